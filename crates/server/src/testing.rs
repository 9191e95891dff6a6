//! Helpers for tests and the load test: a minimal HTTP/1.1 client over a raw TCP stream
//! (so tests can send any bytes, invalid UTF-8 included) and the loopback load
//! generator behind `examples/loadtest.rs`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A response as the client saw it (chunked bodies decoded).
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (`Value::Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn sse_data(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .flat_map(|event| event.lines())
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.trim_start().to_string())
            .collect()
    }
}

/// Sends one request on a fresh connection (`Connection: close`) and reads the whole
/// response.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<HttpResponse> {
    let mut stream = TcpStream::connect(addr).await?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(body).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse_response(&raw)
}

/// POSTs a JSON body.
pub async fn post_json(
    addr: SocketAddr,
    path: &str,
    body: &Value,
) -> std::io::Result<HttpResponse> {
    let bytes = serde_json::to_vec(body).map_err(std::io::Error::other)?;
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        &bytes,
    )
    .await
}

pub async fn get(addr: SocketAddr, path: &str) -> std::io::Result<HttpResponse> {
    request(addr, "GET", path, &[], b"").await
}

fn bad(msg: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, msg.to_string())
}

fn parse_response(raw: &[u8]) -> std::io::Result<HttpResponse> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&raw[..split]).map_err(|_| bad("non-UTF-8 headers"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| bad("bad status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body)?;
    }
    Ok(HttpResponse {
        status,
        headers,
        body,
    })
}

fn dechunk(mut data: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| bad("truncated chunk size"))?;
        let size_text = std::str::from_utf8(&data[..eol]).map_err(|_| bad("bad chunk size"))?;
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
            .map_err(|_| bad("bad chunk size"))?;
        data = &data[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        if data.len() < size + 2 {
            return Err(bad("truncated chunk"));
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Resident memory of this process in KiB (`VmRSS` of /proc/self/status), if known.
pub fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// What a load run did.
#[derive(Clone, Debug)]
pub struct LoadReport {
    pub requests: u64,
    pub failures: u64,
    pub completion_tokens: u64,
    pub elapsed: Duration,
    /// First few failure descriptions.
    pub failure_samples: Vec<String>,
}

impl LoadReport {
    pub fn requests_per_sec(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn tokens_per_sec(&self) -> f64 {
        self.completion_tokens as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// `clients` concurrent loops, each sending chat (alternately streamed and not) and
/// completion requests until `duration` has passed or `max_requests` were sent in
/// all. A failure is anything but a 200 with a well-formed answer.
pub async fn run_load(
    addr: SocketAddr,
    clients: usize,
    duration: Duration,
    max_requests: u64,
    max_tokens: u32,
) -> LoadReport {
    let start = Instant::now();
    let sent = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let sent = sent.clone();
        tasks.push(tokio::spawn(async move {
            let mut requests = 0u64;
            let mut tokens = 0u64;
            let mut failures = Vec::new();
            let mut i = 0u64;
            while start.elapsed() < duration && sent.fetch_add(1, Ordering::Relaxed) < max_requests {
                i += 1;
                let stream = i.is_multiple_of(2);
                let body = if i.is_multiple_of(3) {
                    serde_json::json!({
                        "prompt": format!("client {c} request {i}: once upon a time"),
                        "max_tokens": max_tokens, "stream": stream,
                    })
                } else {
                    serde_json::json!({
                        "messages": [{"role": "user", "content": format!("client {c} asks question {i}")}],
                        "max_tokens": max_tokens, "stream": stream,
                        "stream_options": {"include_usage": true},
                    })
                };
                let path = if i.is_multiple_of(3) { "/v1/completions" } else { "/v1/chat/completions" };
                requests += 1;
                match post_json(addr, path, &body).await {
                    Ok(r) if r.status == 200 => match completion_tokens(&r, stream) {
                        Some(n) => tokens += n,
                        None => failures.push(format!("malformed answer: {}", r.text())),
                    },
                    Ok(r) => failures.push(format!("status {}: {}", r.status, r.text())),
                    Err(e) => failures.push(format!("transport: {e}")),
                }
            }
            (requests, tokens, failures)
        }));
    }
    let mut report = LoadReport {
        requests: 0,
        failures: 0,
        completion_tokens: 0,
        elapsed: Duration::ZERO,
        failure_samples: Vec::new(),
    };
    for t in tasks {
        match t.await {
            Ok((r, tok, f)) => {
                report.requests += r;
                report.completion_tokens += tok;
                report.failures += f.len() as u64;
                report.failure_samples.extend(
                    f.into_iter()
                        .take(3usize.saturating_sub(report.failure_samples.len())),
                );
            }
            Err(e) => {
                report.failures += 1;
                report.failure_samples.push(format!("client task: {e}"));
            }
        }
    }
    report.elapsed = start.elapsed();
    report
}

/// `usage.completion_tokens` of a finished answer; for streams, the usage chunk (and a
/// final `[DONE]`) must be there.
fn completion_tokens(r: &HttpResponse, stream: bool) -> Option<u64> {
    let usage = if stream {
        let data = r.sse_data();
        if data.last().map(String::as_str) != Some("[DONE]") {
            return None;
        }
        let chunks: Vec<Value> = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str(d).ok())
            .collect::<Option<_>>()?;
        if chunks.iter().any(|c| c.get("error").is_some()) {
            return None;
        }
        // Completions streams don't ask for usage above: count the chunks' finish instead.
        match chunks
            .iter()
            .rev()
            .find_map(|c| c.get("usage").filter(|u| !u.is_null()))
        {
            Some(u) => u.clone(),
            None => {
                let finished = chunks
                    .iter()
                    .any(|c| c["choices"][0]["finish_reason"].is_string());
                return finished.then_some(0);
            }
        }
    } else {
        r.json().get("usage")?.clone()
    };
    usage.get("completion_tokens")?.as_u64()
}
