//! The seven built-in tools of llama.cpp's `server-tools.cpp`: `read_file`,
//! `file_glob_search`, `grep_search`, `exec_shell_command`, `write_file`, `edit_file`,
//! `get_info`, with their definitions (names, descriptions, parameter schemas), answers
//! and error messages as llama.cpp words them.

use std::path::PathBuf;

use serde_json::{Map, Value, json};

use super::glob::{MAX_PATTERN_LEN, path_glob_match};
use super::io::{
    ChunkSink, HostSettings, IoSetupError, ListKind, ToolsIo, blocking, host_read_file,
    path_to_string,
};
use super::{ToolFail, ToolResult};

/// The tool parameters of one call.
pub(crate) type Params = Map<String, Value>;

/// `read_file`: most bytes answered (and the largest file read whole without a range).
const READ_FILE_MAX_SIZE: usize = 16 * 1024;
/// `read_file` with `x-resp-type: base64`: largest file.
const READ_FILE_MAX_SIZE_BASE64: usize = 32 * 1024 * 1024;
/// `file_glob_search`: most results.
const FILE_SEARCH_MAX_RESULTS: i64 = 100;
/// `grep_search`: most matches.
const GREP_SEARCH_MAX_RESULTS: usize = 100;
/// `grep_search`: most bytes answered (not in llama.cpp).
const GREP_SEARCH_MAX_OUTPUT: usize = 1024 * 1024;
/// `grep_search` and `edit_file`: largest file read (not in llama.cpp, whose host reads
/// are unbounded; its isolate reads stop at the same 64 MB).
const MAX_FILE_READ: usize = super::io::ISOLATE_READ_FILE_MAX_SIZE;
/// `exec_shell_command`: output cap and longest timeout (seconds).
const EXEC_MAX_OUTPUT_SIZE: i64 = 16 * 1024;
const EXEC_MAX_TIMEOUT: i64 = 60;
/// `get_info`.
const GET_INFO_MAX_OUTPUT: usize = 4096;
const GET_INFO_TIMEOUT: u64 = 5;

/// What a call carries besides its parameters (from the request headers and the server
/// configuration, never from the model).
pub(crate) struct CallCtx<'a> {
    /// `x-tool-cwd` (empty: none).
    pub cwd: String,
    /// `x-tool-runtime`, else `--tools-runtime` (empty: the host).
    pub runtime: String,
    /// `x-resp-type` (only `read_file` reads it: `base64`).
    pub resp_type: String,
    pub host: &'a HostSettings,
}

/// A built-in tool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Builtin {
    ReadFile,
    FileGlobSearch,
    GrepSearch,
    ExecShellCommand,
    WriteFile,
    EditFile,
    GetInfo,
}

impl Builtin {
    /// In llama.cpp's `build_tools` order, which is the listing order.
    pub const ALL: [Builtin; 7] = [
        Builtin::ReadFile,
        Builtin::FileGlobSearch,
        Builtin::GrepSearch,
        Builtin::ExecShellCommand,
        Builtin::WriteFile,
        Builtin::EditFile,
        Builtin::GetInfo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "read_file",
            Builtin::FileGlobSearch => "file_glob_search",
            Builtin::GrepSearch => "grep_search",
            Builtin::ExecShellCommand => "exec_shell_command",
            Builtin::WriteFile => "write_file",
            Builtin::EditFile => "edit_file",
            Builtin::GetInfo => "get_info",
        }
    }

    pub fn display_name(self) -> &'static str {
        match self {
            Builtin::ReadFile => "Read file",
            Builtin::FileGlobSearch => "File search",
            Builtin::GrepSearch => "Grep search",
            Builtin::ExecShellCommand => "Execute shell command",
            Builtin::WriteFile => "Write file",
            Builtin::EditFile => "Edit file",
            Builtin::GetInfo => "Get Runtime Info",
        }
    }

    pub fn permission_write(self) -> bool {
        matches!(
            self,
            Builtin::ExecShellCommand | Builtin::WriteFile | Builtin::EditFile
        )
    }

    pub fn support_stream(self) -> bool {
        self == Builtin::ExecShellCommand
    }

    /// The OpenAI-style definition (`{"type":"function","function":{...}}`).
    pub fn definition(self) -> Value {
        let (description, properties, required): (String, Value, Option<Value>) = match self {
            Builtin::ReadFile => (
                "Read the contents of a file. Optionally specify a 1-based line range. \
                 If append_loc is true, each line is prefixed with its line number (e.g. \"1\u{2192}...\")."
                    .into(),
                json!({
                    "path":       {"type": "string",  "description": "Path to the file"},
                    "start_line": {"type": "integer", "description": "First line to read, 1-based (default: 1)"},
                    "end_line":   {"type": "integer", "description": "Last line to read, 1-based inclusive (default: end of file)"},
                    "append_loc": {"type": "boolean", "description": "Prefix each line with its line number"},
                }),
                Some(json!(["path"])),
            ),
            Builtin::FileGlobSearch => (
                "Recursively search for files matching a glob pattern under a directory. \
                 Automatically skips files ignored by .gitignore (when the directory is inside a git repo) \
                 and common junk directories (.git, node_modules, build, dist, etc.) otherwise. \
                 A pattern with no '/' (e.g. \"*.cpp\") matches the file's basename at any depth. \
                 A pattern containing '/' matches the full relative path; unless already anchored with \
                 \"**/\" or a leading '/', it is automatically prefixed with \"**/\". \
                 Use type=\"dir\" or \"all\" to also list directories; directory entries are suffixed with '/' in the output. \
                 Note: directory listings do not apply .gitignore filtering."
                    .into(),
                json!({
                    "path":      {"type": "string",  "description": "Base directory to search in"},
                    "include":   {"type": "string",  "description": "Glob pattern for files to include (e.g. \"*.cpp\" or \"src/**/*.cpp\"). Default: **"},
                    "exclude":   {"type": "string",  "description": "Glob pattern for files to exclude"},
                    "type":      {"type": "string",  "description": "Entry type to return: \"file\" (default), \"dir\" or \"all\""},
                    "max_depth": {"type": "integer", "description": "Maximum depth to descend into subdirectories (default: 0 = unlimited; 1 = direct children only)"},
                    "limit":     {"type": "integer", "description": format!(
                        "Maximum number of results to return, capped at {FILE_SEARCH_MAX_RESULTS} (default {FILE_SEARCH_MAX_RESULTS})")},
                }),
                Some(json!(["path"])),
            ),
            Builtin::GrepSearch => (
                "Search for a pattern in files under a path. Returns matching lines with file paths \
                 (and, unless searching a single file, paths relative to the given directory). \
                 Automatically skips files ignored by .gitignore (when the directory is inside a git repo) \
                 and common junk directories (.git, node_modules, build, dist, etc.) otherwise. \
                 include/exclude: a pattern with no '/' matches the basename at any depth; a pattern \
                 containing '/' matches the full relative path (auto-anchored with \"**/\" unless already anchored)."
                    .into(),
                json!({
                    "path":                {"type": "string",  "description": "File or directory to search in"},
                    "pattern":             {"type": "string",  "description": "Pattern to search for (regular expression unless literal is true)"},
                    "include":             {"type": "string",  "description": "Glob pattern to filter files (default: **)"},
                    "exclude":             {"type": "string",  "description": "Glob pattern to exclude files"},
                    "return_line_numbers": {"type": "boolean", "description": "If true, include line numbers in results"},
                    "literal":             {"type": "boolean", "description": "Treat pattern as a literal string instead of a regular expression (default: false)"},
                    "ignore_case":         {"type": "boolean", "description": "Case-insensitive search (default: false)"},
                    "context_lines":       {"type": "integer", "description": "Number of lines of context to show before and after each match (default: 0)"},
                }),
                Some(json!(["path", "pattern"])),
            ),
            Builtin::ExecShellCommand => (
                "Execute a shell command and return its output (stdout and stderr combined).".into(),
                json!({
                    "command":         {"type": "string",  "description": "Shell command to execute"},
                    "timeout":         {"type": "integer", "description": format!(
                        "Timeout in seconds (default 10, max {EXEC_MAX_TIMEOUT})")},
                    "max_output_size": {"type": "integer", "description": format!(
                        "Maximum output size in bytes (default {EXEC_MAX_OUTPUT_SIZE})")},
                }),
                Some(json!(["command"])),
            ),
            Builtin::WriteFile => (
                "Write content to a file, creating it (including parent directories) if it does not exist. \
                 May use with edit_file for more complex edits."
                    .into(),
                json!({
                    "path":    {"type": "string", "description": "Path of the file to write"},
                    "content": {"type": "string", "description": "Content to write"},
                }),
                Some(json!(["path", "content"])),
            ),
            Builtin::EditFile => (
                "Edit a file using exact text replacement. Each edits[].old_text must be unique in the file \
                 and is matched against the original content, not incrementally. Merge nearby changes into \
                 one edit instead of overlapping edits. Use write_file to replace the whole file."
                    .into(),
                json!({
                    "path":  {"type": "string", "description": "Path to the file to edit"},
                    "edits": {
                        "type": "array",
                        "description": "One or more exact text replacements to apply",
                        "items": {
                            "type": "object",
                            "properties": {
                                "old_text": {"type": "string", "description": "Exact text to find; must be unique in the file and must not overlap with other edits"},
                                "new_text": {"type": "string", "description": "Text to replace old_text with"},
                            },
                            "required": ["old_text", "new_text"],
                        },
                    },
                }),
                Some(json!(["path", "edits"])),
            ),
            Builtin::GetInfo => (
                "Returns runtime info: the OS name/version and the current working directory".into(),
                json!({}),
                None,
            ),
        };
        let mut parameters = json!({"type": "object", "properties": properties});
        if let Some(r) = required {
            parameters["required"] = r;
        }
        json!({
            "type": "function",
            "function": {
                "name": self.name(),
                "description": description,
                "parameters": parameters,
            },
        })
    }

    /// The `GET /tools` entry.
    pub fn to_json(self) -> Value {
        json!({
            "display_name": self.display_name(),
            "tool": self.name(),
            "type": "server",
            "permissions": {"write": self.permission_write()},
            "uses_cwd": true,
            "definition": self.definition(),
        })
    }

    /// Runs the tool. `Ok` is the answer (`{"error": ...}` included: a tool-level
    /// failure the model sees); `Err` is a request error (HTTP 400/500). With a `sink`
    /// (streaming, `exec_shell_command` only) the output goes there and `Ok(Null)` comes
    /// back.
    pub async fn invoke(
        self,
        p: &Params,
        ctx: &CallCtx<'_>,
        sink: Option<&mut ChunkSink>,
    ) -> ToolResult {
        match self {
            Builtin::ReadFile => read_file(p, ctx).await,
            Builtin::FileGlobSearch => file_glob_search(p, ctx).await,
            Builtin::GrepSearch => grep_search(p, ctx).await,
            Builtin::ExecShellCommand => exec_shell_command(p, ctx, sink).await,
            Builtin::WriteFile => write_file(p, ctx).await,
            Builtin::EditFile => edit_file(p, ctx).await,
            Builtin::GetInfo => get_info(p, ctx).await,
        }
    }
}

// ---------------------------------------------------------------------------------------
// parameters, with nlohmann::json's semantics and messages
// ---------------------------------------------------------------------------------------

pub(crate) fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

pub(crate) fn key_not_found(key: &str) -> ToolFail {
    ToolFail::BadRequest(format!(
        "[json.exception.out_of_range.403] key '{key}' not found"
    ))
}

fn must_be(kind: &str, v: &Value) -> ToolFail {
    ToolFail::BadRequest(format!(
        "[json.exception.type_error.302] type must be {kind}, but is {}",
        type_name(v)
    ))
}

/// `params.at(key).get<std::string>()`.
pub(crate) fn req_string(p: &Params, key: &str) -> Result<String, ToolFail> {
    match p.get(key) {
        None => Err(key_not_found(key)),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(must_be("string", v)),
    }
}

/// `json_value(params, key, default)` for strings: a missing, null or mistyped value
/// gives the default.
fn opt_string(p: &Params, key: &str, default: &str) -> String {
    match p.get(key) {
        Some(Value::String(s)) => s.clone(),
        _ => default.to_string(),
    }
}

/// `json_value(params, key, default)` for `int`: numbers convert (saturated to `int`),
/// booleans give 0/1, anything else the default.
fn opt_int(p: &Params, key: &str, default: i64) -> i64 {
    let v = match p.get(key) {
        Some(Value::Number(n)) => {
            if let Some(i) = n.as_i64() {
                i
            } else if n.as_u64().is_some() {
                i64::MAX
            } else {
                n.as_f64().map(|f| f as i64).unwrap_or(default)
            }
        }
        Some(Value::Bool(b)) => *b as i64,
        _ => default,
    };
    v.clamp(i32::MIN as i64, i32::MAX as i64)
}

fn opt_bool(p: &Params, key: &str, default: bool) -> bool {
    match p.get(key) {
        Some(Value::Bool(b)) => *b,
        _ => default,
    }
}

fn tool_error(msg: impl Into<String>) -> ToolResult {
    Ok(json!({ "error": msg.into() }))
}

/// llama.cpp's `make_tools_io`, with the sandbox refusal as a tool-level error.
macro_rules! io_or_return {
    ($ctx:expr) => {
        match ToolsIo::new(&$ctx.cwd, &$ctx.runtime, $ctx.host) {
            Ok(io) => io,
            Err(IoSetupError::Runtime(m)) => return Err(ToolFail::Server(m)),
            Err(IoSetupError::Sandbox(m)) => return tool_error(m),
        }
    };
}

macro_rules! confine_or_return {
    ($io:expr, $path:expr) => {
        match $io.confine($path) {
            Ok(p) => p,
            Err(m) => return tool_error(m),
        }
    };
}

/// `std::getline` over bytes: split on `\n`, no empty last line.
fn getlines(content: &[u8]) -> Vec<&[u8]> {
    let mut lines: Vec<&[u8]> = content.split(|b| *b == b'\n').collect();
    if lines.last().is_some_and(|l| l.is_empty()) {
        lines.pop();
    }
    lines
}

// ---------------------------------------------------------------------------------------
// read_file
// ---------------------------------------------------------------------------------------

/// Collects the answer of `read_file` from a byte stream, one line at a time, holding at
/// most one (capped) line in memory.
struct LineCollector {
    start: i64,
    end: i64,
    append_loc: bool,
    lineno: i64,
    result: Vec<u8>,
    done: bool,
    cur: Vec<u8>,
    cur_overflow: bool,
}

impl LineCollector {
    fn new(start: i64, end: i64, append_loc: bool) -> LineCollector {
        LineCollector {
            start,
            end,
            append_loc,
            lineno: 0,
            result: Vec::new(),
            done: false,
            cur: Vec::new(),
            cur_overflow: false,
        }
    }

    fn feed(&mut self, mut data: &[u8]) {
        while !self.done && !data.is_empty() {
            match memchr::memchr(b'\n', data) {
                Some(nl) => {
                    self.append_cur(&data[..nl]);
                    data = &data[nl + 1..];
                    let line = std::mem::take(&mut self.cur);
                    let overflow = std::mem::replace(&mut self.cur_overflow, false);
                    self.line(&line, overflow);
                }
                None => {
                    self.append_cur(data);
                    data = &[];
                }
            }
        }
    }

    fn append_cur(&mut self, bytes: &[u8]) {
        let room = (READ_FILE_MAX_SIZE + 1).saturating_sub(self.cur.len());
        if bytes.len() > room {
            self.cur.extend_from_slice(&bytes[..room]);
            self.cur_overflow = true;
        } else {
            self.cur.extend_from_slice(bytes);
        }
    }

    fn line(&mut self, bytes: &[u8], overflow: bool) {
        self.lineno += 1;
        if self.lineno < self.start {
            return;
        }
        if self.end != -1 && self.lineno > self.end {
            self.done = true;
            return;
        }
        let mut out_line = Vec::with_capacity(bytes.len() + 16);
        if self.append_loc {
            out_line.extend_from_slice(format!("{}\u{2192}", self.lineno).as_bytes());
        }
        out_line.extend_from_slice(bytes);
        out_line.push(b'\n');
        if overflow || self.result.len() + out_line.len() > READ_FILE_MAX_SIZE {
            self.result.extend_from_slice(b"[output truncated]");
            self.done = true;
            return;
        }
        self.result.extend_from_slice(&out_line);
    }

    fn finish(mut self) -> Vec<u8> {
        if !self.done && (!self.cur.is_empty() || self.cur_overflow) {
            let line = std::mem::take(&mut self.cur);
            let overflow = self.cur_overflow;
            self.line(&line, overflow);
        }
        self.result
    }
}

fn host_read_lines(path: PathBuf, start: i64, end: i64, append_loc: bool) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path).ok()?;
    let mut lc = LineCollector::new(start, end, append_loc);
    let mut buf = vec![0u8; 64 * 1024];
    while !lc.done {
        match f.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => lc.feed(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        }
    }
    Some(lc.finish())
}

async fn read_file(p: &Params, ctx: &CallCtx<'_>) -> ToolResult {
    let path = req_string(p, "path")?;
    let start_line = opt_int(p, "start_line", 1);
    let end_line = opt_int(p, "end_line", -1); // -1: no limit
    let append_loc = opt_bool(p, "append_loc", false);
    // from the x-resp-type header: the model cannot ask for it
    let as_base64 = ctx.resp_type == "base64";

    let io = io_or_return!(ctx);
    let abs = confine_or_return!(io, &path);

    let Some(file_size) = io.file_size(&abs).await else {
        return tool_error(format!("cannot stat file: {path}"));
    };

    if as_base64 {
        if file_size > READ_FILE_MAX_SIZE_BASE64 as u64 {
            return tool_error(format!(
                "file too large ({file_size} bytes, max {READ_FILE_MAX_SIZE_BASE64})"
            ));
        }
        let Some(content) = io.read_file(&abs, READ_FILE_MAX_SIZE_BASE64).await else {
            return tool_error(format!("failed to open file: {path}"));
        };
        return Ok(json!({
            "base64": base64_encode(&content),
            "size_bytes": content.len(),
        }));
    }

    if file_size > READ_FILE_MAX_SIZE as u64 && end_line == -1 {
        return tool_error(format!(
            "file too large ({file_size} bytes, max {READ_FILE_MAX_SIZE}). Use start_line/end_line to read a portion."
        ));
    }

    let result = match &io {
        ToolsIo::Host(_) => {
            let path_buf = PathBuf::from(&abs);
            blocking(
                move || host_read_lines(path_buf, start_line, end_line, append_loc),
                None,
            )
            .await
        }
        ToolsIo::Isolate(_) => io.read_file(&abs, MAX_FILE_READ).await.map(|content| {
            let mut lc = LineCollector::new(start_line, end_line, append_loc);
            lc.feed(&content);
            lc.finish()
        }),
    };
    match result {
        Some(bytes) => Ok(json!({ "plain_text_response": String::from_utf8_lossy(&bytes) })),
        None => tool_error(format!("failed to open file: {path}")),
    }
}

pub(crate) fn base64_encode(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        out.push(T[(n >> 18) as usize & 63] as char);
        out.push(T[(n >> 12) as usize & 63] as char);
        out.push(if chunk.len() > 1 {
            T[(n >> 6) as usize & 63] as char
        } else {
            '='
        });
        out.push(if chunk.len() > 2 {
            T[n as usize & 63] as char
        } else {
            '='
        });
    }
    out
}

// ---------------------------------------------------------------------------------------
// file_glob_search
// ---------------------------------------------------------------------------------------

fn check_pattern(name: &str, pattern: &str) -> Result<(), String> {
    if pattern.len() > MAX_PATTERN_LEN {
        return Err(format!(
            "{name} pattern too long ({} bytes, max {MAX_PATTERN_LEN})",
            pattern.len()
        ));
    }
    Ok(())
}

async fn file_glob_search(p: &Params, ctx: &CallCtx<'_>) -> ToolResult {
    let io = io_or_return!(ctx);
    let path = req_string(p, "path")?;

    let base = confine_or_return!(io, &path);
    let include = opt_string(p, "include", "**");
    let exclude = opt_string(p, "exclude", "");
    let kind_str = opt_string(p, "type", "file");
    let max_depth = opt_int(p, "max_depth", 0).max(0) as usize;
    let limit_req = opt_int(p, "limit", FILE_SEARCH_MAX_RESULTS);
    if limit_req < 1 {
        return tool_error(format!("invalid limit: {limit_req} (expected 1 or more)"));
    }
    let limit = limit_req.min(FILE_SEARCH_MAX_RESULTS) as usize;

    let kind = match kind_str.as_str() {
        "file" => ListKind::Files,
        "dir" => ListKind::Dirs,
        "all" => ListKind::All,
        _ => {
            return tool_error(format!(
                "invalid type: {kind_str} (expected \"file\", \"dir\" or \"all\")"
            ));
        }
    };
    if let Err(e) = check_pattern("include", &include).and(check_pattern("exclude", &exclude)) {
        return tool_error(e);
    }

    let listing = io.list_entries(&base, max_depth, kind).await;
    if !listing.err.is_empty() {
        return tool_error(format!("{}: {path}", listing.err));
    }

    let matches: Vec<_> = listing
        .entries
        .iter()
        .filter(|e| path_glob_match(&include, &e.rel))
        .filter(|e| exclude.is_empty() || !path_glob_match(&exclude, &e.rel))
        .collect();
    let total = matches.len();
    let shown = total.min(limit);

    let mut text = String::new();
    let mut entries = Vec::with_capacity(shown);
    for m in &matches[..shown] {
        text.push_str(&m.rel);
        if m.is_dir {
            text.push('/');
        }
        text.push('\n');
        entries.push(json!({"path": m.rel, "type": if m.is_dir { "dir" } else { "file" }}));
    }
    text.push_str(&format!("\n---\nTotal matches: {total}\n"));
    if total > shown {
        text.push_str(&format!(
            "[{shown} results limit reached ({total} total matches). Refine the glob pattern to narrow the search.]\n"
        ));
    }
    if listing.truncated {
        text.push_str("[results truncated: time budget or unreadable directory]\n");
    }
    // `base` is absolute, so clients can join the relative entries
    Ok(json!({"plain_text_response": text, "entries": entries, "base": base}))
}

// ---------------------------------------------------------------------------------------
// grep_search
// ---------------------------------------------------------------------------------------

/// The running answer of `grep_search`.
struct GrepScan {
    regex: regex::bytes::Regex,
    show_num: bool,
    ctx_lines: usize,
    out: Vec<u8>,
    total: usize,
    limit_reached: bool,
    out_truncated: bool,
}

impl GrepScan {
    fn stopped(&self) -> bool {
        self.limit_reached || self.out_truncated
    }

    fn scan(&mut self, display: &str, content: &[u8]) {
        let lines = getlines(content);
        for i in 0..lines.len() {
            if self.total >= GREP_SEARCH_MAX_RESULTS {
                self.limit_reached = true;
                return;
            }
            if !self.regex.is_match(lines[i]) {
                continue;
            }
            let (start, end) = if self.ctx_lines > 0 {
                (
                    i.saturating_sub(self.ctx_lines),
                    (lines.len() - 1).min(i.saturating_add(self.ctx_lines)),
                )
            } else {
                (i, i)
            };
            for (j, line) in lines.iter().enumerate().take(end + 1).skip(start) {
                let sep = if j == i { b':' } else { b'-' };
                self.out.extend_from_slice(display.as_bytes());
                self.out.push(sep);
                if self.show_num {
                    self.out.extend_from_slice((j + 1).to_string().as_bytes());
                    self.out.push(sep);
                }
                self.out.extend_from_slice(line);
                self.out.push(b'\n');
                if self.out.len() > GREP_SEARCH_MAX_OUTPUT {
                    self.out.truncate(GREP_SEARCH_MAX_OUTPUT);
                    self.out.extend_from_slice(b"\n[output truncated]\n");
                    self.out_truncated = true;
                    self.total += 1;
                    return;
                }
            }
            if self.ctx_lines > 0 {
                self.out.extend_from_slice(b"--\n");
            }
            self.total += 1;
        }
    }

    fn finish(mut self) -> String {
        self.out
            .extend_from_slice(format!("\n---\nTotal matches: {}\n", self.total).as_bytes());
        if self.limit_reached {
            self.out.extend_from_slice(
                format!(
                    "[{GREP_SEARCH_MAX_RESULTS} matches limit reached. Narrow the path/pattern/include to see more.]\n"
                )
                .as_bytes(),
            );
        }
        String::from_utf8_lossy(&self.out).into_owned()
    }
}

async fn grep_search(p: &Params, ctx: &CallCtx<'_>) -> ToolResult {
    let path = req_string(p, "path")?;
    let pat_str = req_string(p, "pattern")?;
    let include = opt_string(p, "include", "**");
    let exclude = opt_string(p, "exclude", "");
    let show_lineno = opt_bool(p, "return_line_numbers", false);
    let literal = opt_bool(p, "literal", false);
    let ignore_case = opt_bool(p, "ignore_case", false);
    let ctx_lines = opt_int(p, "context_lines", 0).max(0) as usize;

    let source = if literal {
        regex::escape(&pat_str)
    } else {
        pat_str
    };
    let regex = match regex::bytes::RegexBuilder::new(&source)
        .case_insensitive(ignore_case)
        .size_limit(16 << 20)
        .build()
    {
        Ok(r) => r,
        Err(e) => return tool_error(format!("invalid regex: {e}")),
    };
    if let Err(e) = check_pattern("include", &include).and(check_pattern("exclude", &exclude)) {
        return tool_error(e);
    }

    let io = io_or_return!(ctx);
    let abs_path = confine_or_return!(io, &path);

    // (absolute path, display path)
    let mut files: Vec<(String, String)> = Vec::new();
    if io.is_regular_file(&abs_path).await {
        files.push((abs_path.clone(), path.clone()));
    } else if io.is_directory(&abs_path).await {
        let listing = io.list_entries(&abs_path, 0, ListKind::Files).await;
        if !listing.err.is_empty() {
            return tool_error(format!("{}: {path}", listing.err));
        }
        for entry in listing.entries {
            if !path_glob_match(&include, &entry.rel) {
                continue;
            }
            if !exclude.is_empty() && path_glob_match(&exclude, &entry.rel) {
                continue;
            }
            let full = if io.is_isolate() {
                format!("{}/{}", abs_path.trim_end_matches('/'), entry.rel)
            } else {
                path_to_string(&PathBuf::from(&abs_path).join(&entry.rel))
            };
            files.push((full, entry.rel));
        }
    } else {
        return tool_error(format!("path does not exist: {path}"));
    }

    let mut scan = GrepScan {
        regex,
        show_num: show_lineno || ctx_lines > 0,
        ctx_lines,
        out: Vec::new(),
        total: 0,
        limit_reached: false,
        out_truncated: false,
    };
    match &io {
        ToolsIo::Host(host) => {
            let sandboxed = host.sandboxed();
            let host = host.clone();
            scan = blocking(
                move || {
                    for (fpath, display) in &files {
                        if scan.stopped() {
                            break;
                        }
                        // a link inside the sandbox may point out of it
                        if sandboxed && host.confine(fpath).is_err() {
                            continue;
                        }
                        let Some(content) = host_read_file(&PathBuf::from(fpath), MAX_FILE_READ)
                        else {
                            continue;
                        };
                        scan.scan(display, &content);
                    }
                    Some(scan)
                },
                None,
            )
            .await
            .ok_or_else(|| ToolFail::Server("grep_search worker failed".into()))?;
        }
        ToolsIo::Isolate(_) => {
            for (fpath, display) in &files {
                if scan.stopped() {
                    break;
                }
                let Some(content) = io.read_file(fpath, MAX_FILE_READ).await else {
                    continue;
                };
                scan.scan(display, &content);
            }
        }
    }
    Ok(json!({ "plain_text_response": scan.finish() }))
}

// ---------------------------------------------------------------------------------------
// exec_shell_command
// ---------------------------------------------------------------------------------------

async fn exec_shell_command(
    p: &Params,
    ctx: &CallCtx<'_>,
    sink: Option<&mut ChunkSink>,
) -> ToolResult {
    let command = req_string(p, "command")?;
    let timeout = opt_int(p, "timeout", 10).clamp(0, EXEC_MAX_TIMEOUT) as u64;
    let max_output = opt_int(p, "max_output_size", EXEC_MAX_OUTPUT_SIZE);
    // llama.cpp casts to size_t: a negative size becomes huge, then the cap
    let max_output = if max_output < 0 {
        EXEC_MAX_OUTPUT_SIZE
    } else {
        max_output.min(EXEC_MAX_OUTPUT_SIZE)
    } as usize;

    // an isolate is always POSIX, so it always gets `sh -c`
    let args: Vec<String> = if cfg!(windows) && ctx.runtime.is_empty() {
        vec!["cmd".into(), "/c".into(), command]
    } else {
        vec!["sh".into(), "-c".into(), command]
    };

    let io = io_or_return!(ctx);

    if let Some(sink) = sink {
        let res = io.run(&args, max_output, timeout, Some(&mut *sink)).await;
        if sink.is_closed() {
            return Ok(Value::Null);
        }
        let mut tail = format!("\n[exit code: {}]", res.exit_code);
        if res.timed_out {
            tail.push_str(" [exit due to timed out]");
        }
        sink.push_text(tail).await;
        return Ok(Value::Null);
    }

    let res = io.run(&args, max_output, timeout, None).await;
    let mut text = String::from_utf8_lossy(&res.output).into_owned();
    text.push_str(&format!("\n[exit code: {}]", res.exit_code));
    if res.timed_out {
        text.push_str(" [exit due to timed out]");
    }
    Ok(json!({ "plain_text_response": text }))
}

// ---------------------------------------------------------------------------------------
// write_file
// ---------------------------------------------------------------------------------------

async fn write_file(p: &Params, ctx: &CallCtx<'_>) -> ToolResult {
    let path = req_string(p, "path")?;
    let content = req_string(p, "content")?;

    let io = io_or_return!(ctx);
    let abs = confine_or_return!(io, &path);
    let bytes = content.len();
    if !io.write_file(&abs, content.into_bytes()).await {
        return tool_error(format!("failed to write file: {path}"));
    }
    Ok(json!({"result": "file written successfully", "path": path, "bytes": bytes}))
}

// ---------------------------------------------------------------------------------------
// edit_file
// ---------------------------------------------------------------------------------------

struct MatchedEdit {
    edit_index: usize,
    match_index: usize,
    match_length: usize,
    new_text: Vec<u8>,
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    memchr::memmem::find(hay, needle)
}

/// Non-overlapping occurrences.
fn count_occurrences(content: &[u8], needle: &[u8]) -> usize {
    if needle.is_empty() {
        return 0;
    }
    memchr::memmem::find_iter(content, needle)
        .fold((0usize, 0usize), |(count, next_free), pos| {
            if pos >= next_free {
                (count + 1, pos + needle.len())
            } else {
                (count, next_free)
            }
        })
        .0
}

/// Strips trailing whitespace and maps smart quotes, dashes and special spaces to ASCII.
fn normalize_line_for_fuzzy_match(line: &[u8]) -> Vec<u8> {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b' ' | b'\t' | b'\r') {
        end -= 1;
    }
    let s = &line[..end];
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        let (rep, len): (Option<u8>, usize) = match s[i] {
            0xE2 if i + 2 < s.len() => match (s[i + 1], s[i + 2]) {
                (0x80, 0x98..=0x9B) => (Some(b'\''), 3),
                (0x80, 0x9C..=0x9F) => (Some(b'"'), 3),
                (0x80, 0x90..=0x95) => (Some(b'-'), 3),
                (0x88, 0x92) => (Some(b'-'), 3),
                (0x80, 0x82..=0x8A) | (0x80, 0xAF) | (0x81, 0x9F) => (Some(b' '), 3),
                _ => (None, 1),
            },
            0xC2 if i + 1 < s.len() && s[i + 1] == 0xA0 => (Some(b' '), 2),
            0xE3 if i + 2 < s.len() && s[i + 1] == 0x80 && s[i + 2] == 0x80 => (Some(b' '), 3),
            _ => (None, 1),
        };
        match rep {
            Some(c) => out.push(c),
            None => out.push(s[i]),
        }
        i += len;
    }
    out
}

/// Per line; keeps the line count and positions.
fn normalize_for_fuzzy_match(content: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(content.len());
    for (i, line) in content.split(|b| *b == b'\n').enumerate() {
        if i > 0 {
            out.push(b'\n');
        }
        out.extend_from_slice(&normalize_line_for_fuzzy_match(line));
    }
    out
}

/// Lines with their `\n` kept.
fn split_lines_with_endings(content: &[u8]) -> Vec<&[u8]> {
    content.split_inclusive(|b| *b == b'\n').collect()
}

/// Replacements sorted ascending and disjoint; `offset` is where `content` starts in
/// the coordinates of the matches.
fn apply_replacements(content: &[u8], reps: &[&MatchedEdit], offset: usize) -> Option<Vec<u8>> {
    let mut result = content.to_vec();
    for rep in reps.iter().rev() {
        let local = rep.match_index.checked_sub(offset)?;
        let end = local.checked_add(rep.match_length)?;
        if end > result.len() {
            return None;
        }
        result.splice(local..end, rep.new_text.iter().copied());
    }
    Some(result)
}

/// The lines (`[start, end)`) a replacement touches.
fn replacement_line_range(
    spans: &[(usize, usize)],
    index: usize,
    length: usize,
) -> Option<(usize, usize)> {
    let rs = index;
    let re = index + length;
    let start = spans.iter().position(|&(s, e)| rs >= s && rs < e)?;
    let mut end = start;
    while end < spans.len() && spans[end].1 < re {
        end += 1;
    }
    if end >= spans.len() {
        return None;
    }
    Some((start, end + 1))
}

/// Like [`apply_replacements`] over the normalized text, but lines no edit touches come
/// from the original.
fn apply_replacements_preserving_unchanged_lines(
    original: &[u8],
    base: &[u8],
    reps: &[MatchedEdit],
) -> Option<Vec<u8>> {
    let original_lines = split_lines_with_endings(original);
    let mut spans = Vec::new();
    let mut offset = 0;
    for line in split_lines_with_endings(base) {
        spans.push((offset, offset + line.len()));
        offset += line.len();
    }
    struct Group<'a> {
        start: usize,
        end: usize,
        reps: Vec<&'a MatchedEdit>,
    }
    let mut groups: Vec<Group> = Vec::new();
    for rep in reps {
        let (start, end) = replacement_line_range(&spans, rep.match_index, rep.match_length)?;
        match groups.last_mut() {
            Some(g) if start < g.end => {
                g.end = g.end.max(end);
                g.reps.push(rep);
            }
            _ => groups.push(Group {
                start,
                end,
                reps: vec![rep],
            }),
        }
    }
    let mut result = Vec::with_capacity(original.len());
    let mut next_line = 0;
    for g in &groups {
        for line in original_lines.get(next_line..g.start)? {
            result.extend_from_slice(line);
        }
        let from = spans.get(g.start)?.0;
        let to = spans.get(g.end - 1)?.1;
        result.extend(apply_replacements(base.get(from..to)?, &g.reps, from)?);
        next_line = g.end;
    }
    for line in original_lines.get(next_line..).unwrap_or_default() {
        result.extend_from_slice(line);
    }
    Some(result)
}

async fn edit_file(p: &Params, ctx: &CallCtx<'_>) -> ToolResult {
    let path = req_string(p, "path")?;
    let Some(edits_json) = p.get("edits") else {
        return Err(key_not_found("edits"));
    };
    let edits_arr = match edits_json {
        Value::Array(a) if !a.is_empty() => a,
        _ => return tool_error("\"edits\" must be a non-empty array"),
    };
    let mut edits: Vec<(String, String)> = Vec::with_capacity(edits_arr.len());
    for e in edits_arr {
        let Value::Object(obj) = e else {
            return Err(ToolFail::BadRequest(format!(
                "[json.exception.type_error.304] cannot use at() with {}",
                type_name(e)
            )));
        };
        let old_text = req_string(obj, "old_text")?;
        let new_text = req_string(obj, "new_text")?;
        if old_text.is_empty() {
            return tool_error(format!("edits[{}].old_text must not be empty", edits.len()));
        }
        edits.push((old_text, new_text));
    }

    let io = io_or_return!(ctx);
    let abs = confine_or_return!(io, &path);
    if let Some(size) = io.file_size(&abs).await
        && size > MAX_FILE_READ as u64
    {
        return tool_error(format!(
            "file too large ({size} bytes, max {MAX_FILE_READ})"
        ));
    }
    let Some(original) = io.read_file(&abs, MAX_FILE_READ).await else {
        return tool_error(format!("failed to open file: {path}"));
    };

    let fuzzy_content = normalize_for_fuzzy_match(&original);
    // does any old_text need fuzzy matching (no exact match)?
    let mut any_fuzzy = false;
    for (i, (old, _)) in edits.iter().enumerate() {
        if find(&original, old.as_bytes()).is_some() {
            continue;
        }
        if find(&fuzzy_content, &normalize_for_fuzzy_match(old.as_bytes())).is_none() {
            return tool_error(format!(
                "could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
            ));
        }
        any_fuzzy = true;
    }

    let base: &[u8] = if any_fuzzy { &fuzzy_content } else { &original };
    // uniqueness always on the normalized text: a whitespace-only duplicate counts
    let mut matched = Vec::with_capacity(edits.len());
    for (i, (old, new)) in edits.iter().enumerate() {
        let fuzzy_old = normalize_for_fuzzy_match(old.as_bytes());
        let needle: &[u8] = if any_fuzzy {
            &fuzzy_old
        } else {
            old.as_bytes()
        };
        let occurrences = count_occurrences(&fuzzy_content, &fuzzy_old);
        if occurrences > 1 {
            return tool_error(format!(
                "found {occurrences} occurrences of edits[{i}].old_text in {path}, it must be unique"
            ));
        }
        let Some(idx) = find(base, needle) else {
            return tool_error(format!(
                "could not find edits[{i}].old_text in {path}, it must match the file's current content exactly"
            ));
        };
        matched.push(MatchedEdit {
            edit_index: i,
            match_index: idx,
            match_length: needle.len(),
            new_text: new.as_bytes().to_vec(),
        });
    }
    matched.sort_by_key(|m| m.match_index);
    for w in matched.windows(2) {
        if w[0].match_index + w[0].match_length > w[1].match_index {
            return tool_error(format!(
                "edits[{}] and edits[{}] overlap in {path}; merge them into one edit or target disjoint regions",
                w[0].edit_index, w[1].edit_index
            ));
        }
    }

    let new_content = if any_fuzzy {
        apply_replacements_preserving_unchanged_lines(&original, base, &matched)
    } else {
        let refs: Vec<&MatchedEdit> = matched.iter().collect();
        apply_replacements(base, &refs, 0)
    };
    let Some(new_content) = new_content else {
        return tool_error(format!("failed to apply the edits to {path}"));
    };
    if new_content == original {
        return tool_error("no changes made: the replacement(s) produced identical content");
    }
    if !io.write_file(&abs, new_content).await {
        return tool_error(format!("failed to write file: {path}"));
    }
    Ok(json!({"result": "file edited successfully", "path": path, "edits_applied": matched.len()}))
}

// ---------------------------------------------------------------------------------------
// get_info
// ---------------------------------------------------------------------------------------

async fn get_info(_p: &Params, ctx: &CallCtx<'_>) -> ToolResult {
    let io = io_or_return!(ctx);
    // inside an isolate, always the POSIX command
    let args: Vec<String> = if cfg!(windows) && ctx.runtime.is_empty() {
        vec!["cmd".into(), "/c".into(), "ver".into()]
    } else {
        vec!["uname".into(), "-a".into()]
    };
    let res = io
        .run(&args, GET_INFO_MAX_OUTPUT, GET_INFO_TIMEOUT, None)
        .await;
    let os = if res.exit_code == 0 && !res.timed_out {
        String::from_utf8_lossy(&res.output).trim().to_string()
    } else {
        "unknown".to_string()
    };
    let cwd = if !ctx.cwd.is_empty() {
        ctx.cwd.clone()
    } else {
        match &io {
            ToolsIo::Host(h) => h
                .cwd()
                .map(path_to_string)
                .or_else(|| std::env::current_dir().ok().map(|p| path_to_string(&p)))
                .unwrap_or_default(),
            ToolsIo::Isolate(_) => {
                let pwd = io
                    .run(
                        &["pwd".to_string()],
                        GET_INFO_MAX_OUTPUT,
                        GET_INFO_TIMEOUT,
                        None,
                    )
                    .await;
                if pwd.exit_code == 0 && !pwd.timed_out {
                    String::from_utf8_lossy(&pwd.output).trim().to_string()
                } else {
                    "unknown".to_string()
                }
            }
        }
    };
    Ok(json!({"os": os, "cwd": cwd}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(b"foobar"), "Zm9vYmFy");
    }

    #[test]
    fn fuzzy_normalization() {
        let s = "a \u{2018}b\u{2019} \u{201C}c\u{201D} d\u{2014}e\u{00A0}f  \t\r".as_bytes();
        assert_eq!(
            normalize_line_for_fuzzy_match(s),
            b"a 'b' \"c\" d-e f".to_vec()
        );
        assert_eq!(normalize_for_fuzzy_match(b"x  \ny\t\n"), b"x\ny\n".to_vec());
    }

    #[test]
    fn line_collector() {
        let mut lc = LineCollector::new(2, 3, true);
        lc.feed(b"one\ntwo\nthr");
        lc.feed(b"ee\nfour\n");
        assert_eq!(
            String::from_utf8(lc.finish()).unwrap(),
            "2\u{2192}two\n3\u{2192}three\n"
        );
        let mut lc = LineCollector::new(1, -1, false);
        lc.feed(b"no newline");
        assert_eq!(lc.finish(), b"no newline\n".to_vec());
        let mut lc = LineCollector::new(1, 1, false);
        lc.feed(&vec![b'x'; READ_FILE_MAX_SIZE * 3]);
        assert_eq!(lc.finish(), b"[output truncated]".to_vec());
    }

    #[test]
    fn occurrences() {
        assert_eq!(count_occurrences(b"aaaa", b"aa"), 2);
        assert_eq!(count_occurrences(b"dup\ndup\n", b"dup"), 2);
        assert_eq!(count_occurrences(b"x", b""), 0);
    }
}
