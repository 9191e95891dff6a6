//! Each model family's tool-call format: detection from the chat template, the plan
//! (grammar, lazy triggers, system text) and the parsing of generated text. A new
//! family is one file here plus its arm in [`Format`]'s three dispatches.

mod command_r;
mod deepseek;
mod functionary;
mod generic;
mod gpt_oss;
mod granite;
mod hermes;
mod llama3;
mod mistral;

use lamina_grammar::json_schema::{
    Conversion, GrammarBuilder, SchemaDocument, SchemaError, SchemaOptions, build_grammar,
    format_literal,
};
use serde_json::Value;

use crate::reasoning::{ReasoningFormat, partial_marker_len, split_reasoning};
use crate::{ChatError, ParsedMessage, Plan, Tool, ToolChoice, Tools};

/// How a model family writes tool calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// Plain text (no tools in the request).
    ContentOnly,
    /// A JSON answer under `response_format`: as llama.cpp's chat parser, leading
    /// whitespace and an optional ```` ```json ```` fence around it are not content.
    JsonAnswer,
    /// Templates without native tools: the model answers with one JSON object,
    /// `{"tool_call": …}` / `{"tool_calls": […]}` or `{"response": …}`, constrained by
    /// its schema (llama.cpp's generic format).
    Generic,
    /// `<tool_call>\n{"name": …, "arguments": …}\n</tool_call>` (Hermes 2/3, Qwen 2.5,
    /// Qwen 3, SmolLM3, Granite 4).
    Hermes,
    /// Llama 3.1 / 3.2 / 3.3: `{"name": …, "parameters": …}`, bare or after
    /// `<|python_tag|>` (also `<|python_tag|>NAME.call(k=v, …)` for builtin tools).
    Llama3,
    /// Mistral Nemo: `[TOOL_CALLS][{"name": …, "arguments": …, "id": …}, …]`.
    MistralNemo,
    /// Mistral Small 3.2, Devstral, Ministral 3, Magistral:
    /// `[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{…}` (the id optional), `[THINK]…[/THINK]`.
    MistralArgs,
    /// DeepSeek R1 (and its distills): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
    /// <｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`.
    DeepSeekR1,
    /// DeepSeek V3.1: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}
    /// <｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`.
    DeepSeekV31,
    /// Command R7B: `<|START_THINKING|>…<|END_THINKING|>`, `<|START_RESPONSE|>…
    /// <|END_RESPONSE|>` and `<|START_ACTION|>[{"tool_call_id", "tool_name",
    /// "parameters"}, …]<|END_ACTION|>`.
    CommandR7B,
    /// Command R+ (tool_use template): `Action:\n```json\n[{"tool_name", "parameters"},
    /// …]\n````.
    CommandRPlus,
    /// IBM Granite 3.x: `<|tool_call|>[{"name": …, "arguments": …}, …]`, answers in
    /// `<think>…</think><response>…</response>`.
    Granite,
    /// gpt-oss (harmony): channels `analysis` (reasoning), `final` (content) and calls
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{…}`.
    GptOss,
    /// Functionary v3.1 (Llama 3.1): `<function=NAME>{…}</function>`, and
    /// `<|python_tag|>CODE` for a `python` tool.
    FunctionaryV31,
    /// Functionary v3.2: `>>>NAME\n{…}` after a generation prompt ending in `>>>`,
    /// `all\n…` for content.
    FunctionaryV32,
}

impl Format {
    /// The format a chat template's tool calls take.
    /// The format to read answers with when the request has no tools: plain text,
    /// except for families whose every answer has structure (gpt-oss channels,
    /// Functionary v3.2's recipient line, Command R7B's response markers).
    pub fn for_answers(template_source: &str) -> Format {
        match Format::detect(template_source) {
            f @ (Format::GptOss | Format::FunctionaryV32 | Format::CommandR7B) => f,
            _ => Format::ContentOnly,
        }
    }

    /// Whether answers in this format are read with control tokens rendered as text
    /// (markers like `<|channel|>` or `[TOOL_CALLS]` are often control tokens).
    pub fn reads_control_tokens(self) -> bool {
        !matches!(
            self,
            Format::ContentOnly | Format::JsonAnswer | Format::Generic
        )
    }

    pub fn detect(template_source: &str) -> Format {
        let src = template_source;
        if deepseek::detect_v3_1(src) {
            Format::DeepSeekV31
        } else if deepseek::detect_r1(src) {
            Format::DeepSeekR1
        } else if command_r::detect_r7b(src) {
            Format::CommandR7B
        } else if granite::detect(src) {
            Format::Granite
        } else if hermes::detect(src) {
            Format::Hermes
        } else if gpt_oss::detect(src) {
            Format::GptOss
        } else if functionary::detect_v3_2(src) {
            Format::FunctionaryV32
        } else if functionary::detect_v3_1(src) {
            Format::FunctionaryV31
        } else if llama3::detect(src) {
            Format::Llama3
        } else if mistral::detect_args(src) {
            Format::MistralArgs
        } else if mistral::detect_nemo(src) {
            Format::MistralNemo
        } else if command_r::detect_plus(src) {
            Format::CommandRPlus
        } else {
            Format::Generic
        }
    }

    /// What generating with `tools` (and an optional response schema) needs.
    pub fn plan(
        self,
        tools: &Tools,
        json_schema: Option<&Value>,
        limits: &SchemaOptions,
    ) -> Result<Plan, ChatError> {
        tools.check_schemas(limits)?;
        if tools.choice == ToolChoice::None {
            return Ok(Plan::default());
        }
        match self {
            Format::ContentOnly | Format::JsonAnswer => Ok(Plan::default()),
            Format::Generic => generic::plan(tools, json_schema, limits),
            Format::Hermes => hermes::plan(tools, limits),
            Format::Llama3 => llama3::plan(tools, limits),
            Format::MistralNemo => mistral::plan_nemo(tools, limits),
            Format::MistralArgs => mistral::plan_args(tools, limits),
            Format::DeepSeekR1 => deepseek::plan(tools, limits, false),
            Format::DeepSeekV31 => deepseek::plan(tools, limits, true),
            Format::CommandR7B => command_r::plan_r7b(tools, limits),
            Format::CommandRPlus => command_r::plan_plus(tools, limits),
            Format::Granite => granite::plan(tools, limits),
            Format::GptOss => gpt_oss::plan(tools, limits),
            Format::FunctionaryV31 => functionary::plan_v3_1(tools, limits),
            Format::FunctionaryV32 => functionary::plan_v3_2(tools, limits),
        }
    }

    /// Takes generated text apart. `is_final`: the generation is over (else, while
    /// streaming, only what can no longer change is reported).
    pub fn parse(
        self,
        text: &str,
        reasoning: ReasoningFormat,
        forced_open: bool,
        is_final: bool,
        id_seed: u64,
    ) -> ParsedMessage {
        let cx = Cx {
            extract: reasoning.extracts(),
            forced_open,
            is_final,
            id_seed,
        };
        // Families whose reasoning is not a `<think>` block take it apart themselves.
        match self {
            Format::GptOss => return gpt_oss::parse(text, &cx),
            Format::CommandR7B => return command_r::parse_r7b(text, &cx),
            _ => {}
        }
        let (thought, rest) = split_reasoning(text, reasoning, forced_open, is_final);
        let mut m = match self {
            Format::ContentOnly => ParsedMessage {
                content: rest.to_string(),
                ..Default::default()
            },
            Format::JsonAnswer => ParsedMessage {
                content: crate::json_answer(rest, is_final).to_string(),
                ..Default::default()
            },
            Format::Generic => generic::parse(rest, is_final, id_seed),
            Format::Hermes => hermes::parse(rest, is_final, id_seed),
            Format::Llama3 => llama3::parse(rest, &cx),
            Format::MistralNemo => mistral::parse_nemo(rest, &cx),
            Format::MistralArgs => mistral::parse_args(rest, &cx),
            Format::DeepSeekR1 => deepseek::parse(rest, &cx, false),
            Format::DeepSeekV31 => deepseek::parse(rest, &cx, true),
            Format::CommandRPlus => command_r::parse_plus(rest, &cx),
            Format::Granite => granite::parse(rest, &cx),
            Format::FunctionaryV31 => functionary::parse_v3_1(rest, &cx),
            Format::FunctionaryV32 => functionary::parse_v3_2(rest, &cx),
            Format::GptOss | Format::CommandR7B => unreachable!("handled above"),
        };
        if !thought.is_empty() {
            m.reasoning_content = if m.reasoning_content.is_empty() {
                thought.to_string()
            } else {
                format!("{thought}\n{}", m.reasoning_content)
            };
        }
        m
    }
}

/// What a format's parser needs to know besides the text.
pub(crate) struct Cx {
    /// Reasoning goes to `reasoning_content` (else it stays in the content).
    pub extract: bool,
    /// The prompt opened the reasoning block.
    pub forced_open: bool,
    pub is_final: bool,
    pub id_seed: u64,
}

impl Cx {
    pub fn id(&self, index: usize) -> String {
        crate::call_id(self.id_seed, index)
    }

    /// Content that may still grow: while streaming, a possible partial marker and
    /// trailing whitespace (which a marker coming next would trim) are held back.
    pub fn open_content(&self, text: &str, markers: &[&str]) -> String {
        if self.is_final {
            return text.to_string();
        }
        let hold = markers
            .iter()
            .map(|m| partial_marker_len(text, m))
            .max()
            .unwrap_or(0);
        text[..text.len() - hold].trim_end().to_string()
    }
}

/// A JSON array of one call (or, when `parallel`, one or more), each matching one of
/// `items`: the body of the formats that write their calls as an array.
pub(crate) fn calls_array_schema(items: Vec<Value>, parallel: bool) -> Value {
    let item = if items.len() == 1 {
        items.into_iter().next().unwrap_or_default()
    } else {
        serde_json::json!({"anyOf": items})
    };
    let mut schema = serde_json::json!({"type": "array", "items": item, "minItems": 1});
    if !parallel {
        schema["maxItems"] = serde_json::json!(1);
    }
    schema
}

/// `{"name": {"const": NAME}, "arguments": PARAMETERS}`: the JSON object of one call.
pub(crate) fn call_schema(tool: &crate::Tool, with_id: bool) -> Value {
    let mut props = serde_json::Map::new();
    props.insert("name".into(), serde_json::json!({"const": tool.name}));
    props.insert("arguments".into(), tool.parameters.clone());
    let mut required = vec![Value::from("name"), Value::from("arguments")];
    if with_id {
        props.insert(
            "id".into(),
            serde_json::json!({"type": "string", "minLength": 4, "maxLength": 40}),
        );
        required.push(Value::from("id"));
    }
    serde_json::json!({"type": "object", "properties": props, "required": required})
}

/// A call object `{"name": …, "arguments": …}` parsed; arguments as JSON text.
pub(crate) fn call_from_json(v: &Value, id: String) -> Option<crate::ToolCall> {
    let name = v.get("name")?.as_str()?.to_string();
    let arguments = match v.get("arguments").or_else(|| v.get("parameters")) {
        Some(Value::String(s)) => s.clone(),
        Some(a) => a.to_string(),
        None => "{}".to_string(),
    };
    let id = v
        .get("id")
        .and_then(Value::as_str)
        .map_or(id, str::to_string);
    Some(crate::ToolCall {
        id,
        name,
        arguments,
    })
}

/// Arguments as OpenAI reports them: JSON text (a string value is taken as that text).
pub(crate) fn args_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The JSON value at the start of `s` (after whitespace).
pub(crate) enum JsonPrefix {
    /// The value and the bytes it took (leading whitespace included).
    Complete(Value, usize),
    /// `s` may still become JSON.
    Incomplete,
    /// `s` does not start with JSON.
    Invalid,
}

pub(crate) fn json_prefix(s: &str) -> JsonPrefix {
    let mut it = serde_json::Deserializer::from_str(s).into_iter::<Value>();
    match it.next() {
        Some(Ok(v)) => JsonPrefix::Complete(v, it.byte_offset()),
        None => JsonPrefix::Incomplete,
        Some(Err(e)) if e.is_eof() => JsonPrefix::Incomplete,
        Some(Err(_)) => JsonPrefix::Invalid,
    }
}

pub(crate) fn grammar_error(e: SchemaError) -> ChatError {
    ChatError::BadSchema {
        name: "(tool-call grammar)".into(),
        message: e.to_string(),
    }
}

/// Each callable tool with the schema document `schema(tool)` builds for it.
pub(crate) fn tool_docs(
    tools: &Tools,
    limits: &SchemaOptions,
    schema: impl Fn(&Tool) -> Value,
) -> Result<Vec<(String, SchemaDocument)>, ChatError> {
    tools
        .callable()
        .map(|t| {
            SchemaDocument::parse(&schema(t), limits)
                .map(|d| (t.name.clone(), d))
                .map_err(|e| ChatError::BadSchema {
                    name: t.name.clone(),
                    message: e.to_string(),
                })
        })
        .collect()
}

/// Each callable tool's `parameters` as a schema document.
pub(crate) fn args_docs(
    tools: &Tools,
    limits: &SchemaOptions,
) -> Result<Vec<(String, SchemaDocument)>, ChatError> {
    tool_docs(tools, limits, |t| t.parameters.clone())
}

/// Builds the grammar and the plan: lazy behind `triggers` when the model may also
/// answer in prose (`tool_choice: auto`), else constraining from the first token.
pub(crate) fn make_plan<F>(
    tools: &Tools,
    limits: &SchemaOptions,
    triggers: &[&str],
    f: F,
) -> Result<Plan, ChatError>
where
    F: FnOnce(&mut GrammarBuilder<'_>, bool) -> Result<(), SchemaError>,
{
    let lazy = tools.choice == ToolChoice::Auto;
    let conv: Conversion = build_grammar(limits, |b| f(b, lazy)).map_err(grammar_error)?;
    Ok(Plan {
        grammar: Some(conv.grammar),
        triggers: if lazy {
            triggers.iter().map(|t| t.to_string()).collect()
        } else {
            Vec::new()
        },
        system: None,
    })
}

/// A GBNF literal.
pub(crate) fn lit(s: &str) -> String {
    format_literal(s)
}

/// `first ( sep first )*` when calls may be parallel, else `first`.
pub(crate) fn repeat(call: &str, sep: &str, parallel: bool) -> String {
    if parallel {
        format!("{call} ( {sep} {call} )*")
    } else {
        call.to_string()
    }
}

/// A rule matching any text that does not contain `marker`, then `marker` (a
/// Knuth–Morris–Pratt automaton over the marker's characters: one rule per matched
/// prefix length). Returns the rule's name.
pub(crate) fn until_marker(
    b: &mut GrammarBuilder<'_>,
    name: &str,
    marker: &str,
) -> Result<String, SchemaError> {
    let m: Vec<char> = marker.chars().collect();
    let n = m.len();
    let mut alphabet: Vec<char> = m.clone();
    alphabet.sort_unstable();
    alphabet.dedup();
    // Failure function.
    let mut fail = vec![0usize; n];
    let mut k = 0;
    for i in 1..n {
        while k > 0 && m[i] != m[k] {
            k = fail[k - 1];
        }
        if m[i] == m[k] {
            k += 1;
        }
        fail[i] = k;
    }
    let delta = |state: usize, c: char| -> usize {
        let mut s = state;
        loop {
            if s < n && m[s] == c {
                return s + 1;
            }
            if s == 0 {
                return 0;
            }
            s = fail[s - 1];
        }
    };
    let state_name = |i: usize| format!("{name}-s{i}");
    let mut other = String::from("[^");
    for c in &alphabet {
        other.push_str(&class_char(*c));
    }
    other.push(']');
    // State i: the text so far ends with the marker's first i characters (and holds
    // no whole marker). It may end with the rest of the marker.
    let names: Vec<String> = (0..n).map(state_name).collect();
    let mut real = Vec::with_capacity(n);
    for i in 0..n {
        let mut alts = vec![lit(&marker[byte_at(marker, i)..])];
        alts.push(format!("{other} {}", names[0]));
        for &c in &alphabet {
            let next = delta(i, c);
            if next < n {
                alts.push(format!("{} {}", lit(&c.to_string()), names[next]));
            }
        }
        real.push(b.add_rule(&names[i], &alts.join(" | "))?);
    }
    if real != names {
        return Err(SchemaError::Conversion(vec![format!(
            "rule names {name}-s* are taken"
        )]));
    }
    Ok(real[0].clone())
}

fn byte_at(s: &str, char_index: usize) -> usize {
    s.char_indices().nth(char_index).map_or(s.len(), |(b, _)| b)
}

fn class_char(c: char) -> String {
    match c {
        '\\' | ']' | '[' | '^' | '-' => format!("\\{c}"),
        '\n' => "\\n".into(),
        '\r' => "\\r".into(),
        '\t' => "\\t".into(),
        _ => c.to_string(),
    }
}

/// The first of `markers` in `text`: (position, marker).
pub(crate) fn find_first<'m>(text: &str, markers: &[&'m str]) -> Option<(usize, &'m str)> {
    markers
        .iter()
        .filter_map(|m| text.find(m).map(|p| (p, *m)))
        .min_by_key(|(p, m)| (*p, usize::MAX - m.len()))
}
