//! MCP servers over stdio, llama.cpp's `server-mcp.cpp`: the Cursor-compatible
//! `{"mcpServers": {...}}` configuration, one child process per server speaking
//! newline-delimited JSON-RPC 2.0 (protocol version `2024-11-05`), a warm-up at start
//! that lists every server's tools and stops it again, and on-demand (re)spawning when a
//! tool is called, with a cool-down after a failed spawn.
//!
//! A small hand-written client rather than the `rmcp` crate: llama.cpp's behaviour is a
//! handful of specific choices (the old protocol version, a per-call timeout that also
//! bounds the handshake, malformed lines and notifications skipped, stale replies of
//! timed-out calls dropped by id, an 8 MB line cap, lazy respawn with a 5 s cool-down,
//! cancellation at shutdown) that are simpler to state directly than to bend a full SDK
//! (which negotiates its own protocol version and closes the session on a malformed
//! line) into.
//!
//! Bounds: one line from a child is at most [`MAX_LINE`] bytes (longer lines are
//! dropped up to their newline); at most [`QUEUE_MAX_LINES`] lines and
//! [`QUEUE_MAX_BYTES`] bytes wait unread (the oldest are dropped, as llama.cpp's
//! bounded pipe does); the stderr tail kept for diagnostics is 4 KB.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::ChildStdin;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::builtin::type_name;

const MCP_PROTOCOL_VERSION: &str = "2024-11-05";
/// A failed spawn is not retried for this long.
const MCP_COOLDOWN: Duration = Duration::from_secs(5);
/// Tool discovery at start is capped per server.
const MCP_WARMUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The handshake and `tools/list` get at least this long, whatever `timeout_ms` says.
const MCP_HANDSHAKE_MIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Default per-call timeout (`timeout_ms`).
const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// Longest line read from a child.
pub(crate) const MAX_LINE: usize = 8 * 1024 * 1024;
/// Unread lines kept per server.
pub(crate) const QUEUE_MAX_LINES: usize = 65_536;
/// Unread bytes kept per server (not in llama.cpp, whose bound is only the line count).
pub(crate) const QUEUE_MAX_BYTES: usize = 64 * 1024 * 1024;
const ERR_TAIL_MAX: usize = 4096;
/// Largest `--mcp-servers-config` file read.
const MAX_CONFIG_FILE: u64 = 16 * 1024 * 1024;

// ---------------------------------------------------------------------------------------
// configuration
// ---------------------------------------------------------------------------------------

/// One `mcpServers` entry.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct McpServerConfig {
    /// The key, e.g. `filesystem`; tools are exposed as `<name>_<tool>`.
    pub name: String,
    pub command: String,
    pub args: Vec<String>,
    /// Merged over the parent environment.
    pub env: Vec<(String, String)>,
    /// Working directory of the child (empty: the server's).
    pub cwd: String,
    /// Per-call timeout.
    pub timeout_ms: u64,
}

fn type_must_be(kind: &str, v: &Value) -> String {
    format!(
        "[json.exception.type_error.302] type must be {kind}, but is {}",
        type_name(v)
    )
}

fn cfg_string(cfg: &serde_json::Map<String, Value>, key: &str) -> Result<String, String> {
    match cfg.get(key) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(type_must_be("string", v)),
    }
}

/// llama.cpp's `parse_cursor_format`: a missing or non-object `mcpServers` gives no
/// servers, entries without a `command` are skipped (with a warning), mistyped fields are
/// errors.
pub(crate) fn parse_cursor_format(j: &Value) -> Result<Vec<McpServerConfig>, String> {
    let mut result = Vec::new();
    let Some(Value::Object(servers)) = j.get("mcpServers") else {
        return Ok(result);
    };
    for (name, cfg) in servers {
        let Value::Object(cfg) = cfg else {
            return Err(format!(
                "[json.exception.type_error.306] cannot use value() with {}",
                type_name(cfg)
            ));
        };
        let command = cfg_string(cfg, "command")?;
        let cwd = cfg_string(cfg, "cwd")?;
        let timeout_ms = match cfg.get("timeout_ms") {
            None => DEFAULT_TIMEOUT_MS,
            Some(Value::Number(n)) => {
                if let Some(i) = n.as_i64() {
                    i.clamp(0, i32::MAX as i64) as u64
                } else if n.as_u64().is_some() {
                    i32::MAX as u64
                } else {
                    n.as_f64().unwrap_or(0.0).clamp(0.0, i32::MAX as f64) as u64
                }
            }
            Some(Value::Bool(b)) => *b as u64,
            Some(v) => return Err(type_must_be("number", v)),
        };
        let mut args = Vec::new();
        if let Some(Value::Array(a)) = cfg.get("args") {
            for v in a {
                match v {
                    Value::String(s) => args.push(s.clone()),
                    v => return Err(type_must_be("string", v)),
                }
            }
        }
        let mut env = Vec::new();
        if let Some(Value::Object(e)) = cfg.get("env") {
            for (k, v) in e {
                match v {
                    Value::String(s) => env.push((k.clone(), s.clone())),
                    v => return Err(type_must_be("string", v)),
                }
            }
        }
        if command.is_empty() {
            tracing::warn!("MCP server '{name}' has no command, skipping");
            continue;
        }
        result.push(McpServerConfig {
            name: name.clone(),
            command,
            args,
            env,
            cwd,
            timeout_ms,
        });
    }
    Ok(result)
}

/// Reads `--mcp-servers-config` then `--mcp-servers-json` (llama.cpp's
/// `server_mcp::start` parsing half). Names must be unique across both: later
/// duplicates are skipped with a warning.
pub(crate) fn load_configs(
    file: Option<&Path>,
    inline: Option<&str>,
) -> Result<Vec<McpServerConfig>, String> {
    let mut configs: Vec<McpServerConfig> = Vec::new();
    let mut append = |text: &str| -> Result<(), String> {
        let j: Value = serde_json::from_str(text).map_err(|e| {
            format!(
                "failed to parse MCP config JSON: [json.exception.parse_error.101] parse error: {e}"
            )
        })?;
        let parsed =
            parse_cursor_format(&j).map_err(|e| format!("failed to parse MCP config JSON: {e}"))?;
        if parsed.is_empty() {
            tracing::warn!("MCP config: no servers found in JSON");
        }
        for p in parsed {
            if configs.iter().any(|c| c.name == p.name) {
                tracing::warn!("MCP config: duplicate server name '{}', skipping", p.name);
                continue;
            }
            configs.push(p);
        }
        Ok(())
    };
    if let Some(path) = file {
        let open_err = || format!("failed to open MCP config file: {}", path.display());
        let f = std::fs::File::open(path).map_err(|_| open_err())?;
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_CONFIG_FILE + 1), &mut text)
            .map_err(|_| open_err())?;
        if text.len() as u64 > MAX_CONFIG_FILE {
            return Err(format!(
                "MCP config file too large: {} (max {MAX_CONFIG_FILE} bytes)",
                path.display()
            ));
        }
        append(&text)?;
    }
    if let Some(text) = inline {
        append(text)?;
    }
    Ok(configs)
}

// ---------------------------------------------------------------------------------------
// the line queue between a child's stdout and the caller
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct QueueState {
    lines: VecDeque<String>,
    bytes: usize,
    closed: bool,
}

/// Complete lines read from the child, bounded (the oldest are dropped).
#[derive(Default)]
pub(crate) struct LineQueue {
    state: Mutex<QueueState>,
    notify: Notify,
}

enum Pop {
    Line(String),
    Closed,
    TimedOut,
    Cancelled,
}

impl LineQueue {
    fn push(&self, line: String) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.closed {
            return;
        }
        s.bytes += line.len();
        s.lines.push_back(line);
        while s.lines.len() > QUEUE_MAX_LINES || s.bytes > QUEUE_MAX_BYTES {
            match s.lines.pop_front() {
                Some(old) => s.bytes -= old.len(),
                None => break,
            }
        }
        drop(s);
        self.notify.notify_one();
    }

    fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.notify.notify_one();
    }

    async fn pop(&self, deadline: Instant, stop: &mut watch::Receiver<bool>) -> Pop {
        loop {
            {
                let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(line) = s.lines.pop_front() {
                    s.bytes -= line.len();
                    return Pop::Line(line);
                }
                if s.closed {
                    return Pop::Closed;
                }
            }
            tokio::select! {
                _ = self.notify.notified() => {}
                _ = tokio::time::sleep_until(deadline) => return Pop::TimedOut,
                _ = cancelled(stop) => return Pop::Cancelled,
            }
        }
    }
}

/// Completes once the stop flag is set (never when its sender is gone).
async fn cancelled(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Splits a child's output into lines (`\r\n` too), skipping empty ones, dropping any
/// line longer than [`MAX_LINE`] up to its newline; stops at EOF or when `on_line`
/// returns false.
pub(crate) async fn pump_ndjson<R: AsyncRead + Unpin>(
    mut r: R,
    mut on_line: impl FnMut(String) -> bool,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut skipping = false;
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let mut scan_from = buf.len();
        buf.extend_from_slice(&chunk[..n]);
        if skipping {
            match memchr::memchr(b'\n', &buf[scan_from..]) {
                None => {
                    buf.clear(); // still inside the over-long line
                    continue;
                }
                Some(pos) => {
                    buf.drain(..scan_from + pos + 1);
                    scan_from = 0;
                    skipping = false;
                }
            }
        }
        let mut start = 0;
        while let Some(pos) = memchr::memchr(b'\n', &buf[scan_from..]) {
            let end = scan_from + pos;
            let mut line = &buf[start..end];
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let keep_going = if line.is_empty() {
                true
            } else if line.len() > MAX_LINE {
                tracing::warn!("MCP: dropping oversized line (> {MAX_LINE} bytes) from child pipe");
                true
            } else {
                on_line(String::from_utf8_lossy(line).into_owned())
            };
            start = end + 1;
            scan_from = start;
            if !keep_going {
                return;
            }
        }
        buf.drain(..start);
        if buf.len() > MAX_LINE {
            tracing::warn!("MCP: dropping oversized line (> {MAX_LINE} bytes) from child pipe");
            buf.clear();
            skipping = true;
        }
    }
}

// ---------------------------------------------------------------------------------------
// one server session
// ---------------------------------------------------------------------------------------

/// A tool advertised by an MCP server.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct McpToolDef {
    pub server_name: String,
    /// The bare name, without the `<server>_` prefix.
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments, or null.
    pub input_schema: Value,
}

/// State used only while holding the session lock (one request at a time per server:
/// a slow call on one server never stalls another).
struct Session {
    stdin: Option<ChildStdin>,
    next_id: u64,
    initialized: bool,
    tools: Option<Vec<McpToolDef>>,
}

/// Why [`StdioTransport::send_rpc`] returned without a reply.
#[derive(Debug, PartialEq)]
enum RpcFail {
    /// The request could not even be written: safe to retry on a fresh process.
    NotSent,
    Message(&'static str),
}

/// One running MCP server (child process, NDJSON over stdio, stderr drained).
pub(crate) struct StdioTransport {
    name: String,
    timeout: Duration,
    alive: Arc<AtomicBool>,
    queue: Arc<LineQueue>,
    err_tail: Arc<Mutex<String>>,
    last_error: Mutex<String>,
    session: tokio::sync::Mutex<Session>,
    child: Mutex<Option<tokio::process::Child>>,
    pid: Option<u32>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

fn rpc_error_message(resp: &Value) -> String {
    match resp.get("error") {
        Some(Value::Object(e)) => match e.get("message") {
            Some(Value::String(m)) => m.clone(),
            _ => "unknown error".into(),
        },
        Some(Value::String(s)) => s.clone(),
        _ => "unknown error".into(),
    }
}

/// An MCP `tools/call` result in the `/tools` contract: the text parts joined by
/// newlines as `plain_text_response`, or `error` when `isError`.
pub(crate) fn mcp_result_to_response(result: &Value) -> Value {
    let mut text = String::new();
    if let Some(Value::Array(parts)) = result.get("content") {
        for part in parts {
            if part.get("type").and_then(Value::as_str) == Some("text") {
                if !text.is_empty() {
                    text.push('\n');
                }
                text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""));
            }
        }
    }
    if result.get("isError").and_then(Value::as_bool) == Some(true) {
        let msg = if text.is_empty() {
            "MCP tool returned an error".to_string()
        } else {
            text
        };
        return json!({ "error": msg });
    }
    json!({ "plain_text_response": text })
}

fn id_matches(reply_id: Option<&Value>, id: u64) -> bool {
    match reply_id {
        Some(Value::Number(n)) => n.as_u64() == Some(id) || n.as_f64() == Some(id as f64),
        _ => false,
    }
}

impl StdioTransport {
    /// Spawns the server. The handshake happens on the first request.
    pub fn spawn(cfg: &McpServerConfig) -> Result<Arc<StdioTransport>, String> {
        let mut cmd = tokio::process::Command::new(&cfg.command);
        cmd.args(&cfg.args)
            .envs(cfg.env.iter().map(|(k, v)| (k, v)))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if !cfg.cwd.is_empty() {
            cmd.current_dir(&cfg.cwd);
        }
        // its own process group, so that closing it also ends what it started
        #[cfg(unix)]
        cmd.process_group(0);
        let mut child = cmd.spawn().map_err(|e| {
            tracing::warn!("MCP '{}': failed to spawn '{}': {e}", cfg.name, cfg.command);
            format!("failed to spawn '{}': {e}", cfg.command)
        })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let alive = Arc::new(AtomicBool::new(true));
        let queue = Arc::new(LineQueue::default());
        let err_tail = Arc::new(Mutex::new(String::new()));
        let mut tasks = Vec::new();
        if let Some(out) = stdout {
            let (q, a) = (queue.clone(), alive.clone());
            tasks.push(tokio::spawn(async move {
                pump_ndjson(out, |line| {
                    q.push(line);
                    true
                })
                .await;
                a.store(false, Ordering::SeqCst);
                q.close();
            }));
        } else {
            alive.store(false, Ordering::SeqCst);
            queue.close();
        }
        if let Some(err) = stderr {
            let (tail, name) = (err_tail.clone(), cfg.name.clone());
            tasks.push(tokio::spawn(async move {
                pump_ndjson(err, |line| {
                    tracing::debug!("MCP '{name}' stderr: {line}");
                    let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
                    t.push_str(&line);
                    t.push('\n');
                    if t.len() > ERR_TAIL_MAX {
                        let mut cut = t.len() - ERR_TAIL_MAX;
                        while !t.is_char_boundary(cut) {
                            cut += 1;
                        }
                        t.drain(..cut);
                    }
                    true
                })
                .await;
            }));
        }
        let pid = child.id();
        Ok(Arc::new(StdioTransport {
            name: cfg.name.clone(),
            timeout: Duration::from_millis(cfg.timeout_ms),
            alive,
            queue,
            err_tail,
            last_error: Mutex::new(String::new()),
            session: tokio::sync::Mutex::new(Session {
                stdin,
                next_id: 1,
                initialized: false,
                tools: None,
            }),
            child: Mutex::new(Some(child)),
            pid,
            tasks: Mutex::new(tasks),
        }))
    }

    /// Until its stdout closed, a write to it failed, it was closed, or the process
    /// exited.
    pub fn is_alive(&self) -> bool {
        if !self.alive.load(Ordering::SeqCst) {
            return false;
        }
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match child.as_mut().map(|c| c.try_wait()) {
            Some(Ok(None)) => true,
            _ => {
                self.alive.store(false, Ordering::SeqCst);
                false
            }
        }
    }

    /// The last RPC error and the tail of its stderr, for logs.
    pub fn diagnostics(&self) -> String {
        let mut out = self
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let tail = self.err_tail.lock().unwrap_or_else(|e| e.into_inner());
        if !tail.is_empty() {
            if !out.is_empty() {
                out.push_str("; ");
            }
            out.push_str("last stderr: ");
            out.push_str(&tail);
        }
        out
    }

    fn set_last_error(&self, msg: String) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = msg;
    }

    /// Kills the server (and its process group) and stops the pumps; idempotent, never
    /// blocks (a grandchild holding the pipes open cannot stall it).
    pub fn close(&self) {
        self.alive.store(false, Ordering::SeqCst);
        self.queue.close();
        if let Some(mut child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            #[cfg(unix)]
            if let Some(pid) = self.pid
                && let Ok(pid) = libc::pid_t::try_from(pid)
                && pid > 0
                && matches!(child.try_wait(), Ok(None))
            {
                // SAFETY: no memory-safety preconditions; `pid` leads the group of a
                // child that has not been reaped (try_wait just said it runs).
                unsafe {
                    libc::killpg(pid, libc::SIGKILL);
                }
            }
            let _ = child.start_kill();
            // dropping the child lets tokio reap it in the background
        }
        for t in self
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            t.abort();
        }
    }

    async fn write_line(
        &self,
        stdin: &mut ChildStdin,
        msg: &Value,
        deadline: Instant,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), RpcFail> {
        let mut line = msg.to_string();
        line.push('\n');
        let write = async {
            stdin.write_all(line.as_bytes()).await?;
            stdin.flush().await
        };
        tokio::select! {
            r = write => r.map_err(|_| {
                self.alive.store(false, Ordering::SeqCst);
                RpcFail::NotSent
            }),
            _ = tokio::time::sleep_until(deadline) => Err(RpcFail::Message("request timed out")),
            _ = cancelled(stop) => Err(RpcFail::Message("cancelled")),
        }
    }

    /// How long the handshake and `tools/list` may take: the server's timeout, but at
    /// least [`MCP_HANDSHAKE_MIN_TIMEOUT`] (a server started through `npx` or `uvx`
    /// can take seconds to come up; llama.cpp applies `timeout_ms` here too, so such a
    /// server with a short call timeout never lists its tools).
    fn handshake_timeout(&self) -> Duration {
        self.timeout.max(MCP_HANDSHAKE_MIN_TIMEOUT)
    }

    /// Sends one request and waits for the reply with its id, skipping notifications,
    /// malformed lines and stale replies; the deadline is `timeout` from now (or `cap`,
    /// if sooner).
    async fn send_rpc(
        &self,
        s: &mut Session,
        request: Value,
        timeout: Duration,
        cap: Option<Instant>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Value, RpcFail> {
        let mut deadline = Instant::now() + timeout;
        if let Some(cap) = cap {
            deadline = deadline.min(cap);
        }
        let id = request.get("id").and_then(Value::as_u64);
        let Some(stdin) = s.stdin.as_mut() else {
            return Err(RpcFail::NotSent);
        };
        if !self.is_alive() {
            return Err(RpcFail::NotSent);
        }
        self.write_line(stdin, &request, deadline, stop).await?;
        let Some(id) = id else {
            return Ok(Value::Null);
        };
        loop {
            match self.queue.pop(deadline, stop).await {
                Pop::Line(frame) => {
                    let past = Instant::now() >= deadline;
                    let Ok(reply) = serde_json::from_str::<Value>(&frame) else {
                        if past {
                            return Err(RpcFail::Message("request timed out"));
                        }
                        continue; // skip a malformed line
                    };
                    if let Some(method) = reply.get("method") {
                        // a request from the server: answer so it never waits on us
                        if let Some(req_id) = reply.get("id").filter(|v| !v.is_null()) {
                            let answer = if method.as_str() == Some("ping") {
                                json!({"jsonrpc": "2.0", "id": req_id, "result": {}})
                            } else {
                                json!({"jsonrpc": "2.0", "id": req_id,
                                       "error": {"code": -32601, "message": "Method not found"}})
                            };
                            if let Some(stdin) = s.stdin.as_mut() {
                                let _ = self.write_line(stdin, &answer, deadline, stop).await;
                            }
                        }
                    } else if id_matches(reply.get("id"), id) {
                        return Ok(reply);
                    }
                    // a notification, or the stale reply of a timed-out request
                    if past {
                        return Err(RpcFail::Message("request timed out"));
                    }
                }
                // closed by a shutdown: say so, as llama.cpp checks the stop flag first
                Pop::Closed if *stop.borrow() => return Err(RpcFail::Message("cancelled")),
                Pop::Closed => return Err(RpcFail::Message("transport closed")),
                Pop::TimedOut => return Err(RpcFail::Message("request timed out")),
                Pop::Cancelled => return Err(RpcFail::Message("cancelled")),
            }
        }
    }

    /// The `initialize` handshake, once per process.
    async fn ensure_init(
        &self,
        s: &mut Session,
        cap: Option<Instant>,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), RpcFail> {
        if s.initialized {
            return Ok(());
        }
        let id = s.next_id;
        s.next_id += 1;
        let req = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "initialize",
            "params": {
                "protocolVersion": MCP_PROTOCOL_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "lamina", "version": env!("CARGO_PKG_VERSION")},
            },
        });
        let resp = match self
            .send_rpc(s, req, self.handshake_timeout(), cap, stop)
            .await
        {
            Ok(r) if r.get("result").is_some() => r,
            Ok(r) => {
                self.set_last_error(format!("initialize failed: {}", rpc_error_message(&r)));
                return Err(RpcFail::Message("initialize failed"));
            }
            Err(RpcFail::Message(m)) => {
                self.set_last_error(format!("initialize failed: {m}"));
                return Err(RpcFail::Message("initialize failed"));
            }
            Err(RpcFail::NotSent) => {
                self.set_last_error("initialize failed: transport closed".into());
                return Err(RpcFail::NotSent);
            }
        };
        drop(resp);
        // no id, no reply expected
        let notif = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let _ = self
            .send_rpc(s, notif, self.handshake_timeout(), cap, stop)
            .await;
        s.initialized = true;
        Ok(())
    }

    async fn lock_session(
        &self,
        stop: &mut watch::Receiver<bool>,
    ) -> Option<tokio::sync::MutexGuard<'_, Session>> {
        tokio::select! {
            g = self.session.lock() => Some(g),
            _ = cancelled(stop) => None,
        }
    }

    /// `tools/list` (cached per process); empty on any failure.
    pub async fn list_tools(
        &self,
        cap: Option<Instant>,
        stop: &mut watch::Receiver<bool>,
    ) -> Vec<McpToolDef> {
        let Some(mut s) = self.lock_session(stop).await else {
            return Vec::new();
        };
        if self.ensure_init(&mut s, cap, stop).await.is_err() {
            return Vec::new();
        }
        if let Some(tools) = &s.tools {
            return tools.clone();
        }
        let id = s.next_id;
        s.next_id += 1;
        let req = json!({"jsonrpc": "2.0", "id": id, "method": "tools/list"});
        let resp = match self
            .send_rpc(&mut s, req, self.handshake_timeout(), cap, stop)
            .await
        {
            Ok(r) => r,
            Err(RpcFail::Message(m)) => {
                self.set_last_error(format!("tools/list failed: {m}"));
                return Vec::new();
            }
            Err(RpcFail::NotSent) => {
                self.set_last_error("tools/list failed: transport closed".into());
                return Vec::new();
            }
        };
        let Some(result) = resp.get("result") else {
            self.set_last_error(format!("tools/list failed: {}", rpc_error_message(&resp)));
            return Vec::new();
        };
        let mut tools = Vec::new();
        if let Some(Value::Array(list)) = result.get("tools") {
            for t in list {
                let name = t.get("name").and_then(Value::as_str).unwrap_or("");
                if name.is_empty() {
                    continue;
                }
                tools.push(McpToolDef {
                    server_name: self.name.clone(),
                    name: name.to_string(),
                    description: t
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    input_schema: t.get("inputSchema").cloned().unwrap_or(Value::Null),
                });
            }
        }
        s.tools = Some(tools.clone());
        tools
    }

    /// `tools/call`: the `/tools` answer, or `Err(NotSent)` when the request never
    /// reached the process (the caller may retry on a fresh one).
    async fn call_tool(
        &self,
        tool: &str,
        arguments: &Value,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<Value, RpcFail> {
        let Some(mut s) = self.lock_session(stop).await else {
            return Ok(json!({"error": "cancelled"}));
        };
        match self.ensure_init(&mut s, None, stop).await {
            Ok(()) => {}
            Err(RpcFail::NotSent) => return Err(RpcFail::NotSent),
            Err(RpcFail::Message(_)) => {
                let e = self
                    .last_error
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                return Ok(json!({ "error": e }));
            }
        }
        let id = s.next_id;
        s.next_id += 1;
        let req = json!({
            "jsonrpc": "2.0",
            "id": id,
            "method": "tools/call",
            "params": {"name": tool, "arguments": arguments},
        });
        match self.send_rpc(&mut s, req, self.timeout, None, stop).await {
            Err(RpcFail::NotSent) => Err(RpcFail::NotSent),
            Err(RpcFail::Message(m)) => {
                self.set_last_error(m.to_string());
                Ok(json!({ "error": m }))
            }
            Ok(resp) => {
                if resp.get("error").is_some() {
                    Ok(json!({ "error": rpc_error_message(&resp) }))
                } else if let Some(result) = resp.get("result") {
                    Ok(mcp_result_to_response(result))
                } else {
                    Ok(json!({"error": "invalid response from MCP server"}))
                }
            }
        }
    }
}

impl Drop for StdioTransport {
    fn drop(&mut self) {
        self.close();
    }
}

// ---------------------------------------------------------------------------------------
// the manager
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct McpState {
    transports: HashMap<String, Arc<StdioTransport>>,
    /// Spawn-failure cool-down.
    dead: HashMap<String, std::time::Instant>,
}

/// Every configured MCP server.
pub(crate) struct McpManager {
    configs: Vec<McpServerConfig>,
    registry: Vec<McpToolDef>,
    state: Mutex<McpState>,
    stop_tx: watch::Sender<bool>,
}

impl McpManager {
    /// Spawns each server once, lists its tools (at most 10 s each, all servers at the
    /// same time) and stops it. A server that fails contributes no tools.
    pub async fn start(configs: Vec<McpServerConfig>) -> McpManager {
        let (stop_tx, _) = watch::channel(false);
        let mut warmups = Vec::new();
        for cfg in &configs {
            let mut stop = stop_tx.subscribe();
            warmups.push(async move {
                let t = match StdioTransport::spawn(cfg) {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::warn!("MCP warmup: failed to spawn '{}': {e}", cfg.name);
                        return Vec::new();
                    }
                };
                let cap = Instant::now() + MCP_WARMUP_TIMEOUT;
                let tools = t.list_tools(Some(cap), &mut stop).await;
                if tools.is_empty() && !t.diagnostics().is_empty() {
                    tracing::warn!("MCP warmup: '{}': {}", cfg.name, t.diagnostics());
                }
                tracing::info!(
                    "MCP warmup: '{}' discovered {} tools",
                    cfg.name,
                    tools.len()
                );
                t.close();
                tools
            });
        }
        let registry = futures_util::future::join_all(warmups)
            .await
            .into_iter()
            .flatten()
            .collect();
        McpManager {
            configs,
            registry,
            state: Mutex::new(McpState::default()),
            stop_tx,
        }
    }

    /// The tools found at warm-up.
    pub fn tools(&self) -> &[McpToolDef] {
        &self.registry
    }

    /// The running transport of `name`, respawned when it died; `None` during the
    /// cool-down after a failed spawn, at shutdown, or for an unknown name.
    fn get_or_create(&self, name: &str) -> Option<Arc<StdioTransport>> {
        let mut to_close = Vec::new();
        let result = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if *self.stop_tx.borrow() {
                return None;
            }
            let now = std::time::Instant::now();
            if let Some(until) = st.dead.get(name) {
                if now < *until {
                    return None;
                }
                st.dead.remove(name);
            }
            if let Some(t) = st.transports.get(name) {
                if t.is_alive() {
                    return Some(t.clone());
                }
                tracing::warn!("MCP '{name}' is no longer alive: {}", t.diagnostics());
                if let Some(t) = st.transports.remove(name) {
                    to_close.push(t);
                }
            }
            match self.configs.iter().find(|c| c.name == name) {
                None => None,
                Some(cfg) => match StdioTransport::spawn(cfg) {
                    Ok(t) if t.is_alive() => {
                        st.transports.insert(name.to_string(), t.clone());
                        Some(t)
                    }
                    Ok(t) => {
                        tracing::warn!("MCP '{name}': failed to start: {}", t.diagnostics());
                        to_close.push(t);
                        st.dead.insert(name.to_string(), now + MCP_COOLDOWN);
                        None
                    }
                    Err(e) => {
                        tracing::warn!("MCP '{name}': failed to start: {e}");
                        st.dead.insert(name.to_string(), now + MCP_COOLDOWN);
                        None
                    }
                },
            }
        };
        for t in to_close {
            t.close();
        }
        result
    }

    /// Calls `tool` of `server`: the `/tools` answer (`plain_text_response` or `error`).
    pub async fn call_tool(&self, server: &str, tool: &str, arguments: &Value) -> Value {
        let mut stop = self.stop_tx.subscribe();
        // one retry when the request never reached the process: it died since the last
        // call and its reader has not noticed yet
        for attempt in 0..2 {
            let Some(t) = self.get_or_create(server) else {
                return json!({ "error": format!("MCP server unavailable: {server}") });
            };
            match t.call_tool(tool, arguments, &mut stop).await {
                Ok(v) => return v,
                Err(_) if *stop.borrow() => return json!({"error": "cancelled"}),
                Err(_) if attempt == 0 => {
                    tracing::warn!("MCP '{server}': transport closed, respawning");
                    t.close();
                }
                Err(_) => break,
            }
        }
        json!({"error": "transport closed"})
    }

    /// Cancels the calls in flight (they answer `{"error": "cancelled"}`), refuses new
    /// ones and stops every server. Idempotent.
    pub fn shutdown(&self) {
        self.stop_tx.send_replace(true);
        let transports: Vec<_> = {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            st.transports.drain().map(|(_, t)| t).collect()
        };
        for t in transports {
            t.close();
        }
    }
}

impl Drop for McpManager {
    fn drop(&mut self) {
        self.shutdown();
    }
}
