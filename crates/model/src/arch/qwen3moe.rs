//! Qwen 3 MoE, after llama.cpp's `llama_model_qwen3moe`: the qwen3 attention block (per-head
//! Q/K norms, NeoX RoPE) and a softmax-routed mixture of SwiGLU experts with normalised
//! weights and per-expert scales.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::layer::PreNormLayer;
use super::moe::{Gating, MoeAct, MoeParams};
use super::{Architecture, AttnParams, Builder, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, Linear, MoeWeights, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct Qwen3Moe {
    hp: HParams,
    tok_embd: WeightRef,
    output_norm: NormWeights,
    lm_head: Linear,
    layers: Vec<Layer>,
}

#[derive(Debug)]
struct Layer {
    attn_norm: NormWeights,
    attn: AttnWeights,
    attn_q_norm: NormWeights,
    attn_k_norm: NormWeights,
    ffn_norm: NormWeights,
    moe: MoeWeights,
}

/// The experts' width: `expert_feed_forward_length`, else `n_ff / n_expert_used` (llama.cpp).
pub(super) fn n_ff_exp(r: &MetaReader<'_>, hp: &HParams, il: usize) -> Result<u32, ModelError> {
    Ok(
        match r.per_layer("expert_feed_forward_length", hp.n_layer)? {
            Some(v) if v[il] > 0 => v[il],
            _ => hp.n_ff[il] / hp.n_expert_used.max(1),
        },
    )
}

/// llama.cpp's check that a mixture-of-experts architecture has experts.
pub(super) fn require_experts(r: &MetaReader<'_>, hp: &HParams) -> Result<(), ModelError> {
    if hp.n_expert == 0 {
        return Err(r.bad("expert_count", format!("{} needs experts", hp.arch)));
    }
    Ok(())
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "qwen3moe");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    super::require_whole_head_rope(&r, &hp)?;
    require_experts(&r, &hp)?;
    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let head_k = hp.n_embd_head_k as u64;
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            let n_ff = n_ff_exp(&r, &hp, il)?;
            Ok(Layer {
                attn_norm: t.norm(&blk(il, "attn_norm"), n_embd)?,
                attn: t.attention(&hp, il)?,
                attn_q_norm: t.norm(&blk(il, "attn_q_norm"), head_k)?,
                attn_k_norm: t.norm(&blk(il, "attn_k_norm"), head_k)?,
                ffn_norm: t.norm(&blk(il, "ffn_norm"), n_embd)?,
                moe: t.moe(&hp, il, n_ff, (true, false))?.no_bias(),
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Box::new(Qwen3Moe {
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head: t.lm_head(&hp, tok_embd)?,
        layers,
        hp,
    }))
}

impl Architecture for Qwen3Moe {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let kq_scale = 1.0 / (self.hp.n_embd_head_k as f32).sqrt();
        let params = MoeParams {
            norm_weights: true,
            ..MoeParams::new(&self.hp, MoeAct::Silu, Gating::Softmax)
        };
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            let layer = PreNormLayer {
                norm: NormKind::Rms,
                attn_norm: &lw.attn_norm,
                attn: &lw.attn,
                qk_norm: Some((&lw.attn_q_norm, &lw.attn_k_norm)),
                rope_factors: None,
                q_scale: None,
                attn_temperature: None,
                attn_params: AttnParams::scaled(kq_scale),
                ffn_norm: &lw.ffn_norm,
            };
            inp = b.prenorm_layer(il, inp, &layer, |b, x| b.moe_ffn(x, &lw.moe, params))?;
        }
        b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)
    }
}
