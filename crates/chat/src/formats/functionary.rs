//! MeetKai Functionary. v3.1 (on Llama 3.1) writes `<function=NAME>{...}</function>`
//! (lazy trigger `<function=`), and raw code after `<|python_tag|>` for a `python`
//! tool. v3.2's generation prompt ends in `>>>`; the answer names its recipient on
//! the first line: `all\n` and prose, or `NAME\n{...}` for a call, further messages
//! following as `>>>NAME\n{...}` (lazy triggers `NAME\n` for each tool; a `python`
//! call may be raw code).

use lamina_grammar::json_schema::SchemaOptions;
use serde_json::json;

use super::{Cx, JsonPrefix, args_docs, args_text, find_first, json_prefix, lit, make_plan};
use crate::reasoning::partial_marker_len;
use crate::{ChatError, ParsedMessage, Plan, ToolCall, Tools};

const FUNCTION: &str = "<function=";
const FUNCTION_END: &str = "</function>";
const PYTHON_TAG: &str = "<|python_tag|>";
const RECIPIENT: &str = ">>>";

pub(super) fn detect_v3_1(src: &str) -> bool {
    src.contains("<|start_header_id|>") && src.contains(FUNCTION)
}

pub(super) fn detect_v3_2(src: &str) -> bool {
    src.contains(">>>all")
}

fn is_python(name: &str) -> bool {
    name == "python" || name == "ipython"
}

pub(super) fn plan_v3_1(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let docs = args_docs(tools, limits)?;
    let raw_python = docs.iter().any(|(n, _)| is_python(n));
    let triggers: &[&str] = if raw_python {
        &[FUNCTION, PYTHON_TAG]
    } else {
        &[FUNCTION]
    };
    make_plan(tools, limits, triggers, |b, _lazy| {
        let mut alts = Vec::new();
        for (name, doc) in &docs {
            let args = b.add_schema(&format!("{name}-args"), doc, doc.root())?;
            alts.push(b.add_rule(
                &format!("{name}-call"),
                &format!(
                    "{} {args} space {} space",
                    lit(&format!("{FUNCTION}{name}>")),
                    lit(FUNCTION_END)
                ),
            )?);
        }
        if raw_python {
            alts.push(b.add_rule("python-raw-call", &format!("{} .*", lit(PYTHON_TAG)))?);
        }
        let call = b.add_rule("tool-call", &alts.join(" | "))?;
        let root = if tools.parallel {
            format!("{call}+")
        } else {
            call
        };
        b.add_rule("root", &root)?;
        Ok(())
    })
}

pub(super) fn parse_v3_1(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let Some((p, _)) = find_first(text, &[FUNCTION, PYTHON_TAG]) else {
        m.content = cx.open_content(text, &[FUNCTION, PYTHON_TAG]);
        return m;
    };
    m.content = text[..p].trim_end().to_string();
    let mut rest = &text[p..];
    loop {
        let s = rest.trim_start();
        if s.is_empty() {
            return m;
        }
        if let Some(code) = s.strip_prefix(PYTHON_TAG) {
            if cx.is_final {
                m.tool_calls.push(ToolCall {
                    id: cx.id(m.tool_calls.len()),
                    name: "python".into(),
                    arguments: json!({"code": code}).to_string(),
                });
            }
            return m;
        }
        let Some(after) = s.strip_prefix(FUNCTION) else {
            // Text between or after calls.
            match find_first(s, &[FUNCTION, PYTHON_TAG]) {
                Some((q, _)) => {
                    add_content(&mut m.content, s[..q].trim());
                    rest = &s[q..];
                    continue;
                }
                None => {
                    if cx.is_final {
                        add_content(&mut m.content, s.trim());
                    }
                    return m;
                }
            }
        };
        let Some(gt) = after.find('>') else {
            if cx.is_final {
                add_content(&mut m.content, s);
            }
            return m;
        };
        let name = &after[..gt];
        let body = &after[gt + 1..];
        match json_prefix(body) {
            JsonPrefix::Complete(v, used) => {
                let tail = body[used..].trim_start();
                if !cx.is_final && tail.len() < FUNCTION_END.len() && FUNCTION_END.starts_with(tail)
                {
                    return m;
                }
                m.tool_calls.push(ToolCall {
                    id: cx.id(m.tool_calls.len()),
                    name: name.to_string(),
                    arguments: args_text(&v),
                });
                rest = tail.strip_prefix(FUNCTION_END).unwrap_or(tail);
            }
            JsonPrefix::Incomplete if !cx.is_final => return m,
            _ => {
                if cx.is_final {
                    add_content(&mut m.content, s);
                }
                return m;
            }
        }
    }
}

fn add_content(content: &mut String, text: &str) {
    if text.is_empty() {
        return;
    }
    if !content.is_empty() {
        content.push('\n');
    }
    content.push_str(text);
}

pub(super) fn plan_v3_2(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let docs = args_docs(tools, limits)?;
    // The first message's recipient starts the output; later ones follow `>>>`.
    let triggers: Vec<String> = docs
        .iter()
        .flat_map(|(n, _)| [format!("^{n}\n"), format!(">>>{n}\n")])
        .collect();
    let trigger_refs: Vec<&str> = triggers.iter().map(String::as_str).collect();
    make_plan(tools, limits, &trigger_refs, |b, _lazy| {
        let mut alts = Vec::new();
        for (name, doc) in &docs {
            let mut args = b.add_schema(&format!("{name}-args"), doc, doc.root())?;
            if is_python(name) {
                args = b.add_rule(
                    &format!("{name}-maybe-raw-args"),
                    &format!("{args} | [^{{] .*"),
                )?;
            }
            alts.push(b.add_rule(
                &format!("{name}-call"),
                &format!("{} {args}", lit(&format!("{name}\n"))),
            )?);
        }
        let call = b.add_rule("tool-call", &alts.join(" | "))?;
        let root = if tools.parallel {
            format!("{call} space ( {} {call} space )*", lit(RECIPIENT))
        } else {
            format!("{call} space")
        };
        b.add_rule("root", &root)?;
        Ok(())
    })
}

/// A recipient name: word characters (and `.`/`-`).
fn is_recipient(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '.')
}

pub(super) fn parse_v3_2(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let mut rest = text.strip_prefix(RECIPIENT).unwrap_or(text);
    let mut first = true;
    loop {
        let Some(nl) = rest.find('\n') else {
            // The recipient line is not complete.
            if cx.is_final {
                if !(rest.is_empty() || rest == "all") {
                    m.content.push_str(rest);
                }
            } else if first && !is_recipient(rest) && !rest.is_empty() {
                // Not this format's shape: plain content.
                m.content = cx.open_content(text, &[RECIPIENT]);
            }
            return m;
        };
        let recipient = &rest[..nl];
        let body = &rest[nl + 1..];
        if !is_recipient(recipient) {
            if first {
                m.content = cx.open_content(text, &[]);
            } else if cx.is_final {
                m.content.push_str(rest);
            }
            return m;
        }
        first = false;
        if recipient == "all" {
            match body.find(RECIPIENT) {
                Some(q) => {
                    m.content.push_str(&body[..q]);
                    rest = &body[q + RECIPIENT.len()..];
                    continue;
                }
                None => {
                    if cx.is_final {
                        m.content.push_str(body);
                    } else {
                        let hold = partial_marker_len(body, RECIPIENT);
                        m.content.push_str(&body[..body.len() - hold]);
                    }
                    return m;
                }
            }
        }
        let b = body.trim_start();
        if is_python(recipient) && !b.is_empty() && !b.starts_with('{') {
            if cx.is_final {
                m.tool_calls.push(ToolCall {
                    id: cx.id(m.tool_calls.len()),
                    name: recipient.to_string(),
                    arguments: json!({"code": body}).to_string(),
                });
            }
            return m;
        }
        match json_prefix(body) {
            JsonPrefix::Complete(v, used) => {
                m.tool_calls.push(ToolCall {
                    id: cx.id(m.tool_calls.len()),
                    name: recipient.to_string(),
                    arguments: args_text(&v),
                });
                let tail = body[used..].trim_start();
                match tail.strip_prefix(RECIPIENT) {
                    Some(next) => rest = next,
                    None => {
                        if cx.is_final && !tail.trim().is_empty() {
                            m.content.push_str(tail.trim());
                        }
                        return m;
                    }
                }
            }
            JsonPrefix::Incomplete if !cx.is_final => return m,
            _ => {
                if cx.is_final {
                    m.content.push_str(body);
                }
                return m;
            }
        }
    }
}
