//! Files of a known architecture that are wrong inside: a missing, mis-shaped or wrongly typed
//! tensor, inconsistent or missing metadata. Each load fails with a typed error that names the
//! tensor or key, and nothing panics. Variants are made from the random-weight fixtures of
//! `../shared/archs/` by rewriting them with the GGUF writer.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use lamina_backend::Device;
use lamina_core::DType;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_gguf::{GgufFile, GgufWriter, Value};
use lamina_model::{Model, ModelError};

fn fixture(name: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/archs")
        .join(name);
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipping: {} is absent", path.display());
        None
    }
}

fn cpu() -> Arc<dyn Device> {
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(1).with_threads(1)).unwrap();
    reg.cpu_devices()[0].clone()
}

/// What to change in the copy.
enum Edit {
    DropTensor(&'static str),
    /// Replace a tensor with one of this type and shape (zero bytes).
    Retype(&'static str, DType, &'static [u64]),
    SetKey(&'static str, Value),
    DropKey(&'static str),
}

/// Loads a copy of `src` with `edit` applied; returns the error.
fn load_edited(src: &Path, edit: Edit, tag: &str) -> ModelError {
    let file = GgufFile::open(src).unwrap();
    let original = GgufWriter::from_file(&file);
    let mut metadata = original.metadata().clone();
    let zeros = vec![0u8; 4 << 20];
    match &edit {
        Edit::SetKey(k, v) => metadata.set(k, v.clone()),
        Edit::DropKey(k) => {
            let mut kept = lamina_gguf::Metadata::default();
            for (key, value) in metadata.entries() {
                if key != k {
                    kept.set(key, value.clone());
                }
            }
            metadata = kept;
        }
        _ => {}
    }
    let mut w = GgufWriter::new(metadata);
    for t in original.tensors() {
        match &edit {
            Edit::DropTensor(name) if t.name == *name => continue,
            Edit::Retype(name, dtype, dims) if t.name == *name => {
                let n: u64 = dims.iter().product();
                let size = (n as usize) * dtype.type_size() as usize / dtype.block_size() as usize;
                w.add_tensor(t.name.clone(), *dtype, dims, &zeros[..size])
                    .unwrap();
            }
            _ => w
                .add_tensor(t.name.clone(), t.dtype, &t.dims, t.data)
                .unwrap(),
        }
    }
    let out =
        std::env::temp_dir().join(format!("lamina-bad-arch-{}-{tag}.gguf", std::process::id()));
    let mut bytes = Vec::new();
    w.write_to(&mut bytes).unwrap();
    std::fs::write(&out, &bytes).unwrap();
    let result = Model::load(&out, cpu());
    std::fs::remove_file(&out).unwrap();
    match result {
        Ok(_) => panic!("{tag}: the edited file loaded"),
        Err(e) => e,
    }
}

#[test]
fn broken_qwen3_files_get_typed_errors_naming_the_tensor_or_key() {
    let Some(src) = fixture("qwen3-dense.gguf") else {
        return;
    };
    let e = load_edited(
        &src,
        Edit::DropTensor("blk.1.attn_k_norm.weight"),
        "missing",
    );
    assert!(
        matches!(&e, ModelError::MissingTensor(n) if n == "blk.1.attn_k_norm.weight"),
        "{e}"
    );

    let e = load_edited(
        &src,
        Edit::Retype("blk.0.attn_q.weight", DType::F32, &[256, 128]),
        "shape",
    );
    assert!(
        matches!(&e, ModelError::BadShape { name, expected, .. }
            if name == "blk.0.attn_q.weight" && expected == &[256, 256]),
        "{e}"
    );

    let e = load_edited(
        &src,
        Edit::Retype("blk.0.attn_norm.weight", DType::F16, &[256]),
        "type",
    );
    assert!(
        matches!(&e, ModelError::UnsupportedType { name, dtype: DType::F16 }
            if name == "blk.0.attn_norm.weight"),
        "{e}"
    );

    // 4 query heads cannot share 3 key/value heads.
    let e = load_edited(
        &src,
        Edit::SetKey("qwen3.attention.head_count_kv", Value::U32(3)),
        "gqa",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. } if key == "qwen3.attention.head_count_kv"),
        "{e}"
    );

    let e = load_edited(
        &src,
        Edit::SetKey("qwen3.attention.head_count", Value::U32(0)),
        "heads",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. } if key == "qwen3.attention.head_count"),
        "{e}"
    );

    let e = load_edited(
        &src,
        Edit::SetKey("qwen3.block_count", Value::U32(1 << 30)),
        "layers",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. } if key == "qwen3.block_count"),
        "{e}"
    );

    let e = load_edited(
        &src,
        Edit::SetKey("qwen3.embedding_length", Value::String("wide".into())),
        "type-of-key",
    );
    assert!(e.to_string().contains("qwen3.embedding_length"), "{e}");

    let e = load_edited(
        &src,
        Edit::DropKey("qwen3.attention.layer_norm_rms_epsilon"),
        "no-eps",
    );
    assert!(
        e.to_string()
            .contains("qwen3.attention.layer_norm_rms_epsilon"),
        "{e}"
    );

    // Sizes whose products would overflow before any shape check.
    for (key, value, tag) in [
        ("qwen3.attention.head_count", u32::MAX, "huge-heads"),
        ("qwen3.attention.key_length", u32::MAX, "huge-head"),
        ("qwen3.embedding_length", u32::MAX, "huge-embd"),
        ("qwen3.vocab_size", u32::MAX, "huge-vocab"),
        ("qwen3.feed_forward_length", u32::MAX, "huge-ff"),
    ] {
        let e = load_edited(&src, Edit::SetKey(key, Value::U32(value)), tag);
        assert!(
            matches!(&e, ModelError::BadHParam { key: k, .. } if k == key),
            "{key}: {e}"
        );
    }

    // A per-layer array of the wrong length.
    let e = load_edited(
        &src,
        Edit::SetKey(
            "qwen3.feed_forward_length",
            Value::Array(lamina_gguf::Array::U32(vec![384; 3])),
        ),
        "per-layer",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. } if key == "qwen3.feed_forward_length"),
        "{e}"
    );
}

#[test]
fn broken_phi2_files_get_typed_errors() {
    let Some(src) = fixture("phi2-dense.gguf") else {
        return;
    };
    // phi2's layer norms need their biases.
    let e = load_edited(&src, Edit::DropTensor("blk.0.attn_norm.bias"), "norm-bias");
    assert!(
        matches!(&e, ModelError::MissingTensor(n) if n == "blk.0.attn_norm.bias"),
        "{e}"
    );
    // A rotary dimension count past the head size.
    let e = load_edited(
        &src,
        Edit::SetKey("phi2.rope.dimension_count", Value::U32(130)),
        "rot",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. } if key == "phi2.rope.dimension_count"),
        "{e}"
    );
}

#[test]
fn broken_moe_files_get_typed_errors() {
    let Some(src) = fixture("qwen2moe-moe.gguf") else {
        return;
    };
    // More experts used than there are.
    let e = load_edited(
        &src,
        Edit::SetKey("qwen2moe.expert_used_count", Value::U32(3)),
        "used",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. } if key == "qwen2moe.expert_used_count"),
        "{e}"
    );
    // No experts at all, for an architecture that needs them.
    let e = load_edited(
        &src,
        Edit::SetKey("qwen2moe.expert_count", Value::U32(0)),
        "no-experts",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. }
            if key == "qwen2moe.expert_count" || key == "qwen2moe.expert_used_count"),
        "{e}"
    );
    // Experts present but none used.
    let e = load_edited(
        &src,
        Edit::SetKey("qwen2moe.expert_used_count", Value::U32(0)),
        "none-used",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. } if key == "qwen2moe.expert_used_count"),
        "{e}"
    );
    // An implausible expert count (bounds what is allocated per layer).
    let e = load_edited(
        &src,
        Edit::SetKey("qwen2moe.expert_count", Value::U32(1 << 20)),
        "many-experts",
    );
    assert!(
        matches!(&e, ModelError::BadHParam { key, .. } if key == "qwen2moe.expert_count"),
        "{e}"
    );
    // An expert stack of the wrong shape names the tensor.
    let e = load_edited(
        &src,
        Edit::Retype("blk.1.ffn_down_exps.weight", DType::F32, &[384, 256, 3]),
        "stack-shape",
    );
    assert!(
        matches!(&e, ModelError::BadShape { name, .. } if name == "blk.1.ffn_down_exps.weight"),
        "{e}"
    );
    let e = load_edited(
        &src,
        Edit::DropTensor("blk.0.ffn_gate_inp.weight"),
        "router",
    );
    assert!(
        matches!(&e, ModelError::MissingTensor(n) if n == "blk.0.ffn_gate_inp.weight"),
        "{e}"
    );
}

#[test]
fn broken_deepseek2_and_gpt_oss_files_get_typed_errors() {
    if let Some(src) = fixture("deepseek2-moe.gguf") {
        let e = load_edited(
            &src,
            Edit::SetKey("deepseek2.attention.kv_lora_rank", Value::U32(500)),
            "kv-lora",
        );
        assert!(e.to_string().contains("deepseek2."), "{e}");
        let e = load_edited(
            &src,
            Edit::SetKey("deepseek2.expert_gating_func", Value::U32(9)),
            "gating",
        );
        assert!(
            matches!(&e, ModelError::BadHParam { key, .. } if key == "deepseek2.expert_gating_func"),
            "{e}"
        );
        let e = load_edited(&src, Edit::DropTensor("blk.0.attn_k_b.weight"), "k-b");
        assert!(
            matches!(&e, ModelError::MissingTensor(n) if n == "blk.0.attn_k_b.weight"),
            "{e}"
        );
    }
    if let Some(src) = fixture("gpt-oss-moe.gguf") {
        let e = load_edited(&src, Edit::DropTensor("blk.1.attn_sinks.weight"), "sinks");
        assert!(
            matches!(&e, ModelError::MissingTensor(n) if n == "blk.1.attn_sinks.weight"),
            "{e}"
        );
        let e = load_edited(
            &src,
            Edit::DropKey("gpt-oss.attention.sliding_window"),
            "no-window",
        );
        assert!(
            e.to_string().contains("gpt-oss.attention.sliding_window"),
            "{e}"
        );
    }
}
