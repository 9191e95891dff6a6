//! Headless Chromium driven over the DevTools protocol, for the chat page's tests.
//! Included by the test files that use it (`#[path = "common/browser.rs"] mod browser;`),
//! so the other test binaries do not compile it.
//!
//! Chromium missing: [`Browser::launch`] prints SKIPPED and returns `None`, unless
//! LAMINA_REQUIRE_CHROMIUM is set (CI installs it and sets it), then it panics.

#![allow(dead_code)]

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;

/// Whether the environment variable `var` is set to something other than "" or "0".
pub fn required(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0")
}

/// How long one [`Page::wait_for`] may take: a safety net against a hung page only,
/// never a synchronization (the condition is polled).
pub const WAIT_LIMIT: Duration = Duration::from_secs(120);

/// A whole browser test's limit, against a hung browser.
pub const TEST_LIMIT: Duration = Duration::from_secs(300);

/// A Chromium process, killed and reaped however the test ends.
pub struct ChromiumProcess(Child);

impl Drop for ChromiumProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The installed Chromium, if any.
pub fn find_chromium() -> Option<&'static str> {
    ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| Path::new(p).exists())
}

/// Starts headless Chromium with a DevTools port. Returns the process, the browser's
/// DevTools websocket URL (printed on stderr once the port is open, `None` if Chromium
/// exits first), and everything Chromium writes to stderr, for failure messages.
pub fn launch_chromium(
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
            "--hide-scrollbars",
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
pub struct DevTools {
    socket: DevToolsSocket,
    next_id: u64,
    events: Vec<Value>,
}

impl DevTools {
    pub async fn connect(url: &str) -> anyhow::Result<Self> {
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
    pub async fn call(
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
    pub async fn wait_event(&mut self, wanted: impl Fn(&Value) -> bool) -> anyhow::Result<Value> {
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

/// A headless Chromium for one test, with its own profile (so its own localStorage).
pub struct Browser {
    devtools_url: String,
    stderr: Arc<Mutex<String>>,
    // Dropped after the process is killed.
    _process: ChromiumProcess,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium, or returns `None` (after printing SKIPPED) when it is not
    /// installed and LAMINA_REQUIRE_CHROMIUM is not set.
    pub async fn launch() -> Option<Browser> {
        let Some(chromium) = find_chromium() else {
            assert!(
                !required("LAMINA_REQUIRE_CHROMIUM"),
                "chromium is required but missing"
            );
            eprintln!("SKIPPED: chromium not installed (apt-get install -y chromium)");
            return None;
        };
        let profile = tempfile::tempdir().expect("a temporary profile directory");
        let (process, url, stderr) = launch_chromium(chromium, profile.path());
        let devtools_url = match tokio::time::timeout(TEST_LIMIT, url).await {
            Ok(Ok(url)) => url,
            _ => panic!(
                "chromium did not open its DevTools port\nstderr: {}",
                stderr.lock().unwrap_or_else(|e| e.into_inner())
            ),
        };
        Some(Browser {
            devtools_url,
            stderr,
            _process: process,
            _profile: profile,
        })
    }

    /// The end of what Chromium wrote on stderr, without its D-Bus complaints (a
    /// container has no D-Bus; they say nothing about the page).
    pub fn stderr(&self) -> String {
        let log = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let lines: Vec<&str> = log.lines().filter(|l| !l.contains("dbus")).collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// Runs a test body, failing with Chromium's stderr if it fails or hangs.
    pub async fn check(&self, body: impl Future<Output = anyhow::Result<()>>) {
        match tokio::time::timeout(TEST_LIMIT, body).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("{e:#}\nchromium's stderr: {}", self.stderr()),
            Err(_) => panic!(
                "the test hung for {TEST_LIMIT:?}\nchromium's stderr: {}",
                self.stderr()
            ),
        }
    }

    /// A new tab, its page and lifecycle events on.
    pub async fn page(&self) -> anyhow::Result<Page> {
        let mut devtools = DevTools::connect(&self.devtools_url).await?;
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
        let mut page = Page { devtools, session };
        page.call("Page.enable", json!({})).await?;
        page.call("Page.setLifecycleEventsEnabled", json!({"enabled": true}))
            .await?;
        Ok(page)
    }
}

/// One tab of the browser.
pub struct Page {
    devtools: DevTools,
    session: String,
}

impl Page {
    pub async fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.devtools
            .call(Some(&self.session), method, params)
            .await
    }

    /// Opens `url` and returns once its document (not an earlier one) has loaded.
    pub async fn navigate(&mut self, url: &str) -> anyhow::Result<()> {
        let navigation = self.call("Page.navigate", json!({"url": url})).await?;
        if let Some(error) = navigation.get("errorText") {
            bail!("navigating to {url} failed: {error}");
        }
        let loader = navigation["loaderId"].clone();
        self.devtools
            .wait_event(|event| {
                event["method"] == "Page.lifecycleEvent"
                    && event["params"]["name"] == "load"
                    && event["params"]["loaderId"] == loader
            })
            .await?;
        Ok(())
    }

    /// Opens `url` and waits until the chat page has asked the server what it serves.
    pub async fn open_chat(&mut self, url: &str) -> anyhow::Result<()> {
        self.navigate(url).await?;
        self.wait_for(
            "document.body.dataset.ready === 'true'",
            "the page to be ready",
        )
        .await?;
        Ok(())
    }

    /// The value of `expression` (awaited if a promise), or its exception as an error.
    pub async fn eval(&mut self, expression: &str) -> anyhow::Result<Value> {
        let evaluated = self
            .call(
                "Runtime.evaluate",
                json!({
                    "expression": expression,
                    "awaitPromise": true,
                    "returnByValue": true,
                    "userGesture": true,
                }),
            )
            .await?;
        if let Some(exception) = evaluated.get("exceptionDetails") {
            bail!("evaluating {expression} threw: {exception}");
        }
        Ok(evaluated["result"]
            .get("value")
            .cloned()
            .unwrap_or(Value::Null))
    }

    /// Polls `expression` until it is truthy and returns its value; `what` names the
    /// condition in the error if it never holds within [`WAIT_LIMIT`].
    pub async fn wait_for(&mut self, expression: &str, what: &str) -> anyhow::Result<Value> {
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            let v = self.eval(expression).await?;
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return Ok(v);
            }
            if Instant::now() > deadline {
                let html = self
                    .eval("document.body.outerHTML")
                    .await
                    .unwrap_or_default();
                bail!("waited {WAIT_LIMIT:?} for {what} ({expression})\npage: {html}");
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits for the chat turn to end and returns the page's `data-state` ("done",
    /// "stopped" or "error").
    pub async fn turn_end(&mut self) -> anyhow::Result<String> {
        let state = self
            .wait_for(
                "['done', 'stopped', 'error'].includes(document.body.dataset.state) \
                 && document.body.dataset.state",
                "the reply to end",
            )
            .await?;
        Ok(state.as_str().unwrap_or_default().to_string())
    }

    /// Clicks the element `selector` finds (a JavaScript string literal is built here).
    pub async fn click(&mut self, selector: &str) -> anyhow::Result<()> {
        let found = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({}); if (e) e.click(); return !!e; }})()",
                json!(selector)
            ))
            .await?;
        if found != json!(true) {
            bail!("nothing matches {selector}");
        }
        Ok(())
    }

    /// Focuses `selector`, empties it and types `text` as keyboard input would.
    pub async fn fill(&mut self, selector: &str, text: &str) -> anyhow::Result<()> {
        let found = self
            .eval(&format!(
                "(() => {{ const e = document.querySelector({}); if (!e) return false; \
                 e.focus(); e.value = ''; return document.activeElement === e; }})()",
                json!(selector)
            ))
            .await?;
        if found != json!(true) {
            bail!("cannot focus {selector}");
        }
        self.type_text(text).await
    }

    /// Types `text` into the focused element.
    pub async fn type_text(&mut self, text: &str) -> anyhow::Result<()> {
        self.call("Input.insertText", json!({"text": text})).await?;
        Ok(())
    }

    /// Presses and releases `key` ("Enter", "Escape"), with Shift if `shift`.
    pub async fn press(&mut self, key: &str, shift: bool) -> anyhow::Result<()> {
        let (code, text) = match key {
            "Enter" => (13, "\r"),
            "Escape" => (27, ""),
            "Tab" => (9, ""),
            _ => bail!("no key code for {key}"),
        };
        let modifiers = if shift { 8 } else { 0 };
        let mut down = json!({
            "type": "keyDown", "key": key, "code": key, "modifiers": modifiers,
            "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code,
        });
        if !text.is_empty() {
            down["text"] = json!(text);
            down["unmodifiedText"] = json!(text);
        }
        self.call("Input.dispatchKeyEvent", down).await?;
        self.call(
            "Input.dispatchKeyEvent",
            json!({
                "type": "keyUp", "key": key, "code": key, "modifiers": modifiers,
                "windowsVirtualKeyCode": code, "nativeVirtualKeyCode": code,
            }),
        )
        .await?;
        Ok(())
    }

    /// Emulates a screen `width` x `height` CSS pixels wide (a phone's when `mobile`).
    pub async fn set_viewport(
        &mut self,
        width: u32,
        height: u32,
        mobile: bool,
    ) -> anyhow::Result<()> {
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": mobile}),
        )
        .await?;
        Ok(())
    }

    /// The (role, accessible name) of every control Chromium's accessibility tree
    /// exposes now (nodes it ignores, such as hidden ones, left out).
    pub async fn accessible_controls(&mut self) -> anyhow::Result<Vec<(String, String)>> {
        const CONTROLS: [&str; 8] = [
            "button",
            "textbox",
            "combobox",
            "spinbutton",
            "checkbox",
            "link",
            "listbox",
            "slider",
        ];
        let tree = self.call("Accessibility.getFullAXTree", json!({})).await?;
        let mut out = Vec::new();
        for node in tree["nodes"].as_array().context("no AX nodes")? {
            if node["ignored"] == json!(true) {
                continue;
            }
            let role = node["role"]["value"].as_str().unwrap_or_default();
            if CONTROLS.contains(&role) {
                let name = node["name"]["value"].as_str().unwrap_or_default();
                out.push((role.to_string(), name.trim().to_string()));
            }
        }
        Ok(out)
    }

    /// Saves a PNG of the viewport at `path`.
    pub async fn screenshot(&mut self, path: &str) -> anyhow::Result<()> {
        let shot = self
            .call("Page.captureScreenshot", json!({"format": "png"}))
            .await?;
        let data = shot["data"].as_str().context("no screenshot data")?;
        std::fs::write(path, base64_decode(data)?).with_context(|| format!("writing {path}"))?;
        Ok(())
    }
}

/// Standard base64 (what DevTools sends screenshots as), without a dependency for it.
fn base64_decode(text: &str) -> anyhow::Result<Vec<u8>> {
    let value = |c: u8| -> anyhow::Result<u32> {
        Ok(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => bail!("bad base64 byte {c}"),
        } as u32)
    };
    let bytes: Vec<u8> = text.bytes().filter(|&c| c != b'=' && c != b'\n').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for group in bytes.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in group.iter().enumerate() {
            n |= value(c)? << (18 - 6 * i);
        }
        let produced = group.len().saturating_sub(1);
        out.extend_from_slice(&n.to_be_bytes()[1..1 + produced]);
    }
    Ok(out)
}
