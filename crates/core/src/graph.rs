//! The graph IR: an arena of tensor nodes built the way ggml graphs are built, so that models can
//! be ported from llama.cpp's graph builders line by line.
//!
//! A [`Graph`] owns its tensors; a [`TensorId`] addresses one. Tensors are created in topological
//! order (every source exists before its consumer), so creation order is a valid execution order.
//! The IR is backend-neutral: a tensor's memory is a [`Binding`] to some backend's buffer
//! (through the [`BufferMemory`] trait), set either by the caller (weights, KV cache) or by a
//! graph allocator (inputs and intermediates). Which device runs which node is kept outside the
//! graph, by the scheduler.

use std::any::Any;
use std::fmt;
use std::sync::Arc;

use crate::dtype::DType;
use crate::tensor::{Layout, MAX_DIMS, TensorError, TensorFlags};

/// Index of a tensor in its [`Graph`].
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u32);

impl TensorId {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for TensorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Memory a tensor can be bound to. Implemented by the device layer's buffers; the IR only needs
/// identity and size, and lets the backend recover its own type through [`BufferMemory::as_any`].
pub trait BufferMemory: Any + Send + Sync + fmt::Debug {
    /// Process-unique id of the buffer (never reused).
    fn memory_id(&self) -> u64;
    /// Size in bytes.
    fn size(&self) -> usize;
    fn as_any(&self) -> &dyn Any;
}

/// Where a (non-view) tensor's bytes live.
#[derive(Clone, Debug)]
pub struct Binding {
    pub memory: Arc<dyn BufferMemory>,
    pub offset: usize,
}

/// Unary element-wise functions (ggml's `GGML_UNARY_OP_*` of the same names).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnaryOp {
    Silu,
    /// GELU, tanh approximation.
    Gelu,
    /// `1 / (1 + exp(-x))`.
    Sigmoid,
    /// `log(1 + exp(x))`, `x` itself above 20.
    Softplus,
    Tanh,
    /// `max(x, 0)` (0 for NaN).
    Relu,
    /// `x * x` (ggml's `GGML_OP_SQR`).
    Sqr,
    /// ggml's `GGML_OP_SQRT`.
    Sqrt,
    Exp,
    /// Exact GELU: `0.5 x (1 + erf(x / sqrt 2))`.
    GeluErf,
}

/// Gated linear units: `act(a) * b` (ggml's `GGML_GLU_OP_*`).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GluOp {
    SwiGlu,
    GeGlu,
    /// `relu(a) * b`.
    ReGlu,
    /// Exact-GELU gate: `gelu_erf(a) * b`.
    GeGluErf,
    /// gpt-oss: `x = min(a, limit)`, `y = clamp(b, -limit, limit)`,
    /// `x / (1 + exp(-alpha x)) * (y + 1)`.
    SwiGluOai,
    /// `silu(min(a, limit)) * clamp(b, -limit, limit)`.
    SwiGluClamp,
}

impl GluOp {
    pub fn name(self) -> &'static str {
        match self {
            GluOp::SwiGlu => "SWIGLU",
            GluOp::GeGlu => "GEGLU",
            GluOp::ReGlu => "REGLU",
            GluOp::GeGluErf => "GEGLU_ERF",
            GluOp::SwiGluOai => "SWIGLU_OAI",
            GluOp::SwiGluClamp => "SWIGLU_CLAMP",
        }
    }
}

impl UnaryOp {
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Silu => "SILU",
            UnaryOp::Gelu => "GELU",
            UnaryOp::Sigmoid => "SIGMOID",
            UnaryOp::Softplus => "SOFTPLUS",
            UnaryOp::Tanh => "TANH",
            UnaryOp::Relu => "RELU",
            UnaryOp::Sqr => "SQR",
            UnaryOp::Sqrt => "SQRT",
            UnaryOp::Exp => "EXP",
            UnaryOp::GeluErf => "GELU_ERF",
        }
    }
}

/// Sort order of [`Graph::argsort`] (ggml's `GGML_SORT_ORDER_*`).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SortOrder {
    Asc,
    Desc,
}

/// Rotary embedding modes (ggml's `GGML_ROPE_TYPE_*`).
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Rotate adjacent pairs `(x[2i], x[2i+1])`.
    Normal,
    /// Rotate halves `(x[i], x[i + n_dims/2])` (GPT-NeoX).
    Neox,
}

/// Parameters of `rope_ext`, as in ggml.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Number of leading dimensions rotated (partial rotary when less than `ne[0]`).
    pub n_dims: usize,
    pub mode: RopeMode,
    pub n_ctx_orig: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    /// First rotated dimension (ggml_rope_set_offset; DeepSeek-2 ropes the trailing dims):
    /// dims `n_offs..n_offs + n_dims` rotate, the others are copied. 0 by default.
    pub n_offs: usize,
}

impl RopeParams {
    /// Plain RoPE (no YaRN) over `n_dims` dimensions.
    pub fn new(n_dims: usize, mode: RopeMode, freq_base: f32) -> RopeParams {
        RopeParams {
            n_dims,
            mode,
            n_ctx_orig: 0,
            freq_base,
            freq_scale: 1.0,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_offs: 0,
        }
    }
}

/// What computes a tensor. View-like ops (`View`, `Reshape`, `Permute`, `Transpose`) compute
/// nothing: the tensor aliases its view source.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Op {
    /// A leaf: weights, inputs, caches.
    Leaf,
    View,
    Reshape,
    Permute([usize; MAX_DIMS]),
    Transpose,
    GetRows,
    MulMat,
    /// Expert products (see [`Graph::mul_mat_id`]): `src` = weights, activations, i32 ids.
    MulMatId,
    Add,
    Mul,
    Div,
    /// `a + b[ids]` row by row (see [`Graph::add_id`]): `src` = a, b, ids.
    AddId,
    SumRows,
    /// `src[0]` tiled to the output's shape.
    Repeat,
    /// Every element set to `value` (the source only gives the shape).
    Fill {
        value: f32,
    },
    Clamp {
        min: f32,
        max: f32,
    },
    /// i32 indices that sort each row.
    ArgSort(SortOrder),
    /// i32 indices of the `ne0` largest values of each row, in ggml-cpu's (unspecified) order.
    TopK,
    Scale {
        scale: f32,
        bias: f32,
    },
    RmsNorm {
        eps: f32,
    },
    Norm {
        eps: f32,
    },
    Rope(RopeParams),
    /// `src` = input, optional mask, optional f32 sinks (one per dim-2 index; see
    /// [`Graph::soft_max_add_sinks`]).
    SoftMax {
        scale: f32,
        max_bias: f32,
    },
    Unary(UnaryOp),
    /// `src[1]` present: split form `act(a) * b`; absent: `a` holds both halves along dim 0.
    /// `alpha` and `limit` are the parameters of `SwiGluOai` / `SwiGluClamp` (0 otherwise).
    Glu {
        op: GluOp,
        swapped: bool,
        alpha: f32,
        limit: f32,
    },
    /// Writes rows of `src[0]` into the view source at row indices `src[1]`.
    SetRows,
    /// Copies (and converts) `src[0]` into the view source.
    Cpy,
    Cont,
    Concat {
        dim: usize,
    },
    ArgMax,
    /// Fused attention (see [`Graph::attention`]): `src` = q, k, v, mask, optional sinks
    /// ([`Graph::attention_add_sinks`]).
    Attention {
        scale: f32,
    },
    /// Walsh-Hadamard transform of every run of `n` values (see [`Graph::hadamard`]).
    Hadamard {
        n: usize,
    },
    /// ggml's `flash_attn_ext` (see [`Graph::flash_attn_ext`]): `src` = q, k, v, mask,
    /// optional sinks.
    FlashAttnExt {
        scale: f32,
        max_bias: f32,
        softcap: f32,
        /// The thread count llama.cpp would run the node with (`n_threads`): a one-token
        /// step over at least 512 f16/f32 cells splits the cells into that many chunks, and
        /// the split changes the rounding.
        kv_chunks: u32,
    },
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Leaf => "NONE",
            Op::View => "VIEW",
            Op::Reshape => "RESHAPE",
            Op::Permute(_) => "PERMUTE",
            Op::Transpose => "TRANSPOSE",
            Op::GetRows => "GET_ROWS",
            Op::MulMat => "MUL_MAT",
            Op::MulMatId => "MUL_MAT_ID",
            Op::Add => "ADD",
            Op::Mul => "MUL",
            Op::Div => "DIV",
            Op::AddId => "ADD_ID",
            Op::SumRows => "SUM_ROWS",
            Op::Repeat => "REPEAT",
            Op::Fill { .. } => "FILL",
            Op::Clamp { .. } => "CLAMP",
            Op::ArgSort(_) => "ARGSORT",
            Op::TopK => "TOP_K",
            Op::Scale { .. } => "SCALE",
            Op::RmsNorm { .. } => "RMS_NORM",
            Op::Norm { .. } => "NORM",
            Op::Rope(_) => "ROPE",
            Op::SoftMax { .. } => "SOFT_MAX",
            Op::Attention { .. } => "ATTENTION",
            Op::FlashAttnExt { .. } => "FLASH_ATTN_EXT",
            Op::Hadamard { .. } => "HADAMARD",
            Op::Unary(u) => u.name(),
            Op::Glu { op, .. } => op.name(),
            Op::SetRows => "SET_ROWS",
            Op::Cpy => "CPY",
            Op::Cont => "CONT",
            Op::Concat { .. } => "CONCAT",
            Op::ArgMax => "ARGMAX",
        }
    }

    /// Ops that only reinterpret their source's memory.
    pub fn is_view(&self) -> bool {
        matches!(
            self,
            Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose
        )
    }

    /// Ops that do work on a device (not leaves, not views).
    pub fn is_compute(&self) -> bool {
        !matches!(self, Op::Leaf) && !self.is_view()
    }

    /// Ops whose output may take the memory of their first source (same size, and no later
    /// reader of that source), as ggml-alloc lets them: each output row depends only on the
    /// same input row, which backends read before writing. Softmax (attention scores, when not
    /// fused) and the gated activation (the FFN's widest intermediates) are the ones that matter.
    pub fn runs_in_place(&self) -> bool {
        matches!(self, Op::SoftMax { .. } | Op::Glu { .. })
    }
}

/// Sources a node can have (fused attention has five: q, k, v, mask and optional sinks).
pub const MAX_SRC: usize = 5;

/// A node of the graph.
#[derive(Clone, Debug)]
pub struct Tensor {
    pub layout: Layout,
    pub op: Op,
    pub src: [Option<TensorId>; MAX_SRC],
    /// The root tensor whose memory this one aliases (never itself a view), with a byte offset.
    pub view_src: Option<TensorId>,
    pub view_offset: usize,
    pub flags: TensorFlags,
    pub name: String,
    /// Memory of a root tensor; views resolve through `view_src`.
    pub binding: Option<Binding>,
}

impl Tensor {
    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }
    pub fn ne(&self) -> [usize; MAX_DIMS] {
        self.layout.ne
    }
    pub fn nb(&self) -> [usize; MAX_DIMS] {
        self.layout.nb
    }
    pub fn sources(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.src.iter().flatten().copied()
    }
}

/// Errors from building or binding a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    #[error("{op}: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op}: unsupported type {dtype}")]
    Type { op: &'static str, dtype: DType },
    #[error("tensor {0} does not belong to this graph")]
    UnknownTensor(TensorId),
    #[error("tensor {0} is a view; bind its view source instead")]
    BindView(TensorId),
    #[error(
        "binding of tensor {id} ({need} bytes at offset {offset}) exceeds its buffer of {size} bytes"
    )]
    BindOutOfBounds {
        id: TensorId,
        offset: usize,
        need: usize,
        size: usize,
    },
    #[error("graph too large")]
    TooLarge,
    #[error(transparent)]
    Tensor(#[from] TensorError),
}

/// The shapes attention over a cache needs: q `[head_k, n_tokens, n_head]`, k `[head_k, n_kv,
/// n_head_kv]`, v with its cell axis `v_kv_axis` (0 when stored transposed, 1 as rows) and
/// `n_head_kv` heads, a mask `[n_kv, >= n_tokens]`, all 3-D, heads sharing KV heads evenly,
/// packed rows (q's as `q_ok` says).
fn check_attention_shapes(
    op: &'static str,
    [lq, lk, lv, lm]: [Layout; 4],
    v_kv_axis: usize,
    q_ok: bool,
) -> Result<(), GraphError> {
    let (head_k, n_tokens, n_head) = (lq.ne[0], lq.ne[1], lq.ne[2]);
    let (n_kv, n_head_kv) = (lk.ne[1], lk.ne[2]);
    let ok = lk.ne[0] == head_k
        && lv.ne[v_kv_axis] == n_kv
        && lv.ne[2] == n_head_kv
        && n_head_kv != 0
        && n_head.is_multiple_of(n_head_kv)
        && [lq, lk, lv, lm].iter().all(|l| l.ne[3] == 1)
        && lm.ne[0] == n_kv
        && lm.ne[1] >= n_tokens
        && lm.ne[2] == 1
        && q_ok
        && lk.rows_packed()
        && lv.rows_packed()
        && lm.rows_packed();
    if ok {
        return Ok(());
    }
    Err(shape_err(
        op,
        format!(
            "q {:?}, k {:?}, v {:?}, mask {:?}",
            lq.ne, lk.ne, lv.ne, lm.ne
        ),
    ))
}

fn shape_err(op: &'static str, detail: impl Into<String>) -> GraphError {
    GraphError::Shape {
        op,
        detail: detail.into(),
    }
}

/// An arena of tensors in topological order.
#[derive(Clone, Debug, Default)]
pub struct Graph {
    tensors: Vec<Tensor>,
}

impl Graph {
    pub fn new() -> Graph {
        Graph::default()
    }

    pub fn with_capacity(n: usize) -> Graph {
        Graph {
            tensors: Vec::with_capacity(n),
        }
    }

    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Removes every tensor but keeps the allocation, so a graph rebuilt per batch does not
    /// reallocate its arena.
    pub fn clear(&mut self) {
        self.tensors.clear();
    }

    /// The first tensor named `name`.
    pub fn find(&self, name: &str) -> Option<TensorId> {
        self.tensors
            .iter()
            .position(|t| t.name == name)
            .map(|i| TensorId(i as u32))
    }

    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// The id the next tensor created will get.
    pub fn next_id(&self) -> TensorId {
        TensorId(self.tensors.len() as u32)
    }

    pub fn ids(&self) -> impl Iterator<Item = TensorId> + use<> {
        (0..self.tensors.len() as u32).map(TensorId)
    }

    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// A graph made of `tensors` as another process sent them (a device in another process
    /// computing part of a graph). Checks what the builders and the scheduler's rewrites
    /// guarantee: sources and view roots exist (a rewrite may point a node at a copy made
    /// later), view roots are not views, views and bindings lie within their memory.
    pub fn from_tensors(tensors: Vec<Tensor>) -> Result<Graph, GraphError> {
        u32::try_from(tensors.len()).map_err(|_| GraphError::TooLarge)?;
        for (i, t) in tensors.iter().enumerate() {
            let id = TensorId(i as u32);
            let bad = |detail: String| Err(shape_err("GRAPH", format!("tensor {id}: {detail}")));
            if let Some(s) = t.sources().find(|s| s.index() >= tensors.len()) {
                return bad(format!("source {s} does not exist"));
            }
            let Some(span) = t.layout.checked_span_bytes() else {
                let l = &t.layout;
                return bad(format!("bad shape {:?} / strides {:?}", l.ne, l.nb));
            };
            match t.view_src {
                Some(root) => {
                    let Some(r) = tensors.get(root.index()) else {
                        return bad(format!("view root {root} does not exist"));
                    };
                    let root_span = r.layout.span_bytes();
                    if r.view_src.is_some()
                        || t.binding.is_some()
                        || t.view_offset
                            .checked_add(span)
                            .is_none_or(|end| end > root_span)
                    {
                        return bad("view outside its root".into());
                    }
                }
                None => {
                    if let Some(b) = &t.binding
                        && b.offset
                            .checked_add(span)
                            .is_none_or(|end| end > b.memory.size())
                    {
                        return Err(GraphError::BindOutOfBounds {
                            id,
                            offset: b.offset,
                            need: span,
                            size: b.memory.size(),
                        });
                    }
                }
            }
        }
        Ok(Graph { tensors })
    }

    /// The tensor `id`. Panics on a foreign id; use [`Graph::get`] for a checked lookup.
    pub fn tensor(&self, id: TensorId) -> &Tensor {
        &self.tensors[id.index()]
    }

    pub fn get(&self, id: TensorId) -> Result<&Tensor, GraphError> {
        self.tensors
            .get(id.index())
            .ok_or(GraphError::UnknownTensor(id))
    }

    pub fn layout(&self, id: TensorId) -> &Layout {
        &self.tensors[id.index()].layout
    }

    /// The root tensor whose memory `id` uses (itself unless it is a view).
    pub fn root(&self, id: TensorId) -> TensorId {
        self.tensors[id.index()].view_src.unwrap_or(id)
    }

    /// The memory and byte offset of `id`, resolved through its view source.
    pub fn resolve(&self, id: TensorId) -> Option<(&Arc<dyn BufferMemory>, usize)> {
        let t = self.tensors.get(id.index())?;
        match t.view_src {
            Some(root) => {
                let b = self.tensors[root.index()].binding.as_ref()?;
                Some((&b.memory, b.offset + t.view_offset))
            }
            None => t.binding.as_ref().map(|b| (&b.memory, b.offset)),
        }
    }

    fn push(&mut self, t: Tensor) -> Result<TensorId, GraphError> {
        let id = u32::try_from(self.tensors.len()).map_err(|_| GraphError::TooLarge)?;
        self.tensors.push(t);
        Ok(TensorId(id))
    }

    fn check(&self, id: TensorId) -> Result<&Tensor, GraphError> {
        self.get(id)
    }

    fn node(
        &mut self,
        layout: Layout,
        op: Op,
        src: [Option<TensorId>; MAX_SRC],
    ) -> Result<TensorId, GraphError> {
        self.push(Tensor {
            layout,
            op,
            src,
            view_src: None,
            view_offset: 0,
            flags: TensorFlags::NONE,
            name: String::new(),
            binding: None,
        })
    }

    fn view_node(
        &mut self,
        of: TensorId,
        layout: Layout,
        op: Op,
        src: [Option<TensorId>; MAX_SRC],
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let t = self.check(of)?;
        let (root, base) = match t.view_src {
            Some(r) => (r, t.view_offset),
            None => (of, 0),
        };
        let root_span = self.tensors[root.index()].layout.span_bytes();
        let off = base.checked_add(offset).ok_or(GraphError::TooLarge)?;
        if off
            .checked_add(layout.span_bytes())
            .is_none_or(|end| end > root_span)
        {
            return Err(shape_err(
                op.name(),
                format!(
                    "view of {} bytes at offset {off} exceeds its source of {root_span} bytes",
                    layout.span_bytes()
                ),
            ));
        }
        self.push(Tensor {
            layout,
            op,
            src,
            view_src: Some(root),
            view_offset: off,
            flags: TensorFlags::NONE,
            name: String::new(),
            binding: None,
        })
    }

    // ----- rewriting (the scheduler's) -----

    /// A new unbound leaf with `id`'s layout (dtype, shape and strides) and name suffixed
    /// `suffix`: the destination of a copy of `id`'s memory.
    pub fn new_leaf_like(&mut self, id: TensorId, suffix: &str) -> Result<TensorId, GraphError> {
        let t = self.check(id)?;
        let (layout, name) = (t.layout, format!("{}{suffix}", t.name));
        let new = self.node(layout, Op::Leaf, [None; MAX_SRC])?;
        self.tensors[new.index()].name = name;
        Ok(new)
    }

    /// A copy of view `v` (same op, layout and offset) aliasing `root` instead of `v`'s root.
    /// `root` must have the layout of `v`'s root; the copy's sources become `root`.
    pub fn view_onto(&mut self, v: TensorId, root: TensorId) -> Result<TensorId, GraphError> {
        let t = self.check(v)?.clone();
        let old_root = t.view_src.ok_or_else(|| shape_err("VIEW", "not a view"))?;
        if self.check(root)?.layout != self.tensors[old_root.index()].layout {
            return Err(shape_err("VIEW", "new root differs in layout"));
        }
        self.push(Tensor {
            src: [Some(root), None, None, None, None],
            view_src: Some(root),
            binding: None,
            ..t
        })
    }

    /// Points every source of `node` that is `from` at `to`.
    pub fn replace_source(
        &mut self,
        node: TensorId,
        from: TensorId,
        to: TensorId,
    ) -> Result<(), GraphError> {
        self.check(to)?;
        let t = self
            .tensors
            .get_mut(node.index())
            .ok_or(GraphError::UnknownTensor(node))?;
        for s in t.src.iter_mut().flatten() {
            if *s == from {
                *s = to;
            }
        }
        Ok(())
    }

    /// A new leaf tensor of shape `ne` (1 to 4 dims), densely packed.
    pub fn new_tensor(&mut self, dtype: DType, ne: &[usize]) -> Result<TensorId, GraphError> {
        let layout = Layout::contiguous(dtype, ne)?;
        self.node(layout, Op::Leaf, [None; MAX_SRC])
    }

    /// A new leaf flagged as a graph input (written by the host before compute).
    pub fn new_input(&mut self, dtype: DType, ne: &[usize]) -> Result<TensorId, GraphError> {
        let id = self.new_tensor(dtype, ne)?;
        self.tensors[id.index()].flags.insert(TensorFlags::INPUT);
        Ok(id)
    }

    pub fn set_name(&mut self, id: TensorId, name: impl Into<String>) -> Result<(), GraphError> {
        self.tensors
            .get_mut(id.index())
            .ok_or(GraphError::UnknownTensor(id))?
            .name = name.into();
        Ok(())
    }

    pub fn add_flags(&mut self, id: TensorId, flags: TensorFlags) -> Result<(), GraphError> {
        self.tensors
            .get_mut(id.index())
            .ok_or(GraphError::UnknownTensor(id))?
            .flags
            .insert(flags);
        Ok(())
    }

    /// Marks `id` as a graph output: its memory survives until the graph is done.
    pub fn set_output(&mut self, id: TensorId) -> Result<(), GraphError> {
        self.add_flags(id, TensorFlags::OUTPUT)
    }

    /// Binds a root tensor to `offset` bytes into `memory` (weights, KV cache, or an allocator's
    /// compute buffer). The whole tensor must fit.
    pub fn bind(
        &mut self,
        id: TensorId,
        memory: Arc<dyn BufferMemory>,
        offset: usize,
    ) -> Result<(), GraphError> {
        let t = self
            .tensors
            .get_mut(id.index())
            .ok_or(GraphError::UnknownTensor(id))?;
        if t.view_src.is_some() {
            return Err(GraphError::BindView(id));
        }
        let need = t.layout.span_bytes();
        let size = memory.size();
        if offset.checked_add(need).is_none_or(|end| end > size) {
            return Err(GraphError::BindOutOfBounds {
                id,
                offset,
                need,
                size,
            });
        }
        t.binding = Some(Binding { memory, offset });
        Ok(())
    }

    // ----- views -----

    fn view_layout(
        &self,
        a: TensorId,
        ne: [usize; MAX_DIMS],
        nb: [usize; MAX_DIMS],
    ) -> Result<Layout, GraphError> {
        let dtype = self.check(a)?.layout.dtype;
        if ne.contains(&0) {
            return Err(shape_err("VIEW", "zero-sized dimension"));
        }
        if !ne[0].is_multiple_of(dtype.block_size() as usize) {
            return Err(shape_err(
                "VIEW",
                "row length is not a multiple of the block size",
            ));
        }
        Ok(Layout { dtype, ne, nb })
    }

    pub fn view_1d(
        &mut self,
        a: TensorId,
        ne0: usize,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let l = self.layout(a);
        let ts = l.dtype.type_size() as usize;
        let row = l.dtype.row_size(ne0 as u64).map_err(TensorError::from)? as usize;
        let layout = self.view_layout(a, [ne0, 1, 1, 1], [ts, row, row, row])?;
        self.view_node(
            a,
            layout,
            Op::View,
            [Some(a), None, None, None, None],
            offset,
        )
    }

    pub fn view_2d(
        &mut self,
        a: TensorId,
        ne0: usize,
        ne1: usize,
        nb1: usize,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let ts = self.check(a)?.layout.dtype.type_size() as usize;
        let layout = self.view_layout(a, [ne0, ne1, 1, 1], [ts, nb1, nb1 * ne1, nb1 * ne1])?;
        self.view_node(
            a,
            layout,
            Op::View,
            [Some(a), None, None, None, None],
            offset,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub fn view_3d(
        &mut self,
        a: TensorId,
        ne0: usize,
        ne1: usize,
        ne2: usize,
        nb1: usize,
        nb2: usize,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let ts = self.check(a)?.layout.dtype.type_size() as usize;
        let layout = self.view_layout(a, [ne0, ne1, ne2, 1], [ts, nb1, nb2, nb2 * ne2])?;
        self.view_node(
            a,
            layout,
            Op::View,
            [Some(a), None, None, None, None],
            offset,
        )
    }

    pub fn view_4d(
        &mut self,
        a: TensorId,
        ne: [usize; MAX_DIMS],
        nb1: usize,
        nb2: usize,
        nb3: usize,
        offset: usize,
    ) -> Result<TensorId, GraphError> {
        let ts = self.check(a)?.layout.dtype.type_size() as usize;
        let layout = self.view_layout(a, ne, [ts, nb1, nb2, nb3])?;
        self.view_node(
            a,
            layout,
            Op::View,
            [Some(a), None, None, None, None],
            offset,
        )
    }

    /// Reinterprets contiguous `a` with shape `ne`.
    pub fn reshape(&mut self, a: TensorId, ne: &[usize]) -> Result<TensorId, GraphError> {
        let src = self.check(a)?.layout;
        if !src.is_contiguous() {
            return Err(shape_err("RESHAPE", "source is not contiguous"));
        }
        let layout = Layout::contiguous(src.dtype, ne)?;
        if layout.nelements() != src.nelements() {
            return Err(shape_err(
                "RESHAPE",
                format!("{} elements cannot become {ne:?}", src.nelements()),
            ));
        }
        self.view_node(a, layout, Op::Reshape, [Some(a), None, None, None, None], 0)
    }

    /// ggml's permute: source dimension `i` moves to position `axes[i]`.
    pub fn permute(
        &mut self,
        a: TensorId,
        axes: [usize; MAX_DIMS],
    ) -> Result<TensorId, GraphError> {
        let src = self.check(a)?.layout;
        let mut seen = [false; MAX_DIMS];
        for &ax in &axes {
            if ax >= MAX_DIMS || seen[ax] {
                return Err(shape_err(
                    "PERMUTE",
                    format!("{axes:?} is not a permutation"),
                ));
            }
            seen[ax] = true;
        }
        let mut ne = [0; MAX_DIMS];
        let mut nb = [0; MAX_DIMS];
        for i in 0..MAX_DIMS {
            ne[axes[i]] = src.ne[i];
            nb[axes[i]] = src.nb[i];
        }
        if src.dtype.is_quantized() && axes[0] != 0 {
            return Err(GraphError::Type {
                op: "PERMUTE",
                dtype: src.dtype,
            });
        }
        let layout = Layout {
            dtype: src.dtype,
            ne,
            nb,
        };
        self.view_node(
            a,
            layout,
            Op::Permute(axes),
            [Some(a), None, None, None, None],
            0,
        )
    }

    /// Swaps dimensions 0 and 1.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        let mut l = self.check(a)?.layout;
        if l.dtype.is_quantized() {
            return Err(GraphError::Type {
                op: "TRANSPOSE",
                dtype: l.dtype,
            });
        }
        l.ne.swap(0, 1);
        l.nb.swap(0, 1);
        self.view_node(a, l, Op::Transpose, [Some(a), None, None, None, None], 0)
    }

    // ----- compute ops -----

    fn want_f32(&self, op: &'static str, id: TensorId) -> Result<Layout, GraphError> {
        let l = self.check(id)?.layout;
        if l.dtype != DType::F32 {
            return Err(GraphError::Type { op, dtype: l.dtype });
        }
        Ok(l)
    }

    fn f32_like(&self, l: &Layout) -> Result<Layout, GraphError> {
        Ok(Layout::contiguous(DType::F32, &l.ne)?)
    }

    /// Rows of `a` picked by the i32 indices `b` (any strides, e.g. a view of
    /// [`Graph::argsort_top_k`]): `[a.ne0, b.ne0, b.ne1, b.ne2]`, as f32 (i32 data stays i32).
    /// Index `b[i0, i1, i2]` picks row `(b[..], i1, i2)` of `a`: `a` is `[ne0, n_rows, b.ne1,
    /// b.ne2 or 1]`, so 3-D data has one set of rows per index column (`get_rows(reshape_3d(probs,
    /// 1, n_expert, n_tokens), selected)` picks each token's own probabilities).
    pub fn get_rows(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        let la = self.check(a)?.layout;
        let lb = self.check(b)?.layout;
        if lb.dtype != DType::I32 {
            return Err(GraphError::Type {
                op: "GET_ROWS",
                dtype: lb.dtype,
            });
        }
        if !matches!(la.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32)
            && !la.dtype.is_quantized()
        {
            return Err(GraphError::Type {
                op: "GET_ROWS",
                dtype: la.dtype,
            });
        }
        if la.ne[2] != lb.ne[1] || lb.ne[3] != 1 || la.ne[3] != lb.ne[2] && la.ne[3] != 1 {
            return Err(shape_err(
                "GET_ROWS",
                format!("data {:?} vs indices {:?}", la.ne, lb.ne),
            ));
        }
        if !la.rows_packed() {
            return Err(shape_err("GET_ROWS", "data rows must be packed"));
        }
        // f32 out, except i32 data (copied as is), as in ggml.
        let dtype = if la.dtype == DType::I32 {
            DType::I32
        } else {
            DType::F32
        };
        let layout = Layout::contiguous(dtype, &[la.ne[0], lb.ne[0], lb.ne[1], lb.ne[2]])?;
        self.node(layout, Op::GetRows, [Some(a), Some(b), None, None, None])
    }

    /// `a · bᵀ` per ggml: `a` is `[K, M, ..]` (weights, any type), `b` is `[K, N, ..]` f32;
    /// the result is `[M, N, b.ne2, b.ne3]`; `a` is broadcast over dims 2 and 3.
    pub fn mul_mat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        let layout = self.mul_mat_layout(a, b)?;
        self.node(layout, Op::MulMat, [Some(a), Some(b), None, None, None])
    }

    /// ggml_mul_mat_id, the mixture-of-experts product: `as` is `[K, M, n_expert]` (weights of
    /// any type `mul_mat` takes, packed rows), `b` is `[K, n_b1, n_tokens]` f32 (any strides;
    /// `n_b1` is 1, broadcast, or `n_used`), `ids` is i32 `[n_used, n_tokens]` (any strides,
    /// e.g. a view of [`Graph::argsort_top_k`]). The result is f32 `[M, n_used, n_tokens]`:
    /// column `(e, t)` is `as[:, :, ids[e, t]] · b[:, e % n_b1, t]`. An id outside
    /// `0..n_expert` is a compute error (the backend writes no garbage and reports it).
    pub fn mul_mat_id(
        &mut self,
        a: TensorId,
        b: TensorId,
        ids: TensorId,
    ) -> Result<TensorId, GraphError> {
        let la = self.check(a)?.layout;
        let lb = self.want_f32("MUL_MAT_ID", b)?;
        let li = self.check(ids)?.layout;
        if matches!(
            la.dtype,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::F64
        ) {
            return Err(GraphError::Type {
                op: "MUL_MAT_ID",
                dtype: la.dtype,
            });
        }
        if li.dtype != DType::I32 {
            return Err(GraphError::Type {
                op: "MUL_MAT_ID",
                dtype: li.dtype,
            });
        }
        if la.ne[0] != lb.ne[0]
            || la.ne[3] != 1
            || lb.ne[3] != 1
            || li.ne[2] != 1
            || li.ne[3] != 1
            || li.ne[1] != lb.ne[2]
            || li.ne[0] % lb.ne[1] != 0
        {
            return Err(shape_err(
                "MUL_MAT_ID",
                format!("{:?} x {:?} with ids {:?}", la.ne, lb.ne, li.ne),
            ));
        }
        if !la.rows_packed() {
            return Err(shape_err("MUL_MAT_ID", "weight rows must be packed"));
        }
        let layout = Layout::contiguous(DType::F32, &[la.ne[1], li.ne[0], lb.ne[2]])?;
        self.node(
            layout,
            Op::MulMatId,
            [Some(a), Some(b), Some(ids), None, None],
        )
    }

    /// The checked result layout of `mul_mat(a, b)`.
    fn mul_mat_layout(&mut self, a: TensorId, b: TensorId) -> Result<Layout, GraphError> {
        let la = self.check(a)?.layout;
        let lb = self.want_f32("MUL_MAT", b)?;
        if matches!(
            la.dtype,
            DType::I8 | DType::I16 | DType::I32 | DType::I64 | DType::F64
        ) {
            return Err(GraphError::Type {
                op: "MUL_MAT",
                dtype: la.dtype,
            });
        }
        if la.ne[0] != lb.ne[0] || lb.ne[2] % la.ne[2] != 0 || lb.ne[3] % la.ne[3] != 0 {
            return Err(shape_err("MUL_MAT", format!("{:?} x {:?}", la.ne, lb.ne)));
        }
        if !la.rows_packed() {
            return Err(shape_err("MUL_MAT", "first operand rows must be packed"));
        }
        Ok(Layout::contiguous(
            DType::F32,
            &[la.ne[1], lb.ne[1], lb.ne[2], lb.ne[3]],
        )?)
    }

    /// [`Graph::mul_mat`] for attention scores that go only to
    /// `soft_max_ext(·, Some(mask), …)` with this same `mask` (`[ne1(a), >= ne1(b), …]`, f32,
    /// broadcast over dims 2 and 3): an entry whose mask value is -inf may be written as 0
    /// instead of its dot product. The softmax turns it into -inf either way (for a finite
    /// product and scale), so results are unchanged while a causal mask spares about half
    /// the products. A backend may also ignore the mask and compute every entry.
    pub fn mul_mat_masked(
        &mut self,
        a: TensorId,
        b: TensorId,
        mask: TensorId,
    ) -> Result<TensorId, GraphError> {
        let lo = self.mul_mat_layout(a, b)?;
        let lm = self.check(mask)?.layout;
        if lm.dtype != DType::F32 {
            return Err(GraphError::Type {
                op: "MUL_MAT",
                dtype: lm.dtype,
            });
        }
        if lm.ne[0] != lo.ne[0]
            || lm.ne[1] < lo.ne[1]
            || lo.ne[2] % lm.ne[2] != 0
            || lo.ne[3] % lm.ne[3] != 0
            || !lm.rows_packed()
        {
            return Err(shape_err(
                "MUL_MAT",
                format!("mask {:?} for output {:?}", lm.ne, lo.ne),
            ));
        }
        self.node(lo, Op::MulMat, [Some(a), Some(b), Some(mask), None, None])
    }

    /// Attention over a KV cache, fused so that no score matrix is materialised: for query
    /// row `i` of head `h` (KV head `h / (n_head / n_head_kv)`), `out[:, h, i]` is
    /// `v · softmax(k · q[:, i, h] * scale + mask[:, i])`. It equals, bit for bit,
    /// `cont(permute(mul_mat(v, soft_max_ext(mul_mat_masked(k, q, mask), Some(mask), scale, 0)),
    /// [0, 2, 1, 3]))`: a backend computes each score and each output with the kernels those
    /// ops would use. `q` is `[head_k, n_tokens, n_head]` f32 (any strides), `k` is
    /// `[head_k, n_kv, n_head_kv]` and `v` is `[n_kv, head_v, n_head_kv]`, both f16 or both f32
    /// with packed rows; `mask` is f32 `[n_kv, >= n_tokens]` with packed rows. The result is
    /// f32 `[head_v, n_head, n_tokens]`.
    pub fn attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: TensorId,
        scale: f32,
    ) -> Result<TensorId, GraphError> {
        let lq = self.want_f32("ATTENTION", q)?;
        let lk = self.check(k)?.layout;
        let lv = self.check(v)?.layout;
        let lm = self.check(mask)?.layout;
        for l in [lk, lv] {
            if !matches!(l.dtype, DType::F16 | DType::F32) || l.dtype != lk.dtype {
                return Err(GraphError::Type {
                    op: "ATTENTION",
                    dtype: l.dtype,
                });
            }
        }
        if lm.dtype != DType::F32 {
            return Err(GraphError::Type {
                op: "ATTENTION",
                dtype: lm.dtype,
            });
        }
        // V is `[n_kv, head_v, n_head_kv]` here (stored transposed).
        check_attention_shapes("ATTENTION", [lq, lk, lv, lm], 0, true)?;
        let (n_tokens, n_head) = (lq.ne[1], lq.ne[2]);
        let layout = Layout::contiguous(DType::F32, &[lv.ne[1], n_head, n_tokens])?;
        self.node(
            layout,
            Op::Attention { scale },
            [Some(q), Some(k), Some(v), Some(mask), None],
        )
    }

    /// ggml's `flash_attn_ext`: for query row `i` of head `h` (KV head
    /// `h / (n_head / n_head_kv)`), `out[:, h, i] = v · softmax(cap(k · q[:, i, h] * scale) +
    /// slope_h * mask[:, i])`, computed with an online softmax as ggml's CPU backend does
    /// (its rounding, not the standard path's). `cap` is `softcap * tanh(x / softcap)` when
    /// `softcap` is not 0; `slope_h` is ALiBi's for `max_bias > 0`, else 1. `q` is f32
    /// `[head_k, n_tokens, n_head]` with packed rows (any strides otherwise); `k` is
    /// `[head_k, n_kv, n_head_kv]` and `v` `[head_v, n_kv, n_head_kv]` (f16, bf16, f32 or a
    /// quantized type with a CPU dot, packed rows); `mask` f32 `[n_kv, >= n_tokens]`, packed
    /// rows. The result is f32 `[head_v, n_head, n_tokens]`. `kv_chunks`: see
    /// [`Op::FlashAttnExt`].
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn_ext(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        mask: TensorId,
        scale: f32,
        max_bias: f32,
        softcap: f32,
        kv_chunks: u32,
    ) -> Result<TensorId, GraphError> {
        const OP: &str = "FLASH_ATTN_EXT";
        let lq = self.want_f32(OP, q)?;
        let lk = self.check(k)?.layout;
        let lv = self.check(v)?.layout;
        let lm = self.want_f32(OP, mask)?;
        for l in [lk, lv] {
            if matches!(l.dtype, DType::I32 | DType::I64 | DType::I8 | DType::I16) {
                return Err(GraphError::Type {
                    op: OP,
                    dtype: l.dtype,
                });
            }
        }
        // V is `[head_v, n_kv, n_head_kv]` here (rows).
        check_attention_shapes(OP, [lq, lk, lv, lm], 1, lq.rows_packed())?;
        if kv_chunks == 0 {
            return Err(shape_err(OP, "zero KV chunks"));
        }
        let (n_tokens, n_head) = (lq.ne[1], lq.ne[2]);
        let layout = Layout::contiguous(DType::F32, &[lv.ne[0], n_head, n_tokens])?;
        self.node(
            layout,
            Op::FlashAttnExt {
                scale,
                max_bias,
                softcap,
                kv_chunks,
            },
            [Some(q), Some(k), Some(v), Some(mask), None],
        )
    }

    /// Attention sinks for fused attention node `attn` (gpt-oss): f32 `[n_head]`, packed,
    /// created before `attn`. The node then equals the unfused graph with
    /// [`Graph::soft_max_add_sinks`] on its softmax, bit for bit.
    pub fn attention_add_sinks(
        &mut self,
        attn: TensorId,
        sinks: TensorId,
    ) -> Result<(), GraphError> {
        let t = self.check(attn)?;
        let (op, src) = (t.op, t.src);
        if !matches!(op, Op::Attention { .. } | Op::FlashAttnExt { .. }) {
            return Err(shape_err(
                "ATTENTION",
                format!("{attn} is a {} node", op.name()),
            ));
        }
        let ls = self.want_f32("ATTENTION", sinks)?;
        let n_head = src[0].map_or(0, |q| self.layout(q).ne[2]);
        if src[4].is_some() {
            return Err(shape_err("ATTENTION", "the node already has sinks"));
        }
        if sinks >= attn {
            return Err(shape_err(
                "ATTENTION",
                "sinks must be created before the attention",
            ));
        }
        if ls.ne[0] != n_head || ls.nelements() != ls.ne[0] || !ls.rows_packed() {
            return Err(shape_err(
                "ATTENTION",
                format!("sinks {:?} for {n_head} heads", ls.ne),
            ));
        }
        self.tensors[attn.index()].src[4] = Some(sinks);
        Ok(())
    }

    fn binary(&mut self, op: Op, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        let la = self.want_f32(op.name(), a)?;
        let lb = self.want_f32(op.name(), b)?;
        if !lb.can_repeat_to(&la) {
            return Err(shape_err(
                op.name(),
                format!("{:?} cannot broadcast to {:?}", lb.ne, la.ne),
            ));
        }
        let layout = self.f32_like(&la)?;
        self.node(layout, op, [Some(a), Some(b), None, None, None])
    }

    /// `a + b`, `b` broadcast to `a`'s shape.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Add, a, b)
    }

    /// `a * b` element-wise, `b` broadcast to `a`'s shape.
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Mul, a, b)
    }

    /// `a / b` element-wise, `b` broadcast to `a`'s shape.
    pub fn div(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.binary(Op::Div, a, b)
    }

    /// ggml_add_id: row `(i1, i2)` of `a` (`[ne0, n_used, n_tokens]` f32, any strides) plus
    /// row `ids[i1, i2]` of `b` (`[ne0, n_rows]` f32, packed rows), e.g. per-expert biases
    /// added to `mul_mat_id`'s output with the same i32 `ids` (`[n_used, n_tokens]`, any
    /// strides). An id outside `0..n_rows` is a compute error.
    pub fn add_id(
        &mut self,
        a: TensorId,
        b: TensorId,
        ids: TensorId,
    ) -> Result<TensorId, GraphError> {
        let la = self.want_f32("ADD_ID", a)?;
        let lb = self.want_f32("ADD_ID", b)?;
        let li = self.check(ids)?.layout;
        if li.dtype != DType::I32 {
            return Err(GraphError::Type {
                op: "ADD_ID",
                dtype: li.dtype,
            });
        }
        if la.ne[0] != lb.ne[0]
            || la.ne[3] != 1
            || lb.ne[2] != 1
            || lb.ne[3] != 1
            || li.ne[0] != la.ne[1]
            || li.ne[1] != la.ne[2]
            || li.ne[2] != 1
            || li.ne[3] != 1
            || !lb.rows_packed()
        {
            return Err(shape_err(
                "ADD_ID",
                format!("a {:?}, b {:?}, ids {:?}", la.ne, lb.ne, li.ne),
            ));
        }
        let layout = self.f32_like(&la)?;
        self.node(layout, Op::AddId, [Some(a), Some(b), Some(ids), None, None])
    }

    fn unary_like(&mut self, op: Op, a: TensorId) -> Result<TensorId, GraphError> {
        let la = self.want_f32(op.name(), a)?;
        let layout = self.f32_like(&la)?;
        self.node(layout, op, [Some(a), None, None, None, None])
    }

    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId, GraphError> {
        self.unary_like(
            Op::Scale {
                scale: s,
                bias: 0.0,
            },
            a,
        )
    }

    /// `a * s + b`.
    pub fn scale_bias(&mut self, a: TensorId, s: f32, b: f32) -> Result<TensorId, GraphError> {
        self.unary_like(Op::Scale { scale: s, bias: b }, a)
    }

    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        self.unary_like(Op::RmsNorm { eps }, a)
    }

    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId, GraphError> {
        self.unary_like(Op::Norm { eps }, a)
    }

    pub fn silu(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary_like(Op::Unary(UnaryOp::Silu), a)
    }

    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary_like(Op::Unary(UnaryOp::Gelu), a)
    }

    /// Any [`UnaryOp`] of f32 `a` (any strides); the result is contiguous.
    pub fn unary(&mut self, a: TensorId, op: UnaryOp) -> Result<TensorId, GraphError> {
        self.unary_like(Op::Unary(op), a)
    }

    pub fn sigmoid(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Sigmoid)
    }

    pub fn softplus(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Softplus)
    }

    pub fn tanh(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Tanh)
    }

    pub fn relu(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Relu)
    }

    pub fn sqr(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Sqr)
    }

    pub fn sqrt(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Sqrt)
    }

    pub fn exp(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::Exp)
    }

    /// Exact GELU (`0.5 x (1 + erf(x / sqrt 2))`), ggml_gelu_erf.
    pub fn gelu_erf(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.unary(a, UnaryOp::GeluErf)
    }

    /// `max(min(x, max), min)` element-wise, as ggml computes it (NaN becomes `max`).
    pub fn clamp(&mut self, a: TensorId, min: f32, max: f32) -> Result<TensorId, GraphError> {
        self.unary_like(Op::Clamp { min, max }, a)
    }

    /// `a`'s shape (f32, any strides) filled with `value`.
    pub fn fill(&mut self, a: TensorId, value: f32) -> Result<TensorId, GraphError> {
        self.unary_like(Op::Fill { value }, a)
    }

    /// The sum of each row of f32 `a` (any strides): `[1, ne1, ne2, ne3]`, summed in f64 as
    /// ggml does.
    pub fn sum_rows(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        let la = self.want_f32("SUM_ROWS", a)?;
        let layout = Layout::contiguous(DType::F32, &[1, la.ne[1], la.ne[2], la.ne[3]])?;
        self.node(layout, Op::SumRows, [Some(a), None, None, None, None])
    }

    /// `a` tiled to `b`'s shape (ggml_repeat); every dim of `b` a multiple of `a`'s.
    pub fn repeat(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        let ne = self.check(b)?.layout.ne;
        self.repeat_4d(a, ne)
    }

    /// `a` (f32, f16, bf16 or i32, any strides) tiled to shape `ne` (ggml_repeat_4d).
    pub fn repeat_4d(
        &mut self,
        a: TensorId,
        ne: [usize; MAX_DIMS],
    ) -> Result<TensorId, GraphError> {
        let la = self.check(a)?.layout;
        if !matches!(la.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32) {
            return Err(GraphError::Type {
                op: "REPEAT",
                dtype: la.dtype,
            });
        }
        let layout = Layout::contiguous(la.dtype, &ne)?;
        if !la.can_repeat_to(&layout) {
            return Err(shape_err(
                "REPEAT",
                format!("{:?} cannot be repeated to {ne:?}", la.ne),
            ));
        }
        self.node(layout, Op::Repeat, [Some(a), None, None, None, None])
    }

    /// Rotary embedding of `a` (`[head_dim, n_head, n_tokens, 1]`) at i32 positions `pos`
    /// (`[n_tokens]`), with optional f32 per-pair frequency factors.
    pub fn rope_ext(
        &mut self,
        a: TensorId,
        pos: TensorId,
        freq_factors: Option<TensorId>,
        params: RopeParams,
    ) -> Result<TensorId, GraphError> {
        let la = self.want_f32("ROPE", a)?;
        let lp = self.check(pos)?.layout;
        if lp.dtype != DType::I32 {
            return Err(GraphError::Type {
                op: "ROPE",
                dtype: lp.dtype,
            });
        }
        if lp.ne[0] != la.ne[2] || lp.nelements() != lp.ne[0] {
            return Err(shape_err(
                "ROPE",
                format!("positions {:?} for input {:?}", lp.ne, la.ne),
            ));
        }
        if params.n_dims == 0
            || !params.n_dims.is_multiple_of(2)
            || !params.n_offs.is_multiple_of(2)
            || params.n_offs.saturating_add(params.n_dims) > la.ne[0]
        {
            return Err(shape_err(
                "ROPE",
                format!(
                    "n_dims {} at offset {} for rows of {}",
                    params.n_dims, params.n_offs, la.ne[0]
                ),
            ));
        }
        if !la.rows_packed() {
            return Err(shape_err("ROPE", "input rows must be packed"));
        }
        if let Some(ff) = freq_factors {
            let lf = self.want_f32("ROPE", ff)?;
            if lf.ne[0] < params.n_dims / 2 || !lf.rows_packed() {
                return Err(shape_err("ROPE", "frequency factors shorter than n_dims/2"));
            }
        }
        let layout = self.f32_like(&la)?;
        self.node(
            layout,
            Op::Rope(params),
            [Some(a), Some(pos), freq_factors, None, None],
        )
    }

    /// ggml_rope_set_offset: makes rope node `rope` rotate dims `n_offs..n_offs + n_dims`
    /// (even `n_offs`, within the rows) and copy the others.
    pub fn rope_set_offset(&mut self, rope: TensorId, n_offs: usize) -> Result<(), GraphError> {
        let t = self.check(rope)?;
        let Op::Rope(mut p) = t.op else {
            return Err(shape_err(
                "ROPE",
                format!("{rope} is a {} node", t.op.name()),
            ));
        };
        if !n_offs.is_multiple_of(2) || n_offs.saturating_add(p.n_dims) > t.layout.ne[0] {
            return Err(shape_err(
                "ROPE",
                format!(
                    "offset {n_offs} for {} dims of rows of {}",
                    p.n_dims, t.layout.ne[0]
                ),
            ));
        }
        p.n_offs = n_offs;
        self.tensors[rope.index()].op = Op::Rope(p);
        Ok(())
    }

    /// `softmax(a * scale + slope * mask)` over rows; `mask` (f32 or f16, `[ne0, >= ne1, ..]`)
    /// is broadcast over dims 2 and 3; `max_bias > 0` enables ALiBi slopes per dim-2 index.
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
        max_bias: f32,
    ) -> Result<TensorId, GraphError> {
        let la = self.want_f32("SOFT_MAX", a)?;
        if let Some(m) = mask {
            let lm = self.check(m)?.layout;
            if !matches!(lm.dtype, DType::F32 | DType::F16) {
                return Err(GraphError::Type {
                    op: "SOFT_MAX",
                    dtype: lm.dtype,
                });
            }
            if lm.ne[0] != la.ne[0]
                || lm.ne[1] < la.ne[1]
                || la.ne[2] % lm.ne[2] != 0
                || la.ne[3] % lm.ne[3] != 0
                || !lm.rows_packed()
            {
                return Err(shape_err(
                    "SOFT_MAX",
                    format!("mask {:?} for input {:?}", lm.ne, la.ne),
                ));
            }
        }
        let layout = self.f32_like(&la)?;
        self.node(
            layout,
            Op::SoftMax { scale, max_bias },
            [Some(a), mask, None, None, None],
        )
    }

    pub fn soft_max(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        self.soft_max_ext(a, None, 1.0, 0.0)
    }

    /// ggml_soft_max_add_sinks: gives softmax node `sm` attention sinks, f32 `[a.ne2]` (one
    /// logit per head, packed), which join every row's normalization as if each row had one
    /// more value `sinks[i2]` (its probability is dropped). `sinks` must have been created
    /// before `sm` (graph order is execution order).
    pub fn soft_max_add_sinks(&mut self, sm: TensorId, sinks: TensorId) -> Result<(), GraphError> {
        let t = self.check(sm)?;
        let (op, src) = (t.op, t.src);
        let ls = self.want_f32("SOFT_MAX", sinks)?;
        let Some(a) = src[0] else {
            return Err(shape_err("SOFT_MAX", "not a softmax node"));
        };
        if !matches!(op, Op::SoftMax { .. }) {
            return Err(shape_err(
                "SOFT_MAX",
                format!("{sm} is a {} node", op.name()),
            ));
        }
        if src[2].is_some() {
            return Err(shape_err("SOFT_MAX", "the node already has sinks"));
        }
        if sinks >= sm {
            return Err(shape_err(
                "SOFT_MAX",
                "sinks must be created before the softmax",
            ));
        }
        let la = self.layout(a);
        if ls.ne[0] != la.ne[2] || ls.nelements() != ls.ne[0] || !ls.rows_packed() {
            return Err(shape_err(
                "SOFT_MAX",
                format!("sinks {:?} for input {:?}", ls.ne, la.ne),
            ));
        }
        self.tensors[sm.index()].src[2] = Some(sinks);
        Ok(())
    }

    fn glu_node(
        &mut self,
        op: GluOp,
        a: TensorId,
        b: TensorId,
        alpha: f32,
        limit: f32,
    ) -> Result<TensorId, GraphError> {
        let opv = Op::Glu {
            op,
            swapped: false,
            alpha,
            limit,
        };
        let la = self.want_f32(opv.name(), a)?;
        let lb = self.want_f32(opv.name(), b)?;
        if !la.same_shape(&lb) {
            return Err(shape_err(opv.name(), format!("{:?} vs {:?}", la.ne, lb.ne)));
        }
        let layout = self.f32_like(&la)?;
        self.node(layout, opv, [Some(a), Some(b), None, None, None])
    }

    /// Split form `act(a) * b` of any GLU op without parameters (`a` and `b` f32, same
    /// shape). `SwiGluOai` and `SwiGluClamp` take their parameters through
    /// [`Graph::swiglu_oai`] and [`Graph::swiglu_clamp`]; here they get alpha 0 and limit 0.
    pub fn glu_split(
        &mut self,
        op: GluOp,
        a: TensorId,
        b: TensorId,
    ) -> Result<TensorId, GraphError> {
        self.glu_node(op, a, b, 0.0, 0.0)
    }

    /// `silu(a) * b`.
    pub fn swiglu_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.glu_split(GluOp::SwiGlu, a, b)
    }

    /// `gelu(a) * b`.
    pub fn geglu_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.glu_split(GluOp::GeGlu, a, b)
    }

    /// `relu(a) * b`.
    pub fn reglu_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.glu_split(GluOp::ReGlu, a, b)
    }

    /// `gelu_erf(a) * b`.
    pub fn geglu_erf_split(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        self.glu_split(GluOp::GeGluErf, a, b)
    }

    /// gpt-oss's clamped SwiGLU (ggml_swiglu_oai): with `x = min(a, limit)` and
    /// `y = clamp(b, -limit, limit)`, `x / (1 + exp(-alpha x)) * (y + 1)`.
    pub fn swiglu_oai(
        &mut self,
        a: TensorId,
        b: TensorId,
        alpha: f32,
        limit: f32,
    ) -> Result<TensorId, GraphError> {
        self.glu_node(GluOp::SwiGluOai, a, b, alpha, limit)
    }

    /// `silu(min(a, limit)) * clamp(b, -limit, limit)` (ggml_swiglu_clamp).
    pub fn swiglu_clamp(
        &mut self,
        a: TensorId,
        b: TensorId,
        limit: f32,
    ) -> Result<TensorId, GraphError> {
        self.glu_node(GluOp::SwiGluClamp, a, b, 0.0, limit)
    }

    /// Fused form: the first half of each row is the gate (second half if `swapped`).
    pub fn glu(&mut self, op: GluOp, a: TensorId, swapped: bool) -> Result<TensorId, GraphError> {
        let opv = Op::Glu {
            op,
            swapped,
            alpha: 0.0,
            limit: 0.0,
        };
        let la = self.want_f32(opv.name(), a)?;
        if la.ne[0] % 2 != 0 {
            return Err(shape_err(opv.name(), "row length must be even"));
        }
        let mut ne = la.ne;
        ne[0] /= 2;
        let layout = Layout::contiguous(DType::F32, &ne)?;
        self.node(layout, opv, [Some(a), None, None, None, None])
    }

    /// Writes the f32 rows of `src` into `dst` at the i32/i64 row indices `idx`; returns a view of
    /// `dst` carrying the write (use it to order later reads).
    pub fn set_rows(
        &mut self,
        dst: TensorId,
        src: TensorId,
        idx: TensorId,
    ) -> Result<TensorId, GraphError> {
        let ld = self.check(dst)?.layout;
        let ls = self.want_f32("SET_ROWS", src)?;
        let li = self.check(idx)?.layout;
        if !matches!(li.dtype, DType::I32 | DType::I64) {
            return Err(GraphError::Type {
                op: "SET_ROWS",
                dtype: li.dtype,
            });
        }
        if !matches!(ld.dtype, DType::F32 | DType::F16 | DType::BF16) && !ld.dtype.is_quantized() {
            return Err(GraphError::Type {
                op: "SET_ROWS",
                dtype: ld.dtype,
            });
        }
        if ld.ne[0] != ls.ne[0]
            || ld.ne[2] != ls.ne[2]
            || ld.ne[3] != ls.ne[3]
            || ls.ne[1] != li.ne[0]
            || ls.ne[2] % li.ne[1] != 0
            || ls.ne[3] % li.ne[2] != 0
            || li.ne[3] != 1
            || !ld.rows_packed()
        {
            return Err(shape_err(
                "SET_ROWS",
                format!("dst {:?}, src {:?}, indices {:?}", ld.ne, ls.ne, li.ne),
            ));
        }
        self.view_node(
            dst,
            ld,
            Op::SetRows,
            [Some(src), Some(idx), None, None, None],
            0,
        )
    }

    /// Copies `a` into `b` (same element count), converting types; returns a view of `b`.
    pub fn cpy(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, GraphError> {
        let la = self.check(a)?.layout;
        let lb = self.check(b)?.layout;
        for l in [&la, &lb] {
            if !matches!(l.dtype, DType::F32 | DType::F16 | DType::BF16) {
                return Err(GraphError::Type {
                    op: "CPY",
                    dtype: l.dtype,
                });
            }
        }
        if la.nelements() != lb.nelements() {
            return Err(shape_err("CPY", format!("{:?} into {:?}", la.ne, lb.ne)));
        }
        self.view_node(b, lb, Op::Cpy, [Some(a), Some(b), None, None, None], 0)
    }

    /// A contiguous copy of `a`.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        let la = self.check(a)?.layout;
        if !matches!(la.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32) {
            return Err(GraphError::Type {
                op: "CONT",
                dtype: la.dtype,
            });
        }
        let layout = Layout::contiguous(la.dtype, &la.ne)?;
        self.node(layout, Op::Cont, [Some(a), None, None, None, None])
    }

    /// `a` (f32, contiguous) times the orthonormal `n × n` Walsh-Hadamard matrix, for each run
    /// of `n` values (`n` a power of two dividing the element count): llama.cpp's
    /// `llama_mul_mat_hadamard`, which ggml-cpu computes as a fast transform (`x / sqrt(n)`,
    /// then butterflies `u + v`, `u - v`). It rotates Q, K and V around a quantized cache.
    pub fn hadamard(&mut self, a: TensorId, n: usize) -> Result<TensorId, GraphError> {
        let la = self.want_f32("HADAMARD", a)?;
        if !n.is_power_of_two() || !la.nelements().is_multiple_of(n) || !la.is_contiguous() {
            return Err(shape_err(
                "HADAMARD",
                format!(
                    "runs of {n} over {:?} (contiguous: {})",
                    la.ne,
                    la.is_contiguous()
                ),
            ));
        }
        let layout = Layout::contiguous(DType::F32, &la.ne)?;
        self.node(
            layout,
            Op::Hadamard { n },
            [Some(a), None, None, None, None],
        )
    }

    /// A contiguous copy of `a` converted to `dtype` (f32, f16 or bf16; ggml's `cast`).
    pub fn cast(&mut self, a: TensorId, dtype: DType) -> Result<TensorId, GraphError> {
        let la = self.check(a)?.layout;
        for t in [la.dtype, dtype] {
            if !matches!(t, DType::F32 | DType::F16 | DType::BF16) {
                return Err(GraphError::Type {
                    op: "CAST",
                    dtype: t,
                });
            }
        }
        let layout = Layout::contiguous(dtype, &la.ne)?;
        self.node(layout, Op::Cont, [Some(a), None, None, None, None])
    }

    /// `a` and `b` joined along `dim`.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId, GraphError> {
        let la = self.want_f32("CONCAT", a)?;
        let lb = self.want_f32("CONCAT", b)?;
        if dim >= MAX_DIMS || (0..MAX_DIMS).any(|d| d != dim && la.ne[d] != lb.ne[d]) {
            return Err(shape_err(
                "CONCAT",
                format!("{:?} and {:?} along {dim}", la.ne, lb.ne),
            ));
        }
        let mut ne = la.ne;
        ne[dim] += lb.ne[dim];
        let layout = Layout::contiguous(DType::F32, &ne)?;
        self.node(
            layout,
            Op::Concat { dim },
            [Some(a), Some(b), None, None, None],
        )
    }

    /// Index of the maximum of each row of the f32 matrix `a`, as i32 `[a.ne1]`.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId, GraphError> {
        let la = self.want_f32("ARGMAX", a)?;
        if la.ne[2] != 1 || la.ne[3] != 1 {
            return Err(shape_err("ARGMAX", "input must be a matrix"));
        }
        let layout = Layout::contiguous(DType::I32, &[la.ne[1]])?;
        self.node(layout, Op::ArgMax, [Some(a), None, None, None, None])
    }

    /// ggml_argsort: per row of f32 `a` (any strides), the i32 indices that sort it in
    /// `order`, ordered on ties exactly as ggml-cpu's `std::sort` (libstdc++'s introsort).
    pub fn argsort(&mut self, a: TensorId, order: SortOrder) -> Result<TensorId, GraphError> {
        let la = self.want_f32("ARGSORT", a)?;
        if la.ne[0] > i32::MAX as usize {
            return Err(shape_err("ARGSORT", "rows longer than i32::MAX"));
        }
        let layout = Layout::contiguous(DType::I32, &la.ne)?;
        self.node(
            layout,
            Op::ArgSort(order),
            [Some(a), None, None, None, None],
        )
    }

    /// ggml_argsort_top_k: [`Graph::argsort`] in descending order, then a view of the first
    /// `k` indices of each row: i32 `[k, ne1, ne2, ne3]` with the argsort's row strides (not
    /// contiguous when `k < ne0`). `1 <= k <= ne0`.
    pub fn argsort_top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId, GraphError> {
        let ne = self.want_f32("ARGSORT", a)?.ne;
        if k == 0 || k > ne[0] {
            return Err(shape_err(
                "ARGSORT",
                format!("top {k} of rows of {}", ne[0]),
            ));
        }
        let sorted = self.argsort(a, SortOrder::Desc)?;
        let nb = self.layout(sorted).nb;
        self.view_4d(sorted, [k, ne[1], ne[2], ne[3]], nb[1], nb[2], nb[3], 0)
    }

    /// ggml_top_k: per row of f32 `a` (any strides), i32 indices of its `k` largest values
    /// (`1 <= k <= ne0`), contiguous `[k, ne1, ne2, ne3]`, in ggml-cpu's order
    /// (`std::partial_sort`, then the first two swapped: the order is not meaningful).
    pub fn top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId, GraphError> {
        let la = self.want_f32("TOP_K", a)?;
        if k == 0 || k > la.ne[0] {
            return Err(shape_err(
                "TOP_K",
                format!("top {k} of rows of {}", la.ne[0]),
            ));
        }
        let layout = Layout::contiguous(DType::I32, &[k, la.ne[1], la.ne[2], la.ne[3]])?;
        self.node(layout, Op::TopK, [Some(a), None, None, None, None])
    }
}

/// Builds an attention mask the way llama.cpp fills `kq_mask`: row `i` (query at position
/// `q_pos[i]`) and column `j` (cache slot holding position `kv_pos[j]`, negative = empty) is 0
/// where the query may attend and -inf elsewhere: empty slots, future positions (causal) and,
/// with a sliding window `w`, positions `p` with `q - p >= w`. Returns `q_pos.len()` rows of
/// `kv_pos.len()` values.
pub fn build_kq_mask(kv_pos: &[i32], q_pos: &[i32], window: Option<u32>) -> Vec<f32> {
    let mut out = Vec::with_capacity(kv_pos.len() * q_pos.len());
    for &q in q_pos {
        for &p in kv_pos {
            let masked = p < 0
                || p > q
                || window.is_some_and(|w| i64::from(q) - i64::from(p) >= i64::from(w));
            out.push(if masked { f32::NEG_INFINITY } else { 0.0 });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_follow_ggml() {
        let mut g = Graph::new();
        let w = g.new_tensor(DType::Q8_0, &[64, 10]).unwrap();
        let x = g.new_input(DType::F32, &[64, 3]).unwrap();
        let y = g.mul_mat(w, x).unwrap();
        assert_eq!(g.layout(y).ne, [10, 3, 1, 1]);
        let bad = g.new_tensor(DType::F32, &[63, 3]).unwrap();
        assert!(matches!(g.mul_mat(w, bad), Err(GraphError::Shape { .. })));
        // A score mask covers [n_kv = 10, >= 3 tokens], f32.
        let mask = g.new_input(DType::F32, &[10, 4]).unwrap();
        let ym = g.mul_mat_masked(w, x, mask).unwrap();
        assert_eq!(g.layout(ym).ne, [10, 3, 1, 1]);
        assert_eq!(g.tensor(ym).src, [Some(w), Some(x), Some(mask), None, None]);
        let short = g.new_input(DType::F32, &[10, 2]).unwrap();
        assert!(matches!(
            g.mul_mat_masked(w, x, short),
            Err(GraphError::Shape { .. })
        ));
        let wide = g.new_input(DType::F32, &[11, 3]).unwrap();
        assert!(matches!(
            g.mul_mat_masked(w, x, wide),
            Err(GraphError::Shape { .. })
        ));
        let half = g.new_input(DType::F16, &[10, 3]).unwrap();
        assert!(matches!(
            g.mul_mat_masked(w, x, half),
            Err(GraphError::Type { .. })
        ));
        let t = g.transpose(y).unwrap();
        assert_eq!(g.layout(t).ne, [3, 10, 1, 1]);
        assert_eq!(g.tensor(t).view_src, Some(y));
        let p = g.permute(x, [1, 0, 2, 3]).unwrap();
        assert_eq!(g.layout(p).ne, [3, 64, 1, 1]);
        assert!(g.permute(x, [0, 0, 2, 3]).is_err());
        let v = g.view_2d(x, 8, 2, 256, 4).unwrap();
        assert_eq!(g.tensor(v).view_offset, 4);
        assert!(
            g.view_2d(x, 64, 3, 256, 4).is_err(),
            "view past the end must fail"
        );
        let r = g.reshape(x, &[32, 6]).unwrap();
        assert!(g.reshape(x, &[32, 5]).is_err());
        assert!(
            g.reshape(t, &[30]).is_err(),
            "non-contiguous reshape must fail"
        );
        let c = g.concat(r, r, 1).unwrap();
        assert_eq!(g.layout(c).ne, [32, 12, 1, 1]);
        let am = g.argmax(c).unwrap();
        assert_eq!(g.layout(am).ne, [12, 1, 1, 1]);
        g.set_name(am, "best").unwrap();
        assert_eq!(g.find("best"), Some(am));
        let cap = g.tensors().len();
        g.clear();
        assert!(g.is_empty() && g.find("best").is_none());
        assert!(cap > 0);
    }

    #[test]
    fn moe_routing_op_shapes_and_errors() {
        let mut g = Graph::new();
        let logits = g.new_input(DType::F32, &[8, 5]).unwrap();
        let ids = g.argsort_top_k(logits, 2).unwrap();
        assert_eq!(g.layout(ids).ne, [2, 5, 1, 1]);
        assert_eq!(g.layout(ids).nb[1], 8 * 4, "a view of the whole argsort");
        assert!(matches!(
            g.tensor(g.tensor(ids).view_src.unwrap()).op,
            Op::ArgSort(SortOrder::Desc)
        ));
        let fids = g.new_input(DType::F32, &[2, 5]).unwrap();
        // top_k / argsort_top_k: 1 <= k <= ne0
        for k in [0, 9] {
            assert!(matches!(g.top_k(logits, k), Err(GraphError::Shape { .. })));
            assert!(matches!(
                g.argsort_top_k(logits, k),
                Err(GraphError::Shape { .. })
            ));
        }
        assert_eq!(
            {
                let t = g.top_k(logits, 8).unwrap();
                g.layout(t).ne
            },
            [8, 5, 1, 1]
        );
        assert!(matches!(
            g.argsort(ids, SortOrder::Asc),
            Err(GraphError::Type { .. })
        ));
        // add_id
        let up = g.new_input(DType::F32, &[12, 2, 5]).unwrap();
        let bias = g.new_input(DType::F32, &[12, 8]).unwrap();
        assert_eq!(
            {
                let t = g.add_id(up, bias, ids).unwrap();
                g.layout(t).ne
            },
            [12, 2, 5, 1]
        );
        let bias_short = g.new_input(DType::F32, &[11, 8]).unwrap();
        assert!(matches!(
            g.add_id(up, bias_short, ids),
            Err(GraphError::Shape { .. })
        ));
        assert!(matches!(
            g.add_id(up, bias, fids),
            Err(GraphError::Type { .. })
        ));
        let up_t = g.new_input(DType::F32, &[12, 2, 4]).unwrap();
        assert!(matches!(
            g.add_id(up_t, bias, ids),
            Err(GraphError::Shape { .. })
        ));
        // get_rows of the 3-D probabilities with the selected experts
        let p3 = g.reshape(logits, &[1, 8, 5]).unwrap();
        assert_eq!(
            {
                let t = g.get_rows(p3, ids).unwrap();
                g.layout(t).ne
            },
            [1, 2, 5, 1]
        );
        let p3_bad = g.new_input(DType::F32, &[1, 8, 4]).unwrap();
        assert!(g.get_rows(p3_bad, ids).is_err());
        // i32 data (rows of the selected experts) stays i32
        let idx = g.new_input(DType::I32, &[3]).unwrap();
        let picked = g.get_rows(ids, idx).unwrap();
        assert_eq!(g.layout(picked).dtype, DType::I32);
        assert_eq!(g.layout(picked).ne, [2, 3, 1, 1]);
        // broadcasting: ne0 == 1 divisors, and shapes that do not divide
        let weights = g.new_input(DType::F32, &[2, 5]).unwrap();
        let sum = g.sum_rows(weights).unwrap();
        assert_eq!(g.layout(sum).ne, [1, 5, 1, 1]);
        assert_eq!(
            {
                let t = g.div(weights, sum).unwrap();
                g.layout(t).ne
            },
            [2, 5, 1, 1]
        );
        let three = g.new_input(DType::F32, &[3, 5]).unwrap();
        assert!(matches!(
            g.div(weights, three),
            Err(GraphError::Shape { .. })
        ));
        assert!(matches!(g.sum_rows(ids), Err(GraphError::Type { .. })));
        let k_pe = g.new_input(DType::F32, &[64, 1, 5]).unwrap();
        assert_eq!(
            {
                let t = g.repeat_4d(k_pe, [64, 16, 5, 1]).unwrap();
                g.layout(t).ne
            },
            [64, 16, 5, 1]
        );
        assert!(g.repeat_4d(k_pe, [64, 16, 6, 1]).is_err());
        // GLU split forms need equal shapes
        assert!(g.swiglu_oai(up, up_t, 1.702, 7.0).is_err());
        assert!(g.glu_split(GluOp::ReGlu, up, up).is_ok());
        // sinks: one per head, created before the softmax, on a softmax node
        let kq = g.new_input(DType::F32, &[16, 5, 4]).unwrap();
        let sinks = g.new_input(DType::F32, &[4]).unwrap();
        let sinks3 = g.new_input(DType::F32, &[3]).unwrap();
        let sm = g.soft_max_ext(kq, None, 0.125, 0.0).unwrap();
        assert!(g.soft_max_add_sinks(sm, sinks3).is_err());
        assert!(g.soft_max_add_sinks(kq, sinks).is_err());
        let late = g.new_input(DType::F32, &[4]).unwrap();
        assert!(g.soft_max_add_sinks(sm, late).is_err());
        g.soft_max_add_sinks(sm, sinks).unwrap();
        assert_eq!(g.tensor(sm).src[2], Some(sinks));
        assert!(g.soft_max_add_sinks(sm, sinks).is_err(), "sinks set twice");
    }

    #[test]
    fn mul_mat_id_shapes_and_errors() {
        let mut g = Graph::new();
        let w = g.new_tensor(DType::Q4_K, &[256, 12, 8]).unwrap();
        let x = g.new_input(DType::F32, &[256, 1, 5]).unwrap();
        let logits = g.new_input(DType::F32, &[8, 5]).unwrap();
        let ids = g.argsort_top_k(logits, 2).unwrap();
        let y = g.mul_mat_id(w, x, ids).unwrap();
        assert_eq!(g.layout(y).ne, [12, 2, 5, 1]);
        assert_eq!(g.tensor(y).src, [Some(w), Some(x), Some(ids), None, None]);
        // ids must be i32
        let fids = g.new_input(DType::F32, &[2, 5]).unwrap();
        assert!(matches!(
            g.mul_mat_id(w, x, fids),
            Err(GraphError::Type {
                op: "MUL_MAT_ID",
                ..
            })
        ));
        // mismatched K, tokens, broadcast and rank
        let x_k = g.new_input(DType::F32, &[128, 1, 5]).unwrap();
        let x_t = g.new_input(DType::F32, &[256, 1, 4]).unwrap();
        let x_b = g.new_input(DType::F32, &[256, 3, 5]).unwrap();
        let x_4 = g.new_input(DType::F32, &[256, 1, 5, 2]).unwrap();
        for bad in [x_k, x_t, x_b, x_4] {
            assert!(matches!(
                g.mul_mat_id(w, bad, ids),
                Err(GraphError::Shape { .. })
            ));
        }
        let xq = g.new_input(DType::F16, &[256, 1, 5]).unwrap();
        assert!(matches!(
            g.mul_mat_id(w, xq, ids),
            Err(GraphError::Type { .. })
        ));
        // activations per used expert
        let x_u = g.new_input(DType::F32, &[256, 2, 5]).unwrap();
        let y_u = g.mul_mat_id(w, x_u, ids).unwrap();
        assert_eq!(g.layout(y_u).ne, [12, 2, 5, 1]);
        // transposed weights, integer weights
        let wf = g.new_tensor(DType::F32, &[12, 256, 8]).unwrap();
        let wt = g.transpose(wf).unwrap();
        assert!(matches!(
            g.mul_mat_id(wt, x, ids),
            Err(GraphError::Shape { .. })
        ));
        let wi = g.new_tensor(DType::I32, &[256, 12, 8]).unwrap();
        assert!(matches!(
            g.mul_mat_id(wi, x, ids),
            Err(GraphError::Type { .. })
        ));
    }

    #[test]
    fn rope_offset_checks() {
        let mut g = Graph::new();
        let q = g.new_input(DType::F32, &[24, 2, 3]).unwrap();
        let pos = g.new_input(DType::I32, &[3]).unwrap();
        let p = RopeParams::new(8, RopeMode::Neox, 10000.0);
        let r = g.rope_ext(q, pos, None, p).unwrap();
        g.rope_set_offset(r, 16).unwrap();
        assert!(matches!(
            g.tensor(r).op,
            Op::Rope(RopeParams { n_offs: 16, .. })
        ));
        assert!(g.rope_set_offset(r, 17).is_err(), "odd offset");
        assert!(g.rope_set_offset(r, 18).is_err(), "past the row");
        assert!(g.rope_set_offset(q, 0).is_err(), "not a rope node");
        let mut far = p;
        far.n_offs = 20;
        assert!(g.rope_ext(q, pos, None, far).is_err());
    }

    #[test]
    fn attention_sinks_checks() {
        let mut g = Graph::new();
        let q = g.new_input(DType::F32, &[64, 3, 4]).unwrap();
        let k = g.new_input(DType::F16, &[64, 32, 2]).unwrap();
        let v = g.new_input(DType::F16, &[32, 64, 2]).unwrap();
        let mask = g.new_input(DType::F32, &[32, 3]).unwrap();
        let sinks = g.new_input(DType::F32, &[4]).unwrap();
        let short = g.new_input(DType::F32, &[2]).unwrap();
        let attn = g.attention(q, k, v, mask, 0.125).unwrap();
        assert!(g.attention_add_sinks(attn, short).is_err(), "one per head");
        assert!(
            g.attention_add_sinks(q, sinks).is_err(),
            "not an attention node"
        );
        let late = g.new_input(DType::F32, &[4]).unwrap();
        assert!(g.attention_add_sinks(attn, late).is_err(), "created after");
        g.attention_add_sinks(attn, sinks).unwrap();
        assert_eq!(g.tensor(attn).src[4], Some(sinks));
        assert!(g.attention_add_sinks(attn, sinks).is_err(), "set twice");
    }

    #[test]
    fn flash_attn_and_hadamard_checks() {
        let mut g = Graph::new();
        let q = g.new_input(DType::F32, &[64, 5, 8]).unwrap();
        let k = g.new_tensor(DType::Q8_0, &[64, 32, 2]).unwrap();
        let v = g.new_tensor(DType::F16, &[48, 32, 2]).unwrap();
        let mask = g.new_input(DType::F32, &[32, 5]).unwrap();
        let out = g.flash_attn_ext(q, k, v, mask, 0.125, 0.0, 0.0, 2).unwrap();
        assert_eq!(g.layout(out).ne, [48, 8, 5, 1]);
        // Heads that do not share KV heads evenly, a short mask, zero chunks, integer K.
        let q7 = g.new_input(DType::F32, &[64, 5, 7]).unwrap();
        assert!(
            g.flash_attn_ext(q7, k, v, mask, 0.125, 0.0, 0.0, 2)
                .is_err()
        );
        let short = g.new_input(DType::F32, &[32, 4]).unwrap();
        assert!(
            g.flash_attn_ext(q, k, v, short, 0.125, 0.0, 0.0, 2)
                .is_err()
        );
        assert!(g.flash_attn_ext(q, k, v, mask, 0.125, 0.0, 0.0, 0).is_err());
        let ki = g.new_tensor(DType::I32, &[64, 32, 2]).unwrap();
        assert!(matches!(
            g.flash_attn_ext(q, ki, v, mask, 0.125, 0.0, 0.0, 2),
            Err(GraphError::Type { .. })
        ));
        // Sinks attach to flash attention too.
        let late = g.new_input(DType::F32, &[8]).unwrap();
        assert!(g.attention_add_sinks(out, late).is_err(), "created after");
        // Hadamard: powers of two dividing the element count, contiguous f32.
        assert!(g.hadamard(q, 64).is_ok());
        assert!(g.hadamard(q, 48).is_err());
        assert!(g.hadamard(q, 1 << 20).is_err());
        let qt = g.permute(q, [0, 2, 1, 3]).unwrap();
        assert!(g.hadamard(qt, 64).is_err());
        assert!(g.cast(k, DType::F16).is_err());
    }

    #[test]
    fn masks() {
        let m = build_kq_mask(&[0, 1, 2, -1], &[1, 2], None);
        let inf = f32::NEG_INFINITY;
        assert_eq!(m, vec![0.0, 0.0, inf, inf, 0.0, 0.0, 0.0, inf]);
        let s = build_kq_mask(&[0, 1, 2, 3], &[3], Some(2));
        assert_eq!(s, vec![inf, inf, 0.0, 0.0]);
    }
}
