//! `Op::FlashAttnExt`: ggml-cpu's `ggml_compute_forward_flash_attn_ext_f16` with the paths it
//! chooses and their rounding (AVX2 build), so that Lamina with flash attention gives
//! llama.cpp's `-fa on` bits:
//!
//! * **rows** (`_one_chunk`): per query row, Q converted to K's dot type, one dot per
//!   unmasked cell, an online softmax with libm `expf`, and V accumulated in f16 (f16 V,
//!   rounded at every cell) or f32 (other V types, dequantized);
//! * **tiled** (`_tiled`, f16/f32 K and V of one type, at least 64 query rows): tiles of 64
//!   query rows × 64 cells, f32 Q and K, scores by `simd_gemm`, softmax per tile with
//!   `ggml_vec_soft_max_f32`, V accumulated in f32 by `simd_gemm`;
//! * **split KV** (one query row, f16/f32 K and V of one type, at least 512 cells): the cells
//!   cut into `kv_chunks` chunks (llama.cpp: its thread count), the rows path on each, then
//!   the partial results merged in chunk order.
//!
//! Which threads compute what does not change any result (only `kv_chunks` does).

use lamina_core::DType;

use crate::exec::{ErrorSlot, NodePlan, TView, Work, split};
use crate::kernels::{self, fattn, fdot};
use crate::ops::alibi_slope;
use crate::pool::WorkerCtx;
use crate::quant;

/// ggml's `GGML_FA_TILE_Q` / `GGML_FA_TILE_KV`.
const TILE_Q: usize = 64;
const TILE_KV: usize = 64;
/// Query rows per task on the rows path.
const ROWS_PER_TASK: usize = 4;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path {
    Rows,
    Tiled,
    SplitKv { chunks: usize },
}

/// How a query row is converted for K's dot (K's `vec_dot_type`).
#[derive(Clone, Copy, Debug)]
enum QConv {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q8_1,
}

/// The dot of one K row with a converted query row.
#[derive(Clone, Copy, Debug)]
enum KDot {
    F32,
    F16,
    Bf16,
    Quant(kernels::dot::DotFn),
}

pub(crate) struct FlashPlan {
    q: TView,
    k: TView,
    v: TView,
    mask: TView,
    sinks: Option<TView>,
    dk: usize,
    dv: usize,
    n_q: usize,
    n_head: usize,
    n_kv: usize,
    group: usize,
    path: Path,
    qconv: QConv,
    kdot: KDot,
    /// Bytes of a converted query row (64-aligned).
    q_row: usize,
    /// Whether the rows path first lists each query row's unmasked cells (few query rows:
    /// a decode step over several sequences, whose cells interleave).
    lists: bool,
}

impl FlashPlan {
    pub(crate) fn new(
        kernels: &kernels::KernelTable,
        node: &NodePlan,
        kv_chunks: u32,
    ) -> Result<FlashPlan, String> {
        let [Some(q), Some(k), Some(v), Some(mask), sinks] = node.src else {
            return Err("missing operands".into());
        };
        let (dk, n_q, n_head) = (q.l.ne[0], q.l.ne[1], q.l.ne[2]);
        let (n_kv, n_head_kv) = (k.l.ne[1], k.l.ne[2]);
        let dv = v.l.ne[0];
        if q.l.dtype != DType::F32 || mask.l.dtype != DType::F32 || n_head_kv == 0 {
            return Err("q and the mask must be f32".into());
        }
        let kt = k.l.dtype;
        let (qconv, kdot) = match kt {
            DType::F32 => (QConv::F32, KDot::F32),
            DType::F16 => (QConv::F16, KDot::F16),
            DType::BF16 => (QConv::Bf16, KDot::Bf16),
            _ => {
                let f = kernels
                    .of(kt)
                    .vec_dot
                    .map(|k| k.dot)
                    .ok_or_else(|| format!("no dot for K {kt}"))?;
                match quant::vec_dot_type(kt) {
                    Some(DType::Q8_0) => (QConv::Q8_0, KDot::Quant(f)),
                    Some(DType::Q8_1) => (QConv::Q8_1, KDot::Quant(f)),
                    _ => return Err(format!("K type {kt} is not supported")),
                }
            }
        };
        let vt = v.l.dtype;
        if !matches!(vt, DType::F32 | DType::F16 | DType::BF16)
            && !lamina_core::quant::supports_dequantize(vt)
        {
            return Err(format!("V type {vt} is not supported"));
        }
        let q_dtype = match qconv {
            QConv::F32 => DType::F32,
            QConv::F16 => DType::F16,
            QConv::Bf16 => DType::BF16,
            QConv::Q8_0 => DType::Q8_0,
            QConv::Q8_1 => DType::Q8_1,
        };
        let q_row = q_dtype
            .row_size(dk as u64)
            .map_err(|_| format!("rows of {dk} do not fit {q_dtype} blocks"))?
            as usize;
        let f_kv = matches!(kt, DType::F32 | DType::F16) && kt == vt;
        let path = if n_q == 1 && f_kv && n_kv >= 512 {
            Path::SplitKv {
                chunks: kv_chunks.max(1) as usize,
            }
        } else if f_kv && n_q >= TILE_Q {
            Path::Tiled
        } else {
            Path::Rows
        };
        Ok(FlashPlan {
            q,
            k,
            v,
            mask,
            sinks,
            dk,
            dv,
            n_q,
            n_head,
            n_kv,
            group: n_head / n_head_kv,
            path,
            qconv,
            kdot,
            q_row: q_row.next_multiple_of(64),
            lists: path != Path::Tiled && n_q <= TILE_Q && n_q * (n_kv + 1) <= 1 << 22,
        })
    }

    /// One thread's scratch for the rows path: the converted query row,
    /// the f32 accumulator, a dequantized V row and the f16 accumulator.
    fn rows_scratch(&self) -> usize {
        self.q_row + (8 * self.dv + 2 * self.dv).next_multiple_of(64)
    }

    /// One thread's scratch for the tiled path: Q tile, scores, mask, accumulators, V tile,
    /// K tile (all f32).
    fn tiled_scratch(&self) -> usize {
        4 * (TILE_Q * self.dk
            + 2 * TILE_Q * TILE_KV
            + TILE_Q * self.dv
            + TILE_KV * self.dv
            + TILE_KV * self.dk
            + 8 * self.dk)
    }

    /// Bytes of the split path's partial results: per head and chunk, `[M, S, VKQ[dv]]`.
    fn partials_bytes(&self) -> usize {
        match self.path {
            Path::SplitKv { chunks } => 4 * self.n_head * chunks * (2 + self.dv),
            _ => 0,
        }
    }

    /// Bytes of the cell lists: per query row, a count and up to `n_kv` cells.
    fn lists_bytes(&self) -> usize {
        if self.lists {
            4 * self.n_q * (self.n_kv + 1)
        } else {
            0
        }
    }

    /// Bytes of the tiled path's row spans: per query row, its unmasked span `[lo, hi)`
    /// (`lo == hi`: none), found once for all heads.
    fn spans_bytes(&self) -> usize {
        if self.path == Path::Tiled {
            8 * self.n_q
        } else {
            0
        }
    }

    pub(crate) fn work_bytes(&self, nth: usize) -> usize {
        nth * self.per_thread() + self.partials_bytes() + self.lists_bytes() + self.spans_bytes()
    }

    /// Finds the unmasked spans of query rows `rows` (each thread its own rows).
    ///
    /// # Safety
    /// The rows' span entries are this thread's; the mask is read-only during the node.
    unsafe fn build_spans(&self, rows: std::ops::Range<usize>, work: Work, off: usize) {
        for i in rows {
            // SAFETY: by the caller's contract; the entry is inside `spans_bytes`.
            unsafe {
                let e = work.u32s(off + 8 * i, 2);
                let span = kernels::unmasked_span(&self.mask.row_f32(i, 0, 0)[..self.n_kv]);
                let (lo, hi) = span.unwrap_or((0, 0));
                e[0] = lo as u32;
                e[1] = hi as u32;
            }
        }
    }

    /// Query row `i`'s unmasked span, from [`FlashPlan::build_spans`].
    ///
    /// # Safety
    /// The spans are complete (after the barrier) and only read.
    unsafe fn span(&self, i: usize, work: Work, off: usize) -> Option<(usize, usize)> {
        // SAFETY: by the caller's contract.
        let e = unsafe { work.u32s_ref(off + 8 * i, 2) };
        (e[0] < e[1]).then_some((e[0] as usize, e[1] as usize))
    }

    /// Lists the unmasked cells of query rows `rows` (each thread its own rows).
    ///
    /// # Safety
    /// The rows' list regions are this thread's; the mask is read-only during the node.
    unsafe fn build_lists(&self, rows: std::ops::Range<usize>, work: Work, off: usize) {
        let stride = self.n_kv + 1;
        for i in rows {
            // SAFETY: by the caller's contract; the list region is inside `lists_bytes`.
            unsafe {
                let list = work.u32s(off + 4 * i * stride, stride);
                let mrow = self.mask.row_f32(i, 0, 0);
                let mut n = 0;
                // Runs of 16 hidden cells are skipped whole (the other sequences' streams
                // are most of a multi-sequence mask row): -inf is one bit pattern.
                const NEG_INF: u32 = 0xFF80_0000;
                let row = &mrow[..self.n_kv];
                let mut chunks = row.chunks_exact(16);
                for (c, chunk) in chunks.by_ref().enumerate() {
                    if chunk.iter().fold(0, |acc, m| acc | (m.to_bits() ^ NEG_INF)) == 0 {
                        continue;
                    }
                    for (j, &m) in chunk.iter().enumerate() {
                        if m != f32::NEG_INFINITY {
                            list[1 + n] = (16 * c + j) as u32;
                            n += 1;
                        }
                    }
                }
                let tail0 = row.len() / 16 * 16;
                for (j, &m) in chunks.remainder().iter().enumerate() {
                    if m != f32::NEG_INFINITY {
                        list[1 + n] = (tail0 + j) as u32;
                        n += 1;
                    }
                }
                list[0] = n as u32;
            }
        }
    }

    /// Query row `i`'s cell list, when lists are on.
    ///
    /// # Safety
    /// The lists are complete (after the barrier) and only read.
    unsafe fn list<'a>(&self, i: usize, work: Work, off: usize) -> Option<&'a [u32]> {
        if !self.lists {
            return None;
        }
        let stride = self.n_kv + 1;
        // SAFETY: by the caller's contract.
        unsafe {
            let list = work.u32s_ref(off + 4 * i * stride, stride);
            Some(&list[1..1 + list[0] as usize])
        }
    }

    /// Whether the rows and split paths take the query heads of each KV head together
    /// ([`FlashPlan::heads_online`]): several heads share each KV head, K and V are f16 with
    /// no soft cap and cell lists are on, and the `(KV head, head part, query row or cell
    /// chunk)` tasks, `rows` per head part, split evenly over `nth` threads. Then `(tasks,
    /// parts per KV head, heads per part)`.
    fn grouped_tasks(
        &self,
        nth: usize,
        softcap: f32,
        rows: usize,
    ) -> Option<(usize, usize, usize)> {
        let f16 = self.k.l.dtype == DType::F16 && self.v.l.dtype == DType::F16;
        let takes = self.lists
            && f16
            && self.group > 1
            && softcap == 0.0
            && fattn::f16_rows_online_supported(self.dk, self.dv);
        if !takes {
            return None;
        }
        let parts = self.group.div_ceil(fattn::MAX_ROWS_HEADS);
        let per = self.group.div_ceil(parts);
        let tasks = self.n_head / self.group * parts * rows;
        (tasks >= nth && (tasks.is_multiple_of(nth) || tasks >= 4 * nth))
            .then_some((tasks, parts, per))
    }

    fn per_thread(&self) -> usize {
        match self.path {
            Path::Tiled => self.tiled_scratch(),
            _ => self.rows_scratch(),
        }
    }
}

pub(crate) fn work_size(node: &NodePlan, nth: usize, kv_chunks: u32) -> usize {
    FlashPlan::new(kernels::table(), node, kv_chunks).map_or(0, |p| p.work_bytes(nth))
}

/// The per-row state of the online softmax.
struct RowState {
    m: f32,
    s: f32,
}

pub(crate) fn compute(
    node: &NodePlan,
    (scale, max_bias, softcap, kv_chunks): (f32, f32, f32, u32),
    ctx: &WorkerCtx<'_>,
    work: Work,
    err: &ErrorSlot,
) {
    let p = match FlashPlan::new(ctx.kernels, node, kv_chunks) {
        Ok(p) => p,
        Err(e) => {
            if ctx.ith == 0 {
                err.set(|| format!("FLASH_ATTN_EXT {}: {e}", node.id));
            }
            return;
        }
    };
    // ggml divides the scale by the cap and multiplies by it after the tanh.
    let scale = if softcap != 0.0 {
        scale / softcap
    } else {
        scale
    };
    let prm = Params {
        scale,
        softcap,
        max_bias,
    };
    let base = ctx.ith * p.per_thread();
    let lists_off = ctx.nth * p.per_thread() + p.partials_bytes();
    if p.lists {
        // SAFETY: rows are split across threads; the barrier publishes every list.
        unsafe { p.build_lists(split(p.n_q, ctx.ith, ctx.nth), work, lists_off) };
        ctx.barrier.wait();
    }
    let spans_off = lists_off + p.lists_bytes();
    if p.path == Path::Tiled {
        // SAFETY: as the lists.
        unsafe { p.build_spans(split(p.n_q, ctx.ith, ctx.nth), work, spans_off) };
        ctx.barrier.wait();
    }
    let rows_grouped = match p.path {
        Path::Rows => p.grouped_tasks(ctx.nth, prm.softcap, p.n_q),
        _ => None,
    };
    match p.path {
        Path::Rows if let Some((tasks, parts, per)) = rows_grouped => {
            for t in split(tasks, ctx.ith, ctx.nth) {
                // A query row's KV heads in turn: their K and V rows share cache lines
                // (one cell's heads are adjacent) and DRAM pages.
                let (i, c) = (t / (tasks / p.n_q), t % (tasks / p.n_q));
                let (hkv, part) = (c / parts, c % parts);
                let h0 = hkv * p.group + part * per;
                let heads = h0..(h0 + per).min((hkv + 1) * p.group);
                // SAFETY: this thread's scratch; dst rows (heads, i) belong to task t only;
                // the lists are complete.
                unsafe {
                    let cells = p.list(i, work, lists_off).unwrap_or_default();
                    let finish = |h, st, acc: &mut [f32]| p.finish_row(node.dst, h, i, st, acc);
                    if !p.heads_online(&prm, heads.clone(), i, cells, true, finish) {
                        for h in heads {
                            let cells = p.list(i, work, lists_off);
                            let (st, acc) = p.row_chunk(&prm, h, i, 0, p.n_kv, cells, work, base);
                            p.finish_row(node.dst, h, i, st, acc);
                        }
                    }
                }
            }
        }
        Path::Rows => {
            let blocks = p.n_q.div_ceil(ROWS_PER_TASK);
            for t in split(p.n_head * blocks, ctx.ith, ctx.nth) {
                let (h, b) = (t / blocks, t % blocks);
                for i in b * ROWS_PER_TASK..((b + 1) * ROWS_PER_TASK).min(p.n_q) {
                    // SAFETY: this thread's scratch; dst row (h, i) belongs to task t only; the
                    // lists are complete.
                    unsafe {
                        let cells = p.list(i, work, lists_off);
                        let (st, acc) = p.row_chunk(&prm, h, i, 0, p.n_kv, cells, work, base);
                        p.finish_row(node.dst, h, i, st, acc);
                    }
                }
            }
        }
        Path::Tiled => {
            let blocks = p.n_q.div_ceil(TILE_Q);
            for t in split(p.n_head * blocks, ctx.ith, ctx.nth) {
                let (h, b) = (t / blocks, t % blocks);
                let i0 = b * TILE_Q;
                let rows = TILE_Q.min(p.n_q - i0);
                // SAFETY: this thread's scratch; dst rows (h, i0..i0 + rows) are task t's;
                // the spans are complete.
                unsafe { p.tile(&prm, node.dst, h, i0, rows, work, base, spans_off) };
            }
        }
        Path::SplitKv { chunks } => {
            let cs = p.n_kv.div_ceil(chunks);
            let pbase = ctx.nth * p.per_thread();
            let pstride = 2 + p.dv;
            // Head `h`'s partial state over chunk `c`, computed alone.
            let one = |h: usize, c: usize| {
                let c0 = c * cs;
                // SAFETY: partial (h, c) is written by this task only; this thread's scratch.
                unsafe {
                    let part = work.f32s(pbase + 4 * (h * chunks + c) * pstride, pstride);
                    if c0 < p.n_kv {
                        let cells = p.list(0, work, lists_off);
                        let c1 = (c0 + cs).min(p.n_kv);
                        let (st, acc) = p.row_chunk(&prm, h, 0, c0, c1, cells, work, base);
                        part[0] = st.m;
                        part[1] = st.s;
                        part[2..].copy_from_slice(acc);
                    } else {
                        part[0] = f32::NEG_INFINITY;
                        part[1] = 0.0;
                    }
                }
            };
            if let Some((tasks, parts, per)) = p.grouped_tasks(ctx.nth, prm.softcap, chunks) {
                // The query heads of one KV head together, as on the rows path.
                for t in split(tasks, ctx.ith, ctx.nth) {
                    let (hg, c) = (t / chunks, t % chunks);
                    let (hkv, part) = (hg / parts, hg % parts);
                    let h0 = hkv * p.group + part * per;
                    let heads = h0..(h0 + per).min((hkv + 1) * p.group);
                    let (c0, c1) = (c * cs, ((c + 1) * cs).min(p.n_kv));
                    // SAFETY: the lists are complete; partials (heads, c) are this task's.
                    let took = c0 < p.n_kv
                        && unsafe {
                            let list = p.list(0, work, lists_off).unwrap_or_default();
                            let lo = list.partition_point(|&x| (x as usize) < c0);
                            let hi = list.partition_point(|&x| (x as usize) < c1);
                            let write = |h: usize, st: RowState, acc: &mut [f32]| {
                                let part =
                                    work.f32s(pbase + 4 * (h * chunks + c) * pstride, pstride);
                                part[0] = st.m;
                                part[1] = st.s;
                                part[2..].copy_from_slice(acc);
                            };
                            p.heads_online(&prm, heads.clone(), 0, &list[lo..hi], c0 == 0, write)
                        };
                    if !took {
                        for h in heads {
                            one(h, c);
                        }
                    }
                }
            } else {
                for t in split(p.n_head * chunks, ctx.ith, ctx.nth) {
                    one(t / chunks, t % chunks);
                }
            }
            ctx.barrier.wait();
            for h in split(p.n_head, ctx.ith, ctx.nth) {
                // SAFETY: the partials are complete (barrier) and only read now; this
                // thread's scratch holds the merged row; dst row (h, 0) is this thread's.
                unsafe {
                    let acc = work.f32s(base + p.q_row, p.dv);
                    acc.fill(0.0);
                    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
                    for c in 0..chunks {
                        if c * cs >= p.n_kv {
                            continue;
                        }
                        let part = work.f32s(pbase + 4 * (h * chunks + c) * pstride, pstride);
                        let (mc, sc) = (part[0], part[1]);
                        if sc == 0.0 {
                            continue;
                        }
                        let m_new = m.max(mc);
                        let s_old = (m - m_new).exp();
                        let s_new = (mc - m_new).exp();
                        for (a, &pv) in acc.iter_mut().zip(&part[2..]) {
                            *a = a.mul_add(s_old, pv * s_new);
                        }
                        s = s.mul_add(s_old, sc * s_new);
                        m = m_new;
                    }
                    if s != 0.0 {
                        fattn::scale_f32(acc, 1.0 / s);
                    }
                    node.dst.row_f32_mut(h, 0, 0).copy_from_slice(acc);
                }
            }
        }
    }
}

struct Params {
    scale: f32,
    softcap: f32,
    max_bias: f32,
}

impl FlashPlan {
    /// `_one_chunk` for query row `i` of head `h` over cells `c0..c1`: the softmax state and
    /// the unnormalized f32 output (in scratch), sinks applied when `c0 == 0`.
    ///
    /// # Safety
    /// `base` is this thread's scratch; the sources are read-only during the node.
    #[allow(clippy::too_many_arguments)]
    unsafe fn row_chunk<'a>(
        &self,
        prm: &Params,
        h: usize,
        i: usize,
        c0: usize,
        c1: usize,
        cells: Option<&[u32]>,
        work: Work,
        base: usize,
    ) -> (RowState, &'a mut [f32]) {
        let (dk, dv) = (self.dk, self.dv);
        let hkv = h / self.group;
        // SAFETY: scratch layout of `rows_scratch`, all inside this thread's region.
        unsafe {
            let qc = work.bytes(base, self.q_row);
            let fbase = base + self.q_row;
            let acc = work.f32s(fbase, dv);
            let vrow = work.f32s(fbase + 4 * dv, dv);
            let acc16: &mut [u16] = {
                let b = work.bytes(fbase + 8 * dv, 2 * dv);
                std::slice::from_raw_parts_mut(b.as_mut_ptr() as *mut u16, dv)
            };
            // SAFETY: q is f32 with packed rows (checked when the graph was built).
            self.convert_q(&self.q.row_f32(i, h, 0)[..dk], qc);
            let slope = alibi_slope(prm.max_bias, h, self.n_head);
            let mrow = self.mask.row_f32(i, 0, 0);
            let v16 = self.v.l.dtype == DType::F16;
            if v16 {
                acc16.fill(0);
            } else {
                acc.fill(0.0);
            }
            let kf16 = self.k.l.dtype == DType::F16;
            if v16 && kf16 && prm.softcap == 0.0 {
                // The common case, with the accumulator in registers (same bits).
                let row = fattn::F16Rows {
                    k: self.k.row_span(hkv, self.n_kv),
                    k_stride: self.k.l.nb[1],
                    v: self.v.row_span(hkv, self.n_kv),
                    v_stride: self.v.l.nb[1],
                    dk,
                    dv,
                    q: &[&qc[..2 * dk]],
                    scale: prm.scale,
                    softcap: prm.softcap,
                };
                let mut state = [(0f32, 0f32)];
                let mut online = |it: &mut dyn Iterator<Item = (usize, f32)>| {
                    fattn::f16_rows_online(&row, it, &[1.0], acc, &mut state).then_some(state[0])
                };
                let done = match cells {
                    Some(list) => {
                        let lo = list.partition_point(|&c| (c as usize) < c0);
                        let hi = list.partition_point(|&c| (c as usize) < c1);
                        let mut it = list[lo..hi].iter().map(|&ic| {
                            let ic = ic as usize;
                            (ic, slope * mask_value(mrow[ic]))
                        });
                        online(&mut it)
                    }
                    None => {
                        let mut it = mrow[c0..c1]
                            .iter()
                            .enumerate()
                            .map(|(j, &mraw)| (c0 + j, slope * mask_value(mraw)))
                            .filter(|&(_, mv)| mv != f32::NEG_INFINITY);
                        online(&mut it)
                    }
                };
                if let Some((m, s)) = done {
                    let mut st = RowState { m, s };
                    if c0 == 0 {
                        self.apply_sink(h, &mut st, acc);
                    }
                    return (st, acc);
                }
            }
            let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
            let mut cell = |ic: usize, mv: f32| {
                let mut sc = self.kq_dot(self.k.row(ic, hkv, 0), qc) * prm.scale;
                if prm.softcap != 0.0 {
                    sc = prm.softcap * sc.tanh();
                }
                sc += mv;
                let (mut ms, mut vs) = (1f32, 1f32);
                let vdata = self.v.row(ic, hkv, 0);
                if sc > m {
                    let m_old = m;
                    m = sc;
                    ms = (m_old - m).exp();
                    if v16 {
                        fattn::scale_f16(acc16, ms);
                    } else {
                        fattn::scale_f32(acc, ms);
                    }
                } else {
                    vs = (sc - m).exp();
                }
                if v16 {
                    fattn::mad_f16(acc16, vdata, vs);
                } else {
                    v_to_f32(self.v.l.dtype, vdata, vrow);
                    fattn::mad_f32(acc, vrow, vs);
                }
                s = s.mul_add(ms, vs);
            };
            match cells {
                // The row's unmasked cells, in order: the same visits without scanning the
                // cells of other sequences.
                Some(list) => {
                    let lo = list.partition_point(|&c| (c as usize) < c0);
                    let hi = list.partition_point(|&c| (c as usize) < c1);
                    for &ic in &list[lo..hi] {
                        let ic = ic as usize;
                        cell(ic, slope * mask_value(mrow[ic]));
                    }
                }
                None => {
                    for (ic, &mraw) in mrow.iter().enumerate().take(c1).skip(c0) {
                        let mv = slope * mask_value(mraw);
                        if mv != f32::NEG_INFINITY {
                            cell(ic, mv);
                        }
                    }
                }
            }
            if v16 {
                for (a, &hv) in acc.iter_mut().zip(acc16.iter()) {
                    *a = kernels::fp16_to_fp32(hv);
                }
            }
            let mut st = RowState { m, s };
            if c0 == 0 {
                self.apply_sink(h, &mut st, acc);
            }
            (st, acc)
        }
    }

    /// Heads `heads` (of one KV head) of query row `i` in one pass over `cells` (some of the
    /// row's cells, in order): each head's softmax state and unnormalized output, handed to
    /// `done(head, state, output)`, are the ones [`FlashPlan::row_chunk`] gives for the same
    /// cells (sinks applied when `sink`), with each K and V row loaded once for all heads.
    /// Returns `false` (`done` not called) when the kernel does not take these shapes.
    ///
    /// # Safety
    /// The sources are read-only during the node; `done` may write what this thread owns.
    unsafe fn heads_online(
        &self,
        prm: &Params,
        heads: std::ops::Range<usize>,
        i: usize,
        cells: &[u32],
        sink: bool,
        mut done: impl FnMut(usize, RowState, &mut [f32]),
    ) -> bool {
        const G: usize = fattn::MAX_ROWS_HEADS;
        let (dk, dv, g) = (self.dk, self.dv, heads.len());
        if g > G || dk > 256 || dv > 256 || prm.softcap != 0.0 {
            return false;
        }
        let mut qbuf = [[0u8; 512]; G];
        let mut slopes = [0f32; G];
        let mut out = [0f32; G * 256];
        let mut states = [(0f32, 0f32); G];
        // SAFETY (all blocks): rows in range of the checked graph; see the contract.
        for (k, h) in heads.clone().enumerate() {
            self.convert_q(
                unsafe { &self.q.row_f32(i, h, 0)[..dk] },
                &mut qbuf[k][..2 * dk],
            );
            slopes[k] = alibi_slope(prm.max_bias, h, self.n_head);
        }
        let qs: [&[u8]; G] = std::array::from_fn(|k| &qbuf[k][..2 * dk]);
        let hkv = heads.start / self.group;
        let mrow = unsafe { self.mask.row_f32(i, 0, 0) };
        let row = fattn::F16Rows {
            k: unsafe { self.k.row_span(hkv, self.n_kv) },
            k_stride: self.k.l.nb[1],
            v: unsafe { self.v.row_span(hkv, self.n_kv) },
            v_stride: self.v.l.nb[1],
            dk,
            dv,
            q: &qs[..g],
            scale: prm.scale,
            softcap: prm.softcap,
        };
        let mut it = cells
            .iter()
            .map(|&ic| (ic as usize, mask_value(mrow[ic as usize])));
        if !fattn::f16_rows_online(
            &row,
            &mut it,
            &slopes[..g],
            &mut out[..g * dv],
            &mut states[..g],
        ) {
            return false;
        }
        for (k, h) in heads.enumerate() {
            let acc = &mut out[k * dv..][..dv];
            let mut st = RowState {
                m: states[k].0,
                s: states[k].1,
            };
            if sink {
                // SAFETY: the sinks are read-only during the node.
                unsafe { self.apply_sink(h, &mut st, acc) };
            }
            done(h, st, acc);
        }
        true
    }

    /// Attention sinks: the head's sink logit joins the softmax (no value).
    ///
    /// # Safety
    /// The sinks are read-only during the node.
    unsafe fn apply_sink(&self, h: usize, st: &mut RowState, acc: &mut [f32]) {
        let Some(sk) = self.sinks else { return };
        // SAFETY: one f32 per head (checked when the graph was built).
        let sv = unsafe { sk.get([h, 0, 0, 0]) };
        let (mut ms, mut vs) = (1f32, 1f32);
        if sv > st.m {
            ms = (st.m - sv).exp();
            st.m = sv;
            fattn::scale_f32(acc, ms);
        } else {
            vs = (sv - st.m).exp();
        }
        // Not fused here (GCC specialises the two branches into a multiply and an add).
        st.s = st.s * ms + vs;
    }

    /// Normalizes a finished row and stores it as dst row `(h, i)`.
    ///
    /// # Safety
    /// This thread is the only user of dst row `(h, i)`.
    unsafe fn finish_row(&self, d: TView, h: usize, i: usize, st: RowState, acc: &mut [f32]) {
        let inv = if st.s == 0.0 { 0.0 } else { 1.0 / st.s };
        fattn::scale_f32(acc, inv);
        // SAFETY: by the caller's contract.
        unsafe { d.row_f32_mut(h, i, 0).copy_from_slice(acc) };
    }

    fn convert_q(&self, x: &[f32], out: &mut [u8]) {
        match self.qconv {
            QConv::F32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(x) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            QConv::F16 => fattn::f32_row_to_f16(x, out),
            QConv::Bf16 => {
                for (o, v) in out.chunks_exact_mut(2).zip(x) {
                    let b = lamina_core::quant::f32_to_bf16(*v).to_bits();
                    o.copy_from_slice(&b.to_le_bytes());
                }
            }
            QConv::Q8_0 => kernels::quantize_row_q8_0(x, &mut out[..]),
            QConv::Q8_1 => kernels::quantize_row_q8_1(x, &mut out[..]),
        }
    }

    #[inline]
    fn kq_dot(&self, krow: &[u8], qc: &[u8]) -> f32 {
        let dk = self.dk;
        match self.kdot {
            KDot::F32 => fdot::vec_dot_f32(dk, as_f32(krow), as_f32(qc)),
            KDot::F16 => fdot::vec_dot_f16(dk, krow, qc),
            KDot::Bf16 => fattn::vec_dot_bf16(dk, krow, qc),
            KDot::Quant(f) => f(dk, krow, qc),
        }
    }

    /// `_tiled` for query rows `i0..i0 + rows` of head `h`.
    ///
    /// # Safety
    /// `base` is this thread's scratch; dst rows `(h, i0..i0 + rows)` are this thread's.
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile(
        &self,
        prm: &Params,
        d: TView,
        h: usize,
        i0: usize,
        rows: usize,
        work: Work,
        base: usize,
        spans_off: usize,
    ) {
        let (dk, dv) = (self.dk, self.dv);
        let hkv = h / self.group;
        // SAFETY: scratch layout of `tiled_scratch`; sources read-only.
        unsafe {
            let mut off = base;
            let mut take = |n: usize| {
                let s = work.f32s(off, n);
                off += 4 * n;
                s
            };
            let qt = take(TILE_Q * dk);
            let kq = take(TILE_Q * TILE_KV);
            let mask = take(TILE_Q * TILE_KV);
            let acc = take(TILE_Q * dv);
            let vt = take(TILE_KV * dv);
            let kt = take(TILE_KV * dk);
            let krows = take(8 * dk);
            let slope = alibi_slope(prm.max_bias, h, self.n_head);
            let mut m = [f32::NEG_INFINITY; TILE_Q];
            let mut s = [0f32; TILE_Q];
            acc[..rows * dv].fill(0.0);
            for tq in 0..rows {
                copy_q_row(&self.q, i0 + tq, h, &mut qt[tq * dk..(tq + 1) * dk]);
            }
            kt.fill(0.0);
            vt.fill(0.0);
            let kf16 = self.k.l.dtype == DType::F16;
            // Each row's unmasked span: a tile outside all of them is all -inf, which the
            // per-row conversion below would find and skip (several sequences' streams in
            // one batch leave long hidden runs between them).
            let mut spans = [None; TILE_Q];
            for (tq, span) in spans.iter_mut().enumerate().take(rows) {
                *span = self.span(i0 + tq, work, spans_off);
            }
            for ic in (0..self.n_kv).step_by(TILE_KV) {
                let kv_tile = TILE_KV.min(self.n_kv - ic);
                let open = spans[..rows]
                    .iter()
                    .flatten()
                    .any(|&(lo, hi)| lo < ic + kv_tile && hi > ic);
                if !open {
                    continue;
                }
                let mut can_skip = true;
                for tq in 0..rows {
                    let mrow = self.mask.row_f32(i0 + tq, 0, 0);
                    let mt = &mut mask[tq * TILE_KV..(tq + 1) * TILE_KV];
                    can_skip &=
                        fattn::mask_row_f16(&mrow[ic..ic + kv_tile], slope, &mut mt[..kv_tile]);
                    mt[kv_tile..].fill(f32::NEG_INFINITY);
                }
                if can_skip {
                    continue;
                }
                // K tile transposed: kt[dk][tk], 8 keys at a time.
                for tk in (0..kv_tile).step_by(8) {
                    let g = (kv_tile - tk).min(8);
                    for r in 0..g {
                        let kr = self.k.row(ic + tk + r, hkv, 0);
                        let dst = &mut krows[r * dk..(r + 1) * dk];
                        if kf16 {
                            fattn::f16_row_to_f32(kr, dst);
                        } else {
                            dst.copy_from_slice(&as_f32(kr)[..dk]);
                        }
                    }
                    fattn::transpose_into(&krows[..g * dk], g, dk, kt, TILE_KV, tk);
                }
                let kq = &mut kq[..rows * TILE_KV];
                kq.fill(0.0);
                fattn::gemm_acc(kq, qt, kt, rows, dk, TILE_KV);
                fattn::scale_f32(kq, prm.scale);
                if prm.softcap != 0.0 {
                    for v in kq.iter_mut() {
                        *v = v.tanh();
                    }
                    fattn::scale_f32(kq, prm.softcap);
                }
                if kv_tile < TILE_KV {
                    for tq in 0..rows {
                        kq[tq * TILE_KV + kv_tile..(tq + 1) * TILE_KV].fill(f32::NEG_INFINITY);
                    }
                }
                for (v, &mv) in kq.iter_mut().zip(mask.iter()) {
                    *v += mv;
                }
                let mut skip = [false; TILE_Q];
                for tq in 0..rows {
                    let row = &mut kq[tq * TILE_KV..(tq + 1) * TILE_KV];
                    let tmax = fattn::row_max(row);
                    if tmax == f32::NEG_INFINITY {
                        skip[tq] = true;
                        continue;
                    }
                    let m_old = m[tq];
                    let m_new = m_old.max(tmax);
                    if m_new > m_old {
                        let ms = (m_old - m_new).exp();
                        fattn::scale_f32(&mut acc[tq * dv..(tq + 1) * dv], ms);
                        s[tq] *= ms;
                    }
                    m[tq] = m_new;
                    s[tq] = (f64::from(s[tq]) + kernels::act::vec_soft_max_f32(row, m_new)) as f32;
                }
                for tk in 0..kv_tile {
                    let vr = self.v.row(ic + tk, hkv, 0);
                    let o = &mut vt[tk * dv..(tk + 1) * dv];
                    if kf16 {
                        fattn::f16_row_to_f32(vr, o);
                    } else {
                        o.copy_from_slice(&as_f32(vr)[..dv]);
                    }
                }
                for tq in 0..rows {
                    if skip[tq] {
                        kq[tq * TILE_KV..(tq + 1) * TILE_KV].fill(0.0);
                    }
                }
                fattn::gemm_acc(&mut acc[..rows * dv], kq, vt, rows, TILE_KV, dv);
            }
            for tq in 0..rows {
                let a = &mut acc[tq * dv..(tq + 1) * dv];
                let mut st = RowState { m: m[tq], s: s[tq] };
                self.apply_sink(h, &mut st, a);
                self.finish_row(d, h, i0 + tq, st, a);
            }
        }
    }
}

/// The mask as ggml's flash attention reads it: stored as f16 (0 and -inf, the usual values,
/// are exact).
#[inline(always)]
fn mask_value(m: f32) -> f32 {
    if m == 0.0 || m == f32::NEG_INFINITY {
        m
    } else {
        kernels::fp16_to_fp32(kernels::fp32_to_fp16(m))
    }
}

/// A V row as f32 (`to_float` of its type).
fn v_to_f32(dtype: DType, row: &[u8], out: &mut [f32]) {
    match dtype {
        DType::F32 => out.copy_from_slice(&as_f32(row)[..out.len()]),
        DType::BF16 => {
            for (i, o) in out.iter_mut().enumerate() {
                *o = kernels::bf16s(row, i);
            }
        }
        _ => {
            // The type was checked by the plan; a short row cannot occur (packed rows).
            let _ = quant::dequantize_row(dtype, row, out);
        }
    }
}

fn as_f32(b: &[u8]) -> &[f32] {
    // SAFETY: f32 rows and converted rows are 4-byte aligned (tensor data and scratch are);
    // any bit pattern is a valid f32.
    let (pre, mid, _) = unsafe { b.align_to::<f32>() };
    debug_assert!(pre.is_empty());
    mid
}

/// Copies query row `(i, h)` (f32) into `buf` (a tile's row).
///
/// # Safety
/// The row is in range and not written during the node.
unsafe fn copy_q_row<'a>(q: &TView, i: usize, h: usize, buf: &'a mut [f32]) -> &'a [f32] {
    // SAFETY: q is f32 with packed rows (checked when the graph was built).
    let r = unsafe { q.row_f32(i, h, 0) };
    buf[..r.len()].copy_from_slice(r);
    &buf[..r.len()]
}
