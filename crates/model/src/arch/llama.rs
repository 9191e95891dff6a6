//! Llama 2/3, Mistral, SmolLM2 and other llama-shaped models, after llama.cpp's
//! `llama_model_llama`: RMS norms, RoPE on Q and K (with llama 3's frequency factors when the
//! file has them), attention over the KV cache, a SwiGLU feed-forward network, residual adds,
//! tied or separate LM head; with experts (Mixtral) a softmax-routed MoE FFN instead. `mistral3`
//! is this graph too, with an attention temperature.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::layer::PreNormLayer;
use super::moe::{Gating, MoeAct, MoeParams};
use super::{Architecture, AttnParams, Builder, FfnAct, KShiftRope, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{
    AttnWeights, FfnWeights, Linear, MoeWeights, NormWeights, TensorLoader, WeightRef, blk,
};
use crate::{HParams, ModelError};

#[derive(Debug)]
pub(super) struct Llama {
    hp: HParams,
    /// Q is multiplied by a per-position temperature (mistral3): `(scale, floor_scale)`.
    pub(super) attn_temperature: Option<(f32, u32)>,
    tok_embd: WeightRef,
    output_norm: NormWeights,
    lm_head: Linear,
    /// llama 3's RoPE frequency factors (`rope_freqs.weight`), shared by every layer.
    rope_freqs: Option<WeightRef>,
    layers: Vec<Layer>,
}

#[derive(Debug)]
struct Layer {
    attn_norm: NormWeights,
    attn: AttnWeights,
    ffn_norm: NormWeights,
    ffn: Ffn,
}

/// A dense FFN, or experts (Mixtral-style: softmax routing, normalised weights).
#[derive(Debug)]
enum Ffn {
    Dense(FfnWeights),
    Moe(MoeWeights),
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    Ok(Box::new(load_as(&MetaReader::new(gguf, "llama"), gguf)?))
}

impl Llama {
    /// For an architecture built on this one to adjust what it reads itself.
    pub(super) fn hparams_mut(&mut self) -> &mut HParams {
        &mut self.hp
    }
}

/// Loads a llama-shaped model whose keys are under `r.arch`.
pub(super) fn load_as(r: &MetaReader<'_>, gguf: &Gguf) -> Result<Llama, ModelError> {
    let mut hp = HParams::read_common(r, RopeType::Normal)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    super::require_whole_head_rope(r, &hp)?;

    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            let mut attn = t.attention(&hp, il)?;
            attn.wo.b = t.bias(&blk(il, "attn_output"), n_embd)?;
            Ok(Layer {
                attn_norm: t.norm(&blk(il, "attn_norm"), n_embd)?,
                attn,
                ffn_norm: t.norm(&blk(il, "ffn_norm"), n_embd)?,
                ffn: if hp.n_expert == 0 {
                    Ffn::Dense(t.ffn(&hp, il, hp.n_ff[il], true)?)
                } else {
                    // Expert scales, no biases; the gate stack may be absent.
                    let gated = t.has(&blk(il, "ffn_gate_exps.weight"));
                    Ffn::Moe(t.moe(&hp, il, hp.n_ff[il], (gated, false))?.no_bias())
                },
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Llama {
        attn_temperature: None,
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head: t.lm_head(&hp, tok_embd)?,
        rope_freqs: t.optional("rope_freqs.weight", &[hp.n_rot as u64 / 2])?,
        layers,
        hp,
    })
}

impl Architecture for Llama {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let kq_scale = 1.0 / (self.hp.n_embd_head_k as f32).sqrt();
        // Mixtral-style experts; llama.cpp's llama reads no expert weight scale.
        let moe = MoeParams {
            norm_weights: true,
            ..MoeParams::new(&self.hp, MoeAct::Silu, Gating::Softmax)
        };
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            let layer = PreNormLayer {
                norm: NormKind::Rms,
                attn_norm: &lw.attn_norm,
                attn: &lw.attn,
                qk_norm: None,
                rope_factors: self.rope_freqs,
                q_scale: None,
                attn_temperature: self.attn_temperature,
                attn_params: AttnParams::scaled(kq_scale),
                ffn_norm: &lw.ffn_norm,
            };
            inp = b.prenorm_layer(il, inp, &layer, |b, x| match &lw.ffn {
                Ffn::Dense(f) => b.ffn(x, f, FfnAct::Silu),
                Ffn::Moe(m) => b.moe_ffn(x, m, moe),
            })?;
        }
        b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)
    }

    fn k_shift_rope(&self, _il: usize, _kv_size: usize) -> Option<KShiftRope> {
        Some(KShiftRope {
            factors: self.rope_freqs,
            ..KShiftRope::default()
        })
    }
}
