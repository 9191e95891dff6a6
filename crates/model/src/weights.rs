//! Finding weight tensors by llama.cpp's names and checking them against the shapes the
//! hyperparameters imply, before anything is computed; and the weight groups that several
//! architectures share (a linear map with its optional bias and scale, attention projections,
//! feed-forward networks). Each architecture module declares its own typed weights from these.

use lamina_core::DType;
use lamina_core::quant;
use lamina_gguf::{Gguf, TensorInfo};

use crate::{HParams, ModelError};

/// Where a weight's bytes are in the model file, and what they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightRef {
    pub dtype: DType,
    /// Shape, innermost first; unused dimensions are 1.
    pub ne: [usize; 4],
    /// Byte offset from the start of the file.
    pub offset: usize,
}

/// A linear map `w · x`, then `* scale` (a per-tensor `{1}` scale, llama.cpp's `*_s` tensors),
/// then `+ b`, as llama.cpp's `build_lora_mm` and the bias add after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Linear {
    pub w: WeightRef,
    pub b: Option<WeightRef>,
    pub scale: Option<WeightRef>,
}

impl Linear {
    /// The map without its bias (for graphs that do not add one).
    pub fn no_bias(self) -> Linear {
        Linear { b: None, ..self }
    }

    /// The map without its bias or scale (for graphs that apply neither).
    pub fn plain(self) -> Linear {
        Linear {
            b: None,
            scale: None,
            ..self
        }
    }
}

impl FfnWeights {
    /// The network without biases (for graphs that apply only the scales).
    pub fn no_bias(self) -> FfnWeights {
        FfnWeights {
            up: self.up.no_bias(),
            gate: self.gate.map(Linear::no_bias),
            down: self.down.no_bias(),
        }
    }

    /// The network without biases or scales (for graphs that apply neither).
    pub fn plain(self) -> FfnWeights {
        FfnWeights {
            up: self.up.plain(),
            gate: self.gate.map(Linear::plain),
            down: self.down.plain(),
        }
    }
}

/// A norm's weight and optional bias (layer norms have one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NormWeights {
    pub w: WeightRef,
    pub b: Option<WeightRef>,
}

/// Q, K and V projections: separate, or one fused `attn_qkv` matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::large_enum_variant)] // one per layer, made once at load
pub enum Qkv {
    Separate { q: Linear, k: Linear, v: Linear },
    Fused(Linear),
}

/// A layer's attention projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnWeights {
    pub qkv: Qkv,
    pub wo: Linear,
}

/// A feed-forward network's matrices: `down(act(gate(x)) * up(x))`, or `down(act(up(x)))`
/// without a gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FfnWeights {
    pub up: Linear,
    pub gate: Option<Linear>,
    pub down: Linear,
}

/// One stack of expert matrices `[n_in, n_out, n_expert]` (`*_exps.weight`), with optional
/// per-expert biases `[n_out, n_expert]` and per-expert scales `[n_expert]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    pub w: WeightRef,
    pub b: Option<WeightRef>,
    pub scale: Option<WeightRef>,
}

impl Experts {
    /// The stack without its biases.
    pub fn no_bias(self) -> Experts {
        Experts { b: None, ..self }
    }

    /// The stack without biases or scales.
    pub fn plain(self) -> Experts {
        Experts {
            b: None,
            scale: None,
            ..self
        }
    }
}

/// A mixture-of-experts feed-forward layer: the router (`ffn_gate_inp`, optional bias) and the
/// expert stacks; `gate` is absent for ungated experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeWeights {
    pub router: Linear,
    /// The up stack, or with `merged_gate_up` the gate and up stacks side by side
    /// (`ffn_gate_up_exps`, `[n_embd, 2 * n_ff, n_expert]`: gate first).
    pub up: Experts,
    pub gate: Option<Experts>,
    pub merged_gate_up: bool,
    pub down: Experts,
    /// Expert-selection bias (DeepSeek V3's `exp_probs_b`), added for choosing only.
    pub selection_bias: Option<WeightRef>,
}

impl MoeWeights {
    /// The experts and router without biases or scales.
    pub fn plain(self) -> MoeWeights {
        MoeWeights {
            up: self.up.plain(),
            gate: self.gate.map(Experts::plain),
            down: self.down.plain(),
            router: self.router.plain(),
            ..self
        }
    }

    /// The experts and router without biases (expert scales kept).
    pub fn no_bias(self) -> MoeWeights {
        MoeWeights {
            up: self.up.no_bias(),
            gate: self.gate.map(Experts::no_bias),
            down: self.down.no_bias(),
            router: self.router.no_bias(),
            ..self
        }
    }
}

/// Looks up tensors of a GGUF file by name, checking shape and type.
pub struct TensorLoader<'a> {
    gguf: &'a Gguf,
}

/// `blk.{il}.{name}`.
pub fn blk(il: usize, name: &str) -> String {
    format!("blk.{il}.{name}")
}

impl<'a> TensorLoader<'a> {
    pub fn new(gguf: &'a Gguf) -> TensorLoader<'a> {
        TensorLoader { gguf }
    }

    /// The tensor `name` with shape `shape` (innermost first), if present.
    pub fn optional(&self, name: &str, shape: &[u64]) -> Result<Option<WeightRef>, ModelError> {
        match self.gguf.tensor(name) {
            None => Ok(None),
            Some(info) => self.check(info, shape).map(Some),
        }
    }

    /// The tensor `name`, which must be present.
    pub fn get(&self, name: &str, shape: &[u64]) -> Result<WeightRef, ModelError> {
        self.optional(name, shape)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
    }

    /// Whether the file has a tensor called `name`.
    pub fn has(&self, name: &str) -> bool {
        self.gguf.tensor(name).is_some()
    }

    /// `{prefix}.weight` of shape `[n_in, n_out]`, with its optional `{prefix}.bias` `[n_out]`
    /// and `{prefix}.scale` `[1]`.
    pub fn linear(&self, prefix: &str, n_in: u64, n_out: u64) -> Result<Linear, ModelError> {
        Ok(Linear {
            w: self.get(&format!("{prefix}.weight"), &[n_in, n_out])?,
            b: self.optional(&format!("{prefix}.bias"), &[n_out])?,
            scale: self.optional(&format!("{prefix}.scale"), &[1])?,
        })
    }

    /// As [`TensorLoader::linear`], `None` when `{prefix}.weight` is absent.
    pub fn optional_linear(
        &self,
        prefix: &str,
        n_in: u64,
        n_out: u64,
    ) -> Result<Option<Linear>, ModelError> {
        if !self.has(&format!("{prefix}.weight")) {
            return Ok(None);
        }
        self.linear(prefix, n_in, n_out).map(Some)
    }

    /// A norm's `{prefix}.weight` `[n]` (no bias, whatever the file holds: the graphs that
    /// use RMS norms add none).
    pub fn norm(&self, prefix: &str, n: u64) -> Result<NormWeights, ModelError> {
        Ok(NormWeights {
            w: self.get(&format!("{prefix}.weight"), &[n])?,
            b: None,
        })
    }

    /// A layer norm's `{prefix}.weight` and `{prefix}.bias`, both `[n]` and required.
    pub fn norm_with_bias(&self, prefix: &str, n: u64) -> Result<NormWeights, ModelError> {
        Ok(NormWeights {
            w: self.get(&format!("{prefix}.weight"), &[n])?,
            b: Some(self.get(&format!("{prefix}.bias"), &[n])?),
        })
    }

    /// `{prefix}.bias` `[n]`, if present.
    pub fn bias(&self, prefix: &str, n: u64) -> Result<Option<WeightRef>, ModelError> {
        self.optional(&format!("{prefix}.bias"), &[n])
    }

    /// Layer `il`'s attention projections: fused `attn_qkv` if the file has it, else
    /// `attn_q`/`attn_k`/`attn_v`, each with its optional bias and scale (llama.cpp's
    /// `create_tensor_qkv`); then `attn_output` with its optional scale and no bias (an
    /// architecture whose graph adds one sets it).
    pub fn attention(&self, hp: &HParams, il: usize) -> Result<AttnWeights, ModelError> {
        let n_embd = hp.n_embd as u64;
        let n_q = hp.n_embd_q(il) as u64;
        let n_k = hp.n_embd_k_gqa(il) as u64;
        let n_v = hp.n_embd_v_gqa(il) as u64;
        let n_v_out = (hp.n_head[il] * hp.n_embd_head_v) as u64;
        let qkv = match self.optional_linear(&blk(il, "attn_qkv"), n_embd, n_q + n_k + n_v)? {
            Some(fused) => Qkv::Fused(fused),
            None => Qkv::Separate {
                q: self.linear(&blk(il, "attn_q"), n_embd, n_q)?,
                k: self.linear(&blk(il, "attn_k"), n_embd, n_k)?,
                v: self.linear(&blk(il, "attn_v"), n_embd, n_v)?,
            },
        };
        Ok(AttnWeights {
            qkv,
            wo: self
                .linear(&blk(il, "attn_output"), n_v_out, n_embd)?
                .no_bias(),
        })
    }

    /// Layer `il`'s feed-forward network of width `n_ff`, with a gate matrix when `gated`;
    /// each matrix with its optional bias and scale (an architecture whose graph applies
    /// neither takes [`FfnWeights::plain`]).
    pub fn ffn(
        &self,
        hp: &HParams,
        il: usize,
        n_ff: u32,
        gated: bool,
    ) -> Result<FfnWeights, ModelError> {
        let (n_embd, n_ff) = (hp.n_embd as u64, n_ff as u64);
        if n_ff == 0 {
            return Err(ModelError::BadHParam {
                key: format!("{}.feed_forward_length", hp.arch),
                message: format!("layer {il} has no feed-forward width"),
            });
        }
        Ok(FfnWeights {
            up: self.linear(&blk(il, "ffn_up"), n_embd, n_ff)?,
            gate: if gated {
                Some(self.linear(&blk(il, "ffn_gate"), n_embd, n_ff)?)
            } else {
                None
            },
            down: self.linear(&blk(il, "ffn_down"), n_ff, n_embd)?,
        })
    }

    /// `{prefix}.weight` `[n_in, n_out, n_expert]` with its optional per-expert bias and scale.
    pub fn experts(
        &self,
        prefix: &str,
        n_in: u64,
        n_out: u64,
        n_expert: u64,
    ) -> Result<Experts, ModelError> {
        Ok(Experts {
            w: self.get(&format!("{prefix}.weight"), &[n_in, n_out, n_expert])?,
            b: self.optional(&format!("{prefix}.bias"), &[n_out, n_expert])?,
            scale: self.optional(&format!("{prefix}.scale"), &[n_expert])?,
        })
    }

    /// Layer `il`'s experts (`ffn_{up,gate,down}_exps`, width `n_ff_exp`; with `may_merge`, a
    /// merged `ffn_gate_up_exps` if the file has one) and router (`ffn_gate_inp` with its
    /// optional bias), everything optional included (an architecture whose graph ignores some
    /// takes [`MoeWeights::plain`] or sets them to `None`).
    pub fn moe(
        &self,
        hp: &HParams,
        il: usize,
        n_ff_exp: u32,
        (gated, may_merge): (bool, bool),
    ) -> Result<MoeWeights, ModelError> {
        let n_expert = hp.n_expert;
        let (n_embd, n_ff, n_expert) = (hp.n_embd as u64, n_ff_exp as u64, n_expert as u64);
        if n_ff == 0 {
            return Err(ModelError::BadHParam {
                key: format!("{}.expert_feed_forward_length", hp.arch),
                message: format!("layer {il} has no expert width"),
            });
        }
        let router = self.linear(&blk(il, "ffn_gate_inp"), n_embd, n_expert)?;
        let router = Linear {
            scale: None,
            ..router
        };
        // llama.cpp's `create_tensor_gate_up_exps`: a merged gate-up stack if the file has one.
        let merged = gated && may_merge && self.has(&blk(il, "ffn_gate_up_exps.weight"));
        let (up, gate) = if merged {
            let up = self.experts(&blk(il, "ffn_gate_up_exps"), n_embd, 2 * n_ff, n_expert)?;
            (up, None)
        } else {
            let up = self.experts(&blk(il, "ffn_up_exps"), n_embd, n_ff, n_expert)?;
            let gate = if gated {
                Some(self.experts(&blk(il, "ffn_gate_exps"), n_embd, n_ff, n_expert)?)
            } else {
                None
            };
            (up, gate)
        };
        Ok(MoeWeights {
            router,
            up,
            gate,
            merged_gate_up: merged,
            down: self.experts(&blk(il, "ffn_down_exps"), n_ff, n_embd, n_expert)?,
            selection_bias: self.optional(&blk(il, "exp_probs_b.bias"), &[n_expert])?,
        })
    }

    /// `token_embd.weight` `[n_embd, n_vocab]`.
    pub fn token_embd(&self, hp: &HParams) -> Result<WeightRef, ModelError> {
        self.get("token_embd.weight", &[hp.n_embd as u64, hp.n_vocab as u64])
    }

    /// The LM head: `output.weight` (no bias: an architecture whose graph adds one sets it; no
    /// scale: llama.cpp reads `output.scale` only for NVFP4 files), else the token embeddings
    /// (tied).
    pub fn lm_head(&self, hp: &HParams, tok_embd: WeightRef) -> Result<Linear, ModelError> {
        let (n_embd, n_vocab) = (hp.n_embd as u64, hp.n_vocab as u64);
        Ok(self
            .optional_linear("output", n_embd, n_vocab)?
            .map(Linear::plain)
            .unwrap_or(Linear {
                w: tok_embd,
                b: None,
                scale: None,
            }))
    }

    fn check(&self, info: &TensorInfo, shape: &[u64]) -> Result<WeightRef, ModelError> {
        let mut expected = [1u64; 4];
        expected[..shape.len()].copy_from_slice(shape);
        if info.shape != expected {
            return Err(ModelError::BadShape {
                name: info.name.clone(),
                expected: shape.to_vec(),
                actual: info.dims().to_vec(),
            });
        }
        // Norm vectors, biases and scales are used element-wise in f32; matrices need a dot
        // product.
        let usable = if shape.len() == 1 {
            info.dtype == DType::F32
        } else {
            quant::vec_dot_type(info.dtype).is_some() && quant::supports_dequantize(info.dtype)
        };
        if !usable {
            return Err(ModelError::UnsupportedType {
                name: info.name.clone(),
                dtype: info.dtype,
            });
        }
        let to_usize = |v: u64| {
            usize::try_from(v).map_err(|_| ModelError::BadShape {
                name: info.name.clone(),
                expected: shape.to_vec(),
                actual: info.dims().to_vec(),
            })
        };
        Ok(WeightRef {
            dtype: info.dtype,
            ne: [
                to_usize(expected[0])?,
                to_usize(expected[1])?,
                to_usize(expected[2])?,
                to_usize(expected[3])?,
            ],
            offset: to_usize(self.gguf.data_offset + info.offset)?,
        })
    }
}
