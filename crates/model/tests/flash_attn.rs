//! Flash attention and quantized KV caches against llama.cpp, bit for bit: the logits of every
//! prompt position and of every following one-token step equal those of llama.cpp's AVX2 CPU
//! build with the same `-fa`, `-ctk`, `-ctv` and `-t` (`tests/data/fa_reference.json`, made by
//! `scripts/fa-reference/make.sh`; rows compared by FNV-1a hash of their f32 bytes). The cases
//! cover ggml's three flash-attention paths (per row, tiled for 64+ query rows, and the
//! thread-dependent split of a one-token step over 512+ cells), every cache type llama.cpp
//! offers, a quantized K without flash attention, and the standard path as a control.

use std::sync::Arc;

use lamina_backend::Device;
use lamina_core::DType;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_gguf::pull::model_for_test;
use lamina_model::{Batch, Context, ContextParams, FlashAttn, Model};
use serde_json::Value;

fn reference() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/fa_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn cpu() -> Arc<dyn Device> {
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(1)).unwrap();
    reg.cpu_devices()[0].clone()
}

fn fnv1a(row: &[f32]) -> String {
    let mut h: u64 = 0xcbf29ce484222325;
    for v in row {
        for b in v.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x100000001b3);
        }
    }
    format!("{h:016x}")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Compares one row; on a mismatch, describes it against the reference's top 5.
fn check_row(what: &str, got: &[f32], want: &Value, bad: &mut Vec<String>) {
    if fnv1a(got) == want["hash"].as_str().unwrap() {
        return;
    }
    let diff = want["top"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let id = p[0].as_u64().unwrap() as usize;
            (got[id] - p[1].as_f64().unwrap() as f32).abs()
        })
        .fold(0f32, f32::max);
    bad.push(format!("{what}: hash differs (top-5 max |Δ| {diff:e})"));
}

/// Runs every case of `model` and returns the mismatching rows.
fn run_model(name: &str) -> Vec<String> {
    let reference = reference();
    let Some(path) = model_for_test(name) else {
        return Vec::new();
    };
    let model = Arc::new(Model::load(path, cpu()).unwrap());
    let mut bad = Vec::new();
    let mut n_cases = 0;
    for case in reference["cases"].as_array().unwrap() {
        if case["model"] != name {
            continue;
        }
        n_cases += 1;
        let cname = case["name"].as_str().unwrap();
        let dtype = |k: &str| DType::from_name(case[k].as_str().unwrap()).unwrap();
        let params = ContextParams {
            n_ctx: case["n_ctx"].as_u64().unwrap() as usize,
            n_ubatch: case["n_ubatch"].as_u64().unwrap() as usize,
            type_k: dtype("type_k"),
            type_v: dtype("type_v"),
            flash_attn: if case["flash_attn"].as_bool().unwrap() {
                FlashAttn::On
            } else {
                FlashAttn::Off
            },
            n_threads: case["n_threads"].as_u64().unwrap() as usize,
            ..Default::default()
        };
        let mut ctx = Context::new(model.clone(), params).unwrap();
        let prompt = ids(&case["prompt"]);
        let mut batch = Batch::default();
        for (i, &t) in prompt.iter().enumerate() {
            batch.push(t, i as i32, 0, true);
        }
        ctx.decode(&batch).unwrap();
        let want = case["prompt_logits"].as_array().unwrap();
        for (i, w) in want.iter().enumerate() {
            check_row(
                &format!("{cname} prompt {i}"),
                ctx.logits(i).unwrap(),
                w,
                &mut bad,
            );
        }
        let want = case["decode_logits"].as_array().unwrap();
        for (k, (&t, w)) in ids(&case["decode"]).iter().zip(want).enumerate() {
            batch.clear();
            batch.push(t, (prompt.len() + k) as i32, 0, true);
            ctx.decode(&batch).unwrap();
            check_row(
                &format!("{cname} step {k}"),
                ctx.logits(0).unwrap(),
                w,
                &mut bad,
            );
        }
    }
    assert!(n_cases >= 15, "{name}: {n_cases} cases");
    bad
}

fn assert_model(name: &str) {
    let bad = run_model(name);
    assert!(
        bad.is_empty(),
        "{} rows differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn smollm2_matches_llama_cpp_bit_for_bit() {
    assert_model("smollm2-135m");
}

#[test]
fn gemma3_matches_llama_cpp_bit_for_bit() {
    assert_model("gemma3-270m");
}

/// Settings llama.cpp refuses (or Lamina cannot run) are typed errors, not panics.
#[test]
fn cache_settings_that_cannot_work_are_refused() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/archs/mistral3-dense.gguf"
    );
    let model = Arc::new(Model::load(path, cpu()).unwrap());
    let try_params = |type_k, type_v, flash_attn| {
        Context::new(
            model.clone(),
            ContextParams {
                n_ctx: 64,
                type_k,
                type_v,
                flash_attn,
                ..Default::default()
            },
        )
        .err()
        .map(|e| e.to_string())
    };
    let err = try_params(DType::F16, DType::Q8_0, FlashAttn::Off).unwrap();
    assert!(err.contains("requires flash attention"), "{err}");
    assert!(try_params(DType::BF16, DType::BF16, FlashAttn::Off).is_none());
    let err = try_params(DType::Q4_K, DType::F16, FlashAttn::On).unwrap();
    assert!(err.contains("not supported"), "{err}");
    // Auto turns flash attention on, also for a quantized V.
    assert!(try_params(DType::Q4_0, DType::Q4_0, FlashAttn::Auto).is_none());
    assert!(try_params(DType::Q8_0, DType::F16, FlashAttn::Off).is_none());
    assert_eq!("auto".parse::<FlashAttn>().unwrap(), FlashAttn::Auto);
    assert_eq!("1".parse::<FlashAttn>().unwrap(), FlashAttn::On);
    assert_eq!("off".parse::<FlashAttn>().unwrap(), FlashAttn::Off);
    assert!("maybe".parse::<FlashAttn>().is_err());
}

/// A quantized cache takes the bytes of its type: for each layer K and V rows of whole blocks
/// (llama.cpp's sizes: q8_0 is 34/64 of f16, q4_0 18/64).
#[test]
fn quantized_caches_take_their_types_bytes() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/archs/mistral3-dense.gguf"
    );
    let model = Arc::new(Model::load(path, cpu()).unwrap());
    let hp = model.hparams.clone();
    let n_ctx = 256;
    let bytes = |t: DType| {
        let ctx = Context::new(
            model.clone(),
            ContextParams {
                n_ctx,
                type_k: t,
                type_v: t,
                ..Default::default()
            },
        )
        .unwrap();
        ctx.kv_cache().buffer(0).unwrap().size()
    };
    let expected = |t: DType| -> usize {
        (0..hp.n_layer as usize)
            .map(|il| {
                let row = |n: u32| t.row_size(u64::from(n)).unwrap() as usize * n_ctx;
                row(hp.n_embd_k_gqa(il)).next_multiple_of(64)
                    + row(hp.n_embd_v_gqa(il)).next_multiple_of(64)
            })
            .sum()
    };
    for t in [
        DType::F16,
        DType::Q8_0,
        DType::Q4_0,
        DType::IQ4_NL,
        DType::BF16,
    ] {
        assert_eq!(bytes(t), expected(t), "{t}");
    }
    assert_eq!(bytes(DType::Q8_0) * 64, bytes(DType::F16) * 34);
}
