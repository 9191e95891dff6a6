//! Graph execution on one CPU device: resolve every tensor to memory (on the host, at enqueue,
//! so errors come back at once), then on the queue thread lock the buffers, turn locations into
//! pointers and run all nodes on the worker pool, a barrier after each node.
//!
//! This is the device-memory boundary: kernels get [`TView`]s (pointer + layout) and read or
//! write through them with `unsafe` accessors whose contract is stated on each.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use lamina_backend::{BackendError, Buffer, BufferSlice, DeviceKey};
use lamina_core::DType;
use lamina_core::graph::{Graph, MAX_SRC, Op, TensorId};
use lamina_core::tensor::Layout;

use crate::kernels::pack16::Packed16;
use crate::ops;
use crate::packed::PackCache;
use crate::pool::WorkerPool;

/// A tensor's memory as the kernels see it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TView {
    ptr: *mut u8,
    pub l: Layout,
}

// SAFETY: a TView is an address plus a layout; the memory behind it is locked by the executing
// queue thread for as long as kernels run, and kernels partition their writes across threads.
unsafe impl Send for TView {}
// SAFETY: see above.
unsafe impl Sync for TView {}

impl TView {
    /// Whether both views start at the same address (an op running in place).
    pub fn same_start(&self, other: &TView) -> bool {
        self.ptr == other.ptr
    }

    #[inline]
    fn at(&self, i: [usize; 4]) -> *mut u8 {
        self.ptr.wrapping_add(self.l.offset_of(i))
    }

    /// Bytes of packed row `(i1, i2, i3)`.
    ///
    /// # Safety
    /// The row is in bounds (validated at enqueue for in-range indices) and no thread writes it
    /// while the slice lives.
    #[inline]
    pub unsafe fn row<'a>(&self, i1: usize, i2: usize, i3: usize) -> &'a [u8] {
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.at([0, i1, i2, i3]), self.l.row_bytes()) }
    }

    /// The bytes from row `(0, i2, 0)` to the end of row `(n1 - 1, i2, 0)` (rows along dim 1
    /// at stride `nb[1]`), for kernels that step through rows themselves.
    ///
    /// # Safety
    /// As [`TView::row`], for all `n1` rows.
    #[inline]
    pub unsafe fn row_span<'a>(&self, i2: usize, n1: usize) -> &'a [u8] {
        let len = if n1 == 0 {
            0
        } else {
            (n1 - 1) * self.l.nb[1] + self.l.row_bytes()
        };
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.at([0, 0, i2, 0]), len) }
    }

    /// Mutable bytes of packed row `(i1, i2, i3)`.
    ///
    /// # Safety
    /// As [`TView::row`], and this thread is the row's only user while the slice lives.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub unsafe fn row_mut<'a>(&self, i1: usize, i2: usize, i3: usize) -> &'a mut [u8] {
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.at([0, i1, i2, i3]), self.l.row_bytes()) }
    }

    /// Packed f32 row.
    ///
    /// # Safety
    /// As [`TView::row`]; the tensor is f32 with packed rows (alignment validated at enqueue).
    #[inline]
    pub unsafe fn row_f32<'a>(&self, i1: usize, i2: usize, i3: usize) -> &'a [f32] {
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.at([0, i1, i2, i3]) as *const f32, self.l.ne[0]) }
    }

    /// Mutable packed f32 row.
    ///
    /// # Safety
    /// As [`TView::row_mut`] and [`TView::row_f32`].
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub unsafe fn row_f32_mut<'a>(&self, i1: usize, i2: usize, i3: usize) -> &'a mut [f32] {
        // SAFETY: by the caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.at([0, i1, i2, i3]) as *mut f32, self.l.ne[0])
        }
    }

    /// `n` f32 values from flat element `start` of a contiguous f32 tensor.
    ///
    /// # Safety
    /// As [`TView::row_f32`]; the tensor is contiguous and the run in bounds.
    #[inline]
    pub unsafe fn f32_run<'a>(&self, start: usize, n: usize) -> &'a [f32] {
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts((self.ptr as *const f32).add(start), n) }
    }

    /// Mutable [`TView::f32_run`].
    ///
    /// # Safety
    /// As [`TView::f32_run`], and this thread is the run's only user.
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub unsafe fn f32_run_mut<'a>(&self, start: usize, n: usize) -> &'a mut [f32] {
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut((self.ptr as *mut f32).add(start), n) }
    }

    /// Mutable packed i32 row.
    ///
    /// # Safety
    /// As [`TView::row_mut`]; the tensor is i32 with packed rows (alignment validated at
    /// enqueue).
    #[allow(clippy::mut_from_ref)]
    #[inline]
    pub unsafe fn row_i32_mut<'a>(&self, i1: usize, i2: usize, i3: usize) -> &'a mut [i32] {
        // SAFETY: by the caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.at([0, i1, i2, i3]) as *mut i32, self.l.ne[0])
        }
    }

    /// Element `i` as f32 (f32, f16, bf16, i32).
    ///
    /// # Safety
    /// `i` is in range and no thread writes the element concurrently.
    #[inline]
    pub unsafe fn get(&self, i: [usize; 4]) -> f32 {
        let p = self.at(i);
        // SAFETY: in range by contract; alignment validated at enqueue.
        unsafe {
            match self.l.dtype {
                DType::F32 => *(p as *const f32),
                DType::F16 => half::f16::from_bits(*(p as *const u16)).to_f32(),
                DType::BF16 => half::bf16::from_bits(*(p as *const u16)).to_f32(),
                DType::I32 => *(p as *const i32) as f32,
                _ => f32::NAN,
            }
        }
    }

    /// Stores `vals` at elements `i`, `i + [1, 0, 0, 0]`, … (a run along dim 0), converting as
    /// [`TView::set`] does; f32 directly through the stride.
    ///
    /// # Safety
    /// The run is in range and this thread is its elements' only user.
    #[inline(always)]
    pub unsafe fn set_run(&self, i: [usize; 4], vals: &[f32]) {
        let p = self.at(i);
        let step = self.l.nb[0];
        if self.l.dtype == DType::F32 && step == 4 {
            // Packed f32 (a matmul's output rows): one copy, not a store per value.
            // SAFETY: as below; the run's `vals.len()` f32 values are consecutive.
            unsafe {
                std::ptr::copy_nonoverlapping(vals.as_ptr(), p as *mut f32, vals.len());
            }
            return;
        }
        for (k, &v) in vals.iter().enumerate() {
            // SAFETY: in range by contract; alignment validated at enqueue.
            unsafe {
                if self.l.dtype == DType::F32 {
                    *(p.wrapping_add(k * step) as *mut f32) = v;
                } else {
                    self.set([i[0] + k, i[1], i[2], i[3]], v);
                }
            }
        }
    }

    /// Stores `v` at element `i`, converting to the tensor's type (f32, f16, bf16, i32).
    ///
    /// # Safety
    /// `i` is in range and this thread is the element's only user.
    #[inline]
    pub unsafe fn set(&self, i: [usize; 4], v: f32) {
        let p = self.at(i);
        // SAFETY: in range by contract; alignment validated at enqueue.
        unsafe {
            match self.l.dtype {
                DType::F32 => *(p as *mut f32) = v,
                DType::F16 => *(p as *mut u16) = half::f16::from_f32(v).to_bits(),
                DType::BF16 => *(p as *mut u16) = half::bf16::from_f32(v).to_bits(),
                DType::I32 => *(p as *mut i32) = v as i32,
                _ => {}
            }
        }
    }

    /// Copies element `j` of `src` to element `i` of this tensor: bit-exact when the types
    /// match, else converted through f32.
    ///
    /// # Safety
    /// As [`TView::set`] for `i` and [`TView::get`] for `j`; the two elements do not overlap.
    #[inline]
    pub unsafe fn copy_elem(&self, i: [usize; 4], src: &TView, j: [usize; 4]) {
        if self.l.dtype == src.l.dtype && !self.l.dtype.is_quantized() {
            let n = self.l.dtype.type_size() as usize;
            // SAFETY: by the caller's contract.
            unsafe { std::ptr::copy_nonoverlapping(src.at(j), self.at(i), n) };
        } else {
            // SAFETY: by the caller's contract.
            unsafe { self.set(i, src.get(j)) };
        }
    }

    /// Copies row `(i1, i2, i3)` of `src` (same shape and dtype, not quantized; any strides)
    /// into the same row of `self`: one `memcpy` when both rows are packed, else element by
    /// element without per-element index or type dispatch.
    ///
    /// # Safety
    /// As [`TView::copy_elem`] for every element of the row.
    pub unsafe fn copy_row_from(&self, i1: usize, i2: usize, i3: usize, src: &TView) {
        let ts = self.l.dtype.type_size() as usize;
        let n = self.l.ne[0];
        let (s, d) = (src.at([0, i1, i2, i3]), self.at([0, i1, i2, i3]));
        let (ss, ds) = (src.l.nb[0], self.l.nb[0]);
        // SAFETY: by the caller's contract.
        unsafe {
            if ss == ts && ds == ts {
                std::ptr::copy_nonoverlapping(s, d, n * ts);
            } else if ts == 4 {
                for i in 0..n {
                    let v = s.add(i * ss).cast::<u32>().read_unaligned();
                    d.add(i * ds).cast::<u32>().write_unaligned(v);
                }
            } else {
                for i in 0..n {
                    std::ptr::copy_nonoverlapping(s.add(i * ss), d.add(i * ds), ts);
                }
            }
        }
    }

    /// Stores an i32 element.
    ///
    /// # Safety
    /// As [`TView::set`]; the tensor is i32.
    #[inline]
    pub unsafe fn set_i32(&self, i: [usize; 4], v: i32) {
        // SAFETY: by the caller's contract; alignment validated at enqueue.
        unsafe { *(self.at(i) as *mut i32) = v };
    }

    /// An index element (i32 or i64).
    ///
    /// # Safety
    /// `i` is in range.
    #[inline]
    pub unsafe fn index(&self, i: [usize; 4]) -> i64 {
        let p = self.at(i);
        // SAFETY: in range by contract; alignment validated at enqueue.
        unsafe {
            match self.l.dtype {
                DType::I64 => *(p as *const i64),
                _ => i64::from(*(p as *const i32)),
            }
        }
    }
}

/// Scratch memory shared by the threads of one graph run.
#[derive(Clone, Copy)]
pub(crate) struct Work {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: regions of the work buffer are handed to threads disjointly (per-thread scratch) or
// written in one phase and read in the next, with a barrier between.
unsafe impl Send for Work {}
// SAFETY: see above.
unsafe impl Sync for Work {}

impl Work {
    /// Bytes `[off, off + len)`.
    ///
    /// # Safety
    /// In bounds (sized by `ops::work_size`), and no other thread uses an overlapping range
    /// mutably at the same time.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes<'a>(&self, off: usize, len: usize) -> &'a mut [u8] {
        debug_assert!(off + len <= self.len);
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off), len) }
    }

    /// Bytes `[off, off + len)` for reading.
    ///
    /// # Safety
    /// In bounds, and no thread writes the range while the slice lives.
    pub unsafe fn bytes_ref<'a>(&self, off: usize, len: usize) -> &'a [u8] {
        debug_assert!(off + len <= self.len);
        // SAFETY: by the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) }
    }

    /// `n` f32 values at byte offset `off` (a multiple of 4).
    ///
    /// # Safety
    /// As [`Work::bytes`].
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn f32s<'a>(&self, off: usize, n: usize) -> &'a mut [f32] {
        debug_assert!(off.is_multiple_of(4) && off + 4 * n <= self.len);
        // SAFETY: by the caller's contract; the work buffer is 8-byte aligned.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off) as *mut f32, n) }
    }

    /// `n` i32 values at byte offset `off` (a multiple of 4).
    ///
    /// # Safety
    /// As [`Work::bytes`].
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn i32s<'a>(&self, off: usize, n: usize) -> &'a mut [i32] {
        debug_assert!(off.is_multiple_of(4) && off + 4 * n <= self.len);
        // SAFETY: by the caller's contract; the work buffer is 8-byte aligned.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off) as *mut i32, n) }
    }

    /// `n` u32 values at byte offset `off` (a multiple of 4), for reading.
    ///
    /// # Safety
    /// As [`Work::bytes_ref`].
    pub unsafe fn u32s_ref<'a>(&self, off: usize, n: usize) -> &'a [u32] {
        debug_assert!(off.is_multiple_of(4) && off + 4 * n <= self.len);
        // SAFETY: by the caller's contract; the work buffer is 8-byte aligned.
        unsafe { std::slice::from_raw_parts(self.ptr.add(off) as *const u32, n) }
    }

    /// `n` u32 values at byte offset `off` (a multiple of 4).
    ///
    /// # Safety
    /// As [`Work::bytes`].
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn u32s<'a>(&self, off: usize, n: usize) -> &'a mut [u32] {
        debug_assert!(off.is_multiple_of(4) && off + 4 * n <= self.len);
        // SAFETY: by the caller's contract; the work buffer is 8-byte aligned.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(off) as *mut u32, n) }
    }
}

/// First error raised by any thread during a run.
#[derive(Default)]
pub(crate) struct ErrorSlot(Mutex<Option<String>>);

impl ErrorSlot {
    pub fn set(&self, msg: impl FnOnce() -> String) {
        let mut e = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if e.is_none() {
            *e = Some(msg());
        }
    }
    fn take(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// One node to run.
pub(crate) struct NodePlan {
    pub id: TensorId,
    pub op: Op,
    pub dst: TView,
    pub src: [Option<TView>; MAX_SRC],
    /// A `MUL_MAT`'s weights packed for the tier's packed tiles ([`crate::packed`]), or the
    /// packed copy a `GET_ROWS` reads its rows from.
    pub packed: Option<Arc<Packed16>>,
}

/// Thread `ith` of `nth`'s share of `0..n`.
pub(crate) fn split(n: usize, ith: usize, nth: usize) -> Range<usize> {
    let per = n.div_ceil(nth.max(1));
    let s = (ith * per).min(n);
    s..(s + per).min(n)
}

/// Row `r` of a tensor with dims `ne` as `(i1, i2, i3)`.
pub(crate) fn unravel_row(r: usize, ne: [usize; 4]) -> (usize, usize, usize) {
    (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]))
}

/// A graph checked against a device: where each tensor lives.
pub(crate) struct Prepared {
    pub graph: Arc<Graph>,
    /// Indices of the nodes to run (compute nodes in this range, in order).
    pub nodes: Range<usize>,
    pub buffers: Vec<Buffer>,
    /// Indices into `buffers` by ascending buffer id: the order they are locked in, the same
    /// on every queue, so two queues never deadlock.
    pub lock_order: Vec<usize>,
    /// Per tensor: index into `buffers` and byte offset, for tensors the compute touches.
    pub loc: Vec<Option<(usize, usize)>>,
}

fn elem_align(dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::I32 => 4,
        DType::F16 | DType::BF16 | DType::I16 => 2,
        DType::I64 | DType::F64 => 8,
        _ => 1,
    }
}

/// Checks that every tensor the graph computes or reads is bound to memory of `device`, in
/// bounds, aligned, and that outputs are writable and do not overlap their inputs.
pub(crate) fn prepare(
    graph: Arc<Graph>,
    nodes: Range<usize>,
    device: DeviceKey,
    device_name: &str,
) -> Result<Prepared, BackendError> {
    let nodes = nodes.start.min(graph.len())..nodes.end.min(graph.len());
    let node_ids = || graph.ids().skip(nodes.start).take(nodes.len());
    let mut buffers: Vec<Buffer> = Vec::new();
    let mut loc = vec![None; graph.len()];
    let mut locate = |id: TensorId,
                      loc: &mut Vec<Option<(usize, usize)>>|
     -> Result<(usize, usize), BackendError> {
        if let Some(l) = loc[id.index()] {
            return Ok(l);
        }
        let t = graph.tensor(id);
        let BufferSlice { buffer, offset, .. } =
            BufferSlice::of_tensor_on(&graph, id, device, device_name)?;
        let a = elem_align(t.layout.dtype);
        if buffer.base_alignment() < a
            || !offset.is_multiple_of(a)
            || t.layout.nb.iter().any(|nb| !nb.is_multiple_of(a))
        {
            return Err(BackendError::Device {
                device: device_name.to_owned(),
                message: format!(
                    "tensor {id} '{}' is misaligned for {}",
                    t.name, t.layout.dtype
                ),
            });
        }
        let bi = match buffers.iter().position(|b| b == &buffer) {
            Some(i) => i,
            None => {
                buffers.push(buffer);
                buffers.len() - 1
            }
        };
        loc[id.index()] = Some((bi, offset));
        Ok((bi, offset))
    };
    for id in node_ids() {
        let t = graph.tensor(id);
        if !t.op.is_compute() {
            continue;
        }
        let (db, doff) = locate(id, &mut loc)?;
        let dspan = t.layout.span_bytes();
        for s in t.sources() {
            if t.op == Op::Cpy && Some(s) == t.src[1] {
                continue; // the destination operand itself
            }
            let (sb, soff) = locate(s, &mut loc)?;
            let sspan = graph.tensor(s).layout.span_bytes();
            // An op that runs in place may write exactly over its first source.
            let in_place = t.op.runs_in_place()
                && Some(s) == t.src[0]
                && (sb, soff) == (db, doff)
                && graph.tensor(s).layout == t.layout;
            if !in_place && sb == db && soff < doff + dspan && doff < soff + sspan {
                return Err(BackendError::Device {
                    device: device_name.to_owned(),
                    message: format!("output {id} of {} overlaps its input {s}", t.op.name()),
                });
            }
        }
    }
    for id in node_ids() {
        let t = graph.tensor(id);
        if t.op.is_compute()
            && let Some((bi, _)) = loc[id.index()]
            && buffers[bi].is_read_only()
        {
            return Err(BackendError::ReadOnly(buffers[bi].name()));
        }
    }
    let mut lock_order: Vec<usize> = (0..buffers.len()).collect();
    lock_order.sort_by_key(|&i| buffers[i].id());
    Ok(Prepared {
        graph,
        nodes,
        buffers,
        lock_order,
        loc,
    })
}

/// The queue thread's state for one CPU device.
pub(crate) struct ExecState {
    pub pool: WorkerPool,
    /// The device's name, for errors.
    name: String,
    /// Grow-only scratch (u64 for 8-byte alignment).
    work: Vec<u64>,
    /// The node plans of the graph being run, kept for their allocation (their views are
    /// only valid during one [`execute`]).
    nodes: Vec<NodePlan>,
    /// Base address of each of the running graph's buffers, kept for its allocation.
    bases: Vec<BasePtr>,
    /// Weights packed for the tier's packed tiles.
    packs: PackCache,
}

impl ExecState {
    pub fn new(pool: WorkerPool, name: String) -> ExecState {
        ExecState {
            pool,
            name,
            work: Vec::new(),
            nodes: Vec::new(),
            bases: Vec::new(),
            packs: PackCache::default(),
        }
    }
}

/// A buffer's base address while its guard is held.
#[derive(Clone, Copy)]
struct BasePtr(*mut u8);

// SAFETY: only an address; it is dereferenced (through `TView`s) only inside `execute`, while
// the buffer it points into is locked by that same call.
unsafe impl Send for BasePtr {}

/// Locks the buffers of `p` in `order` one by one, noting each one's base address in `bases`,
/// then runs `f` with all of them held. Recursion keeps the guards on the stack (a graph has a
/// handful of buffers), so nothing is allocated per run.
fn with_locked<R>(
    p: &Prepared,
    order: &[usize],
    bases: &mut [BasePtr],
    f: impl FnOnce(&[BasePtr]) -> R,
) -> Result<R, BackendError> {
    let Some((&i, rest)) = order.split_first() else {
        return Ok(f(bases));
    };
    let g = p.buffers[i].lock();
    bases[i] = BasePtr(if g.is_read_only() {
        g.as_ptr()? as *mut u8
    } else {
        g.as_mut_ptr()?
    });
    with_locked(p, rest, bases, f)
}

/// Runs a prepared graph (on the device's queue thread).
pub(crate) fn execute(state: &mut ExecState, p: &Prepared) -> Result<(), BackendError> {
    let mut bases = std::mem::take(&mut state.bases);
    bases.clear();
    bases.resize(p.buffers.len(), BasePtr(std::ptr::null_mut()));
    let r = with_locked(p, &p.lock_order, &mut bases, |bases| {
        run_locked(state, p, bases)
    });
    state.bases = bases;
    r?
}

/// [`execute`], with every buffer of `p` locked at `bases`.
fn run_locked(state: &mut ExecState, p: &Prepared, bases: &[BasePtr]) -> Result<(), BackendError> {
    let graph = &*p.graph;
    let view = |id: TensorId| -> Option<TView> {
        let (bi, off) = p.loc[id.index()]?;
        Some(TView {
            ptr: bases[bi].0.wrapping_add(off),
            l: graph.tensor(id).layout,
        })
    };
    let nth = state.pool.threads();
    let mut nodes = std::mem::take(&mut state.nodes);
    nodes.clear();
    let mut work_bytes = 0usize;
    for id in graph.ids().skip(p.nodes.start).take(p.nodes.len()) {
        let t = graph.tensor(id);
        if !t.op.is_compute() {
            continue;
        }
        let dst = view(id).ok_or_else(|| BackendError::Unbound(id.to_string()))?;
        let src = [
            t.src[0].and_then(view),
            t.src[1].and_then(view),
            t.src[2].and_then(view),
            t.src[3].and_then(view),
            t.src[4].and_then(view),
        ];
        // A product's weights in a read-only buffer, where the packed tiles suit it: packed
        // once, on first use.
        let packed = match (
            t.op,
            src[0],
            src[1],
            t.src[0].and_then(|w| p.loc[w.index()]),
        ) {
            (Op::MulMat, Some(w), Some(b), Some((bi, off))) => {
                // SAFETY: `w` addresses the weight, in bounds (checked by `prepare`), in a
                // buffer locked for this call.
                unsafe {
                    state
                        .packs
                        .get(&mut state.pool, &p.buffers[bi], off, w.ptr, &w.l, b.l.ne[1])
                }
            }
            _ => None,
        };
        let node = NodePlan {
            id,
            op: t.op,
            dst,
            src,
            packed,
        };
        work_bytes = work_bytes.max(ops::work_size(&node, nth));
        nodes.push(node);
    }
    // Rows of a packed weight (a tied embedding) come from the copy, looked up once every
    // product of the graph has made its copies: the file's pages were dropped, and faulting
    // one back maps its cached neighbours too (the kernel's fault-around), which refilled
    // most of the embedding.
    for node in nodes.iter_mut().filter(|n| n.op == Op::GetRows) {
        let w = graph.tensor(node.id).src[0].and_then(|w| p.loc[w.index()]);
        if let (Some((bi, off)), Some(src)) = (w, node.src[0]) {
            node.packed = state.packs.find(&p.buffers[bi], off, &src.l);
        }
    }
    let words = work_bytes.div_ceil(8);
    if state.work.len() < words {
        state.work.resize(words, 0);
    }
    let work = Work {
        ptr: state.work.as_mut_ptr() as *mut u8,
        len: words * 8,
    };
    let errors = ErrorSlot::default();
    let ok = state.pool.run(&|ctx| {
        for node in &nodes {
            ops::compute(node, ctx, work, &errors);
            ctx.barrier.wait();
        }
    });
    state.nodes = nodes;
    if !ok {
        return Err(BackendError::Device {
            device: state.name.clone(),
            message: "a kernel panicked".into(),
        });
    }
    match errors.take() {
        Some(message) => Err(BackendError::Device {
            device: state.name.clone(),
            message,
        }),
        None => Ok(()),
    }
}
