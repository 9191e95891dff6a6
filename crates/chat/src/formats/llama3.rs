//! Llama 3.1 / 3.2 / 3.3: a call is the JSON object `{"name": "f", "parameters":
//! {...}}`, at the start of the answer or after `<|python_tag|>`; the builtin tools of
//! Llama 3.1 / 3.3 (brave_search, wolfram_alpha, code_interpreter) are written
//! `<|python_tag|>brave_search.call(query="...")`. The template allows one call per
//! turn; with `parallel_tool_calls` further objects may follow, separated by `;` or
//! whitespace. Lazy triggers: `<|python_tag|>`, `{"name"` and `{"type": "function"`.

use lamina_grammar::json_schema::SchemaOptions;
use serde_json::{Map, Value};

use super::{Cx, JsonPrefix, args_docs, json_prefix, lit, make_plan};
use crate::{ChatError, ParsedMessage, Plan, ToolCall, Tools};

const PYTHON_TAG: &str = "<|python_tag|>";

pub(super) fn detect(src: &str) -> bool {
    src.contains("<|start_header_id|>ipython<|end_header_id|>")
}

pub(super) fn plan(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let docs = args_docs(tools, limits)?;
    make_plan(
        tools,
        limits,
        // A bare JSON call counts only at the start: prose may contain `{"name"`.
        &[PYTHON_TAG, "^{\"name\"", "^{\"type\": \"function\""],
        |b, _lazy| {
            let mut alts = Vec::new();
            for (name, doc) in &docs {
                let args = b.add_schema(&format!("{name}-args"), doc, doc.root())?;
                let quoted = serde_json::to_string(name).unwrap_or_default();
                alts.push(b.add_rule(
                    &format!("{name}-call"),
                    &format!(
                        "\"{{\" space ( {} space \":\" space {} space \",\" space )? {} space \":\" space {} space \",\" space {} space \":\" space {args} space \"}}\" space",
                        lit("\"type\""),
                        lit("\"function\""),
                        lit("\"name\""),
                        lit(&quoted),
                        lit("\"parameters\""),
                    ),
                )?);
            }
            let call = b.add_rule("tool-call", &alts.join(" | "))?;
            let body = if tools.parallel {
                format!("{call} ( \";\"? space {call} )*")
            } else {
                call
            };
            b.add_rule("root", &format!("( {} )? {body}", lit(PYTHON_TAG)))?;
            Ok(())
        },
    )
}

pub(super) fn parse(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let (lead, body, tagged) = match text.find(PYTHON_TAG) {
        Some(p) => (&text[..p], &text[p + PYTHON_TAG.len()..], true),
        None => {
            let trimmed = text.trim_start();
            if !trimmed.starts_with('{') {
                m.content = cx.open_content(text, &[PYTHON_TAG]);
                return m;
            }
            ("", trimmed, false)
        }
    };
    m.content = lead.trim_end().to_string();
    if tagged && let Some(call) = builtin_call(body.trim_start()) {
        match call {
            Some((name, args)) => m.tool_calls.push(ToolCall {
                id: cx.id(0),
                name,
                arguments: args,
            }),
            None if cx.is_final => m.content.push_str(body),
            None => {}
        }
        return m;
    }
    let mut rest = body;
    loop {
        let s = rest.trim_start_matches(|c: char| c.is_whitespace() || c == ';');
        if s.is_empty() {
            break;
        }
        match json_prefix(s) {
            JsonPrefix::Complete(v, used) if is_call(&v) => {
                if let Some(c) = super::call_from_json(&v, cx.id(m.tool_calls.len())) {
                    m.tool_calls.push(c);
                }
                rest = &s[used..];
            }
            JsonPrefix::Incomplete if !cx.is_final => return m,
            _ => {
                // Not (or no longer) a call: what is left is content, or, when nothing
                // was called, the whole answer is.
                if m.tool_calls.is_empty() && !tagged {
                    m.content = cx.open_content(text, &[]);
                } else if cx.is_final {
                    if !m.content.is_empty() {
                        m.content.push('\n');
                    }
                    m.content.push_str(s.trim_end());
                }
                return m;
            }
        }
    }
    m
}

/// `{"name": …, "parameters" | "arguments": …}` (an optional `"type": "function"`).
fn is_call(v: &Value) -> bool {
    v.get("name").is_some_and(Value::is_string)
        && (v.get("parameters").is_some() || v.get("arguments").is_some())
}

/// `NAME.call(k=v, …)`: `None` when the text is not such a call, `Some(None)` when it
/// may still become one (incomplete), else the name and the arguments as JSON text.
#[allow(clippy::option_option)]
fn builtin_call(s: &str) -> Option<Option<(String, String)>> {
    let ident_end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    if ident_end == 0 {
        return None;
    }
    let name = &s[..ident_end];
    let after = &s[ident_end..];
    let Some(mut rest) = after.strip_prefix(".call(") else {
        return if ".call(".starts_with(after) {
            Some(None)
        } else {
            None
        };
    };
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if rest.starts_with(')') {
            return Some(Some((name.to_string(), Value::Object(args).to_string())));
        }
        let key_end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if key_end == rest.len() {
            return Some(None);
        }
        let key = &rest[..key_end];
        let r = rest[key_end..].trim_start();
        let Some(r) = r.strip_prefix('=') else {
            return if r.is_empty() { Some(None) } else { None };
        };
        match json_prefix(r) {
            JsonPrefix::Complete(v, used) => {
                args.insert(key.to_string(), v);
                rest = r[used..].trim_start();
                if let Some(r) = rest.strip_prefix(',') {
                    rest = r;
                }
            }
            JsonPrefix::Incomplete => return Some(None),
            JsonPrefix::Invalid => return None,
        }
    }
}
