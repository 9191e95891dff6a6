//! Hyperparameters, read from GGUF metadata the way llama.cpp's `llama_model::load_hparams` does.

use lamina_gguf::{Array, Gguf, Metadata, Value};

use crate::ModelError;

/// The architectures Lamina can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3, Mistral, SmolLM2 and other llama-shaped models.
    Llama,
    /// Gemma 3: interleaved sliding-window and global attention layers.
    Gemma3,
}

impl Arch {
    pub fn from_name(name: &str) -> Result<Arch, ModelError> {
        match name {
            "llama" => Ok(Arch::Llama),
            "gemma3" => Ok(Arch::Gemma3),
            other => Err(ModelError::UnknownArchitecture(other.to_string())),
        }
    }

    /// The metadata key prefix (`llama.`, `gemma3.`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
        }
    }

    pub fn rope_type(self) -> RopeType {
        match self {
            Arch::Llama => RopeType::Normal,
            Arch::Gemma3 => RopeType::Neox,
        }
    }
}

/// How RoPE pairs up dimensions: adjacent pairs (llama) or halves (GPT-NeoX, gemma).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeType {
    Normal,
    Neox,
}

/// Everything about a model's shape that the graph needs.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    pub arch: Arch,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub n_embd: u32,
    pub n_layer: u32,
    /// Per layer.
    pub n_head: Vec<u32>,
    /// Per layer.
    pub n_head_kv: Vec<u32>,
    /// Per layer.
    pub n_ff: Vec<u32>,
    pub n_embd_head_k: u32,
    pub n_embd_head_v: u32,
    /// Dimensions rotated by RoPE (the rest pass through).
    pub n_rot: u32,
    pub rope_type: RopeType,
    pub rope_freq_base: f32,
    /// 1 / rope scaling factor.
    pub rope_freq_scale: f32,
    /// RoPE base of sliding-window layers (gemma3: 10000).
    pub rope_freq_base_swa: f32,
    pub rope_freq_scale_swa: f32,
    pub n_ctx_orig: u32,
    pub norm_rms_eps: f32,
    /// Sliding window size in tokens; 0 when no layer uses one.
    pub n_swa: u32,
    /// Per layer: whether the layer uses sliding-window attention.
    pub swa_layers: Vec<bool>,
    /// Scale applied to Q before attention (gemma3); `None` means 1/sqrt(head dim) inside attention.
    pub attention_scale: Option<f32>,
    /// Final logit soft-capping (0 = none).
    pub final_logit_softcapping: f32,
}

impl HParams {
    /// Reads and checks the hyperparameters of the model in `gguf`.
    pub fn from_gguf(gguf: &Gguf) -> Result<HParams, ModelError> {
        let md = &gguf.metadata;
        let arch_name = md
            .get_str("general.architecture")?
            .ok_or(ModelError::NoArchitecture)?;
        let arch = Arch::from_name(arch_name)?;
        let key = |k: &str| format!("{}.{k}", arch.name());
        let bad = |k: &str, message: String| ModelError::BadHParam {
            key: key(k),
            message,
        };

        let n_ctx_train = md.require_u32(&key("context_length"))?;
        let n_embd = md.require_u32(&key("embedding_length"))?;
        let n_layer = md.require_u32(&key("block_count"))?;
        if n_embd == 0 || n_layer == 0 {
            return Err(bad(
                "embedding_length",
                "embedding length and block count must be positive".into(),
            ));
        }
        // Bound what we allocate per layer by what a real model could have.
        if n_layer > 4096 {
            return Err(bad(
                "block_count",
                format!("{n_layer} layers is not plausible"),
            ));
        }
        let n_head = per_layer(md, &key("attention.head_count"), n_layer, None)?;
        let n_head_kv = per_layer(md, &key("attention.head_count_kv"), n_layer, Some(&n_head))?;
        let n_ff = per_layer(md, &key("feed_forward_length"), n_layer, None)?;
        for (il, (&h, &hkv)) in n_head.iter().zip(&n_head_kv).enumerate() {
            if h == 0 || hkv == 0 || h % hkv != 0 {
                return Err(bad(
                    "attention.head_count_kv",
                    format!("layer {il}: {h} heads cannot share {hkv} key/value heads"),
                ));
            }
        }
        let head_default = n_embd / n_head[0];
        let n_embd_head_k = md
            .get_u32(&key("attention.key_length"))?
            .unwrap_or(head_default);
        let n_embd_head_v = md
            .get_u32(&key("attention.value_length"))?
            .unwrap_or(head_default);
        let n_rot = md
            .get_u32(&key("rope.dimension_count"))?
            .unwrap_or(n_embd_head_k);
        if n_embd_head_k == 0 || n_rot > n_embd_head_k || !n_rot.is_multiple_of(2) {
            return Err(bad(
                "rope.dimension_count",
                format!("{n_rot} rotated of {n_embd_head_k} head dimensions"),
            ));
        }

        let rope_freq_base = md.get_f32(&key("rope.freq_base"))?.unwrap_or(10000.0);
        let scaling_type = md.get_str(&key("rope.scaling.type"))?.unwrap_or("none");
        let factor = match md.get_f32(&key("rope.scaling.factor"))? {
            Some(f) => f,
            None => md.get_f32(&key("rope.scale_linear"))?.unwrap_or(0.0),
        };
        if !matches!(scaling_type, "none" | "linear") {
            return Err(bad(
                "rope.scaling.type",
                format!("rope scaling {scaling_type:?} is not supported yet"),
            ));
        }
        let rope_freq_scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
        let n_ctx_orig = md
            .get_u32(&key("rope.scaling.original_context_length"))?
            .unwrap_or(n_ctx_train);
        let norm_rms_eps = md.require_f32(&key("attention.layer_norm_rms_epsilon"))?;

        let n_vocab = match md.get_u32(&key("vocab_size"))? {
            Some(n) => n,
            None => md
                .get_array("tokenizer.ggml.tokens")?
                .map_or(0, |a| a.len() as u32),
        };

        let mut hp = HParams {
            arch,
            n_vocab,
            n_ctx_train,
            n_embd,
            n_layer,
            n_head,
            n_head_kv,
            n_ff,
            n_embd_head_k,
            n_embd_head_v,
            n_rot,
            rope_type: arch.rope_type(),
            rope_freq_base,
            rope_freq_scale,
            rope_freq_base_swa: rope_freq_base,
            rope_freq_scale_swa: rope_freq_scale,
            n_ctx_orig,
            norm_rms_eps,
            n_swa: 0,
            swa_layers: vec![false; n_layer as usize],
            attention_scale: None,
            final_logit_softcapping: 0.0,
        };

        match arch {
            Arch::Llama => {}
            Arch::Gemma3 => {
                // llama.cpp: a sliding window every layer but each sixth, whose rope base is 10000.
                let n_swa = md.get_u32(&key("attention.sliding_window"))?.unwrap_or(0);
                if n_swa == 0 {
                    return Err(bad(
                        "attention.sliding_window",
                        "gemma3 without sliding-window attention (soft-capped logits) is not supported yet".into(),
                    ));
                }
                hp.n_swa = n_swa;
                hp.swa_layers = (0..n_layer).map(|il| il % 6 < 5).collect();
                hp.rope_freq_base_swa = 10000.0;
                hp.rope_freq_scale_swa = 1.0;
                hp.final_logit_softcapping =
                    md.get_f32(&key("final_logit_softcapping"))?.unwrap_or(0.0);
                // Gemma 3 27B (62 layers) scales by n_embd / n_head instead of the head size.
                let scale_dim = if n_layer == 62 {
                    n_embd / hp.n_head[0]
                } else {
                    n_embd_head_k
                };
                hp.attention_scale = Some(1.0 / (scale_dim as f32).sqrt());
            }
        }
        Ok(hp)
    }

    /// Number of query heads × head size (the width of Q).
    pub fn n_embd_q(&self, il: usize) -> u32 {
        self.n_head[il] * self.n_embd_head_k
    }

    /// The width of one token's K in layer `il`.
    pub fn n_embd_k_gqa(&self, il: usize) -> u32 {
        self.n_head_kv[il] * self.n_embd_head_k
    }

    /// The width of one token's V in layer `il`.
    pub fn n_embd_v_gqa(&self, il: usize) -> u32 {
        self.n_head_kv[il] * self.n_embd_head_v
    }

    /// RoPE base and scale of layer `il`.
    pub fn rope_freq(&self, il: usize) -> (f32, f32) {
        if self.swa_layers[il] {
            (self.rope_freq_base_swa, self.rope_freq_scale_swa)
        } else {
            (self.rope_freq_base, self.rope_freq_scale)
        }
    }
}

/// A per-layer count: a scalar for every layer, or an array with one entry per layer.
fn per_layer(
    md: &Metadata,
    key: &str,
    n_layer: u32,
    default: Option<&[u32]>,
) -> Result<Vec<u32>, ModelError> {
    let bad = |message: String| ModelError::BadHParam {
        key: key.to_string(),
        message,
    };
    let value = match (md.get(key), default) {
        (Some(v), _) => v,
        (None, Some(d)) => return Ok(d.to_vec()),
        (None, None) => return Err(lamina_gguf::MetadataError::Missing(key.to_string()).into()),
    };
    let values: Vec<u32> = match value {
        Value::Array(a) => {
            if a.len() != n_layer as usize {
                return Err(bad(format!("{} entries for {n_layer} layers", a.len())));
            }
            let ints: Option<Vec<u32>> = match a {
                Array::U32(v) => Some(v.clone()),
                Array::I32(v) => v.iter().map(|&x| u32::try_from(x).ok()).collect(),
                _ => None,
            };
            ints.ok_or_else(|| {
                bad(format!(
                    "expected non-negative integers, found {}",
                    value.type_description()
                ))
            })?
        }
        v => {
            let n = v.as_u64().and_then(|x| u32::try_from(x).ok());
            vec![
                n.ok_or_else(|| bad(format!(
                    "expected an integer, found {}",
                    v.type_description()
                )))?;
                n_layer as usize
            ]
        }
    };
    Ok(values)
}
