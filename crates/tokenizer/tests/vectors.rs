//! llama.cpp's tokenizer test vectors (`../shared/vocab/*.gguf.{inp,out}`): every string must
//! tokenize to the expected ids (add_special = false, parse_special = false), and detokenizing
//! must give the input back (after the model's own space clean-up, for vocabularies that
//! have one; WordPiece normalizes text, so it is checked for ids only).

use std::path::PathBuf;

use lamina_tokenizer::{Tokenizer, VocabKind};

fn vocab_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/vocab"
    ));
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: {} is absent", dir.display());
        None
    }
}

fn check(name: &str) {
    let Some(dir) = vocab_dir() else { return };
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    let tok = Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let inp = std::fs::read_to_string(path.with_extension("gguf.inp")).unwrap();
    let out = std::fs::read_to_string(path.with_extension("gguf.out")).unwrap();
    let inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let expected: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    // A trailing separator leaves one empty piece after the last test.
    let inputs = &inputs[..expected.len()];
    let mut failures = Vec::new();
    for (text, want) in inputs.iter().zip(&expected) {
        let got = tok.tokenize(text, false, false);
        if &got != want {
            failures.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
            continue;
        }
        if tok.kind() != VocabKind::Wpm {
            let back = tok.detokenize(&got, false, false);
            let mut norm = text.as_bytes().to_vec();
            if tok.cleans_spaces() {
                lamina_tokenizer::clean_spaces(&mut norm);
            }
            let norm = String::from_utf8(norm).unwrap();
            if back != norm {
                failures.push(format!("{text:?}: detokenized to {back:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {} failed:\n{}",
        failures.len(),
        expected.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_spm() {
    check("llama-spm");
}
#[test]
fn llama_bpe() {
    check("llama-bpe");
}
#[test]
fn gpt_2() {
    check("gpt-2");
}
#[test]
fn qwen2() {
    check("qwen2");
}
#[test]
fn phi_3() {
    check("phi-3");
}
#[test]
fn deepseek_llm() {
    check("deepseek-llm");
}
#[test]
fn falcon() {
    check("falcon");
}
#[test]
fn starcoder() {
    check("starcoder");
}
#[test]
fn bert_bge() {
    check("bert-bge");
}
#[test]
fn gemma_4() {
    check("gemma-4");
}
