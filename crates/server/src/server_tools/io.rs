//! Where the built-in tools do their I/O: on the host ([`HostIo`], optionally confined
//! by a [`Sandbox`]) or inside an isolate ([`IsolateIo`]: a running docker/podman
//! container or an ssh host), llama.cpp's `tools_io_basic` / `tools_io_isolate`; the
//! subprocess runner both use ([`run_subprocess`]); and the `--tools-runtime` owner of a
//! spawned container ([`ToolsRuntime`]).

use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Output cap of the `git ls-files` / `find` listings (llama.cpp's 8 MB).
pub(crate) const LIST_MAX_OUTPUT: usize = 8 * 1024 * 1024;
/// Time budget of one directory listing, git and walker together (seconds).
pub(crate) const LIST_TIMEOUT: Duration = Duration::from_secs(15);
/// Timeout of the auxiliary commands run inside an isolate (stat, cat, mkdir, ...).
const ISOLATE_EXEC_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest file read inside an isolate.
pub(crate) const ISOLATE_READ_FILE_MAX_SIZE: usize = 64 * 1024 * 1024;
/// Most entries one walk collects before it stops and reports truncation (not in
/// llama.cpp, which only has the time budget).
const WALK_MAX_ENTRIES: usize = 200_000;
/// How long output is still drained after a process was killed (a detached grandchild
/// can keep the pipe open forever).
const KILL_GRACE: Duration = Duration::from_millis(500);

/// Directories a listing reports but never descends into.
pub(crate) const JUNK_DIR_NAMES: [&str; 13] = [
    ".git",
    ".svn",
    ".hg",
    "node_modules",
    "__pycache__",
    ".venv",
    "venv",
    "dist",
    "build",
    "target",
    ".cache",
    ".idea",
    ".vscode",
];

// ---------------------------------------------------------------------------------------
// subprocesses
// ---------------------------------------------------------------------------------------

/// What a finished command gave back.
#[derive(Debug, Default)]
pub(crate) struct ExecResult {
    /// stdout (and stderr when combined), capped, with `\n[output truncated]` appended
    /// when the cap cut it.
    pub output: Vec<u8>,
    /// The exit status; 1 when killed by a signal and -1 when it could not be spawned
    /// (llama.cpp's subprocess.h conventions).
    pub exit_code: i32,
    pub timed_out: bool,
    /// The cap cut the output.
    pub truncated: bool,
}

/// Streams a command's output as `{"chunk": ...}` events (`POST /tools` with
/// `stream: true`), decoding UTF-8 across chunk boundaries.
pub(crate) struct ChunkSink {
    pub tx: mpsc::Sender<Value>,
    carry: Vec<u8>,
}

impl ChunkSink {
    pub fn new(tx: mpsc::Sender<Value>) -> ChunkSink {
        ChunkSink {
            tx,
            carry: Vec::new(),
        }
    }

    /// Sends the decodable part of `bytes`; false once the receiver is gone.
    pub async fn push_bytes(&mut self, bytes: &[u8]) -> bool {
        self.carry.extend_from_slice(bytes);
        let mut text = String::new();
        let mut rest: &[u8] = &self.carry;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    text.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    text.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        Some(len) => {
                            text.push('\u{FFFD}');
                            rest = &bad[len..];
                        }
                        None => {
                            rest = bad; // an incomplete sequence: wait for more
                            break;
                        }
                    }
                }
            }
        }
        self.carry = rest.to_vec();
        self.push_text(text).await
    }

    /// Sends `text` as one chunk (nothing when empty); false once the receiver is gone.
    pub async fn push_text(&mut self, text: String) -> bool {
        if text.is_empty() {
            return !self.tx.is_closed();
        }
        self.tx.send(json!({ "chunk": text })).await.is_ok()
    }

    /// Sends what is left of an incomplete UTF-8 sequence.
    pub async fn flush(&mut self) -> bool {
        let rest = std::mem::take(&mut self.carry);
        self.push_text(String::from_utf8_lossy(&rest).into_owned())
            .await
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

async fn sink_closed(sink: Option<&ChunkSink>) {
    match sink {
        Some(s) => s.tx.closed().await,
        None => std::future::pending().await,
    }
}

/// How [`run_subprocess`] runs a command.
pub(crate) struct ExecOptions<'a> {
    pub max_output: usize,
    pub timeout: Duration,
    /// stderr goes into the same pipe as stdout (else it is discarded).
    pub combine_stderr: bool,
    pub cwd: Option<&'a str>,
    /// Written to the child's stdin, which is then closed; `None`: stdin is empty.
    pub stdin: Option<Vec<u8>>,
}

/// Kills the child's whole process group (it is spawned as a group leader) unless
/// disarmed once the child has been reaped.
struct GroupKill {
    pid: Option<u32>,
}

impl GroupKill {
    fn kill(&self) {
        #[cfg(unix)]
        if let Some(pid) = self.pid
            && let Ok(pid) = libc::pid_t::try_from(pid)
            && pid > 0
        {
            // SAFETY: killpg has no memory-safety preconditions; `pid` is the group id
            // of a child we spawned with process_group(0) and have not reaped yet, so it
            // cannot name anybody else's group.
            unsafe {
                libc::killpg(pid, libc::SIGKILL);
            }
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The read end of the output pipe.
enum OutputPipe {
    #[cfg(unix)]
    Async(tokio::net::unix::pipe::Receiver),
    /// Read by a helper thread (non-unix, or when the pipe cannot be registered).
    Thread(mpsc::Receiver<Vec<u8>>),
}

impl OutputPipe {
    fn new(reader: std::io::PipeReader) -> OutputPipe {
        #[cfg(unix)]
        {
            let fd = std::os::fd::OwnedFd::from(reader);
            match fd
                .try_clone()
                .and_then(tokio::net::unix::pipe::Receiver::from_owned_fd)
            {
                Ok(rx) => OutputPipe::Async(rx),
                Err(_) => OutputPipe::thread(std::io::PipeReader::from(fd)),
            }
        }
        #[cfg(not(unix))]
        OutputPipe::thread(reader)
    }

    fn thread(mut reader: std::io::PipeReader) -> OutputPipe {
        let (tx, rx) = mpsc::channel(16);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match reader.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        OutputPipe::Thread(rx)
    }

    /// Some bytes, or `None` at EOF / error.
    async fn read(&mut self, buf: &mut Vec<u8>) -> Option<usize> {
        match self {
            #[cfg(unix)]
            OutputPipe::Async(rx) => {
                use tokio::io::AsyncReadExt;
                buf.resize(16 * 1024, 0);
                match rx.read(buf).await {
                    Ok(0) | Err(_) => None,
                    Ok(n) => Some(n),
                }
            }
            OutputPipe::Thread(rx) => {
                let chunk = rx.recv().await?;
                let n = chunk.len();
                *buf = chunk;
                Some(n)
            }
        }
    }
}

fn spawn_failed() -> ExecResult {
    ExecResult {
        output: b"failed to spawn process".to_vec(),
        exit_code: -1,
        ..Default::default()
    }
}

/// Runs `args` (no shell), llama.cpp's `run_subprocess`: output capped at
/// `max_output` (the rest is drained and dropped so the child never blocks), killed
/// (its whole process group) at the timeout, streamed to `sink` as it arrives. When the
/// sink's receiver goes away the command is killed and the result returned early.
pub(crate) async fn run_subprocess(
    args: &[String],
    opts: ExecOptions<'_>,
    mut sink: Option<&mut ChunkSink>,
) -> ExecResult {
    let Some((program, rest)) = args.split_first() else {
        return spawn_failed();
    };
    let Ok((reader, writer)) = std::io::pipe() else {
        return spawn_failed();
    };
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(rest);
    if let Some(cwd) = opts.cwd.filter(|c| !c.is_empty()) {
        cmd.current_dir(cwd);
    }
    cmd.stdin(if opts.stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    if opts.combine_stderr {
        let Ok(w2) = writer.try_clone() else {
            return spawn_failed();
        };
        cmd.stdout(w2);
        cmd.stderr(writer);
    } else {
        cmd.stdout(writer);
        cmd.stderr(Stdio::null());
    }
    cmd.kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    let spawned = cmd.spawn();
    drop(cmd); // closes this side's copies of the pipe's write end
    let Ok(mut child) = spawned else {
        return spawn_failed();
    };
    let mut group = GroupKill { pid: child.id() };

    let stdin_task = match (opts.stdin, child.stdin.take()) {
        (Some(data), Some(mut stdin)) => Some(tokio::spawn(async move {
            // a short write is not an error by itself, the exit code decides
            let _ = stdin.write_all(&data).await;
            let _ = stdin.shutdown().await;
        })),
        _ => None,
    };

    let mut pipe = OutputPipe::new(reader);
    let deadline = Instant::now() + opts.timeout;
    let mut output: Vec<u8> = Vec::new();
    let mut buf = Vec::new();
    let mut truncated = false;
    let mut timed_out = false;
    let mut draining_until: Option<Instant> = None;
    let mut client_gone = false;

    enum Ev {
        Data(usize),
        Eof,
        Deadline,
        ClientGone,
    }
    loop {
        let until = draining_until.unwrap_or(deadline);
        let ev = {
            let closed = sink_closed(sink.as_deref());
            tokio::select! {
                r = pipe.read(&mut buf) => match r { Some(n) => Ev::Data(n), None => Ev::Eof },
                _ = tokio::time::sleep_until(until) => Ev::Deadline,
                _ = closed, if draining_until.is_none() => Ev::ClientGone,
            }
        };
        match ev {
            Ev::Eof => break,
            Ev::Deadline if draining_until.is_some() => break,
            Ev::Deadline => {
                timed_out = true;
                group.kill();
                let _ = child.start_kill();
                draining_until = Some(Instant::now() + KILL_GRACE);
            }
            Ev::ClientGone => {
                client_gone = true;
                group.kill();
                let _ = child.start_kill();
                break;
            }
            Ev::Data(n) => {
                if truncated {
                    continue;
                }
                let n = n.min(buf.len());
                let take = n.min(opts.max_output.saturating_sub(output.len()));
                output.extend_from_slice(&buf[..take]);
                if take < n {
                    truncated = true;
                }
                if take > 0
                    && let Some(s) = sink.as_deref_mut()
                    && !s.push_bytes(&buf[..take]).await
                    && draining_until.is_none()
                {
                    client_gone = true;
                    group.kill();
                    let _ = child.start_kill();
                    break;
                }
            }
        }
    }

    // the output is closed; the child may still run (it closed stdout, or was killed)
    let status = if client_gone || timed_out {
        tokio::time::timeout(KILL_GRACE * 4, child.wait())
            .await
            .ok()
    } else {
        tokio::select! {
            s = child.wait() => Some(s),
            _ = tokio::time::sleep_until(deadline) => {
                timed_out = true;
                group.kill();
                let _ = child.start_kill();
                tokio::time::timeout(KILL_GRACE * 4, child.wait()).await.ok()
            }
        }
    };
    let exit_code = match status {
        Some(Ok(s)) => {
            group.pid = None; // reaped: the pid may be reused from now on
            s.code().unwrap_or(1)
        }
        _ => -1,
    };
    if let Some(t) = stdin_task {
        t.abort();
    }
    if let Some(s) = sink {
        s.flush().await;
    }
    if truncated {
        output.extend_from_slice(b"\n[output truncated]");
    }
    ExecResult {
        output,
        exit_code,
        timed_out,
        truncated,
    }
}

// ---------------------------------------------------------------------------------------
// paths
// ---------------------------------------------------------------------------------------

/// `$HOME`, read once.
fn home_dir() -> Option<&'static str> {
    static HOME: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    HOME.get_or_init(|| {
        #[cfg(windows)]
        let h = std::env::var("HOME")
            .ok()
            .or_else(|| std::env::var("USERPROFILE").ok());
        #[cfg(not(windows))]
        let h = std::env::var("HOME").ok();
        h.filter(|h| !h.is_empty())
    })
    .as_deref()
}

/// A leading `~` or `~/` becomes `$HOME`.
fn expand_home(path: &str) -> String {
    let Some(rest) = path.strip_prefix('~') else {
        return path.to_string();
    };
    if !(rest.is_empty() || rest.starts_with('/') || rest.starts_with('\\')) {
        return path.to_string();
    }
    match home_dir() {
        Some(home) => format!("{home}{rest}"),
        None => path.to_string(),
    }
}

/// `std::filesystem::path::lexically_normal` for the absolute paths used here: drops `.`,
/// resolves `..` against the preceding component (never above the root), no trailing
/// separator.
pub(crate) fn lexically_normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                let at_root = matches!(
                    out.components().next_back(),
                    None | Some(Component::RootDir) | Some(Component::Prefix(_))
                );
                if at_root {
                    if !out.has_root() {
                        out.push("..");
                    }
                } else if out.components().next_back() == Some(Component::ParentDir) {
                    out.push("..");
                } else {
                    out.pop();
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
}

/// '/' separators on every platform, as llama.cpp's `path_to_utf8`.
pub(crate) fn path_to_string(p: &Path) -> String {
    let s = p.to_string_lossy();
    if cfg!(windows) {
        s.replace('\\', "/")
    } else {
        s.into_owned()
    }
}

/// Confines the host file tools to one directory tree (a Lamina addition, see the
/// module doc of `server_tools`).
#[derive(Debug)]
pub(crate) struct Sandbox {
    root: PathBuf,
}

impl Sandbox {
    pub fn new(dir: &Path) -> Result<Sandbox, String> {
        let root = std::fs::canonicalize(dir)
            .map_err(|e| format!("tools sandbox {}: {e}", dir.display()))?;
        if !root.is_dir() {
            return Err(format!("tools sandbox {}: not a directory", dir.display()));
        }
        Ok(Sandbox { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `abs` (absolute, lexically normal) after resolving every symbolic link of its
    /// longest existing prefix must lie inside the root.
    pub fn check(&self, abs: &Path) -> Result<(), String> {
        let refuse = || {
            format!(
                "access denied: {} is outside the tools sandbox {}",
                path_to_string(abs),
                path_to_string(&self.root)
            )
        };
        if !abs.is_absolute() || abs.components().any(|c| c == Component::ParentDir) {
            return Err(refuse());
        }
        let mut probe: &Path = abs;
        loop {
            match std::fs::canonicalize(probe) {
                Ok(real) => {
                    return if real.starts_with(&self.root) {
                        Ok(())
                    } else {
                        Err(refuse())
                    };
                }
                Err(_) => {
                    // an entry that exists but does not resolve is a dangling link (or
                    // unreadable): writing through it could land anywhere
                    if std::fs::symlink_metadata(probe).is_ok() {
                        return Err(refuse());
                    }
                    match probe.parent() {
                        Some(parent) => probe = parent,
                        None => return Err(refuse()),
                    }
                }
            }
        }
    }
}

/// Host settings shared by every call.
#[derive(Debug, Default)]
pub(crate) struct HostSettings {
    /// Working directory when the request has no `x-tool-cwd` (`None`: the process's).
    pub default_cwd: Option<PathBuf>,
    pub sandbox: Option<Arc<Sandbox>>,
}

/// Entry kinds a listing returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListKind {
    Files,
    Dirs,
    All,
}

#[derive(Clone, Debug)]
pub(crate) struct ListEntry {
    /// '/'-separated, relative to the listed directory.
    pub rel: String,
    pub is_dir: bool,
}

#[derive(Debug, Default)]
pub(crate) struct ListResult {
    pub entries: Vec<ListEntry>,
    /// Set when the base is not a directory.
    pub err: String,
    /// The walk could not see everything (time budget, unreadable directory, entry cap).
    pub truncated: bool,
}

fn entry_depth(rel: &str) -> usize {
    1 + rel.bytes().filter(|b| *b == b'/').count()
}

/// Runs `f` on tokio's blocking pool.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
    fallback: T,
) -> T {
    tokio::task::spawn_blocking(f).await.unwrap_or(fallback)
}

/// I/O on the host, llama.cpp's `tools_io_basic`.
#[derive(Clone, Debug)]
pub(crate) struct HostIo {
    /// Working directory (absolute when set).
    cwd: Option<PathBuf>,
    sandbox: Option<Arc<Sandbox>>,
}

impl HostIo {
    /// `cwd` from the `x-tool-cwd` header (empty: the default). With a sandbox the
    /// working directory must lie inside it, and defaults to its root.
    pub fn new(cwd: &str, host: &HostSettings) -> Result<HostIo, String> {
        let base = host
            .default_cwd
            .clone()
            .or_else(|| host.sandbox.as_ref().map(|s| s.root().to_path_buf()));
        let cwd = if cwd.is_empty() {
            base
        } else {
            let p = PathBuf::from(expand_home(cwd));
            let p = if p.is_absolute() {
                p
            } else {
                match base.clone().or_else(|| std::env::current_dir().ok()) {
                    Some(b) => b.join(p),
                    None => p,
                }
            };
            Some(lexically_normal(&p))
        };
        if let Some(sb) = &host.sandbox {
            let probe = cwd
                .clone()
                .or_else(|| std::env::current_dir().ok())
                .unwrap_or_default();
            sb.check(&probe)?;
        }
        Ok(HostIo {
            cwd,
            sandbox: host.sandbox.clone(),
        })
    }

    pub fn cwd(&self) -> Option<&Path> {
        self.cwd.as_deref()
    }

    /// llama.cpp's `resolve`: `~` expanded, relative paths joined to the working
    /// directory (the process's when unset), lexically normalized.
    pub fn resolve_path(&self, path: &str) -> PathBuf {
        let p = PathBuf::from(expand_home(path));
        let full = if p.is_absolute() {
            p
        } else {
            match self.cwd.clone().or_else(|| std::env::current_dir().ok()) {
                Some(base) => base.join(p),
                None => return p,
            }
        };
        lexically_normal(&full)
    }

    /// [`Self::resolve_path`], refused when a sandbox is set and the path escapes it.
    pub fn confine(&self, path: &str) -> Result<PathBuf, String> {
        let abs = self.resolve_path(path);
        if let Some(sb) = &self.sandbox {
            sb.check(&abs)?;
        }
        Ok(abs)
    }

    pub fn sandboxed(&self) -> bool {
        self.sandbox.is_some()
    }
}

/// A regular file's size (symlinks followed); `None` for anything else, as
/// `std::filesystem::file_size`.
pub(crate) fn host_file_size(p: &Path) -> Option<u64> {
    let md = std::fs::metadata(p).ok()?;
    md.is_file().then_some(md.len())
}

/// At most `max` bytes of a regular file; `None` when it cannot be opened, is not a
/// regular file, or is larger.
pub(crate) fn host_read_file(p: &Path, max: usize) -> Option<Vec<u8>> {
    let f = std::fs::File::open(p).ok()?;
    if !f.metadata().ok()?.is_file() {
        return None;
    }
    let mut out = Vec::new();
    f.take(max as u64 + 1).read_to_end(&mut out).ok()?;
    (out.len() <= max).then_some(out)
}

/// Creates the parent directories, then writes.
pub(crate) fn host_write_file(p: &Path, content: &[u8]) -> bool {
    if let Some(parent) = p.parent()
        && !parent.as_os_str().is_empty()
        && std::fs::create_dir_all(parent).is_err()
    {
        return false;
    }
    std::fs::write(p, content).is_ok()
}

/// llama.cpp's `list_entries_fallback`: a depth-first walk that lists junk directories
/// without descending into them and never follows directory links.
fn walk(base: &Path, max_depth: usize, kind: ListKind, deadline: std::time::Instant) -> ListResult {
    let mut out = ListResult::default();
    let mut stack: Vec<(PathBuf, String, usize)> = vec![(base.to_path_buf(), String::new(), 0)];
    while let Some((dir, rel_dir, depth)) = stack.pop() {
        if std::time::Instant::now() >= deadline || out.entries.len() >= WALK_MAX_ENTRIES {
            out.truncated = true;
            return out;
        }
        let rd = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => continue,
            Err(_) => {
                out.truncated = true;
                continue;
            }
        };
        let mut items = Vec::new();
        for entry in rd {
            let Ok(entry) = entry else {
                out.truncated = true;
                break;
            };
            items.push(entry);
        }
        items.sort_by_key(|e| e.file_name());
        let mut subdirs = Vec::new();
        for entry in items {
            if std::time::Instant::now() >= deadline || out.entries.len() >= WALK_MAX_ENTRIES {
                out.truncated = true;
                return out;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = if rel_dir.is_empty() {
                name.clone()
            } else {
                format!("{rel_dir}/{name}")
            };
            let Ok(ft) = entry.file_type() else { continue };
            let is_link = ft.is_symlink();
            // like directory_entry::is_directory / is_regular_file: links followed
            let (is_dir, is_file) = if is_link {
                match std::fs::metadata(entry.path()) {
                    Ok(md) => (md.is_dir(), md.is_file()),
                    Err(_) => continue,
                }
            } else {
                (ft.is_dir(), ft.is_file())
            };
            if is_dir {
                if matches!(kind, ListKind::Dirs | ListKind::All) {
                    out.entries.push(ListEntry {
                        rel: rel.clone(),
                        is_dir: true,
                    });
                }
                let folded = if cfg!(windows) {
                    name.to_lowercase()
                } else {
                    name.clone()
                };
                if JUNK_DIR_NAMES.contains(&folded.as_str()) {
                    continue;
                }
                if !is_link && (max_depth == 0 || depth + 1 < max_depth) {
                    subdirs.push((entry.path(), rel, depth + 1));
                }
            } else if is_file && matches!(kind, ListKind::Files | ListKind::All) {
                out.entries.push(ListEntry { rel, is_dir: false });
            }
        }
        // visited in name order
        stack.extend(subdirs.into_iter().rev());
    }
    out
}

/// llama.cpp's host `list_entries`: files come from `git ls-files` when `base` is in a
/// work tree (so .gitignore applies), else from the walker.
pub(crate) async fn host_list_entries(base: &Path, max_depth: usize, kind: ListKind) -> ListResult {
    if !base.is_dir() {
        return ListResult {
            err: "path does not exist or is not a directory".into(),
            ..Default::default()
        };
    }
    let deadline = std::time::Instant::now() + LIST_TIMEOUT;
    if kind == ListKind::Files {
        let base_s = path_to_string(base);
        // core.fsmonitor would run a configured hook program: never from a listing
        let args: Vec<String> = [
            "git",
            "-c",
            "core.fsmonitor=false",
            "-C",
            &base_s,
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let res = run_subprocess(
            &args,
            ExecOptions {
                max_output: LIST_MAX_OUTPUT,
                timeout: LIST_TIMEOUT,
                combine_stderr: false,
                cwd: None,
                stdin: None,
            },
            None,
        )
        .await;
        if res.exit_code == 0 && !res.timed_out {
            let base = base.to_path_buf();
            return blocking(
                move || {
                    let mut out = ListResult::default();
                    let mut items: Vec<&[u8]> = res.output.split(|b| *b == 0).collect();
                    if res.truncated {
                        items.pop(); // the marker and a possibly cut name
                        out.truncated = true;
                    }
                    for item in items {
                        if item.is_empty() {
                            continue;
                        }
                        let line = String::from_utf8_lossy(item).replace('\\', "/");
                        if max_depth > 0 && entry_depth(&line) > max_depth {
                            continue;
                        }
                        if std::fs::metadata(base.join(&line)).is_ok_and(|m| m.is_file()) {
                            out.entries.push(ListEntry {
                                rel: line,
                                is_dir: false,
                            });
                        }
                    }
                    out
                },
                ListResult::default(),
            )
            .await;
        }
    }
    let base = base.to_path_buf();
    blocking(
        move || walk(&base, max_depth, kind, deadline),
        ListResult {
            truncated: true,
            ..Default::default()
        },
    )
    .await
}

// ---------------------------------------------------------------------------------------
// isolates
// ---------------------------------------------------------------------------------------

/// How commands reach the isolate.
#[derive(Clone, Debug)]
pub(crate) enum Isolate {
    /// `<bin> exec [-i] <id> ...` (docker and podman take the same verbs).
    Container { bin: String, id: String },
    /// `ssh -o BatchMode=yes ... [-n] <target> '<quoted argv>'`.
    Ssh { target: String },
}

/// I/O inside an isolate, llama.cpp's `tools_io_isolate`: every operation is a POSIX
/// command (sh, cat, wc, mkdir, dirname, find, timeout) run there.
#[derive(Clone, Debug)]
pub(crate) struct IsolateIo {
    pub isolate: Isolate,
    pub cwd: String,
}

/// Quotes `argv` so that a POSIX shell re-parses it into exactly `argv`.
pub(crate) fn shell_quote_join(argv: &[String]) -> String {
    let mut out = String::new();
    for arg in argv {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push('\'');
        for c in arg.chars() {
            if c == '\'' {
                out.push_str("'\\''");
            } else {
                out.push(c);
            }
        }
        out.push('\'');
    }
    out
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

impl IsolateIo {
    /// Relative paths join the working directory; isolate paths are always POSIX.
    pub fn resolve(&self, path: &str) -> String {
        if self.cwd.is_empty() || path.starts_with('/') {
            return path.to_string();
        }
        format!("{}/{}", self.cwd, path)
    }

    fn build_argv(&self, inner: &[String], needs_stdin: bool) -> Vec<String> {
        match &self.isolate {
            Isolate::Container { bin, id } => {
                let mut argv = vec![bin.clone(), "exec".into()];
                if needs_stdin {
                    argv.push("-i".into());
                }
                argv.push(id.clone());
                argv.extend(inner.iter().cloned());
                argv
            }
            Isolate::Ssh { target } => {
                // no console: a prompt would hang the call. key-based auth only, and
                // the host key must be trusted beforehand
                let mut argv = strs(&[
                    "ssh",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "PasswordAuthentication=no",
                    "-o",
                    "KbdInteractiveAuthentication=no",
                    "-o",
                    "StrictHostKeyChecking=yes",
                ]);
                if !needs_stdin {
                    argv.push("-n".into());
                }
                argv.push(target.clone());
                // the remote shell re-parses the command line
                argv.push(shell_quote_join(inner));
                argv
            }
        }
    }

    fn with_cwd(&self, inner: Vec<String>) -> Vec<String> {
        if self.cwd.is_empty() {
            return inner;
        }
        // 127: what a shell reports for a command it could not run
        let mut out = strs(&["sh", "-c", "cd \"$1\" || exit 127; shift; exec \"$@\"", "_"]);
        out.push(self.cwd.clone());
        out.extend(inner);
        out
    }

    async fn exec(&self, inner: &[String], max_output: usize, combine_stderr: bool) -> ExecResult {
        run_subprocess(
            &self.build_argv(inner, false),
            ExecOptions {
                max_output,
                timeout: ISOLATE_EXEC_TIMEOUT,
                combine_stderr,
                cwd: None,
                stdin: None,
            },
            None,
        )
        .await
    }

    async fn shell_test(&self, flag: &str, path: &str) -> bool {
        let inner = vec![
            "sh".into(),
            "-c".into(),
            format!("[ {flag} \"$1\" ]"),
            "_".into(),
            path.to_string(),
        ];
        let res = self.exec(&inner, 4096, true).await;
        res.exit_code == 0 && !res.timed_out
    }

    pub async fn is_directory(&self, path: &str) -> bool {
        self.shell_test("-d", &self.resolve(path)).await
    }

    pub async fn is_regular_file(&self, path: &str) -> bool {
        self.shell_test("-f", &self.resolve(path)).await
    }

    pub async fn file_size(&self, path: &str) -> Option<u64> {
        let mut inner = strs(&["sh", "-c", "wc -c < \"$1\"", "_"]);
        inner.push(self.resolve(path));
        let res = self.exec(&inner, 64, true).await;
        if res.exit_code != 0 || res.timed_out {
            return None;
        }
        let text = String::from_utf8_lossy(&res.output);
        let digits: String = text
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect();
        digits.parse().ok()
    }

    /// At most `max` bytes; `None` on failure or when the file is larger.
    pub async fn read_file(&self, path: &str, max: usize) -> Option<Vec<u8>> {
        let inner = vec!["cat".into(), "--".into(), self.resolve(path)];
        let res = self
            .exec(&inner, max.min(ISOLATE_READ_FILE_MAX_SIZE), false)
            .await;
        if res.exit_code != 0 || res.timed_out || res.truncated {
            return None;
        }
        Some(res.output)
    }

    pub async fn write_file(&self, path: &str, content: &[u8]) -> bool {
        let mut inner = strs(&[
            "sh",
            "-c",
            "mkdir -p \"$(dirname \"$1\")\" && cat > \"$1\"",
            "_",
        ]);
        inner.push(self.resolve(path));
        // the content travels on stdin: no argv for the far side to re-parse
        let res = run_subprocess(
            &self.build_argv(&inner, true),
            ExecOptions {
                max_output: 4096,
                timeout: ISOLATE_EXEC_TIMEOUT,
                combine_stderr: true,
                cwd: None,
                stdin: Some(content.to_vec()),
            },
            None,
        )
        .await;
        res.exit_code == 0 && !res.timed_out
    }

    fn split_lines(text: &[u8], strip_dot_slash: bool) -> Vec<String> {
        let text = String::from_utf8_lossy(text);
        let mut out = Vec::new();
        for line in text.split('\n') {
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() {
                continue;
            }
            let line = if strip_dot_slash {
                line.strip_prefix("./").unwrap_or(line)
            } else {
                line
            };
            out.push(line.replace('\\', "/"));
        }
        out
    }

    async fn find_entries(
        &self,
        abs_base: &str,
        max_depth: usize,
        dirs: bool,
        truncated: &mut bool,
    ) -> Vec<String> {
        let prune = JUNK_DIR_NAMES
            .iter()
            .map(|n| format!("-name {n}"))
            .collect::<Vec<_>>()
            .join(" -o ");
        let mut cmd = String::from("cd \"$1\" && find . -mindepth 1");
        if max_depth > 0 {
            cmd += &format!(" -maxdepth {max_depth}");
        }
        cmd += &format!(" \\( {prune} \\) -prune");
        cmd += if dirs {
            " -print -o -type d -print"
        } else {
            " -o -type f -print"
        };
        let inner = vec![
            "sh".into(),
            "-c".into(),
            cmd,
            "_".into(),
            abs_base.to_string(),
        ];
        let res = self.exec(&inner, LIST_MAX_OUTPUT, true).await;
        *truncated = *truncated || res.timed_out;
        let mut lines = Self::split_lines(&res.output, true);
        if res.truncated {
            lines.pop();
            *truncated = true;
        }
        lines
    }

    pub async fn list_entries(&self, base: &str, max_depth: usize, kind: ListKind) -> ListResult {
        let mut out = ListResult::default();
        let abs_base = self.resolve(base);
        if !self.is_directory(base).await {
            out.err = "path does not exist or is not a directory".into();
            return out;
        }
        if kind == ListKind::Files {
            let mut inner = strs(&[
                "sh",
                "-c",
                "cd \"$1\" && git ls-files --cached --others --exclude-standard",
                "_",
            ]);
            inner.push(abs_base.clone());
            let res = self.exec(&inner, LIST_MAX_OUTPUT, true).await;
            if res.exit_code == 0 && !res.timed_out {
                let mut lines = Self::split_lines(&res.output, false);
                if res.truncated {
                    lines.pop();
                    out.truncated = true;
                }
                for rel in lines {
                    if max_depth > 0 && entry_depth(&rel) > max_depth {
                        continue;
                    }
                    out.entries.push(ListEntry { rel, is_dir: false });
                }
                return out;
            }
        }
        let mut truncated = false;
        if matches!(kind, ListKind::Dirs | ListKind::All) {
            for rel in self
                .find_entries(&abs_base, max_depth, true, &mut truncated)
                .await
            {
                out.entries.push(ListEntry { rel, is_dir: true });
            }
        }
        if matches!(kind, ListKind::Files | ListKind::All) {
            for rel in self
                .find_entries(&abs_base, max_depth, false, &mut truncated)
                .await
            {
                out.entries.push(ListEntry { rel, is_dir: false });
            }
        }
        out.truncated = out.truncated || truncated;
        out
    }

    /// Wrapped in the isolate's own `timeout` (killing the host-side client does not
    /// kill what runs inside), with a host-side limit 5 s longer.
    pub async fn run(
        &self,
        args: &[String],
        max_output: usize,
        timeout_secs: u64,
        sink: Option<&mut ChunkSink>,
    ) -> ExecResult {
        let mut inner = vec!["timeout".to_string(), format!("{timeout_secs}s")];
        inner.extend(args.iter().cloned());
        run_subprocess(
            &self.build_argv(&self.with_cwd(inner), true),
            ExecOptions {
                max_output,
                timeout: Duration::from_secs(timeout_secs + 5),
                combine_stderr: true,
                cwd: None,
                stdin: None,
            },
            sink,
        )
        .await
    }
}

// ---------------------------------------------------------------------------------------
// runtime specs
// ---------------------------------------------------------------------------------------

/// `<engine>:<image>` (spawn a container) or `<engine>-container:<id>` (attach).
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct ContainerSpec {
    pub bin: &'static str,
    pub arg: String,
    pub attach: bool,
}

impl ContainerSpec {
    pub fn parse(spec: &str) -> Option<ContainerSpec> {
        for bin in ["docker", "podman"] {
            if let Some(id) = spec.strip_prefix(&format!("{bin}-container:")) {
                return Some(ContainerSpec {
                    bin,
                    arg: id.to_string(),
                    attach: true,
                });
            }
            if let Some(image) = spec.strip_prefix(&format!("{bin}:")) {
                return Some(ContainerSpec {
                    bin,
                    arg: image.to_string(),
                    attach: false,
                });
            }
        }
        None
    }

    /// The id lands on the `<engine> exec` command line: one starting with `-` would
    /// become an engine option (`--privileged`).
    pub fn is_valid_id(id: &str) -> bool {
        id.as_bytes()
            .first()
            .is_some_and(|c| c.is_ascii_alphanumeric())
            && id
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_'))
    }
}

/// ssh reads options from its argv: a target starting with `-` would become one
/// (`-oProxyCommand=<anything>` runs on the host).
pub(crate) fn is_valid_ssh_target(target: &str) -> bool {
    !target.is_empty()
        && !target.starts_with('-')
        && target
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_' | b'@'))
}

/// llama.cpp's `make_tools_io` for a non-empty runtime: the isolate it names, or the
/// error message (a 500 for the caller). Never falls back to the host.
pub(crate) fn parse_isolate(runtime: &str, cwd: &str) -> Result<IsolateIo, String> {
    if let Some(c) = ContainerSpec::parse(runtime) {
        // spawning belongs to the runtime that owns the container, a call only attaches
        if !c.attach {
            return Err(format!(
                "tool runtime must name a running container: {runtime}"
            ));
        }
        if !ContainerSpec::is_valid_id(&c.arg) {
            return Err(format!("invalid container id: {}", c.arg));
        }
        return Ok(IsolateIo {
            isolate: Isolate::Container {
                bin: c.bin.to_string(),
                id: c.arg,
            },
            cwd: cwd.to_string(),
        });
    }
    if let Some(target) = runtime.strip_prefix("ssh:") {
        if !is_valid_ssh_target(target) {
            return Err(format!("invalid ssh target: {target}"));
        }
        return Ok(IsolateIo {
            isolate: Isolate::Ssh {
                target: target.to_string(),
            },
            cwd: cwd.to_string(),
        });
    }
    Err(format!("unknown tool runtime: {runtime}"))
}

/// `--tools-runtime`: the isolate every call without an `x-tool-runtime` header runs in.
#[derive(Debug)]
pub(crate) enum ToolsRuntime {
    /// An existing target (`docker-container:<id>`, `ssh:<target>`), validated at start.
    Static(String),
    /// `docker:<image>` / `podman:<image>`: a container spawned and owned by the server.
    Container(Box<tokio::sync::Mutex<OwnedContainer>>),
}

/// The `<engine> run --rm -i <image> sh` client that keeps the container alive: its
/// shell blocks reading stdin, so closing stdin ends it and `--rm` removes it.
#[derive(Debug)]
pub(crate) struct OwnedContainer {
    bin: &'static str,
    image: String,
    id: String,
    child: Option<tokio::process::Child>,
}

static CIDFILE_COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl OwnedContainer {
    async fn spawn(bin: &'static str, image: &str) -> Result<OwnedContainer, String> {
        let n = CIDFILE_COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cidfile = std::env::temp_dir().join(format!(
            "lamina-tools-runtime-cid-{}-{n}.tmp",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&cidfile);
        let mut cmd = tokio::process::Command::new(bin);
        cmd.args(["run", "--rm", "-i", "--cidfile"])
            .arg(&cidfile)
            .arg(image)
            .arg("sh")
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // its own group: a terminal's Ctrl-C must not kill the client before the server
        // closes its stdin (which is what removes the container)
        #[cfg(unix)]
        cmd.process_group(0);
        let mut child = cmd.spawn().map_err(|_| {
            format!("failed to spawn {bin} container for tools runtime (image: {image})")
        })?;
        let mut id = String::new();
        for _ in 0..100 {
            if let Ok(s) = std::fs::read_to_string(&cidfile) {
                id = s.lines().next().unwrap_or("").trim().to_string();
            }
            if !id.is_empty() {
                break;
            }
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = std::fs::remove_file(&cidfile);
        if id.is_empty() || !ContainerSpec::is_valid_id(&id) {
            let _ = child.start_kill();
            return Err(format!(
                "timed out waiting for {bin} container to start (image: {image})"
            ));
        }
        Ok(OwnedContainer {
            bin,
            image: image.to_string(),
            id,
            child: Some(child),
        })
    }

    /// The spec of the running container, respawned when it died on its own.
    async fn spec(&mut self) -> Result<String, String> {
        let alive = match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        };
        if !alive {
            tracing::warn!(
                "{} tools runtime container \"{}\" died, respawning",
                self.bin,
                self.id
            );
            *self = OwnedContainer::spawn(self.bin, &self.image).await?;
        }
        Ok(format!("{}-container:{}", self.bin, self.id))
    }

    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            drop(child.stdin.take());
            if tokio::time::timeout(Duration::from_secs(10), child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
            }
        }
    }
}

impl ToolsRuntime {
    /// Validates `--tools-runtime`, spawning the container of the `<engine>:<image>`
    /// form.
    pub async fn start(spec: &str) -> Result<ToolsRuntime, String> {
        if let Some(c) = ContainerSpec::parse(spec)
            && !c.attach
        {
            if c.arg.is_empty() {
                return Err(format!(
                    "--tools-runtime {}:<image> requires an image name",
                    c.bin
                ));
            }
            let owned = OwnedContainer::spawn(c.bin, &c.arg).await?;
            return Ok(ToolsRuntime::Container(Box::new(tokio::sync::Mutex::new(
                owned,
            ))));
        }
        parse_isolate(spec, "")?; // nothing to own: reject a bad spec now
        Ok(ToolsRuntime::Static(spec.to_string()))
    }

    pub async fn spec(&self) -> Result<String, String> {
        match self {
            ToolsRuntime::Static(s) => Ok(s.clone()),
            ToolsRuntime::Container(c) => c.lock().await.spec().await,
        }
    }

    pub async fn stop(&self) {
        if let ToolsRuntime::Container(c) = self {
            c.lock().await.stop().await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// the per-call I/O
// ---------------------------------------------------------------------------------------

/// One call's I/O: host or isolate.
#[derive(Clone, Debug)]
pub(crate) enum ToolsIo {
    Host(HostIo),
    Isolate(IsolateIo),
}

/// Why a call's I/O could not be set up.
pub(crate) enum IoSetupError {
    /// A bad runtime (llama.cpp throws: HTTP 500).
    Runtime(String),
    /// The working directory escapes the sandbox (a tool-level `{"error"}`).
    Sandbox(String),
}

impl ToolsIo {
    pub fn new(cwd: &str, runtime: &str, host: &HostSettings) -> Result<ToolsIo, IoSetupError> {
        if runtime.is_empty() {
            return HostIo::new(cwd, host)
                .map(ToolsIo::Host)
                .map_err(IoSetupError::Sandbox);
        }
        parse_isolate(runtime, cwd)
            .map(ToolsIo::Isolate)
            .map_err(IoSetupError::Runtime)
    }

    pub fn is_isolate(&self) -> bool {
        matches!(self, ToolsIo::Isolate(_))
    }

    /// The absolute path a tool works on (confined when sandboxed), as a string.
    pub fn confine(&self, path: &str) -> Result<String, String> {
        match self {
            ToolsIo::Host(h) => h.confine(path).map(|p| path_to_string(&p)),
            ToolsIo::Isolate(i) => Ok(i.resolve(path)),
        }
    }

    pub async fn is_directory(&self, abs: &str) -> bool {
        match self {
            ToolsIo::Host(_) => {
                let p = PathBuf::from(abs);
                blocking(move || p.is_dir(), false).await
            }
            ToolsIo::Isolate(i) => i.is_directory(abs).await,
        }
    }

    pub async fn is_regular_file(&self, abs: &str) -> bool {
        match self {
            ToolsIo::Host(_) => {
                let p = PathBuf::from(abs);
                blocking(
                    move || std::fs::metadata(p).is_ok_and(|m| m.is_file()),
                    false,
                )
                .await
            }
            ToolsIo::Isolate(i) => i.is_regular_file(abs).await,
        }
    }

    pub async fn file_size(&self, abs: &str) -> Option<u64> {
        match self {
            ToolsIo::Host(_) => {
                let p = PathBuf::from(abs);
                blocking(move || host_file_size(&p), None).await
            }
            ToolsIo::Isolate(i) => i.file_size(abs).await,
        }
    }

    pub async fn read_file(&self, abs: &str, max: usize) -> Option<Vec<u8>> {
        match self {
            ToolsIo::Host(_) => {
                let p = PathBuf::from(abs);
                blocking(move || host_read_file(&p, max), None).await
            }
            ToolsIo::Isolate(i) => i.read_file(abs, max).await,
        }
    }

    pub async fn write_file(&self, abs: &str, content: Vec<u8>) -> bool {
        match self {
            ToolsIo::Host(_) => {
                let p = PathBuf::from(abs);
                blocking(move || host_write_file(&p, &content), false).await
            }
            ToolsIo::Isolate(i) => i.write_file(abs, &content).await,
        }
    }

    pub async fn list_entries(
        &self,
        abs_base: &str,
        max_depth: usize,
        kind: ListKind,
    ) -> ListResult {
        match self {
            ToolsIo::Host(_) => host_list_entries(Path::new(abs_base), max_depth, kind).await,
            ToolsIo::Isolate(i) => i.list_entries(abs_base, max_depth, kind).await,
        }
    }

    pub async fn run(
        &self,
        args: &[String],
        max_output: usize,
        timeout_secs: u64,
        sink: Option<&mut ChunkSink>,
    ) -> ExecResult {
        match self {
            ToolsIo::Host(h) => {
                let cwd = h.cwd().map(path_to_string);
                run_subprocess(
                    args,
                    ExecOptions {
                        max_output,
                        timeout: Duration::from_secs(timeout_secs),
                        combine_stderr: true,
                        cwd: cwd.as_deref(),
                        stdin: None,
                    },
                    sink,
                )
                .await
            }
            ToolsIo::Isolate(i) => i.run(args, max_output, timeout_secs, sink).await,
        }
    }
}
