//! Gemma 2, after llama.cpp's `llama_model_gemma2`: embeddings scaled by sqrt(n_embd);
//! alternating sliding-window (4096 unless the file says) and global layers; Q scaled by the
//! architecture's attention scale; attention scores and final logits soft-capped
//! (`cap * tanh(x / cap)`); norms before and after attention and the GELU-gated FFN; the LM head
//! is always the token embeddings.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::{Architecture, AttnParams, Builder, FfnAct, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, FfnWeights, Linear, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct Gemma2 {
    hp: HParams,
    attention_scale: f32,
    attn_softcap: f32,
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
    attn_post_norm: NormWeights,
    ffn_norm: NormWeights,
    ffn: FfnWeights,
    ffn_post_norm: NormWeights,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "gemma2");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    let n_swa = r.u32("attention.sliding_window")?.unwrap_or(4096);
    hp.set_swa(&r, n_swa, 2, false)?;
    hp.rope_freq_base_swa = r.f32("rope.freq_base_swa")?.unwrap_or(hp.rope_freq_base);
    hp.rope_freq_scale_swa = hp.rope_freq_scale;
    // llama.cpp's defaults when the file has no caps.
    let attn_softcap = r.f32("attn_logit_softcapping")?.unwrap_or(50.0);
    let final_softcap = r.f32("final_logit_softcapping")?.unwrap_or(30.0);
    if attn_softcap == 0.0 || final_softcap == 0.0 {
        return Err(r.bad(
            "attn_logit_softcapping",
            "gemma2 soft-caps its scores and logits; a cap of 0 is not valid".into(),
        ));
    }
    // Gemma 2 27B (46 layers) scales by n_embd / n_head, as llama.cpp decides.
    let scale_dim = if hp.n_layer == 46 {
        hp.n_embd / hp.n_head[0]
    } else {
        hp.n_embd_head_k
    };

    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            Ok(Layer {
                attn_norm: t.norm(&blk(il, "attn_norm"), n_embd)?,
                attn: t.attention(&hp, il)?,
                attn_post_norm: t.norm(&blk(il, "post_attention_norm"), n_embd)?,
                ffn_norm: t.norm(&blk(il, "ffn_norm"), n_embd)?,
                // No FFN biases or scales in llama.cpp's gemma2 graph.
                ffn: t.ffn(&hp, il, hp.n_ff[il], true)?.plain(),
                ffn_post_norm: t.norm(&blk(il, "post_ffw_norm"), n_embd)?,
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Box::new(Gemma2 {
        attention_scale: 1.0 / (scale_dim as f32).sqrt(),
        attn_softcap,
        final_softcap,
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        // Always tied, whatever `output.weight` the file holds.
        lm_head: Linear {
            w: tok_embd,
            b: None,
            scale: None,
        },
        layers,
        hp,
    }))
}

impl Architecture for Gemma2 {
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
            let q = b.rope(q, il, None)?;
            let k = b.rope(k, il, None)?;
            let q = b.g.scale(q, self.attention_scale)?;
            let params = AttnParams {
                softcap: self.attn_softcap,
                ..AttnParams::scaled(1.0)
            };
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
        if b.shape.embeddings {
            return Ok(out);
        }
        b.softcap(out, self.final_softcap)
    }
}
