//! Perplexity and KL divergence against llama.cpp (../shared/reference, see its README): the
//! SmolLM2 logits file llama.cpp wrote with `--kl-divergence-base` on areopagitica-short.txt at
//! -c 128 (FA off). Lamina must score mean KLD ≤ 0.0005, ≥ 99% same top token, and perplexity
//! within 1% of llama.cpp's.

use std::sync::Arc;

use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_gguf::pull::model_for_test;
use lamina_model::perplexity::{
    KldAccumulator, LogitsFileReader, PerplexityPlan, eval_chunk_group,
};
use lamina_model::{Context, ContextParams, FlashAttn, Model, perplexity::PerplexityError};

const SHARED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/reference");

#[test]
fn smollm2_kl_divergence_against_llama_cpp() {
    let base_path = format!("{SHARED}/smollm2-135m-areopagitica-short-c128.kld");
    if !std::path::Path::new(&base_path).exists() {
        eprintln!("skipping: ../shared/reference is absent");
        return;
    }
    let Some(model_path) = model_for_test("smollm2-135m") else {
        return;
    };
    let reg = CpuBackendReg::new(CpuConfig::default()).unwrap();
    let model = Arc::new(Model::load(model_path, reg.cpu_devices()[0].clone()).unwrap());
    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 128,
            // The reference is llama.cpp's standard attention path.
            flash_attn: FlashAttn::Off,
            n_ubatch: 128,
            ..Default::default()
        },
    )
    .unwrap();

    let mut reader = LogitsFileReader::open(&base_path).unwrap();
    assert_eq!(reader.header().n_ctx, 128);
    // SmolLM2 does not add BOS (tokenizer.ggml.add_bos_token = false).
    let plan = PerplexityPlan::for_kl_divergence(reader.tokens(), 128, 128, None).unwrap();
    let mut kld = KldAccumulator::new();
    for i in 0..plan.n_chunk() {
        let base = reader.next_chunk().unwrap().unwrap();
        let chunk = plan.chunk(i).unwrap();
        eval_chunk_group(
            &mut ctx,
            &plan,
            i..i + 1,
            |_, pos, logits| -> Result<(), PerplexityError> {
                let k = pos - chunk.first;
                kld.add_token(&base.row(k).unwrap(), logits, chunk.targets[k])?;
                Ok(())
            },
        )
        .unwrap();
    }
    let s = kld.summary();
    eprintln!("{}", kld.report().unwrap_or_default());
    assert!(s.kld.0 <= 0.0005, "mean KLD {} > 0.0005", s.kld.0);
    assert!(
        s.same_top.0 >= 0.99,
        "same top token {} < 99%",
        s.same_top.0
    );
    let ratio = s.ppl.0 / s.ppl_base.0;
    assert!(
        (ratio - 1.0).abs() <= 0.01,
        "PPL {} vs llama.cpp {}",
        s.ppl.0,
        s.ppl_base.0
    );
}

/// llama-perplexity's final PPL on areopagitica.txt at -c 128 (perplexity.json), reproduced
/// within 1% (the same batching: -b 2048, so 16 chunks evaluated together as sequences).
fn check_perplexity(name: &str) {
    let text_path = format!("{SHARED}/areopagitica.txt");
    let Ok(json) = std::fs::read_to_string(format!("{SHARED}/perplexity.json")) else {
        eprintln!("skipping: ../shared/reference is absent");
        return;
    };
    let reference: serde_json::Value = serde_json::from_str(&json).unwrap();
    let want = reference["results"][name]["128"]["ppl"].as_f64().unwrap();
    let Some(model_path) = model_for_test(name) else {
        return;
    };
    let text = std::fs::read_to_string(text_path).unwrap();

    let reg = CpuBackendReg::new(CpuConfig::default()).unwrap();
    let model = Model::load(model_path, reg.cpu_devices()[0].clone()).unwrap();
    let tok = lamina_tokenizer::Tokenizer::from_gguf(&model.file).unwrap();
    let tokens = tok.tokenize(&text, true, false);
    let bos = tok.add_bos().then(|| tok.bos()).flatten();
    let plan = PerplexityPlan::new(&tokens, 128, 2048, bos).unwrap();
    let params = ContextParams {
        n_ctx: 128 * plan.n_seq(),
        // The reference is llama.cpp's standard attention path.
        flash_attn: FlashAttn::Off,
        n_ubatch: 512,
        n_seq_max: plan.n_seq(),
        ..Default::default()
    };
    let mut ctx = Context::new(Arc::new(model), params).unwrap();
    let mut stats = lamina_model::perplexity::PerplexityStats::new();
    let groups: Vec<_> = plan.chunk_groups().collect();
    for group in groups {
        let start = group.start;
        let mut scored: Vec<(usize, usize, f64)> = Vec::new();
        eval_chunk_group(
            &mut ctx,
            &plan,
            group,
            |seq, pos, logits| -> Result<(), PerplexityError> {
                let chunk = plan.chunk(start + seq).unwrap();
                let nll =
                    lamina_model::perplexity::token_nll(logits, chunk.targets[pos - chunk.first])?;
                scored.push((seq, pos, nll));
                Ok(())
            },
        )
        .unwrap();
        for (_, _, nll) in scored {
            stats.add_nll(nll);
        }
    }
    let got = stats.estimate().unwrap().ppl;
    eprintln!("{name}: {} (llama.cpp: PPL = {want})", stats.final_line());
    assert!(
        (got / want - 1.0).abs() <= 0.01,
        "{name}: PPL {got} vs llama.cpp {want}"
    );
}

#[test]
fn smollm2_perplexity_matches_llama_cpp() {
    check_perplexity("smollm2-135m");
}

#[test]
fn gemma3_perplexity_matches_llama_cpp() {
    check_perplexity("gemma3-270m");
}
