//! Cohere's Command models. Command R7B (and its MoE successor) think in
//! `<|START_THINKING|>…<|END_THINKING|>`, answer in `<|START_RESPONSE|>…<|END_RESPONSE|>`
//! and call in `<|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f",
//! "parameters": {...}}, …]<|END_ACTION|>` (lazy trigger `<|START_ACTION|>`; the ids
//! are the model's). Command R+ (tool_use template) writes
//! `Action:\n```json\n[{"tool_name": "f", "parameters": {...}}, …]\n```` (lazy
//! trigger `Action:`); its `directly-answer` pseudo-tool is allowed when the model may
//! answer, and dropped from the calls.

use lamina_grammar::json_schema::{SchemaDocument, SchemaOptions};
use serde_json::{Value, json};

use super::{Cx, JsonPrefix, args_text, json_prefix, lit, make_plan, until_marker};
use crate::reasoning::partial_marker_len;
use crate::{ChatError, ParsedMessage, Plan, ToolCall, ToolChoice, Tools};

const START_THINKING: &str = "<|START_THINKING|>";
const END_THINKING: &str = "<|END_THINKING|>";
const START_RESPONSE: &str = "<|START_RESPONSE|>";
const END_RESPONSE: &str = "<|END_RESPONSE|>";
const START_ACTION: &str = "<|START_ACTION|>";
const END_ACTION: &str = "<|END_ACTION|>";
const ACTION: &str = "Action:";
const DIRECTLY_ANSWER: &str = "directly-answer";

pub(super) fn detect_r7b(src: &str) -> bool {
    src.contains(START_ACTION) && src.contains(END_ACTION)
}

pub(super) fn detect_plus(src: &str) -> bool {
    src.contains("Action:") && src.contains("```json") && src.contains(DIRECTLY_ANSWER)
}

pub(super) fn plan_r7b(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let items: Vec<Value> = tools
        .callable()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "tool_call_id": {"type": "string", "pattern": "^[0-9]{1,10}$"},
                    "tool_name": {"type": "string", "const": t.name},
                    "parameters": t.parameters,
                },
                "required": ["tool_call_id", "tool_name", "parameters"],
            })
        })
        .collect();
    let doc = SchemaDocument::parse(&super::calls_array_schema(items, tools.parallel), limits)
        .map_err(super::grammar_error)?;
    make_plan(tools, limits, &[START_ACTION], |b, lazy| {
        let calls = b.add_schema("tool-calls", &doc, doc.root())?;
        let think = if lazy {
            String::new()
        } else {
            let body = until_marker(b, "thinking", END_THINKING)?;
            format!("( {}? {body} space )? ", lit(START_THINKING))
        };
        b.add_rule(
            "root",
            &format!("{think}{} {calls} {}", lit(START_ACTION), lit(END_ACTION)),
        )?;
        Ok(())
    })
}

pub(super) fn plan_plus(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let mut items: Vec<Value> = tools
        .callable()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "tool_name": {"type": "string", "const": t.name},
                    "parameters": t.parameters,
                },
                "required": ["tool_name", "parameters"],
            })
        })
        .collect();
    if tools.choice == ToolChoice::Auto {
        items.push(json!({
            "type": "object",
            "properties": {
                "tool_name": {"type": "string", "const": DIRECTLY_ANSWER},
                "parameters": {"type": "object", "properties": {}},
            },
            "required": ["tool_name", "parameters"],
        }));
    }
    let doc = SchemaDocument::parse(&super::calls_array_schema(items, tools.parallel), limits)
        .map_err(super::grammar_error)?;
    make_plan(tools, limits, &[ACTION], |b, _lazy| {
        let calls = b.add_schema("tool-calls", &doc, doc.root())?;
        b.add_rule(
            "root",
            &format!(
                "{} space {} space {calls} space {} space",
                lit(ACTION),
                lit("```json"),
                lit("```")
            ),
        )?;
        Ok(())
    })
}

/// Command R7B's answer taken apart (reasoning included).
pub(super) fn parse_r7b(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let mut rest = text;
    // Reasoning.
    let t = rest.trim_start();
    if !cx.is_final && !t.is_empty() && START_THINKING.starts_with(t) {
        return m;
    }
    let open = t
        .strip_prefix(START_THINKING)
        .or(if cx.forced_open { Some(t) } else { None });
    if let Some(body) = open {
        match body.find(END_THINKING) {
            Some(e) => {
                if cx.extract {
                    m.reasoning_content = body[..e].trim().to_string();
                } else {
                    m.content =
                        rest[..rest.len() - body.len() + e + END_THINKING.len()].to_string();
                }
                rest = &body[e + END_THINKING.len()..];
            }
            None => {
                if cx.extract {
                    let hold = if cx.is_final {
                        0
                    } else {
                        partial_marker_len(body, END_THINKING)
                    };
                    m.reasoning_content = body[..body.len() - hold].trim().to_string();
                } else if cx.is_final {
                    m.content = rest.to_string();
                }
                return m;
            }
        }
    }
    let s = rest.trim_start();
    if let Some(p) = s.find(START_ACTION) {
        let before = s[..p].trim();
        push(&mut m.content, before);
        let body = &s[p + START_ACTION.len()..];
        match json_prefix(body) {
            JsonPrefix::Complete(Value::Array(list), _) => {
                for c in &list {
                    let Some(name) = c.get("tool_name").and_then(Value::as_str) else {
                        continue;
                    };
                    let id = match c.get("tool_call_id") {
                        Some(Value::String(s)) => s.clone(),
                        Some(Value::Number(n)) => n.to_string(),
                        _ => cx.id(m.tool_calls.len()),
                    };
                    m.tool_calls.push(ToolCall {
                        id,
                        name: name.to_string(),
                        arguments: c.get("parameters").map_or_else(|| "{}".into(), args_text),
                    });
                }
            }
            JsonPrefix::Incomplete if !cx.is_final => {}
            _ => {
                if cx.is_final {
                    push(&mut m.content, body.trim());
                }
            }
        }
        return m;
    }
    if let Some(r) = s.strip_prefix(START_RESPONSE) {
        let body = match r.find(END_RESPONSE) {
            Some(e) => &r[..e],
            None => {
                &r[..r.len()
                    - if cx.is_final {
                        0
                    } else {
                        partial_marker_len(r, END_RESPONSE)
                    }]
            }
        };
        push(&mut m.content, body);
        return m;
    }
    if !cx.is_final
        && !s.is_empty()
        && (START_RESPONSE.starts_with(s) || START_ACTION.starts_with(s))
    {
        return m;
    }
    let c = cx.open_content(s, &[START_ACTION]);
    push(&mut m.content, &c);
    m
}

fn push(content: &mut String, text: &str) {
    content.push_str(text);
}

/// Command R+'s answer taken apart (after `<think>` reasoning, which it has not).
pub(super) fn parse_plus(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let Some(p) = text.find(ACTION) else {
        m.content = cx.open_content(text, &[ACTION]);
        return m;
    };
    m.content = text[..p].trim_end().to_string();
    let body = text[p + ACTION.len()..].trim_start();
    if !cx.is_final && "```json".starts_with(body) {
        return m;
    }
    let body = body.strip_prefix("```json").unwrap_or(body);
    match json_prefix(body) {
        JsonPrefix::Complete(v, used) => {
            let list = match v {
                Value::Array(a) => a,
                other => vec![other],
            };
            for c in &list {
                let Some(name) = c.get("tool_name").and_then(Value::as_str) else {
                    continue;
                };
                if name == DIRECTLY_ANSWER {
                    continue;
                }
                m.tool_calls.push(ToolCall {
                    id: cx.id(m.tool_calls.len()),
                    name: name.to_string(),
                    arguments: c.get("parameters").map_or_else(|| "{}".into(), args_text),
                });
            }
            let after = body[used..].trim_start();
            let after = after.strip_prefix("```").unwrap_or(after).trim();
            if cx.is_final && !after.is_empty() {
                if !m.content.is_empty() {
                    m.content.push('\n');
                }
                m.content.push_str(after);
            }
        }
        JsonPrefix::Incomplete if !cx.is_final => {}
        _ => {
            if cx.is_final {
                m.content = text.to_string();
            }
        }
    }
    m
}
