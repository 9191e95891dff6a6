//! Bounds on what one HTTP connection may hold the server to: a request body that stalls
//! between two reads is cut off (408), and a connection beyond the cap is refused (503) before
//! anything is read from it. (Header size, header count and the header wait are hyper's
//! own limits, set in `serve_http1`.)

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::HttpBody;
use hyper::body::{Frame, Incoming};
use tokio::io::AsyncWriteExt;
use tokio::time::{Instant, Sleep};

/// The error a body gives once it stalled longer than the body timeout.
#[derive(Debug)]
pub struct BodyTimeout(pub Duration);

impl std::fmt::Display for BodyTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the request body stalled for more than {} s",
            self.0.as_secs_f64()
        )
    }
}

impl std::error::Error for BodyTimeout {}

/// A request body whose every wait for more data is bounded.
pub struct TimeoutBody {
    inner: Incoming,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
}

impl TimeoutBody {
    pub fn new(inner: Incoming, timeout: Duration) -> TimeoutBody {
        TimeoutBody {
            inner,
            timeout,
            sleep: Box::pin(tokio::time::sleep(timeout)),
        }
    }
}

impl HttpBody for TimeoutBody {
    type Data = axum::body::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                // Data came: the next wait gets a fresh bound.
                let deadline = Instant::now() + this.timeout;
                this.sleep.as_mut().reset(deadline);
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout))))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Answers a connection over the cap with a 503 that says why, then closes it.
pub async fn refuse_connection(mut stream: tokio::net::TcpStream, max: usize) {
    let body = format!(
        "{{\"error\":{{\"code\":503,\"message\":\"the server has {max} connections open, its \
         limit; try again later\",\"type\":\"unavailable_error\"}}}}"
    );
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\nRetry-After: 1\r\n\r\n{body}",
        body.len()
    );
    // A peer that does not read is not waited for.
    let _ = tokio::time::timeout(Duration::from_secs(5), async {
        let _ = stream.write_all(response.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}
