//! gpt-oss (OpenAI's harmony format). The answer is a series of messages, each
//! `<|start|>assistant` (the first one's is in the prompt), a header, `<|message|>`, a
//! body and `<|end|>` (`<|call|>` after a call, `<|return|>` after the final answer).
//! The header names a channel: `analysis` is reasoning, `final` (and `commentary`
//! without a recipient) content; a call names its recipient, in the role part
//! (` to=functions.NAME<|channel|>commentary json<|message|>{...}`) or in the channel
//! part (`<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}`).
//! Calls to builtin recipients (`browser.*`, `python`, `container.*`) are dropped, as
//! llama.cpp does. Lazy trigger: ` to=functions.`, which both placements contain.

use lamina_grammar::json_schema::SchemaOptions;

use super::{Cx, JsonPrefix, args_docs, args_text, json_prefix, lit, make_plan, until_marker};
use crate::reasoning::partial_marker_len;
use crate::{ChatError, ParsedMessage, Plan, ToolCall, Tools};

const START: &str = "<|start|>assistant";
const MESSAGE: &str = "<|message|>";
const CHANNEL: &str = "<|channel|>";
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
const TO_FUNCTIONS: &str = " to=functions.";

pub(super) fn detect(src: &str) -> bool {
    src.contains(CHANNEL) && src.contains(MESSAGE)
}

pub(super) fn plan(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let docs = args_docs(tools, limits)?;
    make_plan(tools, limits, &[TO_FUNCTIONS], |b, lazy| {
        let channel = b.add_rule(
            "channel",
            &format!("{} ( \"commentary\" | \"analysis\" )", lit(CHANNEL)),
        )?;
        let constraint = b.add_rule(
            "constraint",
            &format!("\" \" {}? [a-zA-Z0-9_-]+", lit("<|constrain|>")),
        )?;
        let mut alts = Vec::new();
        for (name, doc) in &docs {
            let args = b.add_schema(&format!("{name}-args"), doc, doc.root())?;
            alts.push(b.add_rule(
                &format!("{name}-call"),
                &format!(
                    "{} {channel}? {constraint}? {} {args}",
                    lit(name),
                    lit(MESSAGE)
                ),
            )?);
        }
        let call = b.add_rule(
            "tool-call",
            &format!("{} ( {} )", lit(TO_FUNCTIONS), alts.join(" | ")),
        )?;
        if lazy {
            b.add_rule("root", &call)?;
        } else {
            let analysis_body = until_marker(b, "analysis-body", "<|end|>")?;
            let preamble_body = until_marker(b, "preamble-body", "<|end|>")?;
            let analysis = b.add_rule(
                "analysis",
                &format!(
                    "{} {analysis_body} {}",
                    lit("<|channel|>analysis<|message|>"),
                    lit(START)
                ),
            )?;
            let preamble = b.add_rule(
                "preamble",
                &format!(
                    "{} {preamble_body} {}",
                    lit("<|channel|>commentary<|message|>"),
                    lit(START)
                ),
            )?;
            b.add_rule(
                "root",
                &format!("{analysis}? {preamble}? ( {channel} )? {call}"),
            )?;
        }
        Ok(())
    })
}

/// The header's recipient (`to=…`) and channel.
fn header_parts(header: &str) -> (Option<&str>, Option<&str>) {
    let word = |s: &str| -> String {
        s.chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect()
    };
    let recipient = header.find("to=").map(|p| {
        let w = word(&header[p + 3..]);
        &header[p + 3..p + 3 + w.len()]
    });
    let channel = header.find(CHANNEL).map(|p| {
        let s = &header[p + CHANNEL.len()..];
        &s[..word(s).len()]
    });
    (recipient, channel)
}

pub(super) fn parse(text: &str, cx: &Cx) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let mut rest = text;
    loop {
        if !cx.is_final && !rest.is_empty() && START.starts_with(rest) {
            break;
        }
        rest = rest.strip_prefix(START).unwrap_or(rest);
        if rest.is_empty() {
            break;
        }
        let Some(h) = rest.find(MESSAGE) else {
            // No header yet (or, at the end, text outside the format).
            if cx.is_final && !rest.contains(CHANNEL) && !rest.contains(" to=") {
                m.content.push_str(rest);
            }
            break;
        };
        let header = &rest[..h];
        let body_all = &rest[h + MESSAGE.len()..];
        let end = ENDS
            .iter()
            .filter_map(|e| body_all.find(e).map(|p| (p, e.len())))
            .min();
        let (body, next) = match end {
            Some((p, len)) => (&body_all[..p], Some(&body_all[p + len..])),
            None => (body_all, None),
        };
        let closed = next.is_some() || cx.is_final;
        let (recipient, channel) = header_parts(header);
        let recipient = recipient.filter(|r| *r != "assistant" && *r != "user");
        match recipient {
            Some(r) => {
                if let Some(name) = r.strip_prefix("functions.") {
                    match json_prefix(body) {
                        JsonPrefix::Complete(v, _) => m.tool_calls.push(ToolCall {
                            id: cx.id(m.tool_calls.len()),
                            name: name.to_string(),
                            arguments: args_text(&v),
                        }),
                        JsonPrefix::Incomplete if !closed => break,
                        _ => {}
                    }
                }
            }
            None => {
                let shown = if closed {
                    body
                } else {
                    let hold = ENDS
                        .iter()
                        .map(|e| partial_marker_len(body, e))
                        .max()
                        .unwrap_or(0);
                    &body[..body.len() - hold]
                };
                if channel == Some("analysis") {
                    if cx.extract {
                        m.reasoning_content.push_str(shown);
                    } else {
                        m.content.push_str(header);
                        m.content.push_str(MESSAGE);
                        m.content.push_str(shown);
                        if let Some((p, len)) = end {
                            m.content.push_str(&body_all[p..p + len]);
                        }
                    }
                } else {
                    m.content.push_str(shown);
                }
            }
        }
        match next {
            Some(n) => rest = n,
            None => break,
        }
    }
    m
}
