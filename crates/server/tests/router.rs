//! Router mode: models named by requests are loaded on first use, at most `models_max` at
//! once (least recently used out first), listed with their state; unknown names are 400s.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{get, post};
use lamina_server::ServerConfig;
use lamina_server::fake::FakeEngine;
use lamina_server::model_router::{self, Loader, ModelEntry, RouterConfig, Scan};
use serde_json::{Value, json};

fn entries() -> Vec<ModelEntry> {
    ["alpha", "beta"]
        .iter()
        .map(|id| ModelEntry {
            id: id.to_string(),
            aliases: vec![format!("{id}-short")],
            path: PathBuf::from(format!("/models/{id}.gguf")),
        })
        .collect()
}

fn status(v: &Value, id: &str) -> String {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .map(|m| m["status"]["value"].as_str().unwrap().to_string())
        .unwrap()
}

async fn start(models_max: usize, autoload: bool, loads: Arc<AtomicUsize>) -> std::net::SocketAddr {
    let scan: Scan = Arc::new(entries);
    let loader: Loader = Arc::new(move |_m| {
        loads.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(FakeEngine::new(1024, 1)) as Box<dyn lamina_server::Engine>)
    });
    let cfg = RouterConfig {
        scan,
        models_max,
        autoload,
        default_model: Some("alpha".into()),
    };
    let app = model_router::build(
        cfg,
        loader,
        ServerConfig::default(),
        lamina_server::server_tools::ServerTools::disabled(),
    );
    lamina_server::spawn_app(app).await.unwrap()
}

fn chat(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
}

#[tokio::test]
async fn loads_on_demand_and_evicts_the_least_recently_used() {
    let loads = Arc::new(AtomicUsize::new(0));
    let addr = start(1, true, loads.clone()).await;
    let props = get(addr, "/props").await.json();
    assert_eq!(props["role"], "router");
    assert_eq!(props["max_instances"], 1);
    let m = get(addr, "/models").await.json();
    assert_eq!(status(&m, "alpha"), "unloaded");
    assert_eq!(status(&m, "beta"), "unloaded");

    let r = post(addr, "/v1/chat/completions", chat("beta-short")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["model"], "beta");
    let m = get(addr, "/models").await.json();
    assert_eq!(status(&m, "beta"), "loaded");

    // No model: the default one, which pushes beta out (models_max 1).
    let r = post(
        addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let m = get(addr, "/models").await.json();
    assert_eq!(status(&m, "alpha"), "loaded");
    assert_eq!(status(&m, "beta"), "unloaded");
    // A second request to a loaded model does not load it again.
    post(addr, "/v1/chat/completions", chat("alpha")).await;
    assert_eq!(loads.load(Ordering::Relaxed), 2);

    let r = post(addr, "/v1/chat/completions", chat("nope")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "model_not_found");

    let r = post(addr, "/models/unload", json!({"model": "alpha"})).await;
    assert_eq!(r.json()["success"], true);
    assert_eq!(
        status(&get(addr, "/models").await.json(), "alpha"),
        "unloaded"
    );
}

#[tokio::test]
async fn without_autoload_models_load_only_when_asked() {
    let addr = start(0, false, Arc::new(AtomicUsize::new(0))).await;
    let r = post(addr, "/v1/chat/completions", chat("alpha")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "model_not_loaded");
    let r = post(addr, "/models/load", json!({"model": "alpha"})).await;
    assert_eq!(r.json()["success"], true);
    let r = post(addr, "/v1/chat/completions", chat("alpha")).await;
    assert_eq!(r.status, 200, "{}", r.text());
}
