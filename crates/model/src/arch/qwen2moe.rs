//! Qwen 2 MoE (Qwen1.5-MoE), after llama.cpp's `llama_model_qwen2moe`: the qwen2 attention
//! block and a softmax-routed mixture of SwiGLU experts (weights not normalised, no expert
//! scales) plus a shared expert gated per token by `sigmoid(gate_inp_shexp · x)`.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::layer::PreNormLayer;
use super::moe::{Gating, MoeAct, MoeParams};
use super::qwen3moe::{n_ff_exp, require_experts};
use super::{Architecture, AttnParams, Builder, FfnAct, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{
    AttnWeights, FfnWeights, Linear, MoeWeights, NormWeights, TensorLoader, WeightRef, blk,
};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct Qwen2Moe {
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
    ffn_norm: NormWeights,
    moe: MoeWeights,
    /// `[n_embd]`: the shared expert's per-token gate logit.
    shexp_gate_inp: WeightRef,
    shexp: FfnWeights,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "qwen2moe");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    super::require_whole_head_rope(&r, &hp)?;
    require_experts(&r, &hp)?;
    let n_ff_shexp = r.u32("expert_shared_feed_forward_length")?.unwrap_or(0);
    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            let n_ff = n_ff_exp(&r, &hp, il)?;
            let n_shexp = if n_ff_shexp > 0 {
                n_ff_shexp
            } else {
                hp.n_ff[il]
            };
            let shexp = FfnWeights {
                up: t.linear(&blk(il, "ffn_up_shexp"), n_embd, n_shexp as u64)?,
                gate: Some(t.linear(&blk(il, "ffn_gate_shexp"), n_embd, n_shexp as u64)?),
                down: t.linear(&blk(il, "ffn_down_shexp"), n_shexp as u64, n_embd)?,
            };
            Ok(Layer {
                attn_norm: t.norm(&blk(il, "attn_norm"), n_embd)?,
                attn: t.attention(&hp, il)?,
                ffn_norm: t.norm(&blk(il, "ffn_norm"), n_embd)?,
                // No expert biases or scales in llama.cpp's qwen2moe graph.
                moe: t.moe(&hp, il, n_ff, (true, false))?.plain(),
                shexp_gate_inp: t.get(&blk(il, "ffn_gate_inp_shexp.weight"), &[n_embd])?,
                shexp: shexp.plain(),
            })
        })
        .collect::<Result<_, ModelError>>()?;
    // The LM head is required (never tied).
    let lm_head = t.linear("output", n_embd, hp.n_vocab as u64)?.plain();
    Ok(Box::new(Qwen2Moe {
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head,
        layers,
        hp,
    }))
}

impl Architecture for Qwen2Moe {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let kq_scale = 1.0 / (self.hp.n_embd_head_k as f32).sqrt();
        let params = MoeParams::new(&self.hp, MoeAct::Silu, Gating::Softmax);
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            let layer = PreNormLayer {
                norm: NormKind::Rms,
                attn_norm: &lw.attn_norm,
                attn: &lw.attn,
                qk_norm: None,
                rope_factors: None,
                q_scale: None,
                attn_temperature: None,
                attn_params: AttnParams::scaled(kq_scale),
                ffn_norm: &lw.ffn_norm,
            };
            inp = b.prenorm_layer(il, inp, &layer, |b, x| {
                let moe_out = b.moe_ffn(x, &lw.moe, params)?;
                // The shared expert, gated by sigmoid(logit), computed as silu(l) / l like
                // llama.cpp.
                let gate_w = b.weight(lw.shexp_gate_inp)?;
                let gate_logit = b.g.mul_mat(gate_w, x)?; // [1, n_tokens]
                let silu = b.g.silu(gate_logit)?;
                let gate = b.g.div(silu, gate_logit)?;
                let shexp = b.ffn(x, &lw.shexp, FfnAct::Silu)?;
                let shexp = b.g.mul(shexp, gate)?;
                Ok(b.g.add(moe_out, shexp)?)
            })?;
        }
        b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)
    }
}
