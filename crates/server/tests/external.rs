//! Checks with outside clients: the chat page in headless Chromium (driven over the
//! DevTools protocol), the official `openai` Python package, and a short loopback load
//! test. The first two skip with a message when their tool is missing, unless
//! LAMINA_REQUIRE_CHROMIUM / LAMINA_REQUIRE_OPENAI is set (CI installs both and sets them).

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use common::*;
use futures_util::{SinkExt, StreamExt};
use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use lamina_server::testing;
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

fn required(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0")
}

/// Escapes text the way Chromium serializes it into the DOM.
fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// A Chromium process, killed and reaped however the test ends.
struct ChromiumProcess(Child);

impl Drop for ChromiumProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts headless Chromium with a DevTools port. Returns the process, the browser's
/// DevTools websocket URL (printed on stderr once the port is open, `None` if Chromium
/// exits first), and everything Chromium writes to stderr, for failure messages.
fn launch_chromium(
    chromium: &str,
    profile: &Path,
) -> (
    ChromiumProcess,
    tokio::sync::oneshot::Receiver<String>,
    Arc<Mutex<String>>,
) {
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("chromium starts");
    let stderr = child.stderr.take().expect("piped stderr");
    let process = ChromiumProcess(child);
    let (url_tx, url_rx) = tokio::sync::oneshot::channel();
    let log = Arc::new(Mutex::new(String::new()));
    let thread_log = Arc::clone(&log);
    // Keeps draining stderr after the URL so Chromium never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut url_tx = Some(url_tx);
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if let Some(url) = line.strip_prefix("DevTools listening on ")
                && let Some(tx) = url_tx.take()
            {
                let _ = tx.send(url.trim().to_string());
            }
            let mut log = thread_log.lock().unwrap_or_else(|e| e.into_inner());
            log.push_str(&line);
            log.push('\n');
        }
    });
    (process, url_rx, log)
}

type DevToolsSocket =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// A minimal Chrome DevTools Protocol client: one command at a time, with events that
/// arrive meanwhile kept for [`DevTools::wait_event`].
struct DevTools {
    socket: DevToolsSocket,
    next_id: u64,
    events: Vec<Value>,
}

impl DevTools {
    async fn connect(url: &str) -> anyhow::Result<Self> {
        let (socket, _) = tokio_tungstenite::connect_async(url)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        Ok(Self {
            socket,
            next_id: 0,
            events: Vec::new(),
        })
    }

    async fn receive(&mut self) -> anyhow::Result<Value> {
        loop {
            let message = self
                .socket
                .next()
                .await
                .context("the DevTools connection closed")??;
            match message {
                Message::Text(text) => return Ok(serde_json::from_str(text.as_str())?),
                Message::Close(frame) => bail!("the DevTools connection closed: {frame:?}"),
                _ => {}
            }
        }
    }

    /// Sends `method` (to the page `session`, or to the browser when `None`) and returns
    /// its result.
    async fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> anyhow::Result<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            command["sessionId"] = json!(session);
        }
        self.socket.send(Message::text(command.to_string())).await?;
        loop {
            let message = self.receive().await?;
            if message["id"] == id {
                if let Some(error) = message.get("error") {
                    bail!("{method} failed: {error}");
                }
                return Ok(message["result"].clone());
            }
            if message.get("method").is_some() {
                self.events.push(message);
            }
        }
    }

    /// Returns the first event, already received or still to come, that `wanted` accepts.
    async fn wait_event(&mut self, wanted: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
        if let Some(i) = self.events.iter().position(&wanted) {
            return Ok(self.events.remove(i));
        }
        loop {
            let message = self.receive().await?;
            if wanted(&message) {
                return Ok(message);
            }
            if message.get("method").is_some() {
                self.events.push(message);
            }
        }
    }
}

/// Resolves with the page's HTML once the chat turn has ended (`data-state` "done" or
/// "error"): the page itself signals it, so nothing here depends on how fast the reply
/// is generated.
const HTML_WHEN_TURN_ENDS: &str = r#"new Promise((resolve) => {
  const ended = () => ["done", "error"].includes(document.body.dataset.state);
  const finish = () => resolve(document.documentElement.outerHTML);
  if (ended()) return finish();
  const observer = new MutationObserver(() => {
    if (ended()) {
      observer.disconnect();
      finish();
    }
  });
  observer.observe(document.body, { attributes: true, attributeFilter: ["data-state"] });
})"#;

/// Opens `url` in a new tab of the browser at `browser_url`, waits for the page to load
/// and then for its chat turn to end, and returns the page's HTML.
async fn chat_page_html(browser_url: &str, url: &str) -> anyhow::Result<String> {
    let mut devtools = DevTools::connect(browser_url).await?;
    let target = devtools
        .call(None, "Target.createTarget", json!({"url": "about:blank"}))
        .await?;
    let attached = devtools
        .call(
            None,
            "Target.attachToTarget",
            json!({"targetId": target["targetId"], "flatten": true}),
        )
        .await?;
    let session = attached["sessionId"]
        .as_str()
        .context("no sessionId")?
        .to_string();
    let session = Some(session.as_str());
    devtools.call(session, "Page.enable", json!({})).await?;
    devtools
        .call(
            session,
            "Page.setLifecycleEventsEnabled",
            json!({"enabled": true}),
        )
        .await?;
    let navigation = devtools
        .call(session, "Page.navigate", json!({"url": url}))
        .await?;
    if let Some(error) = navigation.get("errorText") {
        bail!("navigating to {url} failed: {error}");
    }
    let loader = navigation["loaderId"].clone();
    // The load of this navigation's document (not of the about:blank before it); after
    // it, evaluating runs in the chat page, whose script has already sent the prompt.
    devtools
        .wait_event(|event| {
            event["method"] == "Page.lifecycleEvent"
                && event["params"]["name"] == "load"
                && event["params"]["loaderId"] == loader
        })
        .await?;
    let evaluated = devtools
        .call(
            session,
            "Runtime.evaluate",
            json!({
                "expression": HTML_WHEN_TURN_ENDS,
                "awaitPromise": true,
                "returnByValue": true,
            }),
        )
        .await?;
    if let Some(exception) = evaluated.get("exceptionDetails") {
        bail!("evaluating in the page threw: {exception}");
    }
    evaluated["result"]["value"]
        .as_str()
        .map(str::to_string)
        .with_context(|| format!("no HTML in {evaluated}"))
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
    let (_chromium, browser_url, stderr) = launch_chromium(chromium, profile.path());
    let stderr = || stderr.lock().unwrap_or_else(|e| e.into_inner()).clone();
    // A safety net against a hung browser only: the page says when it is done.
    let limit = Duration::from_secs(300);
    let dom = tokio::time::timeout(limit, async {
        let browser_url = browser_url
            .await
            .context("chromium exited without opening its DevTools port")?;
        chat_page_html(&browser_url, &url).await
    })
    .await
    .unwrap_or_else(|_| panic!("chromium hung for {limit:?}\nstderr: {}", stderr()))
    .unwrap_or_else(|e| panic!("driving chromium failed: {e:#}\nstderr: {}", stderr()));
    assert!(
        dom.contains("data-state=\"done\""),
        "the page did not finish: {dom}\nstderr: {}",
        stderr()
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
