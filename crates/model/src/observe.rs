//! Watching the forward pass's products with model weights, as ggml's eval callback lets
//! llama-imatrix do (`cb_eval(t, ask)`): a [`MatmulObserver`] set on a
//! [`Context`](crate::Context) is asked once per built graph, for every `MUL_MAT` and
//! `MUL_MAT_ID` whose first operand is a model weight, whether it wants that product's input;
//! after each micro-batch has run it is handed the wanted inputs as f32 rows (and the expert ids
//! of a `MUL_MAT_ID`), in graph order.
//!
//! Nothing of this costs anything without an observer: graphs are built, kept and run as
//! before. With one, the wanted inputs are kept alive until the micro-batch is done (graph
//! outputs) and read back after it, so every micro-batch is waited for. Which memory holds a
//! value never changes what is computed, so the logits stay the same bit for bit.

use std::collections::HashMap;

use lamina_core::DType;
use lamina_core::graph::{Graph, Op, TensorId};
use lamina_core::tensor::TensorFlags;

/// Which product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatmulKind {
    /// `weight · input` (ggml's `MUL_MAT`).
    MulMat,
    /// Expert products (ggml's `MUL_MAT_ID`): `weight` is `[K, M, n_expert]`, the input
    /// `[K, n_b1, n_tokens]`, the ids `[n_used, n_tokens]`.
    MulMatId,
}

/// One product with a model weight in a graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatmulInfo {
    /// The weight's tensor name in the model file (`blk.0.attn_q.weight`).
    pub weight: String,
    pub kind: MatmulKind,
    /// The weight's shape, innermost first (ggml's `src0->ne`).
    pub weight_ne: [usize; 4],
    /// The input's shape (ggml's `src1->ne`): `ne[1]` is the number of tokens of a `MUL_MAT`.
    pub input_ne: [usize; 4],
    pub input_dtype: DType,
    /// The expert ids' shape, `[n_used, n_tokens, 1, 1]` (`MUL_MAT_ID` only).
    pub ids_ne: Option<[usize; 4]>,
}

/// Sees the inputs of the products it asks for.
pub trait MatmulObserver: Send {
    /// ggml's `ask == true`: whether to be shown this product's input. Asked when a graph is
    /// built (a graph is reused for micro-batches of the same shape, with the same answers).
    fn ask(&mut self, info: &MatmulInfo) -> bool;

    /// ggml's `ask == false`, after the micro-batch ran: `input` holds the product's input,
    /// contiguous, `input_ne[0]` values per row, rows in ggml order (`ne[1]`, then `ne[2]`,
    /// then `ne[3]`); `ids` the expert ids of a `MUL_MAT_ID` (`ids_ne[0]` per token).
    fn collect(&mut self, info: &MatmulInfo, input: &[f32], ids: Option<&[i32]>);
}

/// A product the observer asked for, in a built graph.
#[derive(Clone, Debug)]
pub(crate) struct Tap {
    pub info: MatmulInfo,
    pub input: TensorId,
    pub ids: Option<TensorId>,
}

/// The names of the model's tensors by their byte offset in the file (what weight tensors are
/// bound at in a mapping; see `WeightStore::file_offset` for copies).
pub(crate) fn weight_names(gguf: &lamina_gguf::Gguf) -> HashMap<usize, String> {
    gguf.tensors
        .iter()
        .filter_map(|t| {
            let off = usize::try_from(gguf.data_offset.checked_add(t.offset)?).ok()?;
            Some((off, t.name.clone()))
        })
        .collect()
}

/// Asks `observer` about every product of `graph` with a weight named in `names`; the inputs
/// (and ids) it wants become graph outputs, so their memory lives until the graph is done.
pub(crate) fn tap_graph(
    graph: &mut Graph,
    names: &HashMap<usize, String>,
    file_offset: &dyn Fn(u64, usize) -> Option<usize>,
    observer: &mut dyn MatmulObserver,
) -> Vec<Tap> {
    let mut taps = Vec::new();
    let ids: Vec<TensorId> = graph.ids().collect();
    for id in ids {
        let t = graph.tensor(id);
        let kind = match t.op {
            Op::MulMat => MatmulKind::MulMat,
            Op::MulMatId => MatmulKind::MulMatId,
            _ => continue,
        };
        let (Some(w), Some(x)) = (t.src[0], t.src[1]) else {
            continue;
        };
        let ids_src = if kind == MatmulKind::MulMatId {
            t.src[2]
        } else {
            None
        };
        let wt = graph.tensor(w);
        if !wt.flags.contains(TensorFlags::WEIGHT) || wt.view_src.is_some() {
            continue;
        }
        // Weights copied to a device are bound at their place there, not at their file offset.
        let Some(name) = wt
            .binding
            .as_ref()
            .and_then(|b| file_offset(b.memory.memory_id(), b.offset))
            .and_then(|at| names.get(&at))
        else {
            continue;
        };
        let xt = graph.tensor(x);
        let info = MatmulInfo {
            weight: name.clone(),
            kind,
            weight_ne: wt.ne(),
            input_ne: xt.ne(),
            input_dtype: xt.dtype(),
            ids_ne: ids_src.map(|i| graph.tensor(i).ne()),
        };
        if info.input_dtype != DType::F32 || !observer.ask(&info) {
            continue;
        }
        for keep in [Some(x), ids_src].into_iter().flatten() {
            let root = graph.root(keep);
            // Both exist: they are sources of a node of this graph.
            let _ = graph.set_output(keep);
            let _ = graph.set_output(root);
        }
        taps.push(Tap {
            info,
            input: x,
            ids: ids_src,
        });
    }
    taps
}

/// The elements of a tensor of layout `ne`/`nb` (4-byte elements) read from `bytes`, which
/// start at the tensor's first byte, in ggml order.
pub(crate) fn gather_4byte(bytes: &[u8], ne: [usize; 4], nb: [usize; 4]) -> Option<Vec<[u8; 4]>> {
    let n = ne.iter().product::<usize>();
    let mut out = Vec::with_capacity(n);
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                let row = i3 * nb[3] + i2 * nb[2] + i1 * nb[1];
                for i0 in 0..ne[0] {
                    let o = row + i0 * nb[0];
                    out.push(bytes.get(o..o + 4)?.try_into().ok()?);
                }
            }
        }
    }
    Some(out)
}
