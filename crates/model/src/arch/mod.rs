//! Architectures: one file each, registered in [`ARCHITECTURES`]. An architecture module owns
//! its hyperparameters (read from GGUF metadata), its typed weights and its graph, which it
//! strings together from the shared blocks of [`Builder`] (norms, projections, attention over
//! the KV cache, feed-forward networks) the way llama.cpp's `llm_build_*` do. Graph inputs are
//! objects ([`inputs`]) that the block needing one creates.

mod deepseek2;
mod gemma2;
mod gemma3;
mod gpt_oss;
pub mod inputs;
mod k_shift;
mod layer;
mod llama;
mod mistral3;
mod moe;
mod olmo2;
mod phi2;
mod phi3;
mod qwen2;
mod qwen2moe;
mod qwen3;
mod qwen3moe;
mod starcoder2;

use std::collections::HashMap;
use std::sync::Arc;

use lamina_backend::DeviceHint;
use lamina_core::DType;
use lamina_core::graph::{BufferMemory, GluOp, Graph, RopeMode, RopeParams, TensorId};
use lamina_core::tensor::TensorFlags;
use lamina_gguf::Gguf;

use crate::kv_cache::KvCache;
use crate::weights::{AttnWeights, FfnWeights, Linear, NormWeights, Qkv, WeightRef};
use crate::{HParams, LayerPlan, ModelError, RopeType, WeightStore};
use inputs::{GraphInput, InputFill};
pub use k_shift::{KShiftRope, build_shift_graph};

/// A registered architecture: llama.cpp's name and how to load it.
pub struct ArchEntry {
    pub name: &'static str,
    /// Reads the hyperparameters and finds (and checks) the weights.
    pub load: fn(&Gguf) -> Result<Box<dyn Architecture>, ModelError>,
}

/// Every architecture Lamina runs.
pub const ARCHITECTURES: &[ArchEntry] = &[
    ArchEntry {
        name: "llama",
        load: llama::load,
    },
    ArchEntry {
        name: "gemma3",
        load: gemma3::load,
    },
    ArchEntry {
        name: "qwen2",
        load: qwen2::load,
    },
    ArchEntry {
        name: "qwen3",
        load: qwen3::load,
    },
    ArchEntry {
        name: "phi2",
        load: phi2::load,
    },
    ArchEntry {
        name: "phi3",
        load: phi3::load,
    },
    ArchEntry {
        name: "mistral3",
        load: mistral3::load,
    },
    ArchEntry {
        name: "olmo2",
        load: olmo2::load,
    },
    ArchEntry {
        name: "starcoder2",
        load: starcoder2::load,
    },
    ArchEntry {
        name: "gemma2",
        load: gemma2::load,
    },
    ArchEntry {
        name: "qwen2moe",
        load: qwen2moe::load,
    },
    ArchEntry {
        name: "qwen3moe",
        load: qwen3moe::load,
    },
    ArchEntry {
        name: "gpt-oss",
        load: gpt_oss::load,
    },
    ArchEntry {
        name: "deepseek2",
        load: deepseek2::load,
    },
];

/// The names of [`ARCHITECTURES`], comma-separated.
pub fn supported() -> String {
    ARCHITECTURES
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Loads the architecture of the model in `gguf`.
pub fn load(gguf: &Gguf) -> Result<Box<dyn Architecture>, ModelError> {
    let name = gguf
        .metadata
        .get_str("general.architecture")?
        .ok_or(ModelError::NoArchitecture)?;
    let entry = ARCHITECTURES
        .iter()
        .find(|a| a.name == name)
        .ok_or_else(|| ModelError::UnknownArchitecture {
            name: name.to_string(),
            supported: supported(),
        })?;
    (entry.load)(gguf)
}

/// llama.cpp's check for graphs that rotate whole heads and use one head size for K and V.
pub(crate) fn require_whole_head_rope(
    r: &crate::hparams::MetaReader<'_>,
    hp: &HParams,
) -> Result<(), ModelError> {
    if hp.n_rot != hp.n_embd_head_k || hp.n_embd_head_k != hp.n_embd_head_v {
        return Err(r.bad(
            "rope.dimension_count",
            format!(
                "{} rotates whole heads: {} rotated of {} (K) and {} (V)",
                hp.arch, hp.n_rot, hp.n_embd_head_k, hp.n_embd_head_v
            ),
        ));
    }
    Ok(())
}

/// A loaded architecture: its hyperparameters and weights, and how to build its graph.
pub trait Architecture: Send + Sync + std::fmt::Debug {
    fn hparams(&self) -> &HParams;

    /// Builds the forward graph of one micro-batch; returns the logits `[n_vocab, n_outputs]`
    /// (the final-normed hidden states `[n_embd, n_outputs]` when `b.shape.embeddings`).
    fn build(&self, b: &mut Builder<'_>) -> Result<TensorId, ModelError>;

    /// How layer `il`'s cached K is rotated again when cached positions move (a cache of
    /// `kv_size` cells); `None` for a layer without RoPE. By default the first `n_rot` dims
    /// of each head, with no frequency factors.
    fn k_shift_rope(&self, il: usize, kv_size: usize) -> Option<KShiftRope> {
        let _ = (il, kv_size);
        Some(KShiftRope::default())
    }
}

/// A built graph and where its inputs and output are.
pub struct BuiltGraph {
    pub graph: Graph,
    pub inputs: Vec<GraphInput>,
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
    /// Cells attention looks at: `n_kv` of them from cell `kv_start` (the first cell of the
    /// micro-batch's first stream).
    pub kv_start: usize,
    pub n_kv: usize,
    /// Rows of logits computed.
    pub n_outputs: usize,
    /// Output the final-normed hidden states (`[n_embd, n_outputs]`) instead of logits.
    pub embeddings: bool,
}

/// What graph building reads: the architecture, the weights' memory (per device), the layer
/// placement, and the cache (its memory per device).
pub struct BuildContext<'a> {
    pub arch: &'a dyn Architecture,
    pub weights: &'a [WeightStore],
    pub plan: &'a LayerPlan,
    pub kv: &'a KvCache,
    pub kv_memory: &'a [Option<Arc<dyn BufferMemory>>],
    /// Attention through `flash_attn_ext` (V cached as rows) rather than the standard path.
    pub flash_attn: bool,
    /// llama.cpp's `n_threads`: flash attention's chunk count for one-token steps.
    pub n_threads: u32,
}

/// Builds the forward graph of the context's architecture for one micro-batch.
pub fn build_graph(ctx: &BuildContext<'_>, shape: GraphShape) -> Result<BuiltGraph, ModelError> {
    let mut b = Builder::new(ctx, shape);
    let logits = ctx.arch.build(&mut b)?;
    b.g.set_name(logits, "result_output")?;
    b.g.set_output(logits)?;
    Ok(BuiltGraph {
        graph: b.g,
        inputs: b.inputs,
        logits,
        hints: b.hints,
    })
}

/// Which norm a block applies (llama.cpp's `LLM_NORM_RMS` / `LLM_NORM`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    Rms,
    Layer,
}

/// The activation of a feed-forward network (llama.cpp's `llm_ffn_op_type`); with a gate
/// matrix it is the gated form (`act(gate) * up`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnAct {
    Silu,
    Gelu,
    /// `silu(first half) * second half` of one `up` product twice the width (llama.cpp's
    /// `LLM_FFN_SWIGLU`, phi3's fused gate and up).
    SwiGluFused,
}

/// How a layer attends, besides its Q, K and V.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Scale of `K·Q` inside the softmax.
    pub kq_scale: f32,
    /// Soft-capping of the scores, `cap * tanh(kq / cap)` before the softmax (gemma2); 0: none.
    pub softcap: f32,
    /// Attention sinks, one logit per head (gpt-oss).
    pub sinks: Option<WeightRef>,
}

impl AttnParams {
    /// Plain attention with scale `kq_scale`.
    pub fn scaled(kq_scale: f32) -> AttnParams {
        AttnParams {
            kq_scale,
            softcap: 0.0,
            sinks: None,
        }
    }
}

/// The inputs a graph has created so far, so each is created once.
#[derive(Default)]
struct InputIds {
    tokens: Option<TensorId>,
    pos: Option<TensorId>,
    kq_mask: Option<TensorId>,
    kq_mask_swa: Option<TensorId>,
    k_idxs: Option<TensorId>,
    /// Per V width.
    v_idxs: Vec<(usize, TensorId)>,
    out_ids: Option<TensorId>,
    attn_temperature: Option<TensorId>,
}

/// Graph under construction, with the blocks architectures are made of.
pub struct Builder<'a> {
    pub g: Graph,
    pub ctx: &'a BuildContext<'a>,
    pub shape: GraphShape,
    inputs: Vec<GraphInput>,
    input_ids: InputIds,
    /// Weights already in the graph, by file offset and device (tied embeddings are used
    /// twice, by the input and the output layer, which may be on different devices).
    weight_ids: HashMap<(usize, usize), TensorId>,
    /// The device of the part being built (the input layer's until `begin_layer`).
    device: usize,
    hints: Vec<DeviceHint>,
}

impl<'a> Builder<'a> {
    fn new(ctx: &'a BuildContext<'a>, shape: GraphShape) -> Builder<'a> {
        let g = Graph::with_capacity(64 + 40 * ctx.arch.hparams().n_layer as usize);
        let first = g.next_id();
        Builder {
            g,
            ctx,
            shape,
            inputs: Vec::new(),
            input_ids: InputIds::default(),
            weight_ids: HashMap::new(),
            device: ctx.plan.input,
            hints: vec![DeviceHint {
                start: first,
                device: ctx.plan.input,
            }],
        }
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
        self.ctx.arch.hparams()
    }

    /// Whether this layer is the last one (where only the wanted rows are kept).
    pub fn is_last_layer(&self, il: usize) -> bool {
        il + 1 == self.hp().n_layer as usize
    }

    // ---- inputs ----

    /// A new input tensor filled by `fill` before each compute.
    pub fn add_input(
        &mut self,
        dtype: DType,
        ne: &[usize],
        name: &str,
        fill: Box<dyn InputFill>,
    ) -> Result<TensorId, ModelError> {
        let id = self.g.new_input(dtype, ne)?;
        self.g.set_name(id, name)?;
        self.inputs.push(GraphInput { id, fill });
        Ok(id)
    }

    /// The input in `slot` of the created ones, created by `fill` on first use.
    fn input_once(
        &mut self,
        slot: fn(&mut InputIds) -> &mut Option<TensorId>,
        dtype: DType,
        ne: &[usize],
        name: &str,
        fill: impl FnOnce() -> Box<dyn InputFill>,
    ) -> Result<TensorId, ModelError> {
        if let Some(id) = *slot(&mut self.input_ids) {
            return Ok(id);
        }
        let id = self.add_input(dtype, ne, name, fill())?;
        *slot(&mut self.input_ids) = Some(id);
        Ok(id)
    }

    /// `[n_tokens]` i32 token ids.
    pub fn inp_tokens(&mut self) -> Result<TensorId, ModelError> {
        let ne = [self.shape.n_tokens];
        self.input_once(
            |i| &mut i.tokens,
            DType::I32,
            &ne,
            "inp_tokens",
            || Box::new(inputs::Tokens),
        )
    }

    /// `[n_tokens]` i32 positions.
    pub fn inp_pos(&mut self) -> Result<TensorId, ModelError> {
        let ne = [self.shape.n_tokens];
        self.input_once(
            |i| &mut i.pos,
            DType::I32,
            &ne,
            "inp_pos",
            || Box::new(inputs::Positions),
        )
    }

    /// The causal mask layer `il` attends with: over the sliding window on SWA layers.
    pub fn inp_kq_mask(&mut self, il: usize) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let ne = [self.shape.n_kv, self.shape.n_tokens];
        if hp.swa_layers[il] {
            let window = Some(hp.n_swa);
            self.input_once(
                |i| &mut i.kq_mask_swa,
                DType::F32,
                &ne,
                "kq_mask_swa",
                || Box::new(inputs::KqMask { window }),
            )
        } else {
            self.input_once(
                |i| &mut i.kq_mask,
                DType::F32,
                &ne,
                "kq_mask",
                || Box::new(inputs::KqMask { window: None }),
            )
        }
    }

    /// `[n_tokens]` i32 cells the K rows go to.
    pub fn inp_k_idxs(&mut self) -> Result<TensorId, ModelError> {
        let ne = [self.shape.n_tokens];
        self.input_once(
            |i| &mut i.k_idxs,
            DType::I32,
            &ne,
            "k_idxs",
            || Box::new(inputs::KIdxs),
        )
    }

    /// Element indices of the transposed V writes for V rows `n_embd_v` wide.
    pub fn inp_v_idxs(&mut self, n_embd_v: usize) -> Result<TensorId, ModelError> {
        if let Some(&(_, id)) = self.input_ids.v_idxs.iter().find(|(w, _)| *w == n_embd_v) {
            return Ok(id);
        }
        let ne = [n_embd_v * self.shape.n_tokens];
        let fill = Box::new(inputs::VIdxs { n_embd_v });
        let id = self.add_input(DType::I32, &ne, "v_idxs", fill)?;
        self.input_ids.v_idxs.push((n_embd_v, id));
        Ok(id)
    }

    /// `[n_outputs]` i32 rows whose logits are wanted.
    pub fn inp_out_ids(&mut self) -> Result<TensorId, ModelError> {
        let ne = [self.shape.n_outputs];
        self.input_once(
            |i| &mut i.out_ids,
            DType::I32,
            &ne,
            "out_ids",
            || Box::new(inputs::OutIds),
        )
    }

    /// `[1, 1, n_tokens]` f32 per-token attention temperature (see
    /// [`inputs::AttnTemperature`]).
    pub fn inp_attn_temperature(
        &mut self,
        scale: f32,
        floor_scale: u32,
    ) -> Result<TensorId, ModelError> {
        let ne = [1, 1, self.shape.n_tokens];
        let fill = inputs::AttnTemperature {
            scale,
            floor_scale,
            offset: 0.0,
        };
        self.input_once(
            |i| &mut i.attn_temperature,
            DType::F32,
            &ne,
            "inp_attn_scale",
            || Box::new(fill),
        )
    }

    // ---- blocks ----

    /// The weight as a graph leaf bound to the model's memory.
    pub fn weight(&mut self, w: WeightRef) -> Result<TensorId, ModelError> {
        let key = (w.offset, self.device);
        if let Some(&id) = self.weight_ids.get(&key) {
            return Ok(id);
        }
        let id = self.g.new_tensor(w.dtype, &w.ne)?;
        self.g.add_flags(id, TensorFlags::WEIGHT)?;
        let (memory, offset) = self.ctx.weights[self.device]
            .locate(w.offset)
            .ok_or_else(|| {
                ModelError::Placement(format!(
                    "the weight at file offset {} was not loaded onto {}",
                    w.offset,
                    self.ctx.plan.devices[self.device].name()
                ))
            })?;
        self.g.bind(id, memory, offset)?;
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

    /// `norm(x) * w (+ b)`, as llama.cpp's `build_norm`.
    pub fn norm(
        &mut self,
        x: TensorId,
        nw: &NormWeights,
        kind: NormKind,
    ) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let mut cur = match kind {
            NormKind::Rms => self.g.rms_norm(x, hp.norm_rms_eps)?,
            NormKind::Layer => self.g.norm(x, hp.norm_eps)?,
        };
        let w = self.weight(nw.w)?;
        cur = self.g.mul(cur, w)?;
        if let Some(b) = nw.b {
            let b = self.weight(b)?;
            cur = self.g.add(cur, b)?;
        }
        Ok(cur)
    }

    /// `w · x`, times its scale, plus its bias: llama.cpp's `build_lora_mm(w, x, w_s)` and the
    /// bias add after it (projections, attention output, LM head).
    pub fn linear(&mut self, x: TensorId, l: &Linear) -> Result<TensorId, ModelError> {
        self.linear_in_order(x, l, false)
    }

    /// `w · x`, plus its bias, times its scale: the order of llama.cpp's `build_ffn`.
    pub fn linear_ffn(&mut self, x: TensorId, l: &Linear) -> Result<TensorId, ModelError> {
        self.linear_in_order(x, l, true)
    }

    fn linear_in_order(
        &mut self,
        x: TensorId,
        l: &Linear,
        bias_first: bool,
    ) -> Result<TensorId, ModelError> {
        let w = self.weight(l.w)?;
        let mut y = self.g.mul_mat(w, x)?;
        let scale = l.scale.map(|s| self.weight(s)).transpose()?;
        let bias = l.b.map(|b| self.weight(b)).transpose()?;
        if bias_first && let Some(b) = bias {
            y = self.g.add(y, b)?;
        }
        if let Some(s) = scale {
            y = self.g.mul(y, s)?;
        }
        if !bias_first && let Some(b) = bias {
            y = self.g.add(y, b)?;
        }
        Ok(y)
    }

    /// Layer `il`'s Q, K and V projections of `x`, as `[head_dim, n_head(_kv), n_tokens]`
    /// (llama.cpp's `build_qkv`: views of one product when the projection is fused).
    pub fn qkv(
        &mut self,
        il: usize,
        x: TensorId,
        aw: &AttnWeights,
    ) -> Result<(TensorId, TensorId, TensorId), ModelError> {
        let hp = self.hp();
        let n_tokens = self.shape.n_tokens;
        let (head_k, head_v) = (hp.n_embd_head_k as usize, hp.n_embd_head_v as usize);
        let (n_head, n_head_kv) = (hp.n_head[il] as usize, hp.n_head_kv[il] as usize);
        match &aw.qkv {
            Qkv::Separate { q, k, v } => {
                let q = self.linear(x, q)?;
                let k = self.linear(x, k)?;
                let v = self.linear(x, v)?;
                Ok((
                    self.g.reshape(q, &[head_k, n_head, n_tokens])?,
                    self.g.reshape(k, &[head_k, n_head_kv, n_tokens])?,
                    self.g.reshape(v, &[head_v, n_head_kv, n_tokens])?,
                ))
            }
            Qkv::Fused(l) => {
                let qkv = self.linear(x, l)?;
                let row = self.g.tensor(qkv).nb()[1];
                let (n_q, n_k) = (head_k * n_head, head_k * n_head_kv);
                let q = self
                    .g
                    .view_3d(qkv, head_k, n_head, n_tokens, 4 * head_k, row, 0)?;
                let k =
                    self.g
                        .view_3d(qkv, head_k, n_head_kv, n_tokens, 4 * head_k, row, 4 * n_q)?;
                let v = self.g.view_3d(
                    qkv,
                    head_v,
                    n_head_kv,
                    n_tokens,
                    4 * head_v,
                    row,
                    4 * (n_q + n_k),
                )?;
                Ok((q, k, v))
            }
        }
    }

    /// Layer `il`'s Q, K and V projections of `x` as matrices `[width, n_tokens]`, contiguous
    /// (llama.cpp's `build_qkv` with `reshape = false`), for graphs that norm them whole.
    pub fn qkv_flat(
        &mut self,
        il: usize,
        x: TensorId,
        aw: &AttnWeights,
    ) -> Result<(TensorId, TensorId, TensorId), ModelError> {
        let hp = self.hp();
        let n_tokens = self.shape.n_tokens;
        match &aw.qkv {
            Qkv::Separate { q, k, v } => {
                Ok((self.linear(x, q)?, self.linear(x, k)?, self.linear(x, v)?))
            }
            Qkv::Fused(l) => {
                let qkv = self.linear(x, l)?;
                let row = self.g.tensor(qkv).nb()[1];
                let n_q = hp.n_embd_q(il) as usize;
                let n_k = hp.n_embd_k_gqa(il) as usize;
                let n_v = hp.n_embd_v_gqa(il) as usize;
                let q = self.g.view_2d(qkv, n_q, n_tokens, row, 0)?;
                let k = self.g.view_2d(qkv, n_k, n_tokens, row, 4 * n_q)?;
                let v = self.g.view_2d(qkv, n_v, n_tokens, row, 4 * (n_q + n_k))?;
                Ok((self.g.cont(q)?, self.g.cont(k)?, self.g.cont(v)?))
            }
        }
    }

    /// `[width, n_tokens]` as `[head_dim, width / head_dim, n_tokens]`.
    pub fn heads(&mut self, x: TensorId, head_dim: usize) -> Result<TensorId, ModelError> {
        let ne = self.g.tensor(x).ne();
        Ok(self.g.reshape(x, &[head_dim, ne[0] / head_dim, ne[1]])?)
    }

    /// The feed-forward network (llama.cpp's `build_ffn`): with a gate, the parallel gated form
    /// `down(act(gate(x)) * up(x))`; without, `down(act(up(x)))`.
    pub fn ffn(
        &mut self,
        x: TensorId,
        fw: &FfnWeights,
        act: FfnAct,
    ) -> Result<TensorId, ModelError> {
        let up = self.linear_ffn(x, &fw.up)?;
        let h = match &fw.gate {
            Some(gate) => {
                let gate = self.linear_ffn(x, gate)?;
                match act {
                    FfnAct::Silu | FfnAct::SwiGluFused => self.g.swiglu_split(gate, up)?,
                    FfnAct::Gelu => self.g.geglu_split(gate, up)?,
                }
            }
            None => match act {
                FfnAct::Silu => self.g.silu(up)?,
                FfnAct::Gelu => self.g.gelu(up)?,
                FfnAct::SwiGluFused => self.g.glu(GluOp::SwiGlu, up, false)?,
            },
        };
        self.linear_ffn(h, &fw.down)
    }

    /// Token embeddings of the batch, `[n_embd, n_tokens]`.
    pub fn embeddings(&mut self, tok_embd: WeightRef) -> Result<TensorId, ModelError> {
        let tokens = self.inp_tokens()?;
        let tok_embd = self.weight(tok_embd)?;
        Ok(self.g.get_rows(tok_embd, tokens)?)
    }

    /// RoPE for layer `il` on `x` (`[head_dim, n_head, n_tokens]`) with the layer's base and
    /// scale, and optional per-pair frequency factors.
    pub fn rope(
        &mut self,
        x: TensorId,
        il: usize,
        factors: Option<WeightRef>,
    ) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let (freq_base, freq_scale) = hp.rope_freq(il);
        self.rope_with(x, factors, freq_base, freq_scale, hp.yarn_factors())
    }

    /// [`Builder::rope`] of dims `n_offs..n_offs + n_rot` only (the others pass through:
    /// DeepSeek's Q, whose rotary part comes last).
    pub fn rope_offset(
        &mut self,
        x: TensorId,
        il: usize,
        n_offs: usize,
    ) -> Result<TensorId, ModelError> {
        let y = self.rope(x, il, None)?;
        self.g.rope_set_offset(y, n_offs)?;
        Ok(y)
    }

    /// RoPE on `x` with the given base and scale and YaRN `(ext_factor, attn_factor)`.
    pub fn rope_with(
        &mut self,
        x: TensorId,
        factors: Option<WeightRef>,
        freq_base: f32,
        freq_scale: f32,
        (ext_factor, attn_factor): (f32, f32),
    ) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let mode = match hp.rope_type {
            RopeType::Normal => RopeMode::Normal,
            RopeType::Neox => RopeMode::Neox,
        };
        let mut params = RopeParams::new(hp.n_rot as usize, mode, freq_base);
        params.freq_scale = freq_scale;
        params.n_ctx_orig = hp.n_ctx_orig as usize;
        params.ext_factor = ext_factor;
        params.attn_factor = attn_factor;
        params.beta_fast = hp.yarn_beta_fast;
        params.beta_slow = hp.yarn_beta_slow;
        let pos = self.inp_pos()?;
        let factors = factors.map(|f| self.weight(f)).transpose()?;
        Ok(self.g.rope_ext(x, pos, factors, params)?)
    }

    /// Writes this batch's K and V of layer `il` into the cache and attends over it, as
    /// llama.cpp's `build_attn` without flash attention: `softmax(K·Q * kq_scale + mask)`
    /// then `V·kq`, heads merged, through `wo`. `q`, `k`, `v` are `[head_dim, n_head(_kv), n_tokens]`.
    pub fn attention(
        &mut self,
        il: usize,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        params: AttnParams,
        wo: &Linear,
    ) -> Result<TensorId, ModelError> {
        let merged = self.attend(il, q, k, v, params)?;
        self.linear(merged, wo)
    }

    /// [`Builder::attention`] without the output projection: the heads merged,
    /// `[head_v * n_head, n_tokens]`.
    ///
    /// Around a quantized cache, llama.cpp rotates by a Walsh-Hadamard matrix (an orthonormal
    /// change of basis per run of 64+ values, which spreads outliers before they are
    /// quantized): Q and K when K is quantized, V when V is, and the output back again.
    pub fn attend(
        &mut self,
        il: usize,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        params: AttnParams,
    ) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let fmt = self.ctx.kv.format();
        let v_in_k = self.ctx.kv.layer(il).v_in_k;
        let (head_k, head_v) = (hp.n_embd_head_k as usize, hp.n_embd_head_v as usize);
        // K: the largest power of two (64 or more) dividing the head; V: 64.
        let rot_k = (fmt.type_k.is_quantized() && head_k.is_multiple_of(64))
            .then(|| 1usize << head_k.trailing_zeros());
        let rot_v =
            (!v_in_k && fmt.type_v.is_quantized() && head_v.is_multiple_of(64)).then_some(64);
        let (mut q, mut k, mut v) = (q, k, v);
        if let Some(n) = rot_k {
            q = self.hadamard(q, n)?;
            k = self.hadamard(k, n)?;
        }
        if let Some(n) = rot_v {
            v = self.hadamard(v, n)?;
        }
        let merged = self.attend_cache(il, q, k, v, params)?;
        // A K-only cache's V is rotated with K.
        match if v_in_k { rot_k } else { rot_v } {
            Some(n) => self.hadamard(merged, n),
            None => Ok(merged),
        }
    }

    /// `x` rotated per run of `n` values (contiguous first, as llama.cpp's
    /// `llama_mul_mat_hadamard`).
    fn hadamard(&mut self, x: TensorId, n: usize) -> Result<TensorId, ModelError> {
        let x = if self.g.tensor(x).layout.is_contiguous() {
            x
        } else {
            self.g.cont(x)?
        };
        Ok(self.g.hadamard(x, n)?)
    }

    /// [`Builder::attend`] after any rotation: store K and V, attend over the cache.
    fn attend_cache(
        &mut self,
        il: usize,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        params: AttnParams,
    ) -> Result<TensorId, ModelError> {
        let hp = self.hp();
        let n_tokens = self.shape.n_tokens;
        let (kv_start, n_kv) = (self.shape.kv_start, self.shape.n_kv);
        let head_k = hp.n_embd_head_k as usize;
        let head_v = hp.n_embd_head_v as usize;
        let n_head = hp.n_head[il] as usize;
        let n_head_kv = hp.n_head_kv[il] as usize;
        let kv = self.ctx.kv;
        let fmt = kv.format();
        let lc = kv.layer(il);
        let size = kv.size();
        let row_bytes = |t: DType, n: usize| -> Result<usize, ModelError> {
            t.row_size(n as u64)
                .map(|b| b as usize)
                .map_err(|e| ModelError::Placement(format!("layer {il}: {e}")))
        };

        // The layer's cache as graph leaves over its device's cache buffer.
        let kv_memory = self.ctx.kv_memory[lc.device]
            .clone()
            .ok_or_else(|| ModelError::Placement(format!("layer {il} has no cache")))?;
        let k_cache = self.g.new_tensor(fmt.type_k, &[lc.n_embd_k, size])?;
        self.g.bind(k_cache, kv_memory.clone(), lc.k_offset)?;
        // Store: K rows go to their cells.
        let k_idxs = self.inp_k_idxs()?;
        let k_rows = self.g.reshape(k, &[lc.n_embd_k, n_tokens])?;
        let k_stored = self.g.set_rows(k_cache, k_rows, k_idxs)?;
        let row_k = row_bytes(fmt.type_k, lc.n_embd_k)?;

        // Read back n_kv cells from kv_start, per KV head (views of the stores, so they run
        // first).
        let k_view = self.g.view_3d(
            k_stored,
            head_k,
            n_kv,
            n_head_kv,
            row_k,
            row_bytes(fmt.type_k, head_k)?,
            kv_start * row_k,
        )?;
        if self.ctx.flash_attn {
            // V as rows: stored like K, or (K-only cache) the start of each K row.
            let v_view = if lc.v_in_k {
                self.g
                    .view_3d(k_stored, head_v, n_kv, 1, row_k, row_k, kv_start * row_k)?
            } else {
                let v_cache = self.g.new_tensor(fmt.type_v, &[lc.n_embd_v, size])?;
                self.g.bind(v_cache, kv_memory, lc.v_offset)?;
                let v_rows = self.g.reshape(v, &[lc.n_embd_v, n_tokens])?;
                let v_stored = self.g.set_rows(v_cache, v_rows, k_idxs)?;
                let row_v = row_bytes(fmt.type_v, lc.n_embd_v)?;
                self.g.view_3d(
                    v_stored,
                    head_v,
                    n_kv,
                    n_head_kv,
                    row_v,
                    row_bytes(fmt.type_v, head_v)?,
                    kv_start * row_v,
                )?
            };
            return self.flash_attend(il, q, k_view, v_view, params);
        }
        let ts = fmt.type_v.type_size() as usize;
        let v_view = if lc.v_in_k {
            // K-only cache (absorbed MLA, one KV head): V is the start of each K row, read
            // transposed into a contiguous copy as llama.cpp's non-flash path does.
            if n_head_kv != 1 {
                return Err(ModelError::Placement(format!(
                    "layer {il}: V inside K needs one KV head"
                )));
            }
            let v_rows = self
                .g
                .view_2d(k_stored, head_v, n_kv, row_k, kv_start * row_k)?;
            let v_t = self.g.transpose(v_rows)?;
            let v_t = self.g.cont(v_t)?;
            self.g.reshape(v_t, &[n_kv, head_v, 1])?
        } else {
            // V, stored transposed, element by element.
            let v_cache = self.g.new_tensor(fmt.type_v, &[lc.n_embd_v * size])?;
            self.g.bind(v_cache, kv_memory, lc.v_offset)?;
            let v_idxs = self.inp_v_idxs(lc.n_embd_v)?;
            let v_elems = self.g.reshape(v, &[1, lc.n_embd_v * n_tokens])?;
            let v_as_rows = self.g.reshape(v_cache, &[1, lc.n_embd_v * size])?;
            let v_stored = self.g.set_rows(v_as_rows, v_elems, v_idxs)?;
            self.g.view_3d(
                v_stored,
                n_kv,
                head_v,
                n_head_kv,
                size * ts,
                size * ts * head_v,
                kv_start * ts,
            )?
        };

        let q = self.g.permute(q, [0, 2, 1, 3])?;
        let mask = self.inp_kq_mask(il)?;
        let kq_scale = params.kq_scale;
        // Sinks are created before the node that uses them.
        let sinks = params.sinks.map(|w| self.weight(w)).transpose()?;
        let merged = if params.softcap != 0.0 {
            // Soft-capping changes the scores between K·Q and the softmax: the unfused path,
            // every score computed (the cap must not see skipped ones).
            let kq = self.g.mul_mat(k_view, q)?;
            let kq = self.softcap(kq, params.softcap)?;
            let kq = self.g.soft_max_ext(kq, Some(mask), kq_scale, 0.0)?;
            if let Some(s) = sinks {
                self.g.soft_max_add_sinks(kq, s)?;
            }
            let kqv = self.g.mul_mat(v_view, kq)?;
            let merged = self.g.permute(kqv, [0, 2, 1, 3])?;
            self.g.cont(merged)?
        } else if n_tokens > 1
            && fmt.type_k == fmt.type_v
            && matches!(fmt.type_k, DType::F16 | DType::F32)
        {
            // Fused: the same arithmetic without the `[n_kv, n_tokens, n_head]` score tensor,
            // the largest activation of a prompt micro-batch (9.4 MB for SmolLM2 at 512
            // tokens, and growing with the context).
            let attn = self.g.attention(q, k_view, v_view, mask, kq_scale)?;
            if let Some(s) = sinks {
                self.g.attention_add_sinks(attn, s)?;
            }
            attn
        } else {
            // Scores the mask removes need not be computed (a causal mask: about half).
            let kq = self.g.mul_mat_masked(k_view, q, mask)?;
            let kq = self.g.soft_max_ext(kq, Some(mask), kq_scale, 0.0)?;
            if let Some(s) = sinks {
                self.g.soft_max_add_sinks(kq, s)?;
            }
            let kqv = self.g.mul_mat(v_view, kq)?;
            let merged = self.g.permute(kqv, [0, 2, 1, 3])?;
            self.g.cont(merged)?
        };
        Ok(self.g.reshape(merged, &[head_v * n_head, n_tokens])?)
    }

    /// llama.cpp's `build_attn_mha` with flash attention: `flash_attn_ext` over the cache
    /// views (an f32 cache cast to f16 first, as llama.cpp does), heads merged.
    fn flash_attend(
        &mut self,
        il: usize,
        q: TensorId,
        k_view: TensorId,
        v_view: TensorId,
        params: AttnParams,
    ) -> Result<TensorId, ModelError> {
        let n_tokens = self.shape.n_tokens;
        let hp = self.hp();
        let (head_v, n_head) = (hp.n_embd_head_v as usize, hp.n_head[il] as usize);
        let mut k = k_view;
        let mut v = v_view;
        if self.g.tensor(k).layout.dtype == DType::F32 {
            k = self.g.cast(k, DType::F16)?;
        }
        if self.g.tensor(v).layout.dtype == DType::F32 {
            v = self.g.cast(v, DType::F16)?;
        }
        let q = self.g.permute(q, [0, 2, 1, 3])?;
        let mask = self.inp_kq_mask(il)?;
        // Sinks are created before the node that uses them.
        let sinks = params.sinks.map(|w| self.weight(w)).transpose()?;
        let attn = self.g.flash_attn_ext(
            q,
            k,
            v,
            mask,
            params.kq_scale,
            0.0,
            params.softcap,
            self.ctx.n_threads.max(1),
        )?;
        if let Some(s) = sinks {
            self.g.attention_add_sinks(attn, s)?;
        }
        Ok(self.g.reshape(attn, &[head_v * n_head, n_tokens])?)
    }

    /// `cap * tanh(x / cap)` (llama.cpp's soft-capping of scores and logits).
    pub fn softcap(&mut self, x: TensorId, cap: f32) -> Result<TensorId, ModelError> {
        let x = self.g.scale(x, 1.0 / cap)?;
        let x = self.g.tanh(x)?;
        Ok(self.g.scale(x, cap)?)
    }

    /// At the last layer, keeps only the rows whose logits are wanted (llama.cpp's `inp_out_ids`).
    pub fn select_outputs(&mut self, x: TensorId) -> Result<TensorId, ModelError> {
        if self.shape.n_outputs == self.shape.n_tokens {
            return Ok(x);
        }
        let out_ids = self.inp_out_ids()?;
        Ok(self.g.get_rows(x, out_ids)?)
    }

    /// Final norm and LM head (or, for embeddings, the final norm alone), on the output layer's
    /// device.
    pub fn output(
        &mut self,
        x: TensorId,
        norm: &NormWeights,
        kind: NormKind,
        lm_head: &Linear,
    ) -> Result<TensorId, ModelError> {
        self.begin_output();
        let x = self.norm(x, norm, kind)?;
        if self.shape.embeddings {
            return Ok(x);
        }
        self.linear(x, lm_head)
    }
}
