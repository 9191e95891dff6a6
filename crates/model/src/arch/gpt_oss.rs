//! gpt-oss, after llama.cpp's `llama_model_openai_moe`: alternating sliding-window and global
//! layers, attention with per-head sinks and an output bias, and a mixture of experts with a
//! biased router, top-k before the softmax, per-expert biases and the clamped SwiGLU
//! (alpha 1.702, limit 7). The wanted rows are kept after the last layer, before the final
//! norm, as llama.cpp does.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::moe::{Gating, MoeAct, MoeParams};
use super::qwen3moe::require_experts;
use super::{Architecture, AttnParams, Builder, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, Linear, MoeWeights, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct GptOss {
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
    sinks: WeightRef,
    attn_post_norm: NormWeights,
    moe: MoeWeights,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "gpt-oss");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    super::require_whole_head_rope(&r, &hp)?;
    require_experts(&r, &hp)?;
    let n_ff_exp = r
        .per_layer("expert_feed_forward_length", hp.n_layer)?
        .ok_or_else(|| {
            ModelError::from(lamina_gguf::MetadataError::Missing(
                r.key("expert_feed_forward_length"),
            ))
        })?;
    let n_swa = r.require_u32("attention.sliding_window")?;
    hp.set_swa(&r, n_swa, 2, false)?;
    hp.rope_freq_base_swa = r.f32("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
    hp.rope_freq_scale_swa = hp.rope_freq_scale;

    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let n_expert = hp.n_expert as u64;
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            let mut attn = t.attention(&hp, il)?;
            attn.wo.b = Some(t.get(&blk(il, "attn_output.bias"), &[n_embd])?);
            let n_ff = n_ff_exp[il];
            let mut moe = t.moe(&hp, il, n_ff, (true, false))?;
            // Router and expert biases are required; the graph applies no expert scales.
            let bias = |name: &str, shape: &[u64]| t.get(&blk(il, name), shape);
            moe.router.b = Some(bias("ffn_gate_inp.bias", &[n_expert])?);
            moe.up.b = Some(bias("ffn_up_exps.bias", &[n_ff as u64, n_expert])?);
            moe.down.b = Some(bias("ffn_down_exps.bias", &[n_embd, n_expert])?);
            if let Some(g) = &mut moe.gate {
                g.b = Some(bias("ffn_gate_exps.bias", &[n_ff as u64, n_expert])?);
                g.scale = None;
            }
            moe.up.scale = None;
            moe.down.scale = None;
            moe.selection_bias = None;
            Ok(Layer {
                attn_norm: t.norm(&blk(il, "attn_norm"), n_embd)?,
                attn,
                sinks: t.get(&blk(il, "attn_sinks.weight"), &[hp.n_head[il] as u64])?,
                attn_post_norm: t.norm(&blk(il, "post_attention_norm"), n_embd)?,
                moe,
            })
        })
        .collect::<Result<_, ModelError>>()?;
    // The LM head is required (never tied).
    let lm_head = t.linear("output", n_embd, hp.n_vocab as u64)?.plain();
    Ok(Box::new(GptOss {
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head,
        layers,
        hp,
    }))
}

impl Architecture for GptOss {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let kq_scale = 1.0 / (self.hp.n_rot as f32).sqrt();
        let params = MoeParams {
            n_expert: self.hp.n_expert as usize,
            n_expert_used: self.hp.n_expert_used as usize,
            act: MoeAct::SwiGluOai,
            norm_weights: false,
            weights_scale: 0.0,
            gating: Gating::SoftmaxWeight,
        };
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            b.begin_layer(il);
            let cur = b.norm(inp, &lw.attn_norm, NormKind::Rms)?;
            let (q, k, v) = b.qkv(il, cur, &lw.attn)?;
            let q = b.rope(q, il, None)?;
            let k = b.rope(k, il, None)?;
            let attn = AttnParams {
                sinks: Some(lw.sinks),
                ..AttnParams::scaled(kq_scale)
            };
            let cur = b.attention(il, q, k, v, attn, &lw.attn.wo)?;
            let ffn_inp = b.g.add(cur, inp)?;
            let cur = b.norm(ffn_inp, &lw.attn_post_norm, NormKind::Rms)?;
            let cur = b.moe_ffn(cur, &lw.moe, params)?;
            inp = b.g.add(cur, ffn_inp)?;
        }
        let inp = b.select_outputs(inp)?;
        b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)
    }
}
