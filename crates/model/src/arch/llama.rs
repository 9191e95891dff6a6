//! Llama (and SmolLM2, Mistral, …), after llama.cpp's `llm_build_llama`: RMS norm, grouped-query
//! attention with RoPE, a SwiGLU feed-forward network, residual adds, tied or separate LM head.

use lamina_core::graph::TensorId;

use super::Builder;
use crate::ModelError;

pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    let hp = b.hp();
    let weights = b.ctx.weights;
    let n_tokens = b.shape.n_tokens;
    let head_k = hp.n_embd_head_k as usize;
    let head_v = hp.n_embd_head_v as usize;
    let kq_scale = 1.0 / (head_k as f32).sqrt();

    let mut inp = b.embeddings()?;
    for (il, lw) in weights.layers.iter().enumerate() {
        let n_head = hp.n_head[il] as usize;
        let n_head_kv = hp.n_head_kv[il] as usize;

        let cur = b.rms_norm(inp, lw.attn_norm)?;
        let q = b.linear(cur, lw.wq, lw.bq)?;
        let k = b.linear(cur, lw.wk, lw.bk)?;
        let v = b.linear(cur, lw.wv, lw.bv)?;
        let q = b.g.reshape(q, &[head_k, n_head, n_tokens])?;
        let k = b.g.reshape(k, &[head_k, n_head_kv, n_tokens])?;
        let v = b.g.reshape(v, &[head_v, n_head_kv, n_tokens])?;
        let q = b.rope(q, il)?;
        let k = b.rope(k, il)?;
        let mut cur = b.attention(il, q, k, v, kq_scale, lw.wo, lw.bo)?;

        if il + 1 == weights.layers.len() {
            cur = b.select_outputs(cur)?;
            inp = b.select_outputs(inp)?;
        }
        let ffn_inp = b.g.add(cur, inp)?;

        let cur = b.rms_norm(ffn_inp, lw.ffn_norm)?;
        let gate = b.linear(cur, lw.ffn_gate, None)?;
        let up = b.linear(cur, lw.ffn_up, None)?;
        let act = b.g.swiglu_split(gate, up)?;
        let cur = b.linear(act, lw.ffn_down, None)?;
        inp = b.g.add(cur, ffn_inp)?;
    }
    b.logits(inp)
}
