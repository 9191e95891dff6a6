//! Phi-2, after llama.cpp's `llama_model_phi2`: layer norms with biases, partial NeoX RoPE,
//! Q scaled before attention, and a parallel block: `x + attn(norm(x)) + ffn(norm(x))` with a
//! GELU FFN without gate; biases on the attention output, the FFN and the LM head.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::{Architecture, AttnParams, Builder, FfnAct, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{AttnWeights, FfnWeights, Linear, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct Phi2 {
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
    ffn: FfnWeights,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "phi2");
    let mut hp = HParams::read_common(&r, RopeType::Neox)?;
    hp.norm_eps = r.require_f32("attention.layer_norm_epsilon")?;
    if hp.n_embd_head_k != hp.n_embd_head_v {
        return Err(r.bad(
            "attention.value_length",
            "phi2 needs one head size for K and V".into(),
        ));
    }
    let t = TensorLoader::new(gguf);
    let (n_embd, n_vocab) = (hp.n_embd as u64, hp.n_vocab as u64);
    let tok_embd = t.token_embd(&hp)?;
    let mut lm_head = t.linear("output", n_embd, n_vocab)?.plain();
    lm_head.b = Some(t.get("output.bias", &[n_vocab])?);
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            let mut attn = t.attention(&hp, il)?;
            attn.wo.b = Some(t.get(&blk(il, "attn_output.bias"), &[n_embd])?);
            let mut ffn = t.ffn(&hp, il, hp.n_ff[il], false)?;
            // llama.cpp's phi2 graph applies the FFN biases (required), not scales.
            ffn.up.b = Some(t.get(&blk(il, "ffn_up.bias"), &[hp.n_ff[il] as u64])?);
            ffn.down.b = Some(t.get(&blk(il, "ffn_down.bias"), &[n_embd])?);
            ffn.up.scale = None;
            ffn.down.scale = None;
            Ok(Layer {
                attn_norm: t.norm_with_bias(&blk(il, "attn_norm"), n_embd)?,
                attn,
                ffn,
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Box::new(Phi2 {
        tok_embd,
        output_norm: t.norm_with_bias("output_norm", n_embd)?,
        lm_head,
        layers,
        hp,
    }))
}

impl Architecture for Phi2 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let q_scale = 1.0 / (self.hp.n_embd_head_k as f32).sqrt();
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            b.begin_layer(il);
            let mut normed = b.norm(inp, &lw.attn_norm, NormKind::Layer)?;
            let (q, k, v) = b.qkv(il, normed, &lw.attn)?;
            let q = b.rope(q, il, None)?;
            let k = b.rope(k, il, None)?;
            let q = b.g.scale(q, q_scale)?;
            let params = AttnParams::scaled(1.0);
            let mut cur = b.attention(il, q, k, v, params, &lw.attn.wo)?;
            if b.is_last_layer(il) {
                cur = b.select_outputs(cur)?;
                inp = b.select_outputs(inp)?;
                normed = b.select_outputs(normed)?;
            }
            let ffn_out = b.ffn(normed, &lw.ffn, FfnAct::Gelu)?;
            let cur = b.g.add(cur, ffn_out)?;
            inp = b.g.add(cur, inp)?;
        }
        b.output(inp, &self.output_norm, NormKind::Layer, &self.lm_head)
    }
}
