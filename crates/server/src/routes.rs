//! The HTTP routes: request handling, response shapes (OpenAI's and llama-server's),
//! SSE streaming, API-key checks and the chat page.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::StreamExt;
use futures_util::stream::{self, BoxStream};
use serde_json::{Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use crate::ServerConfig;
use crate::api::{self, GenRequest, MAX_CHOICES};
use crate::engine::ChatMessage;
use crate::engine::{Engine, Token};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scheduler::{
    self, ChatPrompt, Command, Done, EngineInfo, Event, GenParams, Job, Prompt, TokenProbs, TopProb,
};
use lamina_chat::{ChatError, Format, ParsedMessage, ReasoningFormat, ToolCall, ToolChoice, Tools};

pub(crate) const CHAT_PAGE: &str = include_str!("chat.html");

#[derive(Clone)]
struct AppState(Arc<Inner>);

struct Inner {
    cmd: Sender<Command>,
    info: EngineInfo,
    config: ServerConfig,
    metrics: Arc<Metrics>,
    permits: Arc<Semaphore>,
    capacity: usize,
    next_id: AtomicU64,
    created: u64,
}

pub fn build(
    engine: Box<dyn Engine>,
    config: &ServerConfig,
    tools: crate::server_tools::ServerTools,
) -> std::io::Result<Router> {
    let metrics = Arc::new(Metrics::default());
    let cache = scheduler::CacheSettings {
        ram_bytes: config.cache_ram_mib.saturating_mul(1 << 20),
        idle_slots: config.cache_idle_slots,
        ctx_shift: config.ctx_shift,
        swa_full: config.swa_full,
        spm_infill: config.spm_infill,
        verbose: config.verbose,
    };
    let (cmd, info) = scheduler::spawn(
        engine,
        config.n_batch,
        metrics.clone(),
        config.sleep_idle,
        cache,
    )?;
    let capacity = info.n_slots as usize + config.queue_size;
    let state = AppState(Arc::new(Inner {
        cmd,
        info,
        config: config.clone(),
        metrics,
        permits: Arc::new(Semaphore::new(capacity)),
        capacity,
        next_id: AtomicU64::new(1),
        created: unix_now(),
    }));
    let protected = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/completion", post(native_completion))
        .route("/completions", post(native_completion))
        .route("/infill", post(infill))
        .route("/v1/embeddings", post(embeddings))
        .route("/embeddings", post(native_embeddings))
        .route("/embedding", post(native_embeddings))
        .route("/rerank", post(rerank))
        .route("/reranking", post(rerank))
        .route("/v1/rerank", post(rerank))
        .route("/v1/reranking", post(rerank))
        .route("/tokenize", post(tokenize))
        .route("/apply-template", post(apply_template))
        .route("/v1/messages", post(messages))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/chat/completions/input_tokens", post(input_tokens))
        .route("/v1/responses", post(responses))
        .route("/responses", post(responses))
        .route("/v1/responses/input_tokens", post(responses_input_tokens))
        .route("/responses/input_tokens", post(responses_input_tokens))
        .route("/v1/chat/completions/input_tokens", post(input_tokens))
        .route("/detokenize", post(detokenize))
        .route("/v1/models", get(models))
        .route("/models", get(models))
        .route("/props", get(props))
        .route("/slots", get(slots))
        .route("/slots/{id}", post(slot_action))
        .route("/metrics", get(metrics_text))
        .route("/tools", get(tools_list).post(tools_call))
        .route("/cors-proxy", get(cors_proxy).post(cors_proxy))
        .layer(axum::Extension(tools))
        .route_layer(middleware::from_fn_with_state(state.clone(), auth));
    let mut app = Router::new()
        .route("/health", get(health))
        .route("/v1/health", get(health));
    if config.web_ui {
        app = app.route("/", get(page));
    }
    let app = app
        .merge(protected)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), cors))
        .with_state(state);
    Ok(match &config.vertex {
        Some(v) => Gcp {
            predict: v.predict_route.clone(),
            health: v.health_route.clone(),
        }
        .wrap(app),
        None => app,
    })
}

/// Vertex AI's custom-container contract (`AIP_MODE=PREDICTION`), as llama-server
/// follows it: `POST $AIP_PREDICT_ROUTE` (default `/predict`) takes `{"instances": [...]}`,
/// each naming the endpoint it is for in `@requestFormat` (a path, or its camelCase
/// alias: `chatCompletions` for `/v1/chat/completions`), answers each through that
/// endpoint (never streamed) and returns `{"predictions": [...]}`; `$AIP_HEALTH_ROUTE`
/// is another `/health`.
struct Gcp {
    predict: String,
    health: Option<String>,
}

/// The POST endpoints an instance may name.
const GCP_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/completion",
    "/v1/embeddings",
    "/embeddings",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/responses",
    "/rerank",
    "/v1/rerank",
    "/infill",
];

/// llama-server's alias of a path: `/v1` dropped, then camelCase over `/`, `-`, `_`.
fn gcp_alias(path: &str) -> String {
    let s = path
        .strip_prefix("/v1")
        .filter(|_| path.len() > 3)
        .unwrap_or(path);
    let s = s.strip_prefix('/').unwrap_or(s);
    let mut out = String::new();
    let mut cap = false;
    for c in s.chars() {
        if c == ':' {
            break;
        }
        if matches!(c, '/' | '-' | '_') {
            cap = true;
        } else {
            out.push(if cap { c.to_ascii_uppercase() } else { c });
            cap = false;
        }
    }
    out
}

impl Gcp {
    fn wrap(self, app: Router) -> Router {
        let inner = app.clone();
        let mut extra = Router::new().route(
            &self.predict,
            post(move |headers: HeaderMap, body: Body| gcp_predict(inner.clone(), headers, body)),
        );
        if let Some(h) = &self.health {
            extra = extra.route(h, get(health));
        }
        extra.merge(app)
    }
}

async fn gcp_predict(app: Router, headers: HeaderMap, body: Body) -> Response {
    use tower::ServiceExt;
    let bad = |m: &str| ApiError::bad_request(m).into_response();
    let Ok(bytes) = axum::body::to_bytes(body, 8 << 20).await else {
        return bad("the request body is too large");
    };
    let data: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        Err(e) => return bad(&e.to_string()),
    };
    let Some(data) = data.as_object() else {
        return bad("request body must be a JSON object");
    };
    let Some(instances) = data.get("instances").and_then(Value::as_array) else {
        return bad("request body must include an array field named instances");
    };
    if instances.len() > 128 {
        return bad("instances array exceeds maximum size of 128");
    }
    let error = |m: String| json!({"error": ApiError::bad_request(m).body()["error"]});
    let calls = instances.iter().map(|instance| {
        let app = app.clone();
        let headers = headers.clone();
        async move {
            let Some(obj) = instance.as_object() else {
                return error("each instance must be a JSON object".into());
            };
            let Some(format) = obj.get("@requestFormat").and_then(Value::as_str) else {
                return error("each instance must include a string @requestFormat".into());
            };
            let path = GCP_PATHS
                .iter()
                .find(|p| gcp_alias(p) == format || **p == format);
            let Some(path) = path else {
                return error(format!(
                    "no handler registered for @requestFormat: {format}"
                ));
            };
            let mut payload = obj.clone();
            payload.remove("@requestFormat");
            if payload.contains_key("stream") {
                payload.insert("stream".into(), json!(false));
            }
            let mut req = Request::builder().method("POST").uri(*path);
            for (k, v) in &headers {
                if k != header::CONTENT_LENGTH {
                    req = req.header(k, v);
                }
            }
            let Ok(req) = req
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(Value::Object(payload).to_string()))
            else {
                return error("bad instance".into());
            };
            let Ok(resp) = app.oneshot(req).await;
            let bytes = axum::body::to_bytes(resp.into_body(), 64 << 20)
                .await
                .unwrap_or_default();
            if bytes.is_empty() {
                return Value::Null;
            }
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        }
    });
    let predictions = futures_util::future::join_all(calls).await;
    axum::Json(json!({"predictions": predictions})).into_response()
}

/// `GET /tools`: the server tools and MCP tools (403 when none are enabled).
async fn tools_list(
    axum::Extension(tools): axum::Extension<crate::server_tools::ServerTools>,
) -> Response {
    tools.list().into_response()
}

/// `POST /tools`: runs one (`{"tool": NAME, "params": {...}}`).
async fn tools_call(
    axum::Extension(tools): axum::Extension<crate::server_tools::ServerTools>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    tools.call(&body, &headers).await.into_response()
}

/// `POST /slots/{id}?action=save|restore|erase` (`{"filename": F}` for the first two, a
/// plain name inside `--slot-save-path`).
async fn slot_action(
    State(st): State<AppState>,
    axum::extract::Path(id): axum::extract::Path<String>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let r = async {
        let Some(dir) = st.0.config.slot_save_path.clone() else {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "not_supported_error",
                "This server does not support slots action. Start it with `--slot-save-path`",
            ));
        };
        let id: u32 = id
            .parse()
            .ok()
            .filter(|&i| i < st.0.info.n_slots)
            .ok_or_else(|| ApiError::invalid_param("id_slot", format!("no slot {id}")))?;
        let file = || async {
            let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
            let name = map
                .get("filename")
                .and_then(Value::as_str)
                .ok_or_else(|| ApiError::invalid_param("filename", "filename is required"))?;
            if !valid_file_name(name) {
                return Err(ApiError::invalid_param("filename", "Invalid filename"));
            }
            Ok(dir.join(name))
        };
        let action = match q.get("action").map(String::as_str) {
            Some("save") => scheduler::SlotAction::Save(file().await?),
            Some("restore") => scheduler::SlotAction::Restore(file().await?),
            Some("erase") => scheduler::SlotAction::Erase,
            _ => return Err(ApiError::invalid_param("action", "Invalid action")),
        };
        let v = st
            .ask(|reply| Command::Slot { id, action, reply })
            .await??;
        Ok(axum::Json(v).into_response())
    };
    respond(r.await)
}

/// A file name that stays in its folder: no separators, no `..`, nothing odd.
fn valid_file_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ' '))
}

/// `/cors-proxy?url=http://…` (`--ui-mcp-proxy`): the request forwarded for the chat page's
/// MCP clients, which a browser would not let reach another origin. Only the headers the
/// client names `x-llama-server-proxy-header-NAME` go along (never its own credentials or
/// cookies); plain HTTP targets only.
async fn cors_proxy(
    State(st): State<AppState>,
    method: axum::http::Method,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if !st.0.config.cors_proxy {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "feature_disabled",
            "the CORS proxy is disabled (start the server with --ui-mcp-proxy)",
        )
        .into_response();
    }
    let r = async {
        let bad = |m: String| ApiError::internal(m);
        let url = q
            .get("url")
            .ok_or_else(|| ApiError::invalid_param("url", "url is required"))?;
        let uri: axum::http::Uri = url
            .parse()
            .map_err(|e| bad(format!("invalid target URL: {e}")))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(s) => return Err(bad(format!("unsupported URL scheme in target URL: {s}"))),
            None => return Err(bad("invalid target URL: missing scheme".into())),
        }
        let Some(authority) = uri.authority() else {
            return Err(bad("invalid target URL: missing host".into()));
        };
        if authority.as_str().contains('@') {
            return Err(bad("authentication in target URL is not supported".into()));
        }
        let mut req = axum::http::Request::builder()
            .method(method)
            .uri(uri.clone());
        for (k, v) in &headers {
            if let Some(name) = k.as_str().strip_prefix("x-llama-server-proxy-header-")
                && !name.is_empty()
            {
                req = req.header(name, v);
            }
        }
        let req = req
            .body(http_body_util::Full::new(body))
            .map_err(|e| bad(format!("invalid proxied request: {e}")))?;
        let client =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http();
        let resp = tokio::time::timeout(std::time::Duration::from_secs(600), client.request(req))
            .await
            .map_err(|_| bad("the proxied request timed out".into()))?
            .map_err(|e| bad(format!("the proxied request failed: {e}")))?;
        let (parts, body) = resp.into_parts();
        let mut out = Response::builder().status(parts.status);
        for (k, v) in &parts.headers {
            if !matches!(
                k.as_str(),
                "connection" | "transfer-encoding" | "keep-alive" | "upgrade" | "content-length"
            ) {
                out = out.header(k, v);
            }
        }
        out.body(Body::new(body))
            .map_err(|e| bad(format!("bad proxied response: {e}")))
    };
    respond(r.await)
}

/// llama-server's answer for an endpoint turned off by a flag.
fn not_supported(message: &str) -> Response {
    ApiError::new(StatusCode::NOT_IMPLEMENTED, "not_supported_error", message)
        .with_code("not_supported")
        .into_response()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if !key_ok(&st.0.config.api_keys, req.headers()) {
        return ApiError::unauthorized().into_response();
    }
    next.run(req).await
}

/// Whether `headers` carry one of `keys` (`Authorization: Bearer K`, `Authorization: K`
/// or `X-Api-Key: K`); no keys means no check.
pub(crate) fn key_ok(keys: &[String], headers: &HeaderMap) -> bool {
    if keys.is_empty() {
        return true;
    }
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.strip_prefix("Bearer ").unwrap_or(v))
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()));
    // Every key is compared, so the time taken does not say which one nearly matched.
    given.is_some_and(|g| {
        keys.iter().fold(false, |ok, k| {
            ok | constant_time_eq(g.as_bytes(), k.as_bytes())
        })
    })
}

/// llama-server's CORS: the allowed origin on every response (reflected for `*` with
/// credentials, reflected only for localhost origins with `localhost`, else the
/// configured value), and `OPTIONS` preflights answered here, before the API-key check
/// (browsers send no credentials with them).
async fn cors(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let c = &st.0.config.cors;
    let origin = req
        .headers()
        .get(header::ORIGIN)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let allow = if c.credentials && c.origins == "*" {
        Some(origin.clone())
    } else if c.origins == "localhost" {
        (!origin.is_empty() && origin_is_localhost(&origin)).then(|| origin.clone())
    } else {
        Some(c.origins.clone())
    };
    let preflight = req.method() == axum::http::Method::OPTIONS;
    let mut resp = if preflight {
        let mut r = (StatusCode::OK, [(header::CONTENT_TYPE, "text/html")], "").into_response();
        let h = r.headers_mut();
        let set = |h: &mut HeaderMap, name: header::HeaderName, v: &str| {
            if let Ok(v) = axum::http::HeaderValue::from_str(v) {
                h.insert(name, v);
            }
        };
        set(
            h,
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            if c.credentials { "true" } else { "false" },
        );
        set(h, header::ACCESS_CONTROL_ALLOW_METHODS, &c.methods);
        set(h, header::ACCESS_CONTROL_ALLOW_HEADERS, &c.headers);
        r
    } else {
        next.run(req).await
    };
    if let Some(v) = allow.and_then(|a| axum::http::HeaderValue::from_str(&a).ok()) {
        resp.headers_mut()
            .insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
    }
    resp
}

/// Whether an `Origin` (`scheme://host[:port]`) is on this machine.
fn origin_is_localhost(origin: &str) -> bool {
    let Some((_, rest)) = origin.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = authority.strip_prefix('[') {
        v6.split_once(']').map_or("", |(h, _)| h)
    } else {
        authority.split(':').next().unwrap_or("")
    };
    matches!(host, "localhost" | "127.0.0.1" | "::1")
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no route for {} {}",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
    .with_code("method_not_allowed")
}

async fn page() -> Html<&'static str> {
    Html(CHAT_PAGE)
}

async fn health() -> axum::Json<Value> {
    axum::Json(json!({"status": "ok"}))
}

fn respond(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

/// The requests of one HTTP call in flight: one receiver per choice.
struct Run {
    choices: Vec<Choice>,
    _permit: OwnedSemaphorePermit,
    id: String,
    created: u64,
    model: String,
    /// llama-server's `generation_settings` of the request.
    settings: Value,
}

struct Choice {
    rx: mpsc::UnboundedReceiver<Event>,
    prompt_index: usize,
    prompt_tokens: usize,
    /// The prompt opened a `<think>` block: the prompt's text after the tag.
    thinking_open: Option<String>,
    /// The prompt as text (llama-server's `prompt` field).
    prompt: String,
}

impl AppState {
    /// A request's token limit: its own, else the server's `-n`.
    fn token_limit(&self, asked: Option<u32>) -> Option<u32> {
        asked.or(self.0.config.n_predict)
    }

    fn deadline(&self) -> Option<Instant> {
        self.0.config.timeout.map(|t| Instant::now() + t)
    }

    /// Takes room in the queue for every choice (503 when there is none), submits the
    /// jobs and waits until the engine accepted them all (validation errors come back here).
    async fn start(
        &self,
        prompts: Vec<Prompt>,
        n: usize,
        params: GenParams,
        prefix: &str,
    ) -> Result<Run, ApiError> {
        let total = prompts.len() * n;
        if total > MAX_CHOICES || total > self.0.capacity {
            return Err(ApiError::invalid_param(
                "n",
                format!(
                    "{total} choices requested; at most {} at once",
                    MAX_CHOICES.min(self.0.capacity)
                ),
            ));
        }
        let permit = self
            .0
            .permits
            .clone()
            .try_acquire_many_owned(total as u32)
            .map_err(|_| {
                Metrics::add(&self.0.metrics.requests_rejected_total, 1);
                ApiError::unavailable("the server is busy: every slot and the wait queue are full")
                    .with_code("queue_full")
            })?;
        let mut choices = Vec::with_capacity(total);
        let mut jobs = Vec::with_capacity(total);
        for (prompt_index, prompt) in prompts.iter().enumerate() {
            for k in 0..n {
                let mut p = params.clone();
                if k > 0 && p.sampling.seed != lamina_sample::rng::DEFAULT_SEED {
                    p.sampling.seed = p.sampling.seed.wrapping_add(k as u32);
                }
                let (tx, rx) = mpsc::unbounded_channel();
                jobs.push(Job {
                    prompt: prompt.clone(),
                    params: p,
                    events: tx,
                });
                choices.push(Choice {
                    rx,
                    prompt_index,
                    prompt_tokens: 0,
                    thinking_open: None,
                    prompt: String::new(),
                });
            }
        }
        self.0
            .cmd
            .send(Command::Generate(jobs))
            .map_err(|_| ApiError::unavailable("the engine has stopped"))?;
        for c in &mut choices {
            match c.rx.recv().await {
                Some(Event::Accepted {
                    prompt_tokens,
                    thinking_open,
                    prompt,
                }) => {
                    c.prompt_tokens = prompt_tokens;
                    c.thinking_open = thinking_open;
                    c.prompt = prompt;
                }
                Some(Event::Error(e)) => return Err(e),
                _ => return Err(ApiError::internal("the engine stopped")),
            }
        }
        Ok(Run {
            choices,
            _permit: permit,
            id: format!(
                "{prefix}-{:x}",
                self.0.next_id.fetch_add(1, Ordering::Relaxed)
            ),
            created: unix_now(),
            model: model_id(self),
            settings: generation_settings(&params, &self.0.info.eog_tokens),
        })
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> Command,
    ) -> Result<T, ApiError> {
        let (tx, rx) = oneshot::channel();
        self.0
            .cmd
            .send(make(tx))
            .map_err(|_| ApiError::unavailable("the engine has stopped"))?;
        rx.await
            .map_err(|_| ApiError::internal("the engine stopped"))
    }
}

/// Which response shapes to produce.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
enum Api {
    #[default]
    Chat,
    Completions,
    Native,
}

struct Output {
    text: String,
    tokens: Vec<Token>,
    probs: Vec<TokenProbs>,
    done: Done,
}

async fn collect(mut rx: mpsc::UnboundedReceiver<Event>) -> Result<Output, ApiError> {
    let mut out = Output {
        text: String::new(),
        tokens: Vec::new(),
        probs: Vec::new(),
        done: Done {
            stop_type: scheduler::StopType::Limit,
            stopping_word: String::new(),
            prompt_tokens: 0,
            cached_tokens: 0,
            completion_tokens: 0,
            prompt_ms: 0.0,
            predicted_ms: 0.0,
            slot: 0,
            truncated: false,
        },
    };
    loop {
        match rx.recv().await {
            Some(Event::Delta(d)) => {
                out.text.push_str(&d.text);
                out.tokens.extend(d.tokens);
                out.probs.extend(d.probs);
            }
            Some(Event::Done(d)) => {
                out.done = d;
                return Ok(out);
            }
            Some(Event::Error(e)) => return Err(e),
            Some(Event::Accepted { .. } | Event::Progress(_)) => {}
            None => return Err(ApiError::internal("the engine stopped")),
        }
    }
}

fn finite(lp: f32) -> f32 {
    if lp.is_finite() { lp } else { -9999.0 }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn oai_top(t: &TopProb) -> Value {
    json!({"token": lossy(&t.bytes), "logprob": finite(t.logprob), "bytes": t.bytes})
}

fn chat_logprobs(probs: &[TokenProbs]) -> Value {
    let content: Vec<Value> = probs
        .iter()
        .map(|p| {
            let mut o = oai_top(&p.chosen);
            o["top_logprobs"] = p.top.iter().map(oai_top).collect();
            o
        })
        .collect();
    json!({ "content": content })
}

fn completion_logprobs(probs: &[TokenProbs], offset0: usize) -> Value {
    let mut offset = offset0;
    let mut tokens = Vec::new();
    let mut token_logprobs = Vec::new();
    let mut top = Vec::new();
    let mut offsets = Vec::new();
    for p in probs {
        let s = lossy(&p.chosen.bytes);
        offsets.push(offset);
        offset += s.chars().count();
        tokens.push(s);
        token_logprobs.push(finite(p.chosen.logprob));
        let m: serde_json::Map<String, Value> = p
            .top
            .iter()
            .map(|t| (lossy(&t.bytes), json!(finite(t.logprob))))
            .collect();
        top.push(Value::Object(m));
    }
    json!({"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top, "text_offset": offsets})
}

/// llama-server's `completion_probabilities`: log-probabilities, or with
/// `post_sampling_probs` the probabilities after sampling (`prob`, `top_probs`).
fn native_probs(probs: &[TokenProbs], post_sampling: bool) -> Value {
    let entry = |t: &TopProb| {
        if post_sampling {
            json!({"id": t.token, "token": lossy(&t.bytes), "bytes": t.bytes, "prob": t.prob})
        } else {
            json!({"id": t.token, "token": lossy(&t.bytes), "bytes": t.bytes, "logprob": finite(t.logprob)})
        }
    };
    let key = if post_sampling {
        "top_probs"
    } else {
        "top_logprobs"
    };
    probs
        .iter()
        .map(|p| {
            let mut o = entry(&p.chosen);
            o[key] = p.top.iter().map(entry).collect();
            o
        })
        .collect()
}

/// llama-server's `generation_settings`: the sampling and limits a request ran with.
fn generation_settings(p: &GenParams, eog: &[Token]) -> Value {
    let s = &p.sampling;
    let eog_bias: Vec<(Token, f32)> = if p.ignore_eos {
        eog.iter().map(|&t| (t, f32::NEG_INFINITY)).collect()
    } else {
        Vec::new()
    };
    let samplers: Vec<&str> = s
        .samplers
        .iter()
        .map(|t| {
            use lamina_sample::SamplerType as T;
            match t {
                T::Penalties => "penalties",
                T::Dry => "dry",
                T::TopNSigma => "top_n_sigma",
                T::TopK => "top_k",
                T::TypicalP => "typ_p",
                T::TopP => "top_p",
                T::MinP => "min_p",
                T::Xtc => "xtc",
                T::Temperature => "temperature",
            }
        })
        .collect();
    let n_predict = p.max_tokens.map_or(-1, i64::from);
    json!({
        "seed": s.seed,
        "temperature": s.temp,
        "dynatemp_range": s.dynatemp_range,
        "dynatemp_exponent": s.dynatemp_exponent,
        "top_k": s.top_k,
        "top_p": s.top_p,
        "min_p": s.min_p,
        "top_n_sigma": s.top_n_sigma,
        "xtc_probability": s.xtc_probability,
        "xtc_threshold": s.xtc_threshold,
        "typical_p": s.typ_p,
        "repeat_last_n": s.penalty_last_n,
        "repeat_penalty": s.penalty_repeat,
        "presence_penalty": s.penalty_present,
        "frequency_penalty": s.penalty_freq,
        "dry_multiplier": s.dry_multiplier,
        "dry_base": s.dry_base,
        "dry_allowed_length": s.dry_allowed_length,
        "dry_penalty_last_n": s.dry_penalty_last_n,
        "mirostat": s.mirostat,
        "mirostat_tau": s.mirostat_tau,
        "mirostat_eta": s.mirostat_eta,
        // Lamina has no adaptive-p sampler: llama.cpp's "disabled" values.
        "adaptive_target": -1.0,
        "adaptive_decay": 0.9,
        "max_tokens": n_predict,
        "n_predict": n_predict,
        "n_keep": p.n_keep,
        "n_discard": p.n_discard,
        "ignore_eos": p.ignore_eos,
        "n_probs": p.n_probs,
        "min_keep": s.min_keep,
        "stop": p.stop,
        "samplers": samplers,
        // -inf (a banned token) is null in JSON, as llama-server writes it.
        "logit_bias": s.logit_bias.iter().chain(eog_bias.iter())
            .map(|(t, b)| json!({"bias": if b.is_finite() { json!(b) } else { Value::Null }, "token": t}))
            .collect::<Vec<_>>(),
        "grammar": p.grammar.clone().unwrap_or_default(),
    })
}

fn timings(d: &Done) -> Value {
    let per = |n: usize, ms: f64| {
        if n == 0 || ms <= 0.0 {
            0.0
        } else {
            n as f64 * 1e3 / ms
        }
    };
    let per_token = |n: usize, ms: f64| if n == 0 { 0.0 } else { ms / n as f64 };
    let prompt_n = d.prompt_tokens - d.cached_tokens;
    // The first token comes from the prompt's last batch: generation took one decode
    // step fewer than it has tokens (llama-server's rates count steps).
    let steps = d.completion_tokens.saturating_sub(1);
    json!({
        "cache_n": d.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": d.prompt_ms,
        "prompt_per_token_ms": per_token(prompt_n, d.prompt_ms),
        "prompt_per_second": per(prompt_n, d.prompt_ms),
        "predicted_n": d.completion_tokens,
        "predicted_ms": d.predicted_ms,
        "predicted_per_token_ms": per_token(steps, d.predicted_ms),
        "predicted_per_second": per(steps, d.predicted_ms),
    })
}

/// Usage over all choices: each distinct prompt counted once.
fn usage(prompt_tokens: &[(usize, usize)], completion: usize, cached: usize) -> Value {
    let mut seen = Vec::new();
    let mut prompt = 0;
    for &(idx, n) in prompt_tokens {
        if !seen.contains(&idx) {
            seen.push(idx);
            prompt += n;
        }
    }
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}

/// Per-endpoint options that shape the output.
#[derive(Clone, Default)]
struct Shape {
    api: Api,
    want_probs: bool,
    include_usage: bool,
    /// Chat answers are taken apart (reasoning, tool calls).
    chat: Option<ChatOut>,
    /// `/completion`: the generated token ids too (`return_tokens`).
    return_tokens: bool,
    /// `/completion`: only these fields (`response_fields`, `/`-separated paths).
    response_fields: Vec<String>,
    /// `--verbose`: OpenAI-shaped answers carry llama-server's `__verbose` object.
    verbose: bool,
    /// `timings_per_token`: progress chunks carry the timings so far.
    timings_per_token: bool,
    /// `post_sampling_probs`: probabilities after the sampler chain.
    post_sampling_probs: bool,
}

/// How a chat answer is read back.
#[derive(Clone, Copy)]
struct ChatOut {
    format: Format,
    reasoning: ReasoningFormat,
    id_seed: u64,
}

impl ChatOut {
    /// `open`: the prompt opened a `<think>` block and wrote this after the tag. As
    /// llama.cpp, what the prompt wrote from the tag on is parsed with the answer: the
    /// reasoning keeps the tag's line break, and content left raw (`reasoning_format: none`)
    /// starts with the tag.
    fn parse(
        &self,
        text: &str,
        is_final: bool,
        choice: usize,
        open: Option<&str>,
    ) -> ParsedMessage {
        let full;
        let text = match open {
            Some(tail) if self.reasoning.extracts() => {
                full = format!("{tail}{text}");
                &full
            }
            Some(tail) => {
                full = format!("{}{tail}{text}", lamina_chat::THINK_START);
                &full
            }
            None => text,
        };
        self.format.parse(
            text,
            self.reasoning,
            open.is_some(),
            is_final,
            self.id_seed.wrapping_add(choice as u64),
        )
    }
}

/// OpenAI's `tool_calls` array; deltas (`streamed`) number their calls.
fn tool_calls_json(calls: &[ToolCall], streamed: bool) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let mut v = json!({"id": c.id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}});
            if streamed {
                v["index"] = json!(i);
            }
            v
        })
        .collect()
}

/// OpenAI's finish reason, `tool_calls` when the answer is calls.
fn chat_finish_reason(stop: scheduler::StopType, m: &ParsedMessage) -> &'static str {
    if !m.tool_calls.is_empty()
        && matches!(stop, scheduler::StopType::Eos | scheduler::StopType::Word)
    {
        "tool_calls"
    } else {
        stop.finish_reason()
    }
}

async fn finish_run(run: Run, stream: bool, shape: Shape) -> Result<Response, ApiError> {
    if stream {
        return Ok(stream_response(run, shape));
    }
    let (body, _) = finish_json(run, shape).await?;
    Ok(axum::Json(body).into_response())
}

/// The whole answer of a run that does not stream, and each choice's stop word.
async fn finish_json(run: Run, shape: Shape) -> Result<(Value, Vec<String>), ApiError> {
    let Run {
        choices,
        id,
        created,
        model,
        settings,
        _permit,
    } = run;
    let prompt_tokens: Vec<(usize, usize)> = choices
        .iter()
        .map(|c| (c.prompt_index, c.prompt_tokens))
        .collect();
    let thinking_open: Vec<Option<String>> =
        choices.iter().map(|c| c.thinking_open.clone()).collect();
    let prompts: Vec<String> = choices.iter().map(|c| c.prompt.clone()).collect();
    let outs = futures_util::future::join_all(choices.into_iter().map(|c| collect(c.rx))).await;
    let outs = outs.into_iter().collect::<Result<Vec<_>, _>>()?;
    let completion: usize = outs.iter().map(|o| o.done.completion_tokens).sum();
    let cached: usize = outs.iter().map(|o| o.done.cached_tokens).sum();
    let body = match shape.api {
        Api::Chat => {
            let choices: Vec<Value> = outs
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    let m = match &shape.chat {
                        Some(c) => c.parse(&o.text, true, i, thinking_open[i].as_deref()),
                        None => ParsedMessage {
                            content: o.text.clone(),
                            ..Default::default()
                        },
                    };
                    let mut message = json!({"role": "assistant", "content": m.content});
                    if !m.reasoning_content.is_empty() {
                        message["reasoning_content"] = json!(m.reasoning_content);
                    }
                    if !m.tool_calls.is_empty() {
                        if m.content.is_empty() {
                            message["content"] = Value::Null;
                        }
                        message["tool_calls"] = tool_calls_json(&m.tool_calls, false);
                    }
                    json!({
                        "index": i,
                        "message": message,
                        "logprobs": if shape.want_probs { chat_logprobs(&o.probs) } else { Value::Null },
                        "finish_reason": chat_finish_reason(o.done.stop_type, &m),
                    })
                })
                .collect();
            let mut v = json!({
                "id": id, "object": "chat.completion", "created": created, "model": model,
                "system_fingerprint": FINGERPRINT,
                "choices": choices,
                "usage": usage(&prompt_tokens, completion, cached),
                "timings": timings(&outs[0].done),
            });
            if shape.verbose {
                v["__verbose"] = native_result(&outs[0], &model, &settings, &prompts[0], &shape);
            }
            v
        }
        Api::Completions => {
            let choices: Vec<Value> = outs
                .iter()
                .enumerate()
                .map(|(i, o)| {
                    json!({
                        "index": i,
                        "text": o.text,
                        "logprobs": if shape.want_probs { completion_logprobs(&o.probs, 0) } else { Value::Null },
                        "finish_reason": o.done.stop_type.finish_reason(),
                    })
                })
                .collect();
            let mut v = json!({
                "id": id, "object": "text_completion", "created": created, "model": model,
                "system_fingerprint": FINGERPRINT,
                "choices": choices,
                "usage": usage(&prompt_tokens, completion, cached),
                "timings": timings(&outs[0].done),
            });
            if shape.verbose {
                v["__verbose"] = native_result(&outs[0], &model, &settings, &prompts[0], &shape);
            }
            v
        }
        Api::Native => {
            let mut results: Vec<Value> = outs
                .iter()
                .zip(&prompts)
                .enumerate()
                .map(|(i, (o, prompt))| {
                    let mut v = native_result(o, &model, &settings, prompt, &shape);
                    v["index"] = json!(i);
                    select_fields(v, &shape.response_fields)
                })
                .collect();
            if results.len() == 1 {
                results.pop().unwrap_or_default()
            } else {
                Value::Array(results)
            }
        }
    };
    Ok((
        body,
        outs.into_iter().map(|o| o.done.stopping_word).collect(),
    ))
}

/// Stands in for llama-server's build tag (`b<build>-<commit>`), which clients read.
pub(crate) const FINGERPRINT: &str = concat!("b", env!("CARGO_PKG_VERSION"), "-lamina");

/// llama-server's whole `/completion` result for one prompt.
fn native_result(o: &Output, model: &str, settings: &Value, prompt: &str, shape: &Shape) -> Value {
    let mut v = native_final(o.done.clone(), model, settings, prompt);
    v["content"] = json!(o.text);
    v["has_new_line"] = json!(o.text.contains('\n'));
    if shape.return_tokens {
        v["tokens"] = json!(o.tokens);
    }
    if shape.want_probs {
        v["completion_probabilities"] = native_probs(&o.probs, shape.post_sampling_probs);
    }
    v
}

/// llama-server's `response_fields`: just the named fields, each under its full
/// `a/b` path (nested objects are reached through the slashes); unknown ones are left out.
fn select_fields(v: Value, fields: &[String]) -> Value {
    if fields.is_empty() {
        return v;
    }
    let mut out = serde_json::Map::new();
    for f in fields {
        let mut cur = Some(&v);
        for part in f.split('/') {
            cur = cur.and_then(|c| c.get(part));
        }
        if let Some(x) = cur {
            out.insert(f.clone(), x.clone());
        }
    }
    Value::Object(out)
}

fn native_final(d: Done, model: &str, settings: &Value, prompt: &str) -> Value {
    json!({
        "index": 0,
        "content": "",
        "tokens": [],
        "id_slot": d.slot,
        "stop": true,
        "model": model,
        "tokens_predicted": d.completion_tokens,
        "tokens_evaluated": d.prompt_tokens,
        "generation_settings": settings,
        "prompt": prompt,
        "has_new_line": false,
        "truncated": d.truncated,
        "stop_type": d.stop_type.name(),
        "stopping_word": d.stopping_word,
        "tokens_cached": d.cached_tokens,
        "timings": timings(&d),
    })
}

/// What of a partial parse was not sent yet: new reasoning and content, as a delta
/// object (`{}` when nothing). `sent` is (reasoning bytes, content bytes) sent.
fn chat_delta(m: &ParsedMessage, sent: &mut (usize, usize)) -> Value {
    let mut delta = serde_json::Map::new();
    let mut take = |text: &str, at: &mut usize, key: &str| {
        if text.len() > *at && text.is_char_boundary(*at) {
            delta.insert(key.into(), json!(text[*at..]));
            *at = text.len();
        }
    };
    take(&m.reasoning_content, &mut sent.0, "reasoning_content");
    take(&m.content, &mut sent.1, "content");
    Value::Object(delta)
}

/// Streams a run as server-sent events. A task turns engine events into SSE lines; when
/// the client goes away the body (and the task's sender) is dropped, the task ends,
/// and with it the engine's receivers, which cancels generation.
fn stream_response(run: Run, shape: Shape) -> Response {
    let (tx, rx) = mpsc::channel::<String>(32);
    tokio::spawn(drive_stream(run, shape, tx));
    let body = stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|s| (Ok::<_, Infallible>(SseEvent::default().data(s)), rx))
    });
    Sse::new(body).into_response()
}

async fn drive_stream(run: Run, shape: Shape, tx: mpsc::Sender<String>) {
    let Run {
        choices,
        id,
        created,
        model,
        settings,
        _permit,
    } = run;
    let prompts: Vec<String> = choices.iter().map(|c| c.prompt.clone()).collect();
    let mut has_new_line = vec![false; choices.len()];
    let n = choices.len();
    let prompt_tokens: Vec<(usize, usize)> = choices
        .iter()
        .map(|c| (c.prompt_index, c.prompt_tokens))
        .collect();
    let thinking_open: Vec<Option<String>> =
        choices.iter().map(|c| c.thinking_open.clone()).collect();
    let streams: Vec<BoxStream<'static, (usize, Event)>> = choices
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            stream::unfold(
                c.rx,
                |mut rx| async move { rx.recv().await.map(|e| (e, rx)) },
            )
            .map(move |e| (i, e))
            .boxed()
        })
        .collect();
    let mut merged = stream::select_all(streams);
    let usage_null = shape.include_usage;
    let chunk = |choices: Value| -> String {
        let object = match shape.api {
            Api::Chat => "chat.completion.chunk",
            _ => "text_completion",
        };
        let mut v = json!({
            "id": id, "object": object, "created": created, "model": model,
            "system_fingerprint": FINGERPRINT, "choices": choices,
        });
        if usage_null {
            v["usage"] = Value::Null;
        }
        v.to_string()
    };
    if shape.api == Api::Chat {
        for i in 0..n {
            let first = chunk(json!([{
                "index": i, "delta": {"role": "assistant", "content": null},
                "logprobs": null, "finish_reason": null,
            }]));
            if tx.send(first).await.is_err() {
                return;
            }
        }
    }
    let mut n_done = 0;
    let mut last_done: Option<Done> = None;
    let mut completion = 0;
    let mut cached = 0;
    let mut text_offsets = vec![0usize; n];
    // Chat: each choice's text so far and how much of its parse was sent.
    let mut full = vec![String::new(); n];
    let mut sent = vec![(0usize, 0usize); n];
    while n_done < n {
        let next = tokio::select! {
            _ = tx.closed() => return,
            e = merged.next() => e,
        };
        let failed = matches!(next, None | Some((_, Event::Error(_))));
        let line = match next {
            None => ApiError::internal("the engine stopped").body().to_string(),
            Some((_, Event::Error(e))) => e.body().to_string(),
            Some((_, Event::Accepted { .. })) => continue,
            Some((i, Event::Progress(p))) => {
                let progress = json!({"total": p.total, "cache": p.cache,
                                      "processed": p.processed, "time_ms": p.time_ms});
                let mut v: Value = match shape.api {
                    Api::Chat => serde_json::from_str(&chunk(json!([{
                        "index": i, "delta": {"role": "assistant", "content": null},
                        "logprobs": null, "finish_reason": null,
                    }])))
                    .unwrap_or_default(),
                    Api::Completions => serde_json::from_str(&chunk(json!([{
                        "index": i, "text": "", "logprobs": null, "finish_reason": null,
                    }])))
                    .unwrap_or_default(),
                    Api::Native => json!({"index": i, "content": "", "tokens": [], "stop": false}),
                };
                v["prompt_progress"] = progress;
                if shape.timings_per_token {
                    v["timings"] = json!({
                        "cache_n": p.cache,
                        "prompt_n": p.processed - p.cache,
                        "prompt_ms": p.time_ms as f64,
                        "prompt_per_token_ms": 0.0,
                        "prompt_per_second": 0.0,
                        "predicted_n": 0,
                        "predicted_ms": 0.0,
                        "predicted_per_token_ms": 0.0,
                        "predicted_per_second": 0.0,
                    });
                }
                v.to_string()
            }
            Some((i, Event::Delta(d))) => {
                let timings_so_far = d.timings.clone();
                let line = match shape.api {
                    Api::Chat => {
                        let delta = match &shape.chat {
                            Some(c) => {
                                full[i].push_str(&d.text);
                                let m = c.parse(&full[i], false, i, thinking_open[i].as_deref());
                                chat_delta(&m, &mut sent[i])
                            }
                            None => json!({"content": d.text}),
                        };
                        if delta.as_object().is_some_and(|o| o.is_empty()) && !shape.want_probs {
                            continue;
                        }
                        chunk(json!([{
                            "index": i, "delta": delta,
                            "logprobs": if shape.want_probs { chat_logprobs(&d.probs) } else { Value::Null },
                            "finish_reason": null,
                        }]))
                    }
                    Api::Completions => {
                        let lp = if shape.want_probs {
                            completion_logprobs(&d.probs, text_offsets[i])
                        } else {
                            Value::Null
                        };
                        text_offsets[i] += d.text.chars().count();
                        chunk(json!([{
                            "index": i, "text": d.text, "logprobs": lp, "finish_reason": null,
                        }]))
                    }
                    Api::Native => {
                        has_new_line[i] |= d.text.contains('\n');
                        let mut v = json!({"index": i, "content": d.text, "tokens": d.tokens,
                                       "stop": false});
                        if shape.want_probs {
                            v["completion_probabilities"] =
                                native_probs(&d.probs, shape.post_sampling_probs);
                        }
                        v.to_string()
                    }
                };
                match timings_so_far {
                    Some(t) => {
                        let mut v: Value = serde_json::from_str(&line).unwrap_or_default();
                        v["timings"] = timings(&t);
                        v.to_string()
                    }
                    None => line,
                }
            }
            Some((i, Event::Done(d))) => {
                n_done += 1;
                completion += d.completion_tokens;
                cached += d.cached_tokens;
                last_done = Some(d.clone());
                let reason = d.stop_type.finish_reason();
                match shape.api {
                    Api::Chat => {
                        let (delta, reason) = match &shape.chat {
                            Some(c) => {
                                let m = c.parse(&full[i], true, i, thinking_open[i].as_deref());
                                let mut delta = chat_delta(&m, &mut sent[i]);
                                if !m.tool_calls.is_empty() {
                                    delta["tool_calls"] = tool_calls_json(&m.tool_calls, true);
                                }
                                (delta, chat_finish_reason(d.stop_type, &m))
                            }
                            None => (json!({}), reason),
                        };
                        if !delta.as_object().is_some_and(|o| o.is_empty())
                            && tx
                                .send(chunk(json!([{
                                    "index": i, "delta": delta, "logprobs": null,
                                    "finish_reason": null,
                                }])))
                                .await
                                .is_err()
                        {
                            return;
                        }
                        chunk(json!([{
                            "index": i, "delta": {}, "logprobs": null, "finish_reason": reason,
                        }]))
                    }
                    Api::Completions => chunk(json!([{
                        "index": i, "text": "", "logprobs": null, "finish_reason": reason,
                    }])),
                    Api::Native => {
                        let mut v = native_final(d, &model, &settings, &prompts[i]);
                        v["index"] = json!(i);
                        v["has_new_line"] = json!(has_new_line[i]);
                        select_fields(v, &shape.response_fields).to_string()
                    }
                }
            }
        };
        if tx.send(line).await.is_err() || failed {
            return;
        }
    }
    if shape.include_usage && shape.api != Api::Native {
        let mut v: Value = serde_json::from_str(&chunk(json!([]))).unwrap_or_default();
        v["usage"] = usage(&prompt_tokens, completion, cached);
        if let Some(d) = &last_done {
            v["timings"] = timings(d);
        }
        if tx.send(v.to_string()).await.is_err() {
            return;
        }
    }
    if shape.api != Api::Native {
        let _ = tx.send("[DONE]".to_string()).await;
    }
}

fn base_params(
    st: &AppState,
    req: &GenRequest,
    map: &serde_json::Map<String, Value>,
) -> Result<GenParams, ApiError> {
    let defaults = &st.0.config.default_params;
    let merged;
    let map = if defaults.is_empty() {
        map
    } else {
        let mut m = defaults.clone();
        m.extend(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        merged = m;
        &merged
    };
    let (sampling, text_bias) = api::sampling(map, st.0.info.n_vocab)?;
    let int = |key: &str, min: i64| -> Result<i64, ApiError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(if min < 0 { 0 } else { min }),
            Some(v) => v
                .as_i64()
                .filter(|&n| n >= min && n <= i64::from(i32::MAX))
                .ok_or_else(|| {
                    ApiError::invalid_param(key, format!("must be an integer of at least {min}"))
                }),
        }
    };
    let n_keep = int("n_keep", -1)? as i32;
    let n_discard = int("n_discard", 0)? as u32;
    let n_cache_reuse = int("n_cache_reuse", 0)? as u32;
    // llama-server: the request's budget (-1: the server's `--reasoning-budget`).
    let budget_of = |m: &serde_json::Map<String, Value>| -> Result<i64, ApiError> {
        let key = ["reasoning_budget_tokens", "thinking_budget_tokens"]
            .into_iter()
            .find(|k| m.get(*k).is_some_and(|v| !v.is_null()));
        match key {
            None => Ok(-1),
            Some(k) => m[k]
                .as_i64()
                .filter(|&n| (-1..=i64::from(i32::MAX)).contains(&n))
                .ok_or_else(|| ApiError::invalid_param(k, "must be an integer of at least -1")),
        }
    };
    let mut reasoning_budget = budget_of(map)?;
    if reasoning_budget == -1 {
        reasoning_budget = budget_of(defaults)?;
    }
    let text = |key: &str| -> Result<Option<String>, ApiError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(ApiError::invalid_param(key, "must be a string")),
        }
    };
    let reasoning_budget_message = text("reasoning_budget_message")?.unwrap_or_default();
    let end_tags = match (
        map.get("reasoning_budget_end_tags"),
        text("reasoning_budget_end_tag")?,
    ) {
        (Some(Value::Array(tags)), _) => tags
            .iter()
            .map(|t| {
                t.as_str().map(String::from).ok_or_else(|| {
                    ApiError::invalid_param("reasoning_budget_end_tags", "must be strings")
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
        (Some(Value::Null) | None, Some(tag)) => vec![tag],
        (Some(Value::Null) | None, None) => Vec::new(),
        (Some(_), _) => {
            return Err(ApiError::invalid_param(
                "reasoning_budget_end_tags",
                "must be an array of strings",
            ));
        }
    };
    let reasoning_tags = text("reasoning_budget_start_tag")?
        .filter(|s| !s.is_empty() && !end_tags.is_empty())
        .map(|start| (start, end_tags));
    Ok(GenParams {
        n_keep,
        n_discard,
        n_cache_reuse,
        reasoning_budget: reasoning_budget as i32,
        reasoning_budget_message,
        reasoning_tags,
        sampling,
        text_bias,
        max_tokens: None,
        stop: req.stops()?,
        n_probs: 0,
        want_probs: false,
        ignore_eos: req.ignore_eos.unwrap_or(false),
        cache_prompt: req.cache_prompt.unwrap_or(true),
        deadline: st.deadline(),
        grammar: None,
        grammar_triggers: Vec::new(),
        render_special: false,
        return_progress: req.return_progress.unwrap_or(false) && req.stream(),
        post_sampling_probs: req.post_sampling_probs == Some(true),
        timings_per_token: req.timings_per_token == Some(true) && req.stream(),
        id_slot: match req.id_slot {
            None => None,
            Some(i) if i < 0 => None,
            Some(i) if i < i64::from(st.0.info.n_slots) => Some(i as u32),
            Some(i) => {
                return Err(ApiError::invalid_param(
                    "id_slot",
                    format!(
                        "there is no slot {i} (the server has {})",
                        st.0.info.n_slots
                    ),
                ));
            }
        },
    })
}

async fn chat(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(chat_inner(st, headers, body).await)
}

fn chat_error(e: ChatError) -> ApiError {
    let code = match e {
        ChatError::UnknownFunction(_) => "unknown_function",
        ChatError::BadSchema { .. } => "invalid_tool_schema",
        ChatError::Invalid { .. } => "invalid_tools",
    };
    ApiError::invalid_param(e.param(), e.to_string()).with_code(code)
}

/// A chat request made ready: the conversation as the template will see it and how
/// the answer is to be read back.
struct ChatSetup {
    prompt: ChatPrompt,
    out: ChatOut,
}

/// The template side of a chat request, as llama-server reads it: the generation
/// prompt, assistant prefill (a final assistant message is continued),
/// `continue_final_message`, `chat_template_kwargs`, and whether to think
/// (`--reasoning`, `enable_thinking`, `reasoning_effort: "none"`).
fn chat_prompt(
    st: &AppState,
    req: &GenRequest,
    mut messages: Vec<ChatMessage>,
    tools: Option<Value>,
) -> Result<ChatPrompt, ApiError> {
    let mut add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
    let mut continue_final = match &req.continue_final_message {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(Value::String(s)) if matches!(s.as_str(), "auto" | "content" | "reasoning") => {
            Some(true)
        }
        Some(Value::String(s)) if s == "none" => Some(false),
        Some(other) => {
            return Err(ApiError::invalid_param(
                "continue_final_message",
                format!("continue_final_message must be a boolean, got {other}"),
            ));
        }
    };
    let last_is_assistant = messages.last().is_some_and(|m| m.role == "assistant");
    if continue_final.is_none() && last_is_assistant {
        if messages.len() >= 2 && messages[messages.len() - 2].role == "assistant" {
            return Err(ApiError::invalid_param(
                "messages",
                "Cannot have 2 or more assistant messages at the end of the list.",
            ));
        }
        continue_final = Some(true);
        add_generation_prompt = false;
    }
    let continue_final = continue_final.unwrap_or(false);
    if continue_final && add_generation_prompt {
        return Err(ApiError::bad_request(
            "Cannot set both add_generation_prompt and continue_final_message to true.",
        ));
    }
    let mut continuation = None;
    if continue_final && last_is_assistant {
        if messages.last().is_some_and(|m| m.tool_calls.is_some()) {
            return Err(ApiError::invalid_param(
                "messages",
                "Cannot continue an assistant message that contains tool calls.",
            ));
        }
        continuation = messages.pop().map(|m| m.content);
    }
    let mut kwargs = serde_json::Map::new();
    let mut enable_thinking = st.0.config.reasoning.enable_thinking();
    match &req.chat_template_kwargs {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => kwargs.extend(m.iter().map(|(k, v)| (k.clone(), v.clone()))),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "chat_template_kwargs",
                "chat_template_kwargs must be an object",
            ));
        }
    }
    match kwargs.get("enable_thinking") {
        Some(Value::Bool(b)) => enable_thinking = *b,
        Some(Value::String(_)) => {
            return Err(ApiError::invalid_param(
                "chat_template_kwargs",
                "invalid type for \"enable_thinking\" (expected boolean, got string)",
            ));
        }
        _ => {}
    }
    match req.reasoning_effort.as_deref() {
        Some("none") => {
            enable_thinking = false;
            kwargs.remove("reasoning_effort");
        }
        Some(e) if !e.is_empty() => {
            kwargs.insert("reasoning_effort".into(), json!(e));
        }
        _ => {}
    }
    kwargs.insert("enable_thinking".into(), json!(enable_thinking));
    Ok(ChatPrompt {
        messages,
        tools,
        add_generation_prompt,
        kwargs,
        close_thinking: !enable_thinking,
        continuation,
    })
}

/// Tools, tool choice, response format and reasoning of a chat request: sets the
/// grammar in `params` and says how to read the answer.
fn chat_setup(
    st: &AppState,
    req: &GenRequest,
    params: &mut GenParams,
) -> Result<ChatSetup, ApiError> {
    let limits = &st.0.config.schema_limits;
    let mut messages = req.chat_messages()?;
    if !st.0.config.jinja {
        let has_tools = req
            .tools
            .as_ref()
            .is_some_and(|t| t.as_array().is_some_and(|a| !a.is_empty()));
        if has_tools {
            return Err(ApiError::invalid_param(
                "tools",
                "tools param requires --jinja flag",
            ));
        }
        if req
            .tool_choice
            .as_ref()
            .is_some_and(|c| c != "auto" && !c.is_null())
        {
            return Err(ApiError::invalid_param(
                "tool_choice",
                "tool_choice param requires --jinja flag",
            ));
        }
    }
    let tools = Tools::from_request(
        req.tools.as_ref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls.as_ref(),
    )
    .map_err(chat_error)?;
    let reasoning = match req.reasoning_format.as_deref() {
        None => st.0.config.reasoning_format,
        Some(s) => ReasoningFormat::parse(s).ok_or_else(|| {
            ApiError::invalid_param(
                "reasoning_format",
                format!("reasoning_format must be none, deepseek or auto, got {s:?}"),
            )
        })?,
    };
    let mut format = Format::for_answers(&st.0.info.chat_template_source);
    match &tools {
        Some(t) if t.choice != ToolChoice::None => {
            let (grammar, schema) = req.constraint(true)?;
            if grammar.is_some() {
                return Err(ApiError::bad_request("Cannot specify grammar with tools"));
            }
            format = Format::detect(&st.0.info.chat_template_source);
            let plan = format
                .plan(t, schema.as_ref(), limits)
                .map_err(chat_error)?;
            params.grammar = plan.grammar;
            params.grammar_triggers = plan.triggers;
            if let Some(system) = plan.system {
                add_system(&mut messages, &system);
            }
            if format == Format::Generic {
                polyfill_history(&mut messages);
            }
        }
        other => {
            if let Some(t) = other {
                t.check_schemas(limits).map_err(chat_error)?;
            }
            params.grammar = req.grammar(true, limits)?;
            if st.0.config.jinja && params.grammar.is_some() && req.constraint(true)?.1.is_some() {
                // llama.cpp's chat answer to a schema: the JSON, possibly fenced and
                // spaced, taken out of the fence again. (Without Jinja, llama.cpp's legacy
                // path constrains to the schema's grammar as it is.)
                let (_, schema) = req.constraint(true)?;
                let schema = schema.unwrap_or_default();
                params.grammar = Some(
                    lamina_chat::response_format_grammar(&schema, limits).map_err(|e| {
                        ApiError::invalid_param(
                            "response_format",
                            format!("invalid JSON schema: {e}"),
                        )
                        .with_code("invalid_json_schema")
                    })?,
                );
                format = Format::JsonAnswer;
            }
        }
    }
    params.render_special = format.reads_control_tokens();
    Ok(ChatSetup {
        prompt: chat_prompt(st, req, messages, tools.map(|t| t.raw))?,
        out: ChatOut {
            format,
            reasoning,
            id_seed: ID_SEED
                .fetch_add(1, Ordering::Relaxed)
                .wrapping_mul(0x9E37_79B9),
        },
    })
}

static ID_SEED: AtomicU64 = AtomicU64::new(0x51_7c_c1_b7);

/// Prepends `text` to the first system message, or adds one.
fn add_system(messages: &mut Vec<ChatMessage>, text: &str) {
    match messages.first_mut() {
        Some(m) if m.role == "system" => m.content = format!("{text}\n\n{}", m.content),
        _ => messages.insert(0, ChatMessage::new("system", text)),
    }
}

/// For templates without tools: earlier calls become the JSON the model is asked to
/// write, and tool results user messages (llama.cpp's polyfills), so that templates
/// that insist on alternating roles still render.
fn polyfill_history(messages: &mut [ChatMessage]) {
    for m in messages.iter_mut() {
        if m.role == "assistant"
            && let Some(calls) = m.tool_calls.take()
        {
            let calls: Vec<Value> = calls
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let f = &c["function"];
                    let args = match &f["arguments"] {
                        Value::String(s) => {
                            serde_json::from_str(s).unwrap_or(Value::String(s.clone()))
                        }
                        other => other.clone(),
                    };
                    json!({"name": f["name"], "arguments": args, "id": c["id"]})
                })
                .collect();
            m.content = json!({"tool_calls": calls}).to_string();
        } else if m.role == "tool" {
            m.role = "user".into();
            m.content = json!({"tool_response": {
                "tool": m.name, "tool_call_id": m.tool_call_id, "content": m.content,
            }})
            .to_string();
            m.tool_call_id = None;
        }
    }
}

async fn chat_inner(st: AppState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let (run, stream, shape) = start_chat(&st, &map).await?;
    finish_run(run, stream, shape).await
}

/// A chat request (OpenAI's shape) checked, rendered and submitted: its run, whether it
/// streams, and how its answer is shaped.
async fn start_chat(
    st: &AppState,
    map: &serde_json::Map<String, Value>,
) -> Result<(Run, bool, Shape), ApiError> {
    let req: GenRequest = api::decode(map)?;
    req.reject_unsupported()?;
    let (want_probs, n_probs) = req.chat_logprobs()?;
    let mut params = base_params(st, &req, map)?;
    params.max_tokens = st.token_limit(req.openai_max_tokens()?);
    params.want_probs = want_probs;
    params.n_probs = n_probs;
    let setup = chat_setup(st, &req, &mut params)?;
    let n = req.n()?;
    let prompt = Prompt::Chat(setup.prompt);
    let run = st.start(vec![prompt], n, params, "chatcmpl").await?;
    let shape = Shape {
        api: Api::Chat,
        want_probs,
        include_usage: req.include_usage(),
        chat: Some(setup.out),
        verbose: st.0.config.verbose || req.verbose == Some(true),
        timings_per_token: req.timings_per_token == Some(true),
        ..Default::default()
    };
    Ok((run, req.stream(), shape))
}

async fn messages(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(messages_inner(st, headers, body).await)
}

/// Anthropic's Messages API (`/v1/messages`), as llama-server serves it: the request
/// becomes a chat request, and the chat answer (or its stream) an Anthropic message
/// (or Anthropic's named events).
async fn messages_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let chat = crate::anthropic::to_openai_chat(&map)?;
    let (run, stream, shape) = start_chat(&st, &chat).await?;
    if !stream {
        let (v, stops) = finish_json(run, shape).await?;
        let word = stops.first().filter(|w| !w.is_empty()).map(String::as_str);
        return Ok(axum::Json(crate::anthropic::from_openai_response(&v, word)).into_response());
    }
    let prompt_tokens = run.choices.first().map_or(0, |c| c.prompt_tokens) as u64;
    let conv = crate::anthropic::StreamConverter::new(&run.model, prompt_tokens, 0);
    Ok(converted_stream(run, shape, conv))
}

/// Turns a chat stream's `chat.completion.chunk`s into another API's events, as
/// (name, data) pairs; an empty name sends data alone.
trait ChunkConverter: Send + 'static {
    fn on_chunk(&mut self, chunk: &Value) -> Vec<(&'static str, Value)>;
    /// What closes the stream once the chunks ended.
    fn finish(&mut self) -> Vec<(&'static str, Value)>;
    /// A chunk that carries an error.
    fn error(&mut self, chunk: &Value) -> Vec<(&'static str, Value)>;
}

impl ChunkConverter for crate::anthropic::StreamConverter {
    fn on_chunk(&mut self, chunk: &Value) -> Vec<(&'static str, Value)> {
        crate::anthropic::StreamConverter::on_chunk(self, chunk)
    }
    fn finish(&mut self) -> Vec<(&'static str, Value)> {
        crate::anthropic::StreamConverter::finish(self)
    }
    fn error(&mut self, chunk: &Value) -> Vec<(&'static str, Value)> {
        vec![("error", chunk["error"].clone())]
    }
}

impl ChunkConverter for crate::responses::StreamConverter {
    fn on_chunk(&mut self, chunk: &Value) -> Vec<(&'static str, Value)> {
        crate::responses::StreamConverter::on_chunk(self, chunk)
    }
    fn finish(&mut self) -> Vec<(&'static str, Value)> {
        crate::responses::StreamConverter::finish(self)
    }
    fn error(&mut self, chunk: &Value) -> Vec<(&'static str, Value)> {
        vec![("", chunk.clone())]
    }
}

/// A chat run streamed through `conv` as named server-sent events.
fn converted_stream(run: Run, shape: Shape, mut conv: impl ChunkConverter) -> Response {
    let (tx, mut rx) = mpsc::channel::<String>(32);
    tokio::spawn(drive_stream(run, shape, tx));
    let (out_tx, out_rx) = mpsc::channel::<SseEvent>(32);
    tokio::spawn(async move {
        let send = |events: Vec<(&'static str, Value)>| {
            let out_tx = out_tx.clone();
            async move {
                for (name, data) in events {
                    let mut e = SseEvent::default().data(data.to_string());
                    if !name.is_empty() {
                        e = e.event(name);
                    }
                    if out_tx.send(e).await.is_err() {
                        return false;
                    }
                }
                true
            }
        };
        while let Some(line) = rx.recv().await {
            if line == "[DONE]" {
                break;
            }
            let Ok(chunk) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            if chunk.get("error").is_some() {
                let _ = send(conv.error(&chunk)).await;
                return;
            }
            if !send(conv.on_chunk(&chunk)).await {
                return;
            }
        }
        let _ = send(conv.finish()).await;
    });
    let body = stream::unfold(out_rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(body).into_response()
}

async fn responses(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(responses_inner(st, headers, body).await)
}

/// OpenAI's Responses API (`/v1/responses`), as llama-server serves it: through the
/// chat pipeline, converted both ways.
async fn responses_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let chat = crate::responses::to_openai_chat(&map)?;
    let (run, stream, shape) = start_chat(&st, &chat).await?;
    if !stream {
        let (v, _) = finish_json(run, shape).await?;
        return Ok(axum::Json(crate::responses::from_openai_response(&v)).into_response());
    }
    let conv = crate::responses::StreamConverter::new(&run.model);
    Ok(converted_stream(run, shape, conv))
}

/// Which API a token-count request speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum CountApi {
    Anthropic,
    Chat,
    Responses,
}

async fn count_tokens(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(count_tokens_inner(st, headers, body, CountApi::Anthropic).await)
}

async fn input_tokens(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(count_tokens_inner(st, headers, body, CountApi::Chat).await)
}

async fn responses_input_tokens(
    State(st): State<AppState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(count_tokens_inner(st, headers, body, CountApi::Responses).await)
}

/// `/v1/messages/count_tokens` (an Anthropic request) and
/// `/chat/completions/input_tokens` (an OpenAI one): the tokens of the prompt the
/// request would be given.
async fn count_tokens_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
    api_kind: CountApi,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let chat = match api_kind {
        CountApi::Anthropic => crate::anthropic::count_tokens_request(&map)?,
        CountApi::Responses => crate::responses::count_tokens_request(&map)?,
        CountApi::Chat => map,
    };
    let req: GenRequest = api::decode(&chat)?;
    let mut params = GenParams::default();
    let setup = chat_setup(&st, &req, &mut params)?;
    let prompt = st
        .ask(|reply| Command::ApplyTemplate {
            chat: setup.prompt,
            reply,
        })
        .await??;
    let tokens = st
        .ask(|reply| Command::Tokenize {
            text: prompt,
            add_special: true,
            parse_special: true,
            reply,
        })
        .await?;
    let body = match api_kind {
        CountApi::Anthropic => crate::anthropic::count_tokens_response(tokens.len()),
        CountApi::Responses => crate::responses::count_tokens_response(tokens.len()),
        CountApi::Chat => json!({"input_tokens": tokens.len(), "object": "response.input_tokens"}),
    };
    Ok(axum::Json(body).into_response())
}

async fn completions(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(completions_inner(st, headers, body).await)
}

async fn completions_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let req: GenRequest = api::decode(&map)?;
    req.reject_unsupported()?;
    let prompts = req.prompts(true)?;
    let (want_probs, n_probs) = req.completion_logprobs()?;
    let mut params = base_params(&st, &req, &map)?;
    params.max_tokens = st.token_limit(req.openai_max_tokens()?);
    params.want_probs = want_probs;
    params.n_probs = n_probs;
    params.grammar = req.grammar(false, &st.0.config.schema_limits)?;
    let n = req.n()?;
    let run = st.start(prompts, n, params, "cmpl").await?;
    let shape = Shape {
        api: Api::Completions,
        want_probs,
        include_usage: req.include_usage(),
        chat: None,
        verbose: st.0.config.verbose || req.verbose == Some(true),
        timings_per_token: req.timings_per_token == Some(true),
        ..Default::default()
    };
    finish_run(run, req.stream(), shape).await
}

async fn infill(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(infill_inner(st, headers, body).await)
}

/// llama-server's `/infill`: `input_prefix`, `input_suffix`, optional `input_extra`
/// (`[{"filename", "text"}]`) and `prompt`, answered as `/completion` answers.
async fn infill_inner(st: AppState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let mut map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let text = |m: &serde_json::Map<String, Value>, k: &str, required: bool| match m.get(k) {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) if !required => Ok(String::new()),
        None => Err(ApiError::invalid_param(k, format!("\"{k}\" is required"))),
        Some(_) => Err(ApiError::invalid_param(
            k,
            format!("\"{k}\" must be a string"),
        )),
    };
    let mut p = scheduler::InfillPrompt {
        prefix: text(&map, "input_prefix", true)?,
        suffix: text(&map, "input_suffix", true)?,
        prompt: text(&map, "prompt", false)?,
        extra: Vec::new(),
    };
    match map.get("input_extra") {
        None | Some(Value::Null) => {}
        Some(Value::Array(chunks)) => {
            for (i, c) in chunks.iter().enumerate() {
                let bad = |m: &str| ApiError::invalid_param(format!("input_extra[{i}]"), m);
                let t = c.get("text").and_then(Value::as_str).ok_or_else(|| {
                    bad("extra_context chunk must contain a \"text\" field with a string value")
                })?;
                let f = match c.get("filename") {
                    None => "tmp",
                    Some(Value::String(f)) => f.as_str(),
                    Some(_) => {
                        return Err(bad(
                            "extra_context chunk's \"filename\" field must be a string",
                        ));
                    }
                };
                p.extra.push((f.to_string(), t.to_string()));
            }
        }
        Some(_) => {
            return Err(ApiError::invalid_param(
                "input_extra",
                "\"input_extra\" must be an array of {\"filename\": string, \"text\": string}",
            ));
        }
    }
    // The rest of the request is a /completion one (its prompt is built here).
    map.insert("prompt".into(), json!(""));
    let req: GenRequest = api::decode(&map)?;
    let mut params = base_params(&st, &req, &map)?;
    params.max_tokens = st.token_limit(req.native_max_tokens()?);
    params.n_probs = params.sampling.n_probs;
    params.want_probs = params.n_probs > 0;
    let want_probs = params.want_probs;
    let run = st.start(vec![Prompt::Infill(p)], 1, params, "cmpl").await?;
    let shape = Shape {
        api: Api::Native,
        want_probs,
        return_tokens: req.return_tokens.unwrap_or(false),
        post_sampling_probs: req.post_sampling_probs == Some(true),
        timings_per_token: req.timings_per_token == Some(true),
        ..Default::default()
    };
    finish_run(run, req.stream(), shape).await
}

async fn native_completion(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(native_inner(st, headers, body).await)
}

async fn native_inner(st: AppState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let req: GenRequest = api::decode(&map)?;
    req.reject_unsupported()?;
    let prompts = req.prompts(true)?;
    let mut params = base_params(&st, &req, &map)?;
    params.max_tokens = st.token_limit(req.native_max_tokens()?);
    params.n_probs = params.sampling.n_probs;
    params.want_probs = params.n_probs > 0;
    params.grammar = req.grammar(false, &st.0.config.schema_limits)?;
    let want_probs = params.want_probs;
    let run = st.start(prompts, 1, params, "cmpl").await?;
    let shape = Shape {
        api: Api::Native,
        want_probs,
        include_usage: false,
        chat: None,
        return_tokens: req.return_tokens.unwrap_or(false),
        post_sampling_probs: req.post_sampling_probs == Some(true),
        timings_per_token: req.timings_per_token == Some(true),
        response_fields: req.response_fields.clone().unwrap_or_default(),
        verbose: false,
    };
    finish_run(run, req.stream(), shape).await
}

async fn embeddings(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(embeddings_inner(st, headers, body).await)
}

/// L2-normalised (llama-server's default `--embd-normalize 2`).
fn normalized(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if norm > 0.0 {
        v.iter_mut()
            .for_each(|x| *x = (f64::from(*x) / norm) as f32);
    }
    v
}

impl AppState {
    /// Embeds `inputs` with the server's pooling, taking a place in the queue.
    async fn embed(
        &self,
        inputs: Vec<scheduler::EmbedInput>,
    ) -> Result<scheduler::Embeddings, ApiError> {
        let pooling = self.0.config.pooling;
        if pooling == crate::Pooling::Rank {
            return Err(ApiError::new(
                StatusCode::NOT_IMPLEMENTED,
                "not_supported_error",
                "This server does not support embeddings. Start it without `--reranking`",
            ));
        }
        let _permit = self.0.permits.clone().try_acquire_owned().map_err(|_| {
            Metrics::add(&self.0.metrics.requests_rejected_total, 1);
            ApiError::unavailable("the server is busy: every slot and the wait queue are full")
                .with_code("queue_full")
        })?;
        self.ask(|reply| Command::Embed {
            inputs,
            pooling,
            reply,
        })
        .await?
    }
}

async fn embeddings_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let req: api::EmbeddingsRequest = api::decode(&map)?;
    let inputs = req.inputs()?;
    let b64 = req.base64()?;
    if st.0.config.pooling == crate::Pooling::None {
        return Err(ApiError::bad_request(
            "Pooling type 'none' is not OAI compatible. Please use a different pooling type",
        ));
    }
    let results = st.embed(inputs).await?;
    let mut total = 0;
    let data: Vec<Value> = results
        .into_iter()
        .enumerate()
        .map(|(i, (rows, n_tokens))| {
            total += n_tokens;
            let v = normalized(rows.into_iter().next().unwrap_or_default());
            let embedding = if b64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(api::base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(axum::Json(json!({
        "object": "list",
        "data": data,
        "model": model_id(&st),
        "usage": {"prompt_tokens": total, "total_tokens": total},
    }))
    .into_response())
}

async fn native_embeddings(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(native_embeddings_inner(st, headers, body).await)
}

/// llama-server's own `/embedding(s)`: per input `{"index", "embedding": [rows]}`, one
/// normalised row when pooled, every token's raw row with `--pooling none`.
async fn native_embeddings_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let req: api::EmbeddingsRequest = api::decode(&map)?;
    let inputs = req.inputs()?;
    let pooled = st.0.config.pooling != crate::Pooling::None;
    let results = st.embed(inputs).await?;
    let out: Vec<Value> = results
        .into_iter()
        .enumerate()
        .map(|(i, (rows, _))| {
            let rows: Vec<Vec<f32>> = if pooled {
                rows.into_iter().map(normalized).collect()
            } else {
                rows
            };
            json!({"index": i, "embedding": rows})
        })
        .collect();
    Ok(axum::Json(Value::Array(out)).into_response())
}

async fn rerank(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(rerank_inner(st, headers, body).await)
}

/// `/rerank` (Jina's shape; TEI's when the request has `texts`): each document scored
/// against the query by the rank pooling, best first, the first `top_n`.
async fn rerank_inner(st: AppState, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    if st.0.config.pooling != crate::Pooling::Rank {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "not_supported_error",
            "This server does not support reranking. Start it with `--reranking`",
        ));
    }
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let tei = map.contains_key("texts");
    let query = match map.get("query") {
        Some(Value::String(q)) => q.clone(),
        Some(_) => {
            return Err(ApiError::invalid_param(
                "query",
                "\"query\" must be a string",
            ));
        }
        None => {
            return Err(ApiError::invalid_param(
                "query",
                "\"query\" must be provided",
            ));
        }
    };
    let docs_field = if tei { "texts" } else { "documents" };
    let documents: Vec<String> = match map.get(docs_field) {
        Some(Value::Array(items)) if !items.is_empty() && items.len() <= api::MAX_EMBED_INPUTS => {
            items
                .iter()
                .map(|d| d.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        docs_field,
                        "\"documents\" must be a non-empty string array",
                    )
                })?
        }
        _ => {
            return Err(ApiError::invalid_param(
                docs_field,
                "\"documents\" must be a non-empty string array",
            ));
        }
    };
    let top_n = match map.get("top_n") {
        None | Some(Value::Null) => documents.len(),
        Some(v) => v.as_u64().map_or(documents.len(), |n| n as usize),
    };
    let return_text = tei && map.get("return_text").and_then(Value::as_bool) == Some(true);
    let inputs = documents
        .iter()
        .map(|d| scheduler::EmbedInput::Rerank {
            query: query.clone(),
            document: d.clone(),
        })
        .collect();
    let _permit = st.0.permits.clone().try_acquire_owned().map_err(|_| {
        Metrics::add(&st.0.metrics.requests_rejected_total, 1);
        ApiError::unavailable("the server is busy: every slot and the wait queue are full")
            .with_code("queue_full")
    })?;
    let results = st
        .ask(|reply| Command::Embed {
            inputs,
            pooling: crate::Pooling::Rank,
            reply,
        })
        .await??;
    let label = if tei { "score" } else { "relevance_score" };
    let mut n_tokens = 0;
    let mut elements: Vec<(f64, Value)> = results
        .into_iter()
        .enumerate()
        .map(|(i, (rows, n))| {
            n_tokens += n;
            let score = rows
                .first()
                .and_then(|r| r.first())
                .copied()
                .unwrap_or(-1e6);
            let mut e = json!({"index": i, label: score});
            if return_text {
                e["text"] = json!(documents[i]);
            }
            (f64::from(score), e)
        })
        .collect();
    // Stable, as std::sort is not: equal scores keep their order here.
    elements.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
    elements.truncate(top_n);
    let results: Vec<Value> = elements.into_iter().map(|(_, e)| e).collect();
    if tei {
        return Ok(axum::Json(Value::Array(results)).into_response());
    }
    Ok(axum::Json(json!({
        "model": map.get("model").cloned().unwrap_or_else(|| json!(model_id(&st))),
        "object": "list",
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
        "results": results,
    }))
    .into_response())
}

async fn apply_template(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(apply_template_inner(st, headers, body).await)
}

/// llama-server's `/apply-template`: the prompt a chat request would be given (with
/// its tools, and the tool-call instructions a template without tools gets), as text.
async fn apply_template_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let req: GenRequest = api::decode(&map)?;
    let mut params = GenParams::default();
    let setup = chat_setup(&st, &req, &mut params)?;
    let prompt = st
        .ask(|reply| Command::ApplyTemplate {
            chat: setup.prompt,
            reply,
        })
        .await??;
    Ok(axum::Json(json!({"prompt": prompt})).into_response())
}

async fn tokenize(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(tokenize_inner(st, headers, body).await)
}

async fn tokenize_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let req: api::TokenizeRequest = api::decode(&map)?;
    let with_pieces = req.with_pieces;
    let pieces = st
        .ask(|reply| Command::Tokenize {
            text: req.content,
            add_special: req.add_special,
            parse_special: req.parse_special,
            reply,
        })
        .await?;
    let tokens: Vec<Value> = pieces
        .into_iter()
        .map(|(id, bytes)| {
            if with_pieces {
                json!({"id": id, "piece": api::piece_json(&bytes)})
            } else {
                json!(id)
            }
        })
        .collect();
    Ok(axum::Json(json!({ "tokens": tokens })).into_response())
}

async fn detokenize(State(st): State<AppState>, headers: HeaderMap, body: Body) -> Response {
    respond(detokenize_inner(st, headers, body).await)
}

async fn detokenize_inner(
    st: AppState,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let map = api::read_json(&headers, body, st.0.config.max_body_bytes).await?;
    let req: api::DetokenizeRequest = api::decode(&map)?;
    let tokens = api::token_list(&req.tokens, "tokens")?;
    let n_vocab = st.0.info.n_vocab;
    if let Some((i, t)) = tokens
        .iter()
        .enumerate()
        .find(|(_, t)| **t as usize >= n_vocab)
    {
        return Err(ApiError::invalid_param(
            format!("tokens[{i}]"),
            format!("token id {t} is outside the vocabulary (n_vocab = {n_vocab})"),
        )
        .with_code("invalid_token"));
    }
    let content = st
        .ask(|reply| Command::Detokenize { tokens, reply })
        .await?;
    Ok(axum::Json(json!({ "content": content })).into_response())
}

/// The name a request's `model` is reported under: the first alias in sorted order
/// (llama-server keeps its aliases in a sorted set), else the model's own name.
fn model_id(st: &AppState) -> String {
    let mut aliases = st.0.config.aliases.clone();
    aliases.sort();
    aliases
        .into_iter()
        .next()
        .unwrap_or_else(|| st.0.info.model_name.clone())
}

async fn models(State(st): State<AppState>) -> Response {
    let i = &st.0.info;
    let mut aliases = st.0.config.aliases.clone();
    aliases.sort();
    aliases.dedup();
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": model_id(&st),
            "object": "model",
            "created": st.0.created,
            "owned_by": "llamacpp",
            "aliases": aliases,
            "tags": st.0.config.tags,
            "meta": {"n_vocab": i.n_vocab, "n_ctx_train": i.n_ctx_train, "n_embd": i.n_embd},
        }],
    }))
    .into_response()
}

async fn props(State(st): State<AppState>) -> Response {
    let i = &st.0.info;
    let params = base_params(&st, &GenRequest::default(), &serde_json::Map::new())
        .map(|mut p| {
            p.max_tokens = st.token_limit(None);
            generation_settings(&p, &[])
        })
        .unwrap_or_default();
    axum::Json(json!({
        "default_generation_settings": {
            "id": 0,
            "n_ctx": i.n_ctx_seq,
            "speculative": false,
            "is_processing": false,
            "params": params,
        },
        "total_slots": i.n_slots,
        "model_alias": model_id(&st),
        "model_path": st.0.config.model_path,
        "modalities": {"vision": false, "audio": false},
        "chat_template": i.chat_template_source,
        "n_ctx": i.n_ctx,
        "build_info": FINGERPRINT,
        "is_sleeping": i.sleeping.load(Ordering::Relaxed),
        "endpoint_slots": st.0.config.slots_endpoint,
        "endpoint_metrics": st.0.config.metrics_endpoint,
        "webui": st.0.config.web_ui,
    }))
    .into_response()
}

async fn slots(State(st): State<AppState>) -> Response {
    if !st.0.config.slots_endpoint {
        return not_supported(
            "This server does not support slots endpoint. Start it with `--slots`",
        );
    }
    respond(
        st.ask(|reply| Command::Slots { reply })
            .await
            .map(|s| axum::Json(s).into_response()),
    )
}

async fn metrics_text(State(st): State<AppState>) -> Response {
    if !st.0.config.metrics_endpoint {
        return not_supported(
            "This server does not support metrics endpoint. Start it with `--metrics`",
        );
    }
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4".to_string(),
            ),
            (
                header::HeaderName::from_static("process-start-time-unix"),
                st.0.created.to_string(),
            ),
        ],
        st.0.metrics.render(),
    )
        .into_response()
}
