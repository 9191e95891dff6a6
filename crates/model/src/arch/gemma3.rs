//! Gemma 3, after llama.cpp's `llama_model_gemma3` (`graph<iswa>`): embeddings scaled by
//! sqrt(n_embd); interleaved sliding-window and global layers with their own RoPE bases;
//! per-head RMS norms on Q and K; Q scaled by the architecture's attention scale (so the softmax
//! scale is 1); norms before and after both attention and the GELU-gated FFN; tied LM head.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::{Architecture, AttnParams, Builder, FfnAct, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, FfnWeights, Linear, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct Gemma3 {
    hp: HParams,
    /// Q is scaled by this before attention.
    attention_scale: f32,
    /// Logits are soft-capped to this when non-zero.
    final_softcap: f32,
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
    attn_post_norm: NormWeights,
    ffn_norm: NormWeights,
    ffn: FfnWeights,
    ffn_post_norm: NormWeights,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "gemma3");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    // llama.cpp: with a window, sliding on all but every sixth layer (unless the file says
    // which), with RoPE base 10000 unless the file gives one.
    let n_swa = r.u32("attention.sliding_window")?.unwrap_or(0);
    if n_swa > 0 {
        hp.set_swa(&r, n_swa, 6, false)?;
        hp.rope_freq_base_swa = r.f32("rope.freq_base_swa")?.unwrap_or(10000.0);
        hp.rope_freq_scale_swa = 1.0;
    }
    let final_softcap = r.f32("final_logit_softcapping")?.unwrap_or(0.0);
    // Gemma 3 27B (62 layers) scales by n_embd / n_head instead of the head size, as
    // llama.cpp decides from the layer count.
    let scale_dim = if hp.n_layer == 62 {
        hp.n_embd / hp.n_head[0]
    } else {
        hp.n_embd_head_k
    };
    let attention_scale = 1.0 / (scale_dim as f32).sqrt();

    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let head_k = hp.n_embd_head_k as u64;
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            Ok(Layer {
                attn_norm: t.norm(&blk(il, "attn_norm"), n_embd)?,
                attn: t.attention(&hp, il)?,
                attn_q_norm: t.norm(&blk(il, "attn_q_norm"), head_k)?,
                attn_k_norm: t.norm(&blk(il, "attn_k_norm"), head_k)?,
                attn_post_norm: t.norm(&blk(il, "post_attention_norm"), n_embd)?,
                ffn_norm: t.norm(&blk(il, "ffn_norm"), n_embd)?,
                // llama.cpp's gemma3 graph applies no FFN biases or scales.
                ffn: t.ffn(&hp, il, hp.n_ff[il], true)?.plain(),
                ffn_post_norm: t.norm(&blk(il, "post_ffw_norm"), n_embd)?,
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Box::new(Gemma3 {
        attention_scale,
        final_softcap,
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head: t.lm_head(&hp, tok_embd)?,
        layers,
        hp,
    }))
}

impl Architecture for Gemma3 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let hp = &self.hp;
        let inp = b.embeddings(self.tok_embd)?;
        let mut inp = b.g.scale(inp, (hp.n_embd as f32).sqrt())?;
        for (il, lw) in self.layers.iter().enumerate() {
            b.begin_layer(il);
            let cur = b.norm(inp, &lw.attn_norm, NormKind::Rms)?;
            let (q, k, v) = b.qkv(il, cur, &lw.attn)?;
            let q = b.norm(q, &lw.attn_q_norm, NormKind::Rms)?;
            let q = b.rope(q, il, None)?;
            let k = b.norm(k, &lw.attn_k_norm, NormKind::Rms)?;
            let k = b.rope(k, il, None)?;
            let q = b.g.scale(q, self.attention_scale)?;
            let params = AttnParams::scaled(1.0);
            let mut cur = b.attention(il, q, k, v, params, &lw.attn.wo)?;
            if b.is_last_layer(il) {
                cur = b.select_outputs(cur)?;
                inp = b.select_outputs(inp)?;
            }
            let cur = b.norm(cur, &lw.attn_post_norm, NormKind::Rms)?;
            let sa_out = b.g.add(cur, inp)?;

            let cur = b.norm(sa_out, &lw.ffn_norm, NormKind::Rms)?;
            let cur = b.ffn(cur, &lw.ffn, FfnAct::Gelu)?;
            let cur = b.norm(cur, &lw.ffn_post_norm, NormKind::Rms)?;
            inp = b.g.add(cur, sa_out)?;
        }
        let out = b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)?;
        if self.final_softcap == 0.0 || b.shape.embeddings {
            return Ok(out);
        }
        b.softcap(out, self.final_softcap)
    }
}
