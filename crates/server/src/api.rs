//! Request bodies: reading them (size limit, UTF-8, nesting depth), decoding them into
//! typed requests with the offending parameter named on error, and validating what the
//! server can check without the model.

use axum::body::Body;
use axum::http::{HeaderMap, StatusCode, header};
use lamina_grammar::json_schema::{SchemaOptions, json_schema_to_grammar};
use lamina_sample::SamplingParams;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::engine::{ChatMessage, Token};
use crate::error::ApiError;
use crate::scheduler::{EmbedInput, MixedPart, Prompt};

/// Most choices (`n` times the number of prompts) one request may ask for.
pub const MAX_CHOICES: usize = 16;
/// Most alternatives per token for `top_logprobs` / `logprobs`.
pub const MAX_TOP_LOGPROBS: i64 = 20;
/// Most alternatives per token for llama-server's `n_probs`.
pub const MAX_N_PROBS: u32 = 100;
/// Most stop strings, and the longest one, in bytes.
pub const MAX_STOPS: usize = 16;
pub const MAX_STOP_BYTES: usize = 1024;
/// Most inputs one embeddings request may hold.
pub const MAX_EMBED_INPUTS: usize = 256;

/// Reads a body of at most `limit` bytes and parses it as a JSON object. serde_json's
/// recursion limit (128) bounds nesting, so deep input cannot overflow the stack.
pub async fn read_json(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Map<String, Value>, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
        .with_code("body_too_large")
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|e| {
        let mut source: Option<&dyn std::error::Error> = Some(&e);
        while let Some(s) = source {
            if s.to_string().contains("length limit") {
                return too_large();
            }
            if let Some(t) = s.downcast_ref::<crate::http_limits::BodyTimeout>() {
                return ApiError::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "invalid_request_error",
                    t.to_string(),
                )
                .with_code("body_timeout");
            }
            source = s.source();
        }
        ApiError::bad_request(format!("cannot read the request body: {e}"))
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request("the request body is empty").with_code("invalid_json"));
    }
    let value: Value = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(format!("the request body is not valid JSON: {e}"))
            .with_code("invalid_json")
    })?;
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(
            ApiError::bad_request("the request body must be a JSON object")
                .with_code("invalid_json"),
        ),
    }
}

/// Decodes `map` into `T`, naming the field at fault.
pub fn decode<T: DeserializeOwned>(map: &Map<String, Value>) -> Result<T, ApiError> {
    let value = Value::Object(map.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let mut err = ApiError::bad_request(e.inner().to_string()).with_code("invalid_value");
        err.param = param;
        err
    })
}

/// Sampling settings from a request, with llama-server's names and defaults. Nulls
/// mean "default"; `logit_bias` (OpenAI's map or llama's pairs) is decoded here: biases
/// keyed by token id go into the parameters, biases keyed by text are returned, to be
/// applied to the tokens of that text.
pub fn sampling(
    map: &Map<String, Value>,
    n_vocab: usize,
) -> Result<(SamplingParams, Vec<(String, f32)>), ApiError> {
    let mut m: Map<String, Value> = map
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let bias = m.remove("logit_bias");
    let mut params: SamplingParams = decode(&m)?;
    let mut text_bias = Vec::new();
    if let Some(bias) = bias {
        (params.logit_bias, text_bias) = logit_bias(&bias, n_vocab)?;
    }
    if params.n_probs > MAX_N_PROBS {
        return Err(ApiError::invalid_param(
            "n_probs",
            format!("n_probs must be between 0 and {MAX_N_PROBS}"),
        ));
    }
    Ok((params, text_bias))
}

/// Most text-keyed `logit_bias` entries one request may give.
const MAX_TEXT_BIASES: usize = 1024;

/// A token id bias key, or a text one. In OpenAI's map form every key is a string: one
/// that is a number is a token id (llama-server reads it so).
enum BiasKey {
    Token(u32),
    Text(String),
}

#[allow(clippy::type_complexity)]
fn logit_bias(
    v: &Value,
    n_vocab: usize,
) -> Result<(Vec<(u32, f32)>, Vec<(String, f32)>), ApiError> {
    let bad = |msg: String| ApiError::invalid_param("logit_bias", msg);
    let key = |t: &Value, map_key: bool| -> Result<BiasKey, ApiError> {
        let id = match t {
            Value::String(s) if map_key => s.parse::<u64>().ok(),
            Value::Number(n) => Some(
                n.as_u64()
                    .ok_or_else(|| bad(format!("{t} is not a token id")))?,
            ),
            _ => None,
        };
        match (id, t) {
            (Some(id), _) if (id as usize) < n_vocab => Ok(BiasKey::Token(id as u32)),
            (Some(_), _) => Err(bad(format!("{t} is not a token id of this model"))),
            (None, Value::String(s)) => Ok(BiasKey::Text(s.clone())),
            _ => Err(bad(format!("{t} is neither a token id nor a text"))),
        }
    };
    let bias = |b: &Value| -> Result<f32, ApiError> {
        match b {
            Value::Bool(false) => Ok(f32::NEG_INFINITY),
            Value::Number(n) => n
                .as_f64()
                .filter(|x| x.is_finite())
                .map(|x| x as f32)
                .ok_or_else(|| bad(format!("bad bias {b}"))),
            _ => Err(bad(format!("bad bias {b}"))),
        }
    };
    let pairs: Vec<(BiasKey, f32)> = match v {
        Value::Object(m) => m
            .iter()
            .map(|(k, b)| Ok((key(&Value::String(k.clone()), true)?, bias(b)?)))
            .collect::<Result<_, ApiError>>()?,
        Value::Array(items) => items
            .iter()
            .map(|item| match item.as_array().map(Vec::as_slice) {
                Some([t, b]) => Ok((key(t, false)?, bias(b)?)),
                _ => Err(bad("each entry must be [token, bias]".into())),
            })
            .collect::<Result<_, ApiError>>()?,
        _ => {
            return Err(bad(
                "logit_bias must be an object or an array of pairs".into()
            ));
        }
    };
    let mut ids = Vec::new();
    let mut texts = Vec::new();
    for (k, b) in pairs {
        match k {
            BiasKey::Token(t) => ids.push((t, b)),
            BiasKey::Text(s) => texts.push((s, b)),
        }
    }
    if texts.len() > MAX_TEXT_BIASES {
        return Err(bad(format!("at most {MAX_TEXT_BIASES} text keys")));
    }
    Ok((ids, texts))
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields generation endpoints share (each endpoint reads the ones it knows).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct GenRequest {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub max_tokens: Option<i64>,
    pub max_completion_tokens: Option<i64>,
    pub n_predict: Option<i64>,
    pub n: Option<i64>,
    pub stop: Option<StopField>,
    pub ignore_eos: Option<bool>,
    pub cache_prompt: Option<bool>,
    pub logprobs: Option<Value>,
    pub top_logprobs: Option<i64>,
    pub messages: Option<Vec<InMessage>>,
    pub prompt: Option<Value>,
    pub echo: Option<bool>,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<Value>,
    pub reasoning_format: Option<String>,
    pub functions: Option<Value>,
    pub response_format: Option<Value>,
    pub grammar: Option<Value>,
    pub json_schema: Option<Value>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<Value>,
    pub chat_template_kwargs: Option<Value>,
    pub reasoning_effort: Option<String>,
    pub response_fields: Option<Vec<String>>,
    pub return_tokens: Option<bool>,
    pub verbose: Option<bool>,
    pub return_progress: Option<bool>,
    pub timings_per_token: Option<bool>,
    pub post_sampling_probs: Option<bool>,
    pub id_slot: Option<i64>,
}

#[derive(Deserialize)]
pub struct InMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub tool_calls: Option<Value>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

impl GenRequest {
    pub fn stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    /// Rejects features whose absence would silently change the answer.
    pub fn reject_unsupported(&self) -> Result<(), ApiError> {
        let unsupported = |param: &str, what: &str| {
            Err(
                ApiError::invalid_param(param, format!("{what} is not supported by this server"))
                    .with_code("unsupported_parameter"),
            )
        };
        let present = |v: &Option<Value>| match v {
            None | Some(Value::Null) => false,
            Some(Value::Array(a)) => !a.is_empty(),
            Some(_) => true,
        };
        if present(&self.functions) {
            return unsupported("functions", "function calling");
        }
        if self.echo == Some(true) {
            return unsupported("echo", "echo");
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return unsupported("suffix", "suffix (infill)");
        }
        if self.best_of.is_some_and(|b| b > 1) {
            return unsupported("best_of", "best_of");
        }
        Ok(())
    }

    /// The output constraint as GBNF, from llama-server's fields: `grammar` (GBNF text)
    /// or `json_schema` (a schema; `{}` means any object), and on chat completions
    /// OpenAI's `response_format` (`json_object`, optionally with `schema`, or
    /// `json_schema` with `json_schema.schema`). As llama-server: on the completion
    /// endpoints `grammar` wins over `json_schema`; on chat both at once is an error.
    pub fn grammar(&self, chat: bool, limits: &SchemaOptions) -> Result<Option<String>, ApiError> {
        let (grammar, schema) = self.constraint(chat)?;
        let Some(schema) = schema else {
            return Ok(grammar);
        };
        let param = if self.json_schema.as_ref().is_some_and(|v| !v.is_null()) {
            "json_schema"
        } else {
            "response_format"
        };
        let gbnf = json_schema_to_grammar(&schema, limits).map_err(|e| {
            ApiError::invalid_param(param, format!("invalid JSON schema: {e}"))
                .with_code("invalid_json_schema")
        })?;
        // A schema no value satisfies (`minimum` above `maximum`, ...) gives a grammar
        // that cannot end: refused here rather than generating into a dead end.
        lamina_grammar::Grammar::parse(&gbnf, "root", None).map_err(|e| {
            ApiError::invalid_param(param, format!("the JSON schema cannot be satisfied: {e}"))
                .with_code("unsatisfiable_json_schema")
        })?;
        Ok(Some(gbnf))
    }

    /// The constraint as given: GBNF text, or a schema (an empty one made "any object").
    pub fn constraint(&self, chat: bool) -> Result<(Option<String>, Option<Value>), ApiError> {
        let grammar = match &self.grammar {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "grammar",
                    "grammar must be a string",
                ));
            }
        };
        let mut schema = self.json_schema.clone().filter(|v| !v.is_null());
        if chat {
            if schema.is_some() && grammar.is_some() {
                return Err(ApiError::bad_request(
                    "Cannot use both json_schema and grammar",
                ));
            }
            if let Some(rf) = self.response_format.as_ref().filter(|v| !v.is_null()) {
                let Some(rf) = rf.as_object() else {
                    return Err(ApiError::invalid_param(
                        "response_format",
                        "response_format must be an object",
                    ));
                };
                match rf.get("type").and_then(Value::as_str).unwrap_or("") {
                    "json_object" => {
                        if rf.contains_key("schema") || schema.is_none() {
                            schema = Some(
                                rf.get("schema")
                                    .cloned()
                                    .unwrap_or(Value::Object(serde_json::Map::new())),
                            );
                        }
                    }
                    "json_schema" => {
                        schema = Some(
                            rf.get("json_schema")
                                .and_then(|w| w.get("schema"))
                                .cloned()
                                .unwrap_or(Value::Object(serde_json::Map::new())),
                        );
                    }
                    "" | "text" => {}
                    other => {
                        return Err(ApiError::invalid_param(
                            "response_format",
                            format!(
                                "response_format type must be one of \"text\", \"json_object\" or \"json_schema\", but got: {other}"
                            ),
                        ));
                    }
                }
            }
        } else if grammar.is_some() {
            schema = None;
        }
        let Some(mut schema) = schema else {
            return Ok((grammar, None));
        };
        if let Some(obj) = schema.as_object_mut()
            && obj.is_empty()
        {
            // An empty schema means any object.
            obj.insert("type".into(), Value::String("object".into()));
        }
        Ok((None, Some(schema)))
    }

    /// OpenAI's `max_completion_tokens` / `max_tokens` (also llama's `n_predict`): at
    /// least 1; absent means "until the end or the context is full".
    pub fn openai_max_tokens(&self) -> Result<Option<u32>, ApiError> {
        let (param, v) = match (self.max_completion_tokens, self.max_tokens, self.n_predict) {
            (Some(v), _, _) => ("max_completion_tokens", v),
            (None, Some(v), _) => ("max_tokens", v),
            (None, None, Some(v)) => ("n_predict", v),
            (None, None, None) => return Ok(None),
        };
        if param == "n_predict" && v == -1 {
            return Ok(None);
        }
        if !(1..=i64::from(i32::MAX)).contains(&v) {
            return Err(ApiError::invalid_param(
                param,
                format!("{param} must be between 1 and {}, got {v}", i32::MAX),
            ));
        }
        Ok(Some(v as u32))
    }

    /// llama-server's `n_predict` (or `max_tokens`): -1 means no limit, 0 evaluates the
    /// prompt only.
    pub fn native_max_tokens(&self) -> Result<Option<u32>, ApiError> {
        let (param, v) = match (self.n_predict, self.max_tokens) {
            (Some(v), _) => ("n_predict", v),
            (None, Some(v)) => ("max_tokens", v),
            (None, None) => return Ok(None),
        };
        match v {
            -1 => Ok(None),
            0..=0x7FFF_FFFF => Ok(Some(v as u32)),
            _ => Err(ApiError::invalid_param(
                param,
                format!(
                    "{param} must be -1 (no limit) or between 0 and {}, got {v}",
                    i32::MAX
                ),
            )),
        }
    }

    pub fn n(&self) -> Result<usize, ApiError> {
        match self.n {
            None => Ok(1),
            Some(n) if (1..=MAX_CHOICES as i64).contains(&n) => Ok(n as usize),
            Some(n) => Err(ApiError::invalid_param(
                "n",
                format!("n must be between 1 and {MAX_CHOICES}, got {n}"),
            )),
        }
    }

    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(StopField::One(s)) => vec![s.clone()],
            Some(StopField::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS {
            return Err(ApiError::invalid_param(
                "stop",
                format!("at most {MAX_STOPS} stop strings"),
            ));
        }
        if stops.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::invalid_param(
                "stop",
                format!("stop strings are limited to {MAX_STOP_BYTES} bytes"),
            ));
        }
        Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
    }

    /// Chat: `logprobs: bool` and `top_logprobs: 0..=20` -> (want probs, n alternatives).
    pub fn chat_logprobs(&self) -> Result<(bool, u32), ApiError> {
        let want = match &self.logprobs {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(ApiError::invalid_param(
                    "logprobs",
                    "logprobs must be a boolean",
                ));
            }
        };
        let top = match self.top_logprobs {
            None => 0,
            Some(n) if (0..=MAX_TOP_LOGPROBS).contains(&n) => n as u32,
            Some(n) => {
                return Err(ApiError::invalid_param(
                    "top_logprobs",
                    format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
                ));
            }
        };
        if top > 0 && !want {
            return Err(ApiError::invalid_param(
                "top_logprobs",
                "top_logprobs requires logprobs to be true",
            ));
        }
        Ok((want, top))
    }

    /// Legacy completions: `logprobs: int 0..=20` -> (want probs, n alternatives).
    pub fn completion_logprobs(&self) -> Result<(bool, u32), ApiError> {
        match &self.logprobs {
            None | Some(Value::Null) => Ok((false, 0)),
            Some(Value::Number(n)) => match n.as_i64() {
                Some(k) if (0..=MAX_TOP_LOGPROBS).contains(&k) => Ok((true, k as u32)),
                _ => Err(ApiError::invalid_param(
                    "logprobs",
                    format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
                )),
            },
            Some(_) => Err(ApiError::invalid_param(
                "logprobs",
                "logprobs must be an integer",
            )),
        }
    }

    /// The chat messages, checked: at least one, known roles, text content.
    pub fn chat_messages(&self) -> Result<Vec<ChatMessage>, ApiError> {
        let Some(messages) = &self.messages else {
            return Err(ApiError::invalid_param("messages", "messages is required"));
        };
        // llama-server takes an empty conversation: the prompt is the generation prompt.
        messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let role = match m.role.as_str() {
                    "system" | "developer" => "system",
                    "user" => "user",
                    "assistant" => "assistant",
                    "tool" => "tool",
                    other => {
                        return Err(ApiError::invalid_param(
                            format!("messages[{i}].role"),
                            format!(
                                "unknown role {other:?} (expected system, developer, user, assistant or tool)"
                            ),
                        ));
                    }
                };
                let content = match &m.content {
                    None if role == "assistant" && m.tool_calls.is_some() => String::new(),
                    None => {
                        return Err(ApiError::invalid_param(
                            format!("messages[{i}].content"),
                            "content is required",
                        ));
                    }
                    Some(Content::Text(t)) => t.clone(),
                    Some(Content::Parts(parts)) => {
                        // llama.cpp joins text parts with a blank line.
                        let mut text = String::new();
                        for (j, p) in parts.iter().enumerate() {
                            match (p.kind.as_str(), &p.text) {
                                ("text", Some(t)) => {
                                    if !text.is_empty() {
                                        text.push_str("\n\n");
                                    }
                                    text.push_str(t);
                                }
                                ("image_url" | "input_audio" | "image", _) => {
                                    // llama-server's answer without a multimodal projector.
                                    return Err(ApiError::new(
                                        axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                                        "server_error",
                                        "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj",
                                    )
                                    .with_param(format!("messages[{i}].content[{j}]")));
                                }
                                _ => {
                                    return Err(ApiError::invalid_param(
                                        format!("messages[{i}].content[{j}]"),
                                        format!("content part of type {:?} is not supported (only text)", p.kind),
                                    ));
                                }
                            }
                        }
                        text
                    }
                };
                Ok(ChatMessage {
                    role: role.to_string(),
                    content,
                    tool_calls: m.tool_calls.clone(),
                    tool_call_id: m.tool_call_id.clone(),
                    name: m.name.clone(),
                    reasoning_content: m.reasoning_content.clone().filter(|r| !r.is_empty()),
                })
            })
            .collect()
    }

    /// `/v1/completions` prompts: a string, a token array, or an array of either.
    pub fn prompts(&self, allow_many: bool) -> Result<Vec<Prompt>, ApiError> {
        let Some(prompt) = &self.prompt else {
            return Err(ApiError::invalid_param("prompt", "prompt is required"));
        };
        let many = |ps: Vec<Prompt>| {
            if ps.len() > 1 && !allow_many {
                Err(ApiError::invalid_param(
                    "prompt",
                    "this endpoint takes one prompt",
                ))
            } else {
                Ok(ps)
            }
        };
        match prompt {
            Value::Array(items) if items.is_empty() => Err(ApiError::invalid_param(
                "prompt",
                "prompt must not be empty",
            )),
            Value::Array(items) if !is_mixed_sequence(items) => {
                if items.len() > MAX_CHOICES {
                    return Err(ApiError::invalid_param(
                        "prompt",
                        format!("at most {MAX_CHOICES} prompts"),
                    ));
                }
                let ps = items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| one_prompt(item, &format!("prompt[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?;
                many(ps)
            }
            other => Ok(vec![one_prompt(other, "prompt")?]),
        }
    }
}

/// One embedding input: what a prompt may be, or `{"content": [text parts]}` (the parts
/// joined as they are).
fn embed_input(v: &Value, param: &str) -> Result<EmbedInput, ApiError> {
    if let Value::Object(o) = v
        && let Some(content) = o.get("content")
    {
        let parts = content.as_array().ok_or_else(|| {
            ApiError::invalid_param(
                format!("{param}.content"),
                "content must be an array of parts",
            )
        })?;
        let mut text = String::new();
        for (j, p) in parts.iter().enumerate() {
            match (
                p.get("type").and_then(Value::as_str),
                p.get("text").and_then(Value::as_str),
            ) {
                (Some("text"), Some(t)) => text.push_str(t),
                _ => {
                    return Err(ApiError::invalid_param(
                        format!("{param}.content[{j}]"),
                        "only text parts are supported",
                    ));
                }
            }
        }
        return Ok(EmbedInput::Text(text));
    }
    match one_prompt(v, param)? {
        Prompt::Text { text, .. } => Ok(EmbedInput::Text(text)),
        Prompt::Tokens(t) => Ok(EmbedInput::Tokens(t)),
        Prompt::Mixed(p) => Ok(EmbedInput::Mixed(p)),
        Prompt::Chat(_) | Prompt::Infill(_) => {
            Err(ApiError::invalid_param(param, "not an embedding input"))
        }
    }
}

/// An array of token ids and strings, read as one prompt (llama-server's "mixed"
/// prompt), as opposed to an array of prompts.
fn is_mixed_sequence(items: &[Value]) -> bool {
    items.iter().any(Value::is_number) && items.iter().all(|v| v.is_number() || v.is_string())
}

/// One prompt: a string, token ids mixed with strings, or llama-server's JSON prompt
/// object (`{"prompt_string": ...}`; media in `multimodal_data` needs a multimodal model).
fn one_prompt(v: &Value, param: &str) -> Result<Prompt, ApiError> {
    match v {
        Value::String(s) => Ok(text_prompt(s)),
        Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_number) => {
            Ok(Prompt::Tokens(token_list(items, param)?))
        }
        Value::Array(items) if is_mixed_sequence(items) => {
            let mut parts = Vec::with_capacity(items.len());
            for (j, item) in items.iter().enumerate() {
                parts.push(match item {
                    Value::String(s) => MixedPart::Text(s.clone()),
                    _ => MixedPart::Token(
                        token_list(std::slice::from_ref(item), &format!("{param}[{j}]"))?[0],
                    ),
                });
            }
            Ok(Prompt::Mixed(parts))
        }
        Value::Object(o) => {
            if o.get("multimodal_data").is_some_and(|m| !m.is_null()) {
                return Err(ApiError::invalid_param(
                    format!("{param}.multimodal_data"),
                    "this model takes no images or audio (multimodal_data)",
                )
                .with_code("multimodal_not_supported"));
            }
            match o.get("prompt_string") {
                Some(Value::String(s)) => Ok(text_prompt(s)),
                _ => Err(ApiError::invalid_param(
                    format!("{param}.prompt_string"),
                    "a JSON prompt needs a prompt_string",
                )),
            }
        }
        _ => Err(ApiError::invalid_param(
            param,
            "a prompt must be a string, an array of token ids (and strings), or {\"prompt_string\": ...}",
        )),
    }
}

fn text_prompt(s: &str) -> Prompt {
    Prompt::Text {
        text: s.to_string(),
        add_special: true,
    }
}

/// Token ids from JSON numbers: non-negative integers that fit a `u32`.
pub fn token_list(items: &[Value], param: &str) -> Result<Vec<Token>, ApiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|t| u32::try_from(t).ok())
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        format!("{param}[{i}]"),
                        format!("{v} is not a valid token id"),
                    )
                    .with_code("invalid_token")
                })
        })
        .collect()
}

#[derive(Deserialize)]
pub struct TokenizeRequest {
    pub content: String,
    #[serde(default)]
    pub add_special: bool,
    #[serde(default = "yes")]
    pub parse_special: bool,
    #[serde(default)]
    pub with_pieces: bool,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
pub struct DetokenizeRequest {
    pub tokens: Vec<Value>,
}

#[derive(Deserialize)]
pub struct EmbeddingsRequest {
    pub input: Option<Value>,
    /// llama-server's name for `input`.
    pub content: Option<Value>,
    #[serde(default)]
    pub encoding_format: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
}

impl EmbeddingsRequest {
    pub fn inputs(&self) -> Result<Vec<EmbedInput>, ApiError> {
        let Some(input) = self.input.as_ref().or(self.content.as_ref()) else {
            return Err(ApiError::invalid_param("input", "input is required"));
        };
        let inputs = match input {
            Value::Array(items) if items.is_empty() => {
                return Err(ApiError::invalid_param("input", "input must not be empty"));
            }
            Value::Array(items) if !is_mixed_sequence(items) => {
                if items.len() > MAX_EMBED_INPUTS {
                    return Err(ApiError::invalid_param(
                        "input",
                        format!("at most {MAX_EMBED_INPUTS} inputs"),
                    ));
                }
                items
                    .iter()
                    .enumerate()
                    .map(|(i, item)| embed_input(item, &format!("input[{i}]")))
                    .collect::<Result<Vec<_>, _>>()?
            }
            other => vec![embed_input(other, "input")?],
        };
        if let Some(i) = inputs
            .iter()
            .position(|x| matches!(x, EmbedInput::Text(s) if s.is_empty()))
        {
            return Err(ApiError::invalid_param(
                format!("input[{i}]"),
                "input must not be empty",
            ));
        }
        Ok(inputs)
    }

    /// `true` for base64.
    pub fn base64(&self) -> Result<bool, ApiError> {
        match self.encoding_format.as_deref() {
            None | Some("float") => Ok(false),
            Some("base64") => Ok(true),
            Some(other) => Err(ApiError::invalid_param(
                "encoding_format",
                format!("encoding_format must be float or base64, got {other:?}"),
            )),
        }
    }
}

/// Standard base64 (for `encoding_format: base64` embeddings: little-endian f32s).
pub fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(T[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Pieces for `/tokenize` `with_pieces`: text when the bytes are UTF-8, else the bytes.
pub fn piece_json(bytes: &[u8]) -> Value {
    match std::str::from_utf8(bytes) {
        Ok(s) => Value::String(s.to_string()),
        Err(_) => Value::Array(bytes.iter().map(|&b| Value::from(b)).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_rfc4648() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar"), "Zm9vYmFy");
    }
}
