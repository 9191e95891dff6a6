//! Times a grammar's parse, matcher start, and each `fill_mask`/`accept` of a short
//! generation over the fuzz target's byte vocabulary: where the time of a slow grammar goes.
//!
//! `cargo run --release -p lamina-grammar --example slow_grammar -- GRAMMAR.gbnf...`
//!
//! The tokens are the fuzz target's choice (the first allowed `t` with `t % 7 == step % 7`),
//! or with `PREFER=abc` the bytes of `PREFER` in turn when allowed; `STEPS` (default 16).

use lamina_grammar::{Grammar, Matcher, TokenIndex};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let mut pieces: Vec<Vec<u8>> = (0u8..=255).map(|b| vec![b]).collect();
    for s in ["ab", "{\"", "\":", "12", "true", "é", "</s>"] {
        pieces.push(s.as_bytes().to_vec());
    }
    let eos = pieces.len() as u32 - 1;
    let vocab = Arc::new(TokenIndex::new(pieces, move |t| t == eos));
    for path in std::env::args().skip(1) {
        let src = std::fs::read_to_string(&path).unwrap();
        let t = Instant::now();
        let g = Grammar::parse(&src, "root", None);
        let tp = t.elapsed();
        let Ok(g) = g else {
            println!("{path}: parse err {tp:?}");
            continue;
        };
        println!(
            "{path}: parsed {tp:?}, {} rules, {} elems",
            g.rules.len(),
            g.rules.iter().map(|r| r.len()).sum::<usize>()
        );
        let t = Instant::now();
        let mut m = Matcher::new(&g, vocab.clone());
        println!("  new {:?}", t.elapsed());
        let mut mask = vec![0u64; 5];
        let prefer: Vec<u32> = std::env::var("PREFER")
            .unwrap_or_default()
            .bytes()
            .map(u32::from)
            .collect();
        let steps: u32 = std::env::var("STEPS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(16);
        for step in 0..steps {
            let t = Instant::now();
            let fr = m.fill_mask(&mut mask);
            let tf = t.elapsed();
            let allowed = |t: u32| mask[t as usize / 64] >> (t % 64) & 1 == 1;
            let tok = if prefer.is_empty() {
                (0..263u32).find(|&t| allowed(t) && t % 7 == step % 7)
            } else {
                let p = prefer[step as usize % prefer.len()];
                if allowed(p) {
                    Some(p)
                } else {
                    (0..263u32).find(|&t| allowed(t))
                }
            };
            let t = Instant::now();
            let r = tok.map(|t| m.accept(t));
            println!(
                "  step {step}: fill {tf:?} {fr:?} tok {tok:?} accept {:?} {:?}",
                t.elapsed(),
                r
            );
            match r {
                Some(Ok(())) => {}
                _ => break,
            }
        }
    }
}
