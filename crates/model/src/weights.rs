//! The weight tensors of a model, found by llama.cpp's names and checked against the shapes the
//! hyperparameters imply, before anything is computed.

use lamina_core::DType;
use lamina_core::quant;
use lamina_gguf::{Gguf, TensorInfo};

use crate::{Arch, HParams, ModelError};

/// Where a weight's bytes are in the model file, and what they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WeightRef {
    pub dtype: DType,
    /// Shape, innermost first; unused dimensions are 1.
    pub ne: [usize; 4],
    /// Byte offset from the start of the file.
    pub offset: usize,
}

/// One transformer block's weights. Optional tensors are those only some architectures have.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub attn_norm: WeightRef,
    pub wq: WeightRef,
    pub wk: WeightRef,
    pub wv: WeightRef,
    pub wo: WeightRef,
    pub bq: Option<WeightRef>,
    pub bk: Option<WeightRef>,
    pub bv: Option<WeightRef>,
    pub bo: Option<WeightRef>,
    /// Per-head RMS norms of Q and K (gemma3).
    pub attn_q_norm: Option<WeightRef>,
    pub attn_k_norm: Option<WeightRef>,
    /// Norm applied to the attention output before the residual add (gemma3).
    pub attn_post_norm: Option<WeightRef>,
    pub ffn_norm: WeightRef,
    pub ffn_gate: WeightRef,
    pub ffn_up: WeightRef,
    pub ffn_down: WeightRef,
    /// Norm applied to the FFN output before the residual add (gemma3).
    pub ffn_post_norm: Option<WeightRef>,
}

/// All weights of a model.
#[derive(Clone, Debug)]
pub struct Weights {
    pub tok_embd: WeightRef,
    pub output_norm: WeightRef,
    /// The LM head; `None` when it is tied to `tok_embd`.
    pub output: Option<WeightRef>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// The LM head (the output matrix, or the token embeddings when tied).
    pub fn lm_head(&self) -> WeightRef {
        self.output.unwrap_or(self.tok_embd)
    }

    /// Finds every weight of `hp.arch` in `gguf` and checks its shape and type.
    pub fn find(gguf: &Gguf, hp: &HParams) -> Result<Weights, ModelError> {
        let finder = Finder { gguf };
        let n_embd = hp.n_embd as u64;
        let n_vocab = hp.n_vocab as u64;
        let tok_embd = finder.get("token_embd.weight", &[n_embd, n_vocab])?;
        let output_norm = finder.get("output_norm.weight", &[n_embd])?;
        let output = finder.optional("output.weight", &[n_embd, n_vocab])?;
        let gemma = hp.arch == Arch::Gemma3;

        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        for il in 0..hp.n_layer as usize {
            let name = |t: &str| format!("blk.{il}.{t}");
            let n_q = hp.n_embd_q(il) as u64;
            let n_k = hp.n_embd_k_gqa(il) as u64;
            let n_v = hp.n_embd_v_gqa(il) as u64;
            let n_v_out = (hp.n_head[il] * hp.n_embd_head_v) as u64;
            let n_ff = hp.n_ff[il] as u64;
            let head_k = hp.n_embd_head_k as u64;
            let get = |t: &str, shape: &[u64]| finder.get(&name(t), shape);
            let opt = |t: &str, shape: &[u64]| finder.optional(&name(t), shape);
            let need_if =
                |cond: bool, t: &str, shape: &[u64]| -> Result<Option<WeightRef>, ModelError> {
                    if cond {
                        get(t, shape).map(Some)
                    } else {
                        opt(t, shape)
                    }
                };
            layers.push(LayerWeights {
                attn_norm: get("attn_norm.weight", &[n_embd])?,
                wq: get("attn_q.weight", &[n_embd, n_q])?,
                wk: get("attn_k.weight", &[n_embd, n_k])?,
                wv: get("attn_v.weight", &[n_embd, n_v])?,
                wo: get("attn_output.weight", &[n_v_out, n_embd])?,
                bq: opt("attn_q.bias", &[n_q])?,
                bk: opt("attn_k.bias", &[n_k])?,
                bv: opt("attn_v.bias", &[n_v])?,
                bo: opt("attn_output.bias", &[n_embd])?,
                attn_q_norm: need_if(gemma, "attn_q_norm.weight", &[head_k])?,
                attn_k_norm: need_if(gemma, "attn_k_norm.weight", &[head_k])?,
                attn_post_norm: need_if(gemma, "post_attention_norm.weight", &[n_embd])?,
                ffn_norm: get("ffn_norm.weight", &[n_embd])?,
                ffn_gate: get("ffn_gate.weight", &[n_embd, n_ff])?,
                ffn_up: get("ffn_up.weight", &[n_embd, n_ff])?,
                ffn_down: get("ffn_down.weight", &[n_ff, n_embd])?,
                ffn_post_norm: need_if(gemma, "post_ffw_norm.weight", &[n_embd])?,
            });
        }
        Ok(Weights {
            tok_embd,
            output_norm,
            output,
            layers,
        })
    }
}

struct Finder<'a> {
    gguf: &'a Gguf,
}

impl Finder<'_> {
    fn optional(&self, name: &str, shape: &[u64]) -> Result<Option<WeightRef>, ModelError> {
        match self.gguf.tensor(name) {
            None => Ok(None),
            Some(info) => self.check(info, shape).map(Some),
        }
    }

    fn get(&self, name: &str, shape: &[u64]) -> Result<WeightRef, ModelError> {
        self.optional(name, shape)?
            .ok_or_else(|| ModelError::MissingTensor(name.to_string()))
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
        // Norm vectors and biases are used element-wise in f32; matrices need a dot product.
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
