//! Grammar- and schema-constrained generation over HTTP (against the fake engine):
//! `grammar` and `json_schema` on /completion and /v1/completions, `response_format`
//! on /v1/chat/completions, streamed and not, and the 400s for bad constraints.

mod common;

use common::*;
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";
const CMPL: &str = "/v1/completions";
const NATIVE: &str = "/completion";

async fn expect_400(addr: std::net::SocketAddr, path: &str, body: Value) -> Value {
    let r = post(addr, path, body).await;
    assert_client_error(addr, &r, 400).await
}

#[tokio::test]
async fn grammar_constrains_every_endpoint() {
    let addr = start_default().await;
    let digits = "root ::= [0-9]{3} (\"-\" [0-9]{2})?";
    let r = post(
        addr,
        NATIVE,
        json!({"prompt": "x", "grammar": digits, "n_predict": 20, "temperature": 0.7, "seed": 3}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    let text = v["content"].as_str().unwrap();
    let ok = |t: &str| {
        let b = t.as_bytes();
        (b.len() == 3 || (b.len() == 6 && b[3] == b'-'))
            && b.iter()
                .enumerate()
                .all(|(i, c)| i == 3 || c.is_ascii_digit())
    };
    assert!(ok(text), "{text:?}");
    assert_eq!(v["stop_type"], "eos");

    let r = post(
        addr,
        CMPL,
        json!({"prompt": "y", "grammar": digits, "max_tokens": 20}),
    )
    .await;
    let text = r.json()["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(ok(&text), "{text:?}");
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");

    // Streamed chat with a schema through response_format.
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("a number"), "stream": true, "max_tokens": 60,
               "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": true}}}),
    )
    .await;
    let (text, _) = chat_stream_text(&r);
    let parsed: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    // (The request samples with a random seed. JSON Schema's integers are numbers without a
    // fraction, "-0" among them, which llama.cpp's grammar allows and serde_json reads as
    // the float -0.0.)
    let n = &parsed["n"];
    assert!(
        n.is_i64() || n.is_u64() || (n.as_f64() == Some(0.0) && !text.contains('.')),
        "{text:?}"
    );

    // json_object: any object.
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("json"), "max_tokens": 200, "response_format": {"type": "json_object"}}),
    )
    .await;
    let v = r.json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    if v["choices"][0]["finish_reason"] == "stop" {
        let parsed: Value = serde_json::from_str(content).unwrap();
        assert!(parsed.is_object());
    } else {
        assert!(content.starts_with('{'), "{content:?}");
    }

    // json_schema on the native endpoint.
    let r = post(
        addr,
        NATIVE,
        json!({"prompt": "z", "json_schema": {"enum": ["red", "green"]}, "n_predict": 10}),
    )
    .await;
    let content = r.json()["content"].as_str().unwrap().to_string();
    assert!(
        content == "\"red\"" || content == "\"green\"",
        "{content:?}"
    );
}

#[tokio::test]
async fn bad_constraints_are_400s() {
    let addr = start_default().await;
    let v = expect_400(
        addr,
        NATIVE,
        json!({"prompt": "x", "grammar": "root ::= (\"a\""}),
    )
    .await;
    assert_eq!(v["error"]["param"], "grammar");
    assert_eq!(v["error"]["code"], "invalid_grammar");
    assert!(
        v["error"]["message"].as_str().unwrap().contains("line 1"),
        "{v}"
    );
    let v = expect_400(
        addr,
        NATIVE,
        json!({"prompt": "x", "grammar": "root ::= item\n"}),
    )
    .await;
    assert!(
        v["error"]["message"].as_str().unwrap().contains("item"),
        "{v}"
    );
    // A grammar that can never end.
    let v = expect_400(
        addr,
        CMPL,
        json!({"prompt": "x", "grammar": "root ::= \"a\" root"}),
    )
    .await;
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("never end"),
        "{v}"
    );
    expect_400(addr, NATIVE, json!({"prompt": "x", "grammar": 5})).await;
    // Schemas.
    let v = expect_400(
        addr,
        NATIVE,
        json!({"prompt": "x", "json_schema": {"$ref": "#/$defs/missing"}}),
    )
    .await;
    assert_eq!(v["error"]["param"], "json_schema");
    expect_400(
        addr,
        NATIVE,
        json!({"prompt": "x", "json_schema": {"type": "array", "minItems": 100000000}}),
    )
    .await;
    // Unsatisfiable schemas.
    for schema in [
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
        json!({"type": "string", "minLength": 5, "maxLength": 2}),
    ] {
        let v = expect_400(addr, NATIVE, json!({"prompt": "x", "json_schema": schema})).await;
        assert_eq!(v["error"]["param"], "json_schema", "{v}");
    }
    let mut deep = json!({"type": "string"});
    for _ in 0..200 {
        deep = json!({"type": "array", "items": deep});
    }
    expect_400(addr, NATIVE, json!({"prompt": "x", "json_schema": deep})).await;
    // Chat: both at once, unknown response_format types.
    expect_400(
        addr,
        CHAT,
        json!({"messages": user("x"), "grammar": "root ::= \"a\"", "json_schema": {}}),
    )
    .await;
    let v = expect_400(
        addr,
        CHAT,
        json!({"messages": user("x"), "response_format": {"type": "yaml"}}),
    )
    .await;
    assert_eq!(v["error"]["param"], "response_format");
}

#[tokio::test]
async fn a_grammar_no_token_can_follow_stops_with_its_reason() {
    let addr = start_default().await;
    // No token's text holds a NUL (llama.cpp reads pieces as C strings), so after
    // "a" nothing can follow.
    let r = post(
        addr,
        NATIVE,
        json!({"prompt": "x", "grammar": "root ::= \"a\" \"\\x00\"", "n_predict": 10}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["stop_type"], "grammar", "{}", r.text());
    assert_eq!(r.json()["content"], "a");
    let r = post(
        addr,
        CMPL,
        json!({"prompt": "x", "grammar": "root ::= \"a\" \"\\x00\"", "max_tokens": 10}),
    )
    .await;
    assert_eq!(r.json()["choices"][0]["finish_reason"], "grammar_dead_end");
    // Token references must name tokens of the vocabulary.
    let v = expect_400(
        addr,
        NATIVE,
        json!({"prompt": "x", "grammar": "root ::= <[9999]>"}),
    )
    .await;
    assert_eq!(v["error"]["param"], "grammar");
}

#[tokio::test]
async fn schema_limits_are_configurable() {
    let config = lamina_server::ServerConfig {
        schema_limits: lamina_grammar::json_schema::SchemaOptions {
            max_depth: 4,
            max_repetition: 50,
            ..Default::default()
        },
        ..Default::default()
    };
    let addr = start(4096, 1, config).await;
    let nested = |n: usize| {
        let mut s = json!({"type": "integer"});
        for _ in 0..n {
            s = json!({"type": "array", "items": s});
        }
        s
    };
    let r = post(
        addr,
        NATIVE,
        json!({"prompt": "x", "json_schema": nested(2), "n_predict": 4}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    expect_400(
        addr,
        NATIVE,
        json!({"prompt": "x", "json_schema": nested(8)}),
    )
    .await;
    expect_400(
        addr,
        NATIVE,
        json!({"prompt": "x", "json_schema": {"type": "string", "minLength": 60}}),
    )
    .await;
}
