//! Fuzzes the server's request handling in-process: requests go through the real axum
//! routes (`lamina_server::router`, the same `Router` that `lamina serve` puts behind hyper)
//! in front of the scheduler and the deterministic fake model, so every body meets the real
//! parsing, validation, chat templating, tokenizing, grammar and sampling set-up, and is
//! generated for if it passes. Two input forms:
//!
//! * raw: `METHOD /path\n` then the body bytes as they are (the seeds in
//!   `seeds/server_request` are real requests of this form, so the fuzzer mutates JSON
//!   text);
//! * structured: anything else is read with `arbitrary::Unstructured` into a JSON body
//!   shaped like the API's types (OpenAI chat, completions, embeddings and responses,
//!   Anthropic messages, llama.cpp's `/completion`, `/tokenize`, `/detokenize`, `/infill`,
//!   `/apply-template`, `/rerank`, Vertex AI's `/predict`), with the API's own field names
//!   and values of every JSON shape, wrong types included.
//!
//! Every answer is a 2xx, a 4xx or llama-server's 501 for a feature the server was started
//! without (or its 500 for an image without a projector), never another 5xx; an error from an API endpoint is an OpenAI error object; a
//! JSON answer is JSON; no request takes more than 30 s; no panic anywhere (libFuzzer's
//! panic hook aborts on a panic in any thread, the engine thread included).

#![no_main]

use std::sync::OnceLock;
use std::time::Duration;

use arbitrary::{Result as AResult, Unstructured};
use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, header};
use lamina_server::fake::FakeEngine;
use lamina_server::{Pooling, ServerConfig, Vertex};
use libfuzzer_sys::fuzz_target;
use serde_json::{Map, Value, json};
use tower::ServiceExt;

struct Servers {
    rt: tokio::runtime::Runtime,
    /// The default server (embeddings on), with Vertex AI's routes at `/predict`.
    main: Router,
    /// A `--reranking` server, for `/rerank`.
    rank: Router,
}

fn servers() -> &'static Servers {
    static S: OnceLock<Servers> = OnceLock::new();
    S.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let (main, rank) = rt.block_on(async {
            let config = ServerConfig {
                vertex: Some(Vertex {
                    predict_route: "/predict".into(),
                    health_route: Some("/vertex-health".into()),
                }),
                timeout: Some(Duration::from_secs(20)),
                ..ServerConfig::default()
            };
            let engine = FakeEngine::new(512, 2).with_fim(3, 4, 5);
            let main = lamina_server::router(Box::new(engine), &config).expect("router");
            let config = ServerConfig {
                pooling: Pooling::Rank,
                timeout: Some(Duration::from_secs(20)),
                ..ServerConfig::default()
            };
            let rank =
                lamina_server::router(Box::new(FakeEngine::new(512, 2)), &config).expect("router");
            (main, rank)
        });
        Servers { rt, main, rank }
    })
}

/// POST endpoints, whose errors must be OpenAI error objects.
const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/completions",
    "/completion",
    "/completions",
    "/v1/embeddings",
    "/embeddings",
    "/embedding",
    "/tokenize",
    "/detokenize",
    "/infill",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/v1/responses/input_tokens",
    "/apply-template",
    "/rerank",
    "/v1/rerank",
    "/chat/completions/input_tokens",
    "/predict",
];

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
    "max_output_tokens",
    "temperature",
    "temp",
    "top_p",
    "top_k",
    "min_p",
    "typical_p",
    "xtc_probability",
    "xtc_threshold",
    "dynatemp_range",
    "dynatemp_exponent",
    "repeat_last_n",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "top_n_sigma",
    "min_keep",
    "samplers",
    "seed",
    "stream",
    "stream_options",
    "stop",
    "stop_sequences",
    "n",
    "best_of",
    "echo",
    "suffix",
    "logprobs",
    "top_logprobs",
    "n_probs",
    "logit_bias",
    "response_format",
    "json_schema",
    "grammar",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "functions",
    "cache_prompt",
    "id_slot",
    "n_keep",
    "n_discard",
    "n_cache_reuse",
    "ignore_eos",
    "return_tokens",
    "return_progress",
    "reasoning_format",
    "reasoning_effort",
    "reasoning",
    "reasoning_budget_tokens",
    "reasoning_budget_message",
    "thinking",
    "chat_template_kwargs",
    "add_generation_prompt",
    "continue_final_message",
    "input_prefix",
    "input_suffix",
    "input_extra",
    "query",
    "documents",
    "texts",
    "top_n",
    "add_special",
    "parse_special",
    "with_pieces",
    "system",
    "instructions",
    "previous_response_id",
    "conversation",
    "store",
    "text",
    "metadata",
    "encoding_format",
    "post_sampling_probs",
    "timings_per_token",
    "response_fields",
    "verbose",
    "instances",
    "@requestFormat",
];

const STRINGS: &[&str] = &[
    "",
    "hi",
    "user",
    "assistant",
    "system",
    "tool",
    "developer",
    "text",
    "auto",
    "none",
    "required",
    "function",
    "json_object",
    "json_schema",
    "\u{0}",
    "é€𝄞",
    "\u{FFFD}\u{200B}",
    "<s>",
    "</s>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "{\"a\":",
    "root ::= \"a\"",
    "root ::= [a-z]+",
    "root ::= x\nx ::= x",
    "deepseek",
    "float",
    "base64",
    "[INST]",
    "{{ messages }}",
    "/v1/chat/completions",
    "chatCompletions",
    "completion",
    "/tokenize",
];

const INTS: &[i64] = &[
    0,
    1,
    -1,
    2,
    3,
    7,
    255,
    256,
    259,
    260,
    4096,
    65535,
    1 << 31,
    (1 << 31) - 1,
    -(1 << 31),
    1 << 53,
    i64::MAX,
    i64::MIN,
];

const FLOATS: &[f64] = &[
    0.0, -0.0, -0.5, 0.5, 1.0, 1.5, 2.0, 1e308, -1e308, 1e-300, 100.0,
];

fn string(u: &mut Unstructured) -> AResult<String> {
    Ok(match u.int_in_range(0..=9u8)? {
        0..=5 => (*u.choose(STRINGS)?).to_string(),
        6 => "a".repeat(u.int_in_range(0..=6000usize)?),
        7 => (*u.choose(FIELDS)?).to_string(),
        _ => {
            let n = u.int_in_range(0..=24usize)?;
            let bytes = u.bytes(n.min(u.len()))?;
            String::from_utf8_lossy(bytes).into_owned()
        }
    })
}

fn scalar(u: &mut Unstructured) -> AResult<Value> {
    Ok(match u.int_in_range(0..=6u8)? {
        0 => Value::Null,
        1 => json!(u.arbitrary::<bool>()?),
        2 => json!(*u.choose(INTS)?),
        3 => json!(*u.choose(FLOATS)?),
        4 => json!(u64::MAX),
        5 => json!(u.int_in_range(0..=300i64)?),
        _ => json!(string(u)?),
    })
}

/// A value of any shape, API-flavoured.
fn value(u: &mut Unstructured, depth: usize) -> AResult<Value> {
    if depth > 4 || u.is_empty() {
        return scalar(u);
    }
    Ok(match u.int_in_range(0..=11u8)? {
        0..=3 => scalar(u)?,
        4 => {
            let n = u.int_in_range(0..=4usize)?;
            Value::Array(
                (0..n)
                    .map(|_| value(u, depth + 1))
                    .collect::<AResult<_>>()?,
            )
        }
        5 => {
            let mut m = Map::new();
            for _ in 0..u.int_in_range(0..=4usize)? {
                let k = if u.arbitrary()? {
                    (*u.choose(FIELDS)?).to_string()
                } else {
                    (*u.choose(&[
                        "role",
                        "content",
                        "type",
                        "name",
                        "text",
                        "function",
                        "schema",
                        "arguments",
                        "id",
                        "source",
                    ])?)
                    .to_string()
                };
                m.insert(k, value(u, depth + 1)?);
            }
            Value::Object(m)
        }
        6 => Value::Array(
            (0..u.int_in_range(0..=3usize)?)
                .map(|_| openai_message(u, depth + 1))
                .collect::<AResult<_>>()?,
        ),
        7 => schema(u, depth + 1)?,
        8 => tools(u, depth + 1)?,
        9 => Value::Array(
            (0..u.int_in_range(0..=6usize)?)
                .map(|_| Ok(json!(u.int_in_range(0..=300i64)?)))
                .collect::<AResult<_>>()?,
        ),
        10 => content_blocks(u, depth + 1)?,
        _ => {
            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema(u, depth + 1)?}})
        }
    })
}

/// A JSON schema, mostly valid.
fn schema(u: &mut Unstructured, depth: usize) -> AResult<Value> {
    if depth > 5 || u.is_empty() {
        return Ok(
            json!({"type": *u.choose(&["string", "integer", "number", "boolean", "null"])?}),
        );
    }
    Ok(match u.int_in_range(0..=9u8)? {
        0 => {
            json!({"type": "string", "minLength": u.int_in_range(0..=5u8)?, "maxLength": scalar(u)?})
        }
        1 => json!({"type": "integer", "minimum": scalar(u)?, "maximum": scalar(u)?}),
        2 => json!({"type": "string", "pattern": string(u)?}),
        3 => json!({"enum": [string(u)?, scalar(u)?]}),
        4 => {
            json!({"type": "array", "items": schema(u, depth + 1)?, "minItems": scalar(u)?, "maxItems": scalar(u)?})
        }
        5 => {
            let mut props = Map::new();
            for _ in 0..u.int_in_range(0..=3usize)? {
                props.insert(string(u)?, schema(u, depth + 1)?);
            }
            let keys: Vec<Value> = props.keys().map(|k| json!(k)).collect();
            json!({"type": "object", "properties": props, "required": keys, "additionalProperties": u.arbitrary::<bool>()?})
        }
        6 => json!({"anyOf": [schema(u, depth + 1)?, schema(u, depth + 1)?]}),
        7 => json!({"$ref": "#/$defs/a", "$defs": {"a": schema(u, depth + 1)?}}),
        8 => {
            json!({"type": "string", "format": *u.choose(&["date", "time", "date-time", "uuid", "email"])?})
        }
        _ => value(u, depth + 1)?,
    })
}

/// OpenAI `tools` (sometimes Anthropic's or Responses' flat shape).
fn tools(u: &mut Unstructured, depth: usize) -> AResult<Value> {
    let n = u.int_in_range(0..=2usize)?;
    let mut out = Vec::new();
    for _ in 0..n {
        let name = if u.arbitrary()? {
            "get_weather".to_string()
        } else {
            string(u)?
        };
        out.push(match u.int_in_range(0..=3u8)? {
            0 => json!({"type": "function", "function": {"name": name, "description": "d", "parameters": schema(u, depth + 1)?}}),
            1 => json!({"name": name, "description": "d", "input_schema": schema(u, depth + 1)?}),
            2 => json!({"type": "function", "name": name, "parameters": schema(u, depth + 1)?, "strict": u.arbitrary::<bool>()?}),
            _ => value(u, depth + 1)?,
        });
    }
    Ok(Value::Array(out))
}

fn content_blocks(u: &mut Unstructured, depth: usize) -> AResult<Value> {
    let mut out = Vec::new();
    for _ in 0..u.int_in_range(0..=3usize)? {
        out.push(match u.int_in_range(0..=9u8)? {
            0 | 1 => json!({"type": "text", "text": string(u)?}),
            2 => json!({"type": "image_url", "image_url": {"url": string(u)?}}),
            3 => json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": string(u)?}}),
            4 => json!({"type": "tool_use", "id": "t1", "name": "get_weather", "input": value(u, depth + 1)?}),
            5 => json!({"type": "tool_result", "tool_use_id": "t1", "content": value(u, depth + 1)?}),
            6 => json!({"type": "thinking", "thinking": string(u)?, "signature": "s"}),
            7 => json!({"type": "input_text", "text": string(u)?}),
            8 => json!({"type": *u.choose(&["output_text", "input_image", "input_file", "refusal", "reasoning_text"])?, "text": string(u)?}),
            _ => value(u, depth + 1)?,
        });
    }
    Ok(Value::Array(out))
}

fn content(u: &mut Unstructured, depth: usize) -> AResult<Value> {
    Ok(match u.int_in_range(0..=5u8)? {
        0..=2 => json!(string(u)?),
        3 | 4 => content_blocks(u, depth)?,
        _ => value(u, depth)?,
    })
}

fn openai_message(u: &mut Unstructured, depth: usize) -> AResult<Value> {
    let role = *u.choose(&["user", "assistant", "system", "tool", "developer", "nobody"])?;
    let mut m = Map::new();
    m.insert("role".into(), json!(role));
    if u.int_in_range(0..=7u8)? != 0 {
        m.insert("content".into(), content(u, depth + 1)?);
    }
    match u.int_in_range(0..=5u8)? {
        0 => {
            m.insert(
                "tool_calls".into(),
                json!([{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": string(u)?}}]),
            );
        }
        1 => {
            m.insert("tool_call_id".into(), json!("c1"));
        }
        2 => {
            m.insert("reasoning_content".into(), json!(string(u)?));
        }
        3 => {
            m.insert("name".into(), value(u, depth + 1)?);
        }
        _ => {}
    }
    Ok(Value::Object(m))
}

fn anthropic_message(u: &mut Unstructured, depth: usize) -> AResult<Value> {
    let role = *u.choose(&["user", "assistant", "system", "nobody"])?;
    Ok(json!({"role": role, "content": content(u, depth + 1)?}))
}

fn responses_item(u: &mut Unstructured, depth: usize) -> AResult<Value> {
    Ok(match u.int_in_range(0..=5u8)? {
        0 | 1 => {
            json!({"role": *u.choose(&["user", "assistant", "system", "developer"])?, "content": content(u, depth + 1)?})
        }
        2 => {
            json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": string(u)?}]})
        }
        3 => {
            json!({"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": string(u)?})
        }
        4 => {
            json!({"type": "function_call_output", "call_id": "c1", "output": value(u, depth + 1)?})
        }
        _ => {
            json!({"type": "reasoning", "summary": value(u, depth + 1)?, "content": value(u, depth + 1)?})
        }
    })
}

fn list<F>(u: &mut Unstructured, max: usize, mut f: F) -> AResult<Value>
where
    F: FnMut(&mut Unstructured) -> AResult<Value>,
{
    let n = u.int_in_range(0..=max)?;
    Ok(Value::Array((0..n).map(|_| f(u)).collect::<AResult<_>>()?))
}

/// A body for `path`: the endpoint's own fields with well-typed values most of the time.
fn body(u: &mut Unstructured, path: &str, depth: usize) -> AResult<Map<String, Value>> {
    let mut m = Map::new();
    let put = |m: &mut Map<String, Value>, k: &str, v: Value| {
        m.insert(k.to_string(), v);
    };
    match path {
        "/v1/chat/completions"
        | "/chat/completions"
        | "/apply-template"
        | "/chat/completions/input_tokens" => {
            put(
                &mut m,
                "messages",
                list(u, 4, |u| openai_message(u, depth))?,
            );
            if u.arbitrary()? {
                put(&mut m, "tools", tools(u, depth)?);
                put(
                    &mut m,
                    "tool_choice",
                    match u.int_in_range(0..=2u8)? {
                        0 => json!(*u.choose(&["auto", "none", "required"])?),
                        1 => json!({"type": "function", "function": {"name": "get_weather"}}),
                        _ => value(u, depth)?,
                    },
                );
            }
            if u.arbitrary()? {
                put(
                    &mut m,
                    "response_format",
                    match u.int_in_range(0..=2u8)? {
                        0 => json!({"type": "json_object"}),
                        1 => {
                            json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema(u, depth)?}})
                        }
                        _ => json!({"type": "json_object", "schema": schema(u, depth)?}),
                    },
                );
            }
        }
        "/v1/completions" | "/completion" | "/completions" => {
            put(
                &mut m,
                "prompt",
                match u.int_in_range(0..=4u8)? {
                    0 | 1 => json!(string(u)?),
                    2 => list(u, 6, |u| Ok(json!(u.int_in_range(0..=300i64)?)))?,
                    3 => list(u, 3, |u| {
                        Ok(if u.arbitrary()? {
                            json!(string(u)?)
                        } else {
                            json!(*u.choose(INTS)?)
                        })
                    })?,
                    _ => json!({"prompt_string": string(u)?, "multimodal_data": []}),
                },
            );
            if u.arbitrary()? {
                put(&mut m, "grammar", json!(string(u)?));
            }
            if u.arbitrary()? {
                put(&mut m, "json_schema", schema(u, depth)?);
            }
        }
        "/v1/embeddings" | "/embeddings" | "/embedding" => {
            put(
                &mut m,
                if u.arbitrary()? { "input" } else { "content" },
                match u.int_in_range(0..=3u8)? {
                    0 => json!(string(u)?),
                    1 => list(u, 3, |u| Ok(json!(string(u)?)))?,
                    2 => list(u, 3, |u| {
                        list(u, 4, |u| Ok(json!(u.int_in_range(0..=300i64)?)))
                    })?,
                    _ => value(u, depth)?,
                },
            );
            if u.arbitrary()? {
                put(
                    &mut m,
                    "encoding_format",
                    json!(*u.choose(&["float", "base64", "x"])?),
                );
            }
        }
        "/tokenize" => {
            put(&mut m, "content", json!(string(u)?));
            for k in ["add_special", "parse_special", "with_pieces"] {
                if u.arbitrary()? {
                    put(&mut m, k, json!(u.arbitrary::<bool>()?));
                }
            }
        }
        "/detokenize" => {
            put(
                &mut m,
                "tokens",
                list(u, 6, |u| {
                    Ok(if u.int_in_range(0..=5u8)? == 0 {
                        scalar(u)?
                    } else {
                        json!(u.int_in_range(0..=300i64)?)
                    })
                })?,
            );
        }
        "/infill" => {
            put(&mut m, "input_prefix", json!(string(u)?));
            put(&mut m, "input_suffix", json!(string(u)?));
            if u.arbitrary()? {
                put(
                    &mut m,
                    "input_extra",
                    list(u, 2, |u| {
                        Ok(json!({"filename": string(u)?, "text": string(u)?}))
                    })?,
                );
            }
            if u.arbitrary()? {
                put(&mut m, "prompt", json!(string(u)?));
            }
        }
        "/v1/messages" | "/v1/messages/count_tokens" => {
            put(&mut m, "model", json!("m"));
            put(
                &mut m,
                "messages",
                list(u, 4, |u| anthropic_message(u, depth))?,
            );
            if u.arbitrary()? {
                put(
                    &mut m,
                    "system",
                    if u.arbitrary()? {
                        json!(string(u)?)
                    } else {
                        content_blocks(u, depth)?
                    },
                );
            }
            if u.arbitrary()? {
                put(&mut m, "tools", tools(u, depth)?);
                put(
                    &mut m,
                    "tool_choice",
                    json!({"type": *u.choose(&["auto", "any", "tool", "none"])?, "name": "get_weather"}),
                );
            }
            if u.arbitrary()? {
                put(
                    &mut m,
                    "thinking",
                    json!({"type": *u.choose(&["enabled", "disabled", "adaptive"])?, "budget_tokens": scalar(u)?}),
                );
            }
            if u.arbitrary()? {
                put(
                    &mut m,
                    "stop_sequences",
                    list(u, 2, |u| Ok(json!(string(u)?)))?,
                );
            }
        }
        "/v1/responses" | "/v1/responses/input_tokens" => {
            put(
                &mut m,
                "input",
                if u.arbitrary()? {
                    json!(string(u)?)
                } else {
                    list(u, 4, |u| responses_item(u, depth))?
                },
            );
            if u.arbitrary()? {
                put(&mut m, "instructions", json!(string(u)?));
            }
            if u.arbitrary()? {
                put(&mut m, "tools", tools(u, depth)?);
            }
            if u.arbitrary()? {
                put(
                    &mut m,
                    "text",
                    json!({"format": {"type": "json_schema", "name": "x", "schema": schema(u, depth)?}}),
                );
            }
            if u.arbitrary()? {
                put(
                    &mut m,
                    "reasoning",
                    json!({"effort": *u.choose(&["low", "medium", "high", "none"])?, "summary": "auto"}),
                );
            }
        }
        "/rerank" | "/v1/rerank" => {
            put(&mut m, "query", json!(string(u)?));
            put(
                &mut m,
                if u.int_in_range(0..=3u8)? == 0 {
                    "texts"
                } else {
                    "documents"
                },
                list(u, 4, |u| Ok(json!(string(u)?)))?,
            );
            if u.arbitrary()? {
                put(&mut m, "top_n", scalar(u)?);
            }
        }
        "/predict" => {
            let n = u.int_in_range(0..=2usize)?;
            let mut instances = Vec::new();
            for _ in 0..n {
                let inner = *u.choose(&ENDPOINTS[..ENDPOINTS.len() - 1])?;
                let mut b = if depth < 1 {
                    body(u, inner, depth + 1)?
                } else {
                    Map::new()
                };
                let format = if u.arbitrary()? {
                    inner.to_string()
                } else {
                    string(u)?
                };
                b.insert("@requestFormat".into(), json!(format));
                cap(u, &mut b)?;
                instances.push(Value::Object(b));
            }
            put(&mut m, "instances", Value::Array(instances));
        }
        _ => {}
    }
    // Sampling and generation fields, well-typed or not.
    for _ in 0..u.int_in_range(0..=3usize)? {
        let k = *u.choose(FIELDS)?;
        let v = if u.arbitrary()? {
            scalar(u)?
        } else {
            value(u, depth)?
        };
        m.insert(k.to_string(), v);
    }
    Ok(m)
}

/// Keeps generation short (the point is parsing), except now and then.
fn cap(u: &mut Unstructured, m: &mut Map<String, Value>) -> AResult<()> {
    if u.int_in_range(0..=15u8)? != 0 {
        let n = u.int_in_range(0..=3u8)?;
        for k in [
            "max_tokens",
            "n_predict",
            "max_output_tokens",
            "max_completion_tokens",
        ] {
            if m.contains_key(k) || k == "max_tokens" || k == "n_predict" {
                m.insert(k.into(), json!(n));
            }
        }
        if m.get("n").is_some_and(|v| v.as_i64().is_none_or(|n| n > 2)) {
            m.insert("n".into(), json!(2));
        }
    }
    Ok(())
}

struct Req {
    method: Method,
    path: String,
    content_type: Option<&'static str>,
    body: Vec<u8>,
}

/// `METHOD /path\n` then the body.
fn raw(data: &[u8]) -> Option<Req> {
    let nl = data.iter().position(|&b| b == b'\n')?;
    let line = std::str::from_utf8(&data[..nl]).ok()?;
    let (method, path) = line.split_once(' ')?;
    if !path.starts_with('/') {
        return None;
    }
    Some(Req {
        method: Method::from_bytes(method.as_bytes()).ok()?,
        path: path.to_string(),
        content_type: Some("application/json"),
        body: data[nl + 1..].to_vec(),
    })
}

fn structured(data: &[u8]) -> AResult<Req> {
    let mut u = Unstructured::new(data);
    let path = *u.choose(ENDPOINTS)?;
    let mut m = body(&mut u, path, 0)?;
    cap(&mut u, &mut m)?;
    if u.int_in_range(0..=3u8)? == 0 {
        m.insert("stream".into(), json!(true));
        if u.arbitrary()? {
            m.insert("stream_options".into(), json!({"include_usage": true}));
        }
    }
    let content_type = *u.choose(&[
        Some("application/json"),
        Some("application/json"),
        Some("application/json"),
        None,
        Some("text/plain"),
    ])?;
    Ok(Req {
        method: Method::POST,
        path: path.to_string(),
        content_type,
        body: serde_json::to_vec(&Value::Object(m)).expect("a Value serializes"),
    })
}

fn is_rank_path(path: &str) -> bool {
    let p = path.split('?').next().unwrap_or(path);
    matches!(p, "/rerank" | "/reranking" | "/v1/rerank" | "/v1/reranking")
}

async fn send(app: Router, req: Request<Body>) -> (u16, Option<String>, Vec<u8>) {
    let resp = app.oneshot(req).await.expect("the router is infallible");
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = axum::body::to_bytes(resp.into_body(), 64 << 20)
        .await
        .expect("the response body is readable");
    (status, ctype, body.to_vec())
}

fuzz_target!(|data: &[u8]| {
    let req = match raw(data) {
        Some(r) => r,
        None => match structured(data) {
            Ok(r) => r,
            Err(_) => return,
        },
    };
    let s = servers();
    let app = if is_rank_path(&req.path) {
        s.rank.clone()
    } else {
        s.main.clone()
    };
    let mut b = Request::builder().method(req.method.clone()).uri(&req.path);
    if let Some(ct) = req.content_type {
        b = b.header(header::CONTENT_TYPE, ct);
    }
    let Ok(http_req) = b
        .header(header::CONTENT_LENGTH, req.body.len())
        .body(Body::from(req.body.clone()))
    else {
        return; // not a valid URI
    };
    let (status, ctype, body) = s.rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(30), send(app, http_req))
            .await
            .unwrap_or_else(|_| panic!("{} {} took over 30 s", req.method, req.path))
    });
    let text = || String::from_utf8_lossy(&body).into_owned();
    let shown = || String::from_utf8_lossy(&req.body[..req.body.len().min(2000)]).into_owned();
    // llama-server answers an image or audio part without a multimodal projector with a
    // 500 (`server_error`); the server keeps that on purpose.
    let no_mmproj = status == 500
        && serde_json::from_slice::<Value>(&body).is_ok_and(|v| {
            v["error"]["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("image input is not supported"))
        });
    assert!(
        status < 500 || status == 501 || no_mmproj,
        "{} {} {}: {status} {}",
        req.method,
        req.path,
        shown(),
        text()
    );
    if ctype
        .as_deref()
        .is_some_and(|c| c.starts_with("application/json"))
    {
        let v: Value = serde_json::from_slice(&body)
            .unwrap_or_else(|e| panic!("{} answered non-JSON ({e}): {}", req.path, text()));
        let api = req.method == Method::POST && ENDPOINTS.contains(&req.path.as_str());
        if api && status >= 400 {
            assert!(
                v.get("error").is_some_and(Value::is_object),
                "{} {}: {status} without an error object: {}",
                req.path,
                shown(),
                text()
            );
        }
    }
});
