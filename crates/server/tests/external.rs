//! Checks with outside clients: the chat page in headless Chromium (driven over the
//! DevTools protocol), the official `openai` Python package, and a short loopback load
//! test. The first two skip with a message when their tool is missing, unless
//! LAMINA_REQUIRE_CHROMIUM / LAMINA_REQUIRE_OPENAI is set (CI installs both and sets them).

#[path = "common/browser.rs"]
mod browser;
mod common;

use std::process::Command;
use std::time::Duration;

use browser::{Browser, required};
use common::*;
use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use lamina_server::testing;
use serde_json::json;

/// The chat page at `/` asks the server and streams its answer into the page. More of
/// the page is checked in web_ui.rs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_page_streams_a_reply_in_headless_chromium() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let addr = start_default().await;
    // What the model answers, asked directly.
    let expect = post(
        addr,
        "/v1/chat/completions",
        json!({"messages": user("hello"), "temperature": 0, "max_tokens": 40}),
    )
    .await
    .json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(!expect.is_empty());

    let url = format!("http://{addr}/?autotest=hello&temperature=0&max_tokens=40");
    browser
        .check(async {
            let mut page = browser.page().await?;
            // The page sends the prompt itself once loaded (?autotest).
            page.navigate(&url).await?;
            let state = page.turn_end().await?;
            let seen = page
                .eval(
                    "(() => { const q = (s) => document.querySelector(s); \
                     return { user: q('.msg.user .bubble').textContent, \
                              reply: q('.msg.assistant .md.content').textContent, \
                              chunks: Number(q('.msg.assistant').dataset.chunks) }; })()",
                )
                .await?;
            assert_eq!(state, "done", "{seen}");
            assert_eq!(seen["user"], "hello");
            assert_eq!(seen["reply"], expect.as_str());
            // The answer arrived in several chunks.
            let chunks = seen["chunks"].as_u64().unwrap_or(0);
            assert!(chunks > 1, "the reply came in {chunks} chunk(s)");
            Ok(())
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_openai_package_against_the_server() {
    let has_openai = Command::new("python3")
        .args(["-c", "import openai"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_openai {
        assert!(
            !required("LAMINA_REQUIRE_OPENAI"),
            "the openai package is required but missing"
        );
        eprintln!("SKIPPED: python3 with the openai package not available (pip install openai)");
        return;
    }
    let config = ServerConfig {
        api_keys: vec!["test-key".into()],
        ..ServerConfig::default()
    };
    let addr = start(4096, 2, config).await;
    let chat_prompt_tokens =
        chat_prompt(&[("system", "You are terse."), ("user", "Say something.")]);
    let (chat, _, _) = reference(&chat_prompt_tokens, &greedy(), Some(32), 2048, None);
    let (completion, _, _) = reference(
        &text_prompt("Once upon a time"),
        &greedy(),
        Some(32),
        2048,
        None,
    );
    let expected =
        json!({"chat": chat, "completion": completion, "lenient_tools": true}).to_string();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/openai_client.py");
    let base = format!("http://{addr}/v1");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args([script, &base, &expected])
            .output()
    })
    .await
    .unwrap()
    .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The CI version of the load test: 16 clients for a few seconds (bounded request
/// count), zero failures, no timing thresholds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_load_test_has_no_failures() {
    let secs = std::env::var("LAMINA_LOAD_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let engine = FakeEngine::new(4 * 4096, 4);
    let stats = engine.stats();
    let config = ServerConfig {
        queue_size: 16,
        metrics_endpoint: true,
        ..ServerConfig::default()
    };
    let addr = lamina_server::spawn_local(Box::new(engine), config)
        .await
        .unwrap();
    let report = testing::run_load(addr, 16, Duration::from_secs(secs), 20_000, 32).await;
    assert_eq!(report.failures, 0, "{:?}", report.failure_samples);
    assert!(report.requests > 0);
    assert!(report.completion_tokens > 0);
    assert!(
        stats
            .max_seqs_per_batch
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 1
    );
    // Everything finished: no slot is left busy, nothing waits.
    let metrics = get(addr, "/metrics").await.text();
    assert!(
        metrics.contains("llamacpp:requests_processing 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("llamacpp:requests_deferred 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("llamacpp:requests_rejected_total 0"),
        "{metrics}"
    );
}
