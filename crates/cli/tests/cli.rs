//! The `lamina` program as a user runs it: real models (pulled on first use), real output.

use std::process::{Command, Output};

use lamina_gguf::pull::model_for_test;

fn lamina(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(args)
        .output()
        .expect("run lamina")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn run_generates_llama_cpp_greedy_text() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let path = path.to_str().unwrap();
    let o = lamina(&[
        "run",
        "-m",
        path,
        "-p",
        "The capital of France is",
        "-n",
        "8",
        "--temp",
        "0",
        "-t",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // llama.cpp's greedy continuation of this prompt starts " Paris.\n\nThe United States".
    assert!(
        stdout(&o).starts_with("The capital of France is Paris.\n\nThe United States"),
        "{}",
        stdout(&o)
    );
    let err = stderr(&o);
    assert!(
        err.contains("prompt eval time") && err.contains("tokens per second"),
        "{err}"
    );
}

/// The model split over three virtual devices (layers 1:2:1, pipelined prompt) prints exactly
/// what one device prints; the placement flags take llama.cpp's short forms; bad placements
/// are clear errors.
#[test]
fn run_on_three_devices_prints_the_same_text() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let path = path.to_str().unwrap();
    let prompt = "Areopagitica is a prose polemic by John Milton. It argues that";
    let base = [
        "run", "-m", path, "-p", prompt, "-n", "24", "--temp", "0", "-t", "2", "-ub", "8",
    ];
    let run = |devices: &str, extra: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .env("LAMINA_CPU_DEVICES", devices)
            .args(base)
            .args(extra)
            .output()
            .expect("run lamina");
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
        stdout(&o)
    };
    let one = run("1", &[]);
    assert!(one.len() > prompt.len() + 20, "{one}");
    assert_eq!(
        run("3", &["--split-mode", "layer", "--tensor-split", "1,2,1"]),
        one
    );
    assert_eq!(run("3", &["-sm", "none", "-mg", "1"]), one);
    assert_eq!(
        run("2", &["-ngl", "12", "-ts", "1,3", "--device", "CPU1,CPU0"]),
        one
    );
    assert_eq!(run("4", &["--no-pipeline"]), one);

    for (flags, message) in [
        (&["--device", "GPU7"][..], "unknown device \"GPU7\""),
        (&["-sm", "row"][..], "--split-mode row is not supported"),
        (&["-sm", "diagonal"][..], "unknown split mode"),
        (&["-ts", "1,1,1"][..], "3 values for 2 device(s)"),
        (
            &["-sm", "none", "-mg", "5"][..],
            "--main-gpu 5 is out of range",
        ),
        (&["-ngl", "many"][..], "--n-gpu-layers \"many\""),
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .env("LAMINA_CPU_DEVICES", "2")
            .args(base)
            .args(flags)
            .output()
            .expect("run lamina");
        assert_eq!(o.status.code(), Some(1), "{flags:?}");
        assert!(stderr(&o).contains(message), "{flags:?}: {}", stderr(&o));
    }
}

#[test]
fn run_refuses_a_prompt_longer_than_the_context() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let long = "word ".repeat(100);
    let o = lamina(&[
        "run",
        "-m",
        path.to_str().unwrap(),
        "-c",
        "32",
        "-p",
        &long,
        "-n",
        "1",
    ]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("does not fit in the context of 32"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn chat_answers_through_the_template() {
    use std::io::Write;
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args([
            "chat",
            "-m",
            path.to_str().unwrap(),
            "--temp",
            "0",
            "-n",
            "12",
            "-t",
            "2",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is 2+2?\n/exit\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // llama.cpp's greedy reply to this chat prompt (reference outputs) is "The answer is: 4" or
    // similar; SmolLM2 answers 4 either way.
    assert!(stdout(&o).contains('4'), "{}", stdout(&o));

    // With a grammar every reply follows it from its start.
    let mut child = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args([
            "chat",
            "-m",
            path.to_str().unwrap(),
            "--temp",
            "0",
            "-n",
            "12",
        ])
        .args(["-t", "2", "--grammar", "root ::= (\"yes\" | \"no\") \".\""])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"Is the sky blue?\nIs fire cold?\n/exit\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    let replies: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(replies.len(), 2, "{}", stdout(&o));
    assert!(
        replies.iter().all(|r| *r == "yes." || *r == "no."),
        "{replies:?}"
    );
}

#[test]
fn tokenize_prints_llama_tokenize_ids() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let o = lamina(&[
        "tokenize",
        "-m",
        path.to_str().unwrap(),
        "-p",
        "Hello world",
        "--ids",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim(), "[19556, 905]");
}

#[test]
fn inspect_and_devices() {
    let Some(path) = model_for_test("gemma3-270m") else {
        return;
    };
    let o = lamina(&["inspect", path.to_str().unwrap(), "--no-tensors"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("gemma3.attention.sliding_window"),
        "{}",
        stdout(&o)
    );

    let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .arg("--list-devices")
        .env("LAMINA_CPU_DEVICES", "3")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    for name in ["CPU0:", "CPU1:", "CPU2:"] {
        assert!(out.contains(name), "{out}");
    }
}

#[test]
fn bad_input_is_a_clear_error() {
    let o = lamina(&["run", "-m", "/nonexistent/model.gguf", "-p", "x"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("neither a file nor a known model name"),
        "{}",
        stderr(&o)
    );

    let o = lamina(&["run", "-p", "x", "--no-such-flag"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unexpected argument"), "{}", stderr(&o));

    // A file that is not GGUF: a typed error, no panic.
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.gguf");
    std::fs::write(&bogus, b"not a model at all").unwrap();
    let o = lamina(&["run", "-m", bogus.to_str().unwrap(), "-p", "x"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("not a GGUF file"), "{}", stderr(&o));

    // A vocab-only file has no weights: the missing tensor is named.
    let vocab = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/vocab/ggml-vocab-llama-bpe.gguf"
    );
    if std::path::Path::new(vocab).exists() {
        let o = lamina(&["run", "-m", vocab, "-p", "x"]);
        assert_eq!(o.status.code(), Some(1));
        assert!(
            stderr(&o).contains("tensor \"token_embd.weight\" is missing"),
            "{}",
            stderr(&o)
        );
    }
}

/// Context and batch settings that cannot work are refused with one clear line before
/// anything is allocated (as llama.cpp, a context past the training one only warns).
#[test]
fn impossible_context_and_batch_settings_are_refused() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let path = path.to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", "-m", path, "-p", "x", "-n", "1"];
        args.extend_from_slice(extra);
        lamina(&args)
    };
    // 2^40 cells: petabytes of cache, refused by size.
    let o = run(&["-c", "1099511627776"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("needs") && err.contains("free") && err.contains("-ctk q8_0"),
        "{err}"
    );
    assert_eq!(err.matches("KV cache").count(), 1, "said once: {err}");
    for (flag, value, message) in [
        ("-b", "0", "-b must be at least 1"),
        ("--ubatch-size", "0", "-ub must be at least 1"),
        ("-n", "-3", "-1 (no limit) or -2"),
        ("-c", "-5", "-5 is negative"),
        ("-t", "0", "-t must be at least 1"),
    ] {
        let mut args = vec!["run", "-m", path, "-p", "x", flag, value];
        if flag != "-n" {
            args.extend(["-n", "1"]);
        }
        let o = lamina(&args);
        assert!(!o.status.success(), "{flag} {value}");
        assert!(
            stderr(&o).contains(message),
            "{flag} {value}: {}",
            stderr(&o)
        );
    }
    // Past the training context: a warning, then it runs.
    let train = lamina_model::HParams::from_gguf(&lamina_gguf::GgufFile::open(path).unwrap())
        .unwrap()
        .n_ctx_train;
    let c = (2 * train).to_string();
    let o = run(&["-c", &c]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("possible training context overflow"),
        "{}",
        stderr(&o)
    );
    let o = lamina(&["serve", "-m", path, "-b", "0"]);
    assert!(
        stderr(&o).contains("-b must be at least 1"),
        "{}",
        stderr(&o)
    );
}

/// `lamina serve` with a real model, driven by the official `openai` Python package (chat,
/// streaming, completions, logprobs, embeddings, errors).
#[test]
fn serve_answers_the_openai_client() {
    use std::io::{BufRead, BufReader};
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../server/tests/openai_client.py"
    );
    let has_openai = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|s| s.success());
    if !has_openai {
        assert!(
            std::env::var_os("LAMINA_REQUIRE_OPENAI").is_none(),
            "the openai package is required"
        );
        eprintln!("skipping: python3 cannot import openai");
        return;
    }
    let mut server = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args([
            "serve",
            "-m",
            path.to_str().unwrap(),
            "--port",
            "0",
            "-np",
            "2",
            "-c",
            "1024",
            "-t",
            "2",
        ])
        .args(["--api-key", "test-key"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines
            .next()
            .expect("server exited before listening")
            .unwrap();
        if let Some(url) = line.split("listening on ").nth(1) {
            break url.trim().to_string();
        }
    };
    let o = Command::new("python3")
        .arg(script)
        .arg(format!("{url}/v1"))
        .output()
        .unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert_eq!(stdout(&o).trim(), "ok");
}

/// `lamina logits` on a random-weight fixture with llama.cpp's placeholder vocabulary: the JSON
/// form has one row per position with `--all`, the text form the same values, the last row
/// alone without `--all`; bad token ids and missing input are clear errors.
#[test]
fn logits_prints_every_position_as_json_and_text() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/archs/qwen3-dense.gguf"
    );
    if !std::path::Path::new(fixture).exists() {
        eprintln!("skipping: ../shared/archs is absent");
        return;
    }
    let tokens = "11,99,83,56,55";
    let o = lamina(&[
        "logits", "-m", fixture, "--tokens", tokens, "--all", "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["n_vocab"], 128);
    let rows = v["logits"].as_array().unwrap();
    assert_eq!(rows.len(), 5);
    assert!(rows.iter().all(|r| r.as_array().unwrap().len() == 128));

    let o = lamina(&["logits", "-m", fixture, "--tokens", tokens, "--all"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text: Vec<Vec<f64>> = stdout(&o)
        .lines()
        .map(|l| l.split(' ').map(|x| x.parse().unwrap()).collect())
        .collect();
    let json: Vec<Vec<f64>> = rows
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect();
    assert_eq!(text, json);

    let o = lamina(&["logits", "-m", fixture, "--tokens", tokens]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 1);
    let last: Vec<f64> = stdout(&o)
        .trim()
        .split(' ')
        .map(|x| x.parse().unwrap())
        .collect();
    // One output row runs the LM head as matrix-vector products, whose sums are grouped
    // differently from the batched kernel's (as in llama.cpp): equal to rounding.
    assert_eq!(last.len(), 128);
    assert!(last.iter().zip(&json[4]).all(|(a, b)| (a - b).abs() < 1e-5));

    let o = lamina(&["logits", "-m", fixture, "--tokens", "1,128"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("outside the vocabulary of 128"),
        "{}",
        stderr(&o)
    );
    let o = lamina(&["logits", "-m", fixture]);
    assert!(!o.status.success());
    let o = lamina(&["logits", "-m", fixture, "--tokens", "1,2,3", "-c", "2"]);
    assert!(!o.status.success());
    assert!(
        stderr(&o).contains("do not fit in a context of 2"),
        "{}",
        stderr(&o)
    );
    // A placeholder vocabulary cannot tokenize text: a clear error, not a panic.
    let o = lamina(&["logits", "-m", fixture, "-p", "hello"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("vocabulary"), "{}", stderr(&o));
}

#[test]
fn flash_attention_and_cache_type_flags() {
    let fixture = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../model/tests/archs/mistral3-dense.gguf"
    );
    let run = |extra: &[&str]| {
        let mut args = vec![
            "logits",
            "-m",
            fixture,
            "--tokens",
            "11,99,83,56",
            "-t",
            "2",
        ];
        args.extend_from_slice(extra);
        lamina(&args)
    };
    let on = run(&["-fa", "on"]);
    assert!(on.status.success(), "{}", stderr(&on));
    let auto = run(&[]);
    assert_eq!(stdout(&auto), stdout(&on), "auto is on");
    let off = run(&["-fa", "off"]);
    assert!(off.status.success(), "{}", stderr(&off));
    assert_ne!(stdout(&off), stdout(&on), "the two paths round differently");
    for extra in [
        &["-ctk", "q8_0", "-ctv", "q8_0"][..],
        &["-ctk", "q4_0", "-fa", "off"],
        &["--cache-type-k", "bf16", "--cache-type-v", "iq4_nl"],
    ] {
        let o = run(extra);
        assert!(o.status.success(), "{extra:?}: {}", stderr(&o));
    }
    for (extra, message) in [
        (
            &["-ctv", "q4_0", "-fa", "off"][..],
            "requires flash attention",
        ),
        (
            &["-ctk", "q4_k"],
            "--cache-type-k \"q4_k\": use f32, f16, bf16",
        ),
        (&["-fa", "maybe"], "use on, off or auto"),
    ] {
        let o = run(extra);
        assert!(!o.status.success(), "{extra:?}");
        assert!(stderr(&o).contains(message), "{extra:?}: {}", stderr(&o));
    }
}

/// `--grammar`, `--grammar-file`, `-j` and `-jf` constrain `lamina run` to llama.cpp's
/// greedy text under the same constraint (tests/data/grammar_reference.json of the
/// model crate); bad grammars and schemas are refused before the model loads.
#[test]
fn run_follows_grammars_and_schemas() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let path = path.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let run = |extra: &[&str], prompt: &str, n: &str| {
        let mut args = vec![
            "run", "-m", path, "-p", prompt, "-n", n, "--temp", "0", "-t", "2",
        ];
        args.extend_from_slice(extra);
        lamina(&args)
    };
    let yes_no = "root ::= (\"yes\" | \"no\") \", because \" [a-z ]+ \".\"";
    let o = run(&["--grammar", yes_no], "Is the sky blue? Answer:", "32");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).trim_end(),
        "Is the sky blue? Answer:yes, because the sky appears blue to human eyes."
    );
    let file = dir.path().join("g.gbnf");
    std::fs::write(&file, yes_no).unwrap();
    let o2 = run(
        &["--grammar-file", file.to_str().unwrap()],
        "Is the sky blue? Answer:",
        "32",
    );
    assert_eq!(stdout(&o2), stdout(&o));

    let schema = r#"{"type": "string", "pattern": "^\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}$"}"#;
    let o = run(&["-j", schema], "A phone number:", "20");
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).trim_end(), "A phone number:\"(123) 456-7890\"");
    let file = dir.path().join("s.json");
    std::fs::write(&file, schema).unwrap();
    let o2 = run(&["-jf", file.to_str().unwrap()], "A phone number:", "20");
    assert_eq!(stdout(&o2), stdout(&o));

    for (extra, message) in [
        (&["--grammar", "root ::= (\"a\""][..], "line 1"),
        (&["--grammar", "root ::= x"], "undefined rule 'x'"),
        (&["-j", "{not json"], "not valid JSON"),
        (&["-j", r##"{"$ref": "#/$defs/nope"}"##], "JSON schema"),
        (
            &["--grammar", "root ::= \"a\"", "-j", "{}"],
            "cannot be used with",
        ),
    ] {
        let o = run(extra, "x", "4");
        assert!(!o.status.success(), "{extra:?}");
        assert!(stderr(&o).contains(message), "{extra:?}: {}", stderr(&o));
    }
}

/// `lamina serve` answers chat requests with `response_format` and `grammar` exactly as
/// llama-server does (crates/model/tests/data/grammar_reference.json, "chat": the JSON
/// answer grammar llama.cpp's chat parser builds, fences and spaces allowed and taken
/// off again), on both test models.
#[test]
fn serve_chat_response_format_matches_llama_server() {
    use std::io::{BufRead, BufReader};
    let reference: serde_json::Value = serde_json::from_str(include_str!(
        "../../model/tests/data/grammar_reference.json"
    ))
    .unwrap();
    for (key, known) in [
        ("smollm2-135m-instruct-q4_1", "smollm2-135m"),
        ("gemma3-270m-q4_k_m", "gemma3-270m"),
    ] {
        let Some(path) = model_for_test(known) else {
            return;
        };
        let mut server = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["serve", "-m", path.to_str().unwrap(), "--port", "0"])
            .args(["-np", "1", "-c", "2048", "-t", "2"])
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("server exited").unwrap();
            if let Some(url) = line.split("listening on ").nth(1) {
                break url.trim().to_string();
            }
        };
        let cases = reference["models"][key]["chat"].as_array().unwrap();
        let script = r#"
import json, sys, urllib.request
url, cases = sys.argv[1], json.loads(sys.argv[2])
out = []
for c in cases:
    body = {k: v for k, v in c.items() if k not in ("name", "content", "finish_reason")}
    body.update({"temperature": 0, "max_tokens": 64, "cache_prompt": False})
    req = urllib.request.Request(url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out.append(json.loads(urllib.request.urlopen(req, timeout=600).read())["choices"][0]["message"]["content"])
print(json.dumps(out))
"#;
        let o = Command::new("python3")
            .args(["-c", script, &url])
            .arg(serde_json::to_string(cases).unwrap())
            .output()
            .unwrap();
        let _ = server.kill();
        let _ = server.wait();
        assert!(o.status.success(), "{}", stderr(&o));
        let got: Vec<String> = serde_json::from_str(stdout(&o).trim()).unwrap();
        for (case, got) in cases.iter().zip(&got) {
            assert_eq!(
                got,
                case["content"].as_str().unwrap(),
                "{key} {}",
                case["name"]
            );
        }
    }
}

/// `lamina serve --context-shift`, `--cache-reuse` and `--reasoning-budget` answer as
/// llama-server does (crates/cli/tests/data/server_shift_reference.json, made by
/// scripts/ctx-shift-reference/server.py): the same tokens after the context was shifted
/// (twice, with and without `n_keep`), the same tokens and cache counts when a chunk of the
/// cached prompt is moved into place for a new prompt, and the same reasoning when its budget
/// forces the end tag (with and without a message, 0 and no limit).
#[test]
fn serve_context_shift_and_cache_reuse_match_llama_server() {
    use std::io::{BufRead, BufReader};
    let reference: serde_json::Value =
        serde_json::from_str(include_str!("data/server_shift_reference.json")).unwrap();
    for case in reference["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let Some(path) = model_for_test(case["model"].as_str().unwrap()) else {
            return;
        };
        let flags: Vec<&str> = case["flags"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let mut server = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["serve", "-m", path.to_str().unwrap(), "--port", "0"])
            .args(&flags)
            // The flags name test data relative to the workspace.
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
        let url = loop {
            let line = lines.next().expect("server exited").unwrap();
            if let Some(url) = line.split("listening on ").nth(1) {
                break url.trim().to_string();
            }
        };
        let requests: Vec<&serde_json::Value> = case["answers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| &a["request"])
            .collect();
        let script = r#"
import json, sys, urllib.request
url, requests = sys.argv[1], json.loads(sys.argv[2])
out = []
for body in requests:
    body = dict(body)
    path = body.pop("path", "/completion")
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=600).read())
    if path != "/completion":
        msg = r["choices"][0]["message"]
        out.append({"content": msg["content"], "reasoning_content": msg.get("reasoning_content"),
                    "completion_tokens": r["usage"]["completion_tokens"]})
        continue
    t = r["timings"]
    out.append({"tokens": r["tokens"], "content": r["content"], "truncated": r["truncated"],
                "prompt_n": t["prompt_n"], "cache_n": t["cache_n"], "predicted_n": t["predicted_n"]})
print(json.dumps(out))
"#;
        let o = Command::new("python3")
            .args(["-c", script, &url])
            .arg(serde_json::to_string(&requests).unwrap())
            .output()
            .unwrap();
        let _ = server.kill();
        let _ = server.wait();
        assert!(o.status.success(), "{}", stderr(&o));
        let got: Vec<serde_json::Value> = serde_json::from_str(stdout(&o).trim()).unwrap();
        for (k, (want, got)) in case["answers"]
            .as_array()
            .unwrap()
            .iter()
            .zip(&got)
            .enumerate()
        {
            for field in [
                "truncated",
                "prompt_n",
                "cache_n",
                "predicted_n",
                "tokens",
                "completion_tokens",
                "reasoning_content",
                "content",
            ] {
                assert_eq!(
                    got[field], want[field],
                    "{} {name} request {k}: {field}",
                    case["model"]
                );
            }
        }
    }
}

/// The GPU backend from the command line: `lamina devices` lists the virtual GPU devices, and
/// a layer split over two of them prints exactly what one prints (issue 17's "done when"),
/// which on lavapipe is what the CPU prints.
#[test]
fn two_virtual_gpu_devices_print_what_one_prints() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .arg("devices")
        .env("LAMINA_WGPU_DEVICES", "2")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let listed = stdout(&o);
    if !listed.contains("WGPU1:") {
        assert!(
            std::env::var_os("LAMINA_REQUIRE_WGPU").is_none(),
            "no GPU device listed, and LAMINA_REQUIRE_WGPU is set:\n{listed}"
        );
        eprintln!("skipping: no wgpu adapter");
        return;
    }
    let run = |devices: &str| {
        let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["run", "-m", path.to_str().unwrap(), "--device", devices])
            .args([
                "-ngl",
                "all",
                "--split-mode",
                "layer",
                "--temp",
                "0",
                "-n",
                "12",
            ])
            .args(["-p", "The capital of France is"])
            .env("LAMINA_WGPU_DEVICES", "2")
            .output()
            .unwrap();
        assert!(o.status.success(), "{devices}: {}", stderr(&o));
        stdout(&o)
    };
    let one = run("WGPU0");
    assert!(one.starts_with("The capital of France is"), "{one}");
    assert_eq!(run("WGPU0,WGPU1"), one);
    // On lavapipe the GPU repeats the CPU's arithmetic bit for bit: the same text.
    if listed.contains("llvmpipe") {
        assert_eq!(run("CPU"), one);
    }
}
