//! llama.cpp's legacy chat templates (`src/llama-chat.cpp`).
//!
//! `data/chat_legacy_cases.json` is the table of llama.cpp's `tests/test-chat-template.cpp`
//! (0c1e570): each entry's Jinja source, the legacy expectation it checks against
//! `llama_chat_apply_template` (`expected_output`; `expected_output_jinja` is the Jinja path's and
//! is not used here) and any extra messages. `legacy` names the template llama.cpp detects.
//!
//! `data/chat_legacy_golden.json` was produced by compiling llama-chat.cpp unchanged with a
//! small driver: `llm_chat_apply_template` for every template over a set of conversations
//! (odd roles, C whitespace, non-ASCII, embedded NULs, empty), `llm_chat_detect_template` for
//! marker strings that walk every detection branch, and `llama_chat_builtin_templates`.

use lamina_tokenizer::chat_legacy::{LegacyTemplate, LegacyTemplateError, apply_template};
use serde_json::Value;

fn load(name: &str) -> Value {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn text(v: &Value) -> &str {
    v.as_str().expect("a string")
}

fn pairs(v: &Value) -> Vec<(&str, &str)> {
    v.as_array()
        .expect("an array of messages")
        .iter()
        .map(|m| (text(&m[0]), text(&m[1])))
        .collect()
}

/// `test-chat-template.cpp`'s conversation.
const CONVERSATION: [(&str, &str); 6] = [
    ("system", "You are a helpful assistant"),
    ("user", "Hello"),
    ("assistant", "Hi there"),
    ("user", "Who are you"),
    ("assistant", "   I am an assistant   "),
    ("user", "Another question"),
];

/// By name, including Dots1, which has no built-in name.
fn by_name(name: &str) -> LegacyTemplate {
    LegacyTemplate::all()
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("no template {name}"))
}

#[test]
fn llama_cpp_test_table() {
    let cases = load("chat_legacy_cases.json");
    let cases = cases.as_array().expect("an array of cases");
    assert_eq!(cases.len(), 36, "test-chat-template.cpp has 36 entries");
    for case in cases {
        let name = text(&case["name"]);
        let source = text(&case["template"]);
        let expected_template = LegacyTemplate::from_name(text(&case["legacy"]));
        assert!(expected_template.is_some(), "{name}: bad legacy name");
        assert_eq!(
            LegacyTemplate::resolve(source),
            expected_template,
            "{name}: detection"
        );
        let mut conv = CONVERSATION.to_vec();
        if let Some(extra) = case.get("extra_conversation") {
            conv.extend(pairs(extra));
        }
        // The C++ test always asks for the generation prompt.
        let out = apply_template(source, &conv, true);
        assert_eq!(
            out.as_deref(),
            Ok(text(&case["expected"])),
            "{name}: output"
        );
    }
}

#[test]
fn invalid_template_is_unsupported() {
    // test-chat-template.cpp: llama_chat_apply_template("INVALID TEMPLATE", ...) < 0.
    assert_eq!(LegacyTemplate::detect("INVALID TEMPLATE"), None);
    assert_eq!(LegacyTemplate::resolve("INVALID TEMPLATE"), None);
    assert_eq!(
        apply_template("INVALID TEMPLATE", &CONVERSATION, true),
        Err(LegacyTemplateError::Unsupported)
    );
    for source in [
        "",
        " ",
        "{{ messages }}",
        "ChatML",
        " chatml",
        "dots1",
        "unknown",
    ] {
        assert_eq!(LegacyTemplate::resolve(source), None, "{source:?}");
    }
}

#[test]
fn from_name_every_builtin() {
    let golden = load("chat_legacy_golden.json");
    let builtin: Vec<&str> = golden["builtin_names"]
        .as_array()
        .expect("names")
        .iter()
        .map(text)
        .collect();
    // Same names, in llama_chat_builtin_templates' order.
    assert_eq!(LegacyTemplate::names().collect::<Vec<_>>(), builtin);
    assert_eq!(builtin.len(), 54);
    for name in &builtin {
        let t = LegacyTemplate::from_name(name);
        assert_eq!(t.map(LegacyTemplate::name), Some(*name), "{name}");
        // llm_chat_detect_template tries the name first.
        assert_eq!(LegacyTemplate::resolve(name), t, "{name}");
    }
    assert_eq!(LegacyTemplate::all().count(), 55);
    for t in LegacyTemplate::all() {
        if t == LegacyTemplate::Dots1 {
            assert_eq!(LegacyTemplate::from_name(t.name()), None);
        } else {
            assert_eq!(LegacyTemplate::from_name(t.name()), Some(t));
        }
    }
    assert_eq!(
        LegacyTemplate::from_name("gpt-oss"),
        Some(LegacyTemplate::OpenAiMoe)
    );
    assert_eq!(LegacyTemplate::from_name("CHATML"), None);
    assert_eq!(LegacyTemplate::from_name("chatml\n"), None);
}

#[test]
fn golden_outputs_match_llama_cpp() {
    let golden = load("chat_legacy_golden.json");
    let conversations: Vec<Vec<(&str, &str)>> = golden["conversations"]
        .as_array()
        .expect("conversations")
        .iter()
        .map(pairs)
        .collect();
    let outputs = golden["outputs"].as_array().expect("outputs");
    // Every template, every conversation, with and without the generation prompt.
    assert_eq!(outputs.len(), 55 * conversations.len() * 2);
    for record in outputs {
        let name = text(&record[0]);
        let conv = record[1].as_u64().expect("index") as usize;
        let add = record[2].as_bool().expect("bool");
        let out = by_name(name).apply(&conversations[conv], add);
        assert_eq!(
            out.as_deref(),
            Ok(text(&record[3])),
            "{name}, conversation {conv}, add_assistant {add}"
        );
    }
}

#[test]
fn golden_detection_matches_llama_cpp() {
    let golden = load("chat_legacy_golden.json");
    for record in golden["detect"].as_array().expect("detect") {
        let source = text(&record[0]);
        let name = text(&record[1]);
        let expected = (name != "unknown").then(|| by_name(name));
        assert_eq!(LegacyTemplate::resolve(source), expected, "{source:?}");
        // Without the name lookup, detection alone agrees unless the source is a name.
        if LegacyTemplate::from_name(source).is_none() {
            assert_eq!(LegacyTemplate::detect(source), expected, "{source:?}");
        }
    }
}

#[test]
fn detect_is_markers_only() {
    assert_eq!(LegacyTemplate::detect("chatml"), None);
    assert_eq!(
        LegacyTemplate::resolve("chatml"),
        Some(LegacyTemplate::ChatMl)
    );
    // A source that starts with "mistral" is a Llama 2 family template.
    assert_eq!(
        LegacyTemplate::detect("mistral-v9"),
        Some(LegacyTemplate::Llama2)
    );
    assert_eq!(
        LegacyTemplate::detect("{% for m in messages %}{{ m.content }}{% endfor %}"),
        None
    );
}

#[test]
fn inputs_end_at_nul_like_c_strings() {
    assert_eq!(
        LegacyTemplate::resolve("chatml\0<start_of_turn>"),
        Some(LegacyTemplate::ChatMl)
    );
    assert_eq!(LegacyTemplate::resolve("junk\0<|im_start|>"), None);
    let out = LegacyTemplate::ChatMl.apply(&[("user\0x", "a\0b")], false);
    assert_eq!(out.as_deref(), Ok("<|im_start|>user\na<|im_end|>\n"));
}

#[test]
fn apply_template_matches_apply() {
    for name in LegacyTemplate::names() {
        let t = LegacyTemplate::from_name(name).expect("built-in");
        for add in [false, true] {
            assert_eq!(
                apply_template(name, &CONVERSATION, add),
                t.apply(&CONVERSATION, add),
                "{name}"
            );
        }
    }
}

/// A tiny deterministic generator, so the hostile inputs are reproducible.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as usize
    }
}

const PIECES: [&str; 24] = [
    "",
    "system",
    "user",
    "assistant",
    "tool",
    "function",
    "assistant_tool_call",
    " ",
    "\t\n\x0b\x0c\r",
    "\0",
    "é",
    "日本",
    "ü",
    "\u{10ffff}",
    "<|im_start|>",
    "[INST]",
    "<<SYS>>",
    "content.strip()",
    "<start_of_turn>",
    "<｜Assistant｜>",
    "<|start_of_role|>",
    "<tools>",
    "mistral",
    "x",
];

fn random_text(rng: &mut Lcg) -> String {
    let n = rng.next() % 6;
    (0..n).map(|_| PIECES[rng.next() % PIECES.len()]).collect()
}

#[test]
fn hostile_input_never_panics() {
    let huge = "x ".repeat(2 << 20);
    let many: Vec<(&str, &str)> = (0..10_000)
        .map(|i| (PIECES[i % PIECES.len()], PIECES[(i * 7) % PIECES.len()]))
        .collect();
    for t in LegacyTemplate::all() {
        for add in [false, true] {
            assert!(t.apply(&[], add).is_ok(), "{t:?} empty");
            let odd = [
                ("", ""),
                ("ünknown", " \u{0} "),
                ("SYSTEM", "\x0b"),
                ("é", "日本"),
                ("system", ""),
            ];
            assert!(t.apply(&odd, add).is_ok(), "{t:?} odd roles");
            let out = t
                .apply(
                    &[("system", &huge), ("user", &huge), ("assistant", &huge)],
                    add,
                )
                .expect("huge content");
            assert!(out.len() <= 3 * huge.len() + 4096, "{t:?}");
            assert!(t.apply(&many, add).is_ok(), "{t:?} many messages");
        }
    }
    let mut rng = Lcg(0x5eed);
    for _ in 0..2000 {
        let source = random_text(&mut rng);
        let _ = LegacyTemplate::resolve(&source);
        let msgs: Vec<(String, String)> = (0..rng.next() % 5)
            .map(|_| (random_text(&mut rng), random_text(&mut rng)))
            .collect();
        let msgs: Vec<(&str, &str)> = msgs.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
        for t in LegacyTemplate::all() {
            let out = t
                .apply(&msgs, rng.next().is_multiple_of(2))
                .expect("small output");
            assert!(!out.contains('\0'), "{t:?}: NUL passed through");
        }
    }
}
