//! Router mode (`lamina serve` without `-m`, as llama-server without a model): every model
//! of the cache (and `--models-dir`) is served; a model is loaded on the first request
//! that names it (`"model"` in the body, `?model=` in the query), at most `--models-max`
//! stay loaded (the least recently used goes first), and `/models` lists them with
//! their state. Each loaded model is a whole server of its own ([`crate::router`]): the
//! request is handed to it unchanged.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::{Engine, ServerConfig};

/// A model the router can serve.
#[derive(Clone, Debug)]
pub struct ModelEntry {
    /// How requests name it (`/models` reports it as the id).
    pub id: String,
    /// Other names that reach it (a known model's short name).
    pub aliases: Vec<String>,
    pub path: PathBuf,
}

/// Loads a model into an engine (on a blocking thread).
pub type Loader = Arc<dyn Fn(&ModelEntry) -> Result<Box<dyn Engine>, String> + Send + Sync>;
/// Finds the models again (`GET /models?reload=1`).
pub type Scan = Arc<dyn Fn() -> Vec<ModelEntry> + Send + Sync>;

pub struct RouterConfig {
    pub scan: Scan,
    /// Most models loaded at once (0: no limit).
    pub models_max: usize,
    /// Load a model when a request names it (`--no-models-autoload` turns it off).
    pub autoload: bool,
    /// Where a request that names no model goes.
    pub default_model: Option<String>,
}

struct Loaded {
    app: Router,
    last_used: Instant,
}

struct Inner {
    cfg: RouterConfig,
    loader: Loader,
    server: ServerConfig,
    models: Mutex<Vec<ModelEntry>>,
    /// One lock for loading: loads happen one at a time, and a model asked for twice
    /// while loading is loaded once.
    loaded: tokio::sync::Mutex<HashMap<String, Loaded>>,
    loading: Mutex<Option<String>>,
}

#[derive(Clone)]
struct RouterState(Arc<Inner>);

/// The router's HTTP front: its own `/models`, `/models/load`, `/models/unload`, `/props`,
/// `/health` and chat page (`/`), and every other request handed to the model it names.
pub fn build(
    cfg: RouterConfig,
    loader: Loader,
    server: ServerConfig,
    tools: crate::server_tools::ServerTools,
) -> Router {
    let models = (cfg.scan)();
    let state = RouterState(Arc::new(Inner {
        cfg,
        loader,
        server,
        models: Mutex::new(models),
        loaded: tokio::sync::Mutex::new(HashMap::new()),
        loading: Mutex::new(None),
    }));
    let web_ui = state.0.server.web_ui;
    let mut app = Router::new();
    if web_ui {
        // The router's own page, with its model picker: handed to a model, `/` would
        // load one just to show the page (or fail when several are served and none is
        // the default).
        app = app.route(
            "/",
            get(|| async { axum::response::Html(crate::routes::CHAT_PAGE) }),
        );
    }
    app.route(
        "/health",
        get(|| async { axum::Json(json!({"status": "ok"})) }),
    )
    .route(
        "/v1/health",
        get(|| async { axum::Json(json!({"status": "ok"})) }),
    )
    .route("/models", get(list))
    .route("/v1/models", get(list))
    .route("/models/load", post(load))
    .route("/models/unload", post(unload))
    .route("/tools", get(tools_list).post(tools_call))
    .layer(axum::Extension(tools))
    .fallback(dispatch)
    .with_state(state)
}

impl RouterState {
    fn models(&self) -> Vec<ModelEntry> {
        self.0
            .models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The model `name` refers to (its id or an alias); no name: the default model.
    fn resolve(&self, name: Option<&str>) -> Result<ModelEntry, ApiError> {
        let models = self.models();
        let name = match name.filter(|n| !n.is_empty()) {
            Some(n) => n.to_string(),
            None => match (&self.0.cfg.default_model, models.as_slice()) {
                (Some(d), _) => d.clone(),
                (None, [only]) => only.id.clone(),
                _ => {
                    return Err(ApiError::invalid_param(
                        "model",
                        "this server serves several models: say which in \"model\"",
                    ));
                }
            },
        };
        models
            .into_iter()
            .find(|m| m.id == name || m.aliases.contains(&name))
            .ok_or_else(|| {
                ApiError::invalid_param("model", format!("model '{name}' not found"))
                    .with_code("model_not_found")
            })
    }

    /// The loaded server of `m`, loading it (and unloading the least recently used
    /// beyond `--models-max`) when `load` allows.
    async fn instance(&self, m: &ModelEntry, load: bool) -> Result<Router, ApiError> {
        let mut loaded = self.0.loaded.lock().await;
        if let Some(l) = loaded.get_mut(&m.id) {
            l.last_used = Instant::now();
            return Ok(l.app.clone());
        }
        if !load {
            return Err(ApiError::invalid_param(
                "model",
                format!(
                    "model '{}' is not loaded (load it with POST /models/load)",
                    m.id
                ),
            )
            .with_code("model_not_loaded"));
        }
        *self
            .0
            .loading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(m.id.clone());
        let loader = self.0.loader.clone();
        let entry = m.clone();
        let engine = tokio::task::spawn_blocking(move || loader(&entry)).await;
        *self
            .0
            .loading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        let engine = engine
            .map_err(|e| ApiError::internal(format!("loading {} failed: {e}", m.id)))?
            .map_err(|e| ApiError::internal(format!("loading {} failed: {e}", m.id)))?;
        let mut config = self.0.server.clone();
        config.aliases = vec![m.id.clone()];
        config.model_path = m.path.display().to_string();
        let app = crate::router(engine, &config)
            .map_err(|e| ApiError::internal(format!("starting {} failed: {e}", m.id)))?;
        let max = self.0.cfg.models_max;
        while max > 0 && loaded.len() >= max {
            let Some(oldest) = loaded
                .iter()
                .min_by_key(|(_, l)| l.last_used)
                .map(|(id, _)| id.clone())
            else {
                break;
            };
            // Requests in flight keep their server alive until they end.
            loaded.remove(&oldest);
        }
        loaded.insert(
            m.id.clone(),
            Loaded {
                app: app.clone(),
                last_used: Instant::now(),
            },
        );
        Ok(app)
    }
}

/// The server tools belong to the router, not to a model.
async fn tools_list(
    State(st): State<RouterState>,
    axum::Extension(tools): axum::Extension<crate::server_tools::ServerTools>,
    headers: axum::http::HeaderMap,
) -> Response {
    match check_key(&st, &headers) {
        Ok(()) => tools.list().into_response(),
        Err(e) => e.into_response(),
    }
}

async fn tools_call(
    State(st): State<RouterState>,
    axum::Extension(tools): axum::Extension<crate::server_tools::ServerTools>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    match check_key(&st, &headers) {
        Ok(()) => tools.call(&body, &headers).await.into_response(),
        Err(e) => e.into_response(),
    }
}

fn check_key(st: &RouterState, headers: &axum::http::HeaderMap) -> Result<(), ApiError> {
    if crate::routes::key_ok(&st.0.server.api_keys, headers) {
        Ok(())
    } else {
        Err(ApiError::unauthorized())
    }
}

async fn list(
    State(st): State<RouterState>,
    Query(q): Query<HashMap<String, String>>,
    headers: axum::http::HeaderMap,
) -> Response {
    if let Err(e) = check_key(&st, &headers) {
        return e.into_response();
    }
    if q.get("reload").is_some_and(|v| v == "1") {
        let found = (st.0.cfg.scan)();
        *st.0
            .models
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = found;
    }
    let loaded: Vec<String> = st.0.loaded.lock().await.keys().cloned().collect();
    let loading =
        st.0.loading
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
    let data: Vec<Value> = st
        .models()
        .into_iter()
        .map(|m| {
            let status = if loaded.contains(&m.id) {
                "loaded"
            } else if loading.as_deref() == Some(m.id.as_str()) {
                "loading"
            } else {
                "unloaded"
            };
            json!({
                "id": m.id, "object": "model", "owned_by": "llamacpp",
                "aliases": m.aliases, "path": m.path.display().to_string(),
                "status": {"value": status},
            })
        })
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

/// The `model` of a load/unload request.
fn model_field(body: &Value) -> Option<&str> {
    body.get("model").and_then(Value::as_str)
}

async fn load(
    State(st): State<RouterState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let r = async {
        check_key(&st, &headers)?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("bad JSON: {e}")))?;
        let m = st.resolve(model_field(&v))?;
        let _ = st.instance(&m, true).await?;
        Ok::<_, ApiError>(axum::Json(json!({"success": true})).into_response())
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

async fn unload(
    State(st): State<RouterState>,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let r = async {
        check_key(&st, &headers)?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::bad_request(format!("bad JSON: {e}")))?;
        let m = st.resolve(model_field(&v))?;
        st.0.loaded.lock().await.remove(&m.id);
        Ok::<_, ApiError>(axum::Json(json!({"success": true})).into_response())
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

/// Any other request: to the server of the model it names. `/props` without a model is
/// the router's own.
async fn dispatch(State(st): State<RouterState>, req: Request) -> Response {
    let r = async {
        let (parts, body) = req.into_parts();
        let query_model = parts.uri.query().and_then(|q| {
            url_query(q)
                .into_iter()
                .find(|(k, _)| k == "model")
                .map(|(_, v)| v)
        });
        if parts.method == Method::GET && parts.uri.path() == "/props" && query_model.is_none() {
            check_key(&st, &parts.headers)?;
            return Ok(axum::Json(json!({
                "role": "router",
                "max_instances": st.0.cfg.models_max,
                "models_autoload": st.0.cfg.autoload,
                "build_info": crate::routes::FINGERPRINT,
            }))
            .into_response());
        }
        let bytes = axum::body::to_bytes(body, st.0.server.max_body_bytes)
            .await
            .map_err(|_| {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "invalid_request_error",
                    "the request body is too large",
                )
            })?;
        let body_model = if parts.method == Method::POST {
            serde_json::from_slice::<Value>(&bytes)
                .ok()
                .and_then(|v| model_field(&v).map(str::to_string))
        } else {
            None
        };
        let name = body_model.or(query_model);
        let m = st.resolve(name.as_deref())?;
        let app = st.instance(&m, st.0.cfg.autoload).await?;
        use tower::ServiceExt;
        let req = Request::from_parts(parts, Body::from(bytes));
        let Ok(resp) = app.oneshot(req).await;
        Ok::<_, ApiError>(resp)
    };
    r.await.unwrap_or_else(IntoResponse::into_response)
}

/// `a=1&b=x%20y` as pairs, percent-decoded.
fn url_query(q: &str) -> Vec<(String, String)> {
    let decode = |s: &str| {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    let hex = |c: u8| (c as char).to_digit(16);
                    match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                        (Some(h), Some(l)) => {
                            out.push((h * 16 + l) as u8);
                            i += 2;
                        }
                        _ => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode() {
        assert_eq!(
            url_query("model=ggml-org%2Fx%3AQ8_0&reload=1&x"),
            vec![
                ("model".to_string(), "ggml-org/x:Q8_0".to_string()),
                ("reload".to_string(), "1".to_string()),
                ("x".to_string(), String::new()),
            ]
        );
        assert_eq!(
            url_query("a=%zz%4"),
            vec![("a".to_string(), "%zz%4".to_string())]
        );
    }
}
