//! Per-token cost of constrained decoding on a real vocabulary.
//!
//! `cargo run --release -p lamina-grammar --example mask_bench -- MODEL.gguf REFERENCE.json MODEL_KEY`
//!
//! Replays llama.cpp's greedy generations of crates/model/tests/data/grammar_reference.json
//! (each case's grammar or schema, and the tokens llama.cpp chose) and times, per
//! generated token:
//! - `step`: what the sampler does (check the sampled token; a full mask only when the
//!   check fails; here the reference token is the sampled one, so this is the check);
//! - `mask`: a full mask every step of one request, with the matcher's caches;
//! - `cold`: a full mask every step from a fresh matcher state (no cached masks or
//!   transitions, none shared): the worst case;
//! - `rerun`: a full mask every step of a second request with the same grammar, which
//!   finds the masks the first one shared through the vocabulary.
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
    let (mut all_step, mut all_mask, mut all_cold, mut all_rerun) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    println!(
        "{:<16} {:>5}  {:>20}  {:>20}  {:>20}  {:>20}",
        "case",
        "steps",
        "step p50/p99/max",
        "mask p50/p99/max",
        "cold p50/p99/max",
        "rerun p50/p99/max"
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
        let (mut step, mut masked, mut cold, mut rerun) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        // Cold: a matcher brought to each state, every cache cleared, then one mask.
        for i in 0..tokens.len() {
            let mut fresh = Matcher::new(&g, Arc::clone(&vocab));
            for &p in &tokens[..i] {
                fresh.accept(p).unwrap();
            }
            fresh.clear_caches();
            vocab.clear_shared_masks();
            let t1 = Instant::now();
            fresh.fill_mask(&mut mask).unwrap();
            cold.push(t1.elapsed().as_secs_f64() * 1e6);
        }
        vocab.clear_shared_masks();
        // The sampler's step, and a full mask every step (one request).
        let mut m = Matcher::new(&g, Arc::clone(&vocab));
        let mut warm = Matcher::new(&g, Arc::clone(&vocab));
        for (i, &t) in tokens.iter().enumerate() {
            let t1 = Instant::now();
            if !m.is_allowed(t) {
                m.fill_mask(&mut mask).unwrap();
            }
            step.push(t1.elapsed().as_secs_f64() * 1e6);
            let t1 = Instant::now();
            warm.fill_mask(&mut mask).unwrap();
            masked.push(t1.elapsed().as_secs_f64() * 1e6);
            assert!(mask[t as usize / 64] >> (t % 64) & 1 == 1, "step {i}");
            m.accept(t).unwrap();
            warm.accept(t).unwrap();
        }
        // A second request with the same grammar: the masks the first left behind.
        let mut again = Matcher::new(&g, Arc::clone(&vocab));
        for &t in &tokens {
            let t1 = Instant::now();
            again.fill_mask(&mut mask).unwrap();
            rerun.push(t1.elapsed().as_secs_f64() * 1e6);
            again.accept(t).unwrap();
        }
        all_step.extend_from_slice(&step);
        all_mask.extend_from_slice(&masked);
        all_cold.extend_from_slice(&cold);
        all_rerun.extend_from_slice(&rerun);
        let f = |v: &mut Vec<f64>| {
            let max = v.iter().copied().fold(0.0, f64::max);
            format!("{:.1}/{:.1}/{:.0}", pct(v, 0.5), pct(v, 0.99), max)
        };
        println!(
            "{:<16} {:>5}  {:>20}  {:>20}  {:>20}  {:>20}",
            case["name"].as_str().unwrap(),
            tokens.len(),
            f(&mut step),
            f(&mut masked),
            f(&mut cold),
            f(&mut rerun)
        );
    }
    for (name, p) in [("all p50", 0.5), ("all p99", 0.99)] {
        println!(
            "{:<16} {:>5}  {:>20.1}  {:>20.1}  {:>20.1}  {:>20.1}",
            name,
            all_step.len(),
            pct(&mut all_step, p),
            pct(&mut all_mask, p),
            pct(&mut all_cold, p),
            pct(&mut all_rerun, p)
        );
    }
}
