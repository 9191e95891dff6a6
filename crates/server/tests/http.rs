//! The HTTP API against the fake engine: response shapes, streaming, logprobs, stops,
//! limits, auth, queueing, cancellation and timeouts.

mod common;

use std::time::Duration;

use common::*;
use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use lamina_server::testing::{self, HttpResponse};
use serde_json::{Value, json};

#[tokio::test]
async fn health_models_props_slots_metrics() {
    let config = ServerConfig {
        metrics_endpoint: true,
        ..ServerConfig::default()
    };
    let addr = start(4096, 3, config).await;
    let h = get(addr, "/health").await;
    assert_eq!((h.status, h.json()), (200, json!({"status": "ok"})));

    let m = get(addr, "/v1/models").await;
    assert_eq!(m.status, 200);
    assert_eq!(m.json()["object"], "list");
    assert_eq!(m.json()["data"][0]["id"], "lamina-fake");
    assert_eq!(m.json()["data"][0]["object"], "model");

    let p = get(addr, "/props").await.json();
    assert_eq!(p["total_slots"], 3);
    assert_eq!(p["default_generation_settings"]["n_ctx"], 4096 / 3);

    let s = get(addr, "/slots").await.json();
    let slots = s.as_array().unwrap();
    assert_eq!(slots.len(), 3);
    assert!(slots.iter().all(|s| s["is_processing"] == false));

    post(
        addr,
        "/v1/completions",
        json!({"prompt": "hi", "max_tokens": 4, "temperature": 0}),
    )
    .await;
    let metrics = get(addr, "/metrics").await;
    assert_eq!(metrics.status, 200);
    assert!(
        metrics
            .header("content-type")
            .unwrap()
            .starts_with("text/plain")
    );
    let text = metrics.text();
    assert!(text.contains("# TYPE llamacpp:prompt_tokens_total counter"));
    let predicted: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("llamacpp:tokens_predicted_total "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(predicted >= 1.0);
}

#[tokio::test]
async fn chat_matches_the_model_decoded_alone() {
    let addr = start_default().await;
    let r = post(
        addr,
        "/v1/chat/completions",
        json!({"messages": user("hello there"), "temperature": 0, "max_tokens": 40}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let prompt = chat_prompt(&[("user", "hello there")]);
    let (text, n, finish) = reference(&prompt, &greedy(), Some(40), 2048, None);
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], text);
    assert_eq!(v["choices"][0]["finish_reason"], finish);
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(v["usage"]["completion_tokens"], n);
    assert_eq!(v["usage"]["total_tokens"], prompt.len() + n);
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
}

#[tokio::test]
async fn chat_stream_equals_non_stream() {
    let addr = start_default().await;
    let body = |stream: bool| {
        json!({"messages": user("stream me a story"), "temperature": 0, "max_tokens": 60,
               "stream": stream, "stream_options": {"include_usage": true}})
    };
    let plain = post(addr, "/v1/chat/completions", body(false)).await.json();
    let r = post(addr, "/v1/chat/completions", body(true)).await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/event-stream")
    );
    let (text, chunks) = chat_stream_text(&r);
    assert_eq!(
        text,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk")
    );
    let finish: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .map(|c| &c["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finish, vec![&plain["choices"][0]["finish_reason"]]);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"]["completion_tokens"],
        plain["usage"]["completion_tokens"]
    );
    assert_eq!(
        last["usage"]["prompt_tokens"],
        plain["usage"]["prompt_tokens"]
    );
}

/// A two-byte character split across tokens is never streamed half: the stream carries
/// no replacement characters and equals the non-streamed text.
#[tokio::test]
async fn stream_holds_back_partial_utf8() {
    let addr = start_default().await;
    let mut found = false;
    for seed in 0..20 {
        let body = json!({"prompt": format!("utf8 probe {seed}"), "temperature": 0,
                          "max_tokens": 80, "stream": true});
        let r = post(addr, "/v1/completions", body).await;
        let data = r.sse_data();
        let text: String = data[..data.len() - 1]
            .iter()
            .map(|d| serde_json::from_str::<Value>(d).unwrap())
            .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
            .collect();
        assert!(!text.contains('\u{FFFD}'), "{text:?}");
        let (want, _, _) = reference(
            &text_prompt(&format!("utf8 probe {seed}")),
            &greedy(),
            Some(80),
            2048,
            None,
        );
        assert_eq!(text, want);
        if text.contains('é') {
            found = true;
            break;
        }
    }
    assert!(found, "no generation contained a two-byte character");
}

#[tokio::test]
async fn completions_text_tokens_batches_and_n() {
    let addr = start_default().await;
    let prompt = text_prompt("The quick brown fox");
    let (want, n, finish) = reference(&prompt, &greedy(), Some(30), 2048, None);

    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "The quick brown fox", "max_tokens": 30, "temperature": 0}),
    )
    .await;
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["choices"][0]["finish_reason"], finish);
    assert_eq!(v["usage"]["completion_tokens"], n);

    // The same prompt as token ids.
    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 30, "temperature": 0}),
    )
    .await;
    assert_eq!(r.json()["choices"][0]["text"], want);

    // Several prompts, two choices each: index = prompt * n + k.
    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": ["The quick brown fox", "Lorem ipsum"], "n": 2,
               "max_tokens": 30, "temperature": 0}),
    )
    .await;
    let v = r.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    let (want2, _, _) = reference(&text_prompt("Lorem ipsum"), &greedy(), Some(30), 2048, None);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(
            c["text"].as_str().unwrap(),
            if i < 2 { &want } else { &want2 }
        );
    }
    let p = prompt.len() + text_prompt("Lorem ipsum").len();
    assert_eq!(v["usage"]["prompt_tokens"], p);
}

#[tokio::test]
async fn seeded_sampling_is_reproducible_and_n_varies() {
    let addr = start_default().await;
    let body = json!({"messages": user("tell me something random"), "temperature": 1.5,
                      "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 42, "max_tokens": 40, "n": 3,
                      "presence_penalty": 0.5, "frequency_penalty": 0.25});
    let a = post(addr, "/v1/chat/completions", body.clone())
        .await
        .json();
    let b = post(addr, "/v1/chat/completions", body).await.json();
    let texts = |v: &Value| -> Vec<String> {
        v["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(texts(&a), texts(&b));
    let t = texts(&a);
    assert_eq!(t.len(), 3);
    assert!(
        t[0] != t[1] || t[1] != t[2],
        "seeds seed, seed+1, seed+2 all gave {t:?}"
    );
    // Choice 0 is exactly what the model gives alone with that seed.
    let mut params: lamina_sample::SamplingParams = serde_json::from_value(json!({
        "temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 42,
        "presence_penalty": 0.5, "frequency_penalty": 0.25}))
    .unwrap();
    params.n_probs = 0;
    let prompt = chat_prompt(&[("user", "tell me something random")]);
    let (want, _, _) = reference(&prompt, &params, Some(40), 2048, None);
    assert_eq!(t[0], want);
}

#[tokio::test]
async fn chat_logprobs_and_top_logprobs() {
    let addr = start_default().await;
    let r = post(
        addr,
        "/v1/chat/completions",
        json!({"messages": user("probabilities"), "temperature": 0, "max_tokens": 12,
               "logprobs": true, "top_logprobs": 3}),
    )
    .await;
    let v = r.json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    for entry in content {
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{lps:?}");
        // Greedy: the chosen token is the most likely one.
        assert_eq!(entry["token"], top[0]["token"]);
        assert!((entry["logprob"].as_f64().unwrap() - lps[0]).abs() < 1e-6);
        assert!(lps[0] <= 0.0);
        assert!(entry["bytes"].is_array());
    }
    // Streamed, the per-chunk logprobs add up to the same list.
    let r = post(
        addr,
        "/v1/chat/completions",
        json!({"messages": user("probabilities"), "temperature": 0, "max_tokens": 12,
               "logprobs": true, "top_logprobs": 3, "stream": true}),
    )
    .await;
    let (_, chunks) = chat_stream_text(&r);
    let streamed: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|c| c["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&streamed, content);

    // Legacy completions: logprobs = k.
    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "probabilities", "temperature": 0, "max_tokens": 5, "logprobs": 2}),
    )
    .await;
    let lp = &r.json()["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"].as_array().unwrap().len(), 5);
    assert_eq!(lp["token_logprobs"].as_array().unwrap().len(), 5);
    assert!(
        lp["top_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m.as_object().unwrap().len() <= 2)
    );
    assert_eq!(lp["text_offset"][0], 0);
}

#[tokio::test]
async fn stop_strings_cut_and_never_leak_into_the_stream() {
    let addr = start_default().await;
    let prompt = text_prompt("stop test");
    let (full, _, _) = reference(&prompt, &greedy(), Some(60), 2048, None);
    // A stop string taken from the middle of what would be generated.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() > 12, "{full:?}");
    let stop: String = chars[8..11].iter().collect();
    let (want, _, _) = reference(&prompt, &greedy(), Some(60), 2048, Some(&stop));
    assert!(!want.contains(&stop));

    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "stop test", "temperature": 0, "max_tokens": 60, "stop": [stop, "zzzz"]}),
    )
    .await;
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], want);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    let r = post(addr, "/v1/completions",
        json!({"prompt": "stop test", "temperature": 0, "max_tokens": 60, "stop": stop, "stream": true})).await;
    let data = r.sse_data();
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(text, want);

    // llama-server's endpoint reports the word.
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "stop test", "temperature": 0, "n_predict": 60, "stop": [stop]}),
    )
    .await;
    let v = r.json();
    assert_eq!(v["content"], want);
    assert_eq!(v["stop_type"], "word");
    assert_eq!(v["stopping_word"], stop);
}

#[tokio::test]
async fn max_tokens_and_context_give_length() {
    // 64 cells per slot: prompt + completion fill it exactly.
    let addr = start(64, 1, ServerConfig::default()).await;
    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "abc", "max_tokens": 5, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);

    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "abc", "temperature": 0, "ignore_eos": true}),
    )
    .await;
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    // As llama-server (its test_ctx_shift.py: "8 tokens prompt + 248 tokens generated = 256
    // tokens total"): the last token sampled fills the context and is not evaluated.
    let prompt_n = text_prompt("abc").len() as u64;
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64().unwrap() + prompt_n,
        64
    );
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "abc", "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.json()["truncated"], true);
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "abc", "n_predict": 4, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    assert_eq!(r.json()["truncated"], false);
}

#[tokio::test]
async fn native_completion_shape_and_stream() {
    let addr = start_default().await;
    let prompt = text_prompt("native");
    let (want, n, _) = reference(&prompt, &greedy(), Some(20), 2048, None);
    let v = post(
        addr,
        "/completion",
        json!({"prompt": "native", "n_predict": 20, "temperature": 0, "n_probs": 2}),
    )
    .await
    .json();
    assert_eq!(v["content"], want);
    assert_eq!(v["stop"], true);
    assert_eq!(v["tokens_predicted"], n);
    assert_eq!(v["tokens_evaluated"], prompt.len());
    assert!(v["timings"]["predicted_n"].is_number());
    let probs = v["completion_probabilities"].as_array().unwrap();
    assert_eq!(probs.len(), n);
    assert_eq!(probs[0]["top_logprobs"].as_array().unwrap().len(), 2);

    let r = post(
        addr,
        "/completion",
        json!({"prompt": "native", "n_predict": 20, "temperature": 0, "stream": true}),
    )
    .await;
    let events: Vec<Value> = r
        .sse_data()
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = events
        .iter()
        .filter_map(|e| e["content"].as_str())
        .collect();
    assert_eq!(text, want);
    assert_eq!(events.last().unwrap()["stop"], true);
    assert!(
        events[..events.len() - 1]
            .iter()
            .all(|e| e["stop"] == false)
    );

    // n_predict 0 evaluates the prompt only.
    let v = post(
        addr,
        "/completion",
        json!({"prompt": "native", "n_predict": 0}),
    )
    .await
    .json();
    assert_eq!(v["content"], "");
    assert_eq!(v["tokens_predicted"], 0);
}

#[tokio::test]
async fn tokenize_detokenize_round_trip() {
    let addr = start_default().await;
    let v = post(addr, "/tokenize", json!({"content": "héllo<|im_end|>"}))
        .await
        .json();
    let tokens: Vec<u64> = v["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(tokens.len(), 7); // h, é as two bytes, l, l, o, <|im_end|>
    assert_eq!(*tokens.last().unwrap(), lamina_server::fake::IM_END as u64);
    let v = post(addr, "/detokenize", json!({"tokens": tokens}))
        .await
        .json();
    assert_eq!(v["content"], "héllo<|im_end|>");

    let v = post(
        addr,
        "/tokenize",
        json!({"content": "é", "with_pieces": true, "add_special": true}),
    )
    .await
    .json();
    assert_eq!(v["tokens"][0]["id"], lamina_server::fake::BOS);
    assert_eq!(v["tokens"][1]["piece"], json!([0xC3]));
}

#[tokio::test]
async fn embeddings_float_and_base64() {
    let addr = start_default().await;
    let v = post(
        addr,
        "/v1/embeddings",
        json!({"input": ["one", "two words"], "model": "x"}),
    )
    .await
    .json();
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        let e: Vec<f64> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        assert_eq!(e.len(), lamina_server::fake::N_EMBD);
        let norm: f64 = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }
    assert_ne!(data[0]["embedding"], data[1]["embedding"]);
    let n = text_prompt("one").len() + text_prompt("two words").len();
    assert_eq!(v["usage"]["prompt_tokens"], n);

    let b = post(
        addr,
        "/v1/embeddings",
        json!({"input": "one", "encoding_format": "base64"}),
    )
    .await
    .json();
    let s = b["data"][0]["embedding"].as_str().unwrap();
    assert_eq!(s.len(), (lamina_server::fake::N_EMBD * 4).div_ceil(3) * 4);
}

#[tokio::test]
async fn api_key_is_required_where_it_matters() {
    let config = ServerConfig {
        api_keys: vec!["sekrit".into()],
        ..ServerConfig::default()
    };
    let addr = start(4096, 1, config).await;
    let body = serde_json::to_vec(&json!({"prompt": "x", "max_tokens": 1})).unwrap();
    for auth in [
        None,
        Some("Bearer wrong"),
        Some("Bearer  sekrit"),
        Some("Bearer sekri"),
    ] {
        let headers: Vec<(&str, &str)> = auth.map(|a| ("Authorization", a)).into_iter().collect();
        let r = testing::request(addr, "POST", "/v1/completions", &headers, &body)
            .await
            .unwrap();
        let v = assert_client_error(addr, &r, 401).await;
        assert_eq!(v["error"]["code"], "invalid_api_key");
    }
    let r = testing::request(addr, "GET", "/v1/models", &[], b"")
        .await
        .unwrap();
    assert_client_error(addr, &r, 401).await;
    let ok = testing::request(
        addr,
        "POST",
        "/v1/completions",
        &[("Authorization", "Bearer sekrit")],
        &body,
    )
    .await
    .unwrap();
    assert_eq!(ok.status, 200);
    // The page and the health check stay public.
    assert_eq!(get(addr, "/").await.status, 200);
    assert_eq!(get(addr, "/health").await.status, 200);
}

#[tokio::test]
async fn chat_page_is_served() {
    let addr = start_default().await;
    let r = get(addr, "/").await;
    assert_eq!(r.status, 200);
    assert!(r.header("content-type").unwrap().starts_with("text/html"));
    // Relative, so the page also works behind a proxy that serves it under a sub-path.
    assert!(r.text().contains("\"v1/chat/completions\""));
}

/// Opens a streaming request with a generation that would run for minutes and returns
/// the socket once the first chunk arrived.
async fn open_long_stream(addr: std::net::SocketAddr) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = json!({"prompt": "forever", "ignore_eos": true, "stream": true}).to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data:") {
        let n = s.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "connection closed: {}",
            String::from_utf8_lossy(&seen)
        );
        seen.extend_from_slice(&buf[..n]);
    }
    assert!(String::from_utf8_lossy(&seen).starts_with("HTTP/1.1 200"));
    s
}

/// A slow engine with a huge context: generations last minutes unless cancelled.
async fn start_slow(n_slots: u32, config: ServerConfig) -> std::net::SocketAddr {
    let engine = FakeEngine::new(1 << 20, n_slots)
        .with_decode_cost(Duration::from_millis(2), Duration::ZERO);
    lamina_server::spawn_local(Box::new(engine), config)
        .await
        .unwrap()
}

async fn wait_until(what: &str, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn busy_slots(addr: std::net::SocketAddr) -> usize {
    let s = get(addr, "/slots").await.json();
    s.as_array()
        .unwrap()
        .iter()
        .filter(|s| s["is_processing"] == true)
        .count()
}

#[tokio::test]
async fn queue_full_gives_503_and_disconnect_frees_the_slot() {
    let config = ServerConfig {
        queue_size: 1,
        metrics_endpoint: true,
        ..ServerConfig::default()
    };
    let addr = start_slow(1, config).await;
    let a = open_long_stream(addr).await;
    // The second request waits in the queue (accepted, no slot yet): send it raw.
    let b = tokio::spawn(async move {
        testing::post_json(
            addr,
            "/v1/completions",
            &json!({"prompt": "queued", "max_tokens": 3}),
        )
        .await
    });
    wait_until("the queued request", async || {
        get(addr, "/metrics")
            .await
            .text()
            .contains("llamacpp:requests_deferred 1")
    })
    .await;
    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "one too many", "max_tokens": 1}),
    )
    .await;
    let v = assert_client_error_5xx(&r);
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(r.header("retry-after"), Some("1"));

    // Dropping the streaming client cancels its generation; the queued one then runs.
    drop(a);
    let done: HttpResponse = b.await.unwrap().unwrap();
    assert_eq!(done.status, 200, "{}", done.text());
    assert_eq!(done.json()["usage"]["completion_tokens"], 3);
    wait_until("idle slots", async || busy_slots(addr).await == 0).await;
    let m = get(addr, "/metrics").await.text();
    assert!(m.contains("llamacpp:requests_cancelled_total 1"), "{m}");
}

fn assert_client_error_5xx(r: &HttpResponse) -> Value {
    assert_eq!(r.status, 503, "{}", r.text());
    let v = r.json();
    assert!(v["error"]["message"].is_string() && v["error"]["type"] == "unavailable_error");
    v
}

#[tokio::test]
async fn non_streaming_disconnect_frees_the_slot() {
    use tokio::io::AsyncWriteExt;
    let addr = start_slow(1, ServerConfig::default()).await;
    let body = json!({"prompt": "forever", "ignore_eos": true}).to_string();
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.unwrap();
    wait_until("a busy slot", async || busy_slots(addr).await == 1).await;
    drop(s);
    wait_until("the slot to be freed", async || busy_slots(addr).await == 0).await;
}

#[tokio::test]
async fn timeout_ends_generation_with_length() {
    let config = ServerConfig {
        timeout: Some(Duration::from_millis(300)),
        ..ServerConfig::default()
    };
    let addr = start_slow(1, config).await;
    let r = post(
        addr,
        "/v1/completions",
        json!({"prompt": "forever", "ignore_eos": true}),
    )
    .await;
    let v = r.json();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let n = v["usage"]["completion_tokens"].as_u64().unwrap();
    assert!((1..100_000).contains(&n), "{n}");
}

/// The CLI module (compiled here because the cli crate does not depend on the server yet).
#[allow(dead_code)]
#[path = "../../cli/src/cmd/serve.rs"]
mod serve_cmd;

#[test]
fn serve_args_parse_like_llama_server() {
    use clap::Parser;
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        serve: serve_cmd::ServeArgs,
    }
    let argv = [
        "lamina",
        "--host",
        "0.0.0.0",
        "--port",
        "9000",
        "-c",
        "8192",
        "-np",
        "4",
        "--api-key",
        "k",
        "--timeout",
        "30",
        "--max-body-bytes",
        "1000",
        "-b",
        "256",
        "--temp",
        "0.5",
        "--seed",
        "42",
        "-n",
        "64",
        "-a",
        "b,a",
        "--tags",
        "chat",
        "--no-slots",
        "--metrics",
        "--no-ui",
        "--cors-origins",
        "localhost",
        "-rea",
        "off",
        "--no-jinja",
    ];
    let argv = serve_cmd::normalize_llama_flags(argv.iter().map(std::ffi::OsString::from));
    let cli = Cli::try_parse_from(argv).unwrap();
    let config = cli.serve.config().unwrap();
    assert_eq!(config.default_params["temperature"], 0.5);
    assert_eq!(config.default_params["seed"], 42);
    assert_eq!(config.n_predict, Some(64));
    assert_eq!(config.aliases, ["b", "a"]);
    assert_eq!(config.tags, ["chat"]);
    assert!(!config.slots_endpoint && config.metrics_endpoint && !config.web_ui);
    assert_eq!(config.cors.origins, "localhost");
    assert_eq!(config.reasoning, lamina_chat::Reasoning::Off);
    assert!(!config.jinja);
    assert_eq!(config.host, "0.0.0.0");
    assert_eq!(config.port, 9000);
    assert_eq!(cli.serve.ctx_size, 8192);
    assert_eq!(cli.serve.parallel, 4);
    assert_eq!(config.api_keys, ["k"]);
    assert_eq!(config.timeout, Some(Duration::from_secs(30)));
    assert_eq!(config.max_body_bytes, 1000);
    assert_eq!(config.n_batch, 256);
    let defaults = Cli::try_parse_from(["lamina"]).unwrap();
    let d = defaults.serve.config().unwrap();
    assert_eq!(d.port, 8080);
    assert_eq!(d.host, "127.0.0.1");
    assert!(d.slots_endpoint && !d.metrics_endpoint && d.web_ui && d.jinja);
    assert!(d.default_params.is_empty() && d.n_predict.is_none());
    // Flags Lamina does not implement are refused by name.
    let args: Vec<std::ffi::OsString> = ["--lora", "x.gguf"].iter().map(Into::into).collect();
    assert_eq!(
        serve_cmd::unsupported_llama_flag(&args).as_deref(),
        Some("--lora")
    );
    let args: Vec<std::ffi::OsString> = ["--port=1"].iter().map(Into::into).collect();
    assert_eq!(serve_cmd::unsupported_llama_flag(&args), None);
}

/// An engine that panics on `!` and fails on `#` in a batch: the request in flight gets
/// a 500, and the server goes on serving with correct outputs.
struct FlakyEngine(FakeEngine);

impl lamina_server::Engine for FlakyEngine {
    fn model_name(&self) -> String {
        self.0.model_name()
    }
    fn n_ctx(&self) -> u32 {
        self.0.n_ctx()
    }
    fn n_vocab(&self) -> usize {
        self.0.n_vocab()
    }
    fn n_seq_max(&self) -> u32 {
        self.0.n_seq_max()
    }
    fn n_embd(&self) -> usize {
        self.0.n_embd()
    }
    fn bos(&self) -> Option<u32> {
        self.0.bos()
    }
    fn is_eog(&self, token: u32) -> bool {
        self.0.is_eog(token)
    }
    fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.0.tokenize(text, add_special, parse_special)
    }
    fn token_to_piece(&self, token: u32) -> Vec<u8> {
        self.0.token_to_piece(token)
    }
    fn apply_chat_template(
        &self,
        messages: &[lamina_server::ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, lamina_server::EngineError> {
        self.0.apply_chat_template(messages, add_generation_prompt)
    }
    fn decode(&mut self, batch: &lamina_server::Batch) -> Result<(), lamina_server::EngineError> {
        if batch.entries().iter().any(|e| e.token == u32::from(b'!')) {
            panic!("simulated engine bug");
        }
        if batch.entries().iter().any(|e| e.token == u32::from(b'#')) {
            return Err(lamina_server::EngineError::Backend(
                "simulated device error".into(),
            ));
        }
        self.0.decode(batch)
    }
    fn logits(&self, i: usize) -> &[f32] {
        self.0.logits(i)
    }
    fn seq_rm(&mut self, seq_id: u32, p0: u32, p1: Option<u32>) {
        self.0.seq_rm(seq_id, p0, p1)
    }
    fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, lamina_server::EngineError> {
        self.0.embed(tokens)
    }
}

#[tokio::test]
async fn engine_failures_fail_one_request_not_the_server() {
    let engine = FlakyEngine(FakeEngine::new(4096, 2));
    let addr = lamina_server::spawn_local(Box::new(engine), ServerConfig::default())
        .await
        .unwrap();
    for (prompt, stream) in [("boom!", false), ("device #", false), ("boom!", true)] {
        let r = post(
            addr,
            "/v1/completions",
            json!({"prompt": prompt, "max_tokens": 8, "stream": stream}),
        )
        .await;
        if stream {
            // Headers were sent before the failure: the error arrives as an event.
            let data = r.sse_data();
            let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
            assert_eq!(last["error"]["type"], "server_error", "{}", r.text());
        } else {
            assert_eq!(r.status, 500, "{}", r.text());
            assert_eq!(r.json()["error"]["type"], "server_error");
        }
        let prompt = text_prompt("fine");
        let (want, _, _) = reference(&prompt, &greedy(), Some(20), 2048, None);
        let ok = post(
            addr,
            "/v1/completions",
            json!({"prompt": "fine", "max_tokens": 20, "temperature": 0}),
        )
        .await;
        assert_eq!(ok.status, 200);
        assert_eq!(ok.json()["choices"][0]["text"], want);
    }
}
