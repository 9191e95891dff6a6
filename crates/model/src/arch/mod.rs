//! Graph building: the shared blocks (norms, attention over the KV cache, feed-forward) and one
//! file per architecture that strings them together the way llama.cpp's `llm_build_*` does.

mod gemma3;
mod llama;

use std::collections::HashMap;
use std::sync::Arc;

use lamina_backend::DeviceHint;
use lamina_core::DType;
use lamina_core::graph::{BufferMemory, GluOp, Graph, RopeMode, RopeParams, TensorId};
use lamina_core::tensor::TensorFlags;

use crate::kv_cache::KvCache;
use crate::weights::{LayerWeights, WeightRef};
use crate::{Arch, HParams, LayerPlan, ModelError, RopeType};

/// The graph's inputs, written by the host before each compute.
#[derive(Clone, Copy, Debug)]
pub struct GraphInputs {
    /// `[n_tokens]` i32 token ids.
    pub tokens: TensorId,
    /// `[n_tokens]` i32 positions.
    pub pos: TensorId,
    /// `[n_kv, n_tokens]` f32 causal mask.
    pub kq_mask: TensorId,
    /// `[n_kv, n_tokens]` f32 causal sliding-window mask (architectures with SWA layers).
    pub kq_mask_swa: Option<TensorId>,
    /// `[n_tokens]` i32 KV cells the tokens' K rows go to.
    pub k_idxs: TensorId,
    /// `[n_embd_v_gqa * n_tokens]` i32 element indices of the transposed V writes.
    pub v_idxs: TensorId,
    /// `[n_outputs]` i32 rows whose logits are wanted.
    pub out_ids: TensorId,
}

/// A built graph and where its inputs and output are.
pub struct BuiltGraph {
    pub graph: Graph,
    pub inputs: GraphInputs,
    /// `[n_vocab, n_outputs]` f32 (`[n_embd, n_outputs]` when built for embeddings).
    pub logits: TensorId,
    /// Which device each part of the graph belongs to (input layer, each layer, output), for
    /// the scheduler.
    pub hints: Vec<DeviceHint>,
}

/// The sizes one graph is built for: everything a graph depends on besides the model and
/// its cache, so a graph built for a shape can be run again for any batch of that shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GraphShape {
    pub n_tokens: usize,
    /// Cells attention looks at.
    pub n_kv: usize,
    /// Rows of logits computed.
    pub n_outputs: usize,
    /// Output the final-normed hidden states (`[n_embd, n_outputs]`) instead of logits.
    pub embeddings: bool,
}

/// What graph building reads: hyperparameters, weights and their memory (per device), the
/// layer placement, and the cache (its memory per device).
pub struct BuildContext<'a> {
    pub hp: &'a HParams,
    pub weights: &'a crate::weights::Weights,
    pub weight_memory: &'a [Arc<dyn BufferMemory>],
    pub plan: &'a LayerPlan,
    pub kv: &'a KvCache,
    pub kv_memory: &'a [Option<Arc<dyn BufferMemory>>],
}

/// Builds the forward graph of `ctx.hp.arch` for one micro-batch.
pub fn build_graph(ctx: &BuildContext<'_>, shape: GraphShape) -> Result<BuiltGraph, ModelError> {
    let mut b = Builder::new(ctx, shape)?;
    let logits = match ctx.hp.arch {
        Arch::Llama => llama::build(&mut b)?,
        Arch::Gemma3 => gemma3::build(&mut b)?,
    };
    b.g.set_name(logits, "result_output")?;
    b.g.set_output(logits)?;
    Ok(BuiltGraph {
        graph: b.g,
        inputs: b.inputs,
        logits,
        hints: b.hints,
    })
}

/// Graph under construction, with the blocks architectures are made of.
pub(crate) struct Builder<'a> {
    pub g: Graph,
    pub ctx: &'a BuildContext<'a>,
    pub shape: GraphShape,
    pub inputs: GraphInputs,
    /// Weights already in the graph, by file offset and device (tied embeddings are used
    /// twice, by the input and the output layer, which may be on different devices).
    weight_ids: HashMap<(usize, usize), TensorId>,
    /// The device of the part being built (the input layer's until `begin_layer`).
    device: usize,
    hints: Vec<DeviceHint>,
}

impl<'a> Builder<'a> {
    fn new(ctx: &'a BuildContext<'a>, shape: GraphShape) -> Result<Builder<'a>, ModelError> {
        let mut g = Graph::with_capacity(64 + 40 * ctx.hp.n_layer as usize);
        let first = g.next_id();
        let n = shape.n_tokens;
        let n_embd_v = ctx.hp.n_embd_v_gqa(0) as usize;
        let input =
            |g: &mut Graph, dtype, ne: &[usize], name: &str| -> Result<TensorId, ModelError> {
                let id = g.new_input(dtype, ne)?;
                g.set_name(id, name)?;
                Ok(id)
            };
        let inputs = GraphInputs {
            tokens: input(&mut g, DType::I32, &[n], "inp_tokens")?,
            pos: input(&mut g, DType::I32, &[n], "inp_pos")?,
            kq_mask: input(&mut g, DType::F32, &[shape.n_kv, n], "kq_mask")?,
            kq_mask_swa: if ctx.hp.n_swa > 0 {
                Some(input(&mut g, DType::F32, &[shape.n_kv, n], "kq_mask_swa")?)
            } else {
                None
            },
            k_idxs: input(&mut g, DType::I32, &[n], "k_idxs")?,
            v_idxs: input(&mut g, DType::I32, &[n_embd_v * n], "v_idxs")?,
            out_ids: input(&mut g, DType::I32, &[shape.n_outputs], "out_ids")?,
        };
        Ok(Builder {
            g,
            ctx,
            shape,
            inputs,
            weight_ids: HashMap::new(),
            device: ctx.plan.input,
            hints: vec![DeviceHint {
                start: first,
                device: ctx.plan.input,
            }],
        })
    }

    fn begin_part(&mut self, device: usize) {
        self.device = device;
        let start = self.g.next_id();
        match self.hints.last_mut() {
            Some(h) if h.start == start => h.device = device,
            Some(h) if h.device == device => {}
            _ => self.hints.push(DeviceHint { start, device }),
        }
    }

    /// What is built from here on belongs to layer `il` (its weights, cache and device).
    pub fn begin_layer(&mut self, il: usize) {
        self.begin_part(self.ctx.plan.layers[il]);
    }

    /// What is built from here on belongs to the output layer.
    pub fn begin_output(&mut self) {
        self.begin_part(self.ctx.plan.output);
    }

    pub fn hp(&self) -> &'a HParams {
        self.ctx.hp
    }

    /// The weight as a graph leaf bound to the model's memory.
    pub fn weight(&mut self, w: WeightRef) -> Result<TensorId, ModelError> {
        let key = (w.offset, self.device);
        if let Some(&id) = self.weight_ids.get(&key) {
            return Ok(id);
        }
        let id = self.g.new_tensor(w.dtype, &w.ne)?;
        self.g.add_flags(id, TensorFlags::WEIGHT)?;
        self.g
            .bind(id, self.ctx.weight_memory[self.device].clone(), w.offset)?;
        self.weight_ids.insert(key, id);
        Ok(id)
    }

    /// `rms_norm(x) * w`.
    pub fn rms_norm(&mut self, x: TensorId, w: WeightRef) -> Result<TensorId, ModelError> {
        let eps = self.hp().norm_rms_eps;
        let normed = self.g.rms_norm(x, eps)?;
        let w = self.weight(w)?;
        Ok(self.g.mul(normed, w)?)
    }

    /// `w · x (+ b)`.
    pub fn linear(
        &mut self,
        x: TensorId,
        w: WeightRef,
        b: Option<WeightRef>,
    ) -> Result<TensorId, ModelError> {
        let w = self.weight(w)?;
        let mut y = self.g.mul_mat(w, x)?;
        if let Some(b) = b {
            let b = self.weight(b)?;
            y = self.g.add(y, b)?;
        }
        Ok(y)
    }

    /// Layer `il`'s Q, K and V projections of `x`, as `[head_dim, n_head(_kv), n_tokens]`.
    pub fn qkv(
        &mut self,
        il: usize,
        x: TensorId,
        lw: &LayerWeights,
    ) -> Result<(TensorId, TensorId, TensorId), ModelError> {
        let hp = self.hp();
        let n_tokens = self.shape.n_tokens;
        let (head_k, head_v) = (hp.n_embd_head_k as usize, hp.n_embd_head_v as usize);
        let (n_head, n_head_kv) = (hp.n_head[il] as usize, hp.n_head_kv[il] as usize);
        let q = self.linear(x, lw.wq, lw.bq)?;
        let k = self.linear(x, lw.wk, lw.bk)?;
        let v = self.linear(x, lw.wv, lw.bv)?;
        Ok((
            self.g.reshape(q, &[head_k, n_head, n_tokens])?,
            self.g.reshape(k, &[head_k, n_head_kv, n_tokens])?,
            self.g.reshape(v, &[head_v, n_head_kv, n_tokens])?,
        ))
    }

    /// The gated feed-forward network `down(act(gate(x)) * up(x))` (llama.cpp's `LLM_FFN_PAR`).
    pub fn gated_ffn(
        &mut self,
        x: TensorId,
        lw: &LayerWeights,
        act: GluOp,
    ) -> Result<TensorId, ModelError> {
        let gate = self.linear(x, lw.ffn_gate, None)?;
        let up = self.linear(x, lw.ffn_up, None)?;
        let h = self.g.glu_split(act, gate, up)?;
        self.linear(h, lw.ffn_down, None)
    }

    /// Token embeddings of the batch, `[n_embd, n_tokens]`.
    pub fn embeddings(&mut self) -> Result<TensorId, ModelError> {
        let tok_embd = self.weight(self.ctx.weights.tok_embd)?;
        Ok(self.g.get_rows(tok_embd, self.inputs.tokens)?)
    }

    /// RoPE for layer `il` on `x` (`[head_dim, n_head, n_tokens]`).
    pub fn rope(&mut self, x: TensorId, il: usize) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let (freq_base, freq_scale) = hp.rope_freq(il);
        let mode = match hp.rope_type {
            RopeType::Normal => RopeMode::Normal,
            RopeType::Neox => RopeMode::Neox,
        };
        let mut params = RopeParams::new(hp.n_rot as usize, mode, freq_base);
        params.freq_scale = freq_scale;
        params.n_ctx_orig = hp.n_ctx_orig as usize;
        Ok(self.g.rope_ext(x, self.inputs.pos, None, params)?)
    }

    /// Writes this batch's K and V of layer `il` into the cache and attends over it, as
    /// llama.cpp's `build_attn_mha` without flash attention: `softmax(K·Q * kq_scale + mask)`
    /// then `V·kq`, heads merged, through `wo`. `q`, `k`, `v` are `[head_dim, n_head(_kv), n_tokens]`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &mut self,
        il: usize,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        kq_scale: f32,
        wo: WeightRef,
        bo: Option<WeightRef>,
    ) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let n_tokens = self.shape.n_tokens;
        let n_kv = self.shape.n_kv;
        let head_k = hp.n_embd_head_k as usize;
        let head_v = hp.n_embd_head_v as usize;
        let n_head = hp.n_head[il] as usize;
        let n_head_kv = hp.n_head_kv[il] as usize;
        let kv = self.ctx.kv;
        let lc = kv.layer(il);
        let size = kv.size();
        let ts = kv.dtype().type_size() as usize;

        // The layer's cache as graph leaves over its device's cache buffer.
        let kv_memory = self.ctx.kv_memory[lc.device]
            .clone()
            .ok_or_else(|| ModelError::Placement(format!("layer {il} has no cache")))?;
        let k_cache = self.g.new_tensor(kv.dtype(), &[lc.n_embd_k, size])?;
        self.g.bind(k_cache, kv_memory.clone(), lc.k_offset)?;
        let v_cache = self.g.new_tensor(kv.dtype(), &[lc.n_embd_v * size])?;
        self.g.bind(v_cache, kv_memory, lc.v_offset)?;

        // Store: K rows go to their cells; V, stored transposed, element by element.
        let k_rows = self.g.reshape(k, &[lc.n_embd_k, n_tokens])?;
        let k_stored = self.g.set_rows(k_cache, k_rows, self.inputs.k_idxs)?;
        let v_elems = self.g.reshape(v, &[1, lc.n_embd_v * n_tokens])?;
        let v_as_rows = self.g.reshape(v_cache, &[1, lc.n_embd_v * size])?;
        let v_stored = self.g.set_rows(v_as_rows, v_elems, self.inputs.v_idxs)?;

        // Read back the first n_kv cells, per KV head (views of the stores, so they run first).
        let row_k = lc.n_embd_k * ts;
        let k_view = self
            .g
            .view_3d(k_stored, head_k, n_kv, n_head_kv, row_k, head_k * ts, 0)?;
        let v_view = self.g.view_3d(
            v_stored,
            n_kv,
            head_v,
            n_head_kv,
            size * ts,
            size * ts * head_v,
            0,
        )?;

        let q = self.g.permute(q, [0, 2, 1, 3])?;
        let mask = if hp.swa_layers[il] {
            self.inputs
                .kq_mask_swa
                .expect("SWA models have an SWA mask")
        } else {
            self.inputs.kq_mask
        };
        let merged = if n_tokens > 1 && matches!(kv.dtype(), DType::F16 | DType::F32) {
            // Fused: the same arithmetic without the `[n_kv, n_tokens, n_head]` score tensor,
            // the largest activation of a prompt micro-batch (9.4 MB for SmolLM2 at 512
            // tokens, and growing with the context).
            self.g.attention(q, k_view, v_view, mask, kq_scale)?
        } else {
            // Scores the mask removes need not be computed (a causal mask: about half).
            let kq = self.g.mul_mat_masked(k_view, q, mask)?;
            let kq = self.g.soft_max_ext(kq, Some(mask), kq_scale, 0.0)?;
            let kqv = self.g.mul_mat(v_view, kq)?;
            let merged = self.g.permute(kqv, [0, 2, 1, 3])?;
            self.g.cont(merged)?
        };
        let merged = self.g.reshape(merged, &[head_v * n_head, n_tokens])?;
        self.linear(merged, wo, bo)
    }

    /// At the last layer, keeps only the rows whose logits are wanted (llama.cpp's `inp_out_ids`).
    pub fn select_outputs(&mut self, x: TensorId) -> Result<TensorId, ModelError> {
        if self.shape.n_outputs == self.shape.n_tokens {
            return Ok(x);
        }
        Ok(self.g.get_rows(x, self.inputs.out_ids)?)
    }

    /// Final norm and LM head (or, for embeddings, the final norm alone), on the output layer's
    /// device.
    pub fn logits(&mut self, x: TensorId) -> Result<TensorId, ModelError> {
        self.begin_output();
        let w = self.ctx.weights;
        let x = self.rms_norm(x, w.output_norm)?;
        if self.shape.embeddings {
            return Ok(x);
        }
        self.linear(x, w.lm_head(), None)
    }
}
