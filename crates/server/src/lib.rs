//! `lamina serve`: an OpenAI-compatible HTTP server (tokio + axum) over any model that
//! implements [`Engine`], a llama.cpp-style context/batch interface. It owns the HTTP
//! API (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/v1/embeddings`, and
//! llama-server's `/completion`, `/tokenize`, `/detokenize`, `/health`, `/props`,
//! `/slots`, `/metrics`), the built-in chat page at `/`, request validation with
//! OpenAI-format errors, and the scheduler: one engine thread running `-np` slots with
//! continuous batching over one shared KV cache, a bounded wait queue (503 when full),
//! cancellation on client disconnect and per-request timeouts. [`fake::FakeEngine`] is a
//! deterministic stand-in model for tests and load tests.

pub mod anthropic;
pub mod api;
pub mod engine;
pub mod error;
pub mod fake;
mod http_limits;
pub mod metrics;
pub mod model_router;
pub mod responses;
mod routes;
pub mod scheduler;
pub mod server_tools;
pub mod testing;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

pub use engine::{Batch, BatchEntry, ChatMessage, Engine, EngineError, Pooling, Pos, SeqId, Token};
pub use error::ApiError;

/// How the server runs (everything but the model).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Addresses to listen on, comma-separated (llama-server's `--host 127.0.0.1,::1`).
    pub host: String,
    pub port: u16,
    /// When non-empty, every endpoint but `/`, `/health` needs `Authorization: Bearer <key>`
    /// (or `X-Api-Key: <key>`) with one of these keys.
    pub api_keys: Vec<String>,
    /// Names the model answers to (`-a a,b`); `/v1/models` reports the first in sorted
    /// order as the id, as llama-server does. Empty: the model's own name.
    pub aliases: Vec<String>,
    /// `--tags`, reported by `/v1/models`.
    pub tags: Vec<String>,
    /// The model file, for `/props`.
    pub model_path: String,
    /// Request defaults from the command line (`--temp`, `--seed`, `--top-k`, ...), under
    /// the request field names; a request's own value wins.
    pub default_params: serde_json::Map<String, serde_json::Value>,
    /// `-n`: how many tokens a request that says nothing may generate.
    pub n_predict: Option<u32>,
    /// `/slots` answers (`--slots`, the default; `--no-slots` makes it 501).
    pub slots_endpoint: bool,
    /// `/metrics` answers (`--metrics`; off by default, as in llama-server).
    pub metrics_endpoint: bool,
    /// The chat page at `/` (`--no-ui` turns it off).
    pub web_ui: bool,
    /// Cross-origin requests (`--cors-*`).
    pub cors: Cors,
    /// `--verbose`: responses carry llama-server's `__verbose` object (the prompt, ...).
    pub verbose: bool,
    /// Chat templates run as Jinja (`--jinja`, the default); off, llama.cpp's built-in
    /// formats are used and tools are refused.
    pub jinja: bool,
    /// How embeddings are pooled (`--pooling`; `--reranking` makes it [`Pooling::Rank`],
    /// which turns `/rerank` on and embeddings off).
    pub pooling: Pooling,
    /// `--cache-ram N`: MiB of host memory for prompts that leave their slot (0: none).
    pub cache_ram_mib: usize,
    /// `--cache-idle-slots` (on; `--no-cache-idle-slots`): idle slots go to the prompt
    /// cache when a request starts.
    pub cache_idle_slots: bool,
    /// `--context-shift`: a generation that fills its slot's context drops older tokens and
    /// goes on (off by default, as in llama-server). Request defaults `--keep` and
    /// `--cache-reuse` go into `default_params` as `n_keep` and `n_cache_reuse`.
    pub ctx_shift: bool,
    /// `--swa-full` (the SWA layers' cache is full-size: Lamina's always is; it changes how
    /// prompts are batched, as in llama-server).
    pub swa_full: bool,
    /// `--spm-infill`: `/infill` prompts are suffix, prefix, middle (SPM order).
    pub spm_infill: bool,
    /// `--ui-mcp-proxy`: `/cors-proxy?url=` forwards requests for the web UI's MCP clients.
    pub cors_proxy: bool,
    /// `--slot-save-path`: where `POST /slots/{id}?action=save|restore` keep slot files.
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Server tools and MCP servers (`--tools`, `--mcp-servers-*`; off by default).
    pub tools: server_tools::ToolsConfig,
    /// `--sleep-idle-seconds`: idle this long, the model is unloaded until the next
    /// request that needs it.
    pub sleep_idle: Option<Duration>,
    /// Vertex AI's prediction routes (`AIP_MODE=PREDICTION`).
    pub vertex: Option<Vertex>,
    /// `--reasoning on|off|auto`: whether templates are asked to think.
    pub reasoning: lamina_chat::Reasoning,
    /// Longest time one request may take, waiting in the queue included.
    pub timeout: Option<Duration>,
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// Bounds on JSON schemas (nesting depth, rules, repetition counts).
    pub schema_limits: lamina_grammar::json_schema::SchemaOptions,
    /// Where `<think>` reasoning goes in chat answers (`--reasoning-format`).
    pub reasoning_format: lamina_chat::ReasoningFormat,
    /// Most tokens in one decode step (`-b`).
    pub n_batch: u32,
    /// Requests that may wait for a slot; beyond it the server answers 503.
    pub queue_size: usize,
    /// Limits on the HTTP connections themselves.
    pub http: HttpLimits,
}

/// What one HTTP connection may take, with the defaults a reverse proxy would pick (nginx:
/// 60 s to send the headers or between two body reads, headers in a few KiB, 75 s idle).
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// Largest request head (start line and headers); beyond it, 431.
    pub max_header_bytes: usize,
    /// Most header fields in one request; beyond it, 431.
    pub max_headers: usize,
    /// Longest wait for a request's head, which is also how long an idle keep-alive
    /// connection stays open (slow clients that trickle headers are cut off).
    pub header_timeout: Duration,
    /// Longest wait between two pieces of a request body; beyond it, 408.
    pub body_timeout: Duration,
    /// Most connections open at once; more are answered 503 and closed.
    pub max_connections: usize,
    /// On SIGTERM or Ctrl-C, how long requests in flight may take to finish before the
    /// server exits anyway.
    pub drain_timeout: Duration,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits {
            max_header_bytes: 64 << 10,
            max_headers: 100,
            header_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            max_connections: 1024,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_keys: Vec::new(),
            aliases: Vec::new(),
            tags: Vec::new(),
            model_path: String::new(),
            default_params: serde_json::Map::new(),
            n_predict: None,
            slots_endpoint: true,
            metrics_endpoint: false,
            web_ui: true,
            cors: Cors::default(),
            verbose: false,
            jinja: true,
            reasoning: lamina_chat::Reasoning::Auto,
            pooling: Pooling::Mean,
            vertex: None,
            sleep_idle: None,
            tools: Default::default(),
            slot_save_path: None,
            cors_proxy: false,
            cache_ram_mib: 0,
            cache_idle_slots: true,
            ctx_shift: false,
            swa_full: false,
            spm_infill: false,
            timeout: Some(Duration::from_secs(600)),
            max_body_bytes: 8 << 20,
            schema_limits: Default::default(),
            reasoning_format: Default::default(),
            n_batch: 512,
            queue_size: 64,
            http: HttpLimits::default(),
        }
    }
}

/// Vertex AI's custom-container routes, as llama-server serves them under
/// `AIP_MODE=PREDICTION`.
#[derive(Clone, Debug)]
pub struct Vertex {
    /// `AIP_PREDICT_ROUTE` (default `/predict`).
    pub predict_route: String,
    /// `AIP_HEALTH_ROUTE`: another `/health`.
    pub health_route: Option<String>,
}

impl Vertex {
    /// From the environment Vertex AI sets (`AIP_MODE`, `AIP_PREDICT_ROUTE`,
    /// `AIP_HEALTH_ROUTE`; the port, `AIP_HTTP_PORT`, is the caller's), if in prediction mode.
    pub fn from_env() -> Option<Vertex> {
        if std::env::var("AIP_MODE").ok().as_deref() != Some("PREDICTION") {
            return None;
        }
        let route = |name: &str| {
            std::env::var(name).ok().filter(|v| !v.is_empty()).map(|v| {
                if v.starts_with('/') {
                    v
                } else {
                    format!("/{v}")
                }
            })
        };
        Some(Vertex {
            predict_route: route("AIP_PREDICT_ROUTE").unwrap_or_else(|| "/predict".into()),
            health_route: route("AIP_HEALTH_ROUTE"),
        })
    }
}

/// llama-server's CORS settings.
#[derive(Clone, Debug)]
pub struct Cors {
    /// `*` (any origin), `localhost` (only origins on localhost, 127.0.0.1 or ::1 are
    /// reflected) or the literal `Access-Control-Allow-Origin` value.
    pub origins: String,
    pub methods: String,
    pub headers: String,
    pub credentials: bool,
}

impl Default for Cors {
    fn default() -> Self {
        Cors {
            origins: "*".into(),
            methods: "GET, POST, DELETE, OPTIONS".into(),
            headers: "*".into(),
            credentials: true,
        }
    }
}

/// Starts the engine thread for `engine` and returns the HTTP routes in front of it, with
/// the server tools off. The thread ends once the router (and every clone of it) is dropped.
pub fn router(engine: Box<dyn Engine>, config: &ServerConfig) -> std::io::Result<axum::Router> {
    routes::build(engine, config, server_tools::ServerTools::disabled())
}

/// [`router`] with the configured server tools and MCP servers started.
pub async fn router_with_tools(
    engine: Box<dyn Engine>,
    config: &ServerConfig,
) -> std::io::Result<(axum::Router, server_tools::ServerTools)> {
    let tools = server_tools::ServerTools::start(config.tools.clone())
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((routes::build(engine, config, tools.clone())?, tools))
}

/// Binds every address of `config.host` (comma-separated) at `config.port` and serves
/// until Ctrl-C.
pub async fn serve(engine: Box<dyn Engine>, config: ServerConfig) -> std::io::Result<()> {
    serve_until(engine, config, std::future::pending()).await
}

/// [`serve`], stopping as on SIGTERM when `fatal` completes with its reason (the devices the
/// engine needs are lost for good: the requests that needed them have failed with a 5xx that
/// says so, and later ones would fail the same way).
pub async fn serve_until(
    engine: Box<dyn Engine>,
    config: ServerConfig,
    fatal: impl Future<Output = String>,
) -> std::io::Result<()> {
    let (app, tools) = router_with_tools(engine, &config).await?;
    let stopping = tools.clone();
    let r = serve_app_until(
        app,
        &config,
        async move { stopping.shutdown().await },
        fatal,
    )
    .await;
    tools.shutdown().await;
    r
}

/// Serves `app` (one model's server, or the router of several) on every address of
/// `config.host` at `config.port` until Ctrl-C or SIGTERM.
pub async fn serve_app(app: axum::Router, config: &ServerConfig) -> std::io::Result<()> {
    serve_app_until(app, config, async {}, std::future::pending()).await
}

/// [`serve_app`], running `on_stop` as soon as a stop is asked for, before the requests in
/// flight drain: the server tools stop there, so a slow tool call ends at once instead of
/// holding the shutdown (as llama-server's).
async fn serve_app_until(
    app: axum::Router,
    config: &ServerConfig,
    on_stop: impl Future<Output = ()>,
    fatal: impl Future<Output = String>,
) -> std::io::Result<()> {
    let hosts: Vec<&str> = config
        .host
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    if hosts.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "--host needs at least one address",
        ));
    }
    let mut listeners = Vec::with_capacity(hosts.len());
    for host in &hosts {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let listener = tokio::net::TcpListener::bind((host, config.port))
            .await
            .map_err(|e| std::io::Error::new(e.kind(), format!("cannot listen on {host}: {e}")))?;
        eprintln!(
            "lamina serve: listening on http://{}",
            listener.local_addr()?
        );
        listeners.push(listener);
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut servers = tokio::task::JoinSet::new();
    for listener in listeners {
        let mut stop = stop_rx.clone();
        let app = app.clone();
        servers.spawn(serve_http1(listener, app, config.http, async move {
            let _ = stop.wait_for(|s| *s).await;
        }));
    }
    drop(app);
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminated() => {
            eprintln!("lamina serve: SIGTERM, finishing the requests in flight");
        }
        reason = fatal => {
            eprintln!("lamina serve: {reason}; finishing the requests in flight and stopping");
        }
        Some(r) = servers.join_next() => {
            let _ = stop_tx.send(true);
            r.map_err(std::io::Error::other)??;
        }
    }
    let _ = stop_tx.send(true);
    on_stop.await;
    while let Some(r) = servers.join_next().await {
        r.map_err(std::io::Error::other)??;
    }
    Ok(())
}

/// Completes when the process gets SIGTERM (never elsewhere than on Unix).
async fn terminated() {
    #[cfg(unix)]
    if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        s.recv().await;
        return;
    }
    std::future::pending::<()>().await
}

/// Serves HTTP/1.1 connections from `listener` with `app` until `shutdown` completes, then
/// lets the open connections finish. Header names go out title-cased
/// (`Access-Control-Allow-Origin`), as llama-server writes them: clients that copy the
/// headers into a plain dictionary look them up that way. `limits` bound each connection.
async fn serve_http1(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: HttpLimits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    let connections = std::sync::Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    loop {
        let stream = tokio::select! {
            r = listener.accept() => match r {
                Ok((stream, _)) => stream,
                Err(e) if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::Interrupted
                ) => continue,
                Err(_) => {
                    // Out of file descriptors or the like: back off instead of spinning.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(permit) = connections.clone().try_acquire_owned() else {
            tokio::spawn(http_limits::refuse_connection(
                stream,
                limits.max_connections,
            ));
            continue;
        };
        let app = app.clone();
        let body_timeout = limits.body_timeout;
        let service =
            hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                let req = req
                    .map(|b| axum::body::Body::new(http_limits::TimeoutBody::new(b, body_timeout)));
                tower::ServiceExt::oneshot(app.clone(), req)
            });
        let conn = hyper::server::conn::http1::Builder::new()
            .title_case_headers(true)
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .max_headers(limits.max_headers)
            .max_header_size(limits.max_header_bytes)
            .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    // Requests in flight finish, within the drain bound.
    if tokio::time::timeout(limits.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        eprintln!(
            "lamina serve: requests still running after {} s; closing them",
            limits.drain_timeout.as_secs()
        );
    }
    Ok(())
}

/// Serves on an already bound listener until `shutdown` completes (tests bind
/// `127.0.0.1:0`).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    engine: Box<dyn Engine>,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let (app, _tools) = router_with_tools(engine, config).await?;
    serve_http1(listener, app, config.http, shutdown).await
}

/// Starts a server on an ephemeral loopback port in the current runtime and returns its
/// address (for tests, examples and the load test).
pub async fn spawn_local(
    engine: Box<dyn Engine>,
    config: ServerConfig,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (app, _tools) = router_with_tools(engine, &config).await?;
    tokio::spawn(serve_http1(
        listener,
        app,
        config.http,
        std::future::pending(),
    ));
    Ok(addr)
}

/// Serves `app` on an ephemeral loopback port in the current runtime (tests).
pub async fn spawn_app(app: axum::Router) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve_http1(
        listener,
        app,
        HttpLimits::default(),
        std::future::pending(),
    ));
    Ok(addr)
}

/// [`serve`] on a new multi-threaded tokio runtime, for callers without one (the CLI).
pub fn serve_blocking(engine: Box<dyn Engine>, config: ServerConfig) -> std::io::Result<()> {
    serve_blocking_until(engine, config, None)
}

/// [`serve_until`] on a new multi-threaded tokio runtime; `fatal` is a blocking wait for the
/// reason to stop (run on a thread of its own), if there is one to wait for.
pub fn serve_blocking_until(
    engine: Box<dyn Engine>,
    config: ServerConfig,
    fatal: Option<Box<dyn FnOnce() -> String + Send>>,
) -> std::io::Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if let Some(wait) = fatal {
        std::thread::Builder::new()
            .name("lamina-serve-fatal".into())
            .spawn(move || {
                let _ = tx.send(wait());
            })?;
    }
    let fatal = async move {
        match rx.await {
            Ok(reason) => reason,
            // Nothing to wait for: never.
            Err(_) => std::future::pending().await,
        }
    };
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve_until(engine, config, fatal))
}

/// [`serve_app`] on a new multi-threaded tokio runtime.
pub fn serve_app_blocking(app: axum::Router, config: &ServerConfig) -> std::io::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve_app(app, config))
}

/// Router mode ([`model_router`]) with the configured server tools, served until Ctrl-C
/// on a new multi-threaded tokio runtime.
pub fn serve_router_blocking(
    router: model_router::RouterConfig,
    loader: model_router::Loader,
    config: ServerConfig,
) -> std::io::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(async move {
            let tools = server_tools::ServerTools::start(config.tools.clone())
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            let app = model_router::build(router, loader, config.clone(), tools.clone());
            let stopping = tools.clone();
            let r = serve_app_until(
                app,
                &config,
                async move { stopping.shutdown().await },
                std::future::pending(),
            )
            .await;
            tools.shutdown().await;
            r
        })
}
