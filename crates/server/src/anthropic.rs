//! Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) as
//! llama-server implements it: pure JSON conversions around the OpenAI chat-completions
//! pipeline, ported from llama.cpp's `server_chat_convert_anthropic_to_oai`
//! (server-chat.cpp), `server_task_result_cmpl_final::to_json_anthropic{,_stream}` and
//! `server_task_result_cmpl_partial::to_json_anthropic` (server-task.cpp).
//!
//! * [`to_openai_chat`] turns an Anthropic request into the body `/v1/chat/completions`
//!   takes;
//! * [`from_openai_response`] turns the chat completion back into an Anthropic message;
//! * [`StreamConverter`] turns the `chat.completion.chunk`s of a streamed answer into
//!   Anthropic's server-sent events (`message_start`, `content_block_*`,
//!   `message_delta`, `message_stop`);
//! * [`count_tokens_request`] / [`count_tokens_response`] serve `count_tokens`.
//!
//! Errors keep the server's usual (OpenAI-shaped) bodies, as llama-server answers
//! `/v1/messages` errors with its `format_error_response` object too; only an error in
//! the middle of a stream becomes an Anthropic `error` event ([`stream_error_event`]).

use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// `max_tokens` when the request has none (Anthropic requires it; llama-server is
/// permissive and uses this).
pub const DEFAULT_MAX_TOKENS: u64 = 4096;

/// `thinking.budget_tokens` when `thinking.type` is `enabled` without a budget.
pub const DEFAULT_THINKING_BUDGET: i64 = 10000;

/// The string at `key` of `v`, or `""` when `v` is not an object, the key is missing,
/// null or not a string (llama.cpp's `json_value(v, key, std::string())`).
fn str_at<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

/// `v[key]` unless missing or null.
fn non_null<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.get(key).filter(|x| !x.is_null())
}

/// Rewrites the 5-character `cch=` stamp of a Claude Code
/// `x-anthropic-billing-header:` system prompt to `fffff`, so that it stops changing
/// from request to request and the prompt cache gets past it (llama.cpp PR 21793).
/// Other prompts are left alone.
fn normalize_billing_header(text: &mut String) {
    const PREFIX: &str = "x-anthropic-billing-header:";
    const CCH_LEN: usize = 5;
    if !text.starts_with(PREFIX) {
        return;
    }
    let Some(at) = text[PREFIX.len()..].find("cch=") else {
        return;
    };
    let start = PREFIX.len() + at + 4;
    let end = start + CCH_LEN;
    // `start` follows ASCII and `end` is an ASCII ';', so both are char boundaries.
    if end < text.len() && text.as_bytes()[end] == b';' && text.is_char_boundary(start) {
        text.replace_range(start..end, "fffff");
    } else {
        tracing::warn!("anthropic billing header not as expected: {text}");
    }
}

/// Serializes like nlohmann's `dump()`: compact, object keys sorted (nlohmann objects
/// are ordered maps), so tool-call arguments render as llama-server renders them.
fn dump_sorted(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(
                    keys.into_iter()
                        .map(|k| (k.clone(), sorted(&m[k])))
                        .collect(),
                )
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

/// An Anthropic image `source` as an OpenAI `image_url` part: `base64` sources become
/// `data:` URLs (media type defaulting to `image/jpeg`), `url` sources keep their URL;
/// other sources give nothing (dropped, as llama.cpp does).
fn image_part(block: &Value) -> Option<Value> {
    let source = block.get("source").filter(|s| s.is_object())?;
    let url = match str_at(source, "type") {
        "base64" => {
            let media_type = source
                .get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("image/jpeg");
            format!("data:{media_type};base64,{}", str_at(source, "data"))
        }
        "url" => str_at(source, "url").to_string(),
        _ => return None,
    };
    Some(json!({"type": "image_url", "image_url": {"url": url}}))
}

/// The `type` of content block `j` of `where_`, which must be an object with a string
/// `type`.
fn block_type<'a>(block: &'a Value, where_: &str, j: usize) -> Result<&'a str, ApiError> {
    if !block.is_object() {
        return Err(ApiError::invalid_param(
            format!("{where_}[{j}]"),
            format!("{where_}[{j}] must be a content block object"),
        ));
    }
    match block.get("type") {
        Some(Value::String(t)) => Ok(t),
        _ => Err(ApiError::invalid_param(
            format!("{where_}[{j}].type"),
            format!("{where_}[{j}].type must be a string"),
        )),
    }
}

/// The OpenAI `role: tool` message for a `tool_result` block: string content as is,
/// text-only block lists collapsed into one string, lists with images kept as parts
/// (`text` and `image_url`), anything else `""`. `is_error` is not carried over.
fn tool_result_message(block: &Value, where_: &str) -> Result<Value, ApiError> {
    let tool_use_id = str_at(block, "tool_use_id");
    let content = match non_null(block, "content") {
        Some(Value::String(s)) => Value::String(s.clone()),
        Some(Value::Array(items)) => {
            let mut text = String::new();
            let mut parts = Vec::new();
            let mut has_images = false;
            let inner = format!("{where_}.content");
            for (k, c) in items.iter().enumerate() {
                match block_type(c, &inner, k)? {
                    "text" => {
                        let t = str_at(c, "text");
                        text.push_str(t);
                        parts.push(json!({"type": "text", "text": t}));
                    }
                    "image" => {
                        has_images = true;
                        parts.extend(image_part(c));
                    }
                    _ => {}
                }
            }
            if has_images {
                Value::Array(parts)
            } else {
                Value::String(text)
            }
        }
        _ => Value::String(String::new()),
    };
    Ok(json!({"role": "tool", "tool_call_id": tool_use_id, "content": content}))
}

/// Converts an Anthropic Messages request into the OpenAI chat-completions body our
/// `/v1/chat/completions` handler takes, as llama-server's
/// `server_chat_convert_anthropic_to_oai` does:
///
/// * `system` (a string, or blocks whose `text` ones are concatenated) becomes a first
///   `system` message (Claude Code's billing-header stamp normalized);
/// * string-content messages pass through unchanged; block lists are split: `text`
///   blocks stay as content parts, `image` blocks become `image_url` parts, `thinking`
///   blocks are concatenated into `reasoning_content`, `tool_use` blocks become
///   `tool_calls` (arguments: the `input` as compact JSON), and each `tool_result`
///   becomes a `role: tool` message placed after the message built from the rest (which
///   is dropped when nothing is left); other block types are ignored; an assistant
///   message without `content` is skipped;
/// * `tools` become functions with `parameters` = `input_schema`; `tool_choice`
///   `auto` → `"auto"`, `any`/`tool` → `"required"`, `none` → `"none"`;
/// * `stop_sequences` → `stop`; `max_tokens` (default [`DEFAULT_MAX_TOKENS`]);
///   `temperature`, `top_p`, `top_k`, `stream`, `chat_template_kwargs` pass through;
///   `thinking: {type: enabled}` → `thinking_budget_tokens`; `metadata.user_id` →
///   `__metadata_user_id`. `model` is not carried over (the served model answers).
/// * Lamina's addition: a streamed request gets `stream_options.include_usage`, so the
///   usage chunk that [`StreamConverter`] needs for `message_delta.usage` arrives.
///
/// Errors (400) where llama-server would build an unusable request: `messages` missing
/// or not an array, a message that is not an object or has a non-string `role`,
/// content that is neither a string, an array nor null, a content block that is not
/// an object with a string `type`, a `tool_use` whose `input` is not an object, a
/// `system` that is neither a string nor an array, `tools` that is not an array of
/// objects.
pub fn to_openai_chat(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut out = Map::new();
    let mut messages: Vec<Value> = Vec::new();

    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            let mut s = s.clone();
            normalize_billing_header(&mut s);
            messages.push(json!({"role": "system", "content": s}));
        }
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (j, block) in blocks.iter().enumerate() {
                if block_type(block, "system", j)? == "text" {
                    let mut t = str_at(block, "text").to_string();
                    normalize_billing_header(&mut t);
                    text.push_str(&t);
                }
            }
            messages.push(json!({"role": "system", "content": text}));
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "system",
                "system must be a string or an array of text blocks",
            ));
        }
    }

    let list = match body.get("messages") {
        None => {
            return Err(ApiError::invalid_param(
                "messages",
                "'messages' is required",
            ));
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(ApiError::invalid_param(
                "messages",
                "messages must be an array",
            ));
        }
    };
    for (i, msg) in list.iter().enumerate() {
        let Some(obj) = msg.as_object() else {
            return Err(ApiError::invalid_param(
                format!("messages[{i}]"),
                format!("messages[{i}] must be an object"),
            ));
        };
        let role = match obj.get("role") {
            None | Some(Value::Null) => "",
            Some(Value::String(r)) => r.as_str(),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].role"),
                    format!("messages[{i}].role must be a string"),
                ));
            }
        };
        let blocks = match obj.get("content") {
            None if role == "assistant" => continue,
            // Passed on as is: the chat handler reports a missing or null content.
            None | Some(Value::Null) | Some(Value::String(_)) => {
                messages.push(msg.clone());
                continue;
            }
            Some(Value::Array(blocks)) => blocks,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    format!("messages[{i}].content"),
                    format!("messages[{i}].content must be a string or an array of content blocks"),
                ));
            }
        };
        let where_ = format!("messages[{i}].content");
        let mut content = Vec::new();
        let mut tool_calls = Vec::new();
        let mut tool_results = Vec::new();
        let mut reasoning = String::new();
        for (j, block) in blocks.iter().enumerate() {
            match block_type(block, &where_, j)? {
                "text" => content.push(block.clone()),
                "thinking" => reasoning.push_str(str_at(block, "thinking")),
                "image" => content.extend(image_part(block)),
                "tool_use" => {
                    let input = match non_null(block, "input") {
                        None => Value::Object(Map::new()),
                        Some(v @ Value::Object(_)) => v.clone(),
                        Some(_) => {
                            return Err(ApiError::invalid_param(
                                format!("{where_}[{j}].input"),
                                format!("{where_}[{j}].input must be an object"),
                            ));
                        }
                    };
                    tool_calls.push(json!({
                        "id": str_at(block, "id"),
                        "type": "function",
                        "function": {
                            "name": str_at(block, "name"),
                            "arguments": dump_sorted(&input),
                        },
                    }));
                }
                "tool_result" => {
                    tool_results.push(tool_result_message(block, &format!("{where_}[{j}]"))?)
                }
                _ => {}
            }
        }
        if !content.is_empty() || !tool_calls.is_empty() || !reasoning.is_empty() {
            let mut m = Map::new();
            m.insert("role".into(), json!(role));
            m.insert(
                "content".into(),
                if content.is_empty() {
                    json!("")
                } else {
                    Value::Array(content)
                },
            );
            if !tool_calls.is_empty() {
                m.insert("tool_calls".into(), Value::Array(tool_calls));
            }
            if !reasoning.is_empty() {
                m.insert("reasoning_content".into(), json!(reasoning));
            }
            messages.push(Value::Object(m));
        }
        messages.extend(tool_results);
    }
    out.insert("messages".into(), Value::Array(messages));

    match body.get("tools") {
        None | Some(Value::Null) => {}
        Some(Value::Array(tools)) => {
            let mut oai = Vec::with_capacity(tools.len());
            for (i, tool) in tools.iter().enumerate() {
                if !tool.is_object() {
                    return Err(ApiError::invalid_param(
                        format!("tools[{i}]"),
                        format!("tools[{i}] must be an object"),
                    ));
                }
                let parameters = tool
                    .get("input_schema")
                    .cloned()
                    .unwrap_or_else(|| Value::Object(Map::new()));
                oai.push(json!({
                    "type": "function",
                    "function": {
                        "name": str_at(tool, "name"),
                        "description": str_at(tool, "description"),
                        "parameters": parameters,
                    },
                }));
            }
            out.insert("tools".into(), Value::Array(oai));
        }
        Some(_) => return Err(ApiError::invalid_param("tools", "tools must be an array")),
    }

    if let Some(tc) = body.get("tool_choice").filter(|v| v.is_object()) {
        let choice = match str_at(tc, "type") {
            "auto" => Some("auto"),
            "any" | "tool" => Some("required"),
            // Not mapped by llama-server (tools stay allowed); here tools are off.
            "none" => Some("none"),
            _ => None,
        };
        if let Some(c) = choice {
            out.insert("tool_choice".into(), json!(c));
        }
    }

    if let Some(stop) = body.get("stop_sequences") {
        out.insert("stop".into(), stop.clone());
    }

    out.insert(
        "max_tokens".into(),
        body.get("max_tokens")
            .cloned()
            .unwrap_or(json!(DEFAULT_MAX_TOKENS)),
    );

    for key in [
        "temperature",
        "top_p",
        "top_k",
        "stream",
        "chat_template_kwargs",
    ] {
        if let Some(v) = body.get(key) {
            out.insert(key.into(), v.clone());
        }
    }
    if body.get("stream").and_then(Value::as_bool) == Some(true) {
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }

    if let Some(thinking) = body.get("thinking")
        && str_at(thinking, "type") == "enabled"
    {
        let budget = thinking
            .get("budget_tokens")
            .and_then(Value::as_i64)
            .unwrap_or(DEFAULT_THINKING_BUDGET);
        out.insert("thinking_budget_tokens".into(), json!(budget));
    }

    if let Some(metadata) = body.get("metadata") {
        let user_id = str_at(metadata, "user_id");
        if !user_id.is_empty() {
            out.insert("__metadata_user_id".into(), json!(user_id));
        }
    }

    Ok(out)
}

/// The body to render and tokenize for `POST /v1/messages/count_tokens`: the same
/// conversion as [`to_openai_chat`] (llama-server's `handle_count_tokens` uses it
/// too; `max_tokens` is not required). `stream` and `stream_options` are dropped,
/// since nothing is generated.
pub fn count_tokens_request(body: &Map<String, Value>) -> Result<Map<String, Value>, ApiError> {
    let mut out = to_openai_chat(body)?;
    out.remove("stream");
    out.remove("stream_options");
    Ok(out)
}

/// The `count_tokens` answer: `{"input_tokens": N}` and nothing else (llama-server adds
/// `"object"` only on its OpenAI endpoints).
pub fn count_tokens_response(input_tokens: usize) -> Value {
    json!({"input_tokens": input_tokens})
}

/// Anthropic's stop reason for an OpenAI finish reason, as llama-server decides it:
/// an end of generation or a stop string is `end_turn` (`tool_use` when the answer
/// holds tool calls); anything else (`length`, a grammar dead end, ...) `max_tokens`.
/// llama-server never reports `stop_sequence` as a reason; the matched string goes
/// in `stop_sequence`.
pub fn stop_reason(finish_reason: &str, has_tool_calls: bool) -> &'static str {
    match finish_reason {
        "tool_calls" => "tool_use",
        "stop" if has_tool_calls => "tool_use",
        "stop" => "end_turn",
        _ => "max_tokens",
    }
}

/// `usage` numbers of an OpenAI usage object: (prompt, cached, completion).
fn usage_numbers(usage: &Value) -> (u64, u64, u64) {
    let n = |v: &Value| v.as_u64().unwrap_or(0);
    (
        n(&usage["prompt_tokens"]),
        n(&usage["prompt_tokens_details"]["cached_tokens"]),
        n(&usage["completion_tokens"]),
    )
}

/// Converts our non-streamed `chat.completion` (its first choice) into an Anthropic
/// message, as llama-server's `to_json_anthropic`: `content` is a `thinking` block
/// (with an empty `signature`) when there is reasoning, a `text` block when there is
/// content, then a `tool_use` block per call with the arguments parsed into `input`
/// (`{}` when they do not parse); `stop_reason` from [`stop_reason`];
/// `stop_sequence` is `stop_sequence` (the matched stop string, which the chat JSON
/// does not carry) or null; `usage` has `cache_read_input_tokens`, `input_tokens`
/// (prompt tokens not read from the cache) and `output_tokens`. `id` and `model` are
/// the completion's. No `timings`.
pub fn from_openai_response(resp: &Value, stop_sequence: Option<&str>) -> Value {
    let choice = &resp["choices"][0];
    let msg = &choice["message"];
    let mut content = Vec::new();
    let reasoning = str_at(msg, "reasoning_content");
    if !reasoning.is_empty() {
        content.push(json!({"type": "thinking", "thinking": reasoning, "signature": ""}));
    }
    let text = str_at(msg, "content");
    if !text.is_empty() {
        content.push(json!({"type": "text", "text": text}));
    }
    let calls = msg["tool_calls"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    for call in calls {
        let f = &call["function"];
        let input = match &f["arguments"] {
            Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| json!({})),
            Value::Null => json!({}),
            other => other.clone(),
        };
        content.push(json!({
            "type": "tool_use",
            "id": str_at(call, "id"),
            "name": str_at(f, "name"),
            "input": input,
        }));
    }
    let (prompt, cached, completion) = usage_numbers(&resp["usage"]);
    json!({
        "id": resp["id"],
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": resp["model"],
        "stop_reason": stop_reason(str_at(choice, "finish_reason"), !calls.is_empty()),
        "stop_sequence": stop_sequence.filter(|s| !s.is_empty()),
        "usage": {
            "cache_read_input_tokens": cached,
            "input_tokens": prompt.saturating_sub(cached),
            "output_tokens": completion,
        },
    })
}

/// An error that happens once a stream has started, as llama-server sends it:
/// `event: error` with its error object (`code`, `message`, `type`) as data.
pub fn stream_error_event(err: &ApiError) -> (&'static str, Value) {
    (
        "error",
        json!({"code": err.status.as_u16(), "message": err.message, "type": err.kind}),
    )
}

/// One server-sent event as llama-server writes it: `event: NAME\ndata: JSON\n\n`.
pub fn format_sse(name: &str, data: &Value) -> String {
    format!("event: {name}\ndata: {data}\n\n")
}

/// An event (name, data) with the name repeated as the data's `type`.
type SseEvent = (&'static str, Value);

fn event(name: &'static str, mut data: Value) -> SseEvent {
    if let Value::Object(m) = &mut data {
        let mut with_type = Map::new();
        with_type.insert("type".into(), json!(name));
        with_type.extend(std::mem::take(m));
        *m = with_type;
    }
    (name, data)
}

/// Turns the `chat.completion.chunk`s of one streamed chat answer into Anthropic's
/// server-sent events, in llama-server's order:
///
/// 1. `message_start` (with the first chunk): the message with empty `content`, null
///    `stop_reason`, and `usage` (prompt tokens from [`StreamConverter::new`],
///    `output_tokens: 0`);
/// 2. per delta: `content_block_start` the first time a block appears, then
///    `content_block_delta` — `thinking_delta` for `reasoning_content`, `text_delta`
///    for `content`, and for each tool call a `tool_use` block (`id`, `name`) with an
///    `input_json_delta` of its arguments. Blocks are numbered in order of
///    appearance (thinking 0, text next, tool calls after, as llama-server numbers
///    them) and stay open until the end, as llama-server keeps them;
/// 3. with the chunk holding `finish_reason`: a `signature_delta` (empty) for the
///    thinking block, then `content_block_stop` for every block in index order;
/// 4. with the usage chunk (empty `choices`), or [`StreamConverter::finish`]:
///    `message_delta` (`stop_reason`, `stop_sequence`, `usage.output_tokens`) and
///    `message_stop`.
///
/// Only the choice with index 0 is read (Anthropic has no `n`). llama-server sends no
/// `ping` events (its keep-alive is an SSE comment, the wiring's business).
#[derive(Debug)]
pub struct StreamConverter {
    model: String,
    input_tokens: u64,
    cached_tokens: u64,
    started: bool,
    next_index: usize,
    thinking: Option<usize>,
    text: Option<usize>,
    /// (OpenAI tool-call index, block index), in order of appearance.
    tools: Vec<(u64, usize)>,
    blocks_closed: bool,
    finish_reason: Option<String>,
    stop_sequence: Option<String>,
    output_tokens: Option<u64>,
    done: bool,
}

impl StreamConverter {
    /// A converter for one answer of `model`. `prompt_tokens` is the prompt's size and
    /// `cached_tokens` how many of them were reused from the cache (0 when not known
    /// yet): `message_start.usage` reports `input_tokens = prompt_tokens -
    /// cached_tokens` and `cache_read_input_tokens = cached_tokens`, as llama-server.
    pub fn new(model: &str, prompt_tokens: u64, cached_tokens: u64) -> StreamConverter {
        StreamConverter {
            model: model.to_string(),
            input_tokens: prompt_tokens.saturating_sub(cached_tokens),
            cached_tokens,
            started: false,
            next_index: 0,
            thinking: None,
            text: None,
            tools: Vec::new(),
            blocks_closed: false,
            finish_reason: None,
            stop_sequence: None,
            output_tokens: None,
            done: false,
        }
    }

    /// The stop string that ended generation (the chunks do not carry it), reported
    /// as `message_delta.delta.stop_sequence`; call it before the final events go out.
    /// Empty means none.
    pub fn set_stop_sequence(&mut self, word: &str) {
        self.stop_sequence = (!word.is_empty()).then(|| word.to_string());
    }

    /// The output token count for `message_delta.usage`, when the wiring knows it
    /// without a usage chunk.
    pub fn set_output_tokens(&mut self, n: u64) {
        self.output_tokens = Some(n);
    }

    fn start(&mut self, id: &Value, out: &mut Vec<SseEvent>) {
        if self.started {
            return;
        }
        self.started = true;
        out.push(event(
            "message_start",
            json!({"message": {
                "id": if id.is_string() { id.clone() } else { json!("") },
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": self.model,
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {
                    "cache_read_input_tokens": self.cached_tokens,
                    "input_tokens": self.input_tokens,
                    "output_tokens": 0,
                },
            }}),
        ));
    }

    fn open(
        next_index: &mut usize,
        slot: &mut Option<usize>,
        block: Value,
        out: &mut Vec<SseEvent>,
    ) -> usize {
        if let Some(i) = *slot {
            return i;
        }
        let i = *next_index;
        *next_index += 1;
        *slot = Some(i);
        out.push(event(
            "content_block_start",
            json!({"index": i, "content_block": block}),
        ));
        i
    }

    fn delta(index: usize, delta: Value) -> SseEvent {
        event(
            "content_block_delta",
            json!({"index": index, "delta": delta}),
        )
    }

    fn on_delta(&mut self, delta: &Value, out: &mut Vec<SseEvent>) {
        let reasoning = str_at(delta, "reasoning_content");
        if !reasoning.is_empty() {
            let i = Self::open(
                &mut self.next_index,
                &mut self.thinking,
                json!({"type": "thinking", "thinking": ""}),
                out,
            );
            out.push(Self::delta(
                i,
                json!({"type": "thinking_delta", "thinking": reasoning}),
            ));
        }
        let text = str_at(delta, "content");
        if !text.is_empty() {
            let i = Self::open(
                &mut self.next_index,
                &mut self.text,
                json!({"type": "text", "text": ""}),
                out,
            );
            out.push(Self::delta(i, json!({"type": "text_delta", "text": text})));
        }
        let calls = delta["tool_calls"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for (pos, call) in calls.iter().enumerate() {
            let tc_index = call["index"].as_u64().unwrap_or(pos as u64);
            let f = &call["function"];
            let block = match self.tools.iter().find(|(t, _)| *t == tc_index) {
                Some(&(_, b)) => b,
                None => {
                    let b = self.next_index;
                    self.next_index += 1;
                    self.tools.push((tc_index, b));
                    out.push(event(
                        "content_block_start",
                        json!({"index": b, "content_block": {
                            "type": "tool_use",
                            "id": str_at(call, "id"),
                            "name": str_at(f, "name"),
                        }}),
                    ));
                    b
                }
            };
            let args = match &f["arguments"] {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            if !args.is_empty() {
                out.push(Self::delta(
                    block,
                    json!({"type": "input_json_delta", "partial_json": args}),
                ));
            }
        }
    }

    fn close_blocks(&mut self, out: &mut Vec<SseEvent>) {
        if self.blocks_closed {
            return;
        }
        self.blocks_closed = true;
        let mut open: Vec<usize> = self.thinking.into_iter().chain(self.text).collect();
        open.extend(self.tools.iter().map(|&(_, b)| b));
        open.sort_unstable();
        for i in open {
            if Some(i) == self.thinking {
                // Anthropic's API wants a signature before a thinking block closes;
                // local models have none.
                out.push(Self::delta(
                    i,
                    json!({"type": "signature_delta", "signature": ""}),
                ));
            }
            out.push(event("content_block_stop", json!({"index": i})));
        }
    }

    fn end_message(&mut self, out: &mut Vec<SseEvent>) {
        if self.done {
            return;
        }
        self.done = true;
        let reason = stop_reason(
            self.finish_reason.as_deref().unwrap_or("stop"),
            !self.tools.is_empty(),
        );
        out.push(event(
            "message_delta",
            json!({
                "delta": {"stop_reason": reason, "stop_sequence": self.stop_sequence},
                "usage": {"output_tokens": self.output_tokens.unwrap_or(0)},
            }),
        ));
        out.push(event("message_stop", json!({})));
    }

    /// The events for one `chat.completion.chunk` (parsed JSON). Chunks after the
    /// message ended give nothing.
    pub fn on_chunk(&mut self, chunk: &Value) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        self.start(&chunk["id"], &mut out);
        let choices = chunk["choices"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or(&[]);
        for choice in choices {
            if choice["index"].as_u64().unwrap_or(0) != 0 {
                continue;
            }
            if !self.blocks_closed {
                self.on_delta(&choice["delta"], &mut out);
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.finish_reason = Some(reason.to_string());
                self.close_blocks(&mut out);
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.output_tokens = Some(usage_numbers(usage).2);
            if self.finish_reason.is_some() {
                self.end_message(&mut out);
            }
        }
        out
    }

    /// What must still go out when the stream of chunks ends normally: the
    /// `message_start` if no chunk came, the `content_block_stop`s if no
    /// `finish_reason` came, and `message_delta` + `message_stop` if no usage chunk
    /// came (`output_tokens` then from [`StreamConverter::set_output_tokens`], else
    /// 0). Nothing once the message ended. After a failure send
    /// [`stream_error_event`] instead.
    pub fn finish(&mut self) -> Vec<(&'static str, Value)> {
        let mut out = Vec::new();
        if self.done {
            return out;
        }
        self.start(&Value::Null, &mut out);
        self.close_blocks(&mut out);
        self.end_message(&mut out);
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

    #[test]
    fn system_string_and_blocks() {
        let out = conv(json!({
            "system": "You are helpful.",
            "messages": [{"role": "user", "content": "Hi"}],
        }));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "system", "content": "You are helpful."},
                {"role": "user", "content": "Hi"},
            ])
        );
        assert_eq!(out["max_tokens"], json!(4096));
        assert!(out.get("model").is_none());
        let out = conv(json!({
            "system": [
                {"type": "text", "text": "A"},
                {"type": "image", "source": {}},
                {"type": "text", "text": "B", "cache_control": {"type": "ephemeral"}},
            ],
            "messages": [],
        }));
        assert_eq!(
            out["messages"],
            json!([{"role": "system", "content": "AB"}])
        );
    }

    #[test]
    fn billing_header_is_normalized() {
        let out = conv(json!({
            "system": "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=a5145;You are Claude Code.",
            "messages": [],
        }));
        assert_eq!(
            out["messages"][0]["content"],
            "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; cch=fffff;You are Claude Code."
        );
        // Not the header, or not as expected: unchanged.
        for s in [
            "cch=a5145;hello",
            "x-anthropic-billing-header: cch=a51;x",
            "x-anthropic-billing-header: cch=a5145",
            "x-anthropic-billing-header: cch=ééé;",
        ] {
            let mut t = s.to_string();
            normalize_billing_header(&mut t);
            assert_eq!(t, s);
        }
    }

    #[test]
    fn text_image_and_thinking_blocks() {
        let out = conv(json!({"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "What is"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                {"type": "image", "source": {"type": "base64", "data": "BBBB"}},
                {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}},
                {"type": "image", "source": {"type": "file", "file_id": "f"}},
                {"type": "document", "source": {}},
                {"type": "text", "text": " this?"},
            ]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Hmm, ", "signature": "sig"},
                {"type": "thinking", "thinking": "a truck."},
                {"type": "text", "text": "A truck."},
            ]},
            {"role": "assistant"},
            {"role": "user", "content": []},
        ]}));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": [
                    {"type": "text", "text": "What is"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,BBBB"}},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    {"type": "text", "text": " this?"},
                ]},
                {"role": "assistant",
                 "content": [{"type": "text", "text": "A truck."}],
                 "reasoning_content": "Hmm, a truck."},
            ])
        );
    }

    #[test]
    fn tool_use_and_tool_result_blocks() {
        let out = conv(json!({"messages": [
            {"role": "user", "content": "Fix the bug"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Look first."},
                {"type": "tool_use", "id": "call_1", "name": "list_files", "input": {"path": ".", "depth": 2}},
                {"type": "tool_use", "id": "call_2", "name": "now"},
            ]},
            {"role": "user", "content": [
                {"type": "text", "text": "Here are the results:"},
                {"type": "tool_result", "tool_use_id": "call_1", "content": "main.py"},
                {"type": "tool_result", "tool_use_id": "call_2", "is_error": true,
                 "content": [{"type": "text", "text": "no "}, {"type": "text", "text": "clock"}]},
                {"type": "tool_result", "tool_use_id": "call_3",
                 "content": [{"type": "text", "text": "File: a.png"},
                             {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QQ=="}}]},
                {"type": "tool_result", "tool_use_id": "call_4"},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "call_5", "content": "only"},
            ]},
        ]}));
        assert_eq!(
            out["messages"],
            json!([
                {"role": "user", "content": "Fix the bug"},
                {"role": "assistant", "content": "",
                 "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "list_files", "arguments": "{\"depth\":2,\"path\":\".\"}"}},
                    {"id": "call_2", "type": "function",
                     "function": {"name": "now", "arguments": "{}"}},
                 ],
                 "reasoning_content": "Look first."},
                {"role": "user", "content": [{"type": "text", "text": "Here are the results:"}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "main.py"},
                {"role": "tool", "tool_call_id": "call_2", "content": "no clock"},
                {"role": "tool", "tool_call_id": "call_3", "content": [
                    {"type": "text", "text": "File: a.png"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,QQ=="}},
                ]},
                {"role": "tool", "tool_call_id": "call_4", "content": ""},
                {"role": "tool", "tool_call_id": "call_5", "content": "only"},
            ])
        );
    }

    #[test]
    fn tools_tool_choice_and_parameters() {
        let base = json!({
            "messages": [{"role": "user", "content": "Weather?"}],
            "tools": [
                {"name": "get_weather", "description": "Get the weather",
                 "input_schema": {"type": "object", "properties": {"location": {"type": "string"}},
                                  "required": ["location"]}},
                {"name": "bare"},
            ],
            "stop_sequences": ["\n", "END"],
            "max_tokens": 50,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 40,
            "stream": true,
            "chat_template_kwargs": {"enable_thinking": false},
            "thinking": {"type": "enabled", "budget_tokens": 50},
            "metadata": {"user_id": "u1"},
            "model": "claude",
            "service_tier": "auto",
        });
        let out = conv(base.clone());
        assert_eq!(
            out["tools"],
            json!([
                {"type": "function", "function": {
                    "name": "get_weather", "description": "Get the weather",
                    "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                                   "required": ["location"]}}},
                {"type": "function", "function": {"name": "bare", "description": "", "parameters": {}}},
            ])
        );
        assert_eq!(out["stop"], json!(["\n", "END"]));
        assert_eq!(out["max_tokens"], json!(50));
        assert_eq!(out["temperature"], json!(0.5));
        assert_eq!(out["top_p"], json!(0.9));
        assert_eq!(out["top_k"], json!(40));
        assert_eq!(out["stream"], json!(true));
        assert_eq!(out["stream_options"], json!({"include_usage": true}));
        assert_eq!(
            out["chat_template_kwargs"],
            json!({"enable_thinking": false})
        );
        assert_eq!(out["thinking_budget_tokens"], json!(50));
        assert_eq!(out["__metadata_user_id"], json!("u1"));
        assert!(out.get("tool_choice").is_none());
        assert!(out.get("model").is_none());
        assert!(out.get("service_tier").is_none());
        assert!(out.get("metadata").is_none());

        for (choice, want) in [
            (json!({"type": "auto"}), Some("auto")),
            (json!({"type": "any"}), Some("required")),
            (
                json!({"type": "tool", "name": "get_weather"}),
                Some("required"),
            ),
            (json!({"type": "none"}), Some("none")),
            (json!({"type": "other"}), None),
            (json!("auto"), None),
        ] {
            let mut b = base.clone();
            b["tool_choice"] = choice;
            let out = conv(b);
            assert_eq!(out.get("tool_choice"), want.map(|w| json!(w)).as_ref());
        }

        let out = conv(
            json!({"messages": [], "thinking": {"type": "enabled"}, "stream": false,
                              "metadata": {"user_id": ""}}),
        );
        assert_eq!(out["thinking_budget_tokens"], json!(10000));
        assert!(out.get("stream_options").is_none());
        assert!(out.get("__metadata_user_id").is_none());
        let out = conv(json!({"messages": [], "thinking": {"type": "disabled"}}));
        assert!(out.get("thinking_budget_tokens").is_none());
    }

    #[test]
    fn count_tokens_conversion() {
        let out = count_tokens_request(&obj(json!({
            "model": "test", "stream": true, "system": "S",
            "messages": [{"role": "user", "content": "Hello world"}],
        })))
        .unwrap();
        assert_eq!(out["messages"].as_array().unwrap().len(), 2);
        assert!(out.get("stream").is_none() && out.get("stream_options").is_none());
        assert_eq!(count_tokens_response(7), json!({"input_tokens": 7}));
    }

    #[test]
    fn bad_requests_are_errors() {
        let e = conv_err(json!({"model": "test", "max_tokens": 50}));
        assert_eq!(e.status.as_u16(), 400);
        assert_eq!(e.param.as_deref(), Some("messages"));
        assert!(e.message.contains("'messages' is required"));
        let cases = [
            (json!({"messages": "hi"}), "messages"),
            (json!({"messages": ["hi"]}), "messages[0]"),
            (
                json!({"messages": [{"role": 1, "content": "x"}]}),
                "messages[0].role",
            ),
            (
                json!({"messages": [{"role": "user", "content": 5}]}),
                "messages[0].content",
            ),
            (
                json!({"messages": [{"role": "user", "content": ["text"]}]}),
                "messages[0].content[0]",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"text": "x"}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "user", "content": [{"type": 3}]}]}),
                "messages[0].content[0].type",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [
                    {"type": "tool_use", "id": "a", "name": "f", "input": "{\"x\":1}"}]}]}),
                "messages[0].content[0].input",
            ),
            (
                json!({"messages": [{"role": "assistant", "content": [
                    {"type": "tool_use", "id": "a", "name": "f", "input": [1]}]}]}),
                "messages[0].content[0].input",
            ),
            (
                json!({"messages": [{"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "a", "content": [7]}]}]}),
                "messages[0].content[0].content[0]",
            ),
            (json!({"messages": [], "system": 3}), "system"),
            (json!({"messages": [], "system": ["x"]}), "system[0]"),
            (json!({"messages": [], "tools": {"name": "f"}}), "tools"),
            (json!({"messages": [], "tools": ["f"]}), "tools[0]"),
        ];
        for (body, param) in cases {
            let e = conv_err(body.clone());
            assert_eq!(e.status.as_u16(), 400, "{body}");
            assert_eq!(e.param.as_deref(), Some(param), "{body}");
        }
        // Lenient where llama-server is: empty messages, null tool input, a message
        // without content (left to the chat handler), unknown block types.
        let out = conv(json!({"messages": [
            {"role": "user"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": null}]},
            {"role": "user", "content": [{"type": "redacted_thinking", "data": "x"}]},
        ]}));
        assert_eq!(out["messages"][0], json!({"role": "user"}));
        assert_eq!(
            out["messages"][1]["tool_calls"][0]["function"]["arguments"],
            "{}"
        );
        assert_eq!(out["messages"].as_array().unwrap().len(), 2);
    }

    fn completion(message: Value, finish: &str) -> Value {
        json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "tiny",
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                      "prompt_tokens_details": {"cached_tokens": 4}},
            "timings": {"prompt_n": 8},
        })
    }

    #[test]
    fn response_text() {
        let r = from_openai_response(
            &completion(json!({"role": "assistant", "content": "Hello!"}), "stop"),
            None,
        );
        assert_eq!(
            r,
            json!({
                "id": "chatcmpl-1", "type": "message", "role": "assistant",
                "content": [{"type": "text", "text": "Hello!"}],
                "model": "tiny", "stop_reason": "end_turn", "stop_sequence": null,
                "usage": {"cache_read_input_tokens": 4, "input_tokens": 8, "output_tokens": 5},
            })
        );
        assert!(r.get("timings").is_none());
    }

    #[test]
    fn response_thinking_and_tool_calls() {
        let r = from_openai_response(
            &completion(
                json!({"role": "assistant", "content": null, "reasoning_content": "Think.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\":\"Paris\"}"}},
                    {"id": "c2", "type": "function", "function": {"name": "broken", "arguments": "{not json"}},
                ]}),
                "tool_calls",
            ),
            None,
        );
        assert_eq!(
            r["content"],
            json!([
                {"type": "thinking", "thinking": "Think.", "signature": ""},
                {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"location": "Paris"}},
                {"type": "tool_use", "id": "c2", "name": "broken", "input": {}},
            ])
        );
        assert_eq!(r["stop_reason"], "tool_use");
        let r = from_openai_response(
            &completion(
                json!({"role": "assistant", "content": "Answer", "reasoning_content": "Think."}),
                "stop",
            ),
            None,
        );
        assert_eq!(
            r["content"],
            json!([
                {"type": "thinking", "thinking": "Think.", "signature": ""},
                {"type": "text", "text": "Answer"},
            ])
        );
    }

    #[test]
    fn response_stop_reasons() {
        let msg = json!({"role": "assistant", "content": "x"});
        let call = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        let cases = [
            (&msg, "stop", None, "end_turn", Value::Null),
            (&msg, "stop", Some("END"), "end_turn", json!("END")),
            (&msg, "stop", Some(""), "end_turn", Value::Null),
            (&msg, "length", None, "max_tokens", Value::Null),
            (&msg, "grammar_dead_end", None, "max_tokens", Value::Null),
            (&call, "tool_calls", None, "tool_use", Value::Null),
            (&call, "stop", None, "tool_use", Value::Null),
            (&call, "length", None, "max_tokens", Value::Null),
        ];
        for (m, finish, word, reason, seq) in cases {
            let r = from_openai_response(&completion(m.clone(), finish), word);
            assert_eq!(r["stop_reason"], reason, "{finish}");
            assert_eq!(r["stop_sequence"], seq, "{finish}");
        }
        // An empty answer has no blocks; a malformed response does not panic.
        let r = from_openai_response(
            &completion(json!({"role": "assistant", "content": ""}), "length"),
            None,
        );
        assert_eq!(r["content"], json!([]));
        let r = from_openai_response(&json!({}), None);
        assert_eq!(r["type"], "message");
        assert_eq!(r["usage"]["input_tokens"], 0);
    }

    fn chunk(choices: Value) -> Value {
        json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1,
               "model": "tiny", "system_fingerprint": "lamina", "choices": choices, "usage": null})
    }

    /// Runs our chunks through a converter: the events, each with its name checked
    /// against the data's `type` (what test_compat_anthropic.py reads).
    fn run(conv: &mut StreamConverter, chunks: &[Value]) -> Vec<Value> {
        let mut events: Vec<(&str, Value)> = Vec::new();
        for c in chunks {
            events.extend(conv.on_chunk(c));
        }
        events.extend(conv.finish());
        for (name, data) in &events {
            assert_eq!(data["type"], *name);
            let line = format_sse(name, data);
            assert!(
                line.starts_with(&format!("event: {name}\ndata: {{")) && line.ends_with("}\n\n")
            );
        }
        events.into_iter().map(|(_, d)| d).collect()
    }

    #[test]
    fn stream_text_then_tool_call() {
        let mut conv = StreamConverter::new("tiny", 20, 0);
        let chunks = [
            chunk(
                json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
            ),
            chunk(
                json!([{"index": 0, "delta": {"content": "Let me"}, "logprobs": null, "finish_reason": null}]),
            ),
            chunk(
                json!([{"index": 0, "delta": {"content": " check."}, "logprobs": null, "finish_reason": null}]),
            ),
            chunk(json!([{"index": 0, "delta": {"tool_calls": [
                {"id": "call_a", "type": "function", "index": 0,
                 "function": {"name": "calculator", "arguments": "{\"expression\":\"2+2\"}"}}]},
                "logprobs": null, "finish_reason": null}])),
            chunk(
                json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "tool_calls"}]),
            ),
            json!({"id": "chatcmpl-7", "object": "chat.completion.chunk", "created": 1, "model": "tiny",
                   "choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 9, "total_tokens": 29,
                                            "prompt_tokens_details": {"cached_tokens": 0}}}),
        ];
        let events = run(&mut conv, &chunks);
        assert_eq!(
            events,
            vec![
                json!({"type": "message_start", "message": {
                    "id": "chatcmpl-7", "type": "message", "role": "assistant", "content": [],
                    "model": "tiny", "stop_reason": null, "stop_sequence": null,
                    "usage": {"cache_read_input_tokens": 0, "input_tokens": 20, "output_tokens": 0}}}),
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me"}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " check."}}),
                json!({"type": "content_block_start", "index": 1, "content_block": {
                    "type": "tool_use", "id": "call_a", "name": "calculator"}}),
                json!({"type": "content_block_delta", "index": 1, "delta": {
                    "type": "input_json_delta", "partial_json": "{\"expression\":\"2+2\"}"}}),
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "content_block_stop", "index": 1}),
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": null},
                       "usage": {"output_tokens": 9}}),
                json!({"type": "message_stop"}),
            ]
        );
        // What test_compat_anthropic.py checks.
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        for t in [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ] {
            assert!(types.contains(&t), "{t}");
        }
        let starts: Vec<u64> = events
            .iter()
            .filter(|e| e["type"] == "content_block_start")
            .map(|e| e["index"].as_u64().unwrap())
            .collect();
        let mut stops: Vec<u64> = events
            .iter()
            .filter(|e| e["type"] == "content_block_stop")
            .map(|e| e["index"].as_u64().unwrap())
            .collect();
        stops.sort();
        assert_eq!(starts, vec![0, 1]);
        assert_eq!(starts, stops);
        assert!(events.iter().all(|e| e.get("timings").is_none()));
        // Nothing more once the message ended.
        assert!(conv.on_chunk(&chunks[1]).is_empty());
        assert!(conv.finish().is_empty());
    }

    #[test]
    fn stream_thinking_text_and_stop_word() {
        let mut conv = StreamConverter::new("tiny", 30, 10);
        conv.set_stop_sequence("END");
        let events = run(
            &mut conv,
            &[
                chunk(
                    json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]),
                ),
                chunk(
                    json!([{"index": 0, "delta": {"reasoning_content": "2+2"}, "finish_reason": null}]),
                ),
                chunk(
                    json!([{"index": 0, "delta": {"reasoning_content": " is 4", "content": "4"}, "finish_reason": null}]),
                ),
                chunk(json!([{"index": 0, "delta": {}, "finish_reason": "stop"}])),
                json!({"id": "chatcmpl-7", "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 6}}),
            ],
        );
        assert_eq!(
            events[0]["message"]["usage"],
            json!({"cache_read_input_tokens": 10, "input_tokens": 20, "output_tokens": 0})
        );
        assert_eq!(
            events[1..].to_vec(),
            vec![
                json!({"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "2+2"}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": " is 4"}}),
                json!({"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}}),
                json!({"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "4"}}),
                json!({"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta", "signature": ""}}),
                json!({"type": "content_block_stop", "index": 0}),
                json!({"type": "content_block_stop", "index": 1}),
                json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": "END"},
                       "usage": {"output_tokens": 6}}),
                json!({"type": "message_stop"}),
            ]
        );
    }

    #[test]
    fn stream_without_usage_chunk_or_finish() {
        // No usage chunk: finish() ends the message with the count it was given.
        let mut conv = StreamConverter::new("tiny", 5, 0);
        let mut events = conv.on_chunk(&chunk(
            json!([{"index": 0, "delta": {"content": "Hi"}, "finish_reason": null}]),
        ));
        events.extend(conv.on_chunk(&chunk(
            json!([{"index": 0, "delta": {}, "finish_reason": "length"}]),
        )));
        conv.set_output_tokens(3);
        events.extend(conv.finish());
        let names: Vec<&str> = events.iter().map(|e| e.0).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(events[4].1["delta"]["stop_reason"], "max_tokens");
        assert_eq!(events[4].1["usage"]["output_tokens"], 3);

        // Nothing at all: still a well-formed (empty) message.
        let mut conv = StreamConverter::new("tiny", 5, 0);
        let names: Vec<&str> = conv.finish().iter().map(|e| e.0).collect();
        assert_eq!(names, ["message_start", "message_delta", "message_stop"]);

        // Tool-call arguments in pieces (OpenAI style), other choices and junk ignored.
        let mut conv = StreamConverter::new("tiny", 5, 0);
        let events = run(
            &mut conv,
            &[
                json!("not an object"),
                chunk(
                    json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c", "function": {"name": "f", "arguments": ""}}]}}]),
                ),
                chunk(
                    json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}}]),
                ),
                chunk(json!([{"index": 1, "delta": {"content": "other choice"}}])),
                chunk(
                    json!([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}, "finish_reason": "stop"}]),
                ),
            ],
        );
        let kinds: Vec<String> = events
            .iter()
            .map(|e| format!("{}:{}", e["type"].as_str().unwrap(), e["index"]))
            .collect();
        assert_eq!(
            kinds,
            [
                "message_start:null",
                "content_block_start:0",
                "content_block_delta:0",
                "content_block_delta:0",
                "content_block_stop:0",
                "message_delta:null",
                "message_stop:null"
            ]
        );
        assert_eq!(events[5]["delta"]["stop_reason"], "tool_use");
    }

    #[test]
    fn stream_error_event_shape() {
        let (name, data) = stream_error_event(&ApiError::internal("boom"));
        assert_eq!(name, "error");
        assert_eq!(
            data,
            json!({"code": 500, "message": "boom", "type": "server_error"})
        );
    }
}
