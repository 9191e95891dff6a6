//! llama.cpp's generic tool-call format for templates that know nothing of tools: a
//! system text lists the tools, and the answer is one JSON object, either a call
//! (`{"tool_call": {"name", "arguments"}}`, or `{"tool_calls": [...]}` with ids when
//! calls may be parallel) or `{"response": ...}`, constrained by that schema (not lazy:
//! the whole answer is JSON).

use lamina_grammar::json_schema::{SchemaOptions, json_schema_to_grammar};
use serde_json::{Value, json};

use super::{call_from_json, call_schema};
use crate::{ChatError, ParsedMessage, Plan, ToolChoice, Tools, call_id};

pub(super) fn plan(
    tools: &Tools,
    json_schema: Option<&Value>,
    limits: &SchemaOptions,
) -> Result<Plan, ChatError> {
    let calls: Vec<Value> = tools
        .callable()
        .map(|t| call_schema(t, tools.parallel))
        .collect();
    let call = if calls.len() == 1 {
        calls[0].clone()
    } else {
        json!({"anyOf": calls})
    };
    let with_calls = if tools.parallel {
        json!({"type": "object",
               "properties": {"tool_calls": {"type": "array", "items": call, "minItems": 1}},
               "required": ["tool_calls"]})
    } else {
        json!({"type": "object", "properties": {"tool_call": call}, "required": ["tool_call"]})
    };
    let schema = match tools.choice {
        ToolChoice::Required | ToolChoice::Function(_) => with_calls,
        _ => json!({"anyOf": [with_calls, {
            "type": "object",
            "properties": {"response": json_schema.cloned().unwrap_or(json!({"type": "string"}))},
            "required": ["response"],
        }]}),
    };
    let grammar = json_schema_to_grammar(&schema, limits).map_err(|e| ChatError::BadSchema {
        name: "(tool-call schema)".into(),
        message: e.to_string(),
    })?;
    let listed: Vec<Value> = tools.raw.as_array().cloned().unwrap_or_default();
    let system = format!(
        "You can call any of the following tools to satisfy the user's requests: {}\n\n\
         Respond in JSON format, either with `tool_call` (a request to call tools) or with \
         `response` reply to the user's request",
        serde_json::to_string_pretty(&Value::Array(listed)).unwrap_or_default()
    );
    Ok(Plan {
        grammar: Some(grammar),
        triggers: Vec::new(),
        system: Some(system),
    })
}

pub(super) fn parse(text: &str, is_final: bool, id_seed: u64) -> ParsedMessage {
    if !is_final {
        // The answer is one JSON object: nothing is final before it is complete.
        return ParsedMessage::default();
    }
    let Ok(v) = serde_json::from_str::<Value>(text.trim()) else {
        return ParsedMessage {
            content: text.to_string(),
            ..Default::default()
        };
    };
    let mut m = ParsedMessage::default();
    if let Some(list) = v.get("tool_calls").and_then(Value::as_array) {
        m.tool_calls = list
            .iter()
            .enumerate()
            .filter_map(|(i, c)| call_from_json(c, call_id(id_seed, i)))
            .collect();
    } else if let Some(c) = v.get("tool_call") {
        m.tool_calls.extend(call_from_json(c, call_id(id_seed, 0)));
    } else if let Some(r) = v.get("response") {
        m.content = match r {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
    } else {
        m.content = text.to_string();
    }
    m
}
