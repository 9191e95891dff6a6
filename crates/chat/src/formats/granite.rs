//! IBM Granite 3.x: calls are `<|tool_call|>` and a JSON array of
//! `{"name": "f", "arguments": {...}}` objects; with thinking on, the answer is
//! `<think>…</think><response>…</response>` (the `<think>` block is split before this
//! parser runs; the `<response>` wrapper is removed here). Granite 4 writes Hermes
//! calls and is detected as such. Lazy trigger: `<|tool_call|>`.

use lamina_grammar::json_schema::{SchemaDocument, SchemaOptions};
use serde_json::Value;

use super::{Cx, JsonPrefix, call_schema, json_prefix, lit, make_plan};
use crate::reasoning::{THINK_END, partial_marker_len};
use crate::{ChatError, ParsedMessage, Plan, Tools};

const TOOL_CALL: &str = "<|tool_call|>";
const RESPONSE: &str = "<response>";
const RESPONSE_END: &str = "</response>";

pub(super) fn detect(src: &str) -> bool {
    src.contains(TOOL_CALL) && src.contains("<|start_of_role|>")
}

pub(super) fn plan(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let items: Vec<Value> = tools.callable().map(|t| call_schema(t, false)).collect();
    let schema = super::calls_array_schema(items, tools.parallel);
    let doc = SchemaDocument::parse(&schema, limits).map_err(super::grammar_error)?;
    make_plan(tools, limits, &[TOOL_CALL], |b, lazy| {
        let calls = b.add_schema("tool-calls", &doc, doc.root())?;
        let think = if lazy {
            String::new()
        } else {
            let body = super::until_marker(b, "think", THINK_END)?;
            format!("( {}? {body} space )? ", lit("<think>"))
        };
        b.add_rule("root", &format!("{think}{} space {calls}", lit(TOOL_CALL)))?;
        Ok(())
    })
}

pub(super) fn parse(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let (content, calls) = match text.find(TOOL_CALL) {
        Some(p) => (&text[..p], Some(&text[p + TOOL_CALL.len()..])),
        None => (text, None),
    };
    m.content = unwrap_response(content, cx, calls.is_some());
    let Some(calls) = calls else {
        return m;
    };
    match json_prefix(calls) {
        JsonPrefix::Complete(v, used) => {
            let list = match v {
                Value::Array(a) => a,
                other => vec![other],
            };
            for c in &list {
                if let Some(call) = super::call_from_json(c, cx.id(m.tool_calls.len())) {
                    m.tool_calls.push(call);
                }
            }
            let after = calls[used..].trim();
            if cx.is_final && !after.is_empty() {
                m.content.push_str(after);
            }
        }
        JsonPrefix::Incomplete if !cx.is_final => {}
        _ => {
            if cx.is_final {
                m.content.push_str(calls.trim());
            }
        }
    }
    m
}

/// The content without its `<response>…</response>` wrapper. `closed`: a call follows.
fn unwrap_response(text: &str, cx: &Cx, closed: bool) -> String {
    let t = text.trim_start();
    let streaming = !cx.is_final && !closed;
    if let Some(body) = t.strip_prefix(RESPONSE) {
        let body = match body.find(RESPONSE_END) {
            Some(e) => &body[..e],
            None if streaming => &body[..body.len() - partial_marker_len(body, RESPONSE_END)],
            None => body,
        };
        return body.trim().to_string();
    }
    if streaming && !t.is_empty() && RESPONSE.starts_with(t) {
        return String::new();
    }
    if closed {
        text.trim_end().to_string()
    } else {
        cx.open_content(text, &[TOOL_CALL])
    }
}
