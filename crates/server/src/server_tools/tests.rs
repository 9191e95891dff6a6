//! Tests of the built-in tools (on temporary directories), the sandbox, the runtime
//! header checks, the isolate plumbing (against a fake `docker`), and MCP round trips
//! against a small Python MCP server (skipped when `python3` is missing).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{Value, json};

use super::io::{Isolate, IsolateIo, ListKind, shell_quote_join};
use super::*;

async fn start(cfg: ToolsConfig) -> ServerTools {
    ServerTools::start(cfg).await.expect("tools start")
}

async fn all_tools() -> ServerTools {
    start(ToolsConfig {
        builtin: vec!["all".into()],
        ..Default::default()
    })
    .await
}

fn headers(h: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (k, v) in h {
        map.insert(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_str(v).unwrap(),
        );
    }
    map
}

async fn post_raw(t: &ServerTools, body: &Value, h: &[(&str, &str)]) -> (StatusCode, Value) {
    let r = t.call(body.to_string().as_bytes(), &headers(h)).await;
    let v = r.json_body().cloned().expect("a JSON answer");
    (r.status, v)
}

/// POST /tools; 200 expected.
async fn post(t: &ServerTools, tool: &str, params: Value, h: &[(&str, &str)]) -> Value {
    let (status, v) = post_raw(t, &json!({"tool": tool, "params": params}), h).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// A call expected to succeed (no "error").
async fn ok(t: &ServerTools, tool: &str, params: Value, h: &[(&str, &str)]) -> Value {
    let v = post(t, tool, params, h).await;
    assert!(v.get("error").is_none(), "{v}");
    v
}

/// A call expected to give a tool-level error.
async fn tool_err(t: &ServerTools, tool: &str, params: Value, h: &[(&str, &str)]) -> String {
    let v = post(t, tool, params, h).await;
    v["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error: {v}"))
        .to_string()
}

fn text(v: &Value) -> &str {
    v["plain_text_response"].as_str().unwrap_or("")
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

async fn events(t: &ServerTools, body: Value) -> Vec<Value> {
    let r = t.call(body.to_string().as_bytes(), &HeaderMap::new()).await;
    assert_eq!(r.status, StatusCode::OK);
    let ToolsBody::Events(mut rx) = r.body else {
        panic!("not a stream: {:?}", r.body);
    };
    let mut out = Vec::new();
    while let Some(v) = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("stream stalled")
    {
        out.push(v);
    }
    out
}

// ---------------------------------------------------------------------------------------
// setup and listing
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn disabled_answers_403() {
    let t = start(ToolsConfig::default()).await;
    assert!(!t.enabled());
    let r = t.list();
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(
        r.json_body().unwrap(),
        &json!({"error": {"message": "this feature is disabled", "type": "feature_disabled"}})
    );
    let r = t.call(br#"{"tool":"read_file"}"#, &HeaderMap::new()).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // --tools-runtime alone does not enable anything (nor is it validated)
    let t = start(ToolsConfig {
        runtime: Some("bogus".into()),
        ..Default::default()
    })
    .await;
    assert!(!t.enabled());
}

#[tokio::test]
async fn setup_errors() {
    let e = ServerTools::start(ToolsConfig {
        builtin: vec!["read_file".into(), "nope".into()],
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "tools setup failed: unknown tool \"nope\". available tools: read_file, file_glob_search, \
         grep_search, exec_shell_command, write_file, edit_file, get_info"
    );
    for (rt, msg) in [
        ("fake:x", "unknown tool runtime: fake:x"),
        (
            "ssh:-oProxyCommand=x",
            "invalid ssh target: -oProxyCommand=x",
        ),
        (
            "docker-container:--privileged",
            "invalid container id: --privileged",
        ),
        (
            "docker:",
            "--tools-runtime docker:<image> requires an image name",
        ),
    ] {
        let e = ServerTools::start(ToolsConfig {
            builtin: vec!["all".into()],
            runtime: Some(rt.into()),
            ..Default::default()
        })
        .await
        .unwrap_err();
        assert_eq!(e.to_string(), format!("tools setup failed: {msg}"));
    }
    let e = ServerTools::start(ToolsConfig {
        builtin: vec!["all".into()],
        sandbox: Some("/definitely/not/here".into()),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert!(matches!(e, ToolsError::Setup(_)), "{e}");
}

#[test]
fn tools_flag_and_cors() {
    assert_eq!(ToolsConfig::parse_tools_list("all"), vec!["all"]);
    assert_eq!(
        ToolsConfig::parse_tools_list("read_file,grep_search"),
        vec!["read_file", "grep_search"]
    );
    assert_eq!(ToolsConfig::parse_tools_list("\"a,b\",c"), vec!["a,b", "c"]);
    assert_eq!(ToolsConfig::parse_tools_list(""), vec![""]);
    assert!(!ToolsConfig::default().restricts_cors());
    assert!(
        ToolsConfig {
            builtin: vec!["all".into()],
            ..Default::default()
        }
        .restricts_cors()
    );
    assert!(
        ToolsConfig {
            mcp_json: Some("{}".into()),
            ..Default::default()
        }
        .restricts_cors()
    );
}

#[tokio::test]
async fn listing() {
    let t = all_tools().await;
    assert!(t.enabled());
    let r = t.list();
    assert_eq!(r.status, StatusCode::OK);
    let list = r.json_body().unwrap().as_array().unwrap().clone();
    let names: Vec<&str> = list.iter().map(|t| t["tool"].as_str().unwrap()).collect();
    assert_eq!(names, BUILTIN_TOOL_NAMES.to_vec());
    for entry in &list {
        let keys: Vec<&String> = entry.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "display_name",
                "tool",
                "type",
                "permissions",
                "uses_cwd",
                "definition"
            ]
        );
        assert_eq!(entry["type"], "server");
        assert_eq!(entry["uses_cwd"], true);
        assert_eq!(entry["definition"]["type"], "function");
        assert_eq!(entry["definition"]["function"]["name"], entry["tool"]);
        assert_eq!(
            entry["definition"]["function"]["parameters"]["type"],
            "object"
        );
    }
    let write: Vec<bool> = list
        .iter()
        .map(|t| t["permissions"]["write"].as_bool().unwrap())
        .collect();
    assert_eq!(write, [false, false, false, true, true, true, false]);
    assert_eq!(list[0]["display_name"], "Read file");
    assert_eq!(
        list[3]["definition"]["function"]["parameters"]["properties"]["timeout"]["description"],
        "Timeout in seconds (default 10, max 60)"
    );
    assert_eq!(t.openai_tools().len(), 7);

    let t = start(ToolsConfig {
        builtin: ToolsConfig::parse_tools_list("grep_search,read_file"),
        ..Default::default()
    })
    .await;
    assert_eq!(t.tool_names(), ["read_file", "grep_search"]);
    let (status, v) = post_raw(&t, &json!({"tool": "write_file", "params": {}}), &[]).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        v,
        json!({"code": 400, "message": "unknown tool \"write_file\"", "type": "invalid_request_error"})
    );
}

#[tokio::test]
async fn request_errors() {
    let t = all_tools().await;
    let r = t.call(b"not json", &HeaderMap::new()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json_body().unwrap()["type"], "invalid_request_error");
    let (status, v) = post_raw(&t, &json!({"params": {}}), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["message"],
        "[json.exception.out_of_range.403] key 'tool' not found"
    );
    let (status, v) = post_raw(&t, &json!({"tool": "read_file", "params": {}}), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["message"],
        "[json.exception.out_of_range.403] key 'path' not found"
    );
    let (status, v) = post_raw(
        &t,
        &json!({"tool": "read_file", "params": {"path": 3}}),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        v["message"],
        "[json.exception.type_error.302] type must be string, but is number"
    );
    let (status, _) = post_raw(&t, &json!({"tool": "read_file", "params": [1]}), &[]).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, v) = post_raw(
        &t,
        &json!({"tool": "read_file", "params": {"path": "x"}, "stream": true}),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        v["message"],
        "tool \"read_file\" does not support stream = true"
    );
    // a huge or deeply nested body never panics
    let deep = "[".repeat(100_000);
    let r = t.call(deep.as_bytes(), &HeaderMap::new()).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
}

// ---------------------------------------------------------------------------------------
// read / write / edit
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn write_read_edit() {
    let t = all_tools().await;
    let dir = tempfile::tempdir().unwrap();
    let log = s(&dir.path().join("sub/test.log"));

    let w = ok(
        &t,
        "write_file",
        json!({"path": log, "content": "line1\nline2\nline3\n"}),
        &[],
    )
    .await;
    assert_eq!(
        w,
        json!({"result": "file written successfully", "path": log, "bytes": 18})
    );
    let r = ok(&t, "read_file", json!({"path": log}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "line1\nline2\nline3\n"}));

    let e = ok(
        &t,
        "edit_file",
        json!({"path": log, "edits": [
            {"old_text": "line2", "new_text": "line2-edited"},
            {"old_text": "line3\n", "new_text": "line3\nline4\n"},
        ]}),
        &[],
    )
    .await;
    assert_eq!(
        e,
        json!({"result": "file edited successfully", "path": log, "edits_applied": 2})
    );
    let r = ok(&t, "read_file", json!({"path": log}), &[]).await;
    assert_eq!(text(&r), "line1\nline2-edited\nline3\nline4\n");

    // line ranges and line numbers
    let r = ok(
        &t,
        "read_file",
        json!({"path": log, "start_line": 2, "end_line": 3, "append_loc": true}),
        &[],
    )
    .await;
    assert_eq!(text(&r), "2\u{2192}line2-edited\n3\u{2192}line3\n");
    let r = ok(&t, "read_file", json!({"path": log, "end_line": 0}), &[]).await;
    assert_eq!(text(&r), "");

    // base64 only through the header
    let r = ok(
        &t,
        "read_file",
        json!({"path": log, "resp_type": "base64"}),
        &[],
    )
    .await;
    assert!(r.get("base64").is_none());
    let r = ok(
        &t,
        "read_file",
        json!({"path": log}),
        &[("x-resp-type", "base64")],
    )
    .await;
    assert_eq!(r["size_bytes"], 31);
    assert_eq!(r["base64"], "bGluZTEKbGluZTItZWRpdGVkCmxpbmUzCmxpbmU0Cg==");

    // big files need a range
    let big = dir.path().join("big.txt");
    std::fs::write(&big, "0123456789\n".repeat(3000)).unwrap();
    let err = tool_err(&t, "read_file", json!({"path": s(&big)}), &[]).await;
    assert_eq!(
        err,
        "file too large (33000 bytes, max 16384). Use start_line/end_line to read a portion."
    );
    let r = ok(
        &t,
        "read_file",
        json!({"path": s(&big), "start_line": 2999, "end_line": 5000}),
        &[],
    )
    .await;
    assert_eq!(text(&r), "0123456789\n0123456789\n");
    let r = ok(
        &t,
        "read_file",
        json!({"path": s(&big), "end_line": 100000}),
        &[],
    )
    .await;
    assert!(text(&r).ends_with("[output truncated]"));
    assert!(text(&r).len() <= 16384 + 20);

    let missing = s(&dir.path().join("missing"));
    let err = tool_err(&t, "read_file", json!({"path": missing}), &[]).await;
    assert_eq!(err, format!("cannot stat file: {missing}"));
    let err = tool_err(&t, "read_file", json!({"path": s(dir.path())}), &[]).await;
    assert!(err.starts_with("cannot stat file"), "{err}");
}

#[tokio::test]
async fn edit_rejections() {
    let t = all_tools().await;
    let dir = tempfile::tempdir().unwrap();
    let log = s(&dir.path().join("test.log"));
    ok(
        &t,
        "write_file",
        json!({"path": log, "content": "dup\ndup\n"}),
        &[],
    )
    .await;

    let err = tool_err(
        &t,
        "edit_file",
        json!({"path": log, "edits": [{"old_text": "dup", "new_text": "x"}]}),
        &[],
    )
    .await;
    assert_eq!(
        err,
        format!("found 2 occurrences of edits[0].old_text in {log}, it must be unique")
    );

    ok(
        &t,
        "write_file",
        json!({"path": log, "content": "line1\nline2\n"}),
        &[],
    )
    .await;
    let err = tool_err(
        &t,
        "edit_file",
        json!({"path": log, "edits": [
            {"old_text": "line1\nline2", "new_text": "a"},
            {"old_text": "line2", "new_text": "b"},
        ]}),
        &[],
    )
    .await;
    assert_eq!(
        err,
        format!(
            "edits[0] and edits[1] overlap in {log}; merge them into one edit or target disjoint regions"
        )
    );
    let err = tool_err(
        &t,
        "edit_file",
        json!({"path": log, "edits": [{"old_text": "zzz", "new_text": "b"}]}),
        &[],
    )
    .await;
    assert_eq!(
        err,
        format!(
            "could not find edits[0].old_text in {log}, it must match the file's current content exactly"
        )
    );
    let err = tool_err(
        &t,
        "edit_file",
        json!({"path": log, "edits": [
            {"old_text": "line1", "new_text": "x"}, {"old_text": "", "new_text": "b"},
        ]}),
        &[],
    )
    .await;
    assert_eq!(err, "edits[1].old_text must not be empty");
    let err = tool_err(
        &t,
        "edit_file",
        json!({"path": log, "edits": [{"old_text": "line1", "new_text": "line1"}]}),
        &[],
    )
    .await;
    assert_eq!(
        err,
        "no changes made: the replacement(s) produced identical content"
    );
    let err = tool_err(&t, "edit_file", json!({"path": log, "edits": []}), &[]).await;
    assert_eq!(err, "\"edits\" must be a non-empty array");
    let (status, _) = post_raw(
        &t,
        &json!({"tool": "edit_file", "params": {"path": log, "edits": [{"old_text": "a"}]}}),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = post_raw(
        &t,
        &json!({"tool": "edit_file", "params": {"path": log, "edits": ["a"]}}),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let missing = s(&dir.path().join("nope"));
    let err = tool_err(
        &t,
        "edit_file",
        json!({"path": missing, "edits": [{"old_text": "a", "new_text": "b"}]}),
        &[],
    )
    .await;
    assert_eq!(err, format!("failed to open file: {missing}"));
    // the file is untouched by the failures
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "line1\nline2\n");
}

#[tokio::test]
async fn edit_fuzzy_keeps_untouched_lines() {
    let t = all_tools().await;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.txt");
    // trailing spaces and smart quotes in the file; the edit is written in ASCII
    std::fs::write(&f, "keep  \nsay \u{201C}hi\u{201D}  \nend\t\n").unwrap();
    let e = ok(
        &t,
        "edit_file",
        json!({"path": s(&f), "edits": [{"old_text": "say \"hi\"", "new_text": "say bye"}]}),
        &[],
    )
    .await;
    assert_eq!(e["edits_applied"], 1);
    assert_eq!(
        std::fs::read_to_string(&f).unwrap(),
        "keep  \nsay bye\nend\t\n"
    );
}

// ---------------------------------------------------------------------------------------
// grep / glob
// ---------------------------------------------------------------------------------------

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::create_dir_all(p.join("project-alpha/src")).unwrap();
    std::fs::write(p.join("project-alpha/README.md"), "alpha\nMarker here\n").unwrap();
    std::fs::write(
        p.join("project-alpha/src/main.cpp"),
        "int main() {}\n// marker\nreturn;\n",
    )
    .unwrap();
    std::fs::create_dir_all(p.join("project-beta")).unwrap();
    std::fs::write(p.join("project-beta/notes.txt"), "beta\n").unwrap();
    std::fs::create_dir_all(p.join("build/nested")).unwrap();
    std::fs::write(p.join("build/artifact.txt"), "marker in build\n").unwrap();
    dir
}

#[tokio::test]
async fn grep_search() {
    let t = all_tools().await;
    let dir = tree();
    let base = s(dir.path());

    let r = ok(
        &t,
        "grep_search",
        json!({"path": base, "pattern": "marker"}),
        &[],
    )
    .await;
    assert_eq!(
        text(&r),
        "project-alpha/src/main.cpp:// marker\n\n---\nTotal matches: 1\n"
    );

    let r = ok(&t, "grep_search", json!({"path": base, "pattern": "MARKER", "ignore_case": true, "return_line_numbers": true}), &[]).await;
    assert_eq!(
        text(&r),
        "project-alpha/README.md:2:Marker here\nproject-alpha/src/main.cpp:2:// marker\n\n---\nTotal matches: 2\n"
    );
    let r = ok(
        &t,
        "grep_search",
        json!({"path": base, "pattern": "marker", "context_lines": 1}),
        &[],
    )
    .await;
    assert_eq!(
        text(&r),
        "project-alpha/src/main.cpp-1-int main() {}\nproject-alpha/src/main.cpp:2:// marker\n\
         project-alpha/src/main.cpp-3-return;\n--\n\n---\nTotal matches: 1\n"
    );
    let r = ok(
        &t,
        "grep_search",
        json!({"path": base, "pattern": "main()", "literal": true, "include": "*.cpp"}),
        &[],
    )
    .await;
    assert!(text(&r).contains("Total matches: 1"), "{r}");
    let r = ok(
        &t,
        "grep_search",
        json!({"path": base, "pattern": "a", "include": "*.md", "exclude": "README*"}),
        &[],
    )
    .await;
    assert!(text(&r).ends_with("Total matches: 0\n"), "{r}");
    // a single file shows the path as given
    let main = s(&dir.path().join("project-alpha/src/main.cpp"));
    let r = ok(
        &t,
        "grep_search",
        json!({"path": main, "pattern": "return"}),
        &[],
    )
    .await;
    assert_eq!(
        text(&r),
        format!("{main}:return;\n\n---\nTotal matches: 1\n")
    );

    let err = tool_err(
        &t,
        "grep_search",
        json!({"path": base, "pattern": "(unclosed"}),
        &[],
    )
    .await;
    assert!(err.starts_with("invalid regex: "), "{err}");
    let err = tool_err(
        &t,
        "grep_search",
        json!({"path": s(&dir.path().join("nope")), "pattern": "x"}),
        &[],
    )
    .await;
    assert!(err.starts_with("path does not exist: "), "{err}");

    // the match limit
    let many = dir.path().join("many.txt");
    std::fs::write(&many, "hit\n".repeat(150)).unwrap();
    let r = ok(
        &t,
        "grep_search",
        json!({"path": s(&many), "pattern": "hit"}),
        &[],
    )
    .await;
    assert!(
        text(&r).contains("Total matches: 100\n[100 matches limit reached."),
        "{r}"
    );
}

#[tokio::test]
async fn glob_search() {
    let t = all_tools().await;
    let dir = tree();
    let base = s(dir.path());

    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": base, "type": "dir"}),
        &[],
    )
    .await;
    let txt = text(&r);
    assert!(
        txt.contains("project-alpha/\n") && txt.contains("project-beta/\n"),
        "{txt}"
    );
    assert!(txt.contains("project-alpha/src/\n"), "{txt}");
    assert!(!txt.contains("README.md"));
    let types: std::collections::HashMap<String, String> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["path"].as_str().unwrap().into(),
                e["type"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(types["project-alpha"], "dir");
    assert_eq!(types["project-alpha/src"], "dir");
    assert_eq!(r["base"], base);
    // a junk directory is listed but never walked
    assert!(types.contains_key("build"));
    assert!(!types.contains_key("build/nested"));

    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": base, "type": "all", "include": "*proj*"}),
        &[],
    )
    .await;
    let paths: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["project-alpha", "project-beta"]);

    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": base, "type": "all"}),
        &[],
    )
    .await;
    let paths: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert!(paths.contains(&"project-alpha/src/main.cpp"));
    assert!(!paths.contains(&"build/artifact.txt"));

    // depth and limit
    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": base, "max_depth": 2}),
        &[],
    )
    .await;
    assert!(text(&r).contains("project-alpha/README.md"));
    assert!(!text(&r).contains("main.cpp"));
    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": base, "max_depth": 1}),
        &[],
    )
    .await;
    assert_eq!(r["entries"].as_array().unwrap().len(), 0);
    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": base, "limit": 1}),
        &[],
    )
    .await;
    assert_eq!(r["entries"].as_array().unwrap().len(), 1);
    assert!(
        text(&r).contains("Total matches: 3\n[1 results limit reached (3 total matches)."),
        "{r}"
    );
    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": base, "include": "src/*.cpp"}),
        &[],
    )
    .await;
    assert_eq!(
        r["entries"],
        json!([{"path": "project-alpha/src/main.cpp", "type": "file"}])
    );

    let err = tool_err(
        &t,
        "file_glob_search",
        json!({"path": base, "type": "bogus"}),
        &[],
    )
    .await;
    assert_eq!(
        err,
        "invalid type: bogus (expected \"file\", \"dir\" or \"all\")"
    );
    let err = tool_err(
        &t,
        "file_glob_search",
        json!({"path": base, "limit": 0}),
        &[],
    )
    .await;
    assert_eq!(err, "invalid limit: 0 (expected 1 or more)");
    let err = tool_err(
        &t,
        "file_glob_search",
        json!({"path": s(&dir.path().join("nope"))}),
        &[],
    )
    .await;
    assert!(
        err.starts_with("path does not exist or is not a directory: "),
        "{err}"
    );
    let err = tool_err(
        &t,
        "file_glob_search",
        json!({"path": base, "include": "*".repeat(2000)}),
        &[],
    )
    .await;
    assert!(err.contains("pattern too long"), "{err}");
}

#[tokio::test]
async fn glob_honours_gitignore() {
    if std::process::Command::new("git")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("git missing, skipped");
        return;
    }
    let t = all_tools().await;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    let st = std::process::Command::new("git")
        .args(["init", "-q"])
        .current_dir(p)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::write(p.join(".gitignore"), "ignored.txt\n").unwrap();
    std::fs::write(p.join("ignored.txt"), "x").unwrap();
    std::fs::write(p.join("kept.txt"), "x").unwrap();
    std::fs::create_dir_all(p.join("d")).unwrap();
    std::fs::write(p.join("d/deep.txt"), "x").unwrap();
    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": s(p), "include": "*.txt"}),
        &[],
    )
    .await;
    let mut paths: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    paths.sort();
    assert_eq!(paths, ["d/deep.txt", "kept.txt"]);
    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": s(p), "include": "*.txt", "max_depth": 1}),
        &[],
    )
    .await;
    assert_eq!(r["entries"], json!([{"path": "kept.txt", "type": "file"}]));
}

// ---------------------------------------------------------------------------------------
// exec_shell_command, get_info, cwd
// ---------------------------------------------------------------------------------------

#[cfg(unix)]
#[tokio::test]
async fn exec_shell_command() {
    let t = all_tools().await;
    let r = ok(
        &t,
        "exec_shell_command",
        json!({"command": "echo hello; echo oops >&2; exit 3"}),
        &[],
    )
    .await;
    assert_eq!(text(&r), "hello\noops\n\n[exit code: 3]");

    let r = ok(
        &t,
        "exec_shell_command",
        json!({"command": "yes | head -c 100000", "max_output_size": 10}),
        &[],
    )
    .await;
    assert_eq!(
        text(&r),
        "y\ny\ny\ny\ny\n\n[output truncated]\n[exit code: 0]"
    );

    let t0 = Instant::now();
    let r = ok(
        &t,
        "exec_shell_command",
        json!({"command": "echo start; sleep 30", "timeout": 1}),
        &[],
    )
    .await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(text(&r).starts_with("start\n"), "{r}");
    assert!(text(&r).ends_with(" [exit due to timed out]"), "{r}");

    // a background job that keeps the output pipe open is killed with its group at the
    // timeout instead of holding the call forever
    let t0 = Instant::now();
    let r = ok(
        &t,
        "exec_shell_command",
        json!({"command": "sleep 30 & echo bg", "timeout": 1}),
        &[],
    )
    .await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(text(&r).starts_with("bg\n"), "{r}");

    // over-long timeouts are capped, not refused
    let r = ok(
        &t,
        "exec_shell_command",
        json!({"command": "true", "timeout": 100000}),
        &[],
    )
    .await;
    assert_eq!(text(&r), "\n[exit code: 0]");
}

#[cfg(unix)]
#[tokio::test]
async fn exec_shell_command_stream() {
    let t = all_tools().await;
    let ev = events(
        &t,
        json!({"tool": "exec_shell_command", "params": {"command": "echo hello"}, "stream": true}),
    )
    .await;
    assert!(ev.len() >= 2, "{ev:?}");
    assert_eq!(ev.last().unwrap(), &json!({"done": true}));
    let chunks: String = ev[..ev.len() - 1]
        .iter()
        .map(|e| e["chunk"].as_str().unwrap())
        .collect();
    assert_eq!(chunks, "hello\n\n[exit code: 0]");

    // errors end the stream
    let ev = events(
        &t,
        json!({"tool": "exec_shell_command", "params": {}, "stream": true}),
    )
    .await;
    assert_eq!(
        ev,
        [
            json!({"done": true, "error": "[json.exception.out_of_range.403] key 'command' not found"})
        ]
    );

    // the response body goes through axum as SSE
    let r = t
        .call(
            json!({"tool": "exec_shell_command", "params": {"command": "printf a"}, "stream": true})
                .to_string()
                .as_bytes(),
            &HeaderMap::new(),
        )
        .await
        .into_response();
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let body = axum::body::to_bytes(r.into_body(), 1 << 20).await.unwrap();
    let body = String::from_utf8(body.to_vec()).unwrap();
    assert_eq!(
        body,
        "data: {\"chunk\":\"a\"}\n\ndata: {\"chunk\":\"\\n[exit code: 0]\"}\n\ndata: {\"done\":true}\n\n"
    );

    // dropping the stream kills the command
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("after");
    let cmd = format!("echo go; sleep 2; touch {}", s(&marker));
    let r = t
        .call(
            json!({"tool": "exec_shell_command", "params": {"command": cmd}, "stream": true})
                .to_string()
                .as_bytes(),
            &HeaderMap::new(),
        )
        .await;
    let ToolsBody::Events(mut rx) = r.body else {
        panic!()
    };
    assert!(
        rx.recv().await.unwrap()["chunk"]
            .as_str()
            .unwrap()
            .contains("go")
    );
    drop(rx);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!marker.exists(), "the command kept running");
}

#[cfg(unix)]
#[tokio::test]
async fn cwd_header() {
    let t = all_tools().await;
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("workdir");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("rel.txt"), "relative-content").unwrap();
    let h = [("x-tool-cwd", s(&work))];
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let r = ok(&t, "read_file", json!({"path": "rel.txt"}), &h).await;
    assert_eq!(text(&r), "relative-content\n");
    // a "cwd" from the model is ignored in favour of the header
    let r = ok(
        &t,
        "read_file",
        json!({"path": "rel.txt", "cwd": "/definitely/not/real"}),
        &h,
    )
    .await;
    assert_eq!(text(&r), "relative-content\n");
    ok(
        &t,
        "write_file",
        json!({"path": "sub/out.txt", "content": "written"}),
        &h,
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(work.join("sub/out.txt")).unwrap(),
        "written"
    );
    let r = ok(
        &t,
        "file_glob_search",
        json!({"path": ".", "include": "*.txt"}),
        &h,
    )
    .await;
    assert!(text(&r).contains("rel.txt"));
    assert_eq!(r["base"], s(&work));
    ok(
        &t,
        "exec_shell_command",
        json!({"command": "echo hi > marker.txt"}),
        &h,
    )
    .await;
    assert!(work.join("marker.txt").exists());
    let other = dir.path().join("abs.txt");
    std::fs::write(&other, "absolute-content").unwrap();
    let r = ok(&t, "read_file", json!({"path": s(&other)}), &h).await;
    assert_eq!(text(&r), "absolute-content\n");
    let r = ok(&t, "get_info", json!({}), &h).await;
    assert_eq!(r["cwd"], s(&work));
    assert!(!r["os"].as_str().unwrap().is_empty());
}

// ---------------------------------------------------------------------------------------
// sandbox
// ---------------------------------------------------------------------------------------

#[cfg(unix)]
#[tokio::test]
async fn sandbox_refuses_escapes() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("root");
    std::fs::create_dir_all(root.join("inner")).unwrap();
    std::fs::write(root.join("inside.txt"), "inside").unwrap();
    let secret = outer.path().join("secret.txt");
    std::fs::write(&secret, "secret").unwrap();
    std::os::unix::fs::symlink(&secret, root.join("link-out")).unwrap();
    std::os::unix::fs::symlink(outer.path().join("not-yet"), root.join("dangling")).unwrap();
    std::os::unix::fs::symlink(outer.path(), root.join("dir-out")).unwrap();
    std::fs::write(root.join("grep-me.txt"), "secret inside\n").unwrap();

    let t = start(ToolsConfig {
        builtin: vec!["all".into()],
        sandbox: Some(root.clone()),
        ..Default::default()
    })
    .await;
    let denied = |e: &str| assert!(e.starts_with("access denied: "), "{e}");

    // inside works, relative to the root
    let r = ok(&t, "read_file", json!({"path": "inside.txt"}), &[]).await;
    assert_eq!(text(&r), "inside\n");
    ok(
        &t,
        "write_file",
        json!({"path": "inner/new/file.txt", "content": "x"}),
        &[],
    )
    .await;
    assert!(root.join("inner/new/file.txt").exists());
    let r = ok(&t, "read_file", json!({"path": "inner/../inside.txt"}), &[]).await;
    assert_eq!(text(&r), "inside\n");

    // escapes
    denied(&tool_err(&t, "read_file", json!({"path": "../secret.txt"}), &[]).await);
    denied(
        &tool_err(
            &t,
            "read_file",
            json!({"path": "inner/../../secret.txt"}),
            &[],
        )
        .await,
    );
    denied(&tool_err(&t, "read_file", json!({"path": s(&secret)}), &[]).await);
    denied(&tool_err(&t, "read_file", json!({"path": "/etc/passwd"}), &[]).await);
    denied(&tool_err(&t, "read_file", json!({"path": "link-out"}), &[]).await);
    denied(&tool_err(&t, "read_file", json!({"path": "dir-out/secret.txt"}), &[]).await);
    denied(
        &tool_err(
            &t,
            "write_file",
            json!({"path": "dangling", "content": "x"}),
            &[],
        )
        .await,
    );
    assert!(!outer.path().join("not-yet").exists());
    denied(
        &tool_err(
            &t,
            "write_file",
            json!({"path": "../evil.txt", "content": "x"}),
            &[],
        )
        .await,
    );
    assert!(!outer.path().join("evil.txt").exists());
    denied(
        &tool_err(
            &t,
            "edit_file",
            json!({"path": "link-out", "edits": [{"old_text": "secret", "new_text": "x"}]}),
            &[],
        )
        .await,
    );
    assert_eq!(std::fs::read_to_string(&secret).unwrap(), "secret");
    denied(&tool_err(&t, "file_glob_search", json!({"path": ".."}), &[]).await);
    denied(&tool_err(&t, "grep_search", json!({"path": "/", "pattern": "x"}), &[]).await);
    if std::env::var("HOME").is_ok_and(|h| !Path::new(&h).starts_with(&root)) {
        denied(&tool_err(&t, "read_file", json!({"path": "~/.bashrc"}), &[]).await);
    }

    // grep inside the root skips the link pointing out
    let r = ok(
        &t,
        "grep_search",
        json!({"path": ".", "pattern": "secret"}),
        &[],
    )
    .await;
    assert_eq!(
        text(&r),
        "grep-me.txt:secret inside\n\n---\nTotal matches: 1\n"
    );

    // the working directory too
    let h = [("x-tool-cwd", s(outer.path()))];
    let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
    denied(&tool_err(&t, "exec_shell_command", json!({"command": "echo hi"}), &h).await);
    denied(&tool_err(&t, "read_file", json!({"path": "secret.txt"}), &h).await);
    denied(
        &tool_err(
            &t,
            "read_file",
            json!({"path": "inside.txt"}),
            &[("x-tool-cwd", "..")],
        )
        .await,
    );
    let r = ok(
        &t,
        "read_file",
        json!({"path": "../inside.txt"}),
        &[("x-tool-cwd", "inner")],
    )
    .await;
    assert_eq!(text(&r), "inside\n");
    let r = ok(
        &t,
        "exec_shell_command",
        json!({"command": "pwd"}),
        &[("x-tool-cwd", "inner")],
    )
    .await;
    assert!(text(&r).contains("/root/inner"), "{r}");

    // a default cwd outside the sandbox is a setup error
    let e = ServerTools::start(ToolsConfig {
        builtin: vec!["all".into()],
        sandbox: Some(root.clone()),
        cwd: Some(outer.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert!(e.to_string().contains("access denied"), "{e}");
}

// ---------------------------------------------------------------------------------------
// runtimes
// ---------------------------------------------------------------------------------------

#[tokio::test]
async fn runtime_header_injection() {
    let t = all_tools().await;
    let exec = json!({"tool": "exec_shell_command", "params": {"command": "echo hi"}});
    for (rt, msg) in [
        (
            "fake:does-not-exist",
            "unknown tool runtime: fake:does-not-exist",
        ),
        (
            "ssh:-oProxyCommand=touch /tmp/pwned",
            "invalid ssh target: -oProxyCommand=touch /tmp/pwned",
        ),
        ("ssh:", "invalid ssh target: "),
        ("ssh:host;rm -rf /", "invalid ssh target: host;rm -rf /"),
        ("ssh:user@host name", "invalid ssh target: user@host name"),
        (
            "docker-container:--privileged",
            "invalid container id: --privileged",
        ),
        (
            "podman-container:--privileged",
            "invalid container id: --privileged",
        ),
        ("docker-container:", "invalid container id: "),
        (
            "docker-container:abc$(id)",
            "invalid container id: abc$(id)",
        ),
        (
            "docker:busybox",
            "tool runtime must name a running container: docker:busybox",
        ),
        (
            "podman:busybox",
            "tool runtime must name a running container: podman:busybox",
        ),
    ] {
        let (status, v) = post_raw(&t, &exec, &[("x-tool-runtime", rt)]).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{rt}: {v}");
        assert_eq!(
            v,
            json!({"code": 500, "message": msg, "type": "server_error"}),
            "{rt}"
        );
    }
    // every built-in goes through the same check
    for tool in BUILTIN_TOOL_NAMES {
        let (status, _) = post_raw(
            &t,
            &json!({"tool": tool, "params": {"path": "x", "pattern": "x", "content": "x", "command": "x",
                                            "edits": [{"old_text": "a", "new_text": "b"}]}}),
            &[("x-tool-runtime", "ssh:-oX")],
        )
        .await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{tool}");
    }
    // a runtime in the params is ignored: the call runs on the host
    let r = ok(
        &t,
        "exec_shell_command",
        json!({"command": "echo hi", "runtime": "ssh:-oX"}),
        &[],
    )
    .await;
    assert!(text(&r).starts_with("hi"), "{r}");
}

#[test]
fn isolate_argv() {
    assert_eq!(
        shell_quote_join(&["echo".into(), "it's".into(), "$HOME".into()]),
        "'echo' 'it'\\''s' '$HOME'"
    );
    assert!(super::io::is_valid_ssh_target("user@host.example-1_x"));
    assert!(!super::io::is_valid_ssh_target("-oProxyCommand=x"));
    assert!(super::io::ContainerSpec::is_valid_id("a1b2.c_d-e"));
    assert!(!super::io::ContainerSpec::is_valid_id("-a"));
    assert!(!super::io::ContainerSpec::is_valid_id(".a"));
}

/// The isolate plumbing end to end, with a fake `docker` that runs `exec` locally.
#[cfg(unix)]
#[tokio::test]
async fn isolate_io_with_fake_engine() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("fake-docker");
    std::fs::write(
        &fake,
        "#!/bin/sh\n[ \"$1\" = exec ] || exit 99\nshift\n[ \"$1\" = -i ] && shift\n[ \"$1\" = cid1 ] || exit 98\nshift\nexec \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let io = IsolateIo {
        isolate: Isolate::Container {
            bin: s(&fake),
            id: "cid1".into(),
        },
        cwd: s(&work),
    };
    assert!(io.write_file("sub/test.log", b"hello container\n").await);
    assert_eq!(
        std::fs::read_to_string(work.join("sub/test.log")).unwrap(),
        "hello container\n"
    );
    assert_eq!(
        io.read_file("sub/test.log", 1 << 20).await.unwrap(),
        b"hello container\n"
    );
    assert_eq!(io.file_size("sub/test.log").await, Some(16));
    assert!(io.is_directory("sub").await);
    assert!(io.is_regular_file("sub/test.log").await);
    assert!(!io.is_regular_file("nope").await);
    std::fs::create_dir_all(work.join("node_modules/x")).unwrap();
    std::fs::write(work.join("node_modules/x/y.js"), "").unwrap();
    let l = io.list_entries(&s(&work), 0, ListKind::All).await;
    let mut paths: Vec<String> = l
        .entries
        .iter()
        .map(|e| format!("{}{}", e.rel, if e.is_dir { "/" } else { "" }))
        .collect();
    paths.sort();
    assert_eq!(paths, ["node_modules/", "sub/", "sub/test.log"]);
    let r = io
        .run(
            &["sh".into(), "-c".into(), "cat sub/test.log; pwd".into()],
            4096,
            5,
            None,
        )
        .await;
    assert_eq!(r.exit_code, 0);
    assert_eq!(
        String::from_utf8_lossy(&r.output),
        format!("hello container\n{}\n", s(&work))
    );
}

// ---------------------------------------------------------------------------------------
// MCP
// ---------------------------------------------------------------------------------------

/// A small MCP server: `echo`, `add`, `fail_once`, `sleep`, `crash`, `noisy` (a
/// notification and a malformed line before the reply), `burst` (notification and reply
/// in one write), `big` (an over-long line first), `ping_me` (asks us for a ping first),
/// `oops` (an isError result); `--grandchild` leaves a process holding its pipes.
const MCP_SERVER: &str = r#"
import json, os, sys, time, subprocess
if "--grandchild" in sys.argv:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
TOOLS = [
    {"name": "echo", "description": "Echo back the input message",
     "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}},
    {"name": "add", "description": "Add two numbers",
     "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}},
    {"name": "fail_once", "description": "Fails once", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "sleep", "description": "Sleep", "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "crash", "description": "Answer then exit"},
    {"name": "noisy", "description": "Notification first"},
    {"name": "burst", "description": "Notification and reply in one write"},
    {"name": "big", "description": "Over-long line first"},
    {"name": "ping_me", "description": "Pings the client first"},
    {"name": "oops", "description": "isError"},
    {"name": "file", "description": "Collides with read_file when the server is named read"},
]
state = {"failed": False}
out = sys.stdout.buffer
def send(obj):
    out.write((json.dumps(obj) + "\n").encode()); out.flush()
def text(req_id, t):
    return {"jsonrpc": "2.0", "id": req_id, "result": {"content": [{"type": "text", "text": t}]}}
sys.stderr.write("mcp test server starting\n"); sys.stderr.flush()
for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    try:
        req = json.loads(line)
    except Exception:
        continue
    rid = req.get("id"); method = req.get("method")
    if rid is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": "2024-11-05",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "t", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": rid, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        name = req["params"]["name"]; args = req["params"].get("arguments") or {}
        if name == "echo":
            send(text(rid, "echo: " + str(args.get("message", ""))))
        elif name == "add":
            send(text(rid, str(args.get("a", 0) + args.get("b", 0))))
        elif name == "fail_once":
            if not state["failed"]:
                state["failed"] = True
                send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32000, "message": "transient error"}})
            else:
                send(text(rid, "ok"))
        elif name == "sleep":
            time.sleep(args.get("seconds", 1)); send(text(rid, "slept"))
        elif name == "crash":
            send(text(rid, "crashing...")); os._exit(1)
        elif name == "noisy":
            send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 50}})
            out.write(b"THIS IS NOT JSON\n"); out.flush()
            send({"jsonrpc": "2.0", "id": rid + 1000, "result": {}})
            send(text(rid, "quiet now"))
        elif name == "burst":
            data = json.dumps({"jsonrpc": "2.0", "method": "notifications/progress"}) + "\n" + json.dumps(text(rid, "burst ok")) + "\n"
            os.write(1, data.encode())
        elif name == "big":
            out.write(b"x" * (9 * 1024 * 1024) + b"\n"); out.flush()
            send(text(rid, "after big"))
        elif name == "ping_me":
            send({"jsonrpc": "2.0", "id": "srv-1", "method": "ping"})
            answer = json.loads(sys.stdin.readline())
            send(text(rid, "pong id " + str(answer.get("id")) + " " + json.dumps(answer.get("result"))))
        elif name == "oops":
            send({"jsonrpc": "2.0", "id": rid, "result": {"isError": True, "content": [{"type": "text", "text": "bad input"}]}})
        else:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32602, "message": "Unknown tool: " + name}})
    else:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "Method not found"}})
"#;

/// Writes the test server; `None` when python3 is missing.
fn mcp_fixture(dir: &Path) -> Option<PathBuf> {
    let ok = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("python3 missing: MCP test skipped");
        return None;
    }
    let p = dir.join("mcp_test_server.py");
    std::fs::write(&p, MCP_SERVER).unwrap();
    Some(p)
}

fn server_entry(script: &Path, extra: Value) -> Value {
    let mut v = json!({"command": "python3", "args": [s(script)]});
    if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
        m.extend(e);
    }
    v
}

async fn mcp_tools(servers: Value, builtin: bool) -> ServerTools {
    start(ToolsConfig {
        builtin: if builtin { vec!["all".into()] } else { vec![] },
        mcp_json: Some(json!({"mcpServers": servers}).to_string()),
        ..Default::default()
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let Some(script) = mcp_fixture(dir.path()) else {
        return;
    };
    let t = mcp_tools(
        json!({
            "echo": server_entry(&script, json!({})),
            "echo2": server_entry(&script, json!({"env": {"X": "1"}, "cwd": s(dir.path())})),
            "bad": {"command": "this_executable_does_not_exist_12345", "args": []},
            "nocmd": {"args": []},
            "read": server_entry(&script, json!({})),
        }),
        true,
    )
    .await;

    // listing: config order, <server>_<tool>, the shape chat/completions expects
    let list = t.list().json_body().unwrap().clone();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tool"].as_str().unwrap())
        .collect();
    assert_eq!(&names[..7], BUILTIN_TOOL_NAMES);
    assert_eq!(names[7], "echo_echo");
    assert!(names.contains(&"echo2_add"));
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("bad_") || n.starts_with("nocmd_"))
    );
    // read_file from the "read" server collides with the built-in: skipped
    assert_eq!(names.iter().filter(|n| **n == "read_file").count(), 1);
    assert!(names.contains(&"read_echo"));
    let echo = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool"] == "echo_echo")
        .unwrap();
    assert_eq!(echo["type"], "mcp");
    assert_eq!(echo["uses_cwd"], false);
    assert_eq!(echo["permissions"], json!({"write": false}));
    let def = &echo["definition"];
    assert_eq!(def["type"], "function");
    assert_eq!(def["function"]["name"], "echo_echo");
    assert_eq!(
        def["function"]["description"],
        "Echo back the input message"
    );
    assert_eq!(def["function"]["parameters"]["type"], "object");
    assert!(def["function"]["parameters"]["properties"].is_object());
    let crash = list
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool"] == "echo_crash")
        .unwrap();
    assert_eq!(crash["definition"]["function"]["parameters"], json!({}));

    // calls
    let r = post(&t, "echo_echo", json!({"message": "hello world"}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "echo: hello world"}));
    let r = post(&t, "echo_add", json!({"a": 3, "b": 5}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "8"}));
    let r = post(&t, "echo_fail_once", json!({}), &[]).await;
    assert_eq!(r, json!({"error": "transient error"}));
    let r = post(&t, "echo_fail_once", json!({}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "ok"}));
    let r = post(&t, "echo_oops", json!({}), &[]).await;
    assert_eq!(r, json!({"error": "bad input"}));
    // notifications, malformed lines and foreign ids are skipped
    let r = post(&t, "echo_noisy", json!({}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "quiet now"}));
    let r = post(&t, "echo_burst", json!({}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "burst ok"}));
    let r = post(&t, "echo_big", json!({}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "after big"}));
    // a request from the server is answered
    let r = post(&t, "echo_ping_me", json!({}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "pong id srv-1 {}"}));
    // the "cwd" param reaches MCP tools untouched (it is an argument like any other)
    let r = post(&t, "echo2_echo", json!({"message": "m", "cwd": "/x"}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "echo: m"}));
    // no streaming for MCP tools
    let (status, _) = post_raw(
        &t,
        &json!({"tool": "echo_echo", "params": {}, "stream": true}),
        &[],
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // a crashed server is respawned on the next call
    // (a short pause: a call racing the dying process could see it still alive and
    // get "transport closed", as in llama.cpp)
    let r = post(&t, "echo_crash", json!({}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "crashing..."}));
    for i in 0..3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let r = post(&t, "echo_echo", json!({"message": i}), &[]).await;
        assert_eq!(r, json!({"plain_text_response": format!("echo: {i}")}));
        let r = post(&t, "echo_crash", json!({}), &[]).await;
        assert_eq!(r, json!({"plain_text_response": "crashing..."}));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = post(&t, "echo_echo", json!({"message": "back"}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "echo: back"}));

    // concurrent calls to one server, and many in a row
    let calls = (0..10).map(|i| {
        let t = t.clone();
        async move { post(&t, "echo_echo", json!({"message": i}), &[]).await }
    });
    for (i, r) in futures_util::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        assert_eq!(r, json!({"plain_text_response": format!("echo: {i}")}));
    }
    for i in 0..20 {
        let r = post(&t, "echo2_echo", json!({"message": format!("msg{i}")}), &[]).await;
        assert_eq!(r["plain_text_response"], format!("echo: msg{i}"));
    }

    t.shutdown().await;
    let r = post(&t, "echo_echo", json!({"message": "late"}), &[]).await;
    assert_eq!(r, json!({"error": "MCP server unavailable: echo"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_timeout_and_shutdown() {
    let dir = tempfile::tempdir().unwrap();
    let Some(script) = mcp_fixture(dir.path()) else {
        return;
    };
    let t = mcp_tools(
        json!({
            "slow": server_entry(&script, json!({"timeout_ms": 300})),
            "patient": server_entry(&script, json!({"timeout_ms": 30000})),
        }),
        false,
    )
    .await;
    let n = t.tool_names().len();
    assert_eq!(n, 22, "{:?}", t.tool_names());

    // the first call spawns the process (not timed)
    let r = post(&t, "slow_echo", json!({"message": "warm"}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "echo: warm"}));
    let t0 = Instant::now();
    let r = post(&t, "slow_sleep", json!({"seconds": 1}), &[]).await;
    assert_eq!(r, json!({"error": "request timed out"}));
    assert!(
        t0.elapsed() < Duration::from_millis(900),
        "{:?}",
        t0.elapsed()
    );
    // the stale reply of the timed-out call is skipped by id
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let r = post(&t, "slow_echo", json!({"message": "after"}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "echo: after"}));

    // shutdown cancels a call in flight at once
    let t2 = t.clone();
    let call =
        tokio::spawn(async move { post(&t2, "patient_sleep", json!({"seconds": 10}), &[]).await });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let t0 = Instant::now();
    t.shutdown().await;
    let r = tokio::time::timeout(Duration::from_secs(3), call)
        .await
        .expect("the call was not cancelled")
        .unwrap();
    assert_eq!(r, json!({"error": "cancelled"}));
    assert!(t0.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_bad_servers_and_config_errors() {
    let dir = tempfile::tempdir().unwrap();
    // a server that cannot be spawned: no tools, the start succeeds, calls are refused
    let t = mcp_tools(
        json!({"nonexistent": {"command": "this_executable_does_not_exist_12345"}}),
        true,
    )
    .await;
    assert!(t.enabled());
    assert_eq!(t.tool_names(), BUILTIN_TOOL_NAMES);
    // MCP alone enables /tools
    let t = mcp_tools(
        json!({"nonexistent": {"command": "this_executable_does_not_exist_12345"}}),
        false,
    )
    .await;
    assert!(t.enabled());
    assert_eq!(t.list().json_body().unwrap(), &json!([]));

    // a server that never answers: warm-up gives up after 10 s (the handshake gets at
    // least that, whatever timeout_ms says), start still succeeds
    let t0 = Instant::now();
    let t = mcp_tools(
        json!({"mute": {"command": "sleep", "args": ["30"], "timeout_ms": 500}}),
        false,
    )
    .await;
    let waited = t0.elapsed();
    assert!(
        waited > Duration::from_secs(9) && waited < Duration::from_secs(13),
        "{waited:?}"
    );
    assert!(t.tool_names().is_empty());

    let e = ServerTools::start(ToolsConfig {
        mcp_json: Some("not valid json".into()),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert!(
        e.to_string()
            .starts_with("MCP starting failed: failed to parse MCP config JSON: "),
        "{e}"
    );
    let e = ServerTools::start(ToolsConfig {
        mcp_config: Some("/nonexistent/path.json".into()),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "MCP starting failed: failed to open MCP config file: /nonexistent/path.json"
    );
    let e = ServerTools::start(ToolsConfig {
        mcp_json: Some(r#"{"mcpServers": {"x": {"command": "a", "args": [1]}}}"#.into()),
        ..Default::default()
    })
    .await
    .unwrap_err();
    assert!(
        e.to_string().contains("type must be string, but is number"),
        "{e}"
    );

    // parsing: order kept, no command skipped, duplicates across file and inline skipped
    let file = dir.path().join("mcp.json");
    std::fs::write(
        &file,
        r#"{"mcpServers": {"b": {"command": "x", "args": ["1"], "env": {"K": "V"}, "cwd": "/tmp", "timeout_ms": 500},
                           "a": {"command": "y"}, "skip": {"args": []}}}"#,
    )
    .unwrap();
    let cfgs = mcp::load_configs(
        Some(&file),
        Some(r#"{"mcpServers": {"a": {"command": "z"}, "c": {"command": "w"}}}"#),
    )
    .unwrap();
    let names: Vec<&str> = cfgs.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["b", "a", "c"]);
    assert_eq!(cfgs[0].args, ["1"]);
    assert_eq!(cfgs[0].env, [("K".to_string(), "V".to_string())]);
    assert_eq!(cfgs[0].cwd, "/tmp");
    assert_eq!(cfgs[0].timeout_ms, 500);
    assert_eq!(cfgs[1].command, "y");
    assert_eq!(cfgs[1].timeout_ms, 30000);
    assert!(mcp::load_configs(None, Some("{}")).unwrap().is_empty());
    assert!(mcp::load_configs(None, Some("[1, 2]")).unwrap().is_empty());
    // an empty inline config is "not configured"
    let t = start(ToolsConfig {
        mcp_json: Some(String::new()),
        ..Default::default()
    })
    .await;
    assert!(!t.enabled());
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_grandchild_holding_pipes_does_not_deadlock() {
    let dir = tempfile::tempdir().unwrap();
    let Some(script) = mcp_fixture(dir.path()) else {
        return;
    };
    let t0 = Instant::now();
    let t = mcp_tools(
        json!({"gc": {"command": "python3", "args": [s(&script), "--grandchild"]}}),
        false,
    )
    .await;
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    let r = post(&t, "gc_echo", json!({"message": "hello"}), &[]).await;
    assert_eq!(r, json!({"plain_text_response": "echo: hello"}));
    let t0 = Instant::now();
    t.shutdown().await;
    assert!(t0.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn ndjson_framing() {
    let data: Vec<u8> = [
        b"{\"a\":1}\r\n\n".to_vec(),
        vec![b'x'; super::mcp::MAX_LINE + 10],
        b"\n{\"b\":2}\npartial".to_vec(),
    ]
    .concat();
    let mut lines = Vec::new();
    super::mcp::pump_ndjson(&data[..], |l| {
        lines.push(l);
        true
    })
    .await;
    let lens: Vec<usize> = lines.iter().map(String::len).collect();
    assert_eq!(lens, [7, 7]);
    assert_eq!(lines, ["{\"a\":1}", "{\"b\":2}"]);
}
