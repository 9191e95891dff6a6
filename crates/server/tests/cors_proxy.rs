//! `/cors-proxy` (`--ui-mcp-proxy`): off by default (403); on, it forwards to plain HTTP
//! targets with only the headers named `x-llama-server-proxy-header-*`, and passes the
//! target's status back (204 included).

mod common;

use axum::http::HeaderMap;
use common::get;
use lamina_server::{ServerConfig, testing};

#[tokio::test]
async fn forwards_only_the_named_headers() {
    let target = axum::Router::new()
        .route(
            "/echo",
            axum::routing::get(|h: HeaderMap| async move {
                let names: Vec<String> = h.keys().map(|k| k.to_string()).collect();
                names.join(",")
            }),
        )
        .route(
            "/empty",
            axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }),
        );
    let target = lamina_server::spawn_app(target).await.unwrap();

    let off = common::start_default().await;
    assert_eq!(get(off, "/cors-proxy?url=http://x/").await.status, 403);

    let config = ServerConfig {
        cors_proxy: true,
        api_keys: vec!["k".into()],
        ..ServerConfig::default()
    };
    let addr = common::start(1024, 1, config).await;
    let r = testing::request(
        addr,
        "GET",
        &format!("/cors-proxy?url=http://{target}/echo"),
        &[
            ("Authorization", "Bearer k"),
            ("Cookie", "session=secret"),
            ("x-llama-server-proxy-header-accept", "text/plain"),
        ],
        b"",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let names = r.text();
    assert!(names.contains("accept"), "{names}");
    assert!(
        !names.contains("authorization") && !names.contains("cookie"),
        "{names}"
    );

    let r = testing::request(
        addr,
        "POST",
        &format!("/cors-proxy?url=http://{target}/empty"),
        &[("Authorization", "Bearer k")],
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 204);
    for bad in ["ftp://x/", "http://user:pw@x/", "nonsense"] {
        let r = testing::request(
            addr,
            "GET",
            &format!("/cors-proxy?url={bad}"),
            &[("Authorization", "Bearer k")],
            b"",
        )
        .await
        .unwrap();
        assert!(r.status >= 400, "{bad}: {}", r.status);
    }
}
