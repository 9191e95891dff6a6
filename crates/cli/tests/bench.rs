//! `lamina bench` as a user runs it: a real model, llama-bench's JSON, clear errors on bad input.

use std::process::{Command, Output};

use lamina_gguf::pull::model_for_test;

fn lamina(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(args)
        .output()
        .expect("run lamina")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bench_json_reports_llama_bench_fields() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let path = path.to_str().unwrap();
    let o = lamina(&[
        "bench", "-m", path, "-p", "16", "-n", "4", "-r", "1", "-t", "2", "-o", "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("JSON on stdout");
    let tests = v.as_array().expect("an array");
    assert_eq!(tests.len(), 2);
    for (t, (n_prompt, n_gen)) in tests.iter().zip([(16, 0), (0, 4)]) {
        for field in [
            "model_filename",
            "model_type",
            "model_size",
            "model_n_params",
            "n_batch",
            "n_ubatch",
            "n_threads",
            "n_gpu_layers",
            "split_mode",
            "main_gpu",
            "devices",
            "tensor_split",
            "n_prompt",
            "n_gen",
            "test_time",
            "avg_ns",
            "stddev_ns",
            "avg_ts",
            "stddev_ts",
            "samples_ns",
            "samples_ts",
            "backends",
            "cpu_info",
            "build_commit",
        ] {
            assert!(t.get(field).is_some(), "missing {field} in {t}");
        }
        assert_eq!(t["n_prompt"], n_prompt);
        assert_eq!(t["n_gen"], n_gen);
        assert_eq!(t["n_threads"], 2);
        assert_eq!(t["backends"], "CPU");
        assert_eq!(t["model_filename"], path);
        assert!(
            t["model_type"].as_str().unwrap().starts_with("llama "),
            "{t}"
        );
        assert!(t["model_n_params"].as_u64().unwrap() > 100_000_000, "{t}");
        assert!(t["avg_ts"].as_f64().unwrap() > 0.0, "{t}");
        assert_eq!(t["samples_ns"].as_array().unwrap().len(), 1);
    }
}

#[test]
fn bench_markdown_table() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let path = path.to_str().unwrap();
    let o = lamina(&[
        "bench",
        "-m",
        path,
        "-p",
        "8",
        "-n",
        "0",
        "--n-gen-prompt",
        "4,2",
        "-r",
        "1",
        "-t",
        "1",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("| model") && lines[0].ends_with("t/s |"),
        "{out}"
    );
    let cells =
        |line: &str| -> Vec<String> { line.split('|').map(|c| c.trim().to_string()).collect() };
    let (pp, pg) = (cells(lines[2]), cells(lines[3]));
    assert_eq!((pp[4].as_str(), pp[6].as_str()), ("CPU", "pp8"), "{out}");
    assert_eq!((pg[5].as_str(), pg[6].as_str()), ("1", "pp4+tg2"), "{out}");
    assert!(pp[7].contains(" ± ") && pp[2].ends_with(" MiB"), "{out}");
}

#[test]
fn bench_rejects_bad_input_clearly() {
    for (args, expected) in [
        (&["bench", "-r", "0"][..], "at least 1"),
        (&["bench", "-p", "abc"][..], "abc"),
        (
            &["bench", "-m", "no-such-model", "-r", "1"][..],
            "no-such-model",
        ),
        (&["bench", "-p", "0", "-n", "0"][..], "nothing to measure"),
    ] {
        let o = lamina(args);
        let err = stderr(&o);
        assert!(!o.status.success(), "{args:?} succeeded");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// `--device`/`-sm`/`-ts` reach the run and llama-bench's fields report them; the table gets
/// its `sm`, `ts` and `dev` columns.
#[test]
fn bench_reports_the_device_split() {
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let path = path.to_str().unwrap();
    let run = |format: &str| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_lamina"))
            .env("LAMINA_CPU_DEVICES", "2")
            .args([
                "bench", "-m", path, "-p", "8", "-n", "0", "-r", "1", "-t", "2", "-sm", "layer",
                "-ts", "1,3", "-o", format,
            ])
            .output()
            .expect("run lamina");
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8(o.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&run("json")).unwrap();
    let t = &v[0];
    assert_eq!(t["devices"], "CPU0/CPU1", "{t}");
    assert_eq!(t["split_mode"], "layer");
    assert_eq!(t["tensor_split"], "1.00/3.00");
    assert_eq!(t["n_gpu_layers"], 99);
    let md = run("md");
    let header = md.lines().next().unwrap();
    assert!(
        header.contains("| sm ") && header.contains("| ts ") && header.contains("| dev "),
        "{md}"
    );
    assert!(md.contains("CPU0/CPU1"), "{md}");
}
