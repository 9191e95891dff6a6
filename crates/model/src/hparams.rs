//! Hyperparameters: the ones every architecture shares (what the KV cache, the masks and the
//! graph blocks need), read from GGUF metadata the way llama.cpp's generic
//! `llama_model_base::load_hparams` reads them, and [`MetaReader`], the typed reader that
//! architecture modules use for their own keys.

use lamina_gguf::{Array, Gguf, Metadata, Value};

use crate::ModelError;

/// How RoPE pairs up dimensions: adjacent pairs (llama) or halves (GPT-NeoX, gemma, qwen).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeType {
    Normal,
    Neox,
}

/// How RoPE frequencies are scaled for contexts past the training one (llama.cpp's
/// `llama_rope_scaling_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeScaling {
    None,
    Linear,
    Yarn,
    /// Phi-3's: linear frequency scaling, with the long or short factor tensors chosen by
    /// the context size.
    LongRope,
}

/// Most layers a model may declare (llama.cpp's `LLAMA_MAX_LAYERS`); bounds what is allocated
/// per layer from a count read off the file.
pub const MAX_LAYERS: u32 = 512;

/// Bounds on sizes read off a file, far above any real model, so that products of them (head
/// count × head size, widths × context) cannot overflow before the shape checks run.
const MAX_WIDTH: u32 = 1 << 20;
const MAX_HEADS: u32 = 1 << 14;

/// What every architecture's graph, cache and masks need to know about the model's shape.
/// Architecture-specific values (attention scales, soft-capping, expert routing) live in the
/// architecture's own module.
#[derive(Clone, Debug, PartialEq)]
pub struct HParams {
    /// llama.cpp's architecture name (`general.architecture`).
    pub arch: &'static str,
    pub n_vocab: u32,
    pub n_ctx_train: u32,
    pub n_embd: u32,
    pub n_layer: u32,
    /// Per layer.
    pub n_head: Vec<u32>,
    /// Per layer.
    pub n_head_kv: Vec<u32>,
    /// Per layer (0 where the file gives none, as in llama.cpp).
    pub n_ff: Vec<u32>,
    pub n_embd_head_k: u32,
    pub n_embd_head_v: u32,
    /// Dimensions rotated by RoPE (the rest pass through).
    pub n_rot: u32,
    pub rope_type: RopeType,
    pub rope_freq_base: f32,
    /// 1 / rope scaling factor.
    pub rope_freq_scale: f32,
    /// RoPE base and scale of sliding-window layers.
    pub rope_freq_base_swa: f32,
    pub rope_freq_scale_swa: f32,
    pub n_ctx_orig: u32,
    pub rope_scaling: RopeScaling,
    /// `rope.scaling.attn_factor` (1 unless the file says).
    pub rope_attn_factor: f32,
    /// YaRN's log multiplier of the attention scale (`mscale_all_dims`; deepseek2, mistral3);
    /// 0: none.
    pub yarn_log_mul: f32,
    /// With a log multiplier, use it for `mscale` too (llama.cpp's DeepSeek V2 special case).
    pub yarn_mscale_is_log_mul: bool,
    pub yarn_beta_fast: f32,
    pub yarn_beta_slow: f32,
    /// RMS norm epsilon (0 where the architecture uses layer norm).
    pub norm_rms_eps: f32,
    /// Layer norm epsilon (0 where the architecture uses RMS norm).
    pub norm_eps: f32,
    /// Sliding window size in tokens; 0 when no layer uses one.
    pub n_swa: u32,
    /// Per layer: whether the layer uses sliding-window attention.
    pub swa_layers: Vec<bool>,
    /// Experts per MoE layer (0: no experts).
    pub n_expert: u32,
    /// Experts each token is routed to.
    pub n_expert_used: u32,
    /// Expert groups (DeepSeek V3's group-limited routing; 0 or 1: none) and how many of them
    /// a token may use.
    pub n_expert_groups: u32,
    pub n_group_used: u32,
    /// The cache stores no V: a layer's V is the first `n_embd_v_gqa` values of each K row
    /// (llama.cpp's K-only cache of absorbed MLA, where V is the latent K starts with).
    pub v_in_k: bool,
}

impl HParams {
    /// Reads the hyperparameters of the model in `gguf`, as its architecture module does.
    pub fn from_gguf(gguf: &Gguf) -> Result<HParams, ModelError> {
        Ok(crate::arch::load(gguf)?.hparams().clone())
    }

    /// The keys llama.cpp reads for every architecture (`llama_model_base::load_hparams`), with
    /// its defaults, checked; the architecture then reads its own and adjusts these.
    pub fn read_common(r: &MetaReader<'_>, rope_type: RopeType) -> Result<HParams, ModelError> {
        let n_ctx_train = r.require_u32("context_length")?;
        let n_embd = r.require_u32("embedding_length")?;
        let n_layer = r.require_u32("block_count")?;
        if n_embd == 0 || n_embd > MAX_WIDTH {
            return Err(r.bad(
                "embedding_length",
                format!("{n_embd} (1 to {MAX_WIDTH} supported)"),
            ));
        }
        // Checked before anything allocates `n_layer` entries.
        if n_layer == 0 || n_layer > MAX_LAYERS {
            return Err(r.bad(
                "block_count",
                format!("{n_layer} layers (1 to {MAX_LAYERS} supported)"),
            ));
        }
        // llama.cpp's LLAMA_MAX_EXPERTS, and its checks of the expert counts.
        const MAX_EXPERTS: u32 = 512;
        let n_expert = r.u32("expert_count")?.unwrap_or(0);
        let n_expert_used = r
            .per_layer("expert_used_count", n_layer)?
            .map_or(0, |v| v.into_iter().max().unwrap_or(0));
        let n_expert_groups = r.u32("expert_group_count")?.unwrap_or(0);
        let n_group_used = r.u32("expert_group_used_count")?.unwrap_or(0);
        if n_expert > MAX_EXPERTS {
            return Err(r.bad(
                "expert_count",
                format!("{n_expert} experts (at most {MAX_EXPERTS})"),
            ));
        }
        if n_expert_used > n_expert || (n_expert > 0 && n_expert_used == 0) {
            return Err(r.bad(
                "expert_used_count",
                format!("{n_expert_used} experts used of {n_expert}"),
            ));
        }
        if n_expert > 0 && n_expert_groups > 1 {
            if n_expert_groups >= n_expert || !n_expert.is_multiple_of(n_expert_groups) {
                return Err(r.bad(
                    "expert_group_count",
                    format!("{n_expert} experts cannot form {n_expert_groups} groups"),
                ));
            }
            if n_group_used == 0 || n_group_used >= n_expert_groups {
                return Err(r.bad(
                    "expert_group_used_count",
                    format!("{n_group_used} groups used of {n_expert_groups}"),
                ));
            }
        } else if n_expert == 0 && n_expert_groups > 0 {
            return Err(r.bad("expert_group_count", "expert groups without experts".into()));
        }

        let n_ff = r
            .per_layer("feed_forward_length", n_layer)?
            .unwrap_or_else(|| vec![0; n_layer as usize]);
        let n_head = r
            .per_layer("attention.head_count", n_layer)?
            .ok_or_else(|| {
                ModelError::from(lamina_gguf::MetadataError::Missing(
                    r.key("attention.head_count"),
                ))
            })?;
        let n_head_kv = r
            .per_layer("attention.head_count_kv", n_layer)?
            .unwrap_or_else(|| n_head.clone());
        if let Some(il) = n_head.iter().position(|&h| h == 0 || h > MAX_HEADS) {
            return Err(r.bad(
                "attention.head_count",
                format!("layer {il}: {} heads (1 to {MAX_HEADS})", n_head[il]),
            ));
        }
        if let Some(il) = n_ff.iter().position(|&f| f > 16 * MAX_WIDTH) {
            return Err(r.bad(
                "feed_forward_length",
                format!("layer {il}: {} is not plausible", n_ff[il]),
            ));
        }
        for (il, (&h, &hkv)) in n_head.iter().zip(&n_head_kv).enumerate() {
            if hkv == 0 || h % hkv != 0 {
                return Err(r.bad(
                    "attention.head_count_kv",
                    format!("layer {il}: {h} heads cannot share {hkv} key/value heads"),
                ));
            }
        }
        let head_default = n_embd / n_head[0];
        let n_embd_head_k = r.u32("attention.key_length")?.unwrap_or(head_default);
        let n_embd_head_v = r.u32("attention.value_length")?.unwrap_or(head_default);
        if n_embd_head_k == 0 || n_embd_head_v == 0 || n_embd_head_k.max(n_embd_head_v) > 1 << 16 {
            return Err(r.bad(
                "attention.key_length",
                format!("head sizes {n_embd_head_k} (K) and {n_embd_head_v} (V): 1 to 65536"),
            ));
        }
        let n_rot = r.u32("rope.dimension_count")?.unwrap_or(n_embd_head_k);
        if n_rot > n_embd_head_k || !n_rot.is_multiple_of(2) {
            return Err(r.bad(
                "rope.dimension_count",
                format!("{n_rot} rotated of {n_embd_head_k} head dimensions"),
            ));
        }

        let rope_freq_base = r.f32("rope.freq_base")?.unwrap_or(10000.0);
        let rope_scaling = match r.str("rope.scaling.type")?.unwrap_or("linear") {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear,
            "yarn" => RopeScaling::Yarn,
            "longrope" => RopeScaling::LongRope,
            other => {
                return Err(r.bad(
                    "rope.scaling.type",
                    format!("unknown rope scaling {other:?} (none, linear, yarn, longrope)"),
                ));
            }
        };
        let factor = match r.f32("rope.scaling.factor")? {
            Some(f) => f,
            None => r.f32("rope.scale_linear")?.unwrap_or(0.0),
        };
        if !factor.is_finite() || factor < 0.0 {
            return Err(r.bad(
                "rope.scaling.factor",
                format!("{factor} is not a scaling factor"),
            ));
        }
        // llama.cpp never scales with scaling type none.
        let rope_freq_scale = if factor == 0.0 || rope_scaling == RopeScaling::None {
            1.0
        } else {
            1.0 / factor
        };
        let n_ctx_orig = r
            .u32("rope.scaling.original_context_length")?
            .unwrap_or(n_ctx_train);

        let n_vocab = match r.u32("vocab_size")? {
            Some(n) => n,
            None => {
                r.md.get_array("tokenizer.ggml.tokens")?
                    .map_or(0, |a| a.len() as u32)
            }
        };
        if n_vocab == 0 || n_vocab > 1 << 24 {
            return Err(r.bad(
                "vocab_size",
                format!("{n_vocab} tokens (1 to {} supported)", 1 << 24),
            ));
        }

        Ok(HParams {
            arch: r.arch,
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
            rope_type,
            rope_freq_base,
            rope_freq_scale,
            rope_freq_base_swa: rope_freq_base,
            rope_freq_scale_swa: rope_freq_scale,
            n_ctx_orig,
            rope_scaling,
            rope_attn_factor: r.f32("rope.scaling.attn_factor")?.unwrap_or(1.0),
            yarn_log_mul: 0.0,
            yarn_mscale_is_log_mul: false,
            yarn_beta_fast: 32.0,
            yarn_beta_slow: 1.0,
            norm_rms_eps: r.f32("attention.layer_norm_rms_epsilon")?.unwrap_or(0.0),
            norm_eps: r.f32("attention.layer_norm_epsilon")?.unwrap_or(0.0),
            n_swa: 0,
            swa_layers: vec![false; n_layer as usize],
            n_expert,
            n_expert_used,
            n_expert_groups,
            n_group_used,
            v_in_k: false,
        })
    }

    /// Sliding-window attention with window `n_swa` on the layers the file's
    /// `attention.sliding_window_pattern` marks (an array of flags per layer), else on all but
    /// every `n_pattern`-th layer (the key as a number, else `default_pattern`), as llama.cpp's
    /// `load_swa_pattern` / `set_swa_pattern` do.
    pub fn set_swa(
        &mut self,
        r: &MetaReader<'_>,
        n_swa: u32,
        default_pattern: u32,
        dense_first: bool,
    ) -> Result<(), ModelError> {
        const KEY: &str = "attention.sliding_window_pattern";
        if n_swa == 0 {
            return Err(r.bad("attention.sliding_window", "must be positive".into()));
        }
        self.n_swa = n_swa;
        let n_layer = self.n_layer as usize;
        if let Some(Value::Array(a)) = r.md.get(&r.key(KEY)) {
            let flags: Option<Vec<bool>> = match a {
                Array::Bool(v) => Some(v.clone()),
                Array::U32(v) => Some(v.iter().map(|&x| x != 0).collect()),
                Array::I32(v) => Some(v.iter().map(|&x| x != 0).collect()),
                _ => None,
            };
            let mut flags = flags.ok_or_else(|| {
                r.bad(
                    KEY,
                    format!("expected flags, found {}", a.element_type().name()),
                )
            })?;
            if flags.len() > n_layer {
                return Err(r.bad(KEY, format!("{} entries for {n_layer} layers", flags.len())));
            }
            flags.resize(n_layer, false);
            self.swa_layers = flags;
            return Ok(());
        }
        let n_pattern = r.u32(KEY)?.unwrap_or(default_pattern);
        self.swa_layers = (0..n_layer as u32)
            .map(|il| {
                n_pattern == 0
                    || if dense_first {
                        il % n_pattern != 0
                    } else {
                        il % n_pattern < n_pattern - 1
                    }
            })
            .collect();
        Ok(())
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

    /// YaRN's `(ext_factor, attn_factor)` for RoPE, as llama.cpp's context derives them
    /// (`llama_context` constructor): extrapolation on only with YaRN scaling, and the attention
    /// factor corrected for the magnitude scaling ggml's RoPE applies itself.
    pub fn yarn_factors(&self) -> (f32, f32) {
        let mut attn_factor = 1.0f32;
        let ext_factor = if self.rope_scaling == RopeScaling::Yarn {
            1.0
        } else {
            0.0
        };
        if ext_factor != 0.0 {
            let get_mscale = |scale: f32, mscale: f32| {
                if scale <= 1.0 {
                    1.0
                } else {
                    0.1 * mscale * scale.ln() + 1.0
                }
            };
            let factor = 1.0 / self.rope_freq_scale;
            attn_factor = if self.yarn_log_mul != 0.0 {
                let all_dims = self.yarn_log_mul;
                let mscale = if self.yarn_mscale_is_log_mul && all_dims != 1.0 {
                    all_dims
                } else {
                    1.0
                };
                get_mscale(factor, mscale) / get_mscale(factor, all_dims)
            } else {
                get_mscale(factor, 1.0)
            };
            attn_factor *= 1.0 / (1.0 + 0.1 * factor.ln());
        }
        (ext_factor, attn_factor * self.rope_attn_factor)
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

/// Reads an architecture's metadata keys (`<arch>.<key>`) with typed errors that name the key.
pub struct MetaReader<'a> {
    pub md: &'a Metadata,
    pub arch: &'static str,
}

impl<'a> MetaReader<'a> {
    pub fn new(gguf: &'a Gguf, arch: &'static str) -> MetaReader<'a> {
        MetaReader {
            md: &gguf.metadata,
            arch,
        }
    }

    /// The full key name.
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    /// An error about key `k`.
    pub fn bad(&self, k: &str, message: String) -> ModelError {
        ModelError::BadHParam {
            key: self.key(k),
            message,
        }
    }

    pub fn u32(&self, k: &str) -> Result<Option<u32>, ModelError> {
        Ok(self.md.get_u32(&self.key(k))?)
    }

    pub fn require_u32(&self, k: &str) -> Result<u32, ModelError> {
        Ok(self.md.require_u32(&self.key(k))?)
    }

    pub fn f32(&self, k: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.md.get_f32(&self.key(k))?)
    }

    pub fn require_f32(&self, k: &str) -> Result<f32, ModelError> {
        Ok(self.md.require_f32(&self.key(k))?)
    }

    pub fn bool(&self, k: &str) -> Result<Option<bool>, ModelError> {
        Ok(self.md.get_bool(&self.key(k))?)
    }

    pub fn str(&self, k: &str) -> Result<Option<&'a str>, ModelError> {
        Ok(self.md.get_str(&self.key(k))?)
    }

    /// A per-layer count: a scalar for every layer, or an array with one entry per layer;
    /// `None` when the key is absent.
    pub fn per_layer(&self, k: &str, n_layer: u32) -> Result<Option<Vec<u32>>, ModelError> {
        let Some(value) = self.md.get(&self.key(k)) else {
            return Ok(None);
        };
        let values: Vec<u32> = match value {
            Value::Array(a) => {
                if a.len() != n_layer as usize {
                    return Err(self.bad(k, format!("{} entries for {n_layer} layers", a.len())));
                }
                let ints: Option<Vec<u32>> = match a {
                    Array::U32(v) => Some(v.clone()),
                    Array::I32(v) => v.iter().map(|&x| u32::try_from(x).ok()).collect(),
                    _ => None,
                };
                ints.ok_or_else(|| {
                    self.bad(
                        k,
                        format!(
                            "expected non-negative integers, found {}",
                            value.type_description()
                        ),
                    )
                })?
            }
            v => {
                let n = v.as_u64().and_then(|x| u32::try_from(x).ok());
                vec![
                    n.ok_or_else(|| self.bad(
                        k,
                        format!("expected an integer, found {}", v.type_description())
                    ))?;
                    n_layer as usize
                ]
            }
        };
        Ok(Some(values))
    }
}
