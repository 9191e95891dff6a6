//! The chat page at `/` in headless Chromium, driven over the DevTools protocol against
//! servers on the fake engine: streaming, Stop, settings, Markdown, history, branches,
//! the API key prompt, router mode, accessibility and phone width. Every wait polls the
//! page (or the server) until a condition holds; the limits only fail a test that hangs.
//!
//! Skipped with a message when Chromium is missing, unless LAMINA_REQUIRE_CHROMIUM=1.
//! LAMINA_UI_SCREENSHOTS=1 also writes /tmp/lamina-ui-desktop.png (1280x800),
//! /tmp/lamina-ui-desktop-dark.png, /tmp/lamina-ui-settings-dark.png and
//! /tmp/lamina-ui-phone.png (375x740).

#[path = "common/browser.rs"]
mod browser;
mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use browser::{Browser, Page, required};
use common::*;
use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use lamina_server::model_router::{self, Loader, ModelEntry, RouterConfig, Scan};
use serde_json::{Value, json};

const QWQ: &str = include_str!("../../cli/tests/data/qwq-32b.jinja");

/// A reply asked for directly: (content, reasoning, completion tokens).
async fn direct_reply(addr: SocketAddr, body: Value) -> (String, String, u64) {
    let v = post(addr, "/v1/chat/completions", body).await.json();
    let message = &v["choices"][0]["message"];
    let content = message["content"].as_str().unwrap_or_else(|| panic!("{v}"));
    let reasoning = message["reasoning_content"].as_str().unwrap_or_default();
    let tokens = v["usage"]["completion_tokens"].as_u64().expect("usage");
    (content.to_string(), reasoning.to_string(), tokens)
}

/// Types `text` into the message box and presses Enter.
async fn send(page: &mut Page, text: &str) -> anyhow::Result<()> {
    page.fill("#input", text).await?;
    page.press("Enter", false).await
}

/// Waits until the page has finished `n` replies in all; returns how the last ended.
async fn wait_turns(page: &mut Page, n: u32) -> anyhow::Result<String> {
    page.wait_for(
        &format!("Number(document.body.dataset.turns || 0) >= {n}"),
        &format!("reply {n} to end"),
    )
    .await?;
    let state = page.eval("document.body.dataset.state").await?;
    Ok(state.as_str().unwrap_or_default().to_string())
}

/// The open conversation's displayed messages (root to the selected leaf).
async fn messages(page: &mut Page) -> anyhow::Result<Vec<Value>> {
    let v = page.eval("lamina.path()").await?;
    Ok(v.as_array().cloned().unwrap_or_default())
}

/// The sidebar's conversation titles, top first.
async fn titles(page: &mut Page) -> anyhow::Result<Value> {
    page.eval("[...document.querySelectorAll('#conversations .title')].map((b) => b.textContent)")
        .await
}

/// Focuses the control whose `<label>` says `label`, empties it and types `text`.
async fn fill_labelled(page: &mut Page, label: &str, text: &str) -> anyhow::Result<()> {
    let id = page
        .eval(&format!(
            "[...document.querySelectorAll('label')].find((l) => l.textContent === {})?.control?.id",
            json!(label)
        ))
        .await?;
    let id = id
        .as_str()
        .with_context(|| format!("no control labelled {label}"))?;
    page.fill(&format!("#{id}"), text).await
}

/// The value of the control labelled `label`.
async fn labelled_value(page: &mut Page, label: &str) -> anyhow::Result<Value> {
    page.eval(&format!(
        "[...document.querySelectorAll('label')].find((l) => l.textContent === {})?.control?.value",
        json!(label)
    ))
    .await
}

/// Polls `/metrics` until `holds` accepts it (a cancelled request is freed within a
/// decode step or two; the limit only fails a server that never frees it).
async fn wait_metrics(addr: SocketAddr, holds: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = get(addr, "/metrics").await.text();
        if holds(&metrics) {
            return Ok(metrics);
        }
        ensure!(
            Instant::now() < deadline,
            "the metrics never got there:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn metric(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("llamacpp:{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

/// Adds conversations to the page through its import (the same code as the Import
/// button's), opens the first and returns its id.
async fn import(page: &mut Page, conversations: Value) -> anyhow::Result<String> {
    let text = json!({"format": "lamina-chat", "version": 1, "conversations": conversations});
    let added = page
        .eval(&format!("lamina.importJson({})", json!(text.to_string())))
        .await?;
    ensure!(added.as_u64() >= Some(1), "nothing imported: {added}");
    let first = conversations[0]["id"].as_str().context("an id")?;
    page.eval(&format!("openConversation({})", json!(first)))
        .await?;
    Ok(first.to_string())
}

/// A conversation that uses most of what the renderer knows, with lines wider than a
/// phone, and a reply in two versions.
fn showcase() -> Value {
    let reply = "Use `BufReader::lines`, which yields each line without its newline:\n\n\
        ```rust\nuse std::fs::File;\nuse std::io::{self, BufRead, BufReader};\n\n\
        fn main() -> io::Result<()> {\n    let file = File::open(\"notes.txt\")?; // opened once\n    \
        for (n, line) in BufReader::new(file).lines().enumerate() {\n        \
        println!(\"{:>4}: {}\", n + 1, line?);\n    }\n    Ok(())\n}\n```\n\n\
        ### Things to know\n\n\
        - **Errors**: each `line` is an `io::Result<String>`, so bad UTF-8 stops you *there*.\n\
        - **Speed**: the reader buffers 8 KiB at a time.\n  - Raise it with `BufReader::with_capacity`.\n\
        - See the [std::io docs](https://doc.rust-lang.org/std/io/trait.BufRead.html).\n\n\
        | Method | Allocates per line | Keeps the newline |\n\
        |:--|:-:|--:|\n\
        | `lines()` | yes | no |\n\
        | `read_line(&mut buf)` | no (reuses `buf`) | yes |\n\n\
        > Tip: for huge files, `read_line` into one `String` avoids an allocation per line.";
    json!([
        {
            "id": "showcase",
            "title": "Read a file line by line in Rust",
            "updated": 1_700_000_300_000u64,
            // A tree: two versions of the reply, the first one shown.
            "leaf": "a",
            "messages": [
                {"id": "u", "parent": null, "role": "user", "content": "How do I read a file line by line in Rust?"},
                {"id": "a", "parent": "u", "role": "assistant", "content": reply,
                 "reasoning": "The user wants idiomatic Rust. BufRead::lines is the usual answer; \
                               mention the allocation per line and read_line as the alternative."},
                {"id": "a0", "parent": "u", "role": "assistant", "content": "Use `BufRead::lines`."},
            ],
        },
        {"id": "older-1", "title": "Explain KV cache quantization", "updated": 1_700_000_200_000u64,
         "messages": [{"role": "user", "content": "Explain KV cache quantization"},
                      {"role": "assistant", "content": "It stores keys and values in fewer bits."}]},
        {"id": "older-2", "title": "A haiku about borrow checking", "updated": 1_700_000_100_000u64,
         "messages": [{"role": "user", "content": "A haiku about borrow checking"},
                      {"role": "assistant", "content": "One owner, many\nreaders, or a single pen —\nthe compiler nods."}]},
    ])
}

fn chat_url(addr: SocketAddr, query: &str) -> String {
    format!("http://{addr}/{query}")
}

/// Sends with Enter (Shift+Enter makes a new line), streams the reply in several
/// chunks, and shows its token count, speeds and the context used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enter_sends_and_the_reply_streams_with_its_figures() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let addr = start_default().await;
    let text = "first line\nsecond line";
    let (expect, _, tokens) = direct_reply(
        addr,
        json!({"messages": user(text), "temperature": 0, "max_tokens": 40}),
    )
    .await;
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&chat_url(addr, "?temperature=0&max_tokens=40"))
                .await?;
            // The model's name and context size, from /props.
            let ctx = page
                .eval("document.getElementById('ctx').textContent")
                .await?;
            assert_eq!(ctx, "2048 ctx");
            page.fill("#input", "first line").await?;
            page.press("Enter", true).await?;
            page.type_text("second line").await?;
            assert_eq!(
                page.eval("document.getElementById('input').value").await?,
                json!(text)
            );
            assert_eq!(page.eval("lamina.conversations().length").await?, json!(0));
            page.press("Enter", false).await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");

            let m = messages(&mut page).await?;
            assert_eq!(m.len(), 2, "{m:?}");
            assert_eq!(m[0]["role"], "user");
            assert_eq!(m[0]["content"], text);
            assert_eq!(m[1]["content"], expect.as_str());
            let stats = &m[1]["stats"];
            assert_eq!(stats["predicted_n"].as_u64(), Some(tokens), "{stats}");
            assert!(stats["predicted_per_second"].as_f64().is_some(), "{stats}");
            assert!(stats["prompt_per_second"].as_f64().is_some(), "{stats}");
            let total = stats["total_tokens"].as_u64().context("total_tokens")?;

            let seen = page
                .eval(
                    "(() => { const q = (s) => document.querySelector(s); return { \
                     user: q('.msg.user .bubble').textContent, \
                     reply: q('.msg.assistant .md.content').textContent, \
                     chunks: Number(q('.msg.assistant').dataset.chunks), \
                     stats: q('.msg.assistant .stats').textContent, \
                     ctx: q('#ctx').textContent, input: q('#input').value, \
                     send: !q('#send').hidden, stop: !q('#stop').hidden }; })()",
                )
                .await?;
            assert_eq!(seen["user"], text);
            assert_eq!(seen["reply"], expect.trim());
            let chunks = seen["chunks"].as_u64().unwrap_or(0);
            assert!(chunks > 1, "the reply came in {chunks} chunk(s)");
            let shown = seen["stats"].as_str().unwrap_or_default();
            assert!(
                shown.starts_with(&format!("{tokens} tokens · prompt ")),
                "{shown}"
            );
            assert!(shown.contains(" t/s · generation "), "{shown}");
            assert!(
                shown.ends_with(&format!(" t/s · context {total} / 2048")),
                "{shown}"
            );
            assert_eq!(seen["ctx"], format!("{total} / 2048 ctx"));
            assert_eq!(seen["input"], "");
            assert_eq!(
                (seen["send"].clone(), seen["stop"].clone()),
                (json!(true), json!(false))
            );
            Ok(())
        })
        .await;
}

/// Stop (the button, then Escape) aborts the fetch and the server cancels the request:
/// the slot is freed long before the reply could have ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_escape_cancel_the_request_on_the_server() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    // 20 ms a token: a whole reply (up to the 2048-token context) would take 40 s.
    let engine =
        FakeEngine::new(4096, 2).with_decode_cost(Duration::from_millis(20), Duration::ZERO);
    let mut config = ServerConfig {
        metrics_endpoint: true,
        ..ServerConfig::default()
    };
    // No early end of generation (the fake's end tokens banned): the reply runs until
    // stopped or the context is full. (`ignore_eos` is not taken from the defaults.)
    config.default_params.insert(
        "logit_bias".into(),
        json!([
            [lamina_server::fake::EOS, false],
            [lamina_server::fake::IM_END, false]
        ]),
    );
    let addr = lamina_server::spawn_local(Box::new(engine), config)
        .await
        .unwrap();
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&chat_url(addr, "")).await?;
            send(&mut page, "hello").await?;
            page.wait_for(
                "lamina.current()?.messages[1]?.chunks > 2",
                "the reply to stream",
            )
            .await?;
            let controls = page.accessible_controls().await?;
            assert!(
                controls.contains(&("button".into(), "Stop".into())),
                "{controls:?}"
            );
            assert!(
                !controls.iter().any(|(_, name)| name == "Send"),
                "{controls:?}"
            );
            page.click("#stop").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "stopped");
            let metrics = wait_metrics(addr, |m| {
                metric(m, "requests_cancelled_total") == 1.0
                    && metric(m, "requests_processing") == 0.0
            })
            .await?;
            let m = messages(&mut page).await?;
            assert_eq!(m[1]["stopped"], true);
            let partial = m[1]["content"].as_str().unwrap_or_default();
            assert!(!partial.is_empty());
            let stats = page
                .eval("document.querySelector('.msg.assistant .stats').textContent")
                .await?;
            assert_eq!(stats, "stopped");
            // Far fewer tokens than a whole reply: it really stopped.
            assert!(
                metric(&metrics, "tokens_predicted_total") < 1000.0,
                "{metrics}"
            );

            send(&mut page, "again").await?;
            page.wait_for(
                "lamina.current()?.messages[3]?.chunks > 2",
                "the second reply to stream",
            )
            .await?;
            page.press("Escape", false).await?;
            assert_eq!(wait_turns(&mut page, 2).await?, "stopped");
            wait_metrics(addr, |m| {
                metric(m, "requests_cancelled_total") == 2.0
                    && metric(m, "requests_processing") == 0.0
            })
            .await?;
            let slots = get(addr, "/slots").await.json();
            assert!(
                slots
                    .as_array()
                    .is_some_and(|s| s.iter().all(|s| s["is_processing"] == false)),
                "{slots}"
            );
            Ok(())
        })
        .await;
}

/// The Settings dialog's values are remembered and sent: the reply is the one the API
/// gives for the same system prompt and sampling fields (3 tokens, seeded sampling).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_are_remembered_and_sent_with_each_request() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let addr = start_default().await;
    let sampling = |system: bool, seed: u32| {
        let mut messages = vec![json!({"role": "user", "content": "hi"})];
        if system {
            messages.insert(0, json!({"role": "system", "content": "You are terse."}));
        }
        json!({
            "messages": messages, "temperature": 0.9, "top_p": 0.95, "top_k": 20, "min_p": 0.05,
            "repeat_penalty": 1.1, "seed": seed, "max_tokens": 3,
        })
    };
    let (expect, _, tokens) = direct_reply(addr, sampling(true, 42)).await;
    assert_eq!(tokens, 3);
    // Without the system prompt, or with another seed, the answer differs: matching it
    // shows both reached the server.
    assert_ne!(direct_reply(addr, sampling(false, 42)).await.0, expect);
    assert_ne!(direct_reply(addr, sampling(true, 7)).await.0, expect);
    let fields = [
        ("System prompt", "You are terse."),
        ("Temperature", "0.9"),
        ("Top P", "0.95"),
        ("Top K", "20"),
        ("Min P", "0.05"),
        ("Max tokens", "3"),
        ("Repeat penalty", "1.1"),
        ("Seed", "42"),
    ];
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&chat_url(addr, "")).await?;
            page.click("#settings-button").await?;
            page.wait_for(
                "document.getElementById('settings').open",
                "Settings to open",
            )
            .await?;
            let controls = page.accessible_controls().await?;
            for (label, value) in fields {
                assert!(
                    controls.iter().any(|(_, name)| name == label),
                    "no control named {label}: {controls:?}"
                );
                fill_labelled(&mut page, label, value).await?;
            }
            // Enter in a field saves, as the dialog's first button does.
            page.press("Enter", false).await?;
            page.wait_for(
                "!document.getElementById('settings').open",
                "Settings to close",
            )
            .await?;
            // Saved by the dialog's close event, which follows its closing.
            let saved = page
                .wait_for(
                    "JSON.parse(localStorage.getItem('lamina.settings'))",
                    "the settings to be saved",
                )
                .await?;
            assert_eq!(
                saved,
                json!({"system": "You are terse.", "temperature": 0.9, "top_p": 0.95, "top_k": 20,
                       "min_p": 0.05, "max_tokens": 3, "repeat_penalty": 1.1, "seed": 42})
            );

            send(&mut page, "hi").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            let m = messages(&mut page).await?;
            assert_eq!(m[1]["content"], expect.as_str());
            assert_eq!(m[1]["stats"]["predicted_n"], 3);
            let shown = page
                .eval("document.querySelector('.msg.assistant .stats').textContent")
                .await?;
            assert!(
                shown
                    .as_str()
                    .unwrap_or_default()
                    .starts_with("3 tokens · "),
                "{shown}"
            );

            // Remembered across a reload; Escape closes the dialog without saving.
            page.open_chat(&chat_url(addr, "")).await?;
            page.click("#settings-button").await?;
            page.wait_for(
                "document.getElementById('settings').open",
                "Settings to reopen",
            )
            .await?;
            for (label, value) in fields {
                assert_eq!(
                    labelled_value(&mut page, label).await?,
                    json!(value),
                    "{label}"
                );
            }
            fill_labelled(&mut page, "Temperature", "2").await?;
            page.press("Escape", false).await?;
            page.wait_for(
                "!document.getElementById('settings').open",
                "Escape to close Settings",
            )
            .await?;
            page.click("#settings-button").await?;
            assert_eq!(labelled_value(&mut page, "Temperature").await?, "0.9");
            let kept = page
                .eval("JSON.parse(localStorage.getItem('lamina.settings')).temperature")
                .await?;
            assert_eq!(kept, json!(0.9));
            Ok(())
        })
        .await;
}

/// The renderer, fed crafted Markdown in the page: the usual constructs become their
/// elements, and HTML in the text (scripts, event handlers, javascript: links) stays
/// text. Then the same through the page's own message view, with reasoning and tool calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markdown_is_rendered_and_html_never_injected() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let addr = start_default().await;
    let markdown = "# Title\n\nSome **bold**, *em*, `a<b>` and [a link](https://example.com/x) \
        and [bad](javascript:window.__pwned=4).\n\n\
        ```html\n<script>window.__pwned = 5</script>\n```\n\n\
        - one\n- two\n  - nested\n\n1. first\n2. second\n\n\
        | a | b |\n|---|--:|\n| 1 | 2 |\n\n\
        <script>window.__pwned = 1</script>\n\n\
        <img src=x onerror=\"window.__pwned = 2\">\n\n\
        [x](https://a.com/\"onmouseover=\"window.__pwned=3) and https://example.org/a_(b).";
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&chat_url(addr, "")).await?;
            let seen = page
                .eval(&format!(
                    "(() => {{ const html = lamina.renderMarkdown({}); \
                     const box = document.createElement('div'); box.innerHTML = html; \
                     document.body.append(box); \
                     box.querySelectorAll('a').forEach((a) => a.dispatchEvent(new MouseEvent('mouseover'))); \
                     const all = (s) => [...box.querySelectorAll(s)]; \
                     return {{ html, pwned: window.__pwned ?? null, \
                       h1: all('h1').map((e) => e.textContent), strong: all('strong').map((e) => e.textContent), \
                       em: all('em').map((e) => e.textContent), code: all('p code').map((e) => e.textContent), \
                       pre: all('pre > code.language-html').map((e) => e.textContent), \
                       copy: all('.code button').map((e) => e.textContent), \
                       ul: all('ul > li').length, ol: all('ol > li').length, nested: all('li ul li').length, \
                       th: all('th').map((e) => e.textContent), td: all('td').map((e) => e.textContent), \
                       links: all('a').map((e) => e.getAttribute('href')), \
                       dangerous: all('script, img, iframe, object, embed, style, svg, [onerror], [onmouseover], [onclick]').length, \
                       text: box.textContent }}; }})()",
                    json!(markdown)
                ))
                .await?;
            let html = seen["html"].as_str().unwrap_or_default();
            assert!(html.contains("<pre><code"), "{html}");
            assert_eq!(seen["pwned"], Value::Null, "{html}");
            assert_eq!(seen["dangerous"], 0, "{html}");
            assert_eq!(seen["h1"], json!(["Title"]));
            assert_eq!(seen["strong"], json!(["bold"]));
            assert_eq!(seen["em"], json!(["em"]));
            assert_eq!(seen["code"], json!(["a<b>"]));
            assert_eq!(seen["pre"], json!(["<script>window.__pwned = 5</script>"]));
            assert_eq!(seen["copy"], json!(["Copy"]));
            assert_eq!((seen["ul"].clone(), seen["ol"].clone(), seen["nested"].clone()), (json!(3), json!(2), json!(1)));
            assert_eq!(seen["th"], json!(["a", "b"]));
            assert_eq!(seen["td"], json!(["1", "2"]));
            assert_eq!(
                seen["links"],
                json!(["https://example.com/x", "https://a.com/\"onmouseover=\"window.__pwned=3", "https://example.org/a_(b)"])
            );
            let text = seen["text"].as_str().unwrap_or_default();
            assert!(text.contains("<script>window.__pwned = 1</script>"), "{text}");
            assert!(text.contains("<img src=x onerror=\"window.__pwned = 2\">"), "{text}");
            assert!(text.contains("and bad."), "{text}");

            // The page's own view of a reply: reasoning folded, tool calls, Copy.
            import(
                &mut page,
                json!([{"id": "crafted", "title": "crafted", "messages": [
                    {"role": "user", "content": "<b>not bold</b>"},
                    {"role": "assistant", "content": markdown, "reasoning": "Let me <i>think</i>.",
                     "tool_calls": [{"id": "call_1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                ]}]),
            )
            .await?;
            let view = page
                .eval(
                    "(() => { const log = document.getElementById('log'); \
                     const think = log.querySelector('details.think'); \
                     return { pwned: window.__pwned ?? null, \
                       dangerous: log.querySelectorAll('script, img, iframe, b, i, [onerror], [onmouseover]').length, \
                       user: log.querySelector('.msg.user .bubble').textContent, \
                       thinkOpen: think.open, summary: think.querySelector('summary').textContent, \
                       thought: think.querySelector('.md').textContent, \
                       tool: log.querySelector('.tool').textContent }; })()",
                )
                .await?;
            assert_eq!(view["pwned"], Value::Null);
            assert_eq!(view["dangerous"], 0, "{view}");
            assert_eq!(view["user"], "<b>not bold</b>");
            assert_eq!(view["thinkOpen"], false);
            assert_eq!(view["summary"], "Reasoning");
            assert_eq!(view["thought"], "Let me <i>think</i>.");
            assert_eq!(view["tool"], "Tool call: get_weather{\n  \"city\": \"Paris\"\n}");
            // Copy says it copied (for 1.5 s).
            page.click("#log .code button.copy").await?;
            page.wait_for(
                "document.querySelector('#log .code button.copy').textContent === 'Copied'",
                "Copy to say Copied",
            )
            .await?;
            Ok(())
        })
        .await;
}

/// Conversations stay in the browser: across reloads, titled by their first message,
/// renamed, deleted, exported and imported back through the file input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_kept_across_reloads() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let addr = start_default().await;
    let url = chat_url(addr, "?temperature=0&max_tokens=20");
    let export_dir = tempfile::tempdir().unwrap();
    let export_path: PathBuf = export_dir.path().join("chats.json");
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&url).await?;
            send(&mut page, "hello").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            let first = messages(&mut page).await?;
            page.click("#new-chat").await?;
            assert_eq!(
                page.eval("document.querySelectorAll('#log .msg').length")
                    .await?,
                0
            );
            send(&mut page, "second question").await?;
            assert_eq!(wait_turns(&mut page, 2).await?, "done");
            assert_eq!(
                titles(&mut page).await?,
                json!(["second question", "hello"])
            );

            page.open_chat(&url).await?;
            assert_eq!(
                titles(&mut page).await?,
                json!(["second question", "hello"])
            );
            let bubble = page
                .eval("document.querySelector('.msg.user .bubble').textContent")
                .await?;
            assert_eq!(bubble, "second question");
            page.click("#conversations li:nth-child(2) .title").await?;
            assert_eq!(messages(&mut page).await?, first);
            let reply = page
                .eval("document.querySelector('.msg.assistant .md.content').textContent")
                .await?;
            assert_eq!(
                reply,
                json!(first[1]["content"].as_str().unwrap_or_default().trim())
            );

            page.click("button[aria-label='Rename hello']").await?;
            page.fill("#conversations input", "Greeting").await?;
            page.press("Enter", false).await?;
            assert_eq!(
                titles(&mut page).await?,
                json!(["second question", "Greeting"])
            );
            // Deleting asks first (confirm), answered yes here.
            page.eval("window.confirm = () => true").await?;
            page.click("button[aria-label='Delete second question']")
                .await?;
            page.open_chat(&url).await?;
            assert_eq!(titles(&mut page).await?, json!(["Greeting"]));

            // Export, delete everything, import the file back.
            let exported = page.eval("lamina.exportJson()").await?;
            std::fs::write(&export_path, exported.as_str().context("export")?)?;
            page.eval("window.confirm = () => true").await?;
            page.click("button[aria-label='Delete Greeting']").await?;
            assert_eq!(titles(&mut page).await?, json!([]));
            let document = page.call("DOM.getDocument", json!({})).await?;
            let input = page
                .call(
                    "DOM.querySelector",
                    json!({"nodeId": document["root"]["nodeId"], "selector": "#import-file"}),
                )
                .await?;
            page.call(
                "DOM.setFileInputFiles",
                json!({"nodeId": input["nodeId"], "files": [export_path.display().to_string()]}),
            )
            .await?;
            page.wait_for(
                "document.querySelectorAll('#conversations .title').length === 1",
                "the import",
            )
            .await?;
            assert_eq!(titles(&mut page).await?, json!(["Greeting"]));
            page.click("#conversations .title").await?;
            let imported = messages(&mut page).await?;
            let contents = |m: &[Value]| m.iter().map(|m| m["content"].clone()).collect::<Vec<_>>();
            assert_eq!(contents(&imported), contents(&first));
            Ok(())
        })
        .await;
}

/// Editing a user message answers the new text (the old one stays as another
/// version); Regenerate asks again for the last reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edit_resends_and_regenerate_asks_again() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let config = ServerConfig {
        metrics_endpoint: true,
        ..ServerConfig::default()
    };
    let addr = start(4096, 2, config).await;
    let (expect, _, _) = direct_reply(
        addr,
        json!({"messages": user("hi there"), "temperature": 0, "max_tokens": 20}),
    )
    .await;
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&chat_url(addr, "?temperature=0&max_tokens=20"))
                .await?;
            send(&mut page, "hello").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            page.click(".msg.user button[aria-label='Edit']").await?;
            page.fill("textarea[aria-label='Edit message']", "hi there")
                .await?;
            page.press("Enter", false).await?;
            assert_eq!(wait_turns(&mut page, 2).await?, "done");
            let m = messages(&mut page).await?;
            assert_eq!(m.len(), 2, "{m:?}");
            assert_eq!(m[0]["content"], "hi there");
            assert_eq!(m[1]["content"], expect.as_str());
            assert_eq!(titles(&mut page).await?, json!(["hi there"]));

            let before = metric(&get(addr, "/metrics").await.text(), "requests_total");
            page.click("button[aria-label='Regenerate']").await?;
            assert_eq!(wait_turns(&mut page, 3).await?, "done");
            let after = metric(&get(addr, "/metrics").await.text(), "requests_total");
            assert_eq!(after, before + 1.0);
            let m = messages(&mut page).await?;
            assert_eq!(m.len(), 2, "{m:?}");
            assert_eq!(m[1]["content"], expect.as_str());
            Ok(())
        })
        .await;
}

/// What the page shows: each displayed message's text and its "k/n" switcher, if any.
async fn shown(page: &mut Page) -> anyhow::Result<Value> {
    page.eval(
        "[...document.querySelectorAll('#log .msg')].map((a) => \
         [(a.querySelector('.bubble, .md.content') || {}).textContent, \
          a.querySelector('.versions > span')?.textContent ?? ''])",
    )
    .await
}

/// Regenerate and edit + resend keep the old version as a sibling branch, reachable
/// through "‹ k/n ›"; the choice survives a reload, and a request carries only the
/// displayed path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regenerate_and_edit_make_branches_you_can_switch_between() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let config = ServerConfig {
        metrics_endpoint: true,
        ..ServerConfig::default()
    };
    let addr = start(4096, 2, config).await;
    // Sampled replies: the first seed after 1 whose reply differs from seed 1's.
    let ask = |messages: Value, seed: u32| json!({"messages": messages, "temperature": 1, "seed": seed, "max_tokens": 20});
    let (a1, _, _) = direct_reply(addr, ask(user("hello"), 1)).await;
    let mut seed = 2;
    let a2 = loop {
        let (a2, _, _) = direct_reply(addr, ask(user("hello"), seed)).await;
        if a2.trim() != a1.trim() {
            break a2;
        }
        seed += 1;
        assert!(seed < 50, "every seed gives {a1:?}");
    };
    let (b1, _, _) = direct_reply(addr, ask(user("hi there"), seed)).await;
    let later = json!([{"role": "user", "content": "hello"}, {"role": "assistant", "content": a2},
                       {"role": "user", "content": "and then?"}]);
    let (c1, _, _) = direct_reply(addr, ask(later, seed)).await;
    let url = chat_url(addr, "");
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&url).await?;
            page.eval("settings = {temperature: 1, seed: 1, max_tokens: 20}").await?;
            send(&mut page, "hello").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            let first = shown(&mut page).await?;
            assert_eq!(first, json!([["hello", ""], [a1.trim(), ""]]));

            // Regenerate: a second reply beside the first.
            let sampling = format!("settings = {{temperature: 1, seed: {seed}, max_tokens: 20}}");
            page.eval(&sampling).await?;
            let before = metric(&get(addr, "/metrics").await.text(), "requests_total");
            page.click("button[aria-label='Regenerate']").await?;
            assert_eq!(wait_turns(&mut page, 2).await?, "done");
            let after = metric(&get(addr, "/metrics").await.text(), "requests_total");
            assert_eq!(after, before + 1.0);
            assert_eq!(shown(&mut page).await?, json!([["hello", ""], [a2.trim(), "2/2"]]));
            page.click(".msg.assistant button[aria-label='Previous version']").await?;
            assert_eq!(shown(&mut page).await?, json!([["hello", ""], [a1.trim(), "1/2"]]));
            assert_eq!(
                page.eval("document.querySelector(\".msg.assistant button[aria-label='Previous version']\").disabled")
                    .await?,
                true
            );
            page.click(".msg.assistant button[aria-label='Next version']").await?;
            assert_eq!(shown(&mut page).await?, json!([["hello", ""], [a2.trim(), "2/2"]]));

            // Edit + resend: a second user message with its own reply.
            page.click(".msg.user button[aria-label='Edit']").await?;
            page.fill("textarea[aria-label='Edit message']", "hi there").await?;
            page.press("Enter", false).await?;
            assert_eq!(wait_turns(&mut page, 3).await?, "done");
            assert_eq!(shown(&mut page).await?, json!([["hi there", "2/2"], [b1.trim(), ""]]));
            assert_eq!(titles(&mut page).await?, json!(["hi there"]));
            page.click(".msg.user button[aria-label='Previous version']").await?;
            let back = json!([["hello", "1/2"], [a2.trim(), "2/2"]]);
            assert_eq!(shown(&mut page).await?, back);
            assert_eq!(titles(&mut page).await?, json!(["hello"]));

            // Kept across a reload: all five messages and the selected branch.
            page.open_chat(&url).await?;
            assert_eq!(shown(&mut page).await?, back);
            assert_eq!(page.eval("lamina.current().messages.length").await?, 5);
            assert_eq!(titles(&mut page).await?, json!(["hello"]));

            // Export and import again: the same tree, the same branch shown.
            let copy = page
                .eval(
                    "lamina.importJson(lamina.exportJson()) && (() => { \
                       const c = lamina.conversations().find((x) => x.id !== lamina.current().id); \
                       return [c.messages.length, pathOf(c).map((m) => m.content)]; })()",
                )
                .await?;
            assert_eq!(copy, json!([5, ["hello", a2]]));

            // Only the displayed path goes to the server.
            page.eval(&sampling).await?;
            send(&mut page, "and then?").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            let m = messages(&mut page).await?;
            assert_eq!(m.len(), 4, "{m:?}");
            assert_eq!(m[3]["content"], c1.as_str());
            Ok(())
        })
        .await;
}

/// A conversation stored by the page before branches (a flat list) loads, shows its
/// messages and carries on; llama.cpp's tree export imports with its selected branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flat_conversations_from_before_branches_still_load() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let addr = start_default().await;
    let follow = json!([{"role": "user", "content": "old question"},
                        {"role": "assistant", "content": "old answer"},
                        {"role": "user", "content": "next"}]);
    let (expect, _, _) = direct_reply(
        addr,
        json!({"messages": follow, "temperature": 0, "max_tokens": 20}),
    )
    .await;
    let url = chat_url(addr, "?temperature=0&max_tokens=20");
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&url).await?;
            let old = json!([{"id": "old", "title": "old question", "created": 1_700_000_000_000u64,
                "updated": 1_700_000_000_000u64, "messages": [
                    {"id": "m1", "role": "user", "content": "old question"},
                    {"id": "m2", "role": "assistant", "content": "old answer", "created": 1_700_000_000_000u64,
                     "stats": {"predicted_n": 2, "total_tokens": 9}}]}]);
            page.eval(&format!(
                "localStorage.setItem('lamina.conversations', {}); localStorage.setItem('lamina.current', '\"old\"')",
                json!(old.to_string())
            ))
            .await?;
            page.open_chat(&url).await?;
            assert_eq!(titles(&mut page).await?, json!(["old question"]));
            assert_eq!(
                shown(&mut page).await?,
                json!([["old question", ""], ["old answer", ""]])
            );
            send(&mut page, "next").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            let m = messages(&mut page).await?;
            assert_eq!(m.len(), 4, "{m:?}");
            assert_eq!(m[3]["content"], expect.as_str());

            // llama.cpp: a root node, parents, and currNode naming the shown leaf.
            let llama = json!({"conv": {"id": "ll", "name": "From llama.cpp", "lastModified": 1_800_000_000_000u64,
                                        "currNode": "a1"},
                "messages": [
                    {"id": "r", "type": "root", "role": "system", "content": "", "parent": null, "children": ["u"]},
                    {"id": "u", "type": "text", "role": "user", "content": "question", "parent": "r", "children": ["a1", "a2"]},
                    {"id": "a1", "type": "text", "role": "assistant", "content": "first answer", "parent": "u", "children": []},
                    {"id": "a2", "type": "text", "role": "assistant", "content": "second answer", "parent": "u", "children": []}]});
            let added = page
                .eval(&format!("lamina.importJson({})", json!(llama.to_string())))
                .await?;
            assert_eq!(added, 1);
            page.eval("openConversation('ll')").await?;
            assert_eq!(
                shown(&mut page).await?,
                json!([["question", ""], ["first answer", "1/2"]])
            );
            // A file whose parents go round in a circle still imports, as one branch.
            let circle = json!({"id": "circle", "leaf": "y", "messages": [
                {"id": "x", "parent": "y", "role": "user", "content": "x"},
                {"id": "y", "parent": "x", "role": "assistant", "content": "y"}]});
            let added = page
                .eval(&format!("lamina.importJson({})", json!(circle.to_string())))
                .await?;
            assert_eq!(added, 1);
            page.eval("openConversation('circle')").await?;
            assert_eq!(shown(&mut page).await?, json!([["x", ""], ["y", ""]]));
            Ok(())
        })
        .await;
}

/// A server with API keys: the page asks for one (again after a wrong one), keeps it
/// and sends it as a bearer token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_for_an_api_key_when_the_server_answers_401() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let config = ServerConfig {
        api_keys: vec!["k".into()],
        ..ServerConfig::default()
    };
    let addr = start(4096, 2, config).await;
    let body =
        serde_json::to_vec(&json!({"messages": user("hello"), "temperature": 0, "max_tokens": 20}))
            .unwrap();
    let direct = lamina_server::testing::request(
        addr,
        "POST",
        "/v1/chat/completions",
        &[
            ("Content-Type", "application/json"),
            ("Authorization", "Bearer k"),
        ],
        &body,
    )
    .await
    .unwrap()
    .json();
    let expect = direct["choices"][0]["message"]["content"].clone();
    assert!(expect.as_str().is_some_and(|s| !s.is_empty()), "{direct}");
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.navigate(&chat_url(addr, "?temperature=0&max_tokens=20"))
                .await?;
            page.wait_for(
                "document.getElementById('key-dialog').open",
                "the API key prompt",
            )
            .await?;
            let controls = page.accessible_controls().await?;
            assert!(
                controls.contains(&("textbox".into(), "API key".into())),
                "{controls:?}"
            );
            fill_labelled(&mut page, "API key", "wrong").await?;
            page.press("Enter", false).await?;
            // Stored, tried, refused: asked again.
            page.wait_for(
                "localStorage.getItem('lamina.apiKey') === '\"wrong\"' \
                 && document.getElementById('key-dialog').open",
                "the prompt to come back after a wrong key",
            )
            .await?;
            fill_labelled(&mut page, "API key", "k").await?;
            page.press("Enter", false).await?;
            page.wait_for(
                "document.body.dataset.ready === 'true'",
                "the page to load with the key",
            )
            .await?;
            assert_eq!(
                page.eval("document.getElementById('key-dialog').open")
                    .await?,
                false
            );
            assert_eq!(
                page.eval("localStorage.getItem('lamina.apiKey')").await?,
                "\"k\""
            );
            assert_eq!(
                page.eval("document.getElementById('ctx').textContent")
                    .await?,
                "2048 ctx"
            );
            send(&mut page, "hello").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            let m = messages(&mut page).await?;
            assert_eq!(m[1]["content"], expect);
            Ok(())
        })
        .await;
}

/// At 375 px (a phone), wide code, tables and links scroll inside their boxes: the page
/// itself never scrolls sideways, with the sidebar or Settings open either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fits_a_phone_screen_without_horizontal_scrolling() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    // The byte-level fake needs a token a byte: room for the long conversation.
    let addr = start(16384, 2, ServerConfig::default()).await;
    let mut wide = showcase();
    wide[0]["messages"][1]["content"] = json!(format!(
        "{}\n\n```\n{}\n```\n\n| {} |\n|---|---|---|---|---|---|\n| {} |\n\nhttps://example.com/{}\n\n{}",
        wide[0]["messages"][1]["content"].as_str().unwrap(),
        "x".repeat(300),
        ["column"; 6].join(" | "),
        ["a fairly long cell"; 6].join(" | "),
        "y".repeat(200),
        "z".repeat(200),
    ));
    let width = "Math.max(document.documentElement.scrollWidth, document.body.scrollWidth)";
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.set_viewport(375, 740, true).await?;
            page.open_chat(&chat_url(addr, "?temperature=0&max_tokens=60"))
                .await?;
            import(&mut page, wide).await?;
            send(&mut page, "a".repeat(400).as_str()).await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            assert_eq!(page.eval("window.innerWidth").await?, 375);
            let scroll = page.eval(width).await?;
            assert!(scroll.as_u64() <= Some(375), "the page is {scroll} px wide");
            // The sidebar, off-screen until the menu button opens it.
            page.click("#toggle-sidebar").await?;
            // It slides in (a short transition): polled until it is there.
            page.wait_for(
                "document.getElementById('sidebar').getBoundingClientRect().left === 0 \
                 && document.getElementById('toggle-sidebar').getAttribute('aria-expanded') === 'true'",
                "the sidebar to open",
            )
            .await?;
            let scroll = page.eval(width).await?;
            assert!(scroll.as_u64() <= Some(375), "with the sidebar, {scroll} px wide");
            page.click("#scrim").await?;
            page.click("#settings-button").await?;
            let dialog = page
                .eval("(() => { const r = document.getElementById('settings').getBoundingClientRect(); \
                       return r.left >= 0 && r.right <= 375; })()")
                .await?;
            assert_eq!(dialog, true);
            let scroll = page.eval(width).await?;
            assert!(scroll.as_u64() <= Some(375), "with Settings, {scroll} px wide");
            Ok(())
        })
        .await;
}

/// Every control in the accessibility tree has a name, and the main ones have the
/// names users (and screen readers) look for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_control_has_an_accessible_name() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let addr = start_default().await;
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.set_viewport(1280, 800, false).await?;
            page.open_chat(&chat_url(addr, "")).await?;
            import(&mut page, showcase()).await?;
            let controls = page.accessible_controls().await?;
            let unnamed: Vec<_> = controls
                .iter()
                .filter(|(_, name)| name.is_empty())
                .collect();
            assert!(unnamed.is_empty(), "unnamed: {unnamed:?} of {controls:?}");
            for (role, name) in [
                ("textbox", "Message"),
                ("button", "Send"),
                ("button", "Settings"),
                ("button", "New chat"),
                ("button", "Copy"),
                ("button", "Regenerate"),
                ("button", "Edit"),
                ("button", "Previous version"),
                ("button", "Next version"),
                ("button", "Export"),
                ("button", "Import"),
                ("button", "Rename Read a file line by line in Rust"),
                ("button", "Delete Read a file line by line in Rust"),
            ] {
                assert!(
                    controls.contains(&(role.to_string(), name.to_string())),
                    "no {role} named {name}: {controls:?}"
                );
            }
            page.click("#settings-button").await?;
            let controls = page.accessible_controls().await?;
            let unnamed: Vec<_> = controls
                .iter()
                .filter(|(_, name)| name.is_empty())
                .collect();
            assert!(unnamed.is_empty(), "unnamed in Settings: {unnamed:?}");
            assert!(
                controls.contains(&("textbox".into(), "System prompt".into())),
                "{controls:?}"
            );
            assert!(
                controls.contains(&("spinbutton".into(), "Temperature".into())),
                "{controls:?}"
            );
            page.press("Escape", false).await?;
            page.wait_for(
                "!document.getElementById('settings').open",
                "Escape to close Settings",
            )
            .await?;
            Ok(())
        })
        .await;
}

/// Router mode: `/v1/models` lists several models, the page offers a picker, and the
/// request goes to the model picked (remembered across reloads).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_mode_offers_a_model_picker() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let scan: Scan = Arc::new(|| {
        ["alpha", "beta"]
            .iter()
            .map(|id| ModelEntry {
                id: id.to_string(),
                aliases: Vec::new(),
                path: PathBuf::from(format!("/models/{id}.gguf")),
            })
            .collect()
    });
    let loader: Loader =
        Arc::new(|_| Ok(Box::new(FakeEngine::new(1024, 1)) as Box<dyn lamina_server::Engine>));
    let router = RouterConfig {
        scan,
        models_max: 0,
        autoload: true,
        default_model: None,
    };
    let app = model_router::build(
        router,
        loader,
        ServerConfig::default(),
        lamina_server::server_tools::ServerTools::disabled(),
    );
    let addr = lamina_server::spawn_app(app).await.unwrap();
    let url = chat_url(addr, "?temperature=0&max_tokens=8");
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&url).await?;
            let options = page
                .eval("[...document.getElementById('model-picker').options].map((o) => o.value)")
                .await?;
            assert_eq!(options, json!(["alpha", "beta"]));
            let controls = page.accessible_controls().await?;
            assert!(
                controls.contains(&("combobox".into(), "Model".into())),
                "{controls:?}"
            );
            page.eval(
                "(() => { const p = document.getElementById('model-picker'); p.value = 'beta'; \
                 p.dispatchEvent(new Event('change')); })()",
            )
            .await?;
            send(&mut page, "hi").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            let m = messages(&mut page).await?;
            assert_eq!(m[1]["model"], "beta");
            assert_eq!(m[1]["stats"]["n_ctx"], 1024);
            let models = get(addr, "/v1/models").await.json();
            let status = |id: &str| {
                models["data"]
                    .as_array()
                    .and_then(|d| d.iter().find(|m| m["id"] == id))
                    .map(|m| m["status"]["value"].clone())
            };
            assert_eq!(status("beta"), Some(json!("loaded")), "{models}");
            assert_eq!(status("alpha"), Some(json!("unloaded")), "{models}");
            page.open_chat(&url).await?;
            assert_eq!(
                page.eval("document.getElementById('model-picker').value")
                    .await?,
                "beta"
            );
            Ok(())
        })
        .await;
}

/// A template that opens `<think>` (QwQ's) with a reasoning budget: the streamed
/// `reasoning_content` goes into a folded "Reasoning" block above the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reasoning_is_shown_in_a_collapsible_block() {
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let engine = FakeEngine::new(4096, 1).with_chat_template(QWQ).unwrap();
    let mut config = ServerConfig::default();
    config
        .default_params
        .insert("reasoning_budget_tokens".into(), json!(4));
    let addr = lamina_server::spawn_local(Box::new(engine), config)
        .await
        .unwrap();
    let (content, reasoning, _) = direct_reply(
        addr,
        json!({"messages": user("Think."), "temperature": 0, "max_tokens": 30}),
    )
    .await;
    assert!(
        !reasoning.trim().is_empty() && !content.trim().is_empty(),
        "{reasoning:?} {content:?}"
    );
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.open_chat(&chat_url(addr, "?temperature=0&max_tokens=30"))
                .await?;
            send(&mut page, "Think.").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            let m = messages(&mut page).await?;
            assert_eq!(m[1]["reasoning"], reasoning.as_str());
            assert_eq!(m[1]["content"], content.as_str());
            let seen = page
                .eval(
                    "(() => { const t = document.querySelector('.msg.assistant details.think'); \
                     return { open: t.open, summary: t.querySelector('summary').textContent, \
                       thought: t.querySelector('.md').textContent, \
                       answer: document.querySelector('.msg.assistant .md.content').textContent }; })()",
                )
                .await?;
            assert_eq!(seen["open"], false);
            assert_eq!(seen["summary"], "Reasoning");
            assert_eq!(seen["thought"], reasoning.trim());
            assert_eq!(seen["answer"], content.trim());
            page.click(".msg.assistant details.think summary").await?;
            assert_eq!(page.eval("document.querySelector('details.think').open").await?, true);
            Ok(())
        })
        .await;
}

/// With LAMINA_UI_SCREENSHOTS=1: pictures of the page for a person to look at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn screenshots_for_review() {
    if !required("LAMINA_UI_SCREENSHOTS") {
        eprintln!("SKIPPED: set LAMINA_UI_SCREENSHOTS=1 to write /tmp/lamina-ui-*.png");
        return;
    }
    let Some(browser) = Browser::launch().await else {
        return;
    };
    let config = ServerConfig {
        aliases: vec!["qwen2.5-7b-instruct-q4_k_m".into()],
        ..ServerConfig::default()
    };
    let addr = start(8192, 2, config).await;
    browser
        .check(async {
            let mut page = browser.page().await?;
            page.set_viewport(1280, 800, false).await?;
            page.open_chat(&chat_url(addr, "?max_tokens=24&seed=3"))
                .await?;
            import(&mut page, showcase()).await?;
            // A real reply from the fake model, for real speed figures.
            send(&mut page, "Thanks! And in Python?").await?;
            assert_eq!(wait_turns(&mut page, 1).await?, "done");
            page.eval("document.getElementById('input').blur()").await?;
            page.screenshot("/tmp/lamina-ui-desktop.png").await?;
            page.call(
                "Emulation.setEmulatedMedia",
                json!({"features": [{"name": "prefers-color-scheme", "value": "dark"}]}),
            )
            .await?;
            page.screenshot("/tmp/lamina-ui-desktop-dark.png").await?;
            page.click("#settings-button").await?;
            page.screenshot("/tmp/lamina-ui-settings-dark.png").await?;
            page.press("Escape", false).await?;
            page.call("Emulation.setEmulatedMedia", json!({"features": []}))
                .await?;
            page.set_viewport(375, 740, true).await?;
            // The sidebar slides away when the screen narrows: shot once it is gone.
            page.wait_for(
                "document.getElementById('sidebar').getBoundingClientRect().right <= 0",
                "the sidebar to slide away",
            )
            .await?;
            page.eval("document.getElementById('log').scrollTop = 0")
                .await?;
            page.screenshot("/tmp/lamina-ui-phone.png").await?;
            Ok(())
        })
        .await;
}
