//! Tokenizer throughput on 1 MB of mixed text (English prose, code, CJK, Cyrillic, Khmer,
//! emoji, whitespace runs: the llama.cpp test strings plus Milton's Areopagitica).
//!
//! cargo run --release -p lamina-tokenizer --example tokenize_bench -- MODEL.gguf [MODEL.gguf ...]
//!
//! Prints tokens/s and MB/s for each model (best of 5 runs, or of `TOKENIZE_BENCH_RUNS`). With `TOKENIZE_BENCH_DUMP=DIR`,
//! also writes the text (`DIR/text.txt`) and each model's ids (`DIR/<file>.lamina.ids`, one
//! per line) for comparison with llama.cpp.

use std::time::Instant;

use lamina_tokenizer::Tokenizer;

fn mixed_text(target: usize) -> String {
    let shared = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared");
    let mut parts = Vec::new();
    if let Ok(s) = std::fs::read_to_string(format!("{shared}/reference/areopagitica.txt")) {
        parts.push(s);
    }
    for name in ["llama-bpe", "qwen2", "gemma-4"] {
        if let Ok(s) = std::fs::read_to_string(format!("{shared}/vocab/ggml-vocab-{name}.gguf.inp"))
        {
            parts.push(s.replace("\n__ggml_vocab_test__\n", "\n"));
        }
    }
    parts.push(include_str!("tokenize_bench.rs").to_string());
    let mut text = String::with_capacity(target + 64 * 1024);
    while text.len() < target {
        for p in &parts {
            text.push_str(p);
            text.push('\n');
        }
    }
    // Cut at a char boundary at or after `target`.
    let mut end = target;
    while !text.is_char_boundary(end) {
        end += 1;
    }
    text.truncate(end);
    text
}

fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    if paths.is_empty() {
        eprintln!("usage: tokenize_bench MODEL.gguf [MODEL.gguf ...]");
        std::process::exit(2);
    }
    let text = mixed_text(1 << 20);
    let runs: usize = std::env::var("TOKENIZE_BENCH_RUNS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    println!("text: {} bytes", text.len());
    let dump = std::env::var_os("TOKENIZE_BENCH_DUMP").map(std::path::PathBuf::from);
    if let Some(dir) = &dump {
        std::fs::write(dir.join("text.txt"), &text).expect("write text");
    }
    for path in paths {
        let t0 = Instant::now();
        let tok = match Tokenizer::from_file(&path) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{path}: {e}");
                continue;
            }
        };
        let load = t0.elapsed();
        let mut best = f64::MAX;
        let mut ids = Vec::new();
        for _ in 0..runs.max(1) {
            let t = Instant::now();
            ids = tok.tokenize(&text, false, false);
            best = best.min(t.elapsed().as_secs_f64());
        }
        let n = ids.len();
        if let Some(dir) = &dump {
            let name = std::path::Path::new(&path)
                .file_name()
                .unwrap()
                .to_string_lossy()
                .to_string();
            let lines: String = ids.iter().map(|id| format!("{id}\n")).collect();
            std::fs::write(dir.join(format!("{name}.lamina.ids")), lines).expect("write ids");
        }
        println!(
            "{path}: load {:.0} ms, {n} tokens in {:.1} ms: {:.2} M tokens/s, {:.1} MB/s",
            load.as_secs_f64() * 1e3,
            best * 1e3,
            n as f64 / best / 1e6,
            text.len() as f64 / best / 1e6
        );
    }
}
