//! OpenAI tool calling over HTTP against the fake engine, whose ChatML template knows
//! no tools, so calls take llama.cpp's generic JSON form under its grammar: `required`
//! and named choices always yield valid calls, `none` never does, calls stream as
//! `delta.tool_calls`, history with calls and results renders, reasoning is split out,
//! and bad tools are 400s.

mod common;

use common::*;
use serde_json::{Value, json};

const CHAT: &str = "/v1/chat/completions";

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {
            "name": "get_weather", "description": "Weather in a city",
            "parameters": {"type": "object",
                           "properties": {"location": {"type": "string", "maxLength": 12}},
                           "required": ["location"]}}},
        {"type": "function", "function": {
            "name": "get_time",
            "parameters": {"type": "object",
                           "properties": {"zone": {"enum": ["UTC", "CET"]}},
                           "required": ["zone"]}}}
    ])
}

fn calls(v: &Value) -> Vec<Value> {
    v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn args(call: &Value) -> Value {
    serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn required_and_named_choices_always_call() {
    let addr = start_default().await;
    for seed in 0..4 {
        let r = post(
            addr,
            CHAT,
            json!({"messages": user("weather in Paris?"), "tools": weather_tools(),
                   "tool_choice": "required", "max_tokens": 300, "seed": seed, "temperature": 1.0}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let v = r.json();
        let c = calls(&v);
        assert_eq!(c.len(), 1, "{v}");
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
        assert!(v["choices"][0]["message"]["content"].is_null(), "{v}");
        assert_eq!(c[0]["type"], "function");
        assert!(c[0]["id"].as_str().unwrap().starts_with("call_"));
        let name = c[0]["function"]["name"].as_str().unwrap();
        let a = args(&c[0]);
        match name {
            "get_weather" => assert!(a["location"].is_string(), "{a}"),
            "get_time" => assert!(a["zone"] == "UTC" || a["zone"] == "CET", "{a}"),
            other => panic!("unknown tool {other}"),
        }
    }
    // A named function.
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("time?"), "tools": weather_tools(), "max_tokens": 300,
               "tool_choice": {"type": "function", "function": {"name": "get_time"}}}),
    )
    .await;
    let c = calls(&r.json());
    assert_eq!(c[0]["function"]["name"], "get_time", "{}", r.text());
    // Parallel calls carry their own ids.
    let r = post(
        addr,
        CHAT,
        // A fixed seed: the fake model's random JSON may not close within the limit.
        json!({"messages": user("both"), "tools": weather_tools(), "tool_choice": "required",
               "parallel_tool_calls": true, "max_tokens": 400, "seed": 3}),
    )
    .await;
    let c = calls(&r.json());
    assert!(!c.is_empty(), "{}", r.text());
    // `none`: plain text, no calls.
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("hi"), "tools": weather_tools(), "tool_choice": "none", "max_tokens": 20}),
    )
    .await;
    let v = r.json();
    assert!(calls(&v).is_empty(), "{v}");
    assert!(v["choices"][0]["message"]["content"].is_string());
    // `auto`: either a call or a response, never both, never unparsed JSON.
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("hi"), "tools": weather_tools(), "max_tokens": 300}),
    )
    .await;
    let v = r.json();
    let m = &v["choices"][0]["message"];
    if calls(&v).is_empty() {
        let content = m["content"].as_str().unwrap();
        if v["choices"][0]["finish_reason"] == "stop" {
            assert!(!content.trim_start().starts_with("{\"response\""), "{v}");
        }
    } else {
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
    }
}

#[tokio::test]
async fn tool_calls_stream_as_deltas() {
    let addr = start_default().await;
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("weather?"), "tools": weather_tools(), "tool_choice": "required",
               "stream": true, "max_tokens": 300}),
    )
    .await;
    assert_eq!(r.status, 200);
    let chunks: Vec<Value> = r
        .text()
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|l| *l != "[DONE]")
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let with_calls: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
        .collect();
    assert_eq!(with_calls.len(), 1, "{chunks:?}");
    let call = &with_calls[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(call["index"], 0);
    assert!(call["id"].is_string() && call["function"]["name"].is_string());
    assert!(args(call).is_object());
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls");
    // No content deltas: the answer was a call.
    assert!(
        chunks.iter().all(|c| c["choices"][0]["delta"]["content"]
            .as_str()
            .is_none_or(str::is_empty)),
        "{chunks:?}"
    );
}

#[tokio::test]
async fn history_with_calls_and_results_renders() {
    let addr = start_default().await;
    let messages = json!([
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny, 21C"},
    ]);
    let r = post(
        addr,
        "/apply-template",
        json!({"messages": messages, "tools": weather_tools()}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let prompt = r.json()["prompt"].as_str().unwrap().to_string();
    assert!(
        prompt.contains("get_weather") && prompt.contains("sunny, 21C"),
        "{prompt}"
    );
    assert!(prompt.contains("Respond in JSON format"), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    let r = post(
        addr,
        CHAT,
        json!({"messages": messages, "tools": weather_tools(), "max_tokens": 50}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    // Without tools the prompt is the plain template's.
    let r = post(addr, "/apply-template", json!({"messages": user("hi")})).await;
    assert_eq!(
        r.json()["prompt"],
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[tokio::test]
async fn reasoning_is_split_out() {
    let addr = start_default().await;
    let grammar = "root ::= \"<think>\" \"plan\" \"</think>\" \"answer\"";
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("x"), "grammar": grammar, "max_tokens": 40}),
    )
    .await;
    let m = &r.json()["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "plan", "{m}");
    assert_eq!(m["content"], "answer");
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("x"), "grammar": grammar, "max_tokens": 40, "reasoning_format": "none"}),
    )
    .await;
    let m = &r.json()["choices"][0]["message"];
    assert_eq!(m["content"], "<think>plan</think>answer");
    assert!(m.get("reasoning_content").is_none());
    // Streamed: reasoning deltas, then content deltas.
    let r = post(
        addr,
        CHAT,
        json!({"messages": user("x"), "grammar": grammar, "max_tokens": 40, "stream": true}),
    )
    .await;
    let mut reasoning = String::new();
    let mut content = String::new();
    for l in r.text().lines().filter_map(|l| l.strip_prefix("data: ")) {
        if l == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(l).unwrap();
        let d = &v["choices"][0]["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
    }
    assert_eq!((reasoning.as_str(), content.as_str()), ("plan", "answer"));
}

#[tokio::test]
async fn bad_tools_are_400s() {
    let addr = start_default().await;
    let cases = [
        (json!({"tools": {"type": "function"}}), "tools"),
        (
            json!({"tools": [{"type": "function", "function": {}}]}),
            "tools",
        ),
        (json!({"tools": [{"type": "retrieval"}]}), "tools"),
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (
            json!({"tools": weather_tools(), "tool_choice": "sometimes"}),
            "tool_choice",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f",
                    "parameters": {"$ref": "#/$defs/missing"}}}]}),
            "tools",
        ),
        (
            json!({"tools": weather_tools(), "parallel_tool_calls": "yes"}),
            "parallel_tool_calls",
        ),
        (
            json!({"tools": weather_tools(), "reasoning_format": "loud"}),
            "reasoning_format",
        ),
    ];
    for (extra, param) in cases {
        let mut body = json!({"messages": user("x")});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let r = post(addr, CHAT, body.clone()).await;
        let v = assert_client_error(addr, &r, 400).await;
        assert_eq!(v["error"]["param"], param, "{body}: {v}");
    }
    let v = {
        let r = post(
            addr,
            CHAT,
            json!({"messages": user("x"), "tools": weather_tools(), "grammar": "root ::= \"a\""}),
        )
        .await;
        assert_client_error(addr, &r, 400).await
    };
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("grammar with tools")
    );
}

/// A template with native tools (Qwen 2.5's, Hermes-style `<tool_call>` blocks): the
/// tools are rendered by the template itself, a required call is written in its syntax
/// and parsed back.
#[tokio::test]
async fn hermes_template_calls() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/templates/Qwen-Qwen2.5-7B-Instruct.jinja"
    );
    let Ok(source) = std::fs::read_to_string(path) else {
        eprintln!("skipping: ../shared/templates is absent");
        return;
    };
    let engine = lamina_server::fake::FakeEngine::new(4096, 1)
        .with_chat_template(&source)
        .unwrap();
    let addr = lamina_server::spawn_local(Box::new(engine), lamina_server::ServerConfig::default())
        .await
        .unwrap();
    let r = post(
        addr,
        "/apply-template",
        json!({"messages": user("weather?"), "tools": weather_tools()}),
    )
    .await;
    let prompt = r.json()["prompt"].as_str().unwrap().to_string();
    assert!(
        prompt.contains("<tools>") && prompt.contains("get_weather"),
        "{prompt}"
    );
    assert!(!prompt.contains("Respond in JSON format"), "{prompt}");
    for stream in [false, true] {
        let r = post(
            addr,
            CHAT,
            json!({"messages": user("weather in Paris?"), "tools": weather_tools(),
                   "tool_choice": "required", "max_tokens": 300, "stream": stream}),
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.text());
        let call = if stream {
            let chunks: Vec<Value> = r
                .text()
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .filter(|l| *l != "[DONE]")
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            chunks
                .iter()
                .find_map(|c| c["choices"][0]["delta"]["tool_calls"].get(0).cloned())
                .unwrap_or_else(|| panic!("{chunks:?}"))
        } else {
            let v = r.json();
            assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
            calls(&v)[0].clone()
        };
        let name = call["function"]["name"].as_str().unwrap();
        assert!(name == "get_weather" || name == "get_time", "{call}");
        assert!(args(&call).is_object(), "{call}");
    }
}
