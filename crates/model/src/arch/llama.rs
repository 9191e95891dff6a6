//! Llama (and SmolLM2, Mistral, …), after llama.cpp's `llm_build_llama`: RMS norm, grouped-query
//! attention with RoPE, a SwiGLU feed-forward network, residual adds, tied or separate LM head.

use lamina_core::graph::{GluOp, TensorId};

use super::Builder;
use crate::ModelError;

pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    let weights = b.ctx.weights;
    let kq_scale = 1.0 / (b.hp().n_embd_head_k as f32).sqrt();

    let mut inp = b.embeddings()?;
    for (il, lw) in weights.layers.iter().enumerate() {
        b.begin_layer(il);
        let cur = b.rms_norm(inp, lw.attn_norm)?;
        let (q, k, v) = b.qkv(il, cur, lw)?;
        let q = b.rope(q, il)?;
        let k = b.rope(k, il)?;
        let mut cur = b.attention(il, q, k, v, kq_scale, lw.wo, lw.bo)?;

        if il + 1 == weights.layers.len() {
            cur = b.select_outputs(cur)?;
            inp = b.select_outputs(inp)?;
        }
        let ffn_inp = b.g.add(cur, inp)?;

        let cur = b.rms_norm(ffn_inp, lw.ffn_norm)?;
        let cur = b.gated_ffn(cur, lw, GluOp::SwiGlu)?;
        inp = b.g.add(cur, ffn_inp)?;
    }
    b.logits(inp)
}
