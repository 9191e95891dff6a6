//! Every architecture against llama.cpp: the random-weight models that llama.cpp's
//! `tests/test-llama-archs.cpp` builds (`../shared/archs/`, and the ones this repository adds in
//! `tests/archs/`), with llama.cpp's logits for a fixed 24-token batch (CPU, f16 KV, no flash
//! attention, one batch). Per model: NMSE of all logits at most 1e-4 (as llama.cpp compares
//! backends) and the same argmax at every position; and the same logits, bit for bit, on three
//! virtual devices with a layer split as on one device.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lamina_backend::Device;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_model::{Batch, Context, ContextParams, Model, Placement, SplitMode};
use serde_json::Value;

/// The fixtures each architecture is checked on: `(folder, file)`.
const FIXTURES: &[(&str, &str)] = &[
    ("shared", "llama-dense.gguf"),
    ("shared", "qwen2-dense.gguf"),
    ("shared", "qwen3-dense.gguf"),
    ("shared", "phi2-dense.gguf"),
    ("shared", "phi3-dense.gguf"),
    ("shared", "gemma3-dense.gguf"),
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

fn load(path: &Path, n_devices: usize) -> Arc<Model> {
    let reg =
        CpuBackendReg::new(CpuConfig::default().with_devices(n_devices).with_threads(2)).unwrap();
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
    Arc::new(Model::load_placed(path, &placement).unwrap())
}

/// Logits of every position when `tokens` are evaluated in one batch (n_ctx 256, f16 KV).
fn logits(model: Arc<Model>, tokens: &[u32]) -> Vec<Vec<f32>> {
    let params = ContextParams {
        n_ctx: 256,
        n_ubatch: 512,
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

fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

/// Checks one fixture; returns its NMSE.
fn check(which: &str, file: &str, reference: &Value) -> f64 {
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
    let got = logits(load(&path, 1), &tokens);
    assert_eq!(got.len(), expected.len(), "{file}: positions");

    let (mut err, mut norm) = (0f64, 0f64);
    for (pos, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g.len(), e.len(), "{file}: vocabulary size");
        for (&a, &b) in g.iter().zip(e) {
            assert!(a.is_finite(), "{file}: non-finite logit at position {pos}");
            err += (f64::from(a) - b).powi(2);
            norm += b * b;
        }
        let e32: Vec<f32> = e.iter().map(|&v| v as f32).collect();
        assert_eq!(argmax(g), argmax(&e32), "{file}: argmax at position {pos}");
    }
    let nmse = err / norm;
    assert!(nmse <= NMSE_MAX, "{file}: NMSE {nmse:e} > {NMSE_MAX:e}");

    // Three virtual devices, layers split between them: the same bits.
    let split = logits(load(&path, 3), &tokens);
    assert!(
        split
            .iter()
            .flatten()
            .map(|v| v.to_bits())
            .eq(got.iter().flatten().map(|v| v.to_bits())),
        "{file}: 3 devices differ from 1"
    );
    nmse
}

#[test]
fn every_architecture_matches_llama_cpp() {
    let mut report = Vec::new();
    for which in ["shared", "local"] {
        let Some(reference) = reference(which) else {
            continue;
        };
        for &(w, file) in FIXTURES.iter().filter(|(w, _)| *w == which) {
            let nmse = check(w, file, &reference);
            report.push(format!("{file}: NMSE {nmse:.3e}"));
        }
    }
    eprintln!("{}", report.join("\n"));
}
