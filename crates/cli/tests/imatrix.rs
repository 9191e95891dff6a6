//! `lamina imatrix` against llama.cpp's llama-imatrix: SmolLM2 and Gemma 3 on the first 2,600
//! bytes of Areopagitica, 2 chunks of -c 128, flash attention off (the reference files
//! crates/tools/tests/data/{smollm2,gemma3}-imatrix-c128.gguf, made by
//! scripts/imatrix-reference/make.sh with the same arguments from the workspace root). Every sum and count must be llama.cpp's,
//! bit for bit, and so the whole file byte for byte.

use std::path::Path;
use std::process::Command;

use lamina_gguf::pull::model_for_test;
use lamina_tools::imatrix::Imatrix;

const TEXT: &str = "../shared/reference/areopagitica-short.txt";

#[test]
fn imatrix_of_smollm2_is_llama_imatrix_s() {
    check_imatrix("smollm2-135m", "smollm2-imatrix-c128.gguf");
}

#[test]
fn imatrix_of_gemma3_is_llama_imatrix_s() {
    check_imatrix("gemma3-270m", "gemma3-imatrix-c128.gguf");
}

fn check_imatrix(model_name: &str, reference: &str) {
    let Some(model) = model_for_test(model_name) else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if !root.join(TEXT).is_file() {
        eprintln!("skipping: ../shared/reference is absent");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("imatrix.gguf");
    let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .current_dir(&root)
        .args(["imatrix", "-m"])
        .arg(&model)
        .args(["-f", TEXT, "-c", "128", "--chunks", "2", "-t", "2"])
        .args(["--flash-attn", "off", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "lamina imatrix failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(stdout.contains("[1]"), "no perplexity progress: {stdout}");

    let reference = root.join("crates/tools/tests/data").join(reference);
    let ours = Imatrix::load(&out).unwrap();
    let theirs = Imatrix::load(&reference).unwrap();
    assert_eq!(ours.chunk_count, theirs.chunk_count);
    assert_eq!(ours.chunk_size, theirs.chunk_size);
    assert_eq!(ours.datasets, theirs.datasets);
    assert_eq!(
        ours.entries.keys().collect::<Vec<_>>(),
        theirs.entries.keys().collect::<Vec<_>>()
    );
    let mut max_rel = 0f64;
    let mut n_diff = 0usize;
    let mut n_all = 0usize;
    for (name, t) in &theirs.entries {
        let e = &ours.entries[name];
        assert_eq!(e.counts, t.counts, "{name}");
        assert_eq!(e.sums.len(), t.sums.len(), "{name}");
        for (&a, &b) in e.sums.iter().zip(&t.sums) {
            n_all += 1;
            if a.to_bits() != b.to_bits() {
                n_diff += 1;
                let rel = ((a - b).abs() / b.abs().max(f32::MIN_POSITIVE)) as f64;
                max_rel = max_rel.max(rel);
            }
        }
    }
    eprintln!(
        "{n_diff} of {n_all} sums differ from llama-imatrix's; max relative difference {max_rel:e}"
    );
    assert_eq!(n_diff, 0, "max relative difference {max_rel:e}");
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(&reference).unwrap(),
        "same entries but not the same bytes"
    );
}

#[test]
fn legacy_dat_output_is_llama_imatrix_s() {
    let Some(model) = model_for_test("smollm2-135m") else {
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    if !root.join(TEXT).is_file() {
        eprintln!("skipping: ../shared/reference is absent");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("imatrix.dat");
    let o = Command::new(env!("CARGO_BIN_EXE_lamina"))
        .current_dir(&root)
        .args(["imatrix", "-m"])
        .arg(&model)
        .args([
            "-f", TEXT, "-c", "128", "--chunks", "2", "-t", "2", "--no-ppl",
        ])
        .args(["--flash-attn", "off", "--output-format", "dat", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "lamina imatrix failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let reference = root.join("crates/tools/tests/data/smollm2-imatrix-c128.dat");
    assert!(
        std::fs::read(&out).unwrap() == std::fs::read(&reference).unwrap(),
        "the .dat differs from llama-imatrix's"
    );
}
