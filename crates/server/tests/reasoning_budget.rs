//! llama-server's reasoning budget (`--reasoning-budget`, `reasoning_budget_tokens`) on the
//! fake model under a template whose generation prompt opens `<think>` (QwQ's): after the
//! budget's tokens the end tag, after the message if one is given, is forced, and the block
//! is then over. As in llama.cpp, the generation prompt's tokens after the start tag (QwQ's
//! line break) go through the budget too: they count as reasoning, and while forcing they
//! take the place of the forced sequence's first tokens (so a budget of 0 loses the `<` of
//! `</think>` here, as llama-server's does). crates/cli/tests/cli.rs checks all this against
//! llama-server itself.

mod common;

use common::post;
use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use serde_json::{Value, json};

const QWQ: &str = include_str!("../../cli/tests/data/qwq-32b.jinja");

async fn start(config: ServerConfig) -> std::net::SocketAddr {
    let engine = FakeEngine::new(4096, 1).with_chat_template(QWQ).unwrap();
    lamina_server::spawn_local(Box::new(engine), config)
        .await
        .expect("server starts")
}

/// The raw answer (`reasoning_format: none`) to one question with `extra` fields.
async fn raw_answer(addr: std::net::SocketAddr, extra: Value) -> String {
    let mut body = json!({"messages": [{"role": "user", "content": "Think."}], "max_tokens": 40,
                          "temperature": 0, "reasoning_format": "none", "ignore_eos": true});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let v = post(addr, "/v1/chat/completions", body).await.json();
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

#[tokio::test]
async fn the_budget_forces_the_end_tag() {
    let addr = start(ServerConfig::default()).await;
    // The prompt opened the block: the raw answer starts with it, as llama-server's does.
    let free = raw_answer(addr, json!({})).await;
    assert!(free.starts_with("<think>\n"), "{free:?}");
    let none = raw_answer(addr, json!({"reasoning_budget_tokens": 0})).await;
    assert!(none.starts_with("<think>\n/think>"), "{none:?}");
    let three = raw_answer(
        addr,
        json!({"reasoning_budget_tokens": 3, "reasoning_budget_message": " Enough."}),
    )
    .await;
    let thought = &three["<think>\n".len()..three.find(" Enough.</think>").expect(&three)];
    // The line break and two tokens (bytes, for the fake), or a few more to finish a
    // character.
    assert!((2..=4).contains(&thought.len()), "{three:?}");
    assert_eq!(
        &free[..2 + "<think>\n".len()],
        &three[..2 + "<think>\n".len()]
    );
    // Unlimited: the same as no budget.
    let unlimited = raw_answer(addr, json!({"reasoning_budget_tokens": -1})).await;
    assert_eq!(unlimited, free);
    let r = post(
        addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "x"}], "reasoning_budget_tokens": -5}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

#[tokio::test]
async fn the_server_budget_is_the_default_and_a_request_wins() {
    let mut config = ServerConfig::default();
    config
        .default_params
        .insert("reasoning_budget_tokens".into(), json!(0));
    let addr = start(config).await;
    let forced = raw_answer(addr, json!({})).await;
    assert!(forced.starts_with("<think>\n/think>"), "{forced:?}");
    // -1 in a request means "the server's": still forced.
    let again = raw_answer(addr, json!({"reasoning_budget_tokens": -1})).await;
    assert_eq!(again, forced);
    let own = raw_answer(addr, json!({"reasoning_budget_tokens": 2})).await;
    assert!(!own.starts_with("<think>\n/think>"), "{own:?}");
    // The extracted reasoning keeps the tag's line break, as llama-server's parser does.
    let v = post(
        addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Think."}], "max_tokens": 40,
               "temperature": 0, "ignore_eos": true, "reasoning_budget_tokens": 2}),
    )
    .await
    .json();
    let reasoning = v["choices"][0]["message"]["reasoning_content"]
        .as_str()
        .unwrap();
    assert!(reasoning.starts_with('\n'), "{v}");
    assert_eq!(
        &own["<think>".len()..own.find("</think>").unwrap()],
        reasoning
    );
}
