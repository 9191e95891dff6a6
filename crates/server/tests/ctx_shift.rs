//! Context shift (`--context-shift`) and cache reuse (`--cache-reuse`) on the fake model, whose
//! cache moves exactly (a moved token hashes as if evaluated at its new position): what the
//! server generates after a shift equals what a fresh context holding the kept tokens
//! generates, and a prompt rebuilt from moved chunks answers as if evaluated from scratch.

mod common;

use common::{post, start};
use lamina_sample::{SamplerChain, SamplingParams};
use lamina_server::fake::FakeEngine;
use lamina_server::{Batch, Engine, ServerConfig};
use serde_json::json;

/// Greedy tokens of llama-server's context shift, computed the slow way: before each token
/// that would fill the context, drop `n_discard` tokens after the first `n_keep`, then
/// evaluate everything kept from scratch.
fn shifted_reference(prompt: &[u32], n_ctx: usize, n_keep: usize, n_predict: usize) -> Vec<u32> {
    let mut tokens = prompt.to_vec();
    let mut chain =
        SamplerChain::new(&SamplingParams::greedy(), lamina_server::fake::N_VOCAB).unwrap();
    let mut out = Vec::new();
    let mut next = None;
    loop {
        if let Some(t) = next {
            if tokens.len() + 1 >= n_ctx {
                let n_left = tokens.len() - n_keep;
                let n_discard = (n_left / 2).min(n_left.saturating_sub(1));
                tokens.drain(n_keep..n_keep + n_discard);
            }
            tokens.push(t);
        }
        let mut engine = FakeEngine::new(n_ctx as u32, 1);
        let mut batch = Batch::default();
        for (i, &t) in tokens.iter().enumerate() {
            batch.push(t, i as u32, 0, i + 1 == tokens.len());
        }
        engine.decode(&batch).unwrap();
        // ignore_eos: end-of-generation tokens are banned.
        let mut logits = engine.logits(0).to_vec();
        for t in [lamina_server::fake::EOS, lamina_server::fake::IM_END] {
            logits[t as usize] = f32::NEG_INFINITY;
        }
        let t = chain.sample(&logits).unwrap();
        out.push(t);
        if out.len() == n_predict {
            return out;
        }
        next = Some(t);
    }
}

#[tokio::test]
async fn generation_goes_on_past_the_context_after_shifting_it() {
    let config = ServerConfig {
        ctx_shift: true,
        ..ServerConfig::default()
    };
    let addr = start(64, 1, config).await;
    let prompt = common::text_prompt("shift me");
    for n_keep in [0usize, 5] {
        let r = post(
            addr,
            "/completion",
            json!({"prompt": "shift me", "n_predict": 150, "temperature": 0, "ignore_eos": true,
                   "n_keep": n_keep, "return_tokens": true, "cache_prompt": false}),
        )
        .await;
        let v = r.json();
        assert_eq!(v["timings"]["predicted_n"], 150, "{v}");
        assert_eq!(v["truncated"], true);
        assert_eq!(v["stop_type"], "limit");
        assert_eq!(v["generation_settings"]["n_keep"], n_keep);
        let got: Vec<u32> = v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(
            got,
            shifted_reference(&prompt, 64, n_keep, 150),
            "n_keep {n_keep}"
        );
    }
    // Bad values are the client's mistake.
    let r = post(addr, "/completion", json!({"prompt": "x", "n_keep": -2})).await;
    assert_eq!(r.status, 400, "{}", r.text());
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "x", "n_discard": "many"}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.text());
}

#[tokio::test]
async fn without_context_shift_the_full_context_ends_the_generation() {
    let addr = start(64, 1, ServerConfig::default()).await;
    let r = post(
        addr,
        "/completion",
        json!({"prompt": "shift me", "n_predict": 150, "temperature": 0, "ignore_eos": true}),
    )
    .await;
    let v = r.json();
    let n_prompt = common::text_prompt("shift me").len() as u64;
    assert_eq!(v["timings"]["predicted_n"].as_u64().unwrap() + n_prompt, 64);
    assert_eq!(v["truncated"], true);
}

#[tokio::test]
async fn cache_reuse_moves_chunks_of_the_cached_prompt_into_place() {
    const A: &str = "The first part of a long prompt, which stays in place. ";
    const B: &str = "A middle part that the second prompt leaves out entirely. ";
    const C: &str = "The last part, which the second prompt has right after the first.";
    let addr = start(4096, 1, ServerConfig::default()).await;
    let ask = |prompt: String, n_cache_reuse: u32| {
        json!({"prompt": prompt, "n_predict": 12, "temperature": 0,
               "n_cache_reuse": n_cache_reuse})
    };
    let first = post(addr, "/completion", ask(format!("{A}{B}{C}"), 0))
        .await
        .json();
    assert_eq!(first["timings"]["cache_n"], 0);
    let ac = format!("{A}{C}");
    let n_ac = common::text_prompt(&ac).len() as u64;
    let n_a = common::text_prompt(A).len() as u64;
    let (want, _, _) = common::reference(
        &common::text_prompt(&ac),
        &SamplingParams::greedy(),
        Some(12),
        4096,
        None,
    );
    // C is found further on in the cache and moved next to A: only the last token (for its
    // logits) is evaluated again.
    let reused = post(addr, "/completion", ask(ac.clone(), 8)).await.json();
    assert_eq!(reused["timings"]["cache_n"], n_ac - 1, "{reused}");
    assert_eq!(reused["timings"]["prompt_n"], 1);
    assert_eq!(reused["content"], want.as_str());
    // Without reuse only the common prefix is kept.
    post(addr, "/completion", ask(format!("{A}{B}{C}"), 0)).await;
    let prefix = post(addr, "/completion", ask(ac, 0)).await.json();
    assert_eq!(prefix["timings"]["cache_n"], n_a, "{prefix}");
    assert_eq!(prefix["content"], want.as_str());
}
