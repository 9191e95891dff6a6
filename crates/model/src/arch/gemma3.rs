//! Gemma 3, after llama.cpp's `llm_build_gemma3<iswa>`: embeddings scaled by sqrt(n_embd);
//! interleaved sliding-window and global layers with their own RoPE bases; per-head RMS norms on
//! Q and K; Q scaled by the architecture's attention scale (so the softmax scale is 1); norms
//! before and after both attention and the GELU-gated FFN; tied LM head.

use lamina_core::graph::TensorId;

use super::Builder;
use crate::ModelError;

pub(super) fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    let hp = b.hp();
    let weights = b.ctx.weights;
    let n_tokens = b.shape.n_tokens;
    let head_k = hp.n_embd_head_k as usize;
    let head_v = hp.n_embd_head_v as usize;
    let attention_scale = hp.attention_scale.unwrap_or(1.0 / (head_k as f32).sqrt());
    let missing = |what: &str, il: usize| ModelError::MissingTensor(format!("blk.{il}.{what}"));

    let inp = b.embeddings()?;
    let mut inp = b.g.scale(inp, (hp.n_embd as f32).sqrt())?;
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
        let q = b.rms_norm(
            q,
            lw.attn_q_norm
                .ok_or_else(|| missing("attn_q_norm.weight", il))?,
        )?;
        let q = b.rope(q, il)?;
        let k = b.rms_norm(
            k,
            lw.attn_k_norm
                .ok_or_else(|| missing("attn_k_norm.weight", il))?,
        )?;
        let k = b.rope(k, il)?;
        let q = b.g.scale(q, attention_scale)?;
        let mut cur = b.attention(il, q, k, v, 1.0, lw.wo, lw.bo)?;

        if il + 1 == weights.layers.len() {
            cur = b.select_outputs(cur)?;
            inp = b.select_outputs(inp)?;
        }
        let cur = b.rms_norm(
            cur,
            lw.attn_post_norm
                .ok_or_else(|| missing("post_attention_norm.weight", il))?,
        )?;
        let sa_out = b.g.add(cur, inp)?;

        let cur = b.rms_norm(sa_out, lw.ffn_norm)?;
        let gate = b.linear(cur, lw.ffn_gate, None)?;
        let up = b.linear(cur, lw.ffn_up, None)?;
        let act = b.g.geglu_split(gate, up)?;
        let cur = b.linear(act, lw.ffn_down, None)?;
        let cur = b.rms_norm(
            cur,
            lw.ffn_post_norm
                .ok_or_else(|| missing("post_ffw_norm.weight", il))?,
        )?;
        inp = b.g.add(cur, sa_out)?;
    }
    // llama.cpp soft-caps logits only in the variant without sliding windows, which
    // HParams refuses for now.
    b.logits(inp)
}
