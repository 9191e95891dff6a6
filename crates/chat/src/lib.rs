//! The chat protocol around a model, between the OpenAI API and the sampler. It owns
//! OpenAI tool definitions and `tool_choice` ([`Tools`]), the tool-call format of each
//! model family ([`Format`], detected from the chat template): the system text a
//! template without native tools needs, the grammar that constrains a call (lazy,
//! behind a trigger, when the model may also answer in prose), and the parsing of the
//! generated text back into content, `reasoning_content` and tool calls
//! ([`ParsedMessage`]), incrementally for streaming.

mod formats;
mod reasoning;

pub use formats::Format;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_answers_lose_fences_and_space() {
        assert_eq!(json_answer("  {\"a\": 1}\n", true), "{\"a\": 1}");
        assert_eq!(json_answer("```json\n{\"a\": 1}\n```", true), "{\"a\": 1}");
        assert_eq!(json_answer("``", false), "");
        assert_eq!(json_answer("```json\n{\"a\": 1}\n`", false), "{\"a\": 1}");
        let g = response_format_grammar(
            &serde_json::json!({"type": "object"}),
            &SchemaOptions::default(),
        )
        .unwrap();
        let g = lamina_grammar::Grammar::parse(&g, "root", None).unwrap();
        for (text, ok) in [
            ("{}", true),
            ("\n```json\n{\"a\": 1}\n```", true),
            ("```json{}```", true),
            ("```json{}```\n", false),
            ("x{}", false),
        ] {
            let mut m = lamina_grammar::Matcher::new(
                &g,
                std::sync::Arc::new(lamina_grammar::TokenIndex::new(vec![b"x".to_vec()], |_| {
                    false
                })),
            );
            assert_eq!(
                m.accept_str(text).is_ok() && m.is_accepting(),
                ok,
                "{text:?}"
            );
        }
    }
}
pub use reasoning::{
    Reasoning, ReasoningFormat, THINK_END, THINK_START, close_thinking, split_reasoning,
    template_reasoning_markers,
};

use lamina_grammar::json_schema::SchemaOptions;
use serde_json::Value;

/// Why a request's tools could not be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChatError {
    #[error("{param}: {message}")]
    Invalid {
        param: &'static str,
        message: String,
    },
    #[error("tool_choice names the function '{0}', which is not among the tools")]
    UnknownFunction(String),
    #[error("the parameters of tool '{name}' are not a usable JSON schema: {message}")]
    BadSchema { name: String, message: String },
}

impl ChatError {
    /// The request field the error is about.
    pub fn param(&self) -> &'static str {
        match self {
            ChatError::Invalid { param, .. } => param,
            ChatError::UnknownFunction(_) => "tool_choice",
            ChatError::BadSchema { .. } => "tools",
        }
    }
}

fn invalid(param: &'static str, message: impl Into<String>) -> ChatError {
    ChatError::Invalid {
        param,
        message: message.into(),
    }
}

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    pub name: String,
    pub description: String,
    /// JSON schema of the arguments (`{}`-like when absent).
    pub parameters: Value,
}

/// OpenAI's `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    Auto,
    None,
    Required,
    /// `{"type": "function", "function": {"name": ...}}`: this function, always.
    Function(String),
}

/// A request's tools and how they may be used.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    pub tools: Vec<Tool>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// The `tools` array as the client sent it (what templates render).
    pub raw: Value,
}

impl Tools {
    /// Validates OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`. `None`
    /// when there are no tools (an empty array included).
    pub fn from_request(
        tools: Option<&Value>,
        tool_choice: Option<&Value>,
        parallel_tool_calls: Option<&Value>,
    ) -> Result<Option<Tools>, ChatError> {
        let list = match tools {
            None | Some(Value::Null) => return Ok(None),
            Some(Value::Array(a)) if a.is_empty() => return Ok(None),
            Some(Value::Array(a)) => a,
            Some(_) => return Err(invalid("tools", "tools must be an array")),
        };
        let mut out: Vec<Tool> = Vec::with_capacity(list.len());
        for (i, t) in list.iter().enumerate() {
            let kind = t.get("type").and_then(Value::as_str);
            if kind != Some("function") {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}].type must be \"function\""),
                ));
            }
            let Some(f) = t.get("function").and_then(Value::as_object) else {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}].function must be an object"),
                ));
            };
            let Some(name) = f
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            else {
                return Err(invalid(
                    "tools",
                    format!("tools[{i}].function.name must be a non-empty string"),
                ));
            };
            if out.iter().any(|o| o.name == name) {
                return Err(invalid("tools", format!("tool '{name}' is defined twice")));
            }
            let description = match f.get("description") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(_) => {
                    return Err(invalid(
                        "tools",
                        format!("tools[{i}].function.description must be a string"),
                    ));
                }
            };
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => serde_json::json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => {
                    return Err(invalid(
                        "tools",
                        format!("tools[{i}].function.parameters must be a JSON schema object"),
                    ));
                }
            };
            out.push(Tool {
                name: name.to_string(),
                description,
                parameters,
            });
        }
        let choice = match tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "auto" => ToolChoice::Auto,
                "none" => ToolChoice::None,
                "required" => ToolChoice::Required,
                other => {
                    return Err(invalid(
                        "tool_choice",
                        format!(
                            "tool_choice must be \"auto\", \"none\", \"required\" or a function, got \"{other}\""
                        ),
                    ));
                }
            },
            Some(v @ Value::Object(_)) => {
                let name = v
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        invalid(
                            "tool_choice",
                            "tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}",
                        )
                    })?;
                if !out.iter().any(|t| t.name == name) {
                    return Err(ChatError::UnknownFunction(name.to_string()));
                }
                ToolChoice::Function(name.to_string())
            }
            Some(_) => {
                return Err(invalid(
                    "tool_choice",
                    "tool_choice must be a string or an object",
                ));
            }
        };
        let parallel = match parallel_tool_calls {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(invalid(
                    "parallel_tool_calls",
                    "parallel_tool_calls must be a boolean",
                ));
            }
        };
        Ok(Some(Tools {
            tools: out,
            choice,
            parallel,
            raw: Value::Array(list.clone()),
        }))
    }

    /// The tools a call may name: all of them, or the one `tool_choice` names.
    pub fn callable(&self) -> impl Iterator<Item = &Tool> {
        self.tools.iter().filter(move |t| match &self.choice {
            ToolChoice::Function(n) => &t.name == n,
            _ => true,
        })
    }

    /// Checks that every tool's parameters convert to a grammar.
    pub fn check_schemas(&self, limits: &SchemaOptions) -> Result<(), ChatError> {
        for t in &self.tools {
            let bad = |message: String| ChatError::BadSchema {
                name: t.name.clone(),
                message,
            };
            let gbnf = lamina_grammar::json_schema::json_schema_to_grammar(&t.parameters, limits)
                .map_err(|e| bad(e.to_string()))?;
            lamina_grammar::Grammar::parse(&gbnf, "root", None)
                .map_err(|e| bad(format!("no arguments satisfy it ({e})")))?;
        }
        Ok(())
    }
}

/// One call the model asked for, as OpenAI reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// An assistant turn taken apart.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ParsedMessage {
    pub content: String,
    pub reasoning_content: String,
    pub tool_calls: Vec<ToolCall>,
}

/// What generating one chat turn needs beyond the rendered prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// GBNF constraining the output.
    pub grammar: Option<String>,
    /// The grammar starts constraining only once one of these appears in the output
    /// (the model may answer in prose until it starts a call); one written `^WORD`
    /// only at the start of the output.
    pub triggers: Vec<String>,
    /// A system message to add (prepended to the first system message, or as one): how
    /// to call tools, for templates that do not describe tools themselves.
    pub system: Option<String>,
}

impl Plan {
    pub fn is_lazy(&self) -> bool {
        !self.triggers.is_empty()
    }
}

/// The grammar llama.cpp's chat parser builds for `response_format` on a template
/// without reasoning: optional leading whitespace, then the JSON, bare or in a
/// ```` ```json ```` fence, with whitespace around.
pub fn response_format_grammar(
    schema: &Value,
    limits: &SchemaOptions,
) -> Result<String, lamina_grammar::json_schema::SchemaError> {
    use lamina_grammar::json_schema::{SchemaDocument, build_grammar};
    let doc = SchemaDocument::parse(schema, limits)?;
    let conv = build_grammar(limits, |b| {
        let body = b.add_schema("response-format-schema", &doc, doc.root())?;
        let answer = b.add_rule("response-format", &body)?;
        b.add_rule(
            "root",
            &format!(
                "space space (\"```json\" space {answer} space \"```\" | space {answer} space)"
            ),
        )?;
        Ok(())
    })?;
    Ok(conv.grammar)
}

/// The JSON of an answer written under [`response_format_grammar`]: whitespace and
/// the fence removed. While streaming (`!is_final`) what could still turn out to be
/// fence or trailing whitespace is held back.
pub fn json_answer(text: &str, is_final: bool) -> &str {
    let t = text.trim_start();
    let (t, fenced) = match t.strip_prefix("```json") {
        Some(rest) => (rest.trim_start(), true),
        None if !is_final && "```json".starts_with(t) => return "",
        None => (t, false),
    };
    let t = if fenced {
        match t.rfind("```") {
            Some(end) => &t[..end],
            None => t,
        }
    } else {
        t
    };
    if is_final {
        t.trim_end()
    } else {
        t.trim_end_matches(|c: char| c.is_whitespace() || c == '`')
    }
}

/// A tool-call id, as OpenAI's `call_...` ids look: deterministic per position so that
/// the same generation reports the same ids.
pub fn call_id(seed: u64, index: usize) -> String {
    let mut x = seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    const ALPHA: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    let mut s = String::from("call_");
    for _ in 0..24 {
        s.push(ALPHA[(x % ALPHA.len() as u64) as usize] as char);
        x = x.rotate_left(7).wrapping_mul(0x2545_F491_4F6C_DD1D) ^ 0x5851_F42D_4C95_7F2D;
    }
    s
}
