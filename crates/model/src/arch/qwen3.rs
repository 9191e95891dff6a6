//! Qwen 3 (dense), after llama.cpp's `llama_model_qwen3`: the llama block with NeoX RoPE and
//! per-head RMS norms on Q and K before RoPE; FFN scales but no FFN biases.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::layer::PreNormLayer;
use super::{Architecture, AttnParams, Builder, FfnAct, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, FfnWeights, Linear, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct Qwen3 {
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
    ffn: FfnWeights,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "qwen3");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    super::require_whole_head_rope(&r, &hp)?;
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
                ffn_norm: t.norm(&blk(il, "ffn_norm"), n_embd)?,
                // llama.cpp's qwen3 graph applies the FFN scales, not biases.
                ffn: t.ffn(&hp, il, hp.n_ff[il], true)?.no_bias(),
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Box::new(Qwen3 {
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head: t.lm_head(&hp, tok_embd)?,
        layers,
        hp,
    }))
}

impl Architecture for Qwen3 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let kq_scale = 1.0 / (self.hp.n_embd_head_k as f32).sqrt();
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
            inp = b.prenorm_layer(il, inp, &layer, |b, x| b.ffn(x, &lw.ffn, FfnAct::Silu))?;
        }
        b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)
    }
}
