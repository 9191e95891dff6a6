//! Mistral's `[TOOL_CALLS]` calls. Nemo writes one JSON array after the marker,
//! `[TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "abcDEF123"}]`; Small 3.2,
//! Devstral, Ministral 3 and Magistral write each call as
//! `[TOOL_CALLS]f[CALL_ID]abcDEF123[ARGS]{...}` (the id is optional, and only Small
//! 3.2's template renders it). Their templates want 9-character alphanumeric ids, so
//! calls without one get such an id. Reasoning models open with `[THINK]…[/THINK]`.
//! Lazy trigger: `[TOOL_CALLS]`.

use lamina_grammar::json_schema::{SchemaDocument, SchemaOptions};
use serde_json::{Value, json};

use super::{
    Cx, JsonPrefix, args_docs, args_text, json_prefix, lit, make_plan, repeat, until_marker,
};
use crate::{ChatError, ParsedMessage, Plan, ToolCall, Tools};

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";
const THINK: &str = "[THINK]";
const THINK_END: &str = "[/THINK]";

pub(super) fn detect_nemo(src: &str) -> bool {
    src.contains(TOOL_CALLS)
}

pub(super) fn detect_args(src: &str) -> bool {
    src.contains(TOOL_CALLS) && src.contains(ARGS)
}

/// A 9-character alphanumeric id (what Mistral templates accept).
fn mistral_id(cx: &Cx, index: usize) -> String {
    let id = cx.id(index);
    id[id.len() - 9..].to_string()
}

pub(super) fn plan_nemo(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let items: Vec<Value> = tools
        .callable()
        .map(|t| {
            json!({
                "type": "object",
                "properties": {
                    "name": {"type": "string", "const": t.name},
                    "arguments": t.parameters,
                    "id": {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"},
                },
                "required": ["name", "arguments", "id"],
            })
        })
        .collect();
    let schema = super::calls_array_schema(items, tools.parallel);
    let doc = SchemaDocument::parse(&schema, limits).map_err(super::grammar_error)?;
    make_plan(tools, limits, &[TOOL_CALLS], |b, lazy| {
        let calls = b.add_schema("tool-calls", &doc, doc.root())?;
        let think = think_prefix(b, lazy)?;
        b.add_rule("root", &format!("{think}{} {calls}", lit(TOOL_CALLS)))?;
        Ok(())
    })
}

pub(super) fn plan_args(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let docs = args_docs(tools, limits)?;
    make_plan(tools, limits, &[TOOL_CALLS], |b, lazy| {
        let id = b.add_rule("call-id", &format!("{} [a-zA-Z0-9]{{9}}", lit(CALL_ID)))?;
        let mut alts = Vec::new();
        for (name, doc) in &docs {
            let args = b.add_schema(&format!("{name}-args"), doc, doc.root())?;
            alts.push(b.add_rule(
                &format!("{name}-call"),
                &format!(
                    "{} {} {id}? {} {args}",
                    lit(TOOL_CALLS),
                    lit(name),
                    lit(ARGS)
                ),
            )?);
        }
        let call = b.add_rule("tool-call", &alts.join(" | "))?;
        let think = think_prefix(b, lazy)?;
        b.add_rule(
            "root",
            &format!("{think}{}", repeat(&call, "space", tools.parallel)),
        )?;
        Ok(())
    })
}

/// For a grammar that applies from the first token: an optional `[THINK]…[/THINK]`.
fn think_prefix(
    b: &mut lamina_grammar::json_schema::GrammarBuilder<'_>,
    lazy: bool,
) -> Result<String, lamina_grammar::json_schema::SchemaError> {
    if lazy {
        return Ok(String::new());
    }
    let body = until_marker(b, "think", THINK_END)?;
    Ok(format!("( {} {body} space )? ", lit(THINK)))
}

/// `[THINK]…[/THINK]` at the start taken out: (reasoning, rest, done) where `done` is
/// false while the block is still open.
fn split_think<'a>(text: &'a str, cx: &Cx) -> (String, &'a str) {
    if !cx.extract {
        return (String::new(), text);
    }
    let t = text.trim_start();
    let Some(body) = t.strip_prefix(THINK) else {
        return (String::new(), text);
    };
    match body.find(THINK_END) {
        Some(e) => (
            body[..e].trim().to_string(),
            body[e + THINK_END.len()..].trim_start(),
        ),
        None if cx.is_final => (body.trim().to_string(), ""),
        None => {
            let hold = crate::reasoning::partial_marker_len(body, THINK_END);
            (body[..body.len() - hold].trim().to_string(), "")
        }
    }
}

/// Text that is still `[THINK]` or a start of it while streaming.
fn maybe_think_start(text: &str, cx: &Cx) -> bool {
    let t = text.trim_start();
    cx.extract && !cx.is_final && !t.is_empty() && THINK.starts_with(t) && t != THINK
}

pub(super) fn parse_nemo(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    if maybe_think_start(text, cx) {
        return m;
    }
    let (thought, text) = split_think(text, cx);
    m.reasoning_content = thought;
    let Some(p) = text.find(TOOL_CALLS) else {
        m.content = cx.open_content(text, &[TOOL_CALLS]);
        return m;
    };
    m.content = text[..p].trim_end().to_string();
    let rest = &text[p + TOOL_CALLS.len()..];
    parse_array(rest, cx, &mut m);
    m
}

/// A JSON array of call objects (or one object) at the start of `rest`.
fn parse_array(rest: &str, cx: &Cx, m: &mut ParsedMessage) {
    match json_prefix(rest) {
        JsonPrefix::Complete(v, used) => {
            let list = match v {
                Value::Array(a) => a,
                other => vec![other],
            };
            for c in &list {
                let i = m.tool_calls.len();
                if let Some(call) = super::call_from_json(c, mistral_id(cx, i)) {
                    m.tool_calls.push(call);
                }
            }
            let after = rest[used..].trim();
            if cx.is_final && !after.is_empty() {
                append(&mut m.content, after);
            }
        }
        JsonPrefix::Incomplete if !cx.is_final => {}
        _ => {
            if cx.is_final {
                append(&mut m.content, rest.trim());
            }
        }
    }
}

fn append(content: &mut String, text: &str) {
    if !content.is_empty() {
        content.push('\n');
    }
    content.push_str(text);
}

pub(super) fn parse_args(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    if maybe_think_start(text, cx) {
        return m;
    }
    let (thought, text) = split_think(text, cx);
    m.reasoning_content = thought;
    let Some(p) = text.find(TOOL_CALLS) else {
        m.content = cx.open_content(text, &[TOOL_CALLS]);
        return m;
    };
    m.content = text[..p].trim_end().to_string();
    let mut rest = &text[p..];
    loop {
        let Some(r) = rest.trim_start().strip_prefix(TOOL_CALLS) else {
            // Text after the calls.
            let r = rest.trim();
            if cx.is_final && !r.is_empty() {
                append(&mut m.content, r);
            }
            return m;
        };
        if r.trim_start().starts_with('[') {
            // Nemo's array form.
            parse_array(r, cx, &mut m);
            return m;
        }
        let Some(args_at) = r.find(ARGS) else {
            if cx.is_final {
                append(&mut m.content, rest.trim());
            }
            return m;
        };
        let head = &r[..args_at];
        let (name, id) = match head.find(CALL_ID) {
            Some(c) => (&head[..c], Some(head[c + CALL_ID.len()..].trim())),
            None => (head, None),
        };
        let body = &r[args_at + ARGS.len()..];
        match json_prefix(body) {
            JsonPrefix::Complete(v, used) => {
                let i = m.tool_calls.len();
                m.tool_calls.push(ToolCall {
                    id: id
                        .filter(|s| !s.is_empty())
                        .map_or_else(|| mistral_id(cx, i), str::to_string),
                    name: name.trim().to_string(),
                    arguments: args_text(&v),
                });
                rest = &body[used..];
            }
            JsonPrefix::Incomplete if !cx.is_final => return m,
            _ => {
                if cx.is_final {
                    append(&mut m.content, rest.trim());
                }
                return m;
            }
        }
    }
}
