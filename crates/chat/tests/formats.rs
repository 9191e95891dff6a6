//! Tool-call formats: detection from the real chat templates, parsing of model
//! outputs (many from llama.cpp's tests/test-chat.cpp), streaming, and the grammars.

use std::sync::Arc;

use lamina_chat::{Format, ParsedMessage, Plan, ReasoningFormat, ToolCall, Tools};
use lamina_grammar::json_schema::SchemaOptions;
use lamina_grammar::{Grammar, Matcher, TokenIndex};
use serde_json::{Value, json};

// ------------------------------------------------------------------------------------
// Helpers
// ------------------------------------------------------------------------------------

fn template(name: &str) -> Option<String> {
    let path = format!(
        "{}/../../../shared/templates/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    match std::fs::read_to_string(&path) {
        Ok(s) => Some(s),
        Err(_) => {
            eprintln!("skipping: template {path} is absent");
            None
        }
    }
}

fn assert_detects(name: &str, want: Format) {
    if let Some(src) = template(name) {
        assert_eq!(Format::detect(&src), want, "template {name}");
    }
}

fn special_function() -> Value {
    json!({"type": "function", "function": {
        "name": "special_function",
        "description": "I'm special",
        "parameters": {"type": "object",
                       "properties": {"arg1": {"type": "integer", "description": "The arg."}},
                       "required": ["arg1"]}}})
}

fn special_function_with_opt() -> Value {
    json!({"type": "function", "function": {
        "name": "special_function_with_opt",
        "description": "I'm special but have optional stuff",
        "parameters": {"type": "object",
                       "properties": {"arg1": {"type": "integer"}, "arg2": {"type": "integer"}},
                       "required": ["arg1"]}}})
}

fn python_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "python",
        "description": "an ipython interpreter",
        "parameters": {"type": "object",
                       "properties": {"code": {"type": "string"}},
                       "required": ["code"]}}})
}

fn tools_with(list: Vec<Value>, choice: &str, parallel: bool) -> Tools {
    Tools::from_request(
        Some(&Value::Array(list)),
        Some(&json!(choice)),
        Some(&json!(parallel)),
    )
    .unwrap()
    .unwrap()
}

fn tools(choice: &str, parallel: bool) -> Tools {
    tools_with(
        vec![special_function(), special_function_with_opt()],
        choice,
        parallel,
    )
}

fn plan(format: Format, t: &Tools) -> Plan {
    format
        .plan(t, None, &SchemaOptions::default())
        .unwrap_or_else(|e| panic!("{format:?}: {e}"))
}

fn matcher(grammar: &str) -> Matcher {
    let g = Grammar::parse(grammar, "root", None)
        .unwrap_or_else(|e| panic!("grammar does not parse: {e:?}\n{grammar}"));
    Matcher::new(
        &g,
        Arc::new(TokenIndex::new(vec![b"x".to_vec()], |_| false)),
    )
}

fn accepts(grammar: &str, text: &str) -> bool {
    let mut m = matcher(grammar);
    m.accept_str(text).is_ok() && m.is_accepting()
}

/// The plan's grammar accepts each of `good` and rejects each of `bad`.
fn check_grammar(p: &Plan, good: &[&str], bad: &[&str]) {
    let g = p.grammar.as_deref().expect("a grammar");
    for t in good {
        assert!(accepts(g, t), "grammar rejects {t:?}\n{g}");
    }
    for t in bad {
        assert!(!accepts(g, t), "grammar accepts {t:?}\n{g}");
    }
}

const SEED: u64 = 42;

fn parse_with(
    format: Format,
    text: &str,
    reasoning: ReasoningFormat,
    forced_open: bool,
) -> ParsedMessage {
    let fin = format.parse(text, reasoning, forced_open, true, SEED);
    check_streaming(format, text, reasoning, forced_open, &fin);
    fin
}

fn parse(format: Format, text: &str) -> ParsedMessage {
    parse_with(format, text, ReasoningFormat::Auto, false)
}

/// Every streamed prefix reports only what the final parse keeps: its content a
/// prefix of the final content (so no partial marker or partial call shows up), its
/// reasoning a prefix of the final reasoning, its calls the final calls' first ones.
fn check_streaming(
    format: Format,
    text: &str,
    reasoning: ReasoningFormat,
    forced_open: bool,
    fin: &ParsedMessage,
) {
    for (i, _) in text.char_indices().chain([(text.len(), ' ')]) {
        let prefix = &text[..i];
        let m = format.parse(prefix, reasoning, forced_open, false, SEED);
        assert!(
            fin.content.starts_with(&m.content),
            "{format:?}: streamed content {:?} of {prefix:?} is not a prefix of {:?}",
            m.content,
            fin.content
        );
        assert!(
            fin.reasoning_content
                .starts_with(m.reasoning_content.trim_end()),
            "{format:?}: streamed reasoning {:?} of {prefix:?} is not a prefix of {:?}",
            m.reasoning_content,
            fin.reasoning_content
        );
        assert!(
            m.tool_calls.len() <= fin.tool_calls.len()
                && fin.tool_calls[..m.tool_calls.len()] == m.tool_calls[..],
            "{format:?}: streamed calls {:?} of {prefix:?} are not among {:?}",
            m.tool_calls,
            fin.tool_calls
        );
    }
}

fn call(name: &str, args: &str, id: &str) -> ToolCall {
    ToolCall {
        id: id.to_string(),
        name: name.to_string(),
        arguments: args.to_string(),
    }
}

/// A call with a generated id (`call_id(SEED, index)`).
fn gen_call(name: &str, args: &str, index: usize) -> ToolCall {
    call(name, args, &lamina_chat::call_id(SEED, index))
}

fn names(m: &ParsedMessage) -> Vec<&str> {
    m.tool_calls.iter().map(|c| c.name.as_str()).collect()
}

const HELLO: &str = "Hello, world!\nWhat's up?";

// ------------------------------------------------------------------------------------
// Detection over all templates
// ------------------------------------------------------------------------------------

#[test]
fn detects_each_family_from_its_template() {
    use Format::*;
    let table = [
        ("meta-llama-Llama-3.1-8B-Instruct.jinja", Llama3),
        ("meta-llama-Llama-3.2-3B-Instruct.jinja", Llama3),
        ("meta-llama-Llama-3.3-70B-Instruct.jinja", Llama3),
        ("mistralai-Mistral-Nemo-Instruct-2407.jinja", MistralNemo),
        ("Mistral-Small-3.2-24B-Instruct-2506.jinja", MistralArgs),
        ("unsloth-mistral-Devstral-Small-2507.jinja", MistralArgs),
        (
            "mistralai-Ministral-3-14B-Reasoning-2512.jinja",
            MistralArgs,
        ),
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", DeepSeekR1),
        ("llama-cpp-deepseek-r1.jinja", DeepSeekR1),
        ("deepseek-ai-DeepSeek-V3.1.jinja", DeepSeekV31),
        (
            "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
            CommandR7B,
        ),
        ("Cohere2MoE.jinja", CommandR7B),
        (
            "CohereForAI-c4ai-command-r-plus-tool_use.jinja",
            CommandRPlus,
        ),
        ("ibm-granite-granite-3.3-2B-Instruct.jinja", Granite),
        ("ibm-granite-granite-4.0.jinja", Hermes),
        ("openai-gpt-oss-120b.jinja", GptOss),
        ("meetkai-functionary-medium-v3.1.jinja", FunctionaryV31),
        ("meetkai-functionary-medium-v3.2.jinja", FunctionaryV32),
        (
            "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
            Hermes,
        ),
        ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", Hermes),
        ("Qwen-Qwen2.5-7B-Instruct.jinja", Hermes),
        ("Qwen-Qwen3-0.6B.jinja", Hermes),
        ("google-gemma-2-2b-it.jinja", Generic),
        ("microsoft-Phi-3.5-mini-instruct.jinja", Generic),
    ];
    for (name, want) in table {
        assert_detects(name, want);
    }
}

#[test]
fn every_template_detects_and_plans() {
    let dir = format!("{}/../../../shared/templates", env!("CARGO_MANIFEST_DIR"));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipping: {dir} is absent");
        return;
    };
    let t = tools("auto", true);
    for e in entries.flatten() {
        let Ok(src) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let f = Format::detect(&src);
        eprintln!("{:?} -> {f:?}", e.file_name());
        let p = plan(f, &t);
        if let Some(g) = &p.grammar {
            matcher(g);
        }
    }
}

// ------------------------------------------------------------------------------------
// Generic
// ------------------------------------------------------------------------------------

#[test]
fn generic_parses_and_constrains() {
    let f = Format::Generic;
    let m = parse(
        f,
        r#"{"tool_call": {"name": "special_function", "arguments": {"arg1": 1}}}"#,
    );
    assert_eq!(
        m.tool_calls,
        vec![gen_call("special_function", r#"{"arg1":1}"#, 0)]
    );
    let m = parse(f, r#"{"response": "Hello, world!\nWhat's up?"}"#);
    assert_eq!(m.content, HELLO);
    assert!(m.tool_calls.is_empty());

    let p = plan(f, &tools("required", false));
    assert!(!p.is_lazy());
    assert!(p.system.is_some());
    check_grammar(
        &p,
        &[r#"{"tool_call": {"name": "special_function", "arguments": {"arg1": 1}}}"#],
        &[
            r#"{"tool_call": {"name": "other_function", "arguments": {"arg1": 1}}}"#,
            r#"{"response": "hi"}"#,
        ],
    );
    let p = plan(f, &tools("auto", false));
    check_grammar(&p, &[r#"{"response": "hi"}"#], &[]);
}

// ------------------------------------------------------------------------------------
// Hermes
// ------------------------------------------------------------------------------------

#[test]
fn hermes_parses_and_constrains() {
    let f = Format::Hermes;
    let m = parse(
        f,
        "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
    );
    assert_eq!(
        m.tool_calls,
        vec![gen_call("special_function", r#"{"arg1":1}"#, 0)]
    );
    assert_eq!(m.content, "");
    let m = parse(
        f,
        "<think>I'm\nthinking</think>Hello, world!\nWhat's up?\n<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
    );
    assert_eq!(m.reasoning_content, "I'm\nthinking");
    assert_eq!(m.content, HELLO);
    assert_eq!(names(&m), ["special_function"]);
    assert_eq!(parse(f, HELLO).content, HELLO);

    let p = plan(f, &tools("auto", false));
    assert_eq!(p.triggers, ["<tool_call>"]);
    check_grammar(
        &p,
        &[
            "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
        ],
        &["<tool_call>\n{\"name\": \"other\", \"arguments\": {\"arg1\": 1}}\n</tool_call>"],
    );
}

// ------------------------------------------------------------------------------------
// Llama 3.x
// ------------------------------------------------------------------------------------

#[test]
fn llama3_parses_calls() {
    let f = Format::Llama3;
    assert_eq!(parse(f, HELLO).content, HELLO);
    let want = vec![gen_call("special_function", r#"{"arg1":1}"#, 0)];
    let m = parse(
        f,
        r#"{"name": "special_function", "parameters": {"arg1": 1}}"#,
    );
    assert_eq!(m.tool_calls, want);
    assert_eq!(m.content, "");
    let m = parse(
        f,
        r#"<|python_tag|>{"name": "special_function", "parameters": {"arg1": 1}}"#,
    );
    assert_eq!(m.tool_calls, want);
    let m = parse(
        f,
        r#"{"type": "function", "name": "special_function", "parameters": {"arg1": 1}}"#,
    );
    assert_eq!(m.tool_calls, want);
    // Builtin tools (llama.cpp's test vectors).
    let m = parse(
        f,
        "<|python_tag|>brave_search.call(query=\"what is the weather today?\")",
    );
    assert_eq!(
        m.tool_calls,
        vec![gen_call(
            "brave_search",
            r#"{"query":"what is the weather today?"}"#,
            0
        )]
    );
    let m = parse(
        f,
        "<|python_tag|>code_interpreter.call(code=\"print('hey')\")",
    );
    assert_eq!(names(&m), ["code_interpreter"]);
    assert_eq!(m.tool_calls[0].arguments, r#"{"code":"print('hey')"}"#);
    // Parallel, separated by `;`.
    let m = parse(
        f,
        r#"{"name": "special_function", "parameters": {"arg1": 1}}; {"name": "special_function_with_opt", "parameters": {"arg1": 1, "arg2": 2}}"#,
    );
    assert_eq!(names(&m), ["special_function", "special_function_with_opt"]);
    // JSON that is not a call is content.
    let m = parse(f, r#"{"answer": 42}"#);
    assert_eq!(m.content, r#"{"answer": 42}"#);
    assert!(m.tool_calls.is_empty());
    // Prose before a tagged call.
    let m = parse(
        f,
        "Let me check.<|python_tag|>{\"name\": \"special_function\", \"parameters\": {\"arg1\": 1}}",
    );
    assert_eq!(m.content, "Let me check.");
    assert_eq!(m.tool_calls, want);
}

#[test]
fn llama3_streaming_holds_back() {
    let f = Format::Llama3;
    let s = |t: &str| f.parse(t, ReasoningFormat::Auto, false, false, SEED);
    assert_eq!(s("<|python").content, "");
    assert_eq!(s("{\"name\": \"special_fu").content, "");
    assert!(
        s("{\"name\": \"special_function\", \"parameters\": {\"arg1\": 1")
            .tool_calls
            .is_empty()
    );
    assert_eq!(
        s("{\"name\": \"special_function\", \"parameters\": {\"arg1\": 1}}")
            .tool_calls
            .len(),
        1
    );
}

#[test]
fn llama3_grammar() {
    let f = Format::Llama3;
    let p = plan(f, &tools("auto", false));
    assert!(p.triggers.contains(&"<|python_tag|>".to_string()));
    assert!(p.triggers.contains(&"^{\"name\"".to_string()));
    check_grammar(
        &p,
        &[
            r#"{"name": "special_function", "parameters": {"arg1": 1}}"#,
            r#"<|python_tag|>{"name": "special_function", "parameters": {"arg1": 1}}"#,
            r#"{"type": "function", "name": "special_function_with_opt", "parameters": {"arg1": 1, "arg2": 2}}"#,
        ],
        &[
            r#"{"name": "other_function", "parameters": {"arg1": 1}}"#,
            r#"{"name": "special_function", "parameters": {"arg1": "x"}}"#,
            r#"{"name": "special_function", "parameters": {"arg1": 1}}; {"name": "special_function", "parameters": {"arg1": 1}}"#,
        ],
    );
    let p = plan(f, &tools("required", true));
    assert!(!p.is_lazy());
    check_grammar(
        &p,
        &[
            r#"{"name": "special_function", "parameters": {"arg1": 1}}; {"name": "special_function", "parameters": {"arg1": 2}}"#,
        ],
        &["Hello"],
    );
}

// ------------------------------------------------------------------------------------
// Mistral
// ------------------------------------------------------------------------------------

#[test]
fn mistral_nemo_parses_and_constrains() {
    let f = Format::MistralNemo;
    assert_eq!(parse(f, HELLO).content, HELLO);
    let m = parse(
        f,
        r#"[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]"#,
    );
    assert_eq!(
        m.tool_calls,
        vec![call("special_function", r#"{"arg1":1}"#, "123456789")]
    );
    // Without an id, one of 9 alphanumeric characters, as the template requires.
    let m = parse(
        f,
        r#"Sure.[TOOL_CALLS][{"name": "special_function", "arguments": "{\"arg1\": 1}"}]"#,
    );
    assert_eq!(m.content, "Sure.");
    assert_eq!(m.tool_calls[0].arguments, r#"{"arg1": 1}"#);
    let id = &m.tool_calls[0].id;
    assert!(
        id.len() == 9 && id.chars().all(|c| c.is_ascii_alphanumeric()),
        "{id}"
    );

    let s = f.parse("Hi [TOOL_CA", ReasoningFormat::Auto, false, false, SEED);
    assert_eq!(s.content, "Hi");

    let p = plan(f, &tools("auto", false));
    assert_eq!(p.triggers, ["[TOOL_CALLS]"]);
    check_grammar(
        &p,
        &[
            r#"[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]"#,
        ],
        &[
            r#"[TOOL_CALLS][{"name": "nope", "arguments": {"arg1": 1}, "id": "123456789"}]"#,
            r#"[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "12"}]"#,
            r#"[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}, {"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]"#,
        ],
    );
    let p = plan(f, &tools("required", true));
    check_grammar(
        &p,
        &[
            r#"[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}, {"name": "special_function_with_opt", "arguments": {"arg1": 1}, "id": "abcdefghi"}]"#,
        ],
        &[HELLO],
    );
}

#[test]
fn mistral_args_parses_calls() {
    let f = Format::MistralArgs;
    assert_eq!(parse(f, HELLO).content, HELLO);
    // Small 3.2 (llama.cpp's vectors).
    let m = parse(
        f,
        r#"[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}"#,
    );
    assert_eq!(
        m.tool_calls,
        vec![call("special_function", r#"{"arg1":1}"#, "123456789")]
    );
    let m = parse(
        f,
        concat!(
            r#"[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}"#,
            r#"[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}"#
        ),
    );
    assert_eq!(
        m.tool_calls,
        vec![
            call("special_function", r#"{"arg1":1}"#, "000000001"),
            call(
                "special_function_with_opt",
                r#"{"arg1":1,"arg2":2}"#,
                "000000002"
            ),
        ]
    );
    // Devstral.
    let m = parse(
        f,
        r#"Hello, world!
What's up?[TOOL_CALLS]special_function[ARGS]{"arg1": 1}"#,
    );
    assert_eq!(m.content, HELLO);
    assert_eq!(names(&m), ["special_function"]);
    assert_eq!(m.tool_calls[0].id.len(), 9);
    // Ministral 3 / Magistral reasoning.
    let m = parse(
        f,
        r#"[THINK]I'm
thinking[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1": 1}"#,
    );
    assert_eq!(m.reasoning_content, "I'm\nthinking");
    assert_eq!(names(&m), ["special_function"]);
    let m = parse_with(f, "[THINK]hm[/THINK]Hello", ReasoningFormat::None, false);
    assert_eq!(m.content, "[THINK]hm[/THINK]Hello");
}

#[test]
fn mistral_args_grammar() {
    let f = Format::MistralArgs;
    let p = plan(f, &tools("auto", false));
    assert_eq!(p.triggers, ["[TOOL_CALLS]"]);
    check_grammar(
        &p,
        &[
            r#"[TOOL_CALLS]special_function[ARGS]{"arg1": 1}"#,
            r#"[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}"#,
        ],
        &[
            r#"[TOOL_CALLS]other_function[ARGS]{"arg1": 1}"#,
            r#"[TOOL_CALLS]special_function[ARGS]{"arg1": 1}[TOOL_CALLS]special_function[ARGS]{"arg1": 1}"#,
        ],
    );
    let p = plan(f, &tools("required", true));
    assert!(!p.is_lazy());
    check_grammar(
        &p,
        &[
            r#"[TOOL_CALLS]special_function[ARGS]{"arg1": 1}[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}"#,
            r#"[THINK]Let me think.[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1": 1}"#,
        ],
        &[HELLO],
    );
    // A named function: only that one.
    let t = Tools::from_request(
        Some(&json!([special_function(), special_function_with_opt()])),
        Some(&json!({"type": "function", "function": {"name": "special_function_with_opt"}})),
        None,
    )
    .unwrap()
    .unwrap();
    let p = plan(f, &t);
    check_grammar(
        &p,
        &[r#"[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1}"#],
        &[r#"[TOOL_CALLS]special_function[ARGS]{"arg1": 1}"#],
    );
}

// ------------------------------------------------------------------------------------
// DeepSeek
// ------------------------------------------------------------------------------------

const R1_CALL: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

#[test]
fn deepseek_r1_parses_calls() {
    let f = Format::DeepSeekR1;
    let m = parse(f, R1_CALL);
    assert_eq!(
        m.tool_calls,
        vec![gen_call("special_function", r#"{"arg1":1}"#, 0)]
    );
    assert_eq!(m.content, "");
    // Reasoning, forced open by the prompt (`<think>\n`), then prose and calls as the
    // template renders them.
    let text = "I'm\nthinking</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function_with_opt\n```json\n{\"arg1\": 1, \"arg2\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let m = parse_with(f, text, ReasoningFormat::Deepseek, true);
    assert_eq!(m.reasoning_content, "I'm\nthinking");
    assert_eq!(m.content, "Sure.");
    assert_eq!(names(&m), ["special_function", "special_function_with_opt"]);
    assert_eq!(m.tool_calls[1].arguments, r#"{"arg1":1,"arg2":2}"#);
    let m = parse_with(
        f,
        "I'm\nthinking</think>Hello, world!\nWhat's up?",
        ReasoningFormat::Deepseek,
        true,
    );
    assert_eq!(
        (m.reasoning_content.as_str(), m.content.as_str()),
        ("I'm\nthinking", HELLO)
    );
    // A variant opening tag of the distills.
    let m = parse(
        f,
        "<｜tool calls begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    );
    assert_eq!(names(&m), ["special_function"]);
}

#[test]
fn deepseek_r1_grammar() {
    let f = Format::DeepSeekR1;
    let p = plan(f, &tools("auto", false));
    assert!(p.triggers.contains(&"<｜tool▁calls▁begin｜>".to_string()));
    check_grammar(
        &p,
        &[
            R1_CALL,
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ],
        &[&R1_CALL.replace("special_function", "other_function")],
    );
    let p = plan(f, &tools("required", true));
    check_grammar(
        &p,
        &[
            R1_CALL,
            &format!("Okay, let me think.\n</think>\n\n{R1_CALL}"),
            &format!("<think>\nhm\n</think>\n\n{R1_CALL}"),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n```json\n{\"arg1\": 1}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function_with_opt\n```json\n{\"arg1\": 1, \"arg2\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ],
        &[HELLO, "</think> x </think>"],
    );
}

const V31_CALL: &str = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"XYZCITY\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";

fn get_time_tools(choice: &str, parallel: bool) -> Tools {
    let tool = |name: &str| {
        json!({"type": "function", "function": {"name": name, "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    };
    tools_with(
        vec![tool("get_time"), tool("get_weather")],
        choice,
        parallel,
    )
}

#[test]
fn deepseek_v3_1_parses_and_constrains() {
    let f = Format::DeepSeekV31;
    let m = parse(f, V31_CALL);
    assert_eq!(
        m.tool_calls,
        vec![gen_call("get_time", r#"{"city":"XYZCITY"}"#, 0)]
    );
    let m = parse_with(
        f,
        "REASONING</think>CONTENT<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ReasoningFormat::Deepseek,
        true,
    );
    assert_eq!(m.reasoning_content, "REASONING");
    assert_eq!(m.content, "CONTENT");
    assert_eq!(
        m.tool_calls,
        vec![
            gen_call("get_time", r#"{"city":"Paris"}"#, 0),
            gen_call("get_weather", r#"{"city":"Paris"}"#, 1)
        ]
    );
    let m = parse_with(
        f,
        "REASONING</think>\nCONTENT",
        ReasoningFormat::Deepseek,
        true,
    );
    assert_eq!(
        (m.reasoning_content.as_str(), m.content.as_str()),
        ("REASONING", "CONTENT")
    );

    let p = plan(f, &get_time_tools("auto", false));
    check_grammar(
        &p,
        &[V31_CALL],
        &[&V31_CALL.replace("get_time", "get_date")],
    );
    let p = plan(f, &get_time_tools("required", true));
    check_grammar(
        &p,
        &[
            &format!("REASONING</think>{V31_CALL}"),
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Paris\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        ],
        &["CONTENT"],
    );
}

// ------------------------------------------------------------------------------------
// gpt-oss
// ------------------------------------------------------------------------------------

#[test]
fn gpt_oss_parses_channels() {
    let f = Format::GptOss;
    let auto = ReasoningFormat::Auto;
    assert_eq!(
        parse(f, "<|channel|>final<|message|>Hello, world!\nWhat's up?").content,
        HELLO
    );
    assert_eq!(
        parse(
            f,
            "<|channel|>commentary<|message|>Hello, world!\nWhat's up?"
        )
        .content,
        HELLO
    );
    let text = "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>Hello, world!\nWhat's up?";
    let m = parse(f, text);
    assert_eq!(
        (m.reasoning_content.as_str(), m.content.as_str()),
        ("I'm\nthinking", HELLO)
    );
    let m = parse_with(f, text, ReasoningFormat::None, false);
    assert_eq!(m.reasoning_content, "");
    assert_eq!(
        m.content,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|>Hello, world!\nWhat's up?"
    );
    let m = f.parse(
        "<|channel|>analysis<|message|>I'm\nthinking",
        auto,
        false,
        false,
        SEED,
    );
    assert_eq!(m.reasoning_content, "I'm\nthinking");
    let m = f.parse(
        "<|channel|>analysis<|message|>I'm\nthinking<|en",
        auto,
        false,
        false,
        SEED,
    );
    assert_eq!(m.reasoning_content, "I'm\nthinking");
}

#[test]
fn gpt_oss_parses_calls() {
    let f = Format::GptOss;
    let want = vec![gen_call("special_function", r#"{"arg1":1}"#, 0)];
    for text in [
        " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
        "<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}",
        " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}",
        "<|channel|>commentary to=functions.special_function<|message|>{\"arg1\": 1}",
        "<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{\"arg1\": 1}<|call|>",
        " to=functions.special_function<|channel|>commentary json<|message|>{\"arg1\": 1}<|call|>",
    ] {
        let m = parse(f, text);
        assert_eq!(m.tool_calls, want, "{text}");
        assert_eq!(m.content, "", "{text}");
    }
    let m = parse(
        f,
        "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}",
    );
    assert_eq!(m.reasoning_content, "I'm\nthinking");
    assert_eq!(m.tool_calls, want);
    let m = parse(
        f,
        "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary to=functions.edit <|constrain|>json<|message|>{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", \"replaceAll\": false}",
    );
    assert_eq!(m.reasoning_content, "Thinking about edit...");
    assert_eq!(
        m.tool_calls,
        vec![gen_call(
            "edit",
            r#"{"oldString":"if (part < railCount - 1) {","newString":"if (part < 4) {","replaceAll":false}"#,
            0
        )]
    );
    // Builtin recipients are dropped.
    let m = parse(
        f,
        "<|channel|>analysis<|message|>I will execute python to say hello<|end|><|start|>assistant to=container.exec<|channel|>commentary<|message|>python3 -c 'print(\"hello\")'",
    );
    assert_eq!(m.reasoning_content, "I will execute python to say hello");
    assert_eq!(m.content, "");
    assert!(m.tool_calls.is_empty());
}

#[test]
fn gpt_oss_grammar() {
    let f = Format::GptOss;
    let p = plan(f, &tools("auto", false));
    assert_eq!(p.triggers, [" to=functions."]);
    check_grammar(
        &p,
        &[
            " to=functions.special_function<|channel|>commentary json<|message|>{\"arg1\": 1}",
            " to=functions.special_function <|constrain|>json<|message|>{\"arg1\": 1}",
            " to=functions.special_function<|message|>{\"arg1\": 1}",
        ],
        &[" to=functions.other<|channel|>commentary json<|message|>{\"arg1\": 1}"],
    );
    let p = plan(f, &tools("required", false));
    assert!(!p.is_lazy());
    check_grammar(
        &p,
        &[
            " to=functions.special_function<|channel|>commentary json<|message|>{\"arg1\": 1}",
            "<|channel|>analysis<|message|>Let me think <|channel|> about it.<|end|><|start|>assistant<|channel|>commentary to=functions.special_function <|constrain|>json<|message|>{\"arg1\": 1}",
        ],
        &[
            "<|channel|>final<|message|>Hello",
            "<|channel|>analysis<|message|>hm<|end|><|start|>assistant<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{\"arg1\": 1}",
        ],
    );
}

// ------------------------------------------------------------------------------------
// Command R7B / R+
// ------------------------------------------------------------------------------------

#[test]
fn command_r7b_parses_and_constrains() {
    let f = Format::CommandR7B;
    let m = parse(
        f,
        "<|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>",
    );
    assert_eq!(m.content, HELLO);
    let text = "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}}\n]<|END_ACTION|>";
    let m = parse_with(f, text, ReasoningFormat::Deepseek, false);
    assert_eq!(m.reasoning_content, "I'm\nthinking");
    assert_eq!(m.content, "");
    assert_eq!(
        m.tool_calls,
        vec![call("special_function", r#"{"arg1":1}"#, "0")]
    );
    let m = parse(
        f,
        "<|START_THINKING|><|END_THINKING|><|START_RESPONSE|>Hello, world!\nWhat's up?<|END_RESPONSE|>",
    );
    assert_eq!(
        (m.reasoning_content.as_str(), m.content.as_str()),
        ("", HELLO)
    );
    let s = f.parse(
        "<|START_RESPONSE|>Hi<|END_RES",
        ReasoningFormat::Auto,
        false,
        false,
        SEED,
    );
    assert_eq!(s.content, "Hi");

    let p = plan(f, &tools("auto", true));
    assert_eq!(p.triggers, ["<|START_ACTION|>"]);
    check_grammar(
        &p,
        &[
            "<|START_ACTION|>[\n    {\"tool_call_id\": \"0\", \"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}},\n    {\"tool_call_id\": \"1\", \"tool_name\": \"special_function_with_opt\", \"parameters\": {\"arg1\": 1}}\n]<|END_ACTION|>",
        ],
        &[
            "<|START_ACTION|>[{\"tool_call_id\": \"0\", \"tool_name\": \"nope\", \"parameters\": {\"arg1\": 1}}]<|END_ACTION|>",
        ],
    );
    let p = plan(f, &tools("required", false));
    check_grammar(&p, &[text], &[HELLO]);
}

#[test]
fn command_r_plus_parses_and_constrains() {
    let f = Format::CommandRPlus;
    assert_eq!(parse(f, HELLO).content, HELLO);
    let text = "Action:\n```json\n[{\"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}}]\n```";
    let m = parse(f, text);
    assert_eq!(
        m.tool_calls,
        vec![gen_call("special_function", r#"{"arg1":1}"#, 0)]
    );
    // As the template renders calls.
    let m = parse(
        f,
        "I will look it up.\nAction:\n```json\n[\n    {\n        \"tool_name\": \"special_function\",\n        \"parameters\": {\n            \"arg1\": 1\n        }\n    },\n    {\n        \"tool_name\": \"directly-answer\",\n        \"parameters\": {}\n    }\n]```\n",
    );
    assert_eq!(m.content, "I will look it up.");
    assert_eq!(names(&m), ["special_function"]);

    let p = plan(f, &tools("auto", true));
    assert_eq!(p.triggers, ["Action:"]);
    check_grammar(
        &p,
        &[
            text,
            "Action:\n```json\n[{\"tool_name\": \"directly-answer\", \"parameters\": {}}]\n```",
        ],
        &["Action:\n```json\n[{\"tool_name\": \"nope\", \"parameters\": {\"arg1\": 1}}]\n```"],
    );
    let p = plan(f, &tools("required", false));
    check_grammar(
        &p,
        &[text],
        &["Action:\n```json\n[{\"tool_name\": \"directly-answer\", \"parameters\": {}}]\n```"],
    );
}

// ------------------------------------------------------------------------------------
// Granite
// ------------------------------------------------------------------------------------

#[test]
fn granite_parses_and_constrains() {
    let f = Format::Granite;
    assert_eq!(parse(f, HELLO).content, HELLO);
    let m = parse(f, "<think>I'm\nthinking</think>Hello, world!\nWhat's up?");
    assert_eq!(
        (m.reasoning_content.as_str(), m.content.as_str()),
        ("I'm\nthinking", HELLO)
    );
    let m = parse(
        f,
        "<think>I'm\nthinking</think><response>Hello, world!\nWhat's up?</response>",
    );
    assert_eq!(
        (m.reasoning_content.as_str(), m.content.as_str()),
        ("I'm\nthinking", HELLO)
    );
    let text = "<|tool_call|>[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]";
    let m = parse(f, text);
    assert_eq!(
        m.tool_calls,
        vec![gen_call("special_function", r#"{"arg1":1}"#, 0)]
    );
    assert_eq!(m.content, "");

    let p = plan(f, &tools("auto", false));
    assert_eq!(p.triggers, ["<|tool_call|>"]);
    check_grammar(
        &p,
        &[text],
        &["<|tool_call|>[{\"name\": \"nope\", \"arguments\": {\"arg1\": 1}}]"],
    );
    let p = plan(f, &tools("required", true));
    check_grammar(
        &p,
        &[
            &format!("<think>hm</think>{text}"),
            "<|tool_call|>[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}, {\"name\": \"special_function_with_opt\", \"arguments\": {\"arg1\": 1, \"arg2\": 2}}]",
        ],
        &[HELLO],
    );
}

// ------------------------------------------------------------------------------------
// Functionary
// ------------------------------------------------------------------------------------

#[test]
fn functionary_v3_1_parses_and_constrains() {
    let f = Format::FunctionaryV31;
    assert_eq!(parse(f, HELLO).content, HELLO);
    let text = "<function=special_function>{\"arg1\": 1}</function>";
    let m = parse(f, text);
    assert_eq!(
        m.tool_calls,
        vec![gen_call("special_function", r#"{"arg1":1}"#, 0)]
    );
    let m = parse(
        f,
        "Sure.<function=special_function>{\"arg1\": 1}</function>\n<function=special_function_with_opt>{\"arg1\": 1, \"arg2\": 2}</function>",
    );
    assert_eq!(m.content, "Sure.");
    assert_eq!(names(&m), ["special_function", "special_function_with_opt"]);
    let m = parse(f, "<|python_tag|>print('hey')");
    assert_eq!(
        m.tool_calls,
        vec![gen_call("python", r#"{"code":"print('hey')"}"#, 0)]
    );

    let p = plan(f, &tools("auto", false));
    assert_eq!(p.triggers, ["<function="]);
    check_grammar(
        &p,
        &[text],
        &[
            "<function=nope>{\"arg1\": 1}</function>",
            &format!("{text}{text}"),
        ],
    );
    let p = plan(
        f,
        &tools_with(vec![special_function(), python_tool()], "required", true),
    );
    check_grammar(
        &p,
        &[
            &format!("{text}{text}"),
            "<|python_tag|>print('hey')\nprint(1)",
        ],
        &[HELLO],
    );
}

#[test]
fn functionary_v3_2_parses_and_constrains() {
    let f = Format::FunctionaryV32;
    assert_eq!(parse(f, "all\nHello, world!\nWhat's up?").content, HELLO);
    let m = parse(f, "special_function\n{\"arg1\": 1}");
    assert_eq!(
        m.tool_calls,
        vec![gen_call("special_function", r#"{"arg1":1}"#, 0)]
    );
    assert_eq!(m.content, "");
    let m = parse(
        f,
        "all\nLet me call them.>>>special_function\n{\"arg1\": 1}\n>>>special_function_with_opt\n{\"arg1\": 1, \"arg2\": 2}",
    );
    assert_eq!(m.content, "Let me call them.");
    assert_eq!(names(&m), ["special_function", "special_function_with_opt"]);
    let m = parse(f, "python\nprint('hey')");
    assert_eq!(
        m.tool_calls,
        vec![gen_call("python", r#"{"code":"print('hey')"}"#, 0)]
    );
    let s = f.parse("all\nHi>>", ReasoningFormat::Auto, false, false, SEED);
    assert_eq!(s.content, "Hi");

    let p = plan(f, &tools("auto", true));
    assert!(p.triggers.contains(&"^special_function\n".to_string()));
    assert!(p.triggers.contains(&">>>special_function\n".to_string()));
    check_grammar(
        &p,
        &[
            "special_function\n{\"arg1\": 1}",
            "special_function\n{\"arg1\": 1}\n>>>special_function_with_opt\n{\"arg1\": 1, \"arg2\": 2}",
        ],
        &["nope\n{\"arg1\": 1}"],
    );
    let p = plan(f, &tools("required", false));
    check_grammar(
        &p,
        &["special_function_with_opt\n{\"arg1\": 1}"],
        &[
            "all\nHello",
            "special_function\n{\"arg1\": 1}>>>special_function\n{\"arg1\": 1}",
        ],
    );
}

#[test]
fn no_grammar_for_tool_choice_none() {
    let t = tools("none", false);
    for f in [
        Format::Llama3,
        Format::MistralArgs,
        Format::GptOss,
        Format::DeepSeekR1,
    ] {
        assert_eq!(plan(f, &t), Plan::default());
    }
}
