//! Hermes-style calls (NousResearch Hermes 2 Pro / 3, Qwen 2.5 and 3, SmolLM3):
//! `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, possibly several,
//! after optional prose. With `tool_choice: auto` the grammar is lazy, triggered by
//! `<tool_call>`; `required` or a named function constrain from the first token.

use lamina_grammar::json_schema::{SchemaDocument, SchemaOptions, build_grammar};

use super::{call_from_json, call_schema};
use crate::reasoning::partial_marker_len;
use crate::{ChatError, ParsedMessage, Plan, ToolChoice, Tools, call_id};

const START: &str = "<tool_call>";
const END: &str = "</tool_call>";

pub(super) fn detect(src: &str) -> bool {
    // Qwen3-Coder's XML calls (`<function=…>`) share the tag but not the JSON body.
    src.contains(START) && !src.contains("<function=")
}

pub(super) fn plan(tools: &Tools, limits: &SchemaOptions) -> Result<Plan, ChatError> {
    let docs: Vec<(String, SchemaDocument)> = tools
        .callable()
        .map(|t| {
            SchemaDocument::parse(&call_schema(t, false), limits)
                .map(|d| (t.name.clone(), d))
                .map_err(|e| ChatError::BadSchema {
                    name: t.name.clone(),
                    message: e.to_string(),
                })
        })
        .collect::<Result<_, _>>()?;
    let conv = build_grammar(limits, |b| {
        let mut alts = Vec::new();
        for (name, doc) in &docs {
            alts.push(b.add_schema(&format!("{name}-call"), doc, doc.root())?);
        }
        let call = b.add_rule(
            "tool-call",
            &format!(
                "\"<tool_call>\" space ( {} ) space \"</tool_call>\"",
                alts.join(" | ")
            ),
        )?;
        let body = if tools.parallel {
            format!("{call} ( space {call} )* space")
        } else {
            format!("{call} space")
        };
        b.add_rule("root", &body)?;
        Ok(())
    })
    .map_err(|e| ChatError::BadSchema {
        name: "(tool-call grammar)".into(),
        message: e.to_string(),
    })?;
    let lazy = tools.choice == ToolChoice::Auto;
    Ok(Plan {
        grammar: Some(conv.grammar),
        triggers: if lazy {
            vec![START.to_string()]
        } else {
            Vec::new()
        },
        system: None,
    })
}

pub(super) fn parse(text: &str, is_final: bool, id_seed: u64) -> ParsedMessage {
    let mut m = ParsedMessage::default();
    let Some(first) = text.find(START) else {
        if is_final {
            m.content = text.to_string();
        } else {
            // Trailing whitespace too: a call coming next would trim it.
            let hold = partial_marker_len(text, START);
            m.content = text[..text.len() - hold].trim_end().to_string();
        }
        return m;
    };
    m.content = text[..first].trim_end().to_string();
    if !is_final {
        return m;
    }
    let mut rest = &text[first..];
    while let Some(s) = rest.find(START) {
        let after = &rest[s + START.len()..];
        let (body, next) = match after.find(END) {
            Some(e) => (&after[..e], &after[e + END.len()..]),
            None => (after, ""),
        };
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(body.trim())
            && let Some(c) = call_from_json(&v, call_id(id_seed, m.tool_calls.len()))
        {
            m.tool_calls.push(c);
        }
        rest = next;
    }
    m
}
