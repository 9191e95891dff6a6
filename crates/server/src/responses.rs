//! OpenAI's Responses API (`POST /v1/responses`, `POST /v1/responses/input_tokens`) as
//! llama-server implements it: pure JSON conversions around the OpenAI chat-completions
//! pipeline, ported from llama.cpp's `server_chat_convert_responses_to_chatcmpl`
//! (server-chat.cpp), `server_task_result_cmpl_final::to_json_oaicompat_resp{,_stream}`
//! and `server_task_result_cmpl_partial::to_json_oaicompat_resp` (server-task.cpp).
//!
//! * [`to_openai_chat`] turns a Responses request into the body `/v1/chat/completions`
//!   takes;
//! * [`from_openai_response`] turns the chat completion back into a `response` object;
//! * [`StreamConverter`] turns the `chat.completion.chunk`s of a streamed answer into
//!   the Responses API's named events (`response.created`, `response.in_progress`,
//!   `response.output_item.added`, `response.content_part.added`,
//!   `response.reasoning_text.delta`, `response.output_text.delta`,
//!   `response.function_call_arguments.delta`, `response.output_text.done`,
//!   `response.content_part.done`, `response.output_item.done`, `response.completed`);
//! * [`count_tokens_request`] / [`count_tokens_response`] serve `input_tokens`.
//!
//! Errors keep the server's usual (OpenAI-shaped) bodies, as llama-server answers
//! `/v1/responses` errors with its `format_error_response` object. An error in the
//! middle of a stream goes out as llama-server sends it: a data-only event
//! `{"error": {...}}`, no `event:` line ([`stream_error`]). The stream ends without
//! `[DONE]`.
//!
//! llama-server sends no `sequence_number`, `output_index` or `content_index`, no
//! `*.done` events for reasoning text or function-call arguments, no `output_text`
//! convenience field (OpenAI's SDKs compute it) and always reports `status:
//! "completed"`; neither does this module.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The string at `key` of `v`, or `""` when `v` is not an object, the key is missing,
/// null or not a string (llama.cpp's `json_value(v, key, std::string())`).
fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// 32 random letters and digits, as llama.cpp's `random_string()` (the tail of the
/// `resp_`, `rs_` and `msg_` ids). Not cryptographic: std's randomly keyed hasher over a
/// counter and the clock, stretched with splitmix64.
fn random_string() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const ALPHA: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    let mut state = h.finish();
    (0..32)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            ALPHA[(z % ALPHA.len() as u64) as usize] as char
        })
        .collect()
}

/// The bare id of a chat tool call: llama.cpp's chat ids are bare random strings that
/// the Responses output prefixes (`fc_<id>` item id, `call_<id>` call id); ours already
/// look like OpenAI's `call_...`, so the prefix is taken off first (the call id the
/// client sees is then our chat id, unchanged).
fn bare_call_id(id: &str) -> &str {
    id.strip_prefix("call_").unwrap_or(id)
}

/// A function call's arguments as the string the Responses API carries.
fn arguments_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn invalid(param: impl Into<String>, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message)
}

/// Whether the last message built so far is the assistant's (items that follow it —
/// output messages, function calls, reasoning — are merged into it).
fn last_is_assistant(messages: &[Value]) -> bool {
    messages
        .last()
        .is_some_and(|m| str_at(m, "role") == "assistant")
}

/// The parts of an input message (`user`, `system`, `developer`): `input_text` →
/// `text`, `input_image` → `image_url` (its `image_url` string as the `url`).
/// `input_file` and other types are refused, as llama-server refuses them.
fn input_message_parts(parts: &[Value], where_: &str) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{where_}.content[{j}]");
        match str_at(part, "type") {
            "input_text" => match part.get("text") {
                Some(Value::String(t)) => out.push(json!({"text": t, "type": "text"})),
                Some(_) => return Err(invalid(at, "'Input text' requires a string 'text'")),
                None => return Err(invalid(at, "'Input text' requires 'text'")),
            },
            "input_image" => {
                // `detail` defaults to "auto" and may be left out.
                let Some(url) = part.get("image_url") else {
                    return Err(invalid(at, "'image_url' is required"));
                };
                out.push(json!({"image_url": {"url": url}, "type": "image_url"}));
            }
            "input_file" => {
                return Err(invalid(at, "'input_file' is not supported at this moment")
                    .with_code("unsupported_parameter"));
            }
            _ => {
                return Err(invalid(
                    at,
                    "'type' must be one of 'input_text', 'input_image', or 'input_file'",
                ));
            }
        }
    }
    Ok(out)
}

/// The parts of an output (assistant) message: `output_text` (or `input_text`, what a
/// string content was turned into) → `text`, `refusal` → `refusal`.
fn output_message_parts(parts: &[Value], where_: &str) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{where_}.content[{j}]");
        match str_at(part, "type") {
            "output_text" | "input_text" => match part.get("text") {
                Some(Value::String(t)) => out.push(json!({"text": t, "type": "text"})),
                _ => return Err(invalid(at, "'Output text' requires 'text'")),
            },
            "refusal" => match part.get("refusal") {
                Some(Value::String(r)) => out.push(json!({"refusal": r, "type": "refusal"})),
                _ => return Err(invalid(at, "'Refusal' requires 'refusal'")),
            },
            _ => {
                return Err(invalid(
                    at,
                    "'type' must be one of 'output_text' or 'refusal'",
                ));
            }
        }
    }
    Ok(out)
}

/// The content of a `role: tool` message for a `function_call_output` whose `output`
/// is a list: `input_text` parts become `text`, `input_image` parts `image_url`.
fn tool_output_parts(parts: &[Value], where_: &str) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(parts.len());
    for (j, part) in parts.iter().enumerate() {
        let at = format!("{where_}.output[{j}]");
        let Some(obj) = part.as_object() else {
            return Err(invalid(at, "Output of tool call missing 'type' field"));
        };
        let mut obj = obj.clone();
        match obj.get("type") {
            None => return Err(invalid(at, "Output of tool call missing 'type' field")),
            Some(t) if t == "input_text" => {
                obj.insert("type".into(), json!("text"));
            }
            Some(t) if t == "input_image" => {
                let Some(url) = obj.get("image_url").cloned() else {
                    return Err(invalid(at, "'image_url' is required"));
                };
                obj.insert("type".into(), json!("image_url"));
                obj.insert("image_url".into(), json!({"url": url}));
            }
            Some(_) => {
                return Err(invalid(
                    at,
                    "Output of tool call should be 'Input text' or 'Input image'",
                ));
            }
        }
        out.push(Value::Object(obj));
    }
    Ok(out)
}

/// Responses' `tool_choice` in chat's shape: strings pass; `{"type": "function",
/// "name": N}` becomes `{"type": "function", "function": {"name": N}}`;
/// `{"type": "allowed_tools", "mode": M}` becomes `M` (`auto` or `required`; the
/// subset is not enforced); any other object (hosted tools) `"auto"`, which is what
/// llama-server makes of every object (it reads `tool_choice` as a string).
fn tool_choice(tc: &Value) -> Value {
    match tc {
        Value::Object(_) => match str_at(tc, "type") {
            "function" if !str_at(tc, "name").is_empty() => {
                json!({"type": "function", "function": {"name": str_at(tc, "name")}})
            }
            "allowed_tools" if matches!(str_at(tc, "mode"), "auto" | "required") => {
                json!(str_at(tc, "mode"))
            }
            _ => json!("auto"),
        },
        other => other.clone(),
    }
}

/// `text.format` as chat's `response_format`: `json_schema` (`name`, `schema`,
/// `strict`, `description`) → `{"type": "json_schema", "json_schema": {...}}`,
/// `json_object` → itself, `text` → nothing.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let format = match text.get("format") {
        None | Some(Value::Null) => return Ok(None),
        Some(f @ Value::Object(_)) => f,
        Some(_) => return Err(invalid("text.format", "text.format must be an object")),
    };
    match str_at(format, "type") {
        "text" => Ok(None),
        "json_object" => Ok(Some(json!({"type": "json_object"}))),
        "json_schema" => {
            let mut js = Map::new();
            for key in ["name", "description", "schema", "strict"] {
                if let Some(v) = format.get(key).filter(|v| !v.is_null()) {
                    js.insert(key.into(), v.clone());
                }
            }
            if !js.get("schema").is_some_and(Value::is_object) {
                return Err(invalid(
                    "text.format.schema",
                    "text.format.schema must be a JSON schema object",
                ));
            }
            Ok(Some(json!({"type": "json_schema", "json_schema": js})))
        }
        _ => Err(invalid(
            "text.format.type",
            "text.format.type must be 'text', 'json_object' or 'json_schema'",
        )),
    }
}

/// Converts a Responses request into the OpenAI chat-completions body our
/// `/v1/chat/completions` handler takes, as llama-server's
/// `server_chat_convert_responses_to_chatcmpl` does. Every field the conversion does
/// not name passes through unchanged (`model`, `temperature`, `top_p`, `stream`,
/// `parallel_tool_calls`, `timings_per_token`, `return_progress`, llama-server's
/// sampling fields, ...), as llama-server copies the body.
///
/// * `instructions` becomes a first `system` message;
/// * `input` as a string is one `user` message; as a list of items:
///   - an input message (`role` `user`, `system` or `developer`; `content` a string,
///     which counts as one `input_text`, or parts) keeps its fields but `type` and
///     `status`, its parts converted: `input_text` → `text`, `input_image` →
///     `image_url` (`input_file` is refused);
///   - an output message (`role: assistant`, `type: message`) with `output_text` /
///     `input_text` parts → `text`, `refusal` → `refusal`;
///   - a `function_call` (`call_id`, `name`, `arguments`) → a `tool_calls` entry
///     (`id` = `call_id`);
///   - a `function_call_output` (`call_id`, `output` a string or `input_text` /
///     `input_image` parts) → a `role: tool` message;
///   - a `reasoning` item (with `summary` and a non-empty `content` whose first part
///     has `text`) → `reasoning_content`;
///
///   output messages, function calls and reasoning that follow an assistant message
///   are merged into it (content appended, calls added, reasoning set), as
///   llama-server merges them;
/// * `tools`: `function` tools (flat) become chat's `{"type": "function", "function":
///   {...}}` with `strict` defaulting to true; other tool types (hosted tools) are
///   skipped with a warning, and no tools left means no `tools`;
/// * `max_output_tokens` → `max_tokens`; `reasoning.effort` → `reasoning_effort`
///   (the rest of `reasoning` is dropped).
///
/// Lamina's additions and differences:
/// * `tool_choice` is converted to chat's shape (see [`tool_choice`]); llama-server
///   passes it on and so reads every object as `"auto"`;
/// * `text.format` becomes `response_format` (llama-server ignores `text`) unless the
///   request has a `response_format` of its own;
/// * a streamed request gets `stream_options.include_usage`, so the usage chunk that
///   `response.completed` needs arrives;
/// * an assistant message item without `type` (OpenAI's "easy" input message) is read
///   as an output message (llama-server cannot determine its type);
/// * a null `instructions` adds no system message (llama-server adds an empty one);
/// * `conversation` is refused like `previous_response_id` (llama-server ignores it,
///   answering without the stored context).
///
/// Errors (400): `input` missing or neither a string nor a list, an item whose kind
/// cannot be determined (not an object, or none of the kinds above), a part of the
/// wrong type or without its text, `instructions` that is not a string, `tools` that
/// is not a list, a `previous_response_id` or `conversation`, a `text.format` that is
/// not one of the three.
pub fn to_openai_chat(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let Some(input) = body.get("input") else {
        return Err(invalid("input", "'input' is required"));
    };
    if body
        .get("previous_response_id")
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
    {
        return Err(invalid(
            "previous_response_id",
            "'previous_response_id' is not supported: send the whole conversation in 'input'",
        )
        .with_code("unsupported_parameter"));
    }
    if body.get("conversation").is_some_and(|c| !c.is_null()) {
        return Err(invalid(
            "conversation",
            "'conversation' is not supported: send the whole conversation in 'input'",
        )
        .with_code("unsupported_parameter"));
    }

    let mut out = body.clone();
    out.remove("input");
    let mut messages: Vec<Value> = Vec::new();

    match out.remove("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(_) => {
            return Err(invalid("instructions", "'instructions' must be a string"));
        }
    }

    match input {
        Value::String(s) => messages.push(json!({"role": "user", "content": s})),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                convert_item(item, i, &mut messages)?;
            }
        }
        _ => {
            return Err(invalid(
                "input",
                "'input' must be a string or array of objects",
            ));
        }
    }
    out.insert("messages".into(), Value::Array(messages));

    match out.remove("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let mut chat_tools = Vec::with_capacity(tools.len());
            for tool in tools {
                let kind = str_at(&tool, "type");
                if kind != "function" {
                    // Hosted tools (web search, file search, ...) have no chat equivalent.
                    tracing::warn!("unsupported Responses tool type '{kind}' skipped");
                    continue;
                }
                let Value::Object(mut f) = tool else {
                    continue;
                };
                f.remove("type");
                f.entry("strict").or_insert(json!(true));
                chat_tools.push(json!({"type": "function", "function": f}));
            }
            if !chat_tools.is_empty() {
                out.insert("tools".into(), Value::Array(chat_tools));
            }
        }
        Some(_) => return Err(invalid("tools", "'tools' must be an array of objects")),
    }

    if let Some(tc) = out.get("tool_choice").map(tool_choice) {
        out.insert("tool_choice".into(), tc);
    }

    if let Some(n) = out.remove("max_output_tokens") {
        out.insert("max_tokens".into(), n);
    }

    if let Some(reasoning) = out.remove("reasoning")
        && let Some(effort) = reasoning.get("effort")
    {
        out.insert("reasoning_effort".into(), effort.clone());
    }

    if let Some(text) = out.remove("text")
        && let Some(format) = response_format(&text)?
        && !out.contains_key("response_format")
    {
        out.insert("response_format".into(), format);
    }

    if out.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }

    Ok(out)
}

/// One item of a list `input` into chat messages (see [`to_openai_chat`]).
fn convert_item(item: &Value, i: usize, messages: &mut Vec<Value>) -> Result<(), ApiError> {
    let where_ = format!("input[{i}]");
    let Some(obj) = item.as_object() else {
        return Err(invalid(where_, "Cannot determine type of 'item'"));
    };
    let mut item = obj.clone();
    let merge_prev = last_is_assistant(messages);

    // Only an input message has a string content; as one `input_text` part, input and
    // output messages are read alike.
    if let Some(Value::String(s)) = item.get("content") {
        let part = json!([{"text": s, "type": "input_text"}]);
        item.insert("content".into(), part);
    }
    let role = item.get("role").and_then(Value::as_str).map(str::to_owned);
    let kind = item.get("type").and_then(Value::as_str).map(str::to_owned);
    let role = role.as_deref();
    let kind = kind.as_deref();

    if let (Some("user" | "system" | "developer"), Some(Value::Array(parts))) =
        (role, item.get("content"))
    {
        let parts = input_message_parts(parts, &where_)?;
        item.remove("type");
        item.remove("status");
        item.insert("content".into(), Value::Array(parts));
        messages.push(Value::Object(item));
        return Ok(());
    }

    if role == Some("assistant") && matches!(kind, Some("message") | None) {
        let parts = match item.get("content") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(parts)) => output_message_parts(parts, &where_)?,
            Some(_) => {
                return Err(invalid(
                    format!("{where_}.content"),
                    "content must be a string or an array of output parts",
                ));
            }
        };
        if merge_prev && let Some(Value::Object(prev)) = messages.last_mut() {
            let content = prev.entry("content").or_insert_with(|| json!([]));
            if !content.is_array() {
                *content = json!([]);
            }
            if let Value::Array(c) = content {
                c.extend(parts);
            }
        } else {
            item.remove("status");
            item.remove("type");
            item.insert("content".into(), Value::Array(parts));
            messages.push(Value::Object(item));
        }
        return Ok(());
    }

    match kind {
        Some("function_call") => {
            let (
                Some(Value::String(arguments)),
                Some(Value::String(call_id)),
                Some(Value::String(name)),
            ) = (item.get("arguments"), item.get("call_id"), item.get("name"))
            else {
                return Err(invalid(
                    where_,
                    "a 'function_call' item needs string 'arguments', 'call_id' and 'name'",
                ));
            };
            let call = json!({
                "function": {"arguments": arguments, "name": name},
                "id": call_id,
                "type": "function",
            });
            if merge_prev && let Some(Value::Object(prev)) = messages.last_mut() {
                let calls = prev.entry("tool_calls").or_insert_with(|| json!([]));
                if !calls.is_array() {
                    *calls = json!([]);
                }
                if let Value::Array(c) = calls {
                    c.push(call);
                }
            } else {
                messages.push(json!({"role": "assistant", "tool_calls": [call]}));
            }
            Ok(())
        }
        Some("function_call_output") => {
            let Some(Value::String(call_id)) = item.get("call_id") else {
                return Err(invalid(
                    where_,
                    "a 'function_call_output' item needs a string 'call_id'",
                ));
            };
            let content = match item.get("output") {
                Some(Value::String(s)) => json!(s),
                Some(Value::Array(parts)) => Value::Array(tool_output_parts(parts, &where_)?),
                _ => {
                    return Err(invalid(
                        format!("{where_}.output"),
                        "'output' must be a string or an array of input parts",
                    ));
                }
            };
            messages.push(json!({"content": content, "role": "tool", "tool_call_id": call_id}));
            Ok(())
        }
        Some("reasoning") if item.get("summary").is_some_and(Value::is_array) => {
            let text = match item.get("content") {
                Some(Value::Array(c)) if c.is_empty() => {
                    return Err(invalid(
                        format!("{where_}.content"),
                        "item['content'] is empty",
                    ));
                }
                Some(Value::Array(c)) => match c[0].get("text") {
                    Some(Value::String(t)) => t.clone(),
                    _ => {
                        return Err(invalid(
                            format!("{where_}.content[0].text"),
                            "item['content']['text'] is not a string",
                        ));
                    }
                },
                _ => {
                    return Err(invalid(
                        format!("{where_}.content"),
                        "item['content'] is not an array",
                    ));
                }
            };
            if merge_prev && let Some(Value::Object(prev)) = messages.last_mut() {
                prev.insert("reasoning_content".into(), json!(text));
            } else {
                messages.push(json!({
                    "role": "assistant",
                    "content": [],
                    "reasoning_content": text,
                }));
            }
            Ok(())
        }
        _ => Err(invalid(where_, "Cannot determine type of 'item'")),
    }
}

/// The body to render and tokenize for `POST /v1/responses/input_tokens`: the same
/// conversion as [`to_openai_chat`] (llama-server's `handle_count_tokens` uses it
/// too). `stream` and `stream_options` are dropped, since nothing is generated.
pub fn count_tokens_request(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut out = to_openai_chat(body)?;
    out.remove("stream");
    out.remove("stream_options");
    Ok(out)
}

/// The `input_tokens` answer: `{"input_tokens": N, "object": "response.input_tokens"}`
/// (llama-server adds that `object` on its OpenAI endpoints, `/chat/completions/
/// input_tokens` included).
pub fn count_tokens_response(input_tokens: usize) -> Value {
    json!({"input_tokens": input_tokens, "object": "response.input_tokens"})
}

/// Responses `usage` from an OpenAI usage object: `input_tokens` (the whole prompt,
/// cached tokens included), `output_tokens`, `total_tokens` and
/// `input_tokens_details.cached_tokens`.
fn usage(u: &Value) -> Value {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    let input = n(&u["prompt_tokens"]);
    let output = n(&u["completion_tokens"]);
    json!({
        "input_tokens": input,
        "output_tokens": output,
        "total_tokens": input + output,
        "input_tokens_details": {"cached_tokens": n(&u["prompt_tokens_details"]["cached_tokens"])},
    })
}

/// A finished `function_call` output item for a chat tool call.
fn function_call_item(id: &str, name: &str, arguments: &str) -> Value {
    let bare = bare_call_id(id);
    json!({
        "id": format!("fc_{bare}"),
        "type": "function_call",
        "status": "completed",
        "arguments": arguments,
        "call_id": format!("call_{bare}"),
        "name": name,
    })
}

/// Converts our non-streamed `chat.completion` (its first choice) into a Responses
/// `response` object, as llama-server's `to_json_oaicompat_resp`:
/// `{completed_at, created_at, id: "resp_…", model, object: "response", output,
/// status: "completed", usage}`, where `output` holds a `reasoning` item (`rs_…`, the
/// text as one `reasoning_text` part, empty `summary` and `encrypted_content`) when
/// there is reasoning, a `message` item (`msg_…`, one `output_text` part with empty
/// `annotations` and `logprobs`) when there is content, then a `function_call` item
/// per call (`fc_<id>`, `call_id` `call_<id>`, `name`, `arguments`). Both times are
/// now; `usage` as [`usage`]. No `timings` (llama-server attaches none here).
pub fn from_openai_response(resp: &Value) -> Value {
    let msg = &resp["choices"][0]["message"];
    let mut output = Vec::new();
    let reasoning = str_at(msg, "reasoning_content");
    if !reasoning.is_empty() {
        output.push(json!({
            "id": format!("rs_{}", random_string()),
            "summary": [],
            "type": "reasoning",
            "content": [{"text": reasoning, "type": "reasoning_text"}],
            "encrypted_content": "",
            "status": "completed",
        }));
    }
    let text = str_at(msg, "content");
    if !text.is_empty() {
        let role = match str_at(msg, "role") {
            "" => "assistant",
            r => r,
        };
        output.push(json!({
            "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": text}],
            "id": format!("msg_{}", random_string()),
            "role": role,
            "status": "completed",
            "type": "message",
        }));
    }
    for call in msg["tool_calls"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[])
    {
        let f = &call["function"];
        output.push(function_call_item(
            str_at(call, "id"),
            str_at(f, "name"),
            &arguments_string(&f["arguments"]),
        ));
    }
    let t = unix_now();
    json!({
        "completed_at": t,
        "created_at": t,
        "id": format!("resp_{}", random_string()),
        "model": resp["model"],
        "object": "response",
        "output": output,
        "status": "completed",
        "usage": usage(&resp["usage"]),
    })
}

/// A mid-stream error as llama-server sends it on this endpoint: a data-only event
/// (no `event:` line) `{"error": {"code", "message", "type"}}`. When the chat
/// pipeline's own error chunk (`{"error": {...}}`) comes instead, it can go out as
/// is, the same way.
pub fn stream_error(err: &ApiError) -> Value {
    json!({"error": {"code": err.status.as_u16(), "message": err.message, "type": err.kind}})
}

/// One server-sent event as llama-server writes it: `event: NAME\ndata: JSON\n\n`, or
/// just the `data:` line without a name.
pub fn format_sse(name: Option<&str>, data: &Value) -> String {
    match name {
        Some(name) => format!("event: {name}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

/// An event (name, data) with the name repeated as the data's `type` (first).
type SseEvent = (&'static str, Value);

fn event(name: &'static str, data: Value) -> SseEvent {
    let mut m = Map::new();
    m.insert("type".into(), json!(name));
    if let Value::Object(rest) = data {
        m.extend(rest);
    }
    (name, Value::Object(m))
}

/// One tool call of a streamed answer.
#[derive(Debug)]
struct StreamCall {
    /// The chat delta's `index`.
    index: u64,
    id: String,
    name: String,
    arguments: String,
    /// Its `response.output_item.added` went out.
    announced: bool,
}

/// Turns the `chat.completion.chunk`s of one streamed chat answer into the Responses
/// API's server-sent events, in llama-server's order:
///
/// 1. `response.created` and `response.in_progress` (`response`: `id`, `object`,
///    `status: "in_progress"`) with the first chunk that brings something — prompt
///    progress or a delta (the first chunk, `{"role": "assistant", "content": null}`,
///    brings nothing: llama-server starts with its first token or progress report);
///    later progress chunks give one more `response.in_progress` each;
/// 2. per delta, in this order: reasoning — `response.output_item.added` (a
///    `reasoning` item, `rs_…`, the first time) then `response.reasoning_text.delta`;
///    content — `response.output_item.added` (a `message` item, `msg_…`) and
///    `response.content_part.added` (an empty `output_text` part) the first time, then
///    `response.output_text.delta`; each tool call — `response.output_item.added` (a
///    `function_call` item, `fc_<id>`, `call_<id>`, its `name`, empty `arguments`)
///    when its name comes, then `response.function_call_arguments.delta`;
/// 3. a chunk's `timings` and `prompt_progress` are put on the last event it gave (the
///    usage chunk's `timings` on `response.completed`);
/// 4. with the usage chunk (empty `choices`), or [`StreamConverter::finish`]: for
///    reasoning `response.output_item.done`; for content `response.output_text.done`,
///    `response.content_part.done`, `response.output_item.done`; per tool call
///    `response.output_item.done`; then `response.completed` with the whole
///    `response` (`id`, `object`, `created_at`, `status: "completed"`, `model`,
///    `output`, `usage`).
///
/// Every event's data starts with `type`, the event's name. Only the choice with index
/// 0 is read (the Responses API has no `n`).
#[derive(Debug)]
pub struct StreamConverter {
    model: String,
    resp_id: String,
    reasoning_id: String,
    message_id: String,
    created: bool,
    reasoning_started: bool,
    text_started: bool,
    reasoning: String,
    text: String,
    calls: Vec<StreamCall>,
    done: bool,
}

impl StreamConverter {
    /// A converter for one answer of `model` (`response.completed` reports it), with
    /// fresh `resp_…`, `rs_…` and `msg_…` ids.
    pub fn new(model: &str) -> StreamConverter {
        StreamConverter {
            model: model.to_string(),
            resp_id: format!("resp_{}", random_string()),
            reasoning_id: format!("rs_{}", random_string()),
            message_id: format!("msg_{}", random_string()),
            created: false,
            reasoning_started: false,
            text_started: false,
            reasoning: String::new(),
            text: String::new(),
            calls: Vec::new(),
            done: false,
        }
    }

    /// The `resp_…` id of this response.
    pub fn response_id(&self) -> &str {
        &self.resp_id
    }

    fn response_stub(&self) -> Value {
        json!({"response": {"id": self.resp_id, "object": "response", "status": "in_progress"}})
    }

    fn create(&mut self, out: &mut Vec<SseEvent>) {
        if !self.created {
            self.created = true;
            out.push(event("response.created", self.response_stub()));
            out.push(event("response.in_progress", self.response_stub()));
        }
    }

    /// Whether a delta brings anything the Responses stream shows.
    fn has_news(delta: &Value) -> bool {
        !str_at(delta, "reasoning_content").is_empty()
            || !str_at(delta, "content").is_empty()
            || delta["tool_calls"].as_array().is_some_and(|calls| {
                calls.iter().any(|c| {
                    !str_at(&c["function"], "name").is_empty()
                        || !arguments_string(&c["function"]["arguments"]).is_empty()
                })
            })
    }

    fn on_delta(&mut self, delta: &Value, out: &mut Vec<SseEvent>) {
        let reasoning = str_at(delta, "reasoning_content");
        if !reasoning.is_empty() {
            if !self.reasoning_started {
                self.reasoning_started = true;
                out.push(event(
                    "response.output_item.added",
                    json!({"item": {
                        "id": self.reasoning_id,
                        "summary": [],
                        "type": "reasoning",
                        "content": [],
                        "encrypted_content": "",
                        "status": "in_progress",
                    }}),
                ));
            }
            self.reasoning.push_str(reasoning);
            out.push(event(
                "response.reasoning_text.delta",
                json!({"delta": reasoning, "item_id": self.reasoning_id}),
            ));
        }
        let text = str_at(delta, "content");
        if !text.is_empty() {
            if !self.text_started {
                self.text_started = true;
                out.push(event(
                    "response.output_item.added",
                    json!({"item": {
                        "content": [],
                        "id": self.message_id,
                        "role": "assistant",
                        "status": "in_progress",
                        "type": "message",
                    }}),
                ));
                out.push(event(
                    "response.content_part.added",
                    json!({"item_id": self.message_id, "part": {"type": "output_text", "text": ""}}),
                ));
            }
            self.text.push_str(text);
            out.push(event(
                "response.output_text.delta",
                json!({"item_id": self.message_id, "delta": text}),
            ));
        }
        let calls = delta["tool_calls"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (pos, call) in calls.iter().enumerate() {
            let index = call["index"].as_u64().unwrap_or(pos as u64);
            let f = &call["function"];
            let at = match self.calls.iter().position(|c| c.index == index) {
                Some(at) => at,
                None => {
                    let id = match str_at(call, "id") {
                        "" => random_string(),
                        id => id.to_string(),
                    };
                    self.calls.push(StreamCall {
                        index,
                        id,
                        name: String::new(),
                        arguments: String::new(),
                        announced: false,
                    });
                    self.calls.len() - 1
                }
            };
            let c = &mut self.calls[at];
            let bare = bare_call_id(&c.id).to_string();
            let name = str_at(f, "name");
            if !name.is_empty() && !c.announced {
                c.announced = true;
                c.name = name.to_string();
                out.push(event(
                    "response.output_item.added",
                    json!({"item": {
                        "id": format!("fc_{bare}"),
                        "arguments": "",
                        "call_id": format!("call_{bare}"),
                        "name": name,
                        "type": "function_call",
                        "status": "in_progress",
                    }}),
                ));
            }
            let args = arguments_string(&f["arguments"]);
            if !args.is_empty() {
                c.arguments.push_str(&args);
                out.push(event(
                    "response.function_call_arguments.delta",
                    json!({"delta": args, "item_id": format!("fc_{bare}")}),
                ));
            }
        }
    }

    /// The closing events: the `.done` events of every item, then
    /// `response.completed` (with `usage` and, when known, `timings`).
    fn complete(&mut self, usage_v: &Value, timings: Option<&Value>, out: &mut Vec<SseEvent>) {
        if self.done {
            return;
        }
        // llama-server sends these with the first token; an answer without any (an
        // immediate end of generation) still gets them here.
        self.create(out);
        self.done = true;
        let mut output = Vec::new();
        if !self.reasoning.is_empty() {
            let item = json!({
                "id": self.reasoning_id,
                "summary": [],
                "type": "reasoning",
                "content": [{"text": self.reasoning, "type": "reasoning_text"}],
                "encrypted_content": "",
            });
            out.push(event("response.output_item.done", json!({"item": item})));
            output.push(item);
        }
        if !self.text.is_empty() {
            out.push(event(
                "response.output_text.done",
                json!({"item_id": self.message_id, "text": self.text}),
            ));
            let part = json!({
                "type": "output_text",
                "annotations": [],
                "logprobs": [],
                "text": self.text,
            });
            out.push(event(
                "response.content_part.done",
                json!({"item_id": self.message_id, "part": part}),
            ));
            let item = json!({
                "type": "message",
                "status": "completed",
                "id": self.message_id,
                "content": [part],
                "role": "assistant",
            });
            out.push(event("response.output_item.done", json!({"item": item})));
            output.push(item);
        }
        for c in &self.calls {
            let item = function_call_item(&c.id, &c.name, &c.arguments);
            out.push(event("response.output_item.done", json!({"item": item})));
            output.push(item);
        }
        let mut data = json!({"response": {
            "id": self.resp_id,
            "object": "response",
            "created_at": unix_now(),
            "status": "completed",
            "model": self.model,
            "output": output,
            "usage": usage(usage_v),
        }});
        if let Some(t) = timings {
            data["timings"] = t.clone();
        }
        out.push(event("response.completed", data));
    }

    /// The events for one `chat.completion.chunk` (parsed JSON). Chunks that are not
    /// objects, error chunks (the wiring sends those, see [`stream_error`]) and chunks
    /// after `response.completed` give nothing.
    pub fn on_chunk(&mut self, chunk: &Value) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if self.done || !chunk.is_object() || chunk.get("error").is_some() {
            return out;
        }
        let deltas: Vec<&Value> = chunk["choices"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[])
            .iter()
            .filter(|c| c["index"].as_u64().unwrap_or(0) == 0)
            .map(|c| &c["delta"])
            .collect();
        let progress = chunk.get("prompt_progress").filter(|p| !p.is_null());
        let timings = chunk.get("timings").filter(|t| t.is_object());
        if progress.is_some() || deltas.iter().any(|d| Self::has_news(d)) {
            if self.created {
                if progress.is_some() {
                    out.push(event("response.in_progress", self.response_stub()));
                }
            } else {
                self.create(&mut out);
            }
        }
        for d in deltas {
            self.on_delta(d, &mut out);
        }
        if let Some((_, last)) = out.last_mut() {
            if let Some(t) = timings {
                last["timings"] = t.clone();
            }
            if let Some(p) = progress {
                last["prompt_progress"] = p.clone();
            }
        }
        if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
            self.complete(u, timings, &mut out);
        }
        out
    }

    /// What must still go out when the chunks end without a usage chunk: the closing
    /// events with zero `usage` (and `response.created` / `response.in_progress` if
    /// nothing went out yet). Nothing once the response completed. After a failure
    /// send [`stream_error`] instead.
    pub fn finish(&mut self) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        self.complete(&Value::Null, None, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("not an object"),
        }
    }

    fn conv(v: Value) -> Value {
        Value::Object(to_openai_chat(&obj(v)).expect("converts"))
    }

    fn conv_err(v: Value) -> ApiError {
        to_openai_chat(&obj(v)).expect_err("must fail")
    }

    fn has_id(v: &Value, prefix: &str) -> bool {
        v.as_str().is_some_and(|s| {
            s.len() == prefix.len() + 32
                && s.starts_with(prefix)
                && s[prefix.len()..].bytes().all(|b| b.is_ascii_alphanumeric())
        })
    }

    #[test]
    fn string_input_and_instructions() {
        let out = conv(json!({
            "model": "gpt-4.1",
            "instructions": "Be brief.",
            "input": "What is the best book",
            "max_output_tokens": 8,
            "temperature": 0.8,
            "top_p": 0.9,
            "timings_per_token": true,
            "return_progress": true,
            "store": false,
        }));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is the best book"},
            ])
        );
        assert_eq!(out["max_tokens"], json!(8));
        assert_eq!(out["temperature"], json!(0.8));
        assert_eq!(out["top_p"], json!(0.9));
        assert_eq!(out["model"], json!("gpt-4.1"));
        // Passed through, as llama-server copies the body.
        assert_eq!(out["timings_per_token"], json!(true));
        assert_eq!(out["return_progress"], json!(true));
        assert_eq!(out["store"], json!(false));
        for gone in [
            "input",
            "instructions",
            "max_output_tokens",
            "stream_options",
        ] {
            assert!(out.get(gone).is_none(), "{gone}");
        }
        // A null instructions adds nothing.
        let out = conv(json!({"input": "Hi", "instructions": null}));
        assert_eq!(out["messages"], json!([{"role": "user", "content": "Hi"}]));
    }

    #[test]
    fn input_messages() {
        let out = conv(json!({"input": [
            {"role": "system", "content": "Book"},
            {"role": "developer", "content": [{"type": "input_text", "text": "Dev"}]},
            {"type": "message", "role": "user", "status": "completed", "content": [
                {"type": "input_text", "text": "What is"},
                {"type": "input_image", "image_url": "https://x/y.png", "detail": "auto"},
                {"type": "input_text", "text": "this?"},
            ]},
        ]}));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "system", "content": [{"text": "Book", "type": "text"}]},
                {"role": "developer", "content": [{"text": "Dev", "type": "text"}]},
                {"role": "user", "content": [
                    {"text": "What is", "type": "text"},
                    {"image_url": {"url": "https://x/y.png"}, "type": "image_url"},
                    {"text": "this?", "type": "text"},
                ]},
            ])
        );
    }

    #[test]
    fn output_messages_function_calls_outputs_and_reasoning() {
        // The output of a previous turn replayed (what from_openai_response gives).
        let out = conv(json!({"input": [
            {"role": "user", "content": "Weather in Paris and Rome?"},
            {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "",
             "content": [{"type": "reasoning_text", "text": "Two calls."}]},
            {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}]},
            {"id": "fc_a", "type": "function_call", "status": "completed", "call_id": "call_a",
             "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call", "call_id": "call_b", "name": "get_weather",
             "arguments": "{\"city\":\"Rome\"}"},
            {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_b", "output": [
                {"type": "input_text", "text": "rainy"},
                {"type": "input_image", "image_url": "data:image/png;base64,QQ=="},
            ]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "refusal", "refusal": "No."}]},
            {"role": "assistant", "content": "Easy message."},
            {"type": "function_call", "call_id": "call_c", "name": "now", "arguments": "{}"},
            {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Later."}]},
        ]}));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": [{"text": "Weather in Paris and Rome?", "type": "text"}]},
                {"role": "assistant",
                 "content": [{"text": "Let me check.", "type": "text"}],
                 "reasoning_content": "Two calls.",
                 "tool_calls": [
                    {"function": {"arguments": "{\"city\":\"Paris\"}", "name": "get_weather"},
                     "id": "call_a", "type": "function"},
                    {"function": {"arguments": "{\"city\":\"Rome\"}", "name": "get_weather"},
                     "id": "call_b", "type": "function"},
                 ]},
                {"content": "sunny", "role": "tool", "tool_call_id": "call_a"},
                {"content": [
                    {"type": "text", "text": "rainy"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,QQ=="}},
                 ], "role": "tool", "tool_call_id": "call_b"},
                {"role": "assistant",
                 "content": [{"refusal": "No.", "type": "refusal"}, {"text": "Easy message.", "type": "text"}],
                 "tool_calls": [
                    {"function": {"arguments": "{}", "name": "now"}, "id": "call_c", "type": "function"},
                 ],
                 "reasoning_content": "Later."},
            ])
        );
        // A function call that starts an assistant turn: a message without content.
        let out = conv(json!({"input": [
            {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        ]}));
        assert_eq!(
            out["messages"],
            json!([{"role": "assistant", "tool_calls": [
                {"function": {"arguments": "{}", "name": "f"}, "id": "c", "type": "function"}]}])
        );
    }

    #[test]
    fn tools_tool_choice_reasoning_text_and_stream() {
        let base = json!({
            "input": "Weather?",
            "tools": [
                {"type": "function", "name": "get_weather", "description": "Get the weather",
                 "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
                {"type": "function", "name": "loose", "strict": false, "parameters": null},
                {"type": "web_search_preview"},
                "junk",
            ],
            "tool_choice": "required",
            "parallel_tool_calls": true,
            "reasoning": {"effort": "low", "summary": "auto"},
            "stream": true,
        });
        let out = conv(base.clone());
        assert_eq!(
            out["tools"],
            json!([
                {"type": "function", "function": {
                    "name": "get_weather", "description": "Get the weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                    "strict": true}},
                {"type": "function", "function": {"name": "loose", "strict": false, "parameters": null}},
            ])
        );
        assert_eq!(out["tool_choice"], json!("required"));
        assert_eq!(out["parallel_tool_calls"], json!(true));
        assert_eq!(out["reasoning_effort"], json!("low"));
        assert!(out.get("reasoning").is_none());
        assert_eq!(out["stream"], json!(true));
        assert_eq!(out["stream_options"], json!({"include_usage": true}));

        for (choice, want) in [
            (json!("auto"), json!("auto")),
            (json!("none"), json!("none")),
            (
                json!({"type": "function", "name": "get_weather"}),
                json!({"type": "function", "function": {"name": "get_weather"}}),
            ),
            (
                json!({"type": "allowed_tools", "mode": "required", "tools": []}),
                json!("required"),
            ),
            (json!({"type": "file_search"}), json!("auto")),
        ] {
            let mut b = base.clone();
            b["tool_choice"] = choice;
            assert_eq!(conv(b)["tool_choice"], want);
        }

        // Only hosted tools: no tools at all.
        let out = conv(json!({"input": "x", "tools": [{"type": "web_search"}]}));
        assert!(out.get("tools").is_none());

        // text.format → response_format.
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let out = conv(json!({"input": "x", "text": {"format": {
            "type": "json_schema", "name": "answer", "schema": schema, "strict": true}}}));
        assert_eq!(
            out["response_format"],
            json!({"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": true}})
        );
        assert!(out.get("text").is_none());
        let out = conv(json!({"input": "x", "text": {"format": {"type": "json_object"}}}));
        assert_eq!(out["response_format"], json!({"type": "json_object"}));
        let out =
            conv(json!({"input": "x", "text": {"format": {"type": "text"}, "verbosity": "low"}}));
        assert!(out.get("response_format").is_none());
        assert!(out.get("stream_options").is_none());
    }

    #[test]
    fn bad_requests() {
        let cases = [
            (json!({"model": "m"}), "input"),
            (json!({"input": null}), "input"),
            (json!({"input": 3}), "input"),
            (
                json!({"input": "x", "previous_response_id": "resp_1"}),
                "previous_response_id",
            ),
            (
                json!({"input": "x", "conversation": "conv_1"}),
                "conversation",
            ),
            (json!({"input": "x", "instructions": 1}), "instructions"),
            (
                json!({"input": "x", "tools": {"type": "function"}}),
                "tools",
            ),
            (json!({"input": ["hello"]}), "input[0]"),
            (json!({"input": [{"role": "user"}]}), "input[0]"),
            (
                json!({"input": [{"role": "tool", "content": "x"}]}),
                "input[0]",
            ),
            (
                json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
                "input[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_text"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "user", "content": ["x"]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "assistant", "type": "message", "content": [{"type": "output_text"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "assistant", "type": "message", "content": [{"type": "refusal"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "assistant", "type": "message", "content": [{"type": "image"}]}]}),
                "input[0].content[0]",
            ),
            (
                json!({"input": [{"role": "assistant", "type": "message", "content": 7}]}),
                "input[0].content",
            ),
            (
                json!({"input": [{"type": "function_call", "call_id": "c", "name": "f"}]}),
                "input[0]",
            ),
            (
                json!({"input": [{"type": "function_call_output", "output": "x"}]}),
                "input[0]",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": 1}]}),
                "input[0].output",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"text": "x"}]}]}),
                "input[0].output[0]",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "refusal"}]}]}),
                "input[0].output[0]",
            ),
            (
                json!({"input": [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}]}),
                "input[0].output[0]",
            ),
            (
                json!({"input": [{"type": "reasoning", "summary": []}]}),
                "input[0].content",
            ),
            (
                json!({"input": [{"type": "reasoning", "summary": [], "content": []}]}),
                "input[0].content",
            ),
            (
                json!({"input": [{"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text"}]}]}),
                "input[0].content[0].text",
            ),
            (
                json!({"input": [{"type": "reasoning", "content": [{"text": "x"}]}]}),
                "input[0]",
            ),
            (
                json!({"input": "x", "text": {"format": "json"}}),
                "text.format",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "grammar"}}}),
                "text.format.type",
            ),
            (
                json!({"input": "x", "text": {"format": {"type": "json_schema", "name": "a"}}}),
                "text.format.schema",
            ),
        ];
        for (body, param) in cases {
            let e = conv_err(body.clone());
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.kind, "invalid_request_error", "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        // An empty previous_response_id (or a non-string one) is no reference.
        conv(json!({"input": "x", "previous_response_id": ""}));
        conv(json!({"input": "x", "previous_response_id": null, "conversation": null}));
    }

    #[test]
    fn count_tokens_conversion() {
        let out = count_tokens_request(&obj(json!({
            "model": "m", "stream": true, "instructions": "S", "input": "Hello world",
        })))
        .unwrap();
        assert_eq!(out["messages"].as_array().unwrap().len(), 2);
        assert!(out.get("stream").is_none() && out.get("stream_options").is_none());
        assert_eq!(
            count_tokens_response(7),
            json!({"input_tokens": 7, "object": "response.input_tokens"})
        );
    }

    fn completion(message: Value) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny",
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                      "prompt_tokens_details": {"cached_tokens": 4}},
            "timings": {"prompt_n": 8},
        })
    }

    #[test]
    fn response_text() {
        let r = from_openai_response(&completion(
            json!({"role": "assistant", "content": "Suddenly"}),
        ));
        assert!(has_id(&r["id"], "resp_"));
        assert!(r["created_at"].as_u64().is_some_and(|t| t > 1_600_000_000));
        assert_eq!(r["completed_at"], r["created_at"]);
        assert_eq!(r["object"], "response");
        assert_eq!(r["status"], "completed");
        assert_eq!(r["model"], "tiny");
        assert_eq!(r["output"].as_array().unwrap().len(), 1);
        let m = &r["output"][0];
        assert!(has_id(&m["id"], "msg_"));
        assert_eq!(
            *m,
            json!({
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": "Suddenly"}],
                "id": m["id"], "role": "assistant", "status": "completed", "type": "message",
            })
        );
        assert_eq!(
            r["usage"],
            json!({"input_tokens": 12, "output_tokens": 5, "total_tokens": 17,
                   "input_tokens_details": {"cached_tokens": 4}})
        );
        assert!(r.get("timings").is_none());
        assert!(r.get("output_text").is_none());
        // Keys in llama-server's order.
        let keys: Vec<&String> = r.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "completed_at",
                "created_at",
                "id",
                "model",
                "object",
                "output",
                "status",
                "usage"
            ]
        );
        // Fresh ids each time.
        let r2 = from_openai_response(&completion(json!({"role": "assistant", "content": "x"})));
        assert_ne!(r["id"], r2["id"]);
    }

    #[test]
    fn response_reasoning_and_function_calls() {
        let r = from_openai_response(&completion(json!({
        "role": "assistant", "content": null, "reasoning_content": "Think.",
        "tool_calls": [
            {"id": "call_abc", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
            {"id": "xyz", "type": "function", "function": {"name": "now", "arguments": {"tz": "UTC"}}},
        ]})));
        let out = r["output"].as_array().unwrap();
        assert_eq!(out.len(), 3);
        assert!(has_id(&out[0]["id"], "rs_"));
        assert_eq!(
            out[0],
            json!({"id": out[0]["id"], "summary": [], "type": "reasoning",
                   "content": [{"text": "Think.", "type": "reasoning_text"}],
                   "encrypted_content": "", "status": "completed"})
        );
        assert_eq!(
            out[1],
            json!({"id": "fc_abc", "type": "function_call", "status": "completed",
                   "arguments": "{\"city\":\"Paris\"}", "call_id": "call_abc", "name": "get_weather"})
        );
        assert_eq!(
            out[2],
            json!({"id": "fc_xyz", "type": "function_call", "status": "completed",
                   "arguments": "{\"tz\":\"UTC\"}", "call_id": "call_xyz", "name": "now"})
        );
        // The call replayed as input gives back the chat call.
        let back = conv(json!({"input": [out[1].clone()]}));
        assert_eq!(back["messages"][0]["tool_calls"][0]["id"], "call_abc");

        // Empty and malformed answers do not panic.
        let r = from_openai_response(&completion(json!({"role": "assistant", "content": ""})));
        assert_eq!(r["output"], json!([]));
        let r = from_openai_response(&json!({}));
        assert_eq!(r["object"], "response");
        assert_eq!(r["usage"]["total_tokens"], 0);
        let r = from_openai_response(&json!("junk"));
        assert_eq!(r["output"], json!([]));
    }

    fn chunk(delta: Value) -> Value {
        json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1,
               "model": "tiny", "system_fingerprint": "lamina",
               "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}],
               "usage": null})
    }

    fn usage_chunk() -> Value {
        json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
               "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29,
                                        "prompt_tokens_details": {"cached_tokens": 3}},
               "timings": {"prompt_per_second": 100.0, "predicted_per_second": 50.0}})
    }

    /// Runs chunks through a converter: the events' data, each name checked against
    /// the data's `type` and the SSE framing.
    fn run(conv: &mut StreamConverter, chunks: &[Value]) -> Vec<Value> {
        let mut events: Vec<(&str, Value)> = Vec::new();
        for c in chunks {
            events.extend(conv.on_chunk(c));
        }
        events.extend(conv.finish());
        for (name, data) in &events {
            assert_eq!(data["type"], *name);
            assert_eq!(data.as_object().unwrap().keys().next().unwrap(), "type");
            let line = format_sse(Some(name), data);
            assert!(
                line.starts_with(&format!("event: {name}\ndata: {{\"type\":\"{name}\""))
                    && line.ends_with("}\n\n")
            );
        }
        events.into_iter().map(|(_, d)| d).collect()
    }

    #[test]
    fn stream_text_then_function_call() {
        let mut conv = StreamConverter::new("tiny");
        let resp = conv.response_id().to_string();
        assert!(has_id(&json!(resp), "resp_"));
        let chunks = [
            chunk(json!({"role": "assistant", "content": null})),
            chunk(json!({"content": "Let me"})),
            chunk(json!({"content": " check."})),
            chunk(json!({"tool_calls": [
                {"id": "call_a", "type": "function", "index": 0,
                 "function": {"name": "calculator", "arguments": "{\"expression\":\"2+2\"}"}}]})),
            json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
                   "choices": [{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "tool_calls"}]}),
            usage_chunk(),
            chunk(json!({"content": "after the end"})),
        ];
        let events = run(&mut conv, &chunks);
        let msg = events[2]["item"]["id"].clone();
        assert!(has_id(&msg, "msg_"));
        let stub = json!({"id": resp, "object": "response", "status": "in_progress"});
        let part = json!({"type": "output_text", "annotations": [], "logprobs": [], "text": "Let me check."});
        let message = json!({"type": "message", "status": "completed", "id": msg,
                             "content": [part], "role": "assistant"});
        let call = json!({"id": "fc_a", "type": "function_call", "status": "completed",
                          "arguments": "{\"expression\":\"2+2\"}", "call_id": "call_a", "name": "calculator"});
        let completed = &events[12];
        let created_at = completed["response"]["created_at"].clone();
        assert!(created_at.as_u64().is_some());
        assert_eq!(
            events,
            vec![
                json!({"type": "response.created", "response": stub}),
                json!({"type": "response.in_progress", "response": stub}),
                json!({"type": "response.output_item.added", "item": {
                    "content": [], "id": msg, "role": "assistant", "status": "in_progress", "type": "message"}}),
                json!({"type": "response.content_part.added", "item_id": msg,
                       "part": {"type": "output_text", "text": ""}}),
                json!({"type": "response.output_text.delta", "item_id": msg, "delta": "Let me"}),
                json!({"type": "response.output_text.delta", "item_id": msg, "delta": " check."}),
                json!({"type": "response.output_item.added", "item": {
                    "id": "fc_a", "arguments": "", "call_id": "call_a", "name": "calculator",
                    "type": "function_call", "status": "in_progress"}}),
                json!({"type": "response.function_call_arguments.delta",
                       "delta": "{\"expression\":\"2+2\"}", "item_id": "fc_a"}),
                json!({"type": "response.output_text.done", "item_id": msg, "text": "Let me check."}),
                json!({"type": "response.content_part.done", "item_id": msg, "part": part}),
                json!({"type": "response.output_item.done", "item": message}),
                json!({"type": "response.output_item.done", "item": call}),
                json!({"type": "response.completed", "response": {
                    "id": resp, "object": "response", "created_at": created_at, "status": "completed",
                    "model": "tiny", "output": [message, call],
                    "usage": {"input_tokens": 20, "output_tokens": 9, "total_tokens": 29,
                              "input_tokens_details": {"cached_tokens": 3}}},
                    "timings": {"prompt_per_second": 100.0, "predicted_per_second": 50.0}}),
            ]
        );

        // What test_compat_oai_responses.py's stream test checks.
        let mut resp_id = String::new();
        let mut msg_id = String::new();
        let mut gathered = String::new();
        for e in &events {
            let t = e["type"].as_str().unwrap();
            match t {
                "response.created" => {
                    resp_id = e["response"]["id"].as_str().unwrap().to_string();
                    assert!(resp_id.starts_with("resp_"));
                }
                "response.in_progress" => assert_eq!(e["response"]["id"], resp_id.as_str()),
                "response.output_item.added" if e["item"]["type"] == "message" => {
                    msg_id = e["item"]["id"].as_str().unwrap().to_string();
                    assert!(msg_id.starts_with("msg_"));
                }
                "response.content_part.added"
                | "response.output_text.delta"
                | "response.output_text.done"
                | "response.content_part.done" => assert_eq!(e["item_id"], msg_id.as_str()),
                "response.completed" => {
                    let output = &e["response"]["output"];
                    assert!(output[0]["id"].as_str().unwrap().starts_with("msg_"));
                    // OpenAI's SDK: output_text = the output_text parts of messages.
                    let text: String = output
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|i| i["type"] == "message")
                        .flat_map(|i| i["content"].as_array().unwrap().iter())
                        .filter(|p| p["type"] == "output_text")
                        .map(|p| p["text"].as_str().unwrap())
                        .collect();
                    assert_eq!(gathered, text);
                    assert!(e["response"].get("usage").is_some());
                    assert!(e.get("timings").is_some());
                }
                _ => {}
            }
            if t == "response.output_text.delta" {
                gathered.push_str(e["delta"].as_str().unwrap());
            }
        }
        // Nothing more once the response completed.
        assert!(conv.on_chunk(&chunks[1]).is_empty());
        assert!(conv.finish().is_empty());
    }

    #[test]
    fn stream_reasoning_progress_and_timings() {
        // test_responses_stream_with_llama_telemetry: progress on in_progress events,
        // timings on deltas and on response.completed.
        let mut conv = StreamConverter::new("tiny");
        let progress = |processed: u64| {
            let mut c = chunk(json!({"role": "assistant", "content": null}));
            c["prompt_progress"] =
                json!({"total": 40, "cache": 0, "processed": processed, "time_ms": 3});
            c
        };
        let timed = |delta: Value| {
            let mut c = chunk(delta);
            c["timings"] = json!({"prompt_per_second": 10.0, "predicted_per_second": 5.0});
            c
        };
        let events = run(
            &mut conv,
            &[
                chunk(json!({"role": "assistant", "content": null})),
                progress(32),
                progress(40),
                timed(json!({"reasoning_content": "Hmm"})),
                timed(json!({"reasoning_content": ".", "content": "This"})),
                timed(json!({"content": " is"})),
                usage_chunk(),
            ],
        );
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.in_progress",
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.delta",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_item.done",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.completed",
            ]
        );
        for (i, e) in events.iter().enumerate() {
            let want_progress = i == 1 || i == 2;
            assert_eq!(e.get("prompt_progress").is_some(), want_progress, "{i}");
            if want_progress {
                assert_eq!(e["type"], "response.in_progress");
            }
            // Timings on the last event of each timed chunk, and on completed.
            let want_timings = matches!(i, 4 | 8 | 9 | 14);
            assert_eq!(e.get("timings").is_some(), want_timings, "{i}");
        }
        assert_eq!(events[2]["prompt_progress"]["processed"], 40);
        let rs = events[3]["item"].clone();
        assert!(has_id(&rs["id"], "rs_"));
        assert_eq!(
            rs,
            json!({"id": rs["id"], "summary": [], "type": "reasoning", "content": [],
                   "encrypted_content": "", "status": "in_progress"})
        );
        assert_eq!(
            events[4],
            json!({"type": "response.reasoning_text.delta", "delta": "Hmm", "item_id": rs["id"],
                   "timings": {"prompt_per_second": 10.0, "predicted_per_second": 5.0}})
        );
        assert_eq!(
            events[10]["item"],
            json!({"id": rs["id"], "summary": [], "type": "reasoning",
                   "content": [{"text": "Hmm.", "type": "reasoning_text"}], "encrypted_content": ""})
        );
        let output = &events[14]["response"]["output"];
        assert_eq!(output[0]["type"], "reasoning");
        assert_eq!(output[1]["content"][0]["text"], "This is");
        assert_ne!(rs["id"], output[1]["id"]);
    }

    #[test]
    fn stream_edge_cases() {
        // Nothing at all: still a well-formed (empty) response.
        let mut conv = StreamConverter::new("tiny");
        let events = run(
            &mut conv,
            &[chunk(json!({"role": "assistant", "content": null}))],
        );
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types,
            [
                "response.created",
                "response.in_progress",
                "response.completed"
            ]
        );
        assert_eq!(events[2]["response"]["output"], json!([]));
        assert_eq!(events[2]["response"]["usage"]["input_tokens"], 0);
        assert!(events[2].get("timings").is_none());

        // Tool-call arguments in pieces (OpenAI style), a second call, other choices,
        // errors and junk ignored.
        let mut conv = StreamConverter::new("tiny");
        let mut other = chunk(json!({"content": "other choice"}));
        other["choices"][0]["index"] = json!(1);
        let events = run(
            &mut conv,
            &[
                json!("not an object"),
                json!(null),
                json!({"choices": "bad", "usage": 3}),
                other,
                chunk(
                    json!({"tool_calls": [{"index": 0, "id": "call_x", "type": "function",
                                             "function": {"name": "f", "arguments": ""}}]}),
                ),
                chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]})),
                chunk(json!({"tool_calls": [{"index": 1, "id": "y", "function": {"name": "g"}}]})),
                chunk(json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]})),
                chunk(json!({"tool_calls": [{"index": 1, "function": {"arguments": {"b": 2}}}]})),
                json!({"error": {"message": "boom"}}),
                chunk(json!({"tool_calls": "bad", "content": 5, "reasoning_content": null})),
            ],
        );
        let summary: Vec<String> = events
            .iter()
            .map(|e| {
                format!(
                    "{}:{}",
                    e["type"].as_str().unwrap(),
                    e["item_id"]
                        .as_str()
                        .or(e["item"]["id"].as_str())
                        .unwrap_or("")
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                "response.created:",
                "response.in_progress:",
                "response.output_item.added:fc_x",
                "response.function_call_arguments.delta:fc_x",
                "response.output_item.added:fc_y",
                "response.function_call_arguments.delta:fc_x",
                "response.function_call_arguments.delta:fc_y",
                "response.output_item.done:fc_x",
                "response.output_item.done:fc_y",
                "response.completed:",
            ]
        );
        assert_eq!(events[7]["item"]["arguments"], "{\"a\":1}");
        assert_eq!(events[7]["item"]["call_id"], "call_x");
        assert_eq!(events[8]["item"]["arguments"], "{\"b\":2}");
        assert_eq!(events[8]["item"]["name"], "g");
        assert_eq!(events[9]["response"]["output"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn stream_error_shape() {
        let e = stream_error(&ApiError::internal("boom"));
        assert_eq!(
            e,
            json!({"error": {"code": 500, "message": "boom", "type": "server_error"}})
        );
        assert_eq!(
            format_sse(None, &e),
            "data: {\"error\":{\"code\":500,\"message\":\"boom\",\"type\":\"server_error\"}}\n\n"
        );
    }

    #[test]
    fn random_ids() {
        let a = random_string();
        let b = random_string();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_alphanumeric()));
        assert_ne!(a, b);
    }
}
