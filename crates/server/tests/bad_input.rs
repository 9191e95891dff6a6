//! Every kind of bad input gets a 4xx with an OpenAI-format error body, and the server
//! keeps serving (each check ends with a `/health` request).

mod common;

use common::*;
use lamina_server::ServerConfig;
use lamina_server::testing;
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const CMPL: &str = "/v1/completions";

async fn raw(addr: std::net::SocketAddr, path: &str, body: &[u8]) -> testing::HttpResponse {
    testing::request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body,
    )
    .await
    .expect("request")
}

async fn expect_400(addr: std::net::SocketAddr, path: &str, body: Value) -> Value {
    let r = post(addr, path, body).await;
    assert_client_error(addr, &r, 400).await
}

#[tokio::test]
async fn malformed_json() {
    let addr = start_default().await;
    for body in [
        &b"{"[..],
        b"{\"messages\": [}",
        b"nope",
        b"{\"a\":1,}",
        b"",
        b"   ",
    ] {
        for path in [
            CHAT,
            CMPL,
            "/completion",
            "/tokenize",
            "/detokenize",
            "/v1/embeddings",
        ] {
            let r = raw(addr, path, body).await;
            let v = assert_client_error(addr, &r, 400).await;
            assert_eq!(v["error"]["code"], "invalid_json");
        }
    }
}

#[tokio::test]
async fn body_that_is_not_an_object() {
    let addr = start_default().await;
    for body in ["[]", "42", "\"text\"", "null"] {
        let r = raw(addr, CHAT, body.as_bytes()).await;
        assert_client_error(addr, &r, 400).await;
    }
}

#[tokio::test]
async fn wrong_types() {
    let addr = start_default().await;
    let cases = [
        (CHAT, json!({"messages": "hello"}), "messages"),
        (
            CHAT,
            json!({"messages": user("x"), "temperature": "hot"}),
            "temperature",
        ),
        (
            CHAT,
            json!({"messages": user("x"), "max_tokens": "10"}),
            "max_tokens",
        ),
        (
            CHAT,
            json!({"messages": user("x"), "stream": "yes"}),
            "stream",
        ),
        (CHAT, json!({"messages": user("x"), "stop": 5}), "stop"),
        (
            CHAT,
            json!({"messages": user("x"), "logprobs": 3}),
            "logprobs",
        ),
        (CHAT, json!({"messages": user("x"), "seed": "abc"}), "seed"),
        (
            CHAT,
            json!({"messages": [{"role": 1, "content": "x"}]}),
            "messages[0].role",
        ),
        (
            CHAT,
            json!({"messages": [{"role": "user", "content": 7}]}),
            "messages[0].content",
        ),
        (
            CMPL,
            json!({"prompt": {"text": "x"}}),
            "prompt.prompt_string",
        ),
        (CMPL, json!({"prompt": "x", "n": 1.5}), "n"),
        (CMPL, json!({"prompt": "x", "logprobs": "many"}), "logprobs"),
        (
            CMPL,
            json!({"prompt": "x", "logit_bias": "none"}),
            "logit_bias",
        ),
        ("/tokenize", json!({"content": 5}), "content"),
        ("/detokenize", json!({"tokens": "1 2 3"}), "tokens"),
        ("/v1/embeddings", json!({"input": 5}), "input"),
    ];
    for (path, body, param) in cases {
        let v = expect_400(addr, path, body.clone()).await;
        assert_eq!(v["error"]["param"], param, "{path} {body}: {v}");
    }
}

#[tokio::test]
async fn missing_required_fields() {
    let addr = start_default().await;
    expect_400(addr, CHAT, json!({"model": "x"})).await;
    expect_400(addr, CMPL, json!({"max_tokens": 3})).await;
    expect_400(addr, "/tokenize", json!({})).await;
    expect_400(addr, "/v1/embeddings", json!({"model": "x"})).await;
}

#[tokio::test]
async fn unknown_fields_that_matter() {
    let addr = start_default().await;
    let cases = [("functions", json!([{"name": "f"}]))];
    for (field, value) in cases {
        let mut body = json!({"messages": user("x")});
        body[field] = value;
        let v = expect_400(addr, CHAT, body).await;
        assert_eq!(v["error"]["param"], field);
        assert_eq!(v["error"]["code"], "unsupported_parameter");
    }
    for (field, value) in [
        ("echo", json!(true)),
        ("suffix", json!("tail")),
        ("best_of", json!(3)),
    ] {
        let mut body = json!({"prompt": "x"});
        body[field] = value;
        expect_400(addr, CMPL, body).await;
    }
    // Unimplemented samplers are refused rather than ignored.
    expect_400(addr, CMPL, json!({"prompt": "x", "mirostat": 2})).await;
    expect_400(addr, CMPL, json!({"prompt": "x", "dry_multiplier": 0.8})).await;
    // Fields that change nothing are accepted.
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("x"), "max_tokens": 2, "user": "u",
        "metadata": {"a": "b"}, "store": false, "response_format": {"type": "text"}, "tools": []}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn negative_or_absurd_max_tokens() {
    let addr = start_default().await;
    for bad in [
        json!(-1),
        json!(0),
        json!(-1000),
        json!(1u64 << 31),
        json!(1e12),
        json!(u64::MAX),
    ] {
        for key in ["max_tokens", "max_completion_tokens"] {
            let mut body = json!({"messages": user("x")});
            body[key] = bad.clone();
            let v = expect_400(addr, CHAT, body).await;
            assert_eq!(v["error"]["param"], key);
        }
        let v = expect_400(addr, CMPL, json!({"prompt": "x", "max_tokens": bad})).await;
        assert_eq!(v["error"]["param"], "max_tokens");
    }
    for bad in [json!(-2), json!(1u64 << 31), json!(1e12)] {
        expect_400(
            addr,
            "/completion",
            json!({"prompt": "x", "n_predict": bad}),
        )
        .await;
    }
}

#[tokio::test]
async fn negative_or_absurd_n() {
    let addr = start_default().await;
    for bad in [
        json!(0),
        json!(-1),
        json!(17),
        json!(1000),
        json!(1u64 << 40),
    ] {
        let v = expect_400(addr, CHAT, json!({"messages": user("x"), "n": bad})).await;
        assert_eq!(v["error"]["param"], "n");
    }
    // Many prompts times n also counts.
    expect_400(
        addr,
        CMPL,
        json!({"prompt": ["a", "b", "c", "d", "e"], "n": 4}),
    )
    .await;
}

#[tokio::test]
async fn prompt_longer_than_the_context() {
    let addr = start(256, 2, ServerConfig::default()).await;
    let long = "x".repeat(200);
    let v = expect_400(addr, CMPL, json!({"prompt": long})).await;
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let v = expect_400(addr, CHAT, json!({"messages": user(&long)})).await;
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    expect_400(addr, "/completion", json!({"prompt": long, "stream": true})).await;
    expect_400(addr, "/v1/embeddings", json!({"input": long})).await;
    // Streaming requests fail before any event is sent.
    let r = post(addr, CHAT, json!({"messages": user(&long), "stream": true})).await;
    assert_client_error(addr, &r, 400).await;
}

#[tokio::test]
async fn empty_messages_and_prompts() {
    let addr = start_default().await;
    // An empty conversation is a prompt of just the generation prompt, as llama-server
    // takes it.
    let r = post(addr, CHAT, json!({"messages": [], "max_tokens": 2})).await;
    assert_eq!(r.status, 200, "{}", r.text());
    expect_400(addr, CMPL, json!({"prompt": []})).await;
    expect_400(addr, CMPL, json!({"prompt": [[]]})).await;
    expect_400(addr, "/v1/embeddings", json!({"input": ""})).await;
    expect_400(addr, "/v1/embeddings", json!({"input": []})).await;
    let v = expect_400(addr, CHAT, json!({"messages": [{"role": "user"}]})).await;
    assert_eq!(v["error"]["param"], "messages[0].content");
}

#[tokio::test]
async fn unknown_roles_and_content_parts() {
    let addr = start_default().await;
    for role in ["wizard", "", "USER", "function_call"] {
        let v = expect_400(
            addr,
            CHAT,
            json!({"messages": [{"role": role, "content": "x"}]}),
        )
        .await;
        assert_eq!(v["error"]["param"], "messages[0].role");
    }
    // Images: llama-server's answer without a multimodal projector (a 500 that says so).
    let r = post(
        addr,
        CHAT,
        json!({"messages": [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]}),
    )
    .await;
    assert_eq!(r.status, 500, "{}", r.text());
    let v = r.json();
    assert_eq!(v["error"]["param"], "messages[0].content[0]");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("image input is not supported")
    );
    // Text parts and the developer role are fine.
    let r = post(
        addr,
        CHAT,
        json!({"max_tokens": 2, "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi"}]}]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn invalid_utf8() {
    let addr = start_default().await;
    let bodies: [&[u8]; 3] = [
        b"{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
        b"{\"prompt\":\"ab\xc3\"}",
        b"{\"content\":\"\xed\xa0\x80\"}",
    ];
    for (path, body) in [CHAT, CMPL, "/tokenize"].into_iter().zip(bodies) {
        let r = raw(addr, path, body).await;
        assert_client_error(addr, &r, 400).await;
    }
    // A lone surrogate escape is not a character either.
    let r = raw(addr, "/tokenize", br#"{"content":"\ud800"}"#).await;
    assert_client_error(addr, &r, 400).await;
}

#[tokio::test]
async fn oversized_body() {
    let config = ServerConfig {
        max_body_bytes: 1000,
        ..ServerConfig::default()
    };
    let addr = start(4096, 1, config).await;
    let body = json!({"prompt": "y".repeat(2000)});
    let r = post(addr, CMPL, body).await;
    let v = assert_client_error(addr, &r, 413).await;
    assert_eq!(v["error"]["code"], "body_too_large");
    // Within the limit is fine.
    let r = post(addr, CMPL, json!({"prompt": "small", "max_tokens": 1})).await;
    assert_eq!(r.status, 200);
}

#[tokio::test]
async fn oversized_chunked_body() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = ServerConfig {
        max_body_bytes: 1000,
        ..ServerConfig::default()
    };
    let addr = start(4096, 1, config).await;
    // No Content-Length: the limit must hold while reading.
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let chunk = "z".repeat(600);
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{chunk}\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len(),
        chunk.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("\"error\""));
    assert_eq!(get(addr, "/health").await.status, 200);
}

#[tokio::test]
async fn wrong_api_key() {
    let config = ServerConfig {
        api_keys: vec!["right".into()],
        ..ServerConfig::default()
    };
    let addr = start(4096, 1, config).await;
    for path in [
        CHAT,
        CMPL,
        "/completion",
        "/tokenize",
        "/detokenize",
        "/v1/embeddings",
    ] {
        let r = testing::request(
            addr,
            "POST",
            path,
            &[("Authorization", "Bearer wrong")],
            b"{}",
        )
        .await
        .unwrap();
        let v = assert_client_error(addr, &r, 401).await;
        assert_eq!(v["error"]["type"], "authentication_error");
    }
}

#[tokio::test]
async fn token_ids_outside_the_vocabulary() {
    let addr = start_default().await;
    let n_vocab = lamina_server::fake::N_VOCAB as u64;
    for bad in [
        json!([1, 2, n_vocab]),
        json!([u32::MAX]),
        json!([-1]),
        json!([1.5]),
        json!([1u64 << 40]),
    ] {
        let v = expect_400(addr, "/detokenize", json!({"tokens": bad})).await;
        assert_eq!(v["error"]["code"], "invalid_token", "{v}");
        let v = expect_400(addr, CMPL, json!({"prompt": bad})).await;
        assert_eq!(v["error"]["code"], "invalid_token", "{v}");
        let v = expect_400(addr, "/completion", json!({"prompt": bad, "stream": true})).await;
        assert_eq!(v["error"]["code"], "invalid_token", "{v}");
        expect_400(addr, "/v1/embeddings", json!({"input": bad})).await;
    }
    expect_400(addr, CMPL, json!({"prompt": [[1, 2], [n_vocab]]})).await;
    expect_400(
        addr,
        CMPL,
        json!({"prompt": "x", "logit_bias": {(n_vocab + 5).to_string(): 1}}),
    )
    .await;
    // In range is fine.
    let r = post(addr, "/detokenize", json!({"tokens": [104, 105]})).await;
    assert_eq!(r.json()["content"], "hi");
}

#[tokio::test]
async fn n_probs_and_top_logprobs_bounds() {
    let addr = start_default().await;
    for bad in [json!(-1), json!(1u64 << 31), json!(21)] {
        let v = expect_400(
            addr,
            CHAT,
            json!({"messages": user("x"), "logprobs": true, "top_logprobs": bad}),
        )
        .await;
        assert_eq!(v["error"]["param"], "top_logprobs");
        expect_400(addr, CMPL, json!({"prompt": "x", "logprobs": bad})).await;
    }
    for bad in [json!(-1), json!(1u64 << 31), json!(1u64 << 32)] {
        let v = expect_400(addr, "/completion", json!({"prompt": "x", "n_probs": bad})).await;
        assert_eq!(v["error"]["param"], "n_probs");
    }
    // top_logprobs needs logprobs.
    expect_400(
        addr,
        CHAT,
        json!({"messages": user("x"), "top_logprobs": 2}),
    )
    .await;
    // Zero is valid: the chosen token's logprob, no alternatives.
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("x"), "max_tokens": 3,
        "logprobs": true, "top_logprobs": 0}),
    )
    .await;
    assert_eq!(r.status, 200);
    let c = &r.json()["choices"][0]["logprobs"]["content"];
    assert!(
        c.as_array()
            .unwrap()
            .iter()
            .all(|e| e["top_logprobs"] == json!([]))
    );
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "x", "n_predict": 3, "n_probs": 0}),
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.json().get("completion_probabilities").is_none());
}

#[tokio::test]
async fn deeply_nested_json() {
    let addr = start(
        4096,
        1,
        ServerConfig {
            max_body_bytes: 1 << 20,
            ..ServerConfig::default()
        },
    )
    .await;
    let depth = 100_000;
    let mut body = Vec::with_capacity(2 * depth + 20);
    body.extend_from_slice(b"{\"prompt\":");
    body.extend(std::iter::repeat_n(b'[', depth));
    body.extend(std::iter::repeat_n(b']', depth));
    body.push(b'}');
    for path in [
        CHAT,
        CMPL,
        "/completion",
        "/tokenize",
        "/detokenize",
        "/v1/embeddings",
    ] {
        let r = raw(addr, path, &body).await;
        let v = assert_client_error(addr, &r, 400).await;
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("recursion limit"),
            "{v}"
        );
    }
    // Nesting within the limit but where a scalar is expected is a type error.
    let r = raw(addr, CMPL, br#"{"prompt":"x","max_tokens":[[[[1]]]]}"#).await;
    assert_client_error(addr, &r, 400).await;
}

#[tokio::test]
async fn unknown_routes_and_methods() {
    let addr = start_default().await;
    let r = get(addr, "/v1/nothing").await;
    assert_client_error(addr, &r, 404).await;
    let r = get(addr, CHAT).await;
    assert_client_error(addr, &r, 405).await;
    let r = raw(addr, "/health", b"{}").await;
    assert_client_error(addr, &r, 405).await;
}

#[tokio::test]
async fn bad_stop_and_encoding_format() {
    let addr = start_default().await;
    let many: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let v = expect_400(addr, CMPL, json!({"prompt": "x", "stop": many})).await;
    assert_eq!(v["error"]["param"], "stop");
    expect_400(addr, CMPL, json!({"prompt": "x", "stop": "q".repeat(2000)})).await;
    let v = expect_400(
        addr,
        "/v1/embeddings",
        json!({"input": "x", "encoding_format": "hex"}),
    )
    .await;
    assert_eq!(v["error"]["param"], "encoding_format");
}

#[tokio::test]
async fn bad_input_inside_a_stream_request_gets_a_plain_error() {
    let addr = start_default().await;
    let r = post(
        addr,
        CHAT,
        json!({"messages": [{"role": "user"}], "stream": true}),
    )
    .await;
    assert_client_error(addr, &r, 400).await;
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("application/json")
    );
}
