//! A template that stores a namespace inside itself (`{% set ns.x = [ns] %}`, or the typo
//! `{% set ns.text = ns,text ~ … %}` that the `chat_template` fuzzer found) used to make every
//! later print, concatenation or comparison of the namespace recurse until the stack
//! overflowed, aborting the process. The assignment is now refused with a typed error.

use lamina_tokenizer::{ChatMessage, ChatTemplate, TemplateError};

fn render(source: &str) -> Result<String, TemplateError> {
    let t = ChatTemplate::new(source, "<s>", "</s>")?;
    t.render(&[ChatMessage::new("user", "Hi")], None, true)
}

fn assert_cycle_refused(source: &str) {
    match render(source) {
        Err(TemplateError::Render(msg)) => assert!(msg.contains("cycle"), "{source}: {msg}"),
        other => panic!("{source}: expected the cycle to be refused, got {other:?}"),
    }
}

#[test]
fn a_namespace_cannot_hold_itself() {
    assert_cycle_refused("{% set ns = namespace(a=1) %}{% set ns.b = ns %}{{ ns }}");
    assert_cycle_refused("{% set ns = namespace(a=1) %}{% set ns.b = [1, ns] %}{{ ns.b }}");
    assert_cycle_refused(
        "{%- set ns = namespace(t='') -%}{%- set ns.t = ns,'x' ~ 'y' -%}{{ ns.t ~ 'z' }}",
    );
    assert_cycle_refused("{% set ns = namespace() %}{% set ns.m = {'k': [ns]} %}{{ ns == ns.m }}");
    // Through a second namespace.
    assert_cycle_refused(
        "{% set a = namespace() %}{% set b = namespace(x=1) %}{% set b.x = [a] %}\
         {% set a.y = b %}{{ a }}",
    );
}

#[test]
fn the_fuzzer_case_is_an_error_not_an_abort() {
    let source = include_str!("data/fuzz-namespace-cycle.jinja");
    // The probe render at construction may already fail; either way no abort.
    if let Ok(t) = ChatTemplate::new(source, "<s>", "</s>") {
        let tools = serde_json::json!([{"type": "function", "function": {"name": "f"}}]);
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ];
        let _ = t.render(&msgs, Some(&tools), true);
    }
}

#[test]
fn ordinary_namespace_assignments_still_work() {
    let out = render(
        "{%- set ns = namespace(out='', items=[]) -%}\
         {%- for m in messages -%}{%- set ns.out = ns.out ~ m.content -%}\
         {%- set ns.items = ns.items + [m] -%}{%- endfor -%}\
         {%- set ns.n = ns.items | length -%}{{ ns.out }}/{{ ns.n }}\
         {%- if ns.n == 1 %} one{% endif %}{% raw %}{% set ns.x = ns %}{% endraw %}\
         {{ '{% set ns.y = ns %}' }}",
    )
    .unwrap();
    assert_eq!(out, "Hi/1 one{% set ns.x = ns %}{% set ns.y = ns %}");
}
