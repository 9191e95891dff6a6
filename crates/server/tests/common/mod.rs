//! Shared test helpers: starting servers on ephemeral ports and computing what the fake
//! model generates for a prompt when decoded alone (the reference the server must match).

#![allow(dead_code)]

use std::net::SocketAddr;

use lamina_sample::{SamplerChain, SamplingParams};
use lamina_server::fake::FakeEngine;
use lamina_server::testing::{self, HttpResponse};
use lamina_server::{Batch, ChatMessage, Engine, ServerConfig};
use serde_json::{Value, json};

pub async fn start(n_ctx: u32, n_slots: u32, config: ServerConfig) -> SocketAddr {
    let engine = FakeEngine::new(n_ctx, n_slots);
    lamina_server::spawn_local(Box::new(engine), config)
        .await
        .expect("server starts")
}

pub async fn start_default() -> SocketAddr {
    start(4096, 2, ServerConfig::default()).await
}

pub async fn post(addr: SocketAddr, path: &str, body: Value) -> HttpResponse {
    testing::post_json(addr, path, &body)
        .await
        .expect("request")
}

pub async fn get(addr: SocketAddr, path: &str) -> HttpResponse {
    testing::get(addr, path).await.expect("request")
}

/// Asserts a 4xx with an OpenAI-format error body, then that the server still answers.
pub async fn assert_client_error(addr: SocketAddr, r: &HttpResponse, status: u16) -> Value {
    assert_eq!(r.status, status, "body: {}", r.text());
    let v = r.json();
    let err = v
        .get("error")
        .unwrap_or_else(|| panic!("no error object in {}", r.text()));
    assert!(
        err["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{v}"
    );
    assert!(err["type"].is_string(), "{v}");
    let obj = err.as_object().expect("error object");
    assert!(obj.contains_key("param") && obj.contains_key("code"), "{v}");
    let health = get(addr, "/health").await;
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["status"], "ok");
    v
}

/// What the fake model generates for `prompt` decoded alone in a fresh context, with the
/// same sampler set-up as the server (prompt tokens accepted into the chain).
/// Returns (text bytes, completion tokens, finish reason).
pub fn reference(
    prompt: &[u32],
    params: &SamplingParams,
    max_tokens: Option<usize>,
    n_ctx_seq: u32,
    stop: Option<&str>,
) -> (String, usize, &'static str) {
    let mut engine = FakeEngine::new(n_ctx_seq, 1);
    let mut chain =
        SamplerChain::new(&params.clone().with_n_ctx(n_ctx_seq), engine.n_vocab()).unwrap();
    let mut batch = Batch::default();
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as u32, 0, i + 1 == prompt.len());
        chain.accept_prompt(t);
    }
    engine.decode(&batch).unwrap();
    let mut bytes = Vec::new();
    let mut n = 0;
    let mut pos = prompt.len();
    loop {
        let tok = chain.sample(engine.logits(0)).unwrap();
        chain.accept(tok).unwrap();
        n += 1;
        if engine.is_eog(tok) {
            return (String::from_utf8_lossy(&bytes).into_owned(), n, "stop");
        }
        bytes.extend(engine.token_to_piece(tok));
        if let Some(p) = stop.and_then(|s| bytes.windows(s.len()).position(|w| w == s.as_bytes())) {
            bytes.truncate(p);
            return (String::from_utf8_lossy(&bytes).into_owned(), n, "stop");
        }
        // As llama-server: the token that would fill the context ends the generation.
        if max_tokens.is_some_and(|m| n >= m) || pos + 1 >= n_ctx_seq as usize {
            return (String::from_utf8_lossy(&bytes).into_owned(), n, "length");
        }
        let mut b = Batch::default();
        b.push(tok, pos as u32, 0, true);
        engine.decode(&b).unwrap();
        pos += 1;
    }
}

/// The prompt tokens the server builds for a chat.
pub fn chat_prompt(messages: &[(&str, &str)]) -> Vec<u32> {
    let engine = FakeEngine::new(4096, 1);
    let msgs: Vec<ChatMessage> = messages
        .iter()
        .map(|(r, c)| ChatMessage::new(*r, *c))
        .collect();
    let text = engine.apply_chat_template(&msgs, true).unwrap();
    engine.tokenize(&text, true, true)
}

pub fn text_prompt(text: &str) -> Vec<u32> {
    FakeEngine::new(4096, 1).tokenize(text, true, true)
}

pub fn greedy() -> SamplingParams {
    SamplingParams::greedy()
}

pub fn user(text: &str) -> Value {
    json!([{"role": "user", "content": text}])
}

/// Concatenated `delta.content` of a chat stream (choice 0) and its chunks.
pub fn chat_stream_text(r: &HttpResponse) -> (String, Vec<Value>) {
    let data = r.sse_data();
    assert_eq!(
        data.last().map(String::as_str),
        Some("[DONE]"),
        "{}",
        r.text()
    );
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).expect("chunk is JSON"))
        .collect();
    let text = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["delta"]["content"].as_str())
        .collect();
    (text, chunks)
}
