//! A structure-aware fuzz-style test of request parsing, through the real routes: bodies built
//! from the API's own field names with values of every JSON shape (wrong types, huge and
//! negative numbers, deep nesting, odd strings), mutated with a fixed seed, sent to every
//! endpoint of a server on the fake model. Each answer is a 2xx, a 4xx with an error object,
//! or llama-server's 501 for a feature the server was started without; never another 5xx, and
//! the server stays healthy.

mod common;

use common::{get, start};
use lamina_server::ServerConfig;
use lamina_server::testing;
use serde_json::{Map, Value, json};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

const FIELDS: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "input",
    "content",
    "tokens",
    "max_tokens",
    "n_predict",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stream",
    "stream_options",
    "stop",
    "n",
    "logprobs",
    "top_logprobs",
    "n_probs",
    "logit_bias",
    "response_format",
    "json_schema",
    "grammar",
    "tools",
    "tool_choice",
    "cache_prompt",
    "id_slot",
    "n_keep",
    "n_discard",
    "n_cache_reuse",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "ignore_eos",
    "return_tokens",
    "reasoning_format",
    "reasoning_budget_tokens",
    "reasoning_budget_message",
    "chat_template_kwargs",
    "input_prefix",
    "input_suffix",
    "input_extra",
    "query",
    "documents",
    "add_special",
    "with_pieces",
    "system",
    "thinking",
    "instructions",
    "max_output_tokens",
    "encoding_format",
    "post_sampling_probs",
    "timings_per_token",
    "response_fields",
    "samplers",
];

const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/v1/embeddings",
    "/embeddings",
    "/tokenize",
    "/detokenize",
    "/infill",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/apply-template",
    "/rerank",
    "/chat/completions/input_tokens",
];

/// A request `path` accepts.
fn valid(path: &str) -> Map<String, Value> {
    let v = match path {
        "/v1/chat/completions"
        | "/v1/messages"
        | "/v1/messages/count_tokens"
        | "/apply-template"
        | "/chat/completions/input_tokens" => {
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        }
        "/v1/embeddings" | "/embeddings" => json!({"input": "hi"}),
        "/tokenize" => json!({"content": "hi"}),
        "/detokenize" => json!({"tokens": [104, 105]}),
        "/infill" => json!({"input_prefix": "a", "input_suffix": "b"}),
        "/v1/responses" => json!({"input": "hi", "max_output_tokens": 2}),
        "/rerank" => json!({"query": "q", "documents": ["a", "b"]}),
        _ => json!({"prompt": "hi", "max_tokens": 2}),
    };
    match v {
        Value::Object(m) => m,
        _ => unreachable!(),
    }
}

fn value(rng: &mut Rng, depth: usize) -> Value {
    match rng.below(if depth > 3 { 9 } else { 12 }) {
        0 => Value::Null,
        1 => json!(rng.below(2) == 0),
        2 => json!([0i64, 1, -1, 2, 7, 255, 4096, 1 << 31, i64::MAX, i64::MIN][rng.below(10)]),
        3 => json!([0.0, -0.5, 1.5, 1e308, -1e308, 1e-300, 2.0][rng.below(7)]),
        4 => {
            let long = "a".repeat(5000);
            let s = ["", "hi", "\u{0}", "é€𝄞", "<|im_start|>", "{\"a\":", &long][rng.below(7)];
            json!(s)
        }
        5 => json!(u64::MAX),
        6 => json!("user"),
        7 => json!([{"role": "user", "content": "hello"}]),
        8 => json!({"type": "json_object"}),
        9 => Value::Array((0..rng.below(4)).map(|_| value(rng, depth + 1)).collect()),
        10 => {
            let mut m = Map::new();
            for _ in 0..rng.below(4) {
                m.insert(
                    [
                        "role", "content", "type", "name", "text", "function", "schema",
                    ][rng.below(7)]
                    .to_string(),
                    value(rng, depth + 1),
                );
            }
            Value::Object(m)
        }
        _ => {
            let role = ["user", "assistant", "system", "tool", "nobody"][rng.below(5)];
            json!([{"role": role, "content": value(rng, depth + 1)}])
        }
    }
}

#[tokio::test]
async fn structured_random_requests_never_get_a_server_error() {
    let addr = start(256, 2, ServerConfig::default()).await;
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let mut by_status = std::collections::BTreeMap::new();
    for _ in 0..4000 {
        let path = ENDPOINTS[rng.below(ENDPOINTS.len())];
        // Half the time a valid request for the endpoint with one or two fields changed, so
        // that parsing gets past the first check.
        let mut body = if rng.below(2) == 0 {
            valid(path)
        } else {
            Map::new()
        };
        for _ in 0..1 + rng.below(if body.is_empty() { 6 } else { 2 }) {
            body.insert(
                FIELDS[rng.below(FIELDS.len())].to_string(),
                value(&mut rng, 0),
            );
        }
        // Keep generation short: the point is parsing.
        body.insert("max_tokens".into(), json!(rng.below(4)));
        body.insert("n_predict".into(), json!(rng.below(4)));
        if rng.below(3) == 0 {
            body.insert(
                "messages".into(),
                json!([{"role": "user", "content": "hi"}]),
            );
        }
        let raw = serde_json::to_vec(&Value::Object(body.clone())).unwrap();
        let r = testing::request(
            addr,
            "POST",
            path,
            &[("Content-Type", "application/json")],
            &raw,
        )
        .await
        .expect("the server answers");
        *by_status.entry(r.status).or_insert(0) += 1;
        assert!(
            r.status < 500 || r.status == 501,
            "{path} {}: {} -> {}",
            Value::Object(body),
            r.status,
            r.text()
        );
        if r.status >= 400 {
            let v = r.json();
            assert!(v.get("error").is_some(), "{path}: {}", r.text());
        }
    }
    eprintln!("statuses: {by_status:?}");
    assert!(by_status.keys().any(|&s| s == 200) && by_status.keys().any(|&s| s == 400));
    assert_eq!(get(addr, "/health").await.status, 200);
}

/// Found by the `server_request` fuzzer: with a negative `repeat_penalty` the penalties turned
/// the grammar's -inf logits into +inf, the sampler picked a token the grammar forbids, and
/// the request failed with a 500 ("the grammar does not allow token …"). Masked tokens stay
/// masked now.
#[tokio::test]
async fn a_negative_repeat_penalty_keeps_the_grammar() {
    let addr = start(256, 2, ServerConfig::default()).await;
    for penalty in [-1.0, -0.5, 0.0] {
        let body = json!({"prompt": "/v1/chat/completions", "json_schema": {"enum": ["tool", 256]},
            "repeat_penalty": penalty, "max_tokens": 3, "n_predict": 3});
        let raw = serde_json::to_vec(&body).unwrap();
        let r = testing::request(
            addr,
            "POST",
            "/completions",
            &[("Content-Type", "application/json")],
            &raw,
        )
        .await
        .expect("the server answers");
        assert_eq!(r.status, 200, "{body}: {}", r.text());
    }
    assert_eq!(get(addr, "/health").await.status, 200);
}
