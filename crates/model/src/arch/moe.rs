//! The mixture-of-experts feed-forward block, after llama.cpp's `build_moe_ffn`: route each
//! token (softmax, sigmoid or softmax-after-top-k over the router's logits, optionally
//! group-limited and with a selection bias), run only the chosen experts' matrices
//! (`mul_mat_id`, per-expert biases with `add_id`, per-expert scales), weight their outputs and
//! sum them.

use lamina_core::graph::TensorId;

use super::Builder;
use crate::ModelError;
use crate::weights::{Experts, MoeWeights};

/// How router logits become expert probabilities (llama.cpp's
/// `llama_expert_gating_func_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
    /// Top-k on the logits, softmax over the chosen ones (gpt-oss).
    SoftmaxWeight,
    /// `sqrt(softplus(logits))`.
    SqrtSoftplus,
}

impl Gating {
    /// llama.cpp's `expert_gating_func` numbers (0 means the architecture's default).
    pub fn from_gguf(n: u32, default: Gating) -> Option<Gating> {
        Some(match n {
            0 => default,
            1 => Gating::Softmax,
            2 => Gating::Sigmoid,
            3 => Gating::SoftmaxWeight,
            4 => Gating::SqrtSoftplus,
            _ => return None,
        })
    }
}

/// The experts' activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoeAct {
    Silu,
    Gelu,
    /// gpt-oss's clamped SwiGLU (alpha 1.702, limit 7).
    SwiGluOai,
}

/// How one MoE layer routes and combines.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeParams {
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub act: MoeAct,
    /// Normalise the chosen experts' weights to sum to 1.
    pub norm_weights: bool,
    /// Scale of the weights (0 or 1: none).
    pub weights_scale: f32,
    pub gating: Gating,
}

impl MoeParams {
    /// The model's expert counts with `act` and `gating`; weights neither normalised nor
    /// scaled.
    pub fn new(hp: &crate::HParams, act: MoeAct, gating: Gating) -> MoeParams {
        MoeParams {
            n_expert: hp.n_expert as usize,
            n_expert_used: hp.n_expert_used as usize,
            act,
            norm_weights: false,
            weights_scale: 0.0,
            gating,
        }
    }
}

impl Builder<'_> {
    /// `mul_mat_id` of one expert stack, times its per-expert scales, plus its per-expert
    /// biases (llama.cpp's `build_lora_mm_id` and the `add_id` after it).
    fn experts_mm(
        &mut self,
        e: &Experts,
        x: TensorId,
        selected: TensorId,
    ) -> Result<TensorId, ModelError> {
        let w = self.weight(e.w)?;
        let mut y = self.g.mul_mat_id(w, x, selected)?;
        if let Some(s) = e.scale {
            let n_expert = e.w.ne[2];
            let n_tokens = self.g.tensor(x).ne()[2];
            let s = self.weight(s)?;
            let s = self.g.reshape(s, &[1, n_expert, 1])?;
            let s = self.g.repeat_4d(s, [1, n_expert, n_tokens, 1])?;
            let s = self.g.get_rows(s, selected)?;
            y = self.g.mul(y, s)?;
        }
        if let Some(b) = e.b {
            let b = self.weight(b)?;
            y = self.g.add_id(y, b, selected)?;
        }
        Ok(y)
    }

    /// The MoE feed-forward of `x` (`[n_embd, n_tokens]`).
    pub fn moe_ffn(
        &mut self,
        x: TensorId,
        mw: &MoeWeights,
        p: MoeParams,
    ) -> Result<TensorId, ModelError> {
        let [n_embd, n_tokens, ..] = self.g.tensor(x).ne();
        let (n_expert, n_used) = (p.n_expert, p.n_expert_used);
        let hp = self.hp();

        let logits = self.linear(x, &mw.router)?; // [n_expert, n_tokens]
        let probs = match p.gating {
            Gating::Softmax => self.g.soft_max(logits)?,
            Gating::Sigmoid => self.g.sigmoid(logits)?,
            Gating::SoftmaxWeight => logits,
            Gating::SqrtSoftplus => {
                let sp = self.g.softplus(logits)?;
                self.g.sqrt(sp)?
            }
        };
        // The selection bias changes which experts are chosen, not their weights.
        let mut selection = match mw.selection_bias {
            Some(b) => {
                let b = self.weight(b)?;
                self.g.add(probs, b)?
            }
            None => probs,
        };
        if hp.n_expert_groups > 1 && n_tokens > 0 {
            selection = self.limit_to_groups(selection, n_expert, n_tokens)?;
        }
        let selected = self.g.argsort_top_k(selection, n_used)?; // [n_used, n_tokens]

        let probs3 = self.g.reshape(probs, &[1, n_expert, n_tokens])?;
        let mut weights = self.g.get_rows(probs3, selected)?; // [1, n_used, n_tokens]
        if p.gating == Gating::SoftmaxWeight {
            let w = self.g.reshape(weights, &[n_used, n_tokens])?;
            let w = self.g.soft_max(w)?;
            weights = self.g.reshape(w, &[1, n_used, n_tokens])?;
        }
        if p.norm_weights {
            let w = self.g.reshape(weights, &[n_used, n_tokens])?;
            let sum = self.g.sum_rows(w)?; // [1, n_tokens]
            // llama.cpp keeps the sum away from 0 with the smallest normal f16.
            let sum = self.g.clamp(sum, 6.103_515_6e-5, f32::INFINITY)?;
            let w = self.g.div(w, sum)?;
            weights = self.g.reshape(w, &[1, n_used, n_tokens])?;
        }
        if p.weights_scale != 0.0 && p.weights_scale != 1.0 {
            weights = self.g.scale(weights, p.weights_scale)?;
        }

        let cur = self.g.reshape(x, &[n_embd, 1, n_tokens])?;
        let (up, gate) = if mw.merged_gate_up {
            // One product, split into the gate (first half) and up views.
            let gate_up = self.experts_mm(&mw.up, cur, selected)?; // [2 n_ff, n_used, n_tokens]
            let t = self.g.tensor(gate_up);
            let (ne, nb) = (t.ne(), t.nb());
            let n_ff = ne[0] / 2;
            let gate = self
                .g
                .view_3d(gate_up, n_ff, ne[1], ne[2], nb[1], nb[2], 0)?;
            let up = self
                .g
                .view_3d(gate_up, n_ff, ne[1], ne[2], nb[1], nb[2], n_ff * nb[0])?;
            (up, Some(gate))
        } else {
            let up = self.experts_mm(&mw.up, cur, selected)?; // [n_ff, n_used, n_tokens]
            let gate = match &mw.gate {
                Some(g) => Some(self.experts_mm(g, cur, selected)?),
                None => None,
            };
            (up, gate)
        };
        let h = match (p.act, gate) {
            (MoeAct::Silu, Some(g)) => self.g.swiglu_split(g, up)?,
            (MoeAct::Silu, None) => self.g.silu(up)?,
            (MoeAct::Gelu, Some(g)) => self.g.geglu_split(g, up)?,
            (MoeAct::Gelu, None) => self.g.gelu(up)?,
            (MoeAct::SwiGluOai, Some(g)) => self.g.swiglu_oai(g, up, 1.702, 7.0)?,
            (MoeAct::SwiGluOai, None) => {
                return Err(ModelError::MissingTensor("ffn_gate_exps.weight".into()));
            }
        };
        let experts = self.experts_mm(&mw.down, h, selected)?; // [n_embd, n_used, n_tokens]
        let experts = self.g.mul(experts, weights)?;

        // Sum the chosen experts' outputs, in order, as llama.cpp adds its views.
        let nb = self.g.tensor(experts).nb();
        let mut out = self.g.view_2d(experts, n_embd, n_tokens, nb[2], 0)?;
        for i in 1..n_used {
            let v = self
                .g
                .view_2d(experts, n_embd, n_tokens, nb[2], i * nb[1])?;
            out = self.g.add(out, v)?;
        }
        if n_used == 1 {
            out = self.g.cont(out)?;
        }
        Ok(out)
    }

    /// DeepSeek V3's group-limited routing: only the experts of the `n_group_used` groups with
    /// the highest sum of their two best scores stay selectable (the rest become -inf).
    fn limit_to_groups(
        &mut self,
        selection: TensorId,
        n_expert: usize,
        n_tokens: usize,
    ) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let n_groups = hp.n_expert_groups as usize;
        let per_group = n_expert / n_groups;
        let groups = self
            .g
            .reshape(selection, &[per_group, n_groups, n_tokens])?;
        let top2 = self.g.argsort_top_k(groups, 2)?; // [2, n_groups, n_tokens]
        let groups4 = self
            .g
            .reshape(groups, &[1, per_group, n_groups, n_tokens])?;
        let scores = self.g.get_rows(groups4, top2)?; // [1, 2, n_groups, n_tokens]
        let scores = self.g.reshape(scores, &[2, n_groups, n_tokens])?;
        let scores = self.g.sum_rows(scores)?; // [1, n_groups, n_tokens]
        let scores = self.g.reshape(scores, &[n_groups, n_tokens])?;
        let chosen = self.g.argsort_top_k(scores, hp.n_group_used as usize)?;
        let kept = self.g.get_rows(groups, chosen)?; // [per_group, n_group_used, n_tokens]
        let masked = self.g.fill(groups, f32::NEG_INFINITY)?;
        let merged = self.g.set_rows(masked, kept, chosen)?;
        Ok(self.g.reshape(merged, &[n_expert, n_tokens])?)
    }
}
