//! Fuzzes chat templates (programs from model files): arbitrary template text compiles or
//! fails with a typed error, and renders a conversation or fails with one, within the
//! sandbox's limits (instructions, output size, recursion). Seed it with
//! `../shared/templates`.

#![no_main]

use lamina_tokenizer::{ChatMessage, ChatTemplate, TemplateLimits};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let limits = TemplateLimits {
        max_output: 1 << 20,
        fuel: 1_000_000,
        max_recursion: 50,
    };
    let Ok(t) = ChatTemplate::with_limits(source, "<s>", "</s>", limits) else {
        return;
    };
    let messages = [
        ChatMessage::new("system", "S"),
        ChatMessage::new("user", "Hello"),
        ChatMessage::new("assistant", "Hi"),
        ChatMessage::new("user", "Again"),
    ];
    let tools = serde_json::json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    if let Ok(out) = t.render(&messages, Some(&tools), true) {
        assert!(out.len() <= 1 << 20);
    }
});
