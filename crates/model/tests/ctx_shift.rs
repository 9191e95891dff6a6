//! Shifted KV caches against llama.cpp, bit for bit. llama-server's context shift (drop half of
//! what follows the kept tokens, move the rest down) and its `--cache-reuse` (move chunks of a
//! cached prompt to where a new prompt has them) are `seq_rm` and `seq_add` on the cache, after
//! which every cached key is rotated by RoPE to its new position (llama.cpp's K-shift). Each case
//! of `tests/data/ctx_shift_reference.json` (made by `scripts/ctx-shift-reference/make.sh` with
//! llama.cpp's AVX2 CPU build) replays the same operations and tokens; the logits after each step
//! must have the same bits: f16 and q8_0 caches (the latter rotated through the Walsh-Hadamard
//! basis), flash attention on and off, gemma3's two RoPE bases.

use std::sync::Arc;

use lamina_backend::Device;
use lamina_core::DType;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_gguf::pull::model_for_test;
use lamina_model::{Batch, Context, ContextParams, FlashAttn, Model, Placement, SplitMode};
use serde_json::Value;

fn reference() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/ctx_shift_reference.json"
    );
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

/// Lowest id among the highest logits (the reference's greedy choice).
fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Runs the cases of model `name` (those named `only`, if given) on `model`; returns the
/// mismatching rows and the number of cases run.
fn run_cases(model: &Arc<Model>, name: &str, only: Option<&str>) -> (Vec<String>, usize) {
    let reference = reference();
    let mut bad = Vec::new();
    let mut n_cases = 0;
    for case in reference["cases"].as_array().unwrap() {
        if case["model"] != name || only.is_some_and(|o| case["name"] != o) {
            continue;
        }
        n_cases += 1;
        let cname = case["name"].as_str().unwrap();
        let dtype = |k: &str| DType::from_name(case[k].as_str().unwrap()).unwrap();
        let params = ContextParams {
            n_ctx: case["n_ctx"].as_u64().unwrap() as usize,
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
        let mut n_ops = 0;
        let mut batch = Batch::default();
        for (k, step) in case["steps"].as_array().unwrap().iter().enumerate() {
            for op in step["ops"].as_array().unwrap() {
                let p = |i: usize| {
                    let v = op[i].as_i64().unwrap() as i32;
                    (v >= 0).then_some(v)
                };
                match op[0].as_str().unwrap() {
                    "rm" => ctx.seq_rm(Some(0), p(1), p(2)),
                    "add" => ctx
                        .seq_add(0, p(1), p(2), op[3].as_i64().unwrap() as i32)
                        .unwrap(),
                    other => panic!("unknown op {other}"),
                }
                n_ops += 1;
            }
            let feed = if k == 0 {
                prompt.clone()
            } else {
                ids(&step["feed"])
            };
            let pos0 = step["pos0"].as_i64().unwrap() as i32;
            batch.clear();
            for (i, &t) in feed.iter().enumerate() {
                batch.push(t, pos0 + i as i32, 0, i + 1 == feed.len());
            }
            ctx.decode(&batch).unwrap();
            let row = ctx.last_logits().unwrap();
            if fnv1a(row) != step["hash"].as_str().unwrap() {
                let top = &step["top"][0];
                let id = top[0].as_u64().unwrap() as usize;
                bad.push(format!(
                    "{cname} step {k} (pos {pos0}): hash differs; logit of {id}: {} vs {}",
                    row[id], top[1]
                ));
            }
            // The next generation step feeds the reference's greedy choice; so would Lamina.
            // (A reused cache's next step feeds the rest of the new prompt instead.)
            if let Some(next) = case["steps"].get(k + 1)
                && (case["mode"] == "shift" || next["ops"].as_array().unwrap().is_empty())
            {
                let fed = ids(&next["feed"]);
                if fed.len() == 1 && fed[0] != argmax(row) {
                    bad.push(format!("{cname} step {k}: greedy token differs"));
                }
            }
        }
        assert!(n_ops > 0, "{cname}: no cache operations");
    }
    (bad, n_cases)
}

fn assert_model(name: &str) {
    let Some(path) = model_for_test(name) else {
        return;
    };
    let model = Arc::new(Model::load(path, cpu()).unwrap());
    let (bad, n_cases) = run_cases(&model, name, None);
    assert!(n_cases >= 3, "{name}: {n_cases} cases");
    assert!(
        bad.is_empty(),
        "{} rows differ:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn smollm2_shifted_cache_matches_llama_cpp_bit_for_bit() {
    assert_model("smollm2-135m");
}

#[test]
fn gemma3_shifted_cache_matches_llama_cpp_bit_for_bit() {
    assert_model("gemma3-270m");
}

/// Layers on three virtual devices: each layer's keys are rotated on its own device, with the
/// same bits.
#[test]
fn shift_on_three_devices_matches_llama_cpp() {
    let name = "smollm2-135m";
    let Some(path) = model_for_test(name) else {
        return;
    };
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(3).with_threads(2)).unwrap();
    let devices: Vec<Arc<dyn Device>> = reg
        .cpu_devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn Device>)
        .collect();
    let placement = Placement {
        host: devices[0].clone(),
        devices,
        split_mode: SplitMode::Layer,
        tensor_split: Vec::new(),
        n_gpu_layers: None,
        main_gpu: 0,
    };
    let model = Arc::new(Model::load_placed(path, &placement).unwrap());
    let (bad, n_cases) = run_cases(&model, name, Some("shift-nofa-f16-keep20"));
    assert_eq!(n_cases, 1);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// `seq_add` as `llama_memory_seq_add`: the range moves, what lands below 0 is dropped, other
/// sequences and positions stay, and a bad sequence id is an error.
#[test]
fn seq_add_moves_positions_and_drops_what_falls_below_zero() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/archs/mistral3-dense.gguf"
    );
    let model = Arc::new(Model::load(path, cpu()).unwrap());
    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 64,
            n_seq_max: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mut batch = Batch::default();
    for i in 0..10 {
        batch.push(1 + i as u32, i, 0, i == 9);
        batch.push(1 + i as u32, i, 1, i == 9);
    }
    ctx.decode(&batch).unwrap();
    let positions = |ctx: &Context, seq: usize| {
        let mut p: Vec<i32> = ctx
            .kv_cache()
            .cells()
            .iter()
            .filter(|c| c.seqs & (1 << seq) != 0)
            .map(|c| c.pos)
            .collect();
        p.sort();
        p
    };
    ctx.seq_rm(Some(0), Some(2), Some(5));
    ctx.seq_add(0, Some(5), None, -3).unwrap();
    assert_eq!(positions(&ctx, 0), vec![0, 1, 2, 3, 4, 5, 6]);
    assert_eq!(positions(&ctx, 1), (0..10).collect::<Vec<_>>());
    // Moved below 0: dropped.
    ctx.seq_add(0, None, Some(2), -2).unwrap();
    assert_eq!(positions(&ctx, 0), vec![2, 3, 4, 5, 6]);
    assert!(ctx.seq_add(7, None, None, 1).is_err());
    // The next decode rotates the moved keys and goes on.
    batch.clear();
    batch.push(3, 7, 0, true);
    ctx.decode(&batch).unwrap();
    assert!(!ctx.kv_cache().has_shift());
    assert!(ctx.last_logits().unwrap().iter().all(|v| v.is_finite()));
}

/// For every architecture (llama.cpp's random-weight fixtures): tokens computed at positions
/// `0..n`, moved by +7, then one more token, give the logits of the same tokens computed at
/// `7..n+7` in the first place, to rounding (RoPE of a RoPE is the RoPE of the sum). This is
/// what checks the rotated dims of each layout: DeepSeek's trailing rotary part (MLA and
/// legacy), phi2's partial rotation, gemma's per-layer bases, YaRN (gpt-oss). f32 caches keep
/// the rounding small. (These random-weight models attend weakly, so keys left unrotated are
/// off by only some 1e-4 of the logits; olmo2's YaRN scaling, whose magnitude factor llama.cpp's
/// K-shift applies once more, is off by 4e-5.)
#[test]
fn every_architecture_shifts_its_keys_like_recomputing_them() {
    const FILES: &[(&str, &str)] = &[
        ("../../../shared/archs", "llama-dense.gguf"),
        ("../../../shared/archs", "qwen2-dense.gguf"),
        ("../../../shared/archs", "qwen3-dense.gguf"),
        ("../../../shared/archs", "phi2-dense.gguf"),
        ("../../../shared/archs", "phi3-dense.gguf"),
        ("../../../shared/archs", "gemma3-dense.gguf"),
        ("../../../shared/archs", "qwen2moe-moe.gguf"),
        ("../../../shared/archs", "gpt-oss-moe.gguf"),
        ("../../../shared/archs", "deepseek2-moe.gguf"),
        ("tests/archs", "qwen3moe-moe.gguf"),
        ("tests/archs", "llama-moe.gguf"),
        ("tests/archs", "mistral3-dense.gguf"),
        ("tests/archs", "gemma2-dense.gguf"),
        ("tests/archs", "olmo2-dense.gguf"),
        ("tests/archs", "starcoder2-dense.gguf"),
        ("tests/archs", "deepseek2-legacy.gguf"),
    ];
    const SHIFT: i32 = 7;
    let tokens: Vec<u32> = (0..12).map(|i| 1 + (i * 37) % 50).collect();
    let mut worst = Vec::new();
    for (dir, file) in FILES {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(dir)
            .join(file);
        if !path.exists() {
            eprintln!("skipping: {} is absent", path.display());
            continue;
        }
        let model = Arc::new(Model::load(&path, cpu()).unwrap());
        let params = ContextParams {
            n_ctx: 64,
            type_k: DType::F32,
            type_v: DType::F32,
            ..Default::default()
        };
        let run = |pos0: i32, shift: bool| {
            let mut ctx = Context::new(model.clone(), params).unwrap();
            let mut batch = Batch::default();
            let n = tokens.len() - 1;
            for (i, &t) in tokens[..n].iter().enumerate() {
                batch.push(t, pos0 + i as i32, 0, false);
            }
            ctx.decode(&batch).unwrap();
            let mut last = pos0 + n as i32;
            if shift {
                ctx.seq_add(0, None, None, SHIFT).unwrap();
                last += SHIFT;
            }
            batch.clear();
            batch.push(tokens[n], last, 0, true);
            ctx.decode(&batch).unwrap();
            ctx.last_logits().unwrap().to_vec()
        };
        let shifted = run(0, true);
        let direct = run(SHIFT, false);
        let scale = direct.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = shifted
            .iter()
            .zip(&direct)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        // Without the re-rotation the keys would be 7 positions off: far more than rounding.
        let unrotated = {
            let mut ctx = Context::new(model.clone(), params).unwrap();
            let mut batch = Batch::default();
            let n = tokens.len() - 1;
            for (i, &t) in tokens[..n].iter().enumerate() {
                batch.push(t, i as i32, 0, false);
            }
            ctx.decode(&batch).unwrap();
            batch.clear();
            batch.push(tokens[n], n as i32 + SHIFT, 0, true);
            ctx.decode(&batch).unwrap();
            ctx.last_logits()
                .unwrap()
                .iter()
                .zip(&direct)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
        };
        eprintln!("{file}: max |Δ| {diff:e} of {scale:e} (unrotated: {unrotated:e})");
        worst.push((file, diff / scale, unrotated / scale));
    }
    for (file, rel, unrotated) in worst {
        assert!(
            rel < 1e-4,
            "{file}: shifted keys differ by {rel:e} of the logits' scale"
        );
        assert!(
            unrotated > 10.0 * rel.max(1e-7),
            "{file}: the shift was not needed?"
        );
    }
}
