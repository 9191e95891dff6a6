//! Gemma 3, after llama.cpp's `llm_build_gemma3<iswa>`: embeddings scaled by sqrt(n_embd);
//! interleaved sliding-window and global layers with their own RoPE bases; per-head RMS norms on
//! Q and K; Q scaled by the architecture's attention scale (so the softmax scale is 1); norms
//! before and after both attention and the GELU-gated FFN; tied LM head.

use lamina_core::graph::{GluOp, TensorId};

use super::Builder;
use crate::ModelError;
use crate::weights::WeightRef;

pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    let hp = b.hp();
    let weights = b.ctx.weights;
    let attention_scale = hp
        .attention_scale
        .unwrap_or(1.0 / (hp.n_embd_head_k as f32).sqrt());
    // Weights::find requires these for gemma3; the error only guards against misuse.
    let need = |w: Option<WeightRef>, what: &str, il: usize| {
        w.ok_or_else(|| ModelError::MissingTensor(format!("blk.{il}.{what}")))
    };

    let inp = b.embeddings()?;
    let mut inp = b.g.scale(inp, (hp.n_embd as f32).sqrt())?;
    for (il, lw) in weights.layers.iter().enumerate() {
        b.begin_layer(il);
        let cur = b.rms_norm(inp, lw.attn_norm)?;
        let (q, k, v) = b.qkv(il, cur, lw)?;
        let q = b.rms_norm(q, need(lw.attn_q_norm, "attn_q_norm.weight", il)?)?;
        let q = b.rope(q, il)?;
        let k = b.rms_norm(k, need(lw.attn_k_norm, "attn_k_norm.weight", il)?)?;
        let k = b.rope(k, il)?;
        let q = b.g.scale(q, attention_scale)?;
        let mut cur = b.attention(il, q, k, v, 1.0, lw.wo, lw.bo)?;

        if il + 1 == weights.layers.len() {
            cur = b.select_outputs(cur)?;
            inp = b.select_outputs(inp)?;
        }
        let cur = b.rms_norm(
            cur,
            need(lw.attn_post_norm, "post_attention_norm.weight", il)?,
        )?;
        let sa_out = b.g.add(cur, inp)?;

        let cur = b.rms_norm(sa_out, lw.ffn_norm)?;
        let cur = b.gated_ffn(cur, lw, GluOp::GeGlu)?;
        let cur = b.rms_norm(cur, need(lw.ffn_post_norm, "post_ffw_norm.weight", il)?)?;
        inp = b.g.add(cur, sa_out)?;
    }
    // llama.cpp soft-caps logits only in the variant without sliding windows, which
    // HParams refuses for now.
    b.logits(inp)
}
