//! OLMo 2, after llama.cpp's `llama_model_olmo2`: no norm before attention; RMS norms over the
//! whole Q and K (not per head); norms after attention and after the SwiGLU FFN; NeoX RoPE;
//! optional sliding-window layers (every fourth global unless the file says otherwise), whose
//! RoPE keeps the base but drops the scaling.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::{Architecture, AttnParams, Builder, FfnAct, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, FfnWeights, Linear, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct Olmo2 {
    hp: HParams,
    tok_embd: WeightRef,
    output_norm: NormWeights,
    lm_head: Linear,
    layers: Vec<Layer>,
}

#[derive(Debug)]
struct Layer {
    attn: AttnWeights,
    attn_q_norm: NormWeights,
    attn_k_norm: NormWeights,
    attn_post_norm: NormWeights,
    ffn: FfnWeights,
    ffn_post_norm: NormWeights,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "olmo2");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    super::require_whole_head_rope(&r, &hp)?;
    let n_swa = r.u32("attention.sliding_window")?.unwrap_or(0);
    if n_swa > 0 {
        hp.set_swa(&r, n_swa, 4, false)?;
        // What llama.cpp's K-shift rotates sliding-window layers with (their graph ropes them
        // with the global base and no scaling).
        hp.rope_freq_base_swa = r.f32("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
        hp.rope_freq_scale_swa = 1.0;
    }
    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            Ok(Layer {
                attn: t.attention(&hp, il)?,
                attn_q_norm: t.norm(&blk(il, "attn_q_norm"), hp.n_embd_q(il) as u64)?,
                attn_k_norm: t.norm(&blk(il, "attn_k_norm"), hp.n_embd_k_gqa(il) as u64)?,
                attn_post_norm: t.norm(&blk(il, "post_attention_norm"), n_embd)?,
                // llama.cpp's olmo2 graph applies no FFN biases or scales.
                ffn: t.ffn(&hp, il, hp.n_ff[il], true)?.plain(),
                ffn_post_norm: t.norm(&blk(il, "post_ffw_norm"), n_embd)?,
            })
        })
        .collect::<Result<_, ModelError>>()?;
    // The LM head is required (never tied).
    let lm_head = t.linear("output", n_embd, hp.n_vocab as u64)?.plain();
    Ok(Box::new(Olmo2 {
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head,
        layers,
        hp,
    }))
}

impl Architecture for Olmo2 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let hp = &self.hp;
        let head = hp.n_embd_head_k as usize;
        let kq_scale = 1.0 / (head as f32).sqrt();
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            b.begin_layer(il);
            let (q, k, v) = b.qkv_flat(il, inp, &lw.attn)?;
            let q = b.norm(q, &lw.attn_q_norm, NormKind::Rms)?;
            let k = b.norm(k, &lw.attn_k_norm, NormKind::Rms)?;
            let (q, k, v) = (b.heads(q, head)?, b.heads(k, head)?, b.heads(v, head)?);
            // Sliding-window layers: the global base, no scaling and no YaRN (as llama.cpp's
            // graph does).
            let (scale, yarn) = if hp.swa_layers[il] {
                (1.0, (0.0, 1.0))
            } else {
                (hp.rope_freq_scale, hp.yarn_factors())
            };
            let q = b.rope_with(q, None, hp.rope_freq_base, scale, yarn)?;
            let k = b.rope_with(k, None, hp.rope_freq_base, scale, yarn)?;
            let mut cur = b.attention(il, q, k, v, AttnParams::scaled(kq_scale), &lw.attn.wo)?;
            if b.is_last_layer(il) {
                cur = b.select_outputs(cur)?;
                inp = b.select_outputs(inp)?;
            }
            let cur = b.norm(cur, &lw.attn_post_norm, NormKind::Rms)?;
            let ffn_inp = b.g.add(cur, inp)?;
            let cur = b.ffn(ffn_inp, &lw.ffn, FfnAct::Silu)?;
            let cur = b.norm(cur, &lw.ffn_post_norm, NormKind::Rms)?;
            inp = b.g.add(cur, ffn_inp)?;
        }
        b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)
    }
}
