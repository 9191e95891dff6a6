//! DeepSeek V2 / V2-Lite / V3 (and GLM-4.7-Flash and other files of this architecture), after
//! llama.cpp's `llama_model_deepseek2` graph with multi-head latent attention (MLA) in its
//! absorbed form: Q through a low-rank pair (`attn_q_a`, norm, `attn_q_b`; a plain `attn_q` in
//! the Lite models), K and V compressed to one latent row per token (`attn_kv_a_mqa`, norm)
//! that the cache holds with its rotary part, Q's non-rotary part absorbed through `attn_k_b`,
//! attention over the latent (one KV head), then `attn_v_b` back to the heads. The first
//! `leading_dense_block_count` layers have a dense SwiGLU FFN, the rest a routed mixture of
//! experts (softmax or sigmoid gating, optional selection bias and group limits, normalised
//! and scaled weights) plus shared experts.

use lamina_core::graph::TensorId;
use lamina_gguf::Gguf;

use super::moe::{Gating, MoeAct, MoeParams};
use super::qwen3moe::require_experts;
use super::{Architecture, AttnParams, Builder, FfnAct, KShiftRope, NormKind};
use crate::hparams::{MetaReader, RopeType};
use crate::weights::{FfnWeights, Linear, MoeWeights, NormWeights, TensorLoader, WeightRef, blk};
use crate::{HParams, ModelError};

#[derive(Debug)]
struct DeepSeek2 {
    hp: HParams,
    kv_lora_rank: usize,
    /// Head size of Q and K before absorption, and of V after (`key_length_mla`,
    /// `value_length_mla`).
    head_k_mla: usize,
    head_v_mla: usize,
    kq_scale: f32,
    /// `(scale, floor_scale)` of the attention temperature, when the file sets one.
    attn_temperature: Option<(f32, u32)>,
    moe: MoeParams,
    tok_embd: WeightRef,
    output_norm: NormWeights,
    lm_head: Linear,
    layers: Vec<Layer>,
}

/// Q's projection: a low-rank pair with a norm between, or one matrix (Lite).
#[derive(Debug)]
enum QProj {
    LowRank {
        a: WeightRef,
        norm: NormWeights,
        b: WeightRef,
    },
    Plain(WeightRef),
}

/// How the latent becomes heads.
#[derive(Debug)]
enum KvB {
    /// Absorbed MLA: `attn_k_b` `[nope, kv_lora_rank, n_head]` and `attn_v_b`
    /// `[kv_lora_rank, head_v, n_head]`.
    Absorbed { k_b: WeightRef, v_b: WeightRef },
    /// Files converted before absorbed MLA: one `attn_kv_b`
    /// `[kv_lora_rank, n_head * (nope + head_v)]`, and a cache of whole heads.
    Decompressed(WeightRef),
}

#[derive(Debug)]
#[allow(clippy::large_enum_variant)] // one per layer, made once at load
enum Ffn {
    Dense(FfnWeights),
    Moe {
        experts: MoeWeights,
        shared: FfnWeights,
    },
}

#[derive(Debug)]
struct Layer {
    attn_norm: NormWeights,
    q: QProj,
    kv_a_mqa: WeightRef,
    kv_a_norm: NormWeights,
    kv_b: KvB,
    wo: Linear,
    ffn_norm: NormWeights,
    ffn: Ffn,
}

pub(super) fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let r = MetaReader::new(gguf, "deepseek2");
    let mut hp = HParams::read_common(&r, RopeType::Normal)?;
    hp.norm_rms_eps = r.require_f32("attention.layer_norm_rms_epsilon")?;
    require_experts(&r, &hp)?;
    // llama.cpp tells the Lite models (no Q low-rank pair) by their layer count.
    let is_lite = matches!(hp.n_layer, 26 | 27) || (hp.n_layer == 48 && hp.n_vocab == 128256);
    let n_dense_lead = r.u32("leading_dense_block_count")?.unwrap_or(0) as usize;
    let q_lora_rank = if is_lite {
        0
    } else {
        r.require_u32("attention.q_lora_rank")? as usize
    };
    let kv_lora_rank = r.require_u32("attention.kv_lora_rank")? as usize;
    let head_k_mla = r.u32("attention.key_length_mla")?.unwrap_or(0) as usize;
    let head_v_mla = r.u32("attention.value_length_mla")?.unwrap_or(0) as usize;
    let n_rot = hp.n_rot as usize;
    // llama.cpp's `is_mla`: both MLA head sizes set; else the heads are whole in the cache.
    let absorbed = head_k_mla != 0 && head_v_mla != 0;
    // Absorbed MLA's V is the latent K starts with: a K-only cache, as llama.cpp keeps.
    hp.v_in_k = absorbed;
    let (head_k_mla, head_v_mla) = if absorbed {
        (head_k_mla, head_v_mla)
    } else {
        (hp.n_embd_head_k as usize, hp.n_embd_head_v as usize)
    };
    // Absorbed: the cache holds the latent and the rotary part as K (one head), the latent as
    // V. Decompressed: whole heads, one KV head per query head.
    let layout_ok = if absorbed {
        hp.n_embd_head_k as usize == kv_lora_rank + n_rot
            && hp.n_embd_head_v as usize == kv_lora_rank
            && hp.n_head_kv.iter().all(|&h| h == 1)
    } else {
        hp.n_head_kv == hp.n_head
    };
    if !layout_ok || head_k_mla <= n_rot {
        return Err(r.bad(
            "attention.key_length",
            format!(
                "MLA needs K = kv_lora_rank + rope ({} + {n_rot}), V = kv_lora_rank, one KV \
                 head and a non-rotary part; the file has K {}, V {}, MLA K {head_k_mla}",
                kv_lora_rank, hp.n_embd_head_k, hp.n_embd_head_v
            ),
        ));
    }
    let n_shared = r.require_u32("expert_shared_count")?;
    let weights_scale = r.f32("expert_weights_scale")?.unwrap_or(0.0);
    let norm_weights = r.bool("expert_weights_norm")?.unwrap_or(false);
    let gating_n = r.u32("expert_gating_func")?.unwrap_or(0);
    let gating = Gating::from_gguf(gating_n, Gating::Softmax)
        .ok_or_else(|| r.bad("expert_gating_func", format!("unknown gating {gating_n}")))?;
    let temp_scale = r.f32("attention.temperature_scale")?.unwrap_or(0.0);
    let attn_temperature = if temp_scale != 0.0 {
        let floor = r.u32("attention.temperature_length")?.unwrap_or(0);
        if floor == 0 {
            return Err(r.bad(
                "attention.temperature_length",
                "attention temperature scaling needs a positive length".into(),
            ));
        }
        Some((temp_scale, floor))
    } else {
        None
    };
    let n_ff_exp = r
        .per_layer("expert_feed_forward_length", hp.n_layer)?
        .ok_or_else(|| {
            ModelError::from(lamina_gguf::MetadataError::Missing(
                r.key("expert_feed_forward_length"),
            ))
        })?;

    let t = TensorLoader::new(gguf);
    let n_embd = hp.n_embd as u64;
    let n_head = hp.n_head[0] as u64;
    let (kv_lora, nope) = (kv_lora_rank as u64, (head_k_mla - n_rot) as u64);
    let tok_embd = t.token_embd(&hp)?;
    let layers = (0..hp.n_layer as usize)
        .map(|il| {
            if hp.n_head[il] as u64 != n_head {
                return Err(r.bad("attention.head_count", "MLA needs one head count".into()));
            }
            let q_out = n_head * head_k_mla as u64;
            let q = if q_lora_rank > 0 {
                QProj::LowRank {
                    a: t.get(&blk(il, "attn_q_a.weight"), &[n_embd, q_lora_rank as u64])?,
                    norm: t.norm(&blk(il, "attn_q_a_norm"), q_lora_rank as u64)?,
                    b: t.get(&blk(il, "attn_q_b.weight"), &[q_lora_rank as u64, q_out])?,
                }
            } else {
                QProj::Plain(t.get(&blk(il, "attn_q.weight"), &[n_embd, q_out])?)
            };
            let ffn = if il < n_dense_lead {
                // No FFN biases or scales in llama.cpp's deepseek2 graph.
                Ffn::Dense(t.ffn(&hp, il, hp.n_ff[il], true)?.plain())
            } else {
                let n_ff = n_ff_exp[il];
                let n_sh = u64::from(n_ff) * u64::from(n_shared);
                let shared = FfnWeights {
                    up: t.linear(&blk(il, "ffn_up_shexp"), n_embd, n_sh)?,
                    gate: Some(t.linear(&blk(il, "ffn_gate_shexp"), n_embd, n_sh)?),
                    down: t.linear(&blk(il, "ffn_down_shexp"), n_sh, n_embd)?,
                };
                let mut experts = t.moe(&hp, il, n_ff, (true, true))?.plain();
                experts.selection_bias =
                    t.optional(&blk(il, "exp_probs_b.bias"), &[hp.n_expert as u64])?;
                Ffn::Moe {
                    experts,
                    shared: shared.plain(),
                }
            };
            Ok(Layer {
                attn_norm: t.norm(&blk(il, "attn_norm"), n_embd)?,
                q,
                kv_a_mqa: t.get(
                    &blk(il, "attn_kv_a_mqa.weight"),
                    &[n_embd, kv_lora + n_rot as u64],
                )?,
                kv_a_norm: t.norm(&blk(il, "attn_kv_a_norm"), kv_lora)?,
                kv_b: if absorbed {
                    KvB::Absorbed {
                        k_b: t.get(&blk(il, "attn_k_b.weight"), &[nope, kv_lora, n_head])?,
                        v_b: t.get(
                            &blk(il, "attn_v_b.weight"),
                            &[kv_lora, head_v_mla as u64, n_head],
                        )?,
                    }
                } else {
                    let n_out = n_head * (nope + head_v_mla as u64);
                    KvB::Decompressed(t.get(&blk(il, "attn_kv_b.weight"), &[kv_lora, n_out])?)
                },
                wo: t
                    .linear(&blk(il, "attn_output"), n_head * head_v_mla as u64, n_embd)?
                    .no_bias(),
                ffn_norm: t.norm(&blk(il, "ffn_norm"), n_embd)?,
                ffn,
            })
        })
        .collect::<Result<_, ModelError>>()?;
    // llama.cpp's YaRN attention scale (1 without rope scaling): the file's log multiplier is
    // stored divided by 0.1, and DeepSeek V2 uses it for mscale too; the context's attention
    // factor is undone, then Q·K is pre-scaled by mscale².
    if let Some(m) = r.f32("rope.scaling.yarn_log_multiplier")? {
        hp.yarn_log_mul = m / 0.1;
    }
    hp.yarn_mscale_is_log_mul = true;
    let ln_inv_scale = (1.0 / hp.rope_freq_scale).ln();
    let attn_factor = hp.yarn_factors().1;
    let mscale =
        attn_factor * (1.0 + 0.1 * ln_inv_scale) * (1.0 + 0.1 * hp.yarn_log_mul * ln_inv_scale);
    let kq_scale = mscale * mscale / (head_k_mla as f32).sqrt();
    Ok(Box::new(DeepSeek2 {
        kv_lora_rank,
        head_k_mla,
        head_v_mla,
        kq_scale,
        attn_temperature,
        moe: MoeParams {
            n_expert: hp.n_expert as usize,
            n_expert_used: hp.n_expert_used as usize,
            act: MoeAct::Silu,
            norm_weights,
            weights_scale,
            gating,
        },
        tok_embd,
        output_norm: t.norm("output_norm", n_embd)?,
        lm_head: t.lm_head(&hp, tok_embd)?,
        layers,
        hp,
    }))
}

impl DeepSeek2 {
    /// MLA for layer `il` on the normed input `x`: `[head_v_mla * n_head, n_tokens]` after the
    /// output projection.
    fn attention(
        &self,
        b: &mut Builder<'_>,
        il: usize,
        x: TensorId,
        lw: &Layer,
    ) -> Result<TensorId, ModelError> {
        let n_tokens = b.shape.n_tokens;
        let n_head = self.hp.n_head[il] as usize;
        let n_rot = self.hp.n_rot as usize;
        let (kv_lora, head_k) = (self.kv_lora_rank, self.head_k_mla);
        let nope = head_k - n_rot;

        let q = match &lw.q {
            QProj::LowRank { a, norm, b: wb } => {
                let a = b.weight(*a)?;
                let q = b.g.mul_mat(a, x)?;
                let q = b.norm(q, norm, NormKind::Rms)?;
                let wb = b.weight(*wb)?;
                b.g.mul_mat(wb, q)?
            }
            QProj::Plain(w) => {
                let w = b.weight(*w)?;
                b.g.mul_mat(w, x)?
            }
        };
        let q = b.g.reshape(q, &[head_k, n_head, n_tokens])?;
        let kv_a = b.weight(lw.kv_a_mqa)?;
        let kv_pe = b.g.mul_mat(kv_a, x)?; // [kv_lora + n_rot, n_tokens]
        let row = 4 * (kv_lora + n_rot);
        let kv_cmpr = b.g.view_2d(kv_pe, kv_lora, n_tokens, row, 0)?;
        let k_pe =
            b.g.view_3d(kv_pe, n_rot, 1, n_tokens, row, row, 4 * kv_lora)?;
        let k_pe = b.rope(k_pe, il, None)?;
        let kv_cmpr = b.norm(kv_cmpr, &lw.kv_a_norm, NormKind::Rms)?;

        let (k_b, v_b) = match lw.kv_b {
            KvB::Absorbed { k_b, v_b } => (k_b, v_b),
            KvB::Decompressed(kv_b) => {
                // Whole heads: K = [k_nope, k_pe repeated per head], V from the same product,
                // Q roped on its trailing rotary dims.
                let head_v = self.head_v_mla;
                let kv_b = b.weight(kv_b)?;
                let kv = b.g.mul_mat(kv_b, kv_cmpr)?; // [n_head * (nope + head_v), n_tokens]
                let row = 4 * (nope + head_v);
                let k_nope =
                    b.g.view_3d(kv, nope, n_head, n_tokens, row, row * n_head, 0)?;
                let v =
                    b.g.view_3d(kv, head_v, n_head, n_tokens, row, row * n_head, 4 * nope)?;
                let v = b.g.cont(v)?;
                let mut q = b.rope_offset(q, il, nope)?;
                let k_pe = b.g.repeat_4d(k_pe, [n_rot, n_head, n_tokens, 1])?;
                let k = b.g.concat(k_nope, k_pe, 0)?;
                if let Some((scale, floor)) = self.attn_temperature {
                    let temp = b.inp_attn_temperature(scale, floor)?;
                    q = b.g.mul(q, temp)?;
                }
                return b.attention(il, q, k, v, AttnParams::scaled(self.kq_scale), &lw.wo);
            }
        };
        let nb = b.g.tensor(q).nb();
        let q_nope = b.g.view_3d(q, nope, n_head, n_tokens, nb[1], nb[2], 0)?;
        let q_pe =
            b.g.view_3d(q, n_rot, n_head, n_tokens, nb[1], nb[2], 4 * nope)?;
        let q_pe = b.rope(q_pe, il, None)?;
        let q_nope = b.g.permute(q_nope, [0, 2, 1, 3])?; // [nope, n_tokens, n_head]
        let k_b = b.weight(k_b)?;
        let q_abs = b.g.mul_mat(k_b, q_nope)?; // [kv_lora, n_tokens, n_head]
        let q_abs = b.g.permute(q_abs, [0, 2, 1, 3])?; // [kv_lora, n_head, n_tokens]
        let mut q = b.g.concat(q_abs, q_pe, 0)?; // [kv_lora + n_rot, n_head, n_tokens]

        let kv_cmpr = b.g.reshape(kv_cmpr, &[kv_lora, 1, n_tokens])?;
        let k = b.g.concat(kv_cmpr, k_pe, 0)?; // [kv_lora + n_rot, 1, n_tokens]
        if let Some((scale, floor)) = self.attn_temperature {
            let temp = b.inp_attn_temperature(scale, floor)?;
            q = b.g.mul(q, temp)?;
        }
        // Attention over the latent: [kv_lora, n_head, n_tokens], as `V·softmax(K·Q)`.
        let merged = b.attend(il, q, k, kv_cmpr, AttnParams::scaled(self.kq_scale))?;
        let kqv = b.g.reshape(merged, &[kv_lora, n_head, n_tokens])?;
        let kqv = b.g.permute(kqv, [0, 2, 1, 3])?;
        let kqv = b.g.cont(kqv)?; // [kv_lora, n_tokens, n_head], as llama.cpp's kqv
        let v_b = b.weight(v_b)?;
        let out = b.g.mul_mat(v_b, kqv)?; // [head_v_mla, n_tokens, n_head]
        let out = b.g.permute(out, [0, 2, 1, 3])?;
        let out = b.g.cont(out)?;
        let out = b.g.reshape(out, &[self.head_v_mla * n_head, n_tokens])?;
        b.linear(out, &lw.wo)
    }
}

impl Architecture for DeepSeek2 {
    fn hparams(&self) -> &HParams {
        &self.hp
    }

    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
        let mut inp = b.embeddings(self.tok_embd)?;
        for (il, lw) in self.layers.iter().enumerate() {
            b.begin_layer(il);
            let cur = b.norm(inp, &lw.attn_norm, NormKind::Rms)?;
            let mut cur = self.attention(b, il, cur, lw)?;
            if b.is_last_layer(il) {
                cur = b.select_outputs(cur)?;
                inp = b.select_outputs(inp)?;
            }
            let ffn_inp = b.g.add(cur, inp)?;
            let cur = b.norm(ffn_inp, &lw.ffn_norm, NormKind::Rms)?;
            let cur = match &lw.ffn {
                Ffn::Dense(f) => b.ffn(cur, f, FfnAct::Silu)?,
                Ffn::Moe { experts, shared } => {
                    let moe_out = b.moe_ffn(cur, experts, self.moe)?;
                    let shexp = b.ffn(cur, shared, FfnAct::Silu)?;
                    b.g.add(moe_out, shexp)?
                }
            };
            inp = b.g.add(cur, ffn_inp)?;
        }
        b.output(inp, &self.output_norm, NormKind::Rms, &self.lm_head)
    }

    fn k_shift_rope(&self, _il: usize, _kv_size: usize) -> Option<KShiftRope> {
        // The rotary part of each cached head comes last (llama.cpp's `n_embd_nope` view).
        Some(KShiftRope {
            n_offs: (self.hp.n_embd_head_k - self.hp.n_rot) as usize,
            ..KShiftRope::default()
        })
    }
}
