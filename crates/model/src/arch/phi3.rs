//! Phi-3 / 3.5, after llama.cpp's `llama_model_phi3`: RMS norms, NeoX RoPE with the long or
//! short frequency factors (long when the context is longer than the training one), Q scaled
//! before attention, and an FFN whose `up` holds gate and up (fused SwiGLU). llama.cpp runs it
//! without sliding windows.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::layer::PreNormLayer;
use super::{Architecture, AttnParams, Builder, FfnAct, KShiftRope, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, FfnWeights, Linear, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct Phi3 {
    hp: HParams,
    tok_embd: WeightRef,
    output_norm: NormWeights,
    lm_head: Linear,
    rope_long: Option<WeightRef>,
    rope_short: Option<WeightRef>,
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
    let r = MetaReader::new(gguf, "phi3");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    if hp.n_embd_head_k != hp.n_embd_head_v {
        return Err(r.bad(
            "attention.value_length",
            "phi3 needs one head size for K and V".into(),
        ));
    }
    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let tok_embd = t.token_embd(&hp)?;
    let n_factors = [hp.n_rot as u64 / 2];
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            let n_ff = hp.n_ff[il];
            // `ffn_up` is gate and up side by side; no FFN biases or scales in the graph.
            let up = t.linear(&blk(il, "ffn_up"), n_embd, 2 * n_ff as u64)?;
            let down = t.linear(&blk(il, "ffn_down"), n_ff as u64, n_embd)?;
            Ok(Layer {
                attn_norm: t.norm(&blk(il, "attn_norm"), n_embd)?,
                attn: t.attention(&hp, il)?,
                ffn_norm: t.norm(&blk(il, "ffn_norm"), n_embd)?,
                ffn: FfnWeights {
                    up,
                    gate: None,
                    down,
                }
                .plain(),
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Box::new(Phi3 {
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head: t.lm_head(&hp, tok_embd)?,
        rope_long: t.optional("rope_factors_long.weight", &n_factors)?,
        rope_short: t.optional("rope_factors_short.weight", &n_factors)?,
        layers,
        hp,
    }))
}

impl Architecture for Phi3 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let factors = self.rope_factors(b.ctx.kv.size());
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            let layer = PreNormLayer {
                norm: NormKind::Rms,
                attn_norm: &lw.attn_norm,
                attn: &lw.attn,
                qk_norm: None,
                rope_factors: factors,
                q_scale: Some(1.0 / (self.hp.n_embd_head_k as f32).sqrt()),
                attn_temperature: None,
                attn_params: AttnParams::scaled(1.0),
                ffn_norm: &lw.ffn_norm,
            };
            inp = b.prenorm_layer(il, inp, &layer, |b, x| {
                b.ffn(x, &lw.ffn, FfnAct::SwiGluFused)
            })?;
        }
        b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)
    }

    fn k_shift_rope(&self, _il: usize, kv_size: usize) -> Option<KShiftRope> {
        Some(KShiftRope {
            factors: self.rope_factors(kv_size),
            ..KShiftRope::default()
        })
    }
}

impl Phi3 {
    /// llama.cpp's `get_rope_factors`: long factors for contexts past the training one.
    fn rope_factors(&self, kv_size: usize) -> Option<WeightRef> {
        if kv_size > self.hp.n_ctx_orig as usize {
            self.rope_long
        } else {
            self.rope_short
        }
    }
}
