//! HTTP connection limits: oversized heads get 431, a client that trickles its headers or
//! stalls its body is cut off, idle keep-alive connections are closed, and connections over
//! the cap get a 503 at once. Every wait here ends on an event (a response or the server
//! closing the socket); the outer timeouts only turn a hang into a failure.

mod common;

use std::time::Duration;

use lamina_server::fake::FakeEngine;
use lamina_server::{HttpLimits, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn start(limits: HttpLimits) -> std::net::SocketAddr {
    let config = ServerConfig {
        http: limits,
        ..ServerConfig::default()
    };
    lamina_server::spawn_local(Box::new(FakeEngine::new(256, 1)), config)
        .await
        .expect("server starts")
}

/// Everything the server sends until it closes the connection.
async fn read_to_close(stream: &mut TcpStream) -> String {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut out))
        .await
        .expect("the server closes the connection")
        .ok();
    String::from_utf8_lossy(&out).into_owned()
}

fn status_of(response: &str) -> &str {
    response.split(' ').nth(1).unwrap_or("")
}

#[tokio::test]
async fn oversized_heads_get_431() {
    let addr = start(HttpLimits::default()).await;
    // One 200 KB header.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let big = "x".repeat(200 << 10);
    let req = format!("GET /health HTTP/1.1\r\nHost: a\r\nX-Big: {big}\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let r = read_to_close(&mut s).await;
    assert_eq!(status_of(&r), "431", "{}", &r[..r.len().min(200)]);
    // 150 small headers.
    let mut s = TcpStream::connect(addr).await.unwrap();
    let mut req = String::from("GET /health HTTP/1.1\r\nHost: a\r\n");
    for i in 0..150 {
        req.push_str(&format!("X-H{i}: v\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let r = read_to_close(&mut s).await;
    assert_eq!(status_of(&r), "431", "{r}");
    // The server still answers.
    let ok = common::get(addr, "/health").await;
    assert_eq!(ok.status, 200);
}

#[tokio::test]
async fn trickled_headers_and_idle_connections_are_closed() {
    let addr = start(HttpLimits {
        header_timeout: Duration::from_millis(300),
        ..HttpLimits::default()
    })
    .await;
    // Slowloris: half a head, then nothing.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        .await
        .unwrap();
    let r = read_to_close(&mut s).await;
    assert!(!r.contains("200 OK"), "{r}");
    // Keep-alive: one answer, then the idle connection is closed.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let r = read_to_close(&mut s).await;
    assert_eq!(status_of(&r), "200", "{r}");
}

#[tokio::test]
async fn a_stalled_body_gets_408() {
    let addr = start(HttpLimits {
        body_timeout: Duration::from_millis(300),
        ..HttpLimits::default()
    })
    .await;
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"prompt\": ",
    )
    .await
    .unwrap();
    // The answer comes while the connection is still open (the rest never does).
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(30), s.read(&mut buf))
        .await
        .expect("an answer")
        .unwrap();
    let r = String::from_utf8_lossy(&buf[..n]);
    assert_eq!(status_of(&r), "408", "{r}");
    assert!(r.contains("body_timeout"), "{r}");
}

#[tokio::test]
async fn connections_over_the_cap_get_503() {
    let addr = start(HttpLimits {
        max_connections: 2,
        ..HttpLimits::default()
    })
    .await;
    // Two connections that each finished a request and stay open (keep-alive).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nHost: a\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).contains("200 OK"));
        held.push(s);
    }
    let mut s = TcpStream::connect(addr).await.unwrap();
    let r = read_to_close(&mut s).await;
    assert_eq!(status_of(&r), "503", "{r}");
    assert!(r.contains("connections open"), "{r}");
    // A freed connection makes room again.
    drop(held.pop());
    let r = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /health HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let r = read_to_close(&mut s).await;
            // The server may not have seen the close yet: then it refuses, and we retry.
            if status_of(&r) == "200" {
                return r;
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a connection is accepted again");
    assert!(r.contains("ok"), "{r}");
}
