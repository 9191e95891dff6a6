//! The pre-norm decoder layer most architectures are made of (llama, qwen2/3 and their MoE
//! variants, starcoder2, phi3, mistral3): `h = x + attn(norm(x))`, `out = h + ffn(norm(h))`,
//! with the variations they differ by as options.

use lamina_core::graph::TensorId;

use super::{AttnParams, Builder, NormKind};
use crate::ModelError;
use crate::weights::{AttnWeights, NormWeights, WeightRef};

/// One pre-norm layer's attention half and the norm before its FFN.
pub struct PreNormLayer<'a> {
    pub norm: NormKind,
    pub attn_norm: &'a NormWeights,
    pub attn: &'a AttnWeights,
    /// Per-head norms of Q and K before RoPE (qwen3).
    pub qk_norm: Option<(&'a NormWeights, &'a NormWeights)>,
    /// RoPE frequency factors (llama 3's, phi3's long or short ones).
    pub rope_factors: Option<WeightRef>,
    /// Q scaled after RoPE (phi3), before the attention temperature.
    pub q_scale: Option<f32>,
    /// Q multiplied by a per-position temperature `(scale, floor_scale)` after RoPE (mistral3).
    pub attn_temperature: Option<(f32, u32)>,
    pub attn_params: AttnParams,
    pub ffn_norm: &'a NormWeights,
}

impl Builder<'_> {
    /// Layer `il` on `inp`, with `ffn` building the feed-forward part on the normed input.
    pub fn prenorm_layer(
        &mut self,
        il: usize,
        mut inp: TensorId,
        l: &PreNormLayer<'_>,
        ffn: impl FnOnce(&mut Self, TensorId) -> Result<TensorId, ModelError>,
    ) -> Result<TensorId, ModelError> {
        self.begin_layer(il);
        let cur = self.norm(inp, l.attn_norm, l.norm)?;
        let (mut q, mut k, v) = self.qkv(il, cur, l.attn)?;
        if let Some((qn, kn)) = l.qk_norm {
            q = self.norm(q, qn, NormKind::Rms)?;
            q = self.rope(q, il, l.rope_factors)?;
            k = self.norm(k, kn, NormKind::Rms)?;
            k = self.rope(k, il, l.rope_factors)?;
        } else {
            q = self.rope(q, il, l.rope_factors)?;
            k = self.rope(k, il, l.rope_factors)?;
        }
        if let Some(s) = l.q_scale {
            q = self.g.scale(q, s)?;
        }
        if let Some((scale, floor_scale)) = l.attn_temperature {
            let temp = self.inp_attn_temperature(scale, floor_scale)?;
            q = self.g.mul(q, temp)?;
        }
        let mut cur = self.attention(il, q, k, v, l.attn_params, &l.attn.wo)?;
        if self.is_last_layer(il) {
            cur = self.select_outputs(cur)?;
            inp = self.select_outputs(inp)?;
        }
        let ffn_inp = self.g.add(cur, inp)?;
        let cur = self.norm(ffn_inp, l.ffn_norm, l.norm)?;
        let cur = ffn(self, cur)?;
        Ok(self.g.add(cur, ffn_inp)?)
    }
}
