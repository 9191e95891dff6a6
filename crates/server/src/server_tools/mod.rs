//! llama-server's "server tools" and MCP servers (llama.cpp `tools/server/server-tools.cpp`
//! and `server-mcp.cpp`), behind `GET /tools` and `POST /tools`.
//!
//! - **Built-in tools** (`--tools all` or `--tools read_file,grep_search,...`):
//!   `read_file`, `file_glob_search`, `grep_search`, `exec_shell_command`, `write_file`,
//!   `edit_file`, `get_info`. They are meant for the web UI's agent loop: the UI gets the
//!   definitions from `GET /tools`, hands them to the model, and runs each call the model
//!   makes through `POST /tools` (llama.cpp's chat endpoints never call them themselves).
//! - **MCP servers** (`--mcp-servers-config FILE`, `--mcp-servers-json JSON`, the
//!   Cursor-compatible `{"mcpServers": {"name": {"command", "args", "env", "cwd",
//!   "timeout_ms"}}}`): each server is spawned at start to list its tools, stopped, and
//!   respawned on demand; its tools appear as `<server>_<tool>` (see `mcp.rs`).
//! - **Runtimes**: `--tools-runtime` or the per-request `x-tool-runtime` header runs the
//!   built-in tools inside an isolate instead of on the host: `docker-container:<id>`,
//!   `podman-container:<id>` (an existing container), `ssh:<target>` (a remote POSIX
//!   host), and for `--tools-runtime` only `docker:<image>` / `podman:<image>` (a
//!   container spawned at start and removed at exit). `x-tool-cwd` sets the working
//!   directory of one call; `x-resp-type: base64` makes `read_file` answer the raw bytes.
//!
//! # Security
//!
//! These tools give whoever can reach `POST /tools` the server's own rights: reading and
//! writing files, and with `exec_shell_command` running any command. llama.cpp marks
//! them "do not enable in untrusted environments", and so does Lamina. What this module
//! does about it:
//!
//! - **Off by default.** Without `--tools` and MCP servers, `/tools` answers 403
//!   ([`ServerTools::disabled`]). When they are on, the CLI must default
//!   `--cors-origins` to `localhost` unless the user gave one
//!   ([`ToolsConfig::restricts_cors`]), so that a web page cannot drive them.
//! - **Working-directory sandbox** ([`ToolsConfig::sandbox`], a Lamina addition): when
//!   set, every path a host file tool touches (`read_file`, `write_file`, `edit_file`,
//!   the base of `file_glob_search` and `grep_search`, every file `grep_search` reads)
//!   and the working directory itself (`x-tool-cwd`, also the directory
//!   `exec_shell_command` and `get_info` run in) must resolve inside the sandbox root:
//!   `..` is resolved lexically first, then every symbolic link of the longest existing
//!   prefix, and a path outside the root, absolute or not, a link pointing out, or a
//!   dangling link is refused with a tool-level `{"error": "access denied: ..."}`.
//!   Relative paths resolve against the working directory, which defaults to the root.
//!   Limits, stated plainly: this is a path check, not an OS sandbox (a file swapped
//!   for a link between the check and the open is not caught), and it cannot confine
//!   what a shell command does once it runs — enable `exec_shell_command` only where
//!   running arbitrary commands is acceptable, or use an isolate runtime. Without a
//!   sandbox (llama.cpp's behaviour, and what llama.cpp's tests expect) paths go
//!   anywhere the server user can reach.
//! - **No option injection through the runtime headers.** An `ssh:` target must match
//!   `[A-Za-z0-9._@-]+` and must not start with `-` (`ssh:-oProxyCommand=...` would run
//!   a command on the host); a container id must start with a letter or digit and match
//!   `[A-Za-z0-9._-]+` (`docker-container:--privileged`); the spawn form
//!   `docker:<image>` is refused in a header; unknown schemes are refused, never run on
//!   the host instead. Commands are built as argument vectors, never through a host
//!   shell; what goes over ssh is quoted for the remote shell word by word.
//! - **Bounded everything.** Outputs are capped as in llama.cpp (`read_file` 16 KB,
//!   base64 reads 32 MB, `exec_shell_command` 16 KB and 60 s, listings 8 MB and 15 s,
//!   100 glob results, 100 grep matches, MCP lines 8 MB) plus caps llama.cpp lacks (grep
//!   answers 1 MB, files read by grep/edit 64 MB, walks 200 000 entries, glob patterns
//!   1 KB, MCP queues 64 MB, the config file 16 MB). Child processes run in their own
//!   process group, killed as a whole at a timeout, when the client goes away or when
//!   the call is dropped, so a backgrounded grandchild cannot hold a call open. Regular
//!   expressions use the `regex` crate (linear time). Nothing here panics on input.
//! - **git** (used to list files honouring .gitignore) runs with `core.fsmonitor`
//!   off, so a repository's config cannot make a listing start a program.
//!
//! # Differences from llama.cpp
//!
//! Beyond the extra bounds above and the sandbox: glob `**/` also matches zero
//! directories and a leading `/` anchors at the search base (see `glob.rs`); regular
//! expressions are Rust's (no backreferences or look-around; ECMAScript's had them);
//! `git ls-files` is read with `-z`; MCP tools get the client's `params` untouched
//! (llama.cpp also passes them the `cwd`/`runtime`/`resp_type` it injects); an MCP
//! server's `timeout_ms` bounds `tools/call`, while the handshake and `tools/list` get at
//! least 10 s (llama.cpp applies `timeout_ms` to them too, so a slow-starting server with
//! a short timeout never lists its tools); requests from an MCP server (`ping`, ...) get
//! an answer; a call whose request could not even be written to a server that just died
//! is retried once on a fresh process; the MCP client identifies as `lamina`; warm-up
//! runs the servers in parallel; the walker lists entries in name order.

mod builtin;
mod glob;
mod io;
mod mcp;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use builtin::{Builtin, CallCtx, key_not_found, type_name};
use io::{ChunkSink, HostSettings, Sandbox, ToolsRuntime};

/// The names `--tools` accepts (besides `all`), in listing order.
pub const BUILTIN_TOOL_NAMES: [&str; 7] = [
    "read_file",
    "file_glob_search",
    "grep_search",
    "exec_shell_command",
    "write_file",
    "edit_file",
    "get_info",
];

/// What `lamina serve` was asked for.
#[derive(Clone, Debug, Default)]
pub struct ToolsConfig {
    /// `--tools`: built-in tool names, or `all` ([`ToolsConfig::parse_tools_list`]
    /// splits the flag). Empty: no built-in tools.
    pub builtin: Vec<String>,
    /// `--tools-runtime` (`None` or empty: the host).
    pub runtime: Option<String>,
    /// `--mcp-servers-config`.
    pub mcp_config: Option<PathBuf>,
    /// `--mcp-servers-json`.
    pub mcp_json: Option<String>,
    /// Working directory of calls without `x-tool-cwd` (`None`: the process's, or the
    /// sandbox root when there is one).
    pub cwd: Option<PathBuf>,
    /// Confines the host file tools to this directory tree (a Lamina addition; `None`:
    /// llama.cpp's unconfined behaviour). See the module doc.
    pub sandbox: Option<PathBuf>,
}

impl ToolsConfig {
    /// Splits `--tools` as llama.cpp's `parse_csv_row`: on commas, `"..."` quoting a
    /// field (`""` inside is one quote); fields are not trimmed.
    pub fn parse_tools_list(value: &str) -> Vec<String> {
        let mut fields = Vec::new();
        let mut field = String::new();
        let mut in_quotes = false;
        let mut chars = value.chars().peekable();
        while let Some(ch) = chars.next() {
            match ch {
                '"' if !in_quotes => {
                    if field.is_empty() {
                        in_quotes = true;
                    } else {
                        field.push('"');
                    }
                }
                '"' => {
                    if chars.peek() == Some(&'"') {
                        field.push('"');
                        chars.next();
                    } else {
                        in_quotes = false;
                    }
                }
                ',' if !in_quotes => fields.push(std::mem::take(&mut field)),
                c => field.push(c),
            }
        }
        fields.push(field);
        fields
    }

    /// An MCP configuration was given (file or inline, non-empty).
    pub fn mcp_configured(&self) -> bool {
        self.mcp_config
            .as_ref()
            .is_some_and(|p| !p.as_os_str().is_empty())
            || self.mcp_json.as_ref().is_some_and(|j| !j.is_empty())
    }

    /// llama.cpp's rule: with built-in tools or MCP servers, `--cors-origins` defaults
    /// to `localhost` (the CLI applies it when `--cors-origins` was not given, and warns
    /// "server tools or MCP servers are enabled, using localhost as default CORS origin
    /// (change via --cors-origins)").
    pub fn restricts_cors(&self) -> bool {
        !self.builtin.is_empty() || self.mcp_configured()
    }
}

/// Why [`ServerTools::start`] failed; the server must not start (llama.cpp exits 1).
/// The message is llama.cpp's, e.g. `MCP starting failed: failed to open MCP config
/// file: /x.json` or `tools setup failed: unknown tool "x". available tools: ...`.
#[derive(Debug, thiserror::Error)]
pub enum ToolsError {
    /// Reading or parsing the MCP configuration.
    #[error("MCP starting failed: {0}")]
    Mcp(String),
    /// An unknown `--tools` name, a bad `--tools-runtime`, a container that did not
    /// start, a sandbox directory that does not exist.
    #[error("tools setup failed: {0}")]
    Setup(String),
}

/// A request-level failure of one call (as opposed to a tool-level `{"error": ...}`).
#[derive(Debug)]
pub(crate) enum ToolFail {
    /// HTTP 400 `invalid_request_error` (malformed body, missing or mistyped parameter).
    BadRequest(String),
    /// HTTP 500 `server_error` (bad runtime, ...).
    Server(String),
}

pub(crate) type ToolResult = Result<Value, ToolFail>;

/// An MCP tool as listed.
#[derive(Debug)]
struct McpTool {
    name: String,
    def: mcp::McpToolDef,
}

impl McpTool {
    fn definition(&self) -> Value {
        let schema = match &self.def.input_schema {
            Value::Object(_) => self.def.input_schema.clone(),
            _ => json!({}),
        };
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.def.description,
                "parameters": schema,
            },
        })
    }

    fn to_json(&self) -> Value {
        json!({
            "display_name": self.name,
            "tool": self.name,
            "type": "mcp",
            "permissions": {"write": false},
            "uses_cwd": false,
            "definition": self.definition(),
        })
    }
}

struct Inner {
    enabled: bool,
    builtins: Vec<Builtin>,
    mcp_tools: Vec<McpTool>,
    mcp: Option<mcp::McpManager>,
    runtime: Option<ToolsRuntime>,
    host: HostSettings,
}

/// The tools of one server: cheap to clone (shared), `Send + Sync`.
#[derive(Clone)]
pub struct ServerTools {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ServerTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTools")
            .field("enabled", &self.inner.enabled)
            .field("tools", &self.tool_names())
            .finish()
    }
}

/// The answer to `GET /tools` or `POST /tools`; implements [`IntoResponse`].
#[derive(Debug)]
pub struct ToolsResponse {
    pub status: StatusCode,
    pub body: ToolsBody,
}

/// A [`ToolsResponse`] body.
#[derive(Debug)]
pub enum ToolsBody {
    /// A JSON document (`application/json`).
    Json(Value),
    /// Server-sent events, one `data: <json>` per value: `{"chunk": "..."}` while the
    /// tool runs, then `{"done": true}` (with `"error"` when it failed). Dropping the
    /// receiver (the client went away) kills the running command.
    Events(mpsc::Receiver<Value>),
}

impl ToolsResponse {
    fn json(status: StatusCode, body: Value) -> ToolsResponse {
        ToolsResponse {
            status,
            body: ToolsBody::Json(body),
        }
    }

    /// llama.cpp's `format_error_response` object, unwrapped as `/tools` sends it:
    /// `{"code", "message", "type"}`.
    fn error(status: StatusCode, code: u16, kind: &str, message: String) -> ToolsResponse {
        ToolsResponse::json(
            status,
            json!({"code": code, "message": message, "type": kind}),
        )
    }

    fn bad_request(message: String) -> ToolsResponse {
        ToolsResponse::error(
            StatusCode::BAD_REQUEST,
            400,
            "invalid_request_error",
            message,
        )
    }

    /// Unknown tool / no streaming: HTTP 404 with an `invalid_request_error` body
    /// (code 400), as llama.cpp.
    fn not_found(message: String) -> ToolsResponse {
        ToolsResponse::error(StatusCode::NOT_FOUND, 400, "invalid_request_error", message)
    }

    fn server_error(message: String) -> ToolsResponse {
        ToolsResponse::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            500,
            "server_error",
            message,
        )
    }

    /// The JSON body, if this is not a stream (handy in tests).
    pub fn json_body(&self) -> Option<&Value> {
        match &self.body {
            ToolsBody::Json(v) => Some(v),
            ToolsBody::Events(_) => None,
        }
    }
}

impl IntoResponse for ToolsResponse {
    fn into_response(self) -> Response {
        match self.body {
            ToolsBody::Json(v) => (self.status, axum::Json(v)).into_response(),
            ToolsBody::Events(rx) => {
                let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                    let v = rx.recv().await?;
                    let ev = axum::response::sse::Event::default().data(v.to_string());
                    Some((Ok::<_, std::convert::Infallible>(ev), rx))
                });
                (self.status, axum::response::sse::Sse::new(stream)).into_response()
            }
        }
    }
}

/// A header as text (lossy), empty when absent.
fn header(headers: &HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .unwrap_or_default()
}

enum Found<'a> {
    Builtin(Builtin),
    Mcp(&'a McpTool),
}

impl ServerTools {
    /// Tools off: `/tools` answers 403 `{"error": {"message": "this feature is
    /// disabled", "type": "feature_disabled"}}`, as llama-server without `--tools`.
    pub fn disabled() -> ServerTools {
        ServerTools {
            inner: Arc::new(Inner {
                enabled: false,
                builtins: Vec::new(),
                mcp_tools: Vec::new(),
                mcp: None,
                runtime: None,
                host: HostSettings::default(),
            }),
        }
    }

    /// Validates the configuration and sets everything up: reads the MCP configuration
    /// (an unreadable file or invalid JSON is an error), checks the `--tools` names and
    /// `--tools-runtime` (spawning its container for `docker:<image>`), then warms up
    /// every MCP server to list its tools. A server that cannot be spawned or does not
    /// answer is logged and contributes no tools; it never fails the start. With neither
    /// built-in tools nor MCP servers configured this is [`ServerTools::disabled`]
    /// (`--tools-runtime` alone is ignored, as in llama.cpp).
    pub async fn start(cfg: ToolsConfig) -> Result<ServerTools, ToolsError> {
        let configs = if cfg.mcp_configured() {
            mcp::load_configs(
                cfg.mcp_config
                    .as_deref()
                    .filter(|p| !p.as_os_str().is_empty()),
                cfg.mcp_json.as_deref().filter(|j| !j.is_empty()),
            )
            .map_err(ToolsError::Mcp)?
        } else {
            Vec::new()
        };
        if cfg.builtin.is_empty() && configs.is_empty() {
            return Ok(ServerTools::disabled());
        }

        for name in &cfg.builtin {
            if name != "all" && !BUILTIN_TOOL_NAMES.contains(&name.as_str()) {
                return Err(ToolsError::Setup(format!(
                    "unknown tool \"{name}\". available tools: {}",
                    BUILTIN_TOOL_NAMES.join(", ")
                )));
            }
        }
        let all = cfg.builtin.iter().any(|n| n == "all");
        let builtins: Vec<Builtin> = Builtin::ALL
            .into_iter()
            .filter(|b| all || cfg.builtin.iter().any(|n| n == b.name()))
            .collect();

        let sandbox = match &cfg.sandbox {
            Some(dir) => Some(Arc::new(Sandbox::new(dir).map_err(ToolsError::Setup)?)),
            None => None,
        };
        let default_cwd = match &cfg.cwd {
            Some(c) => {
                let abs = if c.is_absolute() {
                    c.clone()
                } else {
                    std::env::current_dir()
                        .map_err(|e| ToolsError::Setup(format!("working directory: {e}")))?
                        .join(c)
                };
                Some(io::lexically_normal(&abs))
            }
            None => None,
        };
        let host = HostSettings {
            default_cwd,
            sandbox,
        };
        // a default cwd outside the sandbox would refuse every call: say so now
        io::HostIo::new("", &host).map_err(ToolsError::Setup)?;

        let runtime = match cfg.runtime.as_deref().filter(|r| !r.is_empty()) {
            Some(spec) => Some(ToolsRuntime::start(spec).await.map_err(ToolsError::Setup)?),
            None => None,
        };

        let mut mcp_tools = Vec::new();
        let mcp = if configs.is_empty() {
            None
        } else {
            let mgr = mcp::McpManager::start(configs).await;
            let mut seen: Vec<String> = builtins.iter().map(|b| b.name().to_string()).collect();
            for def in mgr.tools() {
                let name = format!("{}_{}", def.server_name, def.name);
                if seen.contains(&name) {
                    tracing::warn!(
                        "MCP tool \"{name}\" from server \"{}\" collides with an existing tool, skipping",
                        def.server_name
                    );
                    continue;
                }
                seen.push(name.clone());
                mcp_tools.push(McpTool {
                    name,
                    def: def.clone(),
                });
            }
            if !mcp_tools.is_empty() {
                tracing::info!("Added {} MCP tools", mcp_tools.len());
            }
            Some(mgr)
        };

        Ok(ServerTools {
            inner: Arc::new(Inner {
                enabled: true,
                builtins,
                mcp_tools,
                mcp,
                runtime,
                host,
            }),
        })
    }

    /// `/tools` is served (built-in tools or MCP servers configured). When false, both
    /// routes answer 403 (which [`ServerTools::list`] and [`ServerTools::call`] do).
    pub fn enabled(&self) -> bool {
        self.inner.enabled
    }

    /// The names of the tools, in listing order.
    pub fn tool_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .inner
            .builtins
            .iter()
            .map(|b| b.name().to_string())
            .collect();
        names.extend(self.inner.mcp_tools.iter().map(|t| t.name.clone()));
        names
    }

    fn disabled_response() -> ToolsResponse {
        ToolsResponse::json(
            StatusCode::FORBIDDEN,
            json!({"error": {"message": "this feature is disabled", "type": "feature_disabled"}}),
        )
    }

    /// `GET /tools`: 200 with an array of `{"display_name", "tool", "type" ("server" or
    /// "mcp"), "permissions": {"write"}, "uses_cwd", "definition"}` (403 when disabled).
    pub fn list(&self) -> ToolsResponse {
        if !self.inner.enabled {
            return Self::disabled_response();
        }
        let mut out: Vec<Value> = self.inner.builtins.iter().map(|b| b.to_json()).collect();
        out.extend(self.inner.mcp_tools.iter().map(McpTool::to_json));
        ToolsResponse::json(StatusCode::OK, Value::Array(out))
    }

    /// The OpenAI-style definitions (`{"type": "function", "function": {...}}`) of every
    /// tool, as in `GET /tools`' `definition` fields. llama.cpp never offers them to the
    /// chat endpoints itself (its web UI does, from `GET /tools`); this is for callers
    /// that want to.
    pub fn openai_tools(&self) -> Vec<Value> {
        let mut out: Vec<Value> = self.inner.builtins.iter().map(|b| b.definition()).collect();
        out.extend(self.inner.mcp_tools.iter().map(McpTool::definition));
        out
    }

    fn find(&self, name: &str) -> Option<Found<'_>> {
        if let Some(b) = self.inner.builtins.iter().find(|b| b.name() == name) {
            return Some(Found::Builtin(*b));
        }
        self.inner
            .mcp_tools
            .iter()
            .find(|t| t.name == name)
            .map(Found::Mcp)
    }

    /// `POST /tools` with the raw request `body` (`{"tool": NAME, "params": {...},
    /// "stream": false}`) and its headers (`x-tool-cwd`, `x-tool-runtime`,
    /// `x-resp-type`). Answers:
    /// - 200 with the tool's answer: `{"plain_text_response": "..."}` (plus `entries` and
    ///   `base` for `file_glob_search`), `{"result": "...", ...}` for writes/edits,
    ///   `{"os", "cwd"}` for `get_info`, `{"base64", "size_bytes"}`, or a tool-level
    ///   `{"error": "..."}` (file not found, not unique, MCP errors and timeouts, ...);
    /// - 200 `text/event-stream` with `stream: true` (only `exec_shell_command`);
    /// - 400 `{"code": 400, "message", "type": "invalid_request_error"}` for a body that
    ///   is not JSON or lacks `tool`, or a missing/mistyped required parameter;
    /// - 404 (same body shape) for an unknown tool or `stream` on a tool without it;
    /// - 500 `{"code": 500, "message", "type": "server_error"}` for a bad runtime
    ///   (`unknown tool runtime: ...`, `invalid ssh target: ...`, `invalid container
    ///   id: ...`);
    /// - 403 when disabled.
    ///
    /// Dropping the future (client gone) kills a running command.
    pub async fn call(&self, body: &[u8], headers: &HeaderMap) -> ToolsResponse {
        if !self.inner.enabled {
            return Self::disabled_response();
        }
        let req: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => {
                return ToolsResponse::bad_request(format!(
                    "[json.exception.parse_error.101] parse error: {e}"
                ));
            }
        };
        let Value::Object(req) = req else {
            return ToolsResponse::bad_request(format!(
                "[json.exception.type_error.304] cannot use at() with {}",
                type_name(&req)
            ));
        };
        let tool_name = match req.get("tool") {
            Some(Value::String(s)) => s.clone(),
            Some(v) => {
                return ToolsResponse::bad_request(format!(
                    "[json.exception.type_error.302] type must be string, but is {}",
                    type_name(v)
                ));
            }
            None => {
                return match key_not_found("tool") {
                    ToolFail::BadRequest(m) | ToolFail::Server(m) => ToolsResponse::bad_request(m),
                };
            }
        };
        let params: Map<String, Value> = match req.get("params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(v) => {
                return ToolsResponse::bad_request(format!(
                    "[json.exception.type_error.304] cannot use at() with {}",
                    type_name(v)
                ));
            }
        };
        let stream = match req.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                return ToolsResponse::bad_request(format!(
                    "[json.exception.type_error.302] type must be boolean, but is {}",
                    type_name(v)
                ));
            }
        };

        let builtin = match self.find(&tool_name) {
            None => return ToolsResponse::not_found(format!("unknown tool \"{tool_name}\"")),
            Some(Found::Mcp(_)) if stream => {
                return ToolsResponse::not_found(format!(
                    "tool \"{tool_name}\" does not support stream = true"
                ));
            }
            Some(Found::Mcp(t)) => {
                let Some(mgr) = &self.inner.mcp else {
                    return ToolsResponse::server_error("MCP is not running".into());
                };
                let result = mgr
                    .call_tool(&t.def.server_name, &t.def.name, &Value::Object(params))
                    .await;
                return ToolsResponse::json(StatusCode::OK, result);
            }
            Some(Found::Builtin(b)) if stream && !b.support_stream() => {
                return ToolsResponse::not_found(format!(
                    "tool \"{tool_name}\" does not support stream = true"
                ));
            }
            Some(Found::Builtin(b)) => b,
        };

        // cwd / runtime / resp_type come from the headers (set by the client's runtime,
        // never by the model): values in the params are ignored
        let mut params = params;
        params.remove("cwd");
        params.remove("runtime");
        params.remove("resp_type");
        let cwd = header(headers, "x-tool-cwd");
        let mut runtime = header(headers, "x-tool-runtime");
        if runtime.is_empty()
            && let Some(rt) = &self.inner.runtime
        {
            match rt.spec().await {
                Ok(spec) => runtime = spec,
                Err(e) => return ToolsResponse::server_error(e),
            }
        }
        let resp_type = header(headers, "x-resp-type");

        if !stream {
            let ctx = CallCtx {
                cwd,
                runtime,
                resp_type,
                host: &self.inner.host,
            };
            return match builtin.invoke(&params, &ctx, None).await {
                Ok(v) => ToolsResponse::json(StatusCode::OK, v),
                Err(ToolFail::BadRequest(m)) => ToolsResponse::bad_request(m),
                Err(ToolFail::Server(m)) => {
                    tracing::error!("got exception: {m}");
                    ToolsResponse::server_error(m)
                }
            };
        }

        let (tx, rx) = mpsc::channel::<Value>(64);
        let this = self.clone();
        tokio::spawn(async move {
            let ctx = CallCtx {
                cwd,
                runtime,
                resp_type,
                host: &this.inner.host,
            };
            let mut sink = ChunkSink::new(tx.clone());
            let mut done = json!({"done": true});
            match builtin.invoke(&params, &ctx, Some(&mut sink)).await {
                Ok(Value::Object(m)) => {
                    if let Some(e) = m.get("error") {
                        done["error"] = e.clone();
                    }
                }
                Ok(_) => {}
                Err(ToolFail::BadRequest(m)) | Err(ToolFail::Server(m)) => {
                    done["error"] = Value::String(m);
                }
            }
            let _ = tx.send(done).await;
        });
        ToolsResponse {
            status: StatusCode::OK,
            body: ToolsBody::Events(rx),
        }
    }

    /// Call at server shutdown, before waiting for open connections: cancels MCP calls
    /// in flight (they answer `{"error": "cancelled"}` at once instead of running to
    /// their timeout), stops every MCP server, and stops the container spawned for
    /// `--tools-runtime <engine>:<image>` (closing its stdin; `--rm` removes it).
    /// Idempotent; later MCP calls answer "MCP server unavailable".
    pub async fn shutdown(&self) {
        if let Some(mgr) = &self.inner.mcp {
            mgr.shutdown();
        }
        if let Some(rt) = &self.inner.runtime {
            rt.stop().await;
        }
    }
}
