//! Checks with outside clients: the chat page in headless Chromium, the official
//! `openai` Python package, and a short loopback load test. The first two skip with a
//! message when their tool is missing, unless LAMINA_REQUIRE_CHROMIUM /
//! LAMINA_REQUIRE_OPENAI is set (CI installs both and sets them).

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use lamina_server::testing;
use serde_json::json;

fn required(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Escapes text the way Chromium serializes it into the DOM.
fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_page_streams_a_reply_in_headless_chromium() {
    let chromium = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists());
    let Some(chromium) = chromium else {
        assert!(
            !required("LAMINA_REQUIRE_CHROMIUM"),
            "chromium is required but missing"
        );
        eprintln!("SKIPPED: chromium not installed (apt-get install -y chromium)");
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

    let profile = tempfile::tempdir().unwrap();
    let url = format!("http://{addr}/?autotest=hello&temperature=0&max_tokens=40");
    let args = vec![
        "--headless".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-dev-shm-usage".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--no-first-run".into(),
        format!("--user-data-dir={}", profile.path().display()),
        "--virtual-time-budget=20000".into(),
        "--dump-dom".into(),
        url,
    ];
    let chromium = chromium.to_string();
    let out = tokio::task::spawn_blocking(move || Command::new(chromium).args(args).output())
        .await
        .unwrap()
        .expect("chromium runs");
    let dom = String::from_utf8_lossy(&out.stdout);
    assert!(
        dom.contains("data-state=\"done\""),
        "the page did not finish: {dom}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The user's message and the streamed answer, which arrived in several chunks.
    assert!(dom.contains("<div class=\"msg user\">hello</div>"), "{dom}");
    let reply = format!(">{}</div>", html_escape(&expect));
    assert!(dom.contains(&reply), "expected {reply:?} in {dom}");
    let chunks: usize = dom
        .split("data-chunks=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .and_then(|n| n.parse().ok())
        .expect("chunk count");
    assert!(chunks > 1, "the reply came in {chunks} chunk(s)");
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
        api_key: Some("test-key".into()),
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
    let expected = json!({"chat": chat, "completion": completion}).to_string();
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
        metrics.contains("lamina:requests_processing 0"),
        "{metrics}"
    );
    assert!(metrics.contains("lamina:requests_deferred 0"), "{metrics}");
    assert!(
        metrics.contains("lamina:requests_rejected_total 0"),
        "{metrics}"
    );
}
