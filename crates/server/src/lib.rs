//! `lamina serve`: an OpenAI-compatible HTTP server (tokio + axum) over any model that
//! implements [`Engine`], a llama.cpp-style context/batch interface. It owns the HTTP
//! API (`/v1/chat/completions`, `/v1/completions`, `/v1/models`, `/v1/embeddings`, and
//! llama-server's `/completion`, `/tokenize`, `/detokenize`, `/health`, `/props`,
//! `/slots`, `/metrics`), the built-in chat page at `/`, request validation with
//! OpenAI-format errors, and the scheduler: one engine thread running `-np` slots with
//! continuous batching over one shared KV cache, a bounded wait queue (503 when full),
//! cancellation on client disconnect and per-request timeouts. [`fake::FakeEngine`] is a
//! deterministic stand-in model for tests and load tests.

pub mod api;
pub mod engine;
pub mod error;
pub mod fake;
pub mod metrics;
mod routes;
pub mod scheduler;
pub mod testing;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

pub use engine::{Batch, BatchEntry, ChatMessage, Engine, EngineError, Pos, SeqId, Token};
pub use error::ApiError;

/// How the server runs (everything but the model).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    /// When set, every endpoint but `/`, `/health` needs `Authorization: Bearer <key>`.
    pub api_key: Option<String>,
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
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: None,
            timeout: Some(Duration::from_secs(600)),
            max_body_bytes: 8 << 20,
            schema_limits: Default::default(),
            reasoning_format: Default::default(),
            n_batch: 512,
            queue_size: 64,
        }
    }
}

/// Starts the engine thread for `engine` and returns the HTTP routes in front of it.
/// The thread ends once the router (and every clone of it) is dropped.
pub fn router(engine: Box<dyn Engine>, config: &ServerConfig) -> std::io::Result<axum::Router> {
    routes::build(engine, config)
}

/// Binds `config.host:config.port` and serves until Ctrl-C.
pub async fn serve(engine: Box<dyn Engine>, config: ServerConfig) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind((config.host.as_str(), config.port)).await?;
    let addr = listener.local_addr()?;
    eprintln!("lamina serve: listening on http://{addr}");
    serve_on(listener, engine, &config, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}

/// Serves on an already bound listener until `shutdown` completes (tests bind
/// `127.0.0.1:0`).
pub async fn serve_on(
    listener: tokio::net::TcpListener,
    engine: Box<dyn Engine>,
    config: &ServerConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = router(engine, config)?;
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// Starts a server on an ephemeral loopback port in the current runtime and returns its
/// address (for tests, examples and the load test).
pub async fn spawn_local(
    engine: Box<dyn Engine>,
    config: ServerConfig,
) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let app = router(engine, &config)?;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok(addr)
}

/// [`serve`] on a new multi-threaded tokio runtime, for callers without one (the CLI).
pub fn serve_blocking(engine: Box<dyn Engine>, config: ServerConfig) -> std::io::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(serve(engine, config))
}
