//! StarCoder 2, after llama.cpp's `llama_model_starcoder2`: layer norms with biases, NeoX RoPE,
//! biases on the attention output and on the GELU FFN (no gate), tied or separate LM head.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::layer::PreNormLayer;
use super::{Architecture, AttnParams, Builder, FfnAct, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, FfnWeights, Linear, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct StarCoder2 {
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
    ffn: FfnWeights,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "starcoder2");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_eps = r.require_f32("attention.layer_norm_epsilon")?;
    super::require_whole_head_rope(&r, &hp)?;
    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            let n_ff = hp.n_ff[il] as u64;
            let mut attn = t.attention(&hp, il)?;
            attn.wo.b = Some(t.get(&blk(il, "attn_output.bias"), &[n_embd])?);
            // Required biases, no scales in llama.cpp's starcoder2 FFN.
            let mut ffn = t.ffn(&hp, il, hp.n_ff[il], false)?.plain();
            ffn.up.b = Some(t.get(&blk(il, "ffn_up.bias"), &[n_ff])?);
            ffn.down.b = Some(t.get(&blk(il, "ffn_down.bias"), &[n_embd])?);
            Ok(Layer {
                attn_norm: t.norm_with_bias(&blk(il, "attn_norm"), n_embd)?,
                attn,
                ffn_norm: t.norm_with_bias(&blk(il, "ffn_norm"), n_embd)?,
                ffn,
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Box::new(StarCoder2 {
        tok_embd,
        output_norm: t.norm_with_bias("output_norm", n_embd)?,
        lm_head: t.lm_head(&hp, tok_embd)?,
        layers,
        hp,
    }))
}

impl Architecture for StarCoder2 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let kq_scale = 1.0 / (self.hp.n_embd_head_k as f32).sqrt();
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            let layer = PreNormLayer {
                norm: NormKind::Layer,
                attn_norm: &lw.attn_norm,
                attn: &lw.attn,
                qk_norm: None,
                rope_factors: None,
                q_scale: None,
                attn_temperature: None,
                attn_params: AttnParams::scaled(kq_scale),
                ffn_norm: &lw.ffn_norm,
            };
            inp = b.prenorm_layer(il, inp, &layer, |b, x| b.ffn(x, &lw.ffn, FfnAct::Gelu))?;
        }
        b.output(inp, &self.output_norm, NormKind::Layer, &self.lm_head)
    }
}
