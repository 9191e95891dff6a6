//! `lamina quantize` writes exactly what llama-quantize writes: for every case of
//! `data/quantize_reference.json` (made by scripts/quantize-reference/make.py with llama.cpp
//! 0c1e570), the same sha256, or the same refusal. A refused or failed quantization leaves no
//! file behind.

use std::path::Path;
use std::process::Command;

use lamina_gguf::pull::model_for_test;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn cases(model: &str) -> Vec<Value> {
    let text = include_str!("data/quantize_reference.json");
    let v: Value = serde_json::from_str(text).unwrap();
    v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["model"] == model)
        .cloned()
        .collect()
}

fn check_model(model: &str) {
    let Some(path) = model_for_test(model) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    let mut failures = Vec::new();
    let cases = cases(model);
    assert!(cases.len() > 20);
    for case in &cases {
        let args: Vec<&str> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let (flags, qtype) = args.split_at(args.len() - 1);
        // From the repository root: imatrix paths are relative to it, and llama-quantize
        // records them as given.
        let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .arg("quantize")
            .args(flags)
            .arg(&path)
            .arg(&out)
            .arg(qtype[0])
            .arg("2")
            .output()
            .unwrap();
        let what = format!("{model} {}", args.join(" "));
        let expected_ok = case["status"] == 0;
        if o.status.success() != expected_ok {
            failures.push(format!(
                "{what}: exit {:?}, llama-quantize's {}: {}",
                o.status.code(),
                case["status"],
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            ));
            continue;
        }
        if !expected_ok {
            assert!(
                !out.exists(),
                "{what}: a refused run left {}",
                out.display()
            );
            continue;
        }
        let hash = format!("{:x}", Sha256::digest(std::fs::read(&out).unwrap()));
        if hash != case["sha256"].as_str().unwrap() {
            failures.push(format!("{what}: sha256 {hash}, llama's {}", case["sha256"]));
        }
        std::fs::remove_file(&out).unwrap();
    }
    let leftovers: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn smollm2_quantizes_like_llama_quantize() {
    check_model("smollm2-135m");
}

#[test]
fn gemma3_quantizes_like_llama_quantize() {
    check_model("gemma3-270m");
}

fn lamina(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn bad_arguments_are_refused_with_a_clear_error() {
    let o = lamina(&["quantize", "--help"]);
    let help = String::from_utf8_lossy(&o.stdout);
    for name in ["Q4_K_M", "IQ4_XS", "IQ2_XXS", "TQ2_0", "MXFP4_MOE", "COPY"] {
        assert!(help.contains(name), "--help lists {name}");
    }
    let Some(path) = model_for_test("smollm2-135m") else {
        return;
    };
    let path = path.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    let out = out.to_str().unwrap();
    let err = |args: &[&str]| {
        let o = lamina(args);
        assert!(!o.status.success(), "{args:?} succeeded");
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    assert!(err(&["quantize", path, out, "Q4_7"]).contains("invalid quantization type 'Q4_7'"));
    assert!(
        err(&["quantize", "--output-tensor-type", "q9", path, out, "Q4_0"])
            .contains("invalid ggml type 'q9'")
    );
    assert!(err(&["quantize", path, path, "Q4_0"]).contains("same file"));
    assert!(
        err(&[
            "quantize",
            "--allow-requantize",
            path,
            "/nonexistent/dir/o.gguf",
            "Q4_0"
        ])
        .contains("cannot write /nonexistent/dir/o.gguf")
    );
    assert!(err(&["quantize", "/nonexistent.gguf", out, "Q4_0"]).contains("/nonexistent.gguf"));
    let e = err(&["quantize", "--allow-requantize", path, out, "IQ2_XXS"]);
    assert!(e.contains("requires an importance matrix"), "{e}");
    assert!(!Path::new(out).exists());
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none());
}

/// The perplexity of each quantized model on ../shared/reference/areopagitica-short.txt equals
/// llama-perplexity's (its AVX2 build, `-kvu`: see scripts/quantize-reference/perplexity.py) on
/// llama-quantize's file, to the digits it prints; the file is first checked to be that file's
/// bytes (for the whole-model i-quants this is their only hash check, so each is made once).
fn check_perplexity(model: &str) {
    let text = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/reference/areopagitica-short.txt"
    );
    if !Path::new(text).exists() {
        eprintln!("skipping: ../shared/reference is absent");
        return;
    }
    let Some(path) = model_for_test(model) else {
        return;
    };
    let reference: Value =
        serde_json::from_str(include_str!("data/quantize_reference.json")).unwrap();
    let results: Vec<&Value> = reference["perplexity"]["results"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["model"] == model)
        .collect();
    assert!(results.len() >= 8);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.gguf");
    let out_s = out.to_str().unwrap();
    let mut failures = Vec::new();
    for r in results {
        let qtype = r["type"].as_str().unwrap();
        // An importance matrix (IQ2_XXS) is named by its path from the repository root, and
        // run from there: the path as given is written into `quantize.imatrix.file`.
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
        let mut args = vec!["quantize", "--allow-requantize"];
        if let Some(p) = r["imatrix"].as_str() {
            args.extend(["--imatrix", p]);
        }
        args.extend([path.to_str().unwrap(), out_s, qtype, "2"]);
        let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .current_dir(root)
            .args(&args)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "{model} {qtype}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let hash = format!("{:x}", Sha256::digest(std::fs::read(&out).unwrap()));
        if hash != r["sha256"].as_str().unwrap() {
            failures.push(format!(
                "{model} {qtype}: sha256 {hash}, llama's {}",
                r["sha256"]
            ));
            continue;
        }
        let o = lamina(&[
            "perplexity",
            "-m",
            out_s,
            "-f",
            text,
            "-c",
            "128",
            "-t",
            "2",
            "-fa",
            "off",
        ]);
        let all =
            String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        // The printed digits agree; relative 1e-9 leaves room only for the last digits of
        // TQ2_0's astronomic perplexities (~3e11), where double sums in another order show.
        let want: Vec<f64> = ["ppl", "err"]
            .iter()
            .map(|k| r[*k].as_str().unwrap().parse().unwrap())
            .collect();
        let line = all
            .lines()
            .find(|l| l.contains("Final estimate"))
            .unwrap_or("(no final estimate)")
            .trim()
            .to_string();
        let got: Vec<f64> = line
            .split("PPL = ")
            .nth(1)
            .unwrap_or("")
            .split(" +/- ")
            .filter_map(|v| v.trim().parse().ok())
            .collect();
        eprintln!("{model} {qtype}: {line}");
        let same = got.len() == 2 && (got[0] / want[0] - 1.0).abs() < 1e-9;
        if !same {
            failures.push(format!(
                "{model} {qtype}: {line}; llama-perplexity: {want:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn smollm2_quantized_perplexity_matches_llama() {
    check_perplexity("smollm2-135m");
}

#[test]
fn gemma3_quantized_perplexity_matches_llama() {
    check_perplexity("gemma3-270m");
}

/// Writes `model` as llama-gguf-split `--split --split-max-tensors N` writes it: tensors in
/// table order, N per file, the first file with all metadata, every file with the split keys
/// (checked against llama-gguf-split's hashes before use).
fn write_splits(model: &Path, dir: &Path, max_tensors: usize) -> Vec<std::path::PathBuf> {
    use lamina_gguf::{GgufFile, GgufStreamWriter, Metadata, TensorHeader, Value};
    let file = GgufFile::open(model).unwrap();
    let gguf = file.gguf();
    let chunks: Vec<_> = gguf.tensors.chunks(max_tensors).collect();
    let mut paths = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let mut meta = if i == 0 {
            gguf.metadata.clone()
        } else {
            Metadata::default()
        };
        // gguf-split sets split.count last (its placeholder is set again, which gguf.cpp does
        // by removing and appending).
        meta.set_last("split.no", Value::U16(i as u16));
        meta.set_last("split.tensors.count", Value::I32(gguf.tensors.len() as i32));
        meta.set_last("split.count", Value::U16(chunks.len() as u16));
        let table: Vec<TensorHeader> = chunk
            .iter()
            .map(|t| TensorHeader {
                name: t.name.clone(),
                dtype: t.dtype,
                dims: t.shape[..t.n_dims].to_vec(),
            })
            .collect();
        let path = dir.join(format!("split-{:05}-of-{:05}.gguf", i + 1, chunks.len()));
        let out = std::fs::File::create(&path).unwrap();
        let mut w = GgufStreamWriter::new(&out, &meta, &table).unwrap();
        for t in chunk.iter() {
            w.write_tensor(file.tensor_data(t)).unwrap();
        }
        w.finish().unwrap();
        paths.push(path);
    }
    paths
}

/// Each file's name and sha256.
fn names_and_hashes(paths: &[std::path::PathBuf]) -> Vec<(String, String)> {
    paths
        .iter()
        .map(|p| {
            let name = p.file_name().unwrap().to_str().unwrap().to_string();
            (name, sha256_of(p))
        })
        .collect()
}

fn sha256_of(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

/// Split models: read from their first file; with `--keep-split`, one output per split (and
/// `PREFIX-00001-of-00001.gguf` for a one-file model); every file llama-quantize's bytes.
#[test]
fn split_models_quantize_like_llama_quantize() {
    let Some(model) = model_for_test("smollm2-135m") else {
        return;
    };
    let reference: Value =
        serde_json::from_str(include_str!("data/quantize_reference.json")).unwrap();
    let split = &reference["split"];
    let dir = tempfile::tempdir().unwrap();
    let max = split["split_max_tensors"].as_u64().unwrap() as usize;
    let inputs = write_splits(&model, dir.path(), max);
    let want: Vec<(&str, &str)> = split["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["name"].as_str().unwrap(), i["sha256"].as_str().unwrap()))
        .collect();
    let got = names_and_hashes(&inputs);
    let got: Vec<(&str, &str)> = got.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(got, want, "the split input is not llama-gguf-split's");

    let mut failures = Vec::new();
    for case in split["cases"].as_array().unwrap() {
        let args: Vec<&str> = case["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        let (flags, qtype) = args.split_at(args.len() - 1);
        let out_dir = dir.path().join("out");
        std::fs::create_dir(&out_dir).unwrap();
        let input = if case["input"] == "split" {
            inputs[0].clone()
        } else {
            model.clone()
        };
        let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
            .arg("quantize")
            .args(flags)
            .arg(&input)
            .arg(out_dir.join("q.gguf"))
            .arg(qtype[0])
            .arg("2")
            .output()
            .unwrap();
        let what = format!("{} {}", case["input"], args.join(" "));
        assert_eq!(
            o.status.success(),
            case["status"] == 0,
            "{what}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let mut outs: Vec<_> = std::fs::read_dir(&out_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        outs.sort();
        let got = names_and_hashes(&outs);
        let want: Vec<(String, String)> = case["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["name"].as_str().unwrap().to_string(),
                    o["sha256"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        if got != want {
            failures.push(format!("{what}: {got:?}, llama-quantize's {want:?}"));
        }
        std::fs::remove_dir_all(&out_dir).unwrap();
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Refused: a later split as the input, a missing split, a bad name; nothing written.
    let out = dir.path().join("never.gguf");
    let run = |input: &Path| {
        Command::new(env!("CARGO_BIN_EXE_lamina"))
            .args(["quantize", "--allow-requantize"])
            .arg(input)
            .arg(&out)
            .args(["Q4_0", "2"])
            .output()
            .unwrap()
    };
    let o = run(&inputs[1]);
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("expected 0"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let renamed = dir.path().join("other.gguf");
    std::fs::copy(&inputs[0], &renamed).unwrap();
    let o = run(&renamed);
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("invalid split file name"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Running a split model is refused with the way out (COPY, tested above).
    let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .args(["run", "-n", "1", "-p", "hi", "-m"])
        .arg(&inputs[0])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("split 1 of a model in 3 files") && err.contains("COPY"),
        "{err}"
    );
    std::fs::remove_file(&inputs[2]).unwrap();
    let o = run(&inputs[0]);
    assert!(!o.status.success());
    assert!(!out.exists());
}
