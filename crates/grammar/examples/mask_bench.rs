//! Per-token cost of constrained decoding on a real vocabulary.
//!
//! `cargo run --release -p lamina-grammar --example mask_bench -- MODEL.gguf REFERENCE.json MODEL_KEY`
//!
//! Replays llama.cpp's greedy generations of crates/model/tests/data/grammar_reference.json
//! (each case's grammar or schema, and the tokens llama.cpp chose) and times, per
//! generated token:
//! - `step`: what the sampler does (check the sampled token; a full mask only when the
//!   check fails; here the reference token is the sampled one, so this is the check);
//! - `mask`: a full mask every step, with the matcher's caches;
//! - `cold`: a full mask every step from a fresh matcher state (no cached masks or
//!   transitions): the worst case.
//!
//! Prints p50/p99/max per case in microseconds.

use std::sync::Arc;
use std::time::Instant;

use lamina_grammar::json_schema::{SchemaOptions, json_schema_to_grammar};
use lamina_grammar::{Grammar, Matcher, TokenIndex};

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: mask_bench MODEL.gguf REFERENCE.json MODEL_KEY");
        std::process::exit(2);
    }
    let file = lamina_gguf::GgufFile::open(&args[1]).expect("model");
    let tok = lamina_tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let t0 = Instant::now();
    let vocab = Arc::new(TokenIndex::new(
        (0..tok.n_vocab() as u32)
            .map(|t| tok.token_to_piece(t, true))
            .collect(),
        |t| tok.is_eog(t),
    ));
    println!(
        "vocab {} tokens, trie {} nodes, built in {:.1} ms",
        vocab.n_vocab(),
        vocab.n_nodes(),
        t0.elapsed().as_secs_f64() * 1e3
    );
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&args[2]).expect("reference")).unwrap();
    let mut mask = vec![0u64; vocab.n_vocab().div_ceil(64)];
    let (mut all_step, mut all_mask, mut all_cold) = (Vec::new(), Vec::new(), Vec::new());
    println!(
        "{:<16} {:>5}  {:>22}  {:>22}  {:>22}",
        "case", "steps", "step p50/p99/max us", "mask p50/p99/max us", "cold p50/p99/max us"
    );
    for case in reference["models"][&args[3]]["completions"]
        .as_array()
        .unwrap()
    {
        let src = match case.get("grammar") {
            Some(g) => g.as_str().unwrap().to_string(),
            None => {
                let mut s = case["json_schema"].clone();
                if s.as_object().is_some_and(|o| o.is_empty()) {
                    s = serde_json::json!({"type": "object"});
                }
                json_schema_to_grammar(&s, &SchemaOptions::default()).unwrap()
            }
        };
        let g = Grammar::parse(&src, "root", None).unwrap();
        let tokens: Vec<u32> = case["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let (mut step, mut masked, mut cold) = (Vec::new(), Vec::new(), Vec::new());
        let mut m = Matcher::new(&g, Arc::clone(&vocab));
        let mut warm = Matcher::new(&g, Arc::clone(&vocab));
        for (i, &t) in tokens.iter().enumerate() {
            let t1 = Instant::now();
            let ok = m.is_allowed(t);
            if !ok {
                m.fill_mask(&mut mask);
            }
            step.push(t1.elapsed().as_secs_f64() * 1e6);
            let t1 = Instant::now();
            warm.fill_mask(&mut mask);
            masked.push(t1.elapsed().as_secs_f64() * 1e6);
            assert!(mask[t as usize / 64] >> (t % 64) & 1 == 1, "step {i}");
            // Cold: a new matcher brought to the same state, then one mask.
            let mut fresh = Matcher::new(&g, Arc::clone(&vocab));
            for &p in &tokens[..i] {
                fresh.accept(p).unwrap();
            }
            fresh.clear_caches();
            let t1 = Instant::now();
            fresh.fill_mask(&mut mask);
            cold.push(t1.elapsed().as_secs_f64() * 1e6);
            m.accept(t).unwrap();
            warm.accept(t).unwrap();
        }
        all_step.extend_from_slice(&step);
        all_mask.extend_from_slice(&masked);
        all_cold.extend_from_slice(&cold);
        let f = |v: &mut Vec<f64>| {
            let max = v.iter().copied().fold(0.0, f64::max);
            format!("{:.1}/{:.1}/{:.0}", pct(v, 0.5), pct(v, 0.99), max)
        };
        println!(
            "{:<16} {:>5}  {:>22}  {:>22}  {:>22}",
            case["name"].as_str().unwrap(),
            tokens.len(),
            f(&mut step),
            f(&mut masked),
            f(&mut cold)
        );
    }
    println!(
        "{:<16} {:>5}  {:>22.1}  {:>22.1}  {:>22.1}",
        "all p50",
        all_step.len(),
        pct(&mut all_step, 0.5),
        pct(&mut all_mask, 0.5),
        pct(&mut all_cold, 0.5)
    );
    println!(
        "{:<16} {:>5}  {:>22.1}  {:>22.1}  {:>22.1}",
        "all p99",
        "",
        pct(&mut all_step, 0.99),
        pct(&mut all_mask, 0.99),
        pct(&mut all_cold, 0.99)
    );
}
