//! Every architecture against llama.cpp: the random-weight models that llama.cpp's
//! `tests/test-llama-archs.cpp` builds (`../shared/archs/`, and the ones this repository adds in
//! `tests/archs/`), with llama.cpp's logits for a fixed 24-token batch (CPU, f16 KV, no flash
//! attention, one batch). Per model: NMSE of all logits at most 1e-4 (as llama.cpp compares
//! backends) and the same argmax at every position; where the kernels allow it, the same bits
//! (the shared file holds logits rounded to 6 decimals, so there "the same bits" means the
//! same after that rounding); and the same logits, bit for bit, on three virtual devices with a
//! layer split as on one device.

use std::path::{Path, PathBuf};
use std::sync::Arc;

mod common;

use common::load;
use lamina_model::{Batch, Context, ContextParams, FlashAttn, Model};
use serde_json::Value;

/// The fixtures each architecture is checked on: `(folder, file)`; every one must give
/// llama.cpp's bits.
const FIXTURES: &[(&str, &str)] = &[
    ("shared", "llama-dense.gguf"),
    ("shared", "qwen2-dense.gguf"),
    ("shared", "qwen3-dense.gguf"),
    ("shared", "phi2-dense.gguf"),
    ("shared", "phi3-dense.gguf"),
    ("shared", "gemma3-dense.gguf"),
    ("shared", "qwen2moe-moe.gguf"),
    ("shared", "gpt-oss-moe.gguf"),
    ("shared", "deepseek2-moe.gguf"),
    ("local", "qwen3moe-moe.gguf"),
    ("local", "llama-moe.gguf"),
    ("local", "mistral3-dense.gguf"),
    ("local", "gemma2-dense.gguf"),
    ("local", "olmo2-dense.gguf"),
    ("local", "starcoder2-dense.gguf"),
    ("local", "deepseek2-legacy.gguf"),
];

const NMSE_MAX: f64 = 1e-4;

fn folder(which: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    match which {
        "shared" => root.join("../../../shared/archs"),
        _ => root.join("tests/archs"),
    }
}

/// The folder's reference logits, or `None` (with a note) when the folder is absent.
fn reference(which: &str) -> Option<Value> {
    let path = folder(which).join("reference-logits.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(serde_json::from_str(&text).unwrap()),
        Err(_) => {
            eprintln!("skipping: {} is absent", path.display());
            None
        }
    }
}

/// Logits of every position when `tokens` are evaluated in one batch (n_ctx 256, f16 KV,
/// flash attention `fa`, llama.cpp's two threads).
fn logits(model: Arc<Model>, tokens: &[u32], fa: FlashAttn) -> Vec<Vec<f32>> {
    let params = ContextParams {
        n_ctx: 256,
        n_ubatch: tokens.len(),
        flash_attn: fa,
        n_threads: 2,
        ..Default::default()
    };
    let mut ctx = Context::new(model, params).unwrap();
    let mut batch = Batch::default();
    for (i, &t) in tokens.iter().enumerate() {
        batch.push(t, i as i32, 0, true);
    }
    ctx.decode(&batch).unwrap();
    (0..tokens.len())
        .map(|i| ctx.logits(i).unwrap().to_vec())
        .collect()
}

/// Logits of every position when `tokens` are decoded one at a time (token generation: one-row
/// kernels, reused graphs, the cache growing), on `n_devices` devices.
fn logits_one_by_one(model: Arc<Model>, tokens: &[u32], fa: FlashAttn) -> Vec<Vec<f32>> {
    let params = ContextParams {
        n_ctx: 256,
        flash_attn: fa,
        n_threads: 2,
        ..Default::default()
    };
    let mut ctx = Context::new(model, params).unwrap();
    let mut batch = Batch::default();
    let mut rows = Vec::new();
    for (i, &t) in tokens.iter().enumerate() {
        batch.clear();
        batch.push(t, i as i32, 0, true);
        ctx.decode(&batch).unwrap();
        rows.push(ctx.last_logits().unwrap().to_vec());
    }
    rows
}

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// `v` as the shared reference stores it: numpy's `round(float32, 6)`, in float32 arithmetic.
fn round6(v: f32) -> f32 {
    (v * 1e6).round_ties_even() / 1e6
}

/// Checks one fixture against `reference` (computed with flash attention `fa`; its values
/// rounded to 6 decimals when `rounded`); returns its NMSE (batch, and token by token) and how
/// many logits have llama.cpp's bits.
fn check(
    which: &str,
    file: &str,
    reference: &Value,
    fa: FlashAttn,
    rounded: bool,
) -> (f64, f64, usize, usize) {
    let tokens: Vec<u32> = reference["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let expected: Vec<Vec<f64>> = reference["models"][file]["logits"]
        .as_array()
        .unwrap_or_else(|| panic!("{file}: no reference logits"))
        .iter()
        .map(|row| {
            row.as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        })
        .collect();
    let path = folder(which).join(file);
    let got = logits(load(&path, 1), &tokens, fa);
    assert_eq!(got.len(), expected.len(), "{file}: positions");

    let (mut err, mut norm) = (0f64, 0f64);
    let (mut same, mut total) = (0, 0);
    for (pos, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g.len(), e.len(), "{file}: vocabulary size");
        for (&a, &b) in g.iter().zip(e) {
            assert!(a.is_finite(), "{file}: non-finite logit at position {pos}");
            err += (f64::from(a) - b).powi(2);
            norm += b * b;
            total += 1;
            // Compared as f32: the JSON holds f32 values, and its f64 parse may be off in the
            // last f64 bit.
            let b = b as f32;
            same += usize::from(if rounded { round6(a) == b } else { a == b });
        }
        let e32: Vec<f32> = e.iter().map(|&v| v as f32).collect();
        assert_eq!(argmax(g), argmax(&e32), "{file}: argmax at position {pos}");
    }
    let nmse = err / norm;
    assert!(nmse <= NMSE_MAX, "{file}: NMSE {nmse:e} > {NMSE_MAX:e}");
    assert!(
        same == total,
        "{file}: {} of {total} logits differ from llama.cpp's bits",
        total - same
    );

    // Token by token (generation): other kernels, so not the same bits, but as close to
    // llama.cpp's batch logits as llama.cpp's own generation is (checked the same way).
    let stepwise = logits_one_by_one(load(&path, 1), &tokens, fa);
    let (mut err, mut norm) = (0f64, 0f64);
    for (pos, (g, e)) in stepwise.iter().zip(&expected).enumerate() {
        for (&a, &b) in g.iter().zip(e) {
            err += (f64::from(a) - b).powi(2);
            norm += b * b;
        }
        let e32: Vec<f32> = e.iter().map(|&v| v as f32).collect();
        assert_eq!(
            argmax(g),
            argmax(&e32),
            "{file}: step-by-step argmax at {pos}"
        );
    }
    let step_nmse = err / norm;
    assert!(
        step_nmse <= NMSE_MAX,
        "{file}: step-by-step NMSE {step_nmse:e}"
    );

    // Three virtual devices, layers split between them: the same bits.
    let split = logits(load(&path, 3), &tokens, fa);
    assert!(
        split
            .iter()
            .flatten()
            .map(|v| v.to_bits())
            .eq(got.iter().flatten().map(|v| v.to_bits())),
        "{file}: 3 devices differ from 1"
    );
    (nmse, step_nmse, same, total)
}

/// A fixture with the variant's metadata keys set, written to a temporary file.
fn variant_file(v: &Value) -> PathBuf {
    use lamina_gguf::{GgufFile, GgufWriter};
    let (which, file) = v["base"].as_str().unwrap().split_once(':').unwrap();
    let src = GgufFile::open(folder(which).join(file)).unwrap();
    let mut w = GgufWriter::from_file(&src);
    for (key, tv) in v["set"].as_object().unwrap() {
        let (t, val) = (tv[0].as_str().unwrap(), tv[1].as_str().unwrap());
        let value = match t {
            "str" => lamina_gguf::Value::String(val.into()),
            "f32" => lamina_gguf::Value::F32(val.parse().unwrap()),
            "u32" => lamina_gguf::Value::U32(val.parse().unwrap()),
            "bool" => lamina_gguf::Value::Bool(val == "true"),
            _ => panic!("type {t}"),
        };
        w.metadata_mut().set(key, value);
    }
    let path = std::env::temp_dir().join(format!(
        "lamina-variant-{}-{}.gguf",
        std::process::id(),
        v["name"].as_str().unwrap()
    ));
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    std::fs::write(&path, bytes).unwrap();
    path
}

/// RoPE scaling as llama.cpp reads it (linear, YaRN with and without its log multiplier,
/// phi3's long factors past the training context): each variant of a fixture
/// (`tests/archs/variants.json`, made by `scripts/arch-fixtures/variants.sh`) gives llama.cpp's
/// logits bit for bit.
#[test]
fn rope_scaling_variants_match_llama_cpp() {
    let path = folder("local").join("variants.json");
    let variants: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let tokens: Vec<u32> = variants["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    for v in variants["variants"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        let (which, _) = v["base"].as_str().unwrap().split_once(':').unwrap();
        if reference(which).is_none() {
            continue;
        }
        let file = variant_file(v);
        let got = logits(load(&file, 1), &tokens, FlashAttn::Off);
        std::fs::remove_file(&file).unwrap();
        let expected = v["logits"].as_array().unwrap();
        let mut differ = 0;
        for (g, e) in got.iter().zip(expected) {
            for (&a, b) in g.iter().zip(e.as_array().unwrap()) {
                differ += usize::from(a != b.as_f64().unwrap() as f32);
            }
        }
        assert_eq!(differ, 0, "{name}: {differ} logits differ from llama.cpp's");
    }
}

#[test]
fn every_architecture_matches_llama_cpp() {
    let mut report = Vec::new();
    for which in ["shared", "local"] {
        let Some(reference) = reference(which) else {
            continue;
        };
        for &(w, file) in FIXTURES.iter().filter(|(w, _)| *w == which) {
            let (nmse, step, same, total) =
                check(w, file, &reference, FlashAttn::Off, which == "shared");
            report.push(format!(
                "{file}: NMSE {nmse:.3e}, {same}/{total} logits with llama.cpp's bits; \
                 token by token NMSE {step:.3e}"
            ));
        }
    }
    eprintln!("{}", report.join("\n"));
}

/// The same with flash attention (llama.cpp's default): every fixture against llama.cpp's
/// `-fa on` logits (`tests/archs/reference-logits-fa.json`, full precision), bit for bit;
/// this covers soft-capping (gemma2), sinks (gpt-oss), sliding windows and the K-only MLA
/// cache (deepseek2) inside `flash_attn_ext`.
#[test]
fn every_architecture_matches_llama_cpp_with_flash_attention() {
    let path = folder("local").join("reference-logits-fa.json");
    let reference: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut report = Vec::new();
    for &(w, file) in FIXTURES {
        if !folder(w).join(file).exists() {
            eprintln!("skipping {file}: {} is absent", folder(w).display());
            continue;
        }
        let (nmse, step, same, total) = check(w, file, &reference, FlashAttn::On, false);
        report.push(format!(
            "{file} (fa on): NMSE {nmse:.3e}, {same}/{total} logits with llama.cpp's bits; \
             token by token NMSE {step:.3e}"
        ));
    }
    eprintln!("{}", report.join("\n"));
}

/// Absorbed MLA keeps only K in the cache (V is the latent K starts with), as llama.cpp does:
/// the cache holds K's bytes and nothing more, and the logits above are unchanged by it.
#[test]
fn absorbed_mla_keeps_a_k_only_cache() {
    let path = folder("shared").join("deepseek2-moe.gguf");
    if !path.exists() {
        eprintln!("skipping: {} is absent", path.display());
        return;
    }
    let model = load(&path, 1);
    let hp = model.hparams.clone();
    assert!(hp.v_in_k);
    let n_ctx = 256;
    let ctx = Context::new(
        model,
        ContextParams {
            n_ctx,
            ..Default::default()
        },
    )
    .unwrap();
    let k_bytes: usize = (0..hp.n_layer as usize)
        .map(|il| (hp.n_embd_k_gqa(il) as usize * n_ctx * 2).next_multiple_of(64))
        .sum();
    assert_eq!(ctx.kv_cache().buffer(0).unwrap().size(), k_bytes);
}
