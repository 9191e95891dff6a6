//! Every chat template in `../shared/templates/` renders a system/user/assistant conversation
//! with and without the generation prompt, and with tool definitions where the template uses
//! them. Hostile templates hit the sandbox's limits with typed errors.

use std::path::PathBuf;

use lamina_tokenizer::{ChatMessage, ChatTemplate, TemplateError, TemplateLimits};

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "What is the capital of France?"),
        ChatMessage::new("assistant", "The capital of France is Paris."),
        ChatMessage::new("user", "And of Italy?"),
    ]
}

fn tools() -> serde_json::Value {
    serde_json::json!([{
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "The city"}},
                "required": ["city"]
            }
        }
    }])
}

#[test]
fn every_shared_template_renders() {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/templates"
    ));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        eprintln!("skipping: {} is absent", dir.display());
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jinja"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty());
    let msgs = conversation();
    let tools = tools();
    let mut failures = Vec::new();
    for path in &paths {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let src = std::fs::read_to_string(path).unwrap();
        let t = match ChatTemplate::new(&src, "<s>", "</s>") {
            Ok(t) => t,
            Err(e) => {
                failures.push(format!("{name}: {e}"));
                continue;
            }
        };
        let run = |tools: Option<&serde_json::Value>, prompt: bool| {
            t.render(&msgs, tools, prompt)
                .map_err(|e| format!("{name} (tools: {}, prompt: {prompt}): {e}", tools.is_some()))
        };
        let (without, with) = match (run(None, false), run(None, true)) {
            (Ok(a), Ok(b)) => (a, b),
            (a, b) => {
                failures.extend(a.err());
                failures.extend(b.err());
                continue;
            }
        };
        if !(without.contains("Paris") && with.contains("Italy")) {
            failures.push(format!("{name}: conversation text missing from output"));
        }
        if with.len() < without.len() {
            failures.push(format!("{name}: generation prompt made the output shorter"));
        }
        if src.contains("tools") {
            match run(Some(&tools), true) {
                Ok(out) if !out.contains("get_weather") => {
                    failures.push(format!("{name}: tool definition missing from output"))
                }
                Ok(_) => {}
                Err(e) => failures.push(e),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} templates failed:\n{}",
        failures.len(),
        paths.len(),
        failures.join("\n")
    );
}

fn limited() -> TemplateLimits {
    TemplateLimits {
        max_output: 64 << 10,
        fuel: 200_000,
        max_recursion: 50,
    }
}

#[test]
fn hostile_recursion_is_stopped() {
    let src = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}";
    let t = ChatTemplate::with_limits(src, "", "", limited()).unwrap();
    let e = t.render(&conversation(), None, false).unwrap_err();
    assert!(
        matches!(e, TemplateError::Render(ref m) if m.contains("recursion")),
        "{e}"
    );
}

#[test]
fn hostile_loop_runs_out_of_fuel() {
    let src = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let t = ChatTemplate::with_limits(src, "", "", limited()).unwrap();
    assert!(matches!(
        t.render(&conversation(), None, false),
        Err(TemplateError::OutOfFuel)
    ));
}

#[test]
fn hostile_output_is_capped() {
    let src = "{% for i in range(10000) %}{{ 'x' * 1000 }}{% endfor %}";
    let t = ChatTemplate::with_limits(
        src,
        "",
        "",
        TemplateLimits {
            fuel: 10_000_000,
            ..limited()
        },
    )
    .unwrap();
    assert!(matches!(
        t.render(&conversation(), None, false),
        Err(TemplateError::OutputTooLarge(_))
    ));
}

#[test]
fn no_file_or_environment_access() {
    for src in [
        "{% include '/etc/passwd' %}",
        "{% import '/etc/passwd' as x %}",
        "{% extends '/etc/hostname' %}",
    ] {
        let t = ChatTemplate::with_limits(src, "", "", limited()).unwrap();
        assert!(
            matches!(
                t.render(&conversation(), None, false),
                Err(TemplateError::Render(_))
            ),
            "{src}"
        );
    }
    // Nothing in the context or globals exposes the process environment.
    let t = ChatTemplate::new("{{ env }}{{ environ }}{{ os }}", "", "").unwrap();
    assert_eq!(t.render(&conversation(), None, false).unwrap(), "");
}

#[test]
fn raise_exception_is_typed() {
    let t = ChatTemplate::new("{{ raise_exception('bad role') }}", "", "").unwrap();
    assert!(
        matches!(t.render(&conversation(), None, false), Err(TemplateError::Raised(m)) if m == "bad role")
    );
}

#[test]
fn hostile_string_repeat_is_refused() {
    let t = ChatTemplate::with_limits("{{ 'x' * 100000000000 }}", "", "", limited()).unwrap();
    assert!(t.render(&conversation(), None, false).is_err());
}

#[test]
fn tokenizer_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<lamina_tokenizer::Tokenizer>();
    assert_send_sync::<ChatTemplate>();
}

#[test]
fn extra_context_reaches_the_template() {
    let path = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/templates/Qwen-Qwen3-0.6B.jinja"
    ));
    let Ok(src) = std::fs::read_to_string(&path) else {
        eprintln!("skipping: {} is absent", path.display());
        return;
    };
    let t = ChatTemplate::new(&src, "", "<|im_end|>").unwrap();
    let msgs = [ChatMessage::new("user", "Hi")];
    let mut extra = serde_json::Map::new();
    extra.insert("enable_thinking".into(), serde_json::Value::Bool(false));
    let out = t.render_with(&msgs, None, true, &extra).unwrap();
    assert!(
        out.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"),
        "{out:?}"
    );
    let out = t.render(&msgs, None, true).unwrap();
    assert!(out.ends_with("<|im_start|>assistant\n"), "{out:?}");
}
