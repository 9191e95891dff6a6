//! The CPU kernels, one function per op. Every kernel is called by all `nth` threads of the
//! device with its own `ith` and writes only its share of the output (rows, or for `set_rows`
//! destination rows by index), so no two threads write the same bytes. Scalar for now; the
//! per-type dot kernels of `mul_mat` are the plug-in point for SIMD.

use lamina_core::DType;
use lamina_core::graph::{GluOp, Op, RopeMode, RopeParams, SortOrder, UnaryOp};

use crate::exec::{ErrorSlot, NodePlan, TView, Work, split, unravel_row};
use crate::kernels;
use crate::kernels::act::elem;
use crate::pool::WorkerCtx;
use crate::quant;

/// Scratch bytes a node needs for `nth` threads.
pub(crate) fn work_size(node: &NodePlan, nth: usize) -> usize {
    let max_ne0 = node
        .src
        .iter()
        .flatten()
        .map(|s| s.l.ne[0])
        .max()
        .unwrap_or(0)
        .max(node.dst.l.ne[0]);
    let per_thread = nth * 2 * max_ne0 * 4;
    match node.op {
        Op::MulMat => match (node.src[0], node.src[1]) {
            (Some(a), Some(b)) => {
                let k = a.l.ne[0];
                let brow = quant::vec_dot_type(a.l.dtype)
                    .and_then(|t| t.row_size(k as u64).ok())
                    .unwrap_or(0) as usize;
                (b.l.nrows() * brow).next_multiple_of(64) + nth * k * 4
            }
            _ => 0,
        },
        Op::MulMatId => MulMatIdPlan::new(kernels::table(), node, nth).map_or(0, |p| p.work_bytes),
        Op::Attention { .. } => match AttentionPlan::new(kernels::table(), node) {
            Some(p) => nth * p.scratch_bytes() + 8 * p.q.l.ne[1],
            None => 0,
        },
        Op::FlashAttnExt { kv_chunks, .. } => crate::flash_attn::work_size(node, nth, kv_chunks),
        _ => per_thread,
    }
}

/// Byte offset of the per-thread scratch slot `slot` (0 or 1) of `max_ne0` 4-byte values,
/// for nodes other than mul_mat.
fn scratch_off(ctx: &WorkerCtx<'_>, node: &NodePlan, slot: usize) -> usize {
    let max_ne0 = node
        .src
        .iter()
        .flatten()
        .map(|s| s.l.ne[0])
        .max()
        .unwrap_or(0)
        .max(node.dst.l.ne[0]);
    (ctx.ith * 2 + slot) * max_ne0 * 4
}

/// Per-thread f32 scratch of `n` values (`slot` 0 or 1), for nodes other than mul_mat.
///
/// # Safety
/// Each (thread, slot) region is used by that thread only.
unsafe fn scratch<'a>(
    work: Work,
    ctx: &WorkerCtx<'_>,
    node: &NodePlan,
    slot: usize,
    n: usize,
) -> &'a mut [f32] {
    // SAFETY: per-thread disjoint region inside `work_size`.
    unsafe { work.f32s(scratch_off(ctx, node, slot), n) }
}

/// [`scratch`] as i32 values.
///
/// # Safety
/// As [`scratch`].
unsafe fn scratch_i32<'a>(
    work: Work,
    ctx: &WorkerCtx<'_>,
    node: &NodePlan,
    slot: usize,
    n: usize,
) -> &'a mut [i32] {
    // SAFETY: per-thread disjoint region inside `work_size`.
    unsafe { work.i32s(scratch_off(ctx, node, slot), n) }
}

/// Source row `(i1, i2, i3)` as f32: borrowed when packed f32, else gathered into `buf`.
///
/// # Safety
/// The row is in range and not written concurrently.
unsafe fn src_row<'a>(v: &TView, i1: usize, i2: usize, i3: usize, buf: &'a mut [f32]) -> &'a [f32] {
    if v.l.dtype == DType::F32 && v.l.rows_packed() {
        // SAFETY: by the caller's contract.
        return unsafe { v.row_f32(i1, i2, i3) };
    }
    for (i0, o) in buf.iter_mut().enumerate().take(v.l.ne[0]) {
        // SAFETY: by the caller's contract.
        *o = unsafe { v.get([i0, i1, i2, i3]) };
    }
    &buf[..v.l.ne[0]]
}

/// [`src_row`] for an op that may run in place (see `Op::runs_in_place`): when `a` is the
/// destination's memory, the row is copied into `buf` before the output row is borrowed over it.
///
/// # Safety
/// As [`src_row`].
unsafe fn src_row_before_dst<'a>(
    a: &TView,
    d: &TView,
    i1: usize,
    i2: usize,
    i3: usize,
    buf: &'a mut [f32],
) -> &'a [f32] {
    if a.same_start(d) {
        // SAFETY: by the caller's contract.
        buf.copy_from_slice(unsafe { &a.row_f32(i1, i2, i3)[..a.l.ne[0]] });
        return buf;
    }
    // SAFETY: by the caller's contract.
    unsafe { src_row(a, i1, i2, i3, buf) }
}

pub(crate) fn compute(node: &NodePlan, ctx: &WorkerCtx<'_>, work: Work, err: &ErrorSlot) {
    let Some(a) = node.src[0] else {
        err.set(|| format!("{} {}: missing source", node.op.name(), node.id));
        return;
    };
    match node.op {
        Op::GetRows => get_rows(node, a, ctx, err),
        Op::MulMat => mul_mat(node, a, ctx, work, err),
        Op::MulMatId => mul_mat_id(node, a, ctx, work, err),
        Op::Add | Op::Mul | Op::Div => binary(node, a, ctx, work),
        Op::AddId => add_id(node, a, ctx, work, err),
        Op::SumRows => sum_rows(node, a, ctx, work),
        Op::Repeat => repeat(node, a, ctx),
        Op::Fill { value } => {
            let d = node.dst;
            for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
                let (i1, i2, i3) = unravel_row(r, d.l.ne);
                // SAFETY: dst row r is this thread's (rows are split across threads).
                unsafe { d.row_f32_mut(i1, i2, i3).fill(value) };
            }
        }
        Op::Clamp { min, max } => map_rows(node, a, ctx, work, |x, y| {
            for (o, &v) in y.iter_mut().zip(x) {
                *o = elem::clamp(v, min, max);
            }
        }),
        Op::ArgSort(order) => argsort(node, a, order, ctx, work),
        Op::TopK => top_k(node, a, ctx, work),
        Op::Scale { scale, bias } => map_rows(node, a, ctx, work, |x, y| {
            for (o, v) in y.iter_mut().zip(x) {
                *o = v * scale + bias;
            }
        }),
        Op::RmsNorm { eps } => rms_norm(node, a, eps, ctx, work),
        Op::Norm { eps } => map_rows(node, a, ctx, work, |x, y| kernels::norm_row(x, eps, y)),
        Op::Unary(UnaryOp::Silu) => map_rows(node, a, ctx, work, kernels::silu_row),
        Op::Unary(UnaryOp::Gelu) => map_rows(node, a, ctx, work, kernels::gelu_row),
        Op::Unary(op) => {
            let f: fn(f32) -> f32 = match op {
                UnaryOp::Sigmoid => elem::sigmoid,
                UnaryOp::Softplus => elem::softplus,
                UnaryOp::Tanh => elem::tanh,
                UnaryOp::Relu => elem::relu,
                UnaryOp::Sqr => elem::sqr,
                UnaryOp::Sqrt => elem::sqrt,
                UnaryOp::Exp => elem::exp,
                UnaryOp::GeluErf => elem::gelu_erf,
                UnaryOp::Silu | UnaryOp::Gelu => unreachable!("matched above"),
            };
            map_rows(node, a, ctx, work, |x, y| {
                for (o, &v) in y.iter_mut().zip(x) {
                    *o = f(v);
                }
            })
        }
        Op::Glu {
            op,
            swapped,
            alpha,
            limit,
        } => glu(node, a, (op, swapped, alpha, limit), ctx, work),
        Op::Rope(p) => rope(node, a, &p, ctx, work, err),
        Op::SoftMax { scale, max_bias } => soft_max(node, a, scale, max_bias, ctx, work),
        Op::Attention { scale } => attention(node, scale, ctx, work, err),
        Op::Hadamard { n } => hadamard(node, a, n, ctx),
        Op::FlashAttnExt {
            scale,
            max_bias,
            softcap,
            kv_chunks,
        } => {
            crate::flash_attn::compute(node, (scale, max_bias, softcap, kv_chunks), ctx, work, err)
        }
        Op::SetRows => set_rows(node, a, ctx, work, err),
        Op::Cpy | Op::Cont => copy(node, a, ctx),
        Op::Concat { dim } => concat(node, a, dim, ctx),
        Op::ArgMax => argmax(node, a, ctx, work),
        Op::Leaf | Op::View | Op::Reshape | Op::Permute(_) | Op::Transpose => {}
    }
}

/// Applies `f(src_row, dst_row)` to every row of a same-shaped f32 output.
fn map_rows(
    node: &NodePlan,
    a: TView,
    ctx: &WorkerCtx<'_>,
    work: Work,
    f: impl Fn(&[f32], &mut [f32]),
) {
    let d = node.dst;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        // SAFETY: this thread owns dst row r (rows are split across threads); sources are not
        // written during this node; scratch slot 0 is this thread's.
        unsafe {
            let buf = scratch(work, ctx, node, 0, a.l.ne[0]);
            let x = src_row(&a, i1, i2, i3, buf);
            f(x, d.row_f32_mut(i1, i2, i3));
        }
    }
}

/// `rms_norm` over this thread's rows, 4 rows' sums of squares at a time where the source
/// rows are packed f32 (each row's sum keeps its order: the same bits as row by row).
fn rms_norm(node: &NodePlan, a: TView, eps: f32, ctx: &WorkerCtx<'_>, work: Work) {
    if a.l.dtype != DType::F32 || !a.l.rows_packed() {
        return map_rows(node, a, ctx, work, |x, y| kernels::rms_norm_row(x, eps, y));
    }
    let d = node.dst;
    let rows = split(d.l.nrows(), ctx.ith, ctx.nth);
    let mut r = rows.start;
    while r < rows.end {
        let k = (rows.end - r).min(4);
        let at = |j: usize| unravel_row(r + j.min(k - 1), d.l.ne);
        // SAFETY: as in `map_rows` (rows past this thread's range are never taken: a short
        // group repeats its last row, whose extra sum is not used).
        unsafe {
            let x = [0, 1, 2, 3].map(|j| {
                let (i1, i2, i3) = at(j);
                &a.row_f32(i1, i2, i3)[..a.l.ne[0]]
            });
            let sums = kernels::sum_sq_rows4(x);
            for j in 0..k {
                let (i1, i2, i3) = at(j);
                kernels::rms_norm_scale(x[j], sums[j], eps, d.row_f32_mut(i1, i2, i3));
            }
        }
        r += k;
    }
}

fn binary(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, work: Work) {
    let Some(b) = node.src[1] else { return };
    let d = node.dst;
    let op = node.op;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        // SAFETY: as in `map_rows`; scratch slots 0 and 1 are this thread's.
        unsafe {
            let x = src_row(&a, i1, i2, i3, scratch(work, ctx, node, 0, a.l.ne[0]));
            let y = src_row(
                &b,
                i1 % b.l.ne[1],
                i2 % b.l.ne[2],
                i3 % b.l.ne[3],
                scratch(work, ctx, node, 1, b.l.ne[0]),
            );
            let o = d.row_f32_mut(i1, i2, i3);
            // `y` repeats along the row (ggml_can_repeat); chunks of its length keep the
            // inner loop free of index arithmetic so it vectorises.
            for (oc, xc) in o.chunks_mut(y.len().max(1)).zip(x.chunks(y.len().max(1))) {
                match op {
                    Op::Add => binary_chunk(oc, xc, y, |a, b| a + b),
                    Op::Mul => binary_chunk(oc, xc, y, |a, b| a * b),
                    _ => binary_chunk(oc, xc, y, |a, b| a / b),
                }
            }
        }
    }
}

#[inline(always)]
fn binary_chunk(o: &mut [f32], x: &[f32], y: &[f32], f: impl Fn(f32, f32) -> f32) {
    for ((ov, &xv), &yv) in o.iter_mut().zip(x).zip(y) {
        *ov = f(xv, yv);
    }
}

fn glu(
    node: &NodePlan,
    a: TView,
    (op, swapped, alpha, limit): (GluOp, bool, f32, f32),
    ctx: &WorkerCtx<'_>,
    work: Work,
) {
    let d = node.dst;
    let n = d.l.ne[0];
    // ggml_vec_swiglu_f32 / ggml_vec_geglu_f32 (f16 GELU table) / the scalar loops of
    // ggml_compute_forward_{reglu,geglu_erf,swiglu_oai,swiglu_clamp}_f32.
    let act = |g: &[f32], u: &[f32], o: &mut [f32]| {
        let each = |o: &mut [f32], f: &dyn Fn(f32, f32) -> f32| {
            for ((o, &x), &y) in o.iter_mut().zip(g).zip(u) {
                *o = f(x, y);
            }
        };
        match op {
            GluOp::SwiGlu => kernels::swiglu_row(g, u, o),
            GluOp::GeGlu => kernels::geglu_row(g, u, o),
            GluOp::ReGlu => each(o, &elem::reglu),
            GluOp::GeGluErf => each(o, &elem::geglu_erf),
            GluOp::SwiGluOai => each(o, &|x, y| elem::swiglu_oai(x, y, alpha, limit)),
            GluOp::SwiGluClamp => each(o, &|x, y| elem::swiglu_clamp(x, y, limit)),
        }
    };
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        // SAFETY: as in `binary`.
        unsafe {
            let x = src_row_before_dst(&a, &d, i1, i2, i3, scratch(work, ctx, node, 0, a.l.ne[0]));
            let o = d.row_f32_mut(i1, i2, i3);
            match node.src[1] {
                Some(b) => {
                    let y = src_row(&b, i1, i2, i3, scratch(work, ctx, node, 1, b.l.ne[0]));
                    act(&x[..n], &y[..n], &mut o[..n]);
                }
                None => {
                    let (g, u) = if swapped {
                        (&x[n..2 * n], &x[..n])
                    } else {
                        (&x[..n], &x[n..2 * n])
                    };
                    act(g, u, &mut o[..n]);
                }
            }
        }
    }
}

/// ggml_compute_forward_add_id_f32: `dst[:, i1, i2] = a[:, i1, i2] + b[:, ids[i1, i2]]`.
fn add_id(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, work: Work, err: &ErrorSlot) {
    let (Some(b), Some(ids)) = (node.src[1], node.src[2]) else {
        return;
    };
    let d = node.dst;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        // SAFETY: dst row r is this thread's; sources are read-only; the id element is in
        // range (ids is [a.ne1, a.ne2], checked when the graph was built) and the b row is
        // read only after the bounds check; scratch slot 0 is this thread's.
        unsafe {
            let id = ids.index([i1, i2, 0, 0]);
            let o = d.row_f32_mut(i1, i2, i3);
            if id < 0 || id as usize >= b.l.ne[1] {
                err.set(|| {
                    format!(
                        "ADD_ID {}: row index {id} outside 0..{}",
                        node.id, b.l.ne[1]
                    )
                });
                o.fill(0.0);
                continue;
            }
            let x = src_row(&a, i1, i2, i3, scratch(work, ctx, node, 0, a.l.ne[0]));
            let y = b.row_f32(id as usize, 0, 0);
            for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                *o = x + y;
            }
        }
    }
}

/// ggml_compute_forward_sum_rows_f32: `ggml_vec_sum_f32`, an f64 sum in order.
fn sum_rows(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, work: Work) {
    let d = node.dst;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        // SAFETY: dst element r is this thread's; the source is read-only; scratch slot 0 is
        // this thread's.
        unsafe {
            let x = src_row(&a, i1, i2, i3, scratch(work, ctx, node, 0, a.l.ne[0]));
            let mut sum = 0f64;
            for &v in x {
                sum += f64::from(v);
            }
            d.set([0, i1, i2, i3], sum as f32);
        }
    }
}

/// ggml_compute_forward_repeat: element copies (bit-exact), `src[0]` tiled over `dst`.
fn repeat(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>) {
    let d = node.dst;
    let ne = a.l.ne;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        let (j1, j2, j3) = (i1 % ne[1], i2 % ne[2], i3 % ne[3]);
        for i0 in 0..d.l.ne[0] {
            // SAFETY: dst row r is this thread's; the source is read-only; both indices are
            // in range.
            unsafe { d.copy_elem([i0, i1, i2, i3], &a, [i0 % ne[0], j1, j2, j3]) };
        }
    }
}

/// ggml_compute_forward_argsort_f32: `std::sort` of the row's indices by value.
fn argsort(node: &NodePlan, a: TView, order: SortOrder, ctx: &WorkerCtx<'_>, work: Work) {
    let d = node.dst;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        // SAFETY: dst row r is this thread's (i32, contiguous); the source is read-only;
        // scratch slot 0 is this thread's.
        unsafe {
            let x = src_row(&a, i1, i2, i3, scratch(work, ctx, node, 0, a.l.ne[0]));
            let idx = d.row_i32_mut(i1, i2, i3);
            for (j, v) in idx.iter_mut().enumerate() {
                *v = j as i32;
            }
            kernels::sort::sort_indices(idx, x, order == SortOrder::Desc);
        }
    }
}

/// ggml_compute_forward_top_k_f32: `std::partial_sort` of the row's indices, the first `k`
/// copied out, then the first two swapped ("the order is not important").
fn top_k(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, work: Work) {
    let d = node.dst;
    let k = d.l.ne[0];
    let n = a.l.ne[0];
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        // SAFETY: dst row r is this thread's (i32, contiguous); the source is read-only;
        // scratch slots 0 and 1 are this thread's (slot 1 holds `n` i32 values: slots are
        // `max_ne0` 4-byte values each).
        unsafe {
            let x = src_row(&a, i1, i2, i3, scratch(work, ctx, node, 0, n));
            let tmp = scratch_i32(work, ctx, node, 1, n);
            for (j, v) in tmp.iter_mut().enumerate() {
                *v = j as i32;
            }
            kernels::sort::partial_sort_desc(tmp, k, x);
            let o = d.row_i32_mut(i1, i2, i3);
            o.copy_from_slice(&tmp[..k]);
            if k > 1 {
                o.swap(0, 1);
            }
        }
    }
}

/// Bytes of the longest row a packed weight has (64 blocks of Q8_0's 34).
const MAX_PACKED_ROW: usize = 64 * 34;

fn get_rows(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, err: &ErrorSlot) {
    let Some(b) = node.src[1] else { return };
    let d = node.dst;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i10, i11, i12) = unravel_row(r, d.l.ne);
        // SAFETY: index element in range of `b` (dst rows mirror b's shape); dst row r owned
        // by this thread; `a` rows are read only after the bounds check.
        unsafe {
            let idx = b.index([i10, i11, i12, 0]);
            if idx < 0 || idx as usize >= a.l.ne[1] {
                err.set(|| {
                    format!(
                        "GET_ROWS {}: row index {idx} outside 0..{}",
                        node.id, a.l.ne[1]
                    )
                });
                d.row_mut(i10, i11, i12).fill(0);
                continue;
            }
            let mut unpacked = [0u8; MAX_PACKED_ROW];
            let row = match node.packed.as_deref() {
                Some(p)
                    if a.l.ne[2] == 1
                        && a.l.ne[3] == 1
                        && p.layout().block * p.blocks() <= MAX_PACKED_ROW =>
                {
                    let n = p.layout().block * p.blocks();
                    p.row_into(idx as usize, &mut unpacked[..n]);
                    &unpacked[..n]
                }
                _ => a.row(idx as usize, i11, i12 % a.l.ne[3]),
            };
            if d.l.dtype == DType::I32 {
                // i32 rows are copied as they are.
                d.row_mut(i10, i11, i12).copy_from_slice(row);
                continue;
            }
            let o = d.row_f32_mut(i10, i11, i12);
            if let Err(e) = quant::dequantize_row(a.l.dtype, row, o) {
                err.set(|| format!("GET_ROWS {}: {e}", node.id));
            }
        }
    }
}

type DotFn = fn(usize, &[u8], &[u8]) -> f32;

fn as_f32(b: &[u8]) -> &[f32] {
    // SAFETY: f32 has no invalid bit patterns; `align_to` only yields the aligned middle part,
    // and callers pass 4-aligned rows (validated tensors, 8-aligned work buffer).
    let (pre, mid, _) = unsafe { b.align_to::<f32>() };
    debug_assert!(pre.is_empty());
    mid
}

fn dot_f32(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_f32_slices(&as_f32(x)[..n], &as_f32(y)[..n])
}

fn dot_f32_slices(x: &[f32], y: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut xc = x.chunks_exact(8);
    let mut yc = y.chunks_exact(8);
    for (a, b) in (&mut xc).zip(&mut yc) {
        for k in 0..8 {
            acc[k] += a[k] * b[k];
        }
    }
    let tail: f32 = xc
        .remainder()
        .iter()
        .zip(yc.remainder())
        .map(|(a, b)| a * b)
        .sum();
    acc.iter().sum::<f32>() + tail
}

/// Dot of two half-precision rows: converted 64 at a time (F16C when the CPU has it, through
/// `half`) and accumulated in f32 lanes.
fn dot_half<T: half::slice::HalfFloatSliceExt + ?Sized>(
    n: usize,
    x: &[u8],
    y: &[u8],
    cast: fn(&[u8]) -> &T,
) -> f32 {
    const CHUNK: usize = 64;
    let (mut xa, mut ya) = ([0f32; CHUNK], [0f32; CHUNK]);
    let mut sum = 0f32;
    let mut i = 0;
    while i < n {
        let len = CHUNK.min(n - i);
        cast(&x[2 * i..2 * (i + len)]).convert_to_f32_slice(&mut xa[..len]);
        cast(&y[2 * i..2 * (i + len)]).convert_to_f32_slice(&mut ya[..len]);
        sum += dot_f32_slices(&xa[..len], &ya[..len]);
        i += len;
    }
    sum
}

fn as_f16(b: &[u8]) -> &[half::f16] {
    // SAFETY: f16 is a plain u16 wrapper with no invalid bit patterns; only the aligned middle
    // is used, and rows are 2-aligned (validated tensors, 8-aligned work buffer).
    let (pre, mid, _) = unsafe { b.align_to::<half::f16>() };
    debug_assert!(pre.is_empty());
    mid
}

fn as_bf16(b: &[u8]) -> &[half::bf16] {
    // SAFETY: as `as_f16`.
    let (pre, mid, _) = unsafe { b.align_to::<half::bf16>() };
    debug_assert!(pre.is_empty());
    mid
}

fn dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_half(n, x, y, as_f16)
}

fn dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_half(n, x, y, as_bf16)
}

/// The row·row dot kernel for weights of `dtype` (against `vec_dot_type(dtype)` rows).
fn dot_kernel(dtype: DType) -> DotFn {
    macro_rules! generic {
        ($($t:ident),*) => {
            match dtype {
                $(DType::$t => |n, x, y| quant::vec_dot(DType::$t, n, x, y).unwrap_or(f32::NAN),)*
                _ => |_, _, _| f32::NAN,
            }
        };
    }
    match dtype {
        DType::F32 => dot_f32,
        DType::F16 => dot_f16,
        DType::BF16 => dot_bf16,
        _ => generic!(
            Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, TQ1_0,
            TQ2_0, NVFP4, Q1_0, Q2_0, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M
        ),
    }
}

fn mul_mat(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, work: Work, err: &ErrorSlot) {
    let Some(b) = node.src[1] else { return };
    let k = a.l.ne[0];
    let weight_2d = a.l.ne[2] == 1 && a.l.ne[3] == 1;
    // llama.cpp's choice of kernel (tinyBLAS, repacked Q4_K, tiled K-quants, vec_dot) and its
    // per-output arithmetic; types without an exact kernel keep the reference dot below.
    let plan = kernels::MatMul::plan(
        ctx.kernels,
        a.l.dtype,
        a.l.ne[1],
        b.l.ne[1],
        k,
        b.l.is_contiguous(),
        weight_2d,
    );
    let Some(plan) = plan else {
        return mul_mat_reference(node, a, ctx, work, err);
    };
    let Some(brow) = plan.act_row_bytes(k) else {
        err.set(|| {
            format!(
                "MUL_MAT {}: rows of {k} do not fit {} blocks",
                node.id,
                plan.act_type()
            )
        });
        return;
    };
    let d = node.dst;
    // The weights packed in groups of 16 rows, where the plan's tiles read them so.
    let packed = node.packed.as_deref().filter(|_| plan.takes_packed());
    let nb_rows = b.l.nrows();
    let scratch_off = (nb_rows * brow).next_multiple_of(64) + ctx.ith * k * 4;
    // Phase 1: activations to the kernel's row format, once per mul_mat.
    for r in split(nb_rows, ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, b.l.ne);
        // SAFETY: row r of the converted area and this thread's scratch are written only by
        // this thread in this phase; `b` is read-only here.
        unsafe {
            let x = src_row(&b, i1, i2, i3, work.f32s(scratch_off, k));
            plan.convert_act(i1, x, work.bytes(r * brow, brow));
        }
    }
    ctx.barrier.wait();
    // Phase 2: dot products in tiles of up to `WR` weight rows (of one plane) × `AR`
    // activation rows, never across the plan's activation boundary (a multiple of `AR`). A
    // group's weight rows stay in L1 while the activation rows stream past, and each group of
    // activation rows is reused for all `WR` weight rows. With many activation rows (and an
    // f32 destination) threads own disjoint groups of activation rows, i.e. whole dst rows;
    // otherwise they own disjoint groups of weight rows (dst dim 0 ranges).
    const WR: usize = 8;
    const AR: usize = 4;
    // Activation rows per `dot_tile` call (whole groups): one call's fixed cost (checks,
    // dispatch, the copy out) is spread over several tiles, which matters when rows are short
    // (attention scores: k = head size).
    const CALL: usize = 4 * AR;
    let (r2, r3) = (b.l.ne[2] / a.l.ne[2], b.l.ne[3] / a.l.ne[3]);
    let (m, n) = (a.l.ne[1], b.l.ne[1]);
    let ne12 = b.l.ne[2];
    let planes = ne12 * b.l.ne[3];
    let boundary = plan.act_boundary().min(n);
    let mut out = [0f32; WR * CALL];
    // Weight rows i0..i0 + rm of plane (i12, i13), as an array.
    let fill_wrows = |rows: &mut [&[u8]], i0: usize, i12: usize, i13: usize| {
        let (p2, p3) = (i12 / r2, i13 / r3);
        for (i, row) in rows.iter_mut().enumerate() {
            // SAFETY: row in range (the caller's `rows` ends at `m`); weights are read-only
            // during the node.
            *row = unsafe { a.row(i0 + i, p2, p3) };
        }
    };
    let wrows = |i0: usize, rm: usize, i12: usize, i13: usize| -> [&[u8]; WR] {
        let mut rows: [&[u8]; WR] = [&[]; WR];
        fill_wrows(&mut rows[..rm], i0, i12, i13);
        rows
    };
    // Converted activation rows j0..j0 + rn of plane (i12, i13).
    let arows = |j0: usize, rn: usize, i12: usize, i13: usize| -> [&[u8]; CALL] {
        let plane = n * (i12 + ne12 * i13);
        let mut rows: [&[u8]; CALL] = [&[]; CALL];
        for (j, row) in rows.iter_mut().enumerate().take(rn) {
            // SAFETY: the converted area is complete (barrier) and only read from now on.
            *row = unsafe { work.bytes_ref((plane + j0 + j) * brow, brow) };
        }
        rows
    };
    // `Graph::mul_mat_masked`: the leading activation rows of a call whose mask hides all of
    // the call's weight rows (a causal mask above the diagonal) are left out and read as 0.
    let mask = node.src[2].filter(|mk| mk.l.dtype == DType::F32 && mk.l.rows_packed());
    let masked_lead = |i0: usize, rm: usize, j0: usize, rn: usize, i12: usize, i13: usize| {
        let Some(mk) = mask else { return 0 };
        let (m2, m3) = (i12 % mk.l.ne[2], i13 % mk.l.ne[3]);
        let mut lead = 0;
        while lead < rn {
            // SAFETY: the graph checked that mask rows cover every dst row and that a row
            // holds the `m` weight-row entries; the mask is read-only here.
            let row = unsafe { mk.row_f32(j0 + lead, m2, m3) };
            if !row[i0..i0 + rm].iter().all(|&v| v == f32::NEG_INFINITY) {
                break;
            }
            lead += 1;
        }
        lead
    };
    let by_act_rows = n >= 2 * AR * ctx.nth && d.l.dtype == DType::F32 && d.l.rows_packed();
    if by_act_rows {
        // Plans whose tiles gain from more activation rows take a batch of calls at once.
        const WIDE: usize = 8 * CALL;
        const WIDE_W: usize = 64;
        let wide = plan.wide_tiles() && mask.is_none();
        let step = if wide {
            plan.weight_rows_per_call().clamp(WR, WIDE_W)
        } else {
            WR
        };
        let mut wide_out = [0f32; WIDE_W * WIDE];
        let jgroups = n.div_ceil(AR);
        let range = split(jgroups * planes, ctx.ith, ctx.nth);
        let mut t = range.start;
        while t < range.end {
            let (p, g0) = (t / jgroups, t % jgroups);
            let g1 = jgroups.min(g0 + (range.end - t));
            let (i12, i13) = (p % ne12, p / ne12);
            // Calls in batches whose trimmed `k` is found once for all weight rows (a
            // zero-tail scan per weight-row group would cost a quarter of the products).
            let mut g = g0;
            while g < g1 {
                // Each call's activation rows, gathered once for all weight-row groups.
                let mut calls = [(0usize, 0usize, 0usize, [&[] as &[u8]; CALL]); 8];
                let mut ncalls = 0;
                while g < g1 && ncalls < calls.len() {
                    let j0 = g * AR;
                    let mut j1 = (j0 + CALL).min(g1 * AR).min(n);
                    if j0 < boundary {
                        j1 = j1.min(boundary);
                    }
                    let rn = j1 - j0;
                    g = j1.div_ceil(AR);
                    let acts = arows(j0, rn, i12, i13);
                    // A `k` that covers every row of the call covers any subset of them.
                    let k = plan.trimmed_k(k, &acts[..rn]);
                    calls[ncalls] = (j0, rn, k, acts);
                    ncalls += 1;
                }
                let mut next = 0;
                while next < m {
                    let i0 = next;
                    // Whole groups of `WR` while there are any (tiles of some kernels need
                    // a multiple of 4 weight rows), then the rest.
                    let mut rm = step.min(m - i0);
                    if rm > WR {
                        rm -= rm % WR;
                    }
                    next += rm;
                    if wide {
                        let mut w = [&[] as &[u8]; WIDE_W];
                        if packed.is_none() {
                            fill_wrows(&mut w[..rm], i0, i12, i13);
                        }
                        // Consecutive calls on one side of the activation boundary as one
                        // tile (no mask here: nothing is left out).
                        let mut c = 0;
                        while c < ncalls {
                            let j0 = calls[c].0;
                            let below = j0 < boundary;
                            let mut acts = [&[] as &[u8]; WIDE];
                            let (mut rn, mut k) = (0, 0);
                            while c < ncalls && (calls[c].0 < boundary) == below {
                                let (_, n, kc, a) = &calls[c];
                                acts[rn..rn + n].copy_from_slice(&a[..*n]);
                                (rn, k) = (rn + n, k.max(*kc));
                                c += 1;
                            }
                            let out = &mut wide_out[..rm * rn];
                            match packed {
                                // `i0` steps by 64 and `m` is whole groups.
                                Some(p) => plan.dot_packed(p, i0, rm, &acts[..rn], out),
                                None => plan.dot_tile(k, &w[..rm], &acts[..rn], j0, out),
                            }
                            for j in 0..rn {
                                // SAFETY: as below.
                                let row = unsafe { d.row_f32_mut(j0 + j, i12, i13) };
                                let src = &out[j * rm..(j + 1) * rm];
                                if rm == WR {
                                    copy_run::<WR>(&mut row[i0..i0 + rm], src);
                                } else {
                                    row[i0..i0 + rm].copy_from_slice(src);
                                }
                            }
                        }
                        continue;
                    }
                    let w = wrows(i0, rm, i12, i13);
                    for (j0, rn, k, acts) in &calls[..ncalls] {
                        let (j0, rn, k) = (*j0, *rn, *k);
                        let lead = masked_lead(i0, rm, j0, rn, i12, i13);
                        let nc = rn - lead;
                        let out = &mut out[..rm * nc];
                        plan.dot_tile(k, &w[..rm], &acts[lead..rn], j0 + lead, out);
                        for j in 0..rn {
                            // SAFETY: dst rows j0..j0 + rn of this plane belong to this
                            // thread's task range only (activation-row groups are split
                            // across threads).
                            let row = unsafe { d.row_f32_mut(j0 + j, i12, i13) };
                            let row = &mut row[i0..i0 + rm];
                            if j < lead {
                                row.fill(0.0);
                            } else {
                                copy_run::<WR>(row, &out[(j - lead) * rm..(j - lead + 1) * rm]);
                            }
                        }
                    }
                }
            }
            t += g1 - g0;
        }
        return;
    }
    // Several weight-row groups per call need one kernel for all rows and no mask; packed
    // weights go in calls of whole groups of 16 rows.
    let one_kernel = mask.is_none() && (boundary == 0 || boundary == n);
    let packed = packed.filter(|_| one_kernel);
    let unit = if packed.is_some() { 2 * WR } else { WR };
    let groups = m.div_ceil(unit);
    // Few activation rows (token generation, a decode step of several slots; no mask, one
    // kernel for all rows): several weight-row groups of one plane per call, so the per-call
    // work (checks, dispatch, the kernels' activation tables, the rows-in-lanes tiles' groups
    // of 16 weight rows) is spread over more rows; every output has the same kernel and bits
    // either way. (With 8 weight rows a call, a step of 8 slots cost 2.9 times one of 4:
    // half of each 16-row group was padding and the tables were rebuilt per call.)
    const GEMV_GROUPS: usize = 8;
    let per_call = if one_kernel {
        GEMV_GROUPS * WR / unit
    } else {
        1
    };
    let mut gemv_out = [0f32; WR * GEMV_GROUPS * CALL];
    let range = split(groups * planes, ctx.ith, ctx.nth);
    let mut t = range.start;
    while t < range.end {
        let g0 = t % groups;
        let mut g1 = groups.min(g0 + per_call).min(g0 + (range.end - t));
        if g1 == groups && g1 - g0 > 1 && !m.is_multiple_of(WR) {
            // The short last group in a call of its own: tiles of some kernels need a
            // multiple of 4 weight rows.
            g1 -= 1;
        }
        let i0 = g0 * unit;
        let i12 = (t / groups) % ne12;
        let i13 = t / (groups * ne12);
        t += g1 - g0;
        if per_call > 1 {
            let rm = (g1 * unit).min(m) - i0;
            let mut w = [&[] as &[u8]; WR * GEMV_GROUPS];
            if packed.is_none() {
                fill_wrows(&mut w[..rm], i0, i12, i13);
            }
            for j0 in (0..n).step_by(CALL) {
                let rn = CALL.min(n - j0);
                let out = &mut gemv_out[..rm * rn];
                let acts = arows(j0, rn, i12, i13);
                match packed {
                    Some(p) => plan.dot_packed(p, i0, rm, &acts[..rn], out),
                    None => {
                        let k = plan.trimmed_k(k, &acts[..rn]);
                        plan.dot_tile(k, &w[..rm], &acts[..rn], j0, out);
                    }
                }
                for (j, col) in out.chunks_exact(rm).enumerate() {
                    // SAFETY: dst elements (i0..i0 + rm, j0 + j, i12, i13) belong to tasks
                    // this thread runs only.
                    unsafe { d.set_run([i0, j0 + j, i12, i13], col) };
                }
            }
            continue;
        }
        let rm = WR.min(m - i0);
        let w = wrows(i0, rm, i12, i13);
        let mut j0 = 0;
        while j0 < n {
            let end = if j0 < boundary {
                boundary.min(j0 + CALL)
            } else {
                n.min(j0 + CALL)
            };
            let rn = end - j0;
            let lead = masked_lead(i0, rm, j0, rn, i12, i13);
            let (jc, nc) = (j0 + lead, rn - lead);
            let acts = arows(jc, nc, i12, i13);
            let k = plan.trimmed_k(k, &acts[..nc]);
            plan.dot_tile(k, &w[..rm], &acts[..nc], jc, &mut out[..rm * nc]);
            let zeros = [0f32; WR];
            for j in 0..rn {
                let col = if j >= lead {
                    &out[(j - lead) * rm..(j - lead + 1) * rm]
                } else {
                    &zeros[..rm]
                };
                // SAFETY: dst elements (i0..i0 + rm, j, i12, i13) belong to task t, which only
                // this thread runs.
                unsafe { d.set_run([i0, j0 + j, i12, i13], col) };
            }
            j0 = end;
        }
    }
}

/// `dst.copy_from_slice(src)`, with full `W`-wide runs (a whole weight-row group) as one
/// fixed-size move: a tile's copy-out runs once per output row, and the general copy is a
/// `memmove` call each time.
#[inline(always)]
fn copy_run<const W: usize>(dst: &mut [f32], src: &[f32]) {
    match (
        <&mut [f32; W]>::try_from(&mut *dst),
        <&[f32; W]>::try_from(src),
    ) {
        (Ok(d), Ok(s)) => *d = *s,
        _ => dst.copy_from_slice(src),
    }
}

/// Where a `mul_mat_id` node keeps its work, and how it computes each expert's products.
struct MulMatIdPlan {
    b: TView,
    ids: TView,
    /// The conversion plan (`plan_id` with no rows: every expert converts alike); `None`:
    /// the reference dots of `lamina_core` (types without an exact kernel).
    plan: Option<kernels::MatMul>,
    /// Activation row type of the reference path.
    vdt: DType,
    /// Bytes of one converted activation row.
    brow: usize,
    /// Per-thread f32 rows (`k` values each) for gathering strided activations.
    f32_off: usize,
    /// u32 arrays: rows per expert, first row of each expert (`n_expert + 1`), the experts
    /// with rows (count first), and the (slot, token) pairs grouped by expert.
    counts_off: usize,
    starts_off: usize,
    active_off: usize,
    rows_off: usize,
    work_bytes: usize,
}

impl MulMatIdPlan {
    fn new(
        table: &'static kernels::KernelTable,
        node: &NodePlan,
        nth: usize,
    ) -> Option<MulMatIdPlan> {
        let [Some(a), Some(b), Some(ids), ..] = node.src else {
            return None;
        };
        let (k, m, n_expert) = (a.l.ne[0], a.l.ne[1], a.l.ne[2]);
        let plan = kernels::MatMul::plan_id(table, a.l.dtype, m, n_expert, 0);
        let vdt = quant::vec_dot_type(a.l.dtype)?;
        let brow = match plan {
            Some(p) => p.act_row_bytes(k)?,
            None => vdt.row_size(k as u64).ok()? as usize,
        };
        let n_entries = ids.l.ne[0] * ids.l.ne[1];
        let f32_off = (b.l.nrows() * brow).next_multiple_of(64);
        let counts_off = f32_off + (nth * k * 4).next_multiple_of(64);
        let starts_off = counts_off + 4 * n_expert;
        let active_off = starts_off + 4 * (n_expert + 1);
        let rows_off = active_off + 4 * (n_expert + 1);
        Some(MulMatIdPlan {
            b,
            ids,
            plan,
            vdt,
            brow,
            f32_off,
            counts_off,
            starts_off,
            active_off,
            rows_off,
            work_bytes: rows_off + 8 * n_entries,
        })
    }
}

/// `ggml_compute_forward_mul_mat_id`: every activation row converted once (as `mul_mat`
/// does), the (slot, token) pairs grouped by expert in ggml's order, then each expert's rows
/// multiplied by its weights with the kernel `MatMul::plan_id` picks for that expert (the
/// `mul_mat` tile kernels, so each output has ggml's bits), and scattered to their columns.
/// Tasks are (expert, group of 8 weight rows) pairs, so no two threads write one output and
/// no barrier separates the experts. An id outside `0..n_expert` is reported as an error and
/// its column is written as zeros.
fn mul_mat_id(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, work: Work, err: &ErrorSlot) {
    let Some(p) = MulMatIdPlan::new(ctx.kernels, node, ctx.nth) else {
        err.set(|| format!("MUL_MAT_ID {}: unsupported operands", node.id));
        return;
    };
    let (b, ids, d) = (p.b, p.ids, node.dst);
    let (k, m, n_expert) = (a.l.ne[0], a.l.ne[1], a.l.ne[2]);
    let (n_used, n_tokens, n_b1) = (ids.l.ne[0], ids.l.ne[1], b.l.ne[1]);
    let brow = p.brow;
    // Phase 1: activations to the kernel's row format.
    for r in split(b.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, b.l.ne);
        // SAFETY: row r of the converted area and this thread's f32 row are written only by
        // this thread in this phase; `b` is read-only here.
        unsafe {
            let x = src_row(&b, i1, i2, i3, work.f32s(p.f32_off + ctx.ith * k * 4, k));
            let out = work.bytes(r * brow, brow);
            match p.plan {
                Some(plan) => plan.convert_act(i1, x, out),
                None => {
                    if let Err(e) = quant::quantize_row(p.vdt, x, out) {
                        err.set(|| format!("MUL_MAT_ID {}: {e}", node.id));
                    }
                }
            }
        }
    }
    if ctx.ith == 0 {
        // SAFETY: the grouping arrays are written by thread 0 only, before the barrier, and
        // only read after it; `ids` is read-only; a column with a bad id is written here and
        // by no task (it is in no expert's list).
        unsafe {
            let counts = work.u32s(p.counts_off, n_expert);
            let starts = work.u32s(p.starts_off, n_expert + 1);
            let active = work.u32s(p.active_off, n_expert + 1);
            let rows = work.u32s(p.rows_off, 2 * n_used * n_tokens);
            counts.fill(0);
            let id_at = |u: usize, t: usize| {
                let id = ids.index([u, t, 0, 0]);
                (0..n_expert as i64).contains(&id).then_some(id as usize)
            };
            for t in 0..n_tokens {
                for u in 0..n_used {
                    match id_at(u, t) {
                        Some(e) => counts[e] += 1,
                        None => {
                            let id = ids.index([u, t, 0, 0]);
                            err.set(|| {
                                format!(
                                    "MUL_MAT_ID {}: expert id {id} outside 0..{n_expert}",
                                    node.id
                                )
                            });
                            d.row_f32_mut(u, t, 0).fill(0.0);
                        }
                    }
                }
            }
            let mut n_active = 0;
            starts[0] = 0;
            for e in 0..n_expert {
                starts[e + 1] = starts[e] + counts[e];
                if counts[e] > 0 {
                    active[1 + n_active] = e as u32;
                    n_active += 1;
                }
                counts[e] = 0;
            }
            active[0] = n_active as u32;
            // Rows in ggml's order: tokens, then slots.
            for t in 0..n_tokens {
                for u in 0..n_used {
                    if let Some(e) = id_at(u, t) {
                        let at = (starts[e] + counts[e]) as usize;
                        rows[2 * at] = u as u32;
                        rows[2 * at + 1] = t as u32;
                        counts[e] += 1;
                    }
                }
            }
        }
    }
    ctx.barrier.wait();
    // Phase 2: products, in tiles of up to WR weight rows × CALL activation rows.
    const WR: usize = 8;
    const CALL: usize = 16;
    // SAFETY: the grouping arrays are complete (barrier) and only read from now on.
    let (counts, starts, active, rows) = unsafe {
        (
            work.u32s_ref(p.counts_off, n_expert),
            work.u32s_ref(p.starts_off, n_expert + 1),
            work.u32s_ref(p.active_off, n_expert + 1),
            work.u32s_ref(p.rows_off, 2 * n_used * n_tokens),
        )
    };
    let n_active = active[0] as usize;
    let groups = m.div_ceil(WR);
    let dot = dot_kernel(a.l.dtype);
    let mut out = [0f32; WR * CALL];
    for t in split(n_active * groups, ctx.ith, ctx.nth) {
        let e = active[1 + t / groups] as usize;
        let i0 = (t % groups) * WR;
        let rm = WR.min(m - i0);
        let mut w: [&[u8]; WR] = [&[]; WR];
        for (i, row) in w.iter_mut().enumerate().take(rm) {
            // SAFETY: row in range; weights are read-only during the node.
            *row = unsafe { a.row(i0 + i, e, 0) };
        }
        let w = &w[..rm];
        let cne1 = counts[e] as usize;
        let plan = p
            .plan
            .and_then(|_| kernels::MatMul::plan_id(ctx.kernels, a.l.dtype, m, n_expert, cne1));
        let erows = &rows[2 * starts[e] as usize..2 * (starts[e] as usize + cne1)];
        for (c, chunk) in erows.chunks(2 * CALL).enumerate() {
            let rn = chunk.len() / 2;
            let mut acts: [&[u8]; CALL] = [&[]; CALL];
            for (j, act) in acts.iter_mut().enumerate().take(rn) {
                let (u, tok) = (chunk[2 * j] as usize, chunk[2 * j + 1] as usize);
                let r = u % n_b1 + n_b1 * tok;
                // SAFETY: the converted area is complete (barrier) and only read.
                *act = unsafe { work.bytes_ref(r * brow, brow) };
            }
            let acts = &acts[..rn];
            let out = &mut out[..rm * rn];
            match plan {
                Some(plan) => plan.dot_tile(k, w, acts, c * CALL, out),
                None => {
                    for (i, wr) in w.iter().enumerate() {
                        for (j, act) in acts.iter().enumerate() {
                            out[j * rm + i] = dot(k, wr, act);
                        }
                    }
                }
            }
            for j in 0..rn {
                let (u, tok) = (chunk[2 * j] as usize, chunk[2 * j + 1] as usize);
                // SAFETY: dst elements (i0..i0 + rm, u, tok) belong to this task only: the
                // (u, tok) pair is in one expert's list once, and the weight rows are this
                // task's group.
                unsafe { d.set_run([i0, u, tok, 0], &out[j * rm..(j + 1) * rm]) };
            }
        }
    }
}

/// Query rows per attention task (a multiple of the tile's 4 activation rows).
const ATTN_ROWS: usize = 16;

/// The two products of [`Graph::attention`](lamina_core::graph::Graph::attention), planned as
/// the unfused `mul_mat`s would be, so every score and output comes from the same kernel.
struct AttentionPlan {
    q: TView,
    k: TView,
    v: TView,
    mask: TView,
    kq: kernels::MatMul,
    kqv: kernels::MatMul,
    /// Bytes of one converted query row / probability row.
    q_row: usize,
    p_row: usize,
}

impl AttentionPlan {
    fn new(table: &'static kernels::KernelTable, node: &NodePlan) -> Option<AttentionPlan> {
        let [Some(q), Some(k), Some(v), Some(mask), _] = node.src else {
            return None;
        };
        let (head_k, n_tokens) = (q.l.ne[0], q.l.ne[1]);
        let (n_kv, head_v) = (k.l.ne[1], v.l.ne[1]);
        // `mul_mat(k, q)`: k's rows are the weights; `mul_mat(v, p)`: p is contiguous.
        let kq = kernels::MatMul::plan(
            table,
            k.l.dtype,
            n_kv,
            n_tokens,
            head_k,
            q.l.is_contiguous(),
            false,
        )?;
        let kqv = kernels::MatMul::plan(table, v.l.dtype, head_v, n_tokens, n_kv, true, false)?;
        Some(AttentionPlan {
            q,
            k,
            v,
            mask,
            q_row: kq.act_row_bytes(head_k)?.next_multiple_of(64),
            p_row: kqv.act_row_bytes(n_kv)?.next_multiple_of(64),
            kq,
            kqv,
        })
    }

    /// One thread's scratch: converted query rows, scores (f32, one spare row), converted
    /// probability rows, and an f32 query row.
    fn scratch_bytes(&self) -> usize {
        let (head_k, n_kv) = (self.q.l.ne[0], self.k.l.ne[1]);
        ATTN_ROWS * self.q_row
            + ((ATTN_ROWS + 1) * n_kv * 4).next_multiple_of(64)
            + ATTN_ROWS * self.p_row
            + (head_k * 4).next_multiple_of(64)
    }
}

/// Fused attention (`Op::Attention`): each task is one head and up to [`ATTN_ROWS`] query
/// rows. Scores go to per-thread scratch, never to a `[n_kv, n_tokens, n_head]` tensor; each
/// score and each output is the `MatMul` dot the unfused graph would compute (tiles give the
/// same bits as single dots), and each softmax row is the same `softmax_row`, so the result
/// equals the unfused one bit for bit. Scores the mask hides in a whole tile's leading rows
/// are skipped, as `mul_mat_masked` does.
fn attention(node: &NodePlan, scale: f32, ctx: &WorkerCtx<'_>, work: Work, err: &ErrorSlot) {
    let Some(p) = AttentionPlan::new(ctx.kernels, node) else {
        err.set(|| format!("ATTENTION {}: unsupported operands", node.id));
        return;
    };
    let (q, k, v, mk, d) = (p.q, p.k, p.v, p.mask, node.dst);
    let (head_k, n_tokens, n_head) = (q.l.ne[0], q.l.ne[1], q.l.ne[2]);
    let (n_kv, head_v, n_head_kv) = (k.l.ne[1], v.l.ne[1], k.l.ne[2]);
    let group = n_head / n_head_kv;
    // Fewer rows per task when there would be too few tasks to keep every thread busy.
    let mut rows = ATTN_ROWS;
    while rows > 4 && n_head * n_tokens.div_ceil(rows) < 2 * ctx.nth {
        rows /= 2;
    }
    let blocks = n_tokens.div_ceil(rows);
    // This thread's scratch.
    let base = ctx.ith * p.scratch_bytes();
    let scores_off = base + ATTN_ROWS * p.q_row;
    let probs_off = scores_off + ((ATTN_ROWS + 1) * n_kv * 4).next_multiple_of(64);
    let qf_off = probs_off + ATTN_ROWS * p.p_row;
    // Per query row, the span of cells its mask leaves open (`[lo, hi)`, `lo == hi`: none),
    // found once for all heads: a group of cells outside it for the leading rows of a task
    // (a causal mask above the diagonal, a sliding window before it) is not computed. (Cells
    // hidden inside a span are computed and then masked, as llama.cpp computes them all.)
    let spans_off = ctx.nth * p.scratch_bytes();
    for j in split(n_tokens, ctx.ith, ctx.nth) {
        // SAFETY: entry j is this thread's (rows are split); the mask is read-only.
        unsafe {
            let e = work.u32s(spans_off + 8 * j, 2);
            let (lo, hi) = kernels::unmasked_span(&mk.row_f32(j, 0, 0)[..n_kv]).unwrap_or((0, 0));
            e[0] = lo as u32;
            e[1] = hi as u32;
        }
    }
    ctx.barrier.wait();
    const WR: usize = 8;
    let mut out = [0f32; WR * ATTN_ROWS];
    for t in split(n_head * blocks, ctx.ith, ctx.nth) {
        let (h, b) = (t / blocks, t % blocks);
        let hkv = h / group;
        let j0 = b * rows;
        let rn = rows.min(n_tokens - j0);
        // SAFETY (whole block): the scratch regions are this thread's; q, k, v, the mask and
        // the sinks (one per head, checked when the graph was built) are read-only during the
        // node; dst rows (h, j0..j0 + rn) belong to task t only.
        unsafe {
            let mut qrows: [&[u8]; ATTN_ROWS] = [&[]; ATTN_ROWS];
            for (j, row) in qrows.iter_mut().enumerate().take(rn) {
                let x = src_row(&q, j0 + j, h, 0, work.f32s(qf_off, head_k));
                let out = work.bytes(base + j * p.q_row, p.q_row);
                p.kq.convert_act(j0 + j, x, out);
                *row = work.bytes_ref(base + j * p.q_row, p.q_row);
            }
            let qrows = &qrows[..rn];
            let kq_k = p.kq.trimmed_k(head_k, qrows);
            let scores = work.f32s(scores_off, (rn + 1) * n_kv);
            let (scores, spare) = scores.split_at_mut(rn * n_kv);
            let mut spans = [None; ATTN_ROWS];
            for (j, span) in spans.iter_mut().enumerate().take(rn) {
                let e = work.u32s_ref(spans_off + 8 * (j0 + j), 2);
                *span = (e[0] < e[1]).then_some((e[0] as usize, e[1] as usize));
            }
            for i0 in (0..n_kv).step_by(WR) {
                let rm = WR.min(n_kv - i0);
                let mut w: [&[u8]; WR] = [&[]; WR];
                for (i, row) in w.iter_mut().enumerate().take(rm) {
                    *row = k.row(i0 + i, hkv, 0);
                }
                let lead = spans[..rn]
                    .iter()
                    .take_while(|s| s.is_none_or(|(a, b)| i0 + rm <= a || b <= i0))
                    .count();
                let nc = rn - lead;
                p.kq.dot_tile(
                    kq_k,
                    &w[..rm],
                    &qrows[lead..],
                    j0 + lead,
                    &mut out[..rm * nc],
                );
                for j in 0..rn {
                    let row = &mut scores[j * n_kv + i0..j * n_kv + i0 + rm];
                    if j < lead {
                        row.fill(0.0);
                    } else {
                        row.copy_from_slice(&out[(j - lead) * rm..(j - lead + 1) * rm]);
                    }
                }
            }
            let slope = alibi_slope(0.0, h, n_head);
            // Attention sinks (`Graph::attention_add_sinks`): one per head, read-only.
            let sink = node.src[4].map(|s| s.get([h, 0, 0, 0]));
            let mut prows: [&[u8]; ATTN_ROWS] = [&[]; ATTN_ROWS];
            for (j, row) in prows.iter_mut().enumerate().take(rn) {
                let x = &scores[j * n_kv..(j + 1) * n_kv];
                let mrow = &mk.row_f32(j0 + j, 0, 0)[..n_kv];
                let y = &mut spare[..n_kv];
                kernels::softmax_row_sink(x, scale, Some(mrow), slope, sink, y);
                let off = probs_off + j * p.p_row;
                p.kqv.convert_act(j0 + j, y, work.bytes(off, p.p_row));
                *row = work.bytes_ref(off, p.p_row);
            }
            let prows = &prows[..rn];
            let kqv_k = p.kqv.trimmed_k(n_kv, prows);
            for i0 in (0..head_v).step_by(WR) {
                let rm = WR.min(head_v - i0);
                let mut w: [&[u8]; WR] = [&[]; WR];
                for (i, row) in w.iter_mut().enumerate().take(rm) {
                    *row = v.row(i0 + i, hkv, 0);
                }
                p.kqv
                    .dot_tile(kqv_k, &w[..rm], prows, j0, &mut out[..rm * rn]);
                for j in 0..rn {
                    let dst = &mut d.row_f32_mut(h, j0 + j, 0)[i0..i0 + rm];
                    dst.copy_from_slice(&out[j * rm..(j + 1) * rm]);
                }
            }
        }
    }
}

/// `Op::Hadamard`: ggml-cpu's `ggml_compute_forward_fwht` on each run of `n` values (the
/// SIMD passes' `u + v*(-1)` is `u - v` exactly, so every pass is plain adds and subtracts).
fn hadamard(node: &NodePlan, a: TView, n: usize, ctx: &WorkerCtx<'_>) {
    let d = node.dst;
    let total = d.l.nelements();
    let scale = 1.0 / (n as f32).sqrt();
    for r in split(total / n, ctx.ith, ctx.nth) {
        // SAFETY: both tensors are contiguous f32 (checked when the graph was built); run r
        // of dst is this thread's; the source is read-only during the node.
        unsafe {
            let src = a.f32_run(r * n, n);
            let out = d.f32_run_mut(r * n, n);
            for (o, &x) in out.iter_mut().zip(src) {
                *o = x * scale;
            }
            let mut len = 1;
            while len < n {
                for i in (0..n).step_by(2 * len) {
                    for j in i..i + len {
                        let (u, v) = (out[j], out[j + len]);
                        out[j] = u + v;
                        out[j + len] = u - v;
                    }
                }
                len <<= 1;
            }
        }
    }
}

/// `mul_mat` for weight types without an exact kernel: `lamina_core`'s reference dots.
fn mul_mat_reference(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, work: Work, err: &ErrorSlot) {
    let Some(b) = node.src[1] else { return };
    let d = node.dst;
    let k = a.l.ne[0];
    let Some(vdt) = quant::vec_dot_type(a.l.dtype) else {
        err.set(|| format!("MUL_MAT {}: no dot type for {}", node.id, a.l.dtype));
        return;
    };
    let Ok(brow) = vdt.row_size(k as u64) else {
        err.set(|| format!("MUL_MAT {}: rows of {k} do not fit {vdt} blocks", node.id));
        return;
    };
    let brow = brow as usize;
    let nb_rows = b.l.nrows();
    let scratch_off = (nb_rows * brow).next_multiple_of(64) + ctx.ith * k * 4;
    // Phase 1: activations to the dot type, once per mul_mat.
    for r in split(nb_rows, ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, b.l.ne);
        // SAFETY: row r of the quantized area and this thread's scratch are written only by
        // this thread in this phase; `b` is read-only here.
        unsafe {
            let x = src_row(&b, i1, i2, i3, work.f32s(scratch_off, k));
            if let Err(e) = quant::quantize_row(vdt, x, work.bytes(r * brow, brow)) {
                err.set(|| format!("MUL_MAT {}: {e}", node.id));
            }
        }
    }
    ctx.barrier.wait();
    // Phase 2: dot products; threads own disjoint rows of `a` (dst dim 0 ranges).
    let dot = dot_kernel(a.l.dtype);
    let (r2, r3) = (b.l.ne[2] / a.l.ne[2], b.l.ne[3] / a.l.ne[3]);
    let m = a.l.ne[1];
    let tasks = m * b.l.ne[2] * b.l.ne[3];
    for t in split(tasks, ctx.ith, ctx.nth) {
        let i01 = t % m;
        let i12 = (t / m) % b.l.ne[2];
        let i13 = t / (m * b.l.ne[2]);
        // SAFETY: the quantized area is complete (barrier) and only read; each dst element
        // (i01, j, i12, i13) belongs to task t, which only this thread runs.
        unsafe {
            let arow = a.row(i01, i12 / r2, i13 / r3);
            for j in 0..b.l.ne[1] {
                let r = j + b.l.ne[1] * (i12 + b.l.ne[2] * i13);
                let v = dot(k, arow, work.bytes_ref(r * brow, brow));
                d.set([i01, j, i12, i13], v);
            }
        }
    }
}

/// YaRN correction dims (ggml's `ggml_rope_yarn_corr_dims`).
pub(crate) fn rope_corr_dims(p: &RopeParams) -> [f32; 2] {
    let corr = |n_rot: f32| {
        p.n_dims as f32 * (p.n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * p.freq_base.ln())
    };
    let start = corr(p.beta_fast).floor();
    let end = corr(p.beta_slow).ceil();
    [start.max(0.0), end.min(p.n_dims as f32 - 1.0)]
}

fn rope(
    node: &NodePlan,
    a: TView,
    p: &RopeParams,
    ctx: &WorkerCtx<'_>,
    work: Work,
    err: &ErrorSlot,
) {
    let Some(pos) = node.src[1] else { return };
    let ff = node.src[2];
    let d = node.dst;
    let n_dims = p.n_dims;
    let prm = kernels::act::RopeCacheParams {
        freq_scale: p.freq_scale,
        ext_factor: p.ext_factor,
        attn_factor: p.attn_factor,
        corr_dims: rope_corr_dims(p),
        theta_scale: p.freq_base.powf(-2.0 / n_dims as f32),
        sin_sign: 1.0,
    };
    let neox = matches!(p.mode, RopeMode::Neox);
    let mut last_i2 = usize::MAX;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        // SAFETY: dst row r owned by this thread; sources read-only; pos has ne2 entries;
        // scratch slot 1 (the cos/sin cache, ne0 values) is this thread's; freq factors are a
        // packed f32 vector of at least n_dims/2 values (checked when the graph was built).
        unsafe {
            let cache = scratch(work, ctx, node, 1, d.l.ne[0]);
            if i2 != last_i2 {
                // ggml_rope_cache_init for this position, as ggml does once per position.
                let position = pos.index([i2, 0, 0, 0]);
                let factors = ff.map(|f| f.row_f32(0, 0, 0));
                kernels::rope_cache(position as f32, &prm, factors, cache);
                last_i2 = i2;
            }
            let x = a.row_f32(i1, i2, i3);
            let y = d.row_f32_mut(i1, i2, i3);
            // Dims n_offs..n_offs + n_dims rotate (with the cache's first n_dims entries, as
            // ggml does), the others are copied.
            let off = p.n_offs;
            kernels::rope_rotate(neox, n_dims, cache, &x[off..], &mut y[off..]);
            y[..off].copy_from_slice(&x[..off]);
            y[off + n_dims..].copy_from_slice(&x[off + n_dims..]);
        }
    }
    if !p.freq_base.is_finite() || p.freq_base <= 0.0 {
        err.set(|| format!("ROPE {}: invalid freq_base {}", node.id, p.freq_base));
    }
}

/// ALiBi slope of head `h` of `n_head` (1 when `max_bias` is 0).
pub(crate) fn alibi_slope(max_bias: f32, h: usize, n_head: usize) -> f32 {
    if max_bias <= 0.0 {
        return 1.0;
    }
    let n_head_log2 = 1usize << (usize::BITS - 1 - n_head.leading_zeros());
    let m0 = 2f32.powf(-max_bias / n_head_log2 as f32);
    let m1 = 2f32.powf(-(max_bias / 2.0) / n_head_log2 as f32);
    // powf, as ggml (not powi: the roundings differ).
    if h < n_head_log2 {
        m0.powf((h + 1) as f32)
    } else {
        m1.powf((2 * (h - n_head_log2) + 1) as f32)
    }
}

fn soft_max(node: &NodePlan, a: TView, scale: f32, max_bias: f32, ctx: &WorkerCtx<'_>, work: Work) {
    let d = node.dst;
    let mask = node.src[1];
    let sinks = node.src[2];
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        let slope = alibi_slope(max_bias, i2, d.l.ne[2]);
        // SAFETY: sinks has one value per dim-2 index (checked when the graph was built) and
        // is read-only during the node.
        let sink = sinks.map(|s| unsafe { s.get([i2, 0, 0, 0]) });
        // SAFETY: dst row r owned by this thread; sources read-only; scratch slots are this
        // thread's; the mask row index is in range (mask.ne1 >= ne1, broadcast by modulo).
        unsafe {
            let x = src_row_before_dst(&a, &d, i1, i2, i3, scratch(work, ctx, node, 0, a.l.ne[0]));
            let y = d.row_f32_mut(i1, i2, i3);
            let mrow = mask.map(|m| {
                let (m2, m3) = (i2 % m.l.ne[2], i3 % m.l.ne[3]);
                if m.l.dtype == DType::F32 && m.l.rows_packed() {
                    return &m.row_f32(i1, m2, m3)[..y.len()];
                }
                let buf = scratch(work, ctx, node, 1, y.len());
                if m.l.dtype == DType::F16 && m.l.rows_packed() {
                    let row = &m.row(i1, m2, m3)[..2 * y.len()];
                    // exact f16 -> f32, as `get` does element by element
                    for (o, h) in buf.iter_mut().zip(row.chunks_exact(2)) {
                        *o = half::f16::from_bits(u16::from_le_bytes([h[0], h[1]])).to_f32();
                    }
                    return &*buf;
                }
                for (i0, o) in buf.iter_mut().enumerate() {
                    *o = m.get([i0, i1, m2, m3]);
                }
                &*buf
            });
            // ggml_compute_forward_soft_max_f32's arithmetic.
            kernels::softmax_row_sink(x, scale, mrow, slope, sink, y);
        }
    }
}

fn set_rows(node: &NodePlan, src: TView, ctx: &WorkerCtx<'_>, work: Work, err: &ErrorSlot) {
    let Some(idx) = node.src[1] else { return };
    let d = node.dst;
    let ne = src.l.ne;
    // f32 rows into an f16 or f32 cache, converted in place: without flash attention the V
    // cache is stored transposed, one row per value (Gemma 3 at pp512: 131k one-value rows a
    // layer), where the general path's per-row dispatch took ~6 % of a prompt.
    let direct = matches!(d.l.dtype, DType::F16 | DType::F32)
        && src.l.dtype == DType::F32
        && src.l.rows_packed();
    // Destination rows are owned by thread `row % nth`, so duplicate indices never race and
    // the last write wins, as in a serial loop (rows in ggml's order: i1 fastest).
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                // SAFETY: index element in range (idx broadcast by modulo over its shape); the
                // dst row is written only by its owning thread; scratch slot 0 is this
                // thread's.
                unsafe {
                    let row = idx.index([i1, i2 % idx.l.ne[1], i3 % idx.l.ne[2], 0]);
                    if row < 0 || row as usize >= d.l.ne[1] {
                        if ctx.ith == 0 {
                            err.set(|| {
                                format!(
                                    "SET_ROWS {}: row index {row} outside 0..{}",
                                    node.id, d.l.ne[1]
                                )
                            });
                        }
                        continue;
                    }
                    if row as usize % ctx.nth != ctx.ith {
                        continue;
                    }
                    let out = d.row_mut(row as usize, i2, i3);
                    if direct {
                        let x = &src.row_f32(i1, i2, i3)[..ne[0]];
                        if d.l.dtype == DType::F16 {
                            // The conversion `quant::quantize_row` makes (round to nearest even).
                            for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                                o.copy_from_slice(
                                    &lamina_core::quant::f32_to_f16(v).to_bits().to_le_bytes(),
                                );
                            }
                        } else {
                            for (o, &v) in out.chunks_exact_mut(4).zip(x) {
                                o.copy_from_slice(&v.to_le_bytes());
                            }
                        }
                        continue;
                    }
                    let x = src_row(&src, i1, i2, i3, scratch(work, ctx, node, 0, ne[0]));
                    // ggml-cpu stores with the type's CPU `from_float`: for Q8_0 the x86
                    // quantizer (round half to even), not the reference one (`roundf`).
                    if d.l.dtype == DType::Q8_0 && x.len().is_multiple_of(32) {
                        kernels::quantize_row_q8_0(x, out);
                    } else if let Err(e) = quant::quantize_row(d.l.dtype, x, out) {
                        err.set(|| format!("SET_ROWS {}: {e}", node.id));
                    }
                }
            }
        }
    }
}

/// `cpy` and `cont`: element copy with conversion; same shapes copy row by row, different
/// shapes (same element count) in flat ggml order.
fn copy(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>) {
    let d = node.dst;
    if a.l.ne == d.l.ne && a.l.dtype == d.l.dtype && !d.l.dtype.is_quantized() {
        for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
            let (i1, i2, i3) = unravel_row(r, d.l.ne);
            // SAFETY: dst row r owned by this thread; the source is read-only here.
            unsafe { d.copy_row_from(i1, i2, i3, &a) };
        }
        return;
    }
    if a.l.ne == d.l.ne {
        for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
            let (i1, i2, i3) = unravel_row(r, d.l.ne);
            for i0 in 0..d.l.ne[0] {
                // SAFETY: dst row r owned by this thread; the source is read-only here.
                unsafe { d.copy_elem([i0, i1, i2, i3], &a, [i0, i1, i2, i3]) };
            }
        }
        return;
    }
    let unravel = |mut n: usize, ne: [usize; 4]| {
        let i0 = n % ne[0];
        n /= ne[0];
        let i1 = n % ne[1];
        n /= ne[1];
        [i0, i1, n % ne[2], n / ne[2]]
    };
    for n in split(d.l.nelements(), ctx.ith, ctx.nth) {
        // SAFETY: element n of dst belongs to this thread's flat range; source read-only.
        unsafe { d.copy_elem(unravel(n, d.l.ne), &a, unravel(n, a.l.ne)) };
    }
}

fn concat(node: &NodePlan, a: TView, dim: usize, ctx: &WorkerCtx<'_>) {
    let Some(b) = node.src[1] else { return };
    let d = node.dst;
    for r in split(d.l.nrows(), ctx.ith, ctx.nth) {
        let (i1, i2, i3) = unravel_row(r, d.l.ne);
        for i0 in 0..d.l.ne[0] {
            let mut i = [i0, i1, i2, i3];
            // SAFETY: dst row r owned by this thread; sources read-only; `i` is mapped into
            // the source that holds it.
            unsafe {
                let v = if i[dim] < a.l.ne[dim] {
                    a.get(i)
                } else {
                    i[dim] -= a.l.ne[dim];
                    b.get(i)
                };
                d.set([i0, i1, i2, i3], v);
            }
        }
    }
}

fn argmax(node: &NodePlan, a: TView, ctx: &WorkerCtx<'_>, work: Work) {
    let d = node.dst;
    for i1 in split(a.l.ne[1], ctx.ith, ctx.nth) {
        // SAFETY: dst element i1 owned by this thread; source read-only; scratch is ours.
        unsafe {
            let x = src_row(&a, i1, 0, 0, scratch(work, ctx, node, 0, a.l.ne[0]));
            let mut best = 0usize;
            for (i, v) in x.iter().enumerate() {
                if *v > x[best] {
                    best = i;
                }
            }
            d.set_i32([i1, 0, 0, 0], best as i32);
        }
    }
}
