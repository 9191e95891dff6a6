//! Fidelity against llama.cpp (../shared/reference/outputs.json, see its README): at every prompt
//! position the top-1 token matches (except near-ties), each reference top-10 logit is within
//! 0.05, logsumexp within 0.05; greedy continuations match up to the first near-tie.

use std::sync::Arc;

use lamina_backend::Device;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_gguf::pull::model_for_test;
use lamina_model::{Batch, Context, ContextParams, FlashAttn, Model};
use serde_json::Value;

const TOLERANCE: f32 = 0.05;

fn reference() -> Option<Value> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../../shared/reference/outputs.json"
    );
    match std::fs::read_to_string(path) {
        Ok(text) => Some(serde_json::from_str(&text).unwrap()),
        Err(_) => {
            eprintln!("skipping: ../shared/reference is absent");
            None
        }
    }
}

fn cpu() -> Arc<dyn Device> {
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(1)).unwrap();
    reg.cpu_devices()[0].clone()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn logsumexp(logits: &[f32]) -> f64 {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
    max + logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

fn check_model(name: &str) {
    let Some(reference) = reference() else { return };
    let Some(path) = model_for_test(name) else {
        return;
    };
    let model = Arc::new(Model::load(path, cpu()).unwrap());
    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 512,
            // The reference is llama.cpp's standard attention path.
            flash_attn: FlashAttn::Off,
            ..Default::default()
        },
    )
    .unwrap();
    let prompts = reference["models"][name]["prompts"].as_array().unwrap();
    for p in prompts {
        let tokens = ids(&p["tokens"]);
        ctx.clear();
        let mut batch = Batch::default();
        for (i, &t) in tokens.iter().enumerate() {
            batch.push(t, i as i32, 0, true);
        }
        ctx.decode(&batch).unwrap();
        let mut worst = 0f32;
        for (i, pos) in p["positions"].as_array().unwrap().iter().enumerate() {
            let logits = ctx.logits(i).unwrap();
            let top = pos["top"].as_array().unwrap();
            for entry in top {
                let id = entry[0].as_u64().unwrap() as usize;
                let want = entry[1].as_f64().unwrap() as f32;
                let diff = (logits[id] - want).abs();
                worst = worst.max(diff);
                assert!(
                    diff <= TOLERANCE,
                    "{name} {:?} position {i}: logit of {id} is {} (llama.cpp {want})",
                    p["prompt"],
                    logits[id]
                );
            }
            let margin = top[0][1].as_f64().unwrap() - top[1][1].as_f64().unwrap();
            if margin >= TOLERANCE as f64 {
                assert_eq!(
                    argmax(logits) as u64,
                    top[0][0].as_u64().unwrap(),
                    "{name} position {i}: top-1"
                );
            }
            let lse = pos["logsumexp"].as_f64().unwrap();
            assert!(
                (logsumexp(logits) - lse).abs() <= TOLERANCE as f64,
                "{name} position {i}: logsumexp"
            );
        }
        eprintln!(
            "{name} {:?}: {} positions, worst top-10 logit difference {worst:.4}",
            p["prompt"],
            tokens.len()
        );

        // Greedy continuation up to the first near-tie (at least the reference's safe prefix).
        let greedy = ids(&p["greedy"]);
        let margins: Vec<f64> = p["greedy_margins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_f64().unwrap())
            .collect();
        let safe = margins
            .iter()
            .position(|&m| m < TOLERANCE as f64)
            .unwrap_or(greedy.len())
            .min(32);
        let mut next = argmax(ctx.last_logits().unwrap());
        let builds = ctx.graph_builds();
        for (step, (&want, pos)) in greedy.iter().zip(tokens.len() as i32..).enumerate() {
            // The README's rule is the tokens before the first near-tie (`safe`); Lamina's
            // arithmetic is llama.cpp's, so the whole continuation must match.
            let rule = if step < safe {
                "before any near-tie"
            } else {
                "past a near-tie"
            };
            assert_eq!(
                next, want,
                "{name} {:?}: greedy token {step} ({rule})",
                p["prompt"]
            );
            if step + 1 == greedy.len() {
                break;
            }
            ctx.decode(&Batch::sequence(&[next], pos, 0)).unwrap();
            next = argmax(ctx.last_logits().unwrap());
        }
        // One-token steps over fewer than 256 cells all have one shape: after at most one
        // build per copy slot, every step reuses its graph (and still matches llama.cpp).
        let built = ctx.graph_builds() - builds;
        assert!(
            built <= ctx.scheduler().n_slots() && built < greedy.len() - 1,
            "{name}: {built} graphs built for {} generation steps",
            greedy.len() - 1
        );
    }
}

#[test]
fn smollm2_matches_llama_cpp() {
    check_model("smollm2-135m");
}

#[test]
fn gemma3_matches_llama_cpp() {
    check_model("gemma3-270m");
}
