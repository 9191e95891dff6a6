//! DeepSeek R1 (and its Qwen / Llama distills) and DeepSeek V3.1. Both wrap the calls
//! in `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`, one
//! `<｜tool▁call▁begin｜>…<｜tool▁call▁end｜>` each. R1 writes
//! `function<｜tool▁sep｜>NAME\n```json\n{...}\n```` inside, V3.1 `NAME<｜tool▁sep｜>{...}`.
//! Reasoning is a `<think>` block (split before these parsers run). The distills are
//! unsure of the opening tag, so its common variants are accepted (llama.cpp's list).
//! Lazy triggers: those opening tags. A grammar that applies from the first token
//! lets the model reason first (`… </think>`).

use lamina_grammar::json_schema::SchemaOptions;

use super::{Cx, JsonPrefix, args_docs, args_text, find_first, json_prefix, lit, make_plan};
use crate::reasoning::THINK_END;
use crate::{ChatError, ParsedMessage, Plan, ToolCall, Tools};

const CALLS_BEGIN: [&str; 5] = [
    "<｜tool▁calls▁begin｜>",
    "<｜tool_calls_begin｜>",
    "<｜tool calls begin｜>",
    "<｜tool\\_calls\\_begin｜>",
    "<｜tool▁calls｜>",
];
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";

pub(super) fn detect_r1(src: &str) -> bool {
    src.contains(CALLS_BEGIN[0])
}

pub(super) fn detect_v3_1(src: &str) -> bool {
    src.contains("message['prefix'] is defined and message['prefix'] and thinking")
        || (src.contains(CALLS_BEGIN[0])
            && src.contains("tool['function']['name'] + '<｜tool▁sep｜>'"))
}

pub(super) fn plan(tools: &Tools, limits: &SchemaOptions, v3_1: bool) -> Result<Plan, ChatError> {
    let docs = args_docs(tools, limits)?;
    make_plan(tools, limits, &CALLS_BEGIN, |b, lazy| {
        let mut alts = Vec::new();
        for (name, doc) in &docs {
            let args = b.add_schema(&format!("{name}-args"), doc, doc.root())?;
            let rule = if v3_1 {
                format!(
                    "( {} )? {} {args} space {}",
                    lit(CALL_BEGIN),
                    lit(&format!("{name}{SEP}")),
                    lit(CALL_END)
                )
            } else {
                format!(
                    "( {} )? {} {args} space {}",
                    lit(CALL_BEGIN),
                    lit(&format!("function{SEP}{name}\n```json\n")),
                    lit(&format!("```{CALL_END}"))
                )
            };
            alts.push(b.add_rule(&format!("{name}-call"), &rule)?);
        }
        let call = b.add_rule("tool-call", &alts.join(" | "))?;
        let begin: Vec<String> = CALLS_BEGIN.iter().map(|s| lit(s)).collect();
        let calls = if tools.parallel {
            format!("{call} ( space {call} )*")
        } else {
            call
        };
        let think = if lazy {
            String::new()
        } else {
            let body = super::until_marker(b, "think", THINK_END)?;
            format!("( {body} space )? ")
        };
        b.add_rule(
            "root",
            &format!(
                "{think}( {} ) {calls} space {} space",
                begin.join(" | "),
                lit(CALLS_END)
            ),
        )?;
        Ok(())
    })
}

pub(super) fn parse(text: &str, cx: &Cx, v3_1: bool) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let Some((p, marker)) = find_first(text, &CALLS_BEGIN) else {
        // Models sometimes skip the block's opening tag.
        if let Some(p) = text.find(CALL_BEGIN) {
            m.content = text[..p].trim_end().to_string();
            parse_calls(&text[p..], cx, v3_1, &mut m);
            return m;
        }
        let mut markers = CALLS_BEGIN.to_vec();
        markers.push(CALL_BEGIN);
        m.content = cx.open_content(text, &markers);
        return m;
    };
    m.content = text[..p].trim_end().to_string();
    parse_calls(&text[p + marker.len()..], cx, v3_1, &mut m);
    m
}

fn parse_calls(mut rest: &str, cx: &Cx, v3_1: bool, m: &mut ParsedMessage) {
    loop {
        let s = rest.trim_start();
        if let Some(after) = s.strip_prefix(CALLS_END) {
            finish(after, cx, m);
            return;
        }
        if s.is_empty() {
            return;
        }
        let s = s.strip_prefix(CALL_BEGIN).unwrap_or(s);
        let Some(sep) = s.find(SEP) else {
            return give_up(s, cx, m);
        };
        let (name, body) = if v3_1 {
            (s[..sep].trim(), &s[sep + SEP.len()..])
        } else {
            // `function<｜tool▁sep｜>NAME\n```json\n{...}\n````
            let after = &s[sep + SEP.len()..];
            let Some(nl) = after.find('\n') else {
                return give_up(s, cx, m);
            };
            let body = after[nl + 1..].trim_start();
            let body = body.strip_prefix("```json").unwrap_or(body);
            (after[..nl].trim(), body)
        };
        match json_prefix(body) {
            JsonPrefix::Complete(v, used) => {
                let mut after = body[used..].trim_start();
                after = after.strip_prefix("```").unwrap_or(after).trim_start();
                match after.strip_prefix(CALL_END) {
                    Some(next) => {
                        m.tool_calls.push(ToolCall {
                            id: cx.id(m.tool_calls.len()),
                            name: name.to_string(),
                            arguments: args_text(&v),
                        });
                        rest = next;
                    }
                    None if !cx.is_final && CALL_END.starts_with(after) => return,
                    None => {
                        // A closing tag missing at the end still ends the call.
                        if cx.is_final && after.is_empty() {
                            m.tool_calls.push(ToolCall {
                                id: cx.id(m.tool_calls.len()),
                                name: name.to_string(),
                                arguments: args_text(&v),
                            });
                            return;
                        }
                        return give_up(s, cx, m);
                    }
                }
            }
            JsonPrefix::Incomplete if !cx.is_final => return,
            _ => return give_up(s, cx, m),
        }
    }
}

/// Text after the call block is content.
fn finish(after: &str, cx: &Cx, m: &mut ParsedMessage) {
    let after = after.trim();
    if !after.is_empty() {
        let add = cx.open_content(after, &[]);
        if !m.content.is_empty() && !add.is_empty() {
            m.content.push('\n');
        }
        m.content.push_str(&add);
    }
}

/// A malformed call: while streaming, wait; at the end, it is content.
fn give_up(s: &str, cx: &Cx, m: &mut ParsedMessage) {
    if cx.is_final {
        finish(s, cx, m);
    }
}
