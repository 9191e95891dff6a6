//! AVX2 versions of the flash-attention steps of `kernels/fattn.rs` (f16/f32 multiply-adds,
//! scales, the online f16 row, the bf16 dot).

use std::arch::x86_64::*;

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mad_f16(y: &mut [u16], x: &[u8], v: f32) {
    let n = y.len();
    let nv = n / 8 * 8;
    // SAFETY: loads and stores of 8 values stay below `nv <= n`; `x` holds `n` values.
    unsafe {
        let vv = _mm256_set1_ps(v);
        for i in (0..nv).step_by(8) {
            let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(2 * i) as *const __m128i));
            let yp = y.as_mut_ptr().add(i) as *mut __m128i;
            let yv = _mm256_cvtph_ps(_mm_loadu_si128(yp));
            let r = _mm256_fmadd_ps(xv, vv, yv);
            _mm_storeu_si128(yp, _mm256_cvtps_ph::<0>(r));
        }
    }
    crate::kernels::fattn::mad_f16_scalar(&mut y[nv..], &x[2 * nv..], v);
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn scale_f16(y: &mut [u16], v: f32) {
    let n = y.len();
    let nv = n / 8 * 8;
    // SAFETY: loads and stores of 8 values stay below `nv <= n`.
    unsafe {
        let vv = _mm256_set1_ps(v);
        for i in (0..nv).step_by(8) {
            let yp = y.as_mut_ptr().add(i) as *mut __m128i;
            let r = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(yp)), vv);
            _mm_storeu_si128(yp, _mm256_cvtps_ph::<0>(r));
        }
    }
    crate::kernels::fattn::scale_f16_scalar(&mut y[nv..], v);
}

#[target_feature(enable = "avx2,fma")]
pub unsafe fn mad_f32(y: &mut [f32], x: &[f32], v: f32) {
    for (o, &xv) in y.iter_mut().zip(x) {
        *o = xv.mul_add(v, *o);
    }
}

/// Cells whose scores [`f16_rows_online`] computes ahead of their softmax steps.
const SCORE_BATCH: usize = 8;

/// Batches whose K and V rows are prefetched ahead of the one computing.
const AHEAD: usize = 1;

/// [`crate::kernels::fattn::f16_rows_online`] for `G` query heads (all of `r.q`) with the
/// accumulators held as `NV` vectors of f32 values that are always exactly f16 (each step
/// rounds through `vcvtps2ph`, as ggml's store does), so no accumulator round trip goes
/// through memory. Each head's arithmetic is its own row's, in the same order: the heads
/// share only the loads and widening of the K and V rows (the heads of one KV head read the
/// same cells). The scores of up to [`SCORE_BATCH`] cells are computed before their softmax
/// steps (each as `ggml_vec_dot_f16` forms it, the query widened once): independent dots
/// overlap, where one dot per step left each step waiting on its dot's reduction.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_rows_online<const NV: usize, const G: usize>(
    r: &crate::kernels::fattn::F16Rows<'_>,
    cells: &mut dyn Iterator<Item = (usize, f32)>,
    slopes: &[f32],
    out: &mut [f32],
    states: &mut [(f32, f32)],
) {
    #[inline(always)]
    unsafe fn round16(x: __m256) -> __m256 {
        // SAFETY: register-only; F16C enabled by the caller.
        unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph::<0>(x)) }
    }
    const QMAX: usize = 256;
    let dk = r.dk;
    debug_assert!(dk <= QMAX && r.q.len() == G && slopes.len() == G);
    // The queries widened to f32 (the values `vec_dot_f16` converts at each call).
    let mut qf = [[0f32; QMAX]; G];
    for (qg, q) in qf.iter_mut().zip(r.q) {
        for (i, v) in qg.iter_mut().enumerate().take(dk) {
            *v = crate::kernels::fdot::f16s(q, i);
        }
    }
    let qs: [&[f32]; G] = std::array::from_fn(|g| &qf[g][..dk]);
    let mut acc = [[_mm256_setzero_ps(); NV]; G];
    let mut m = [f32::NEG_INFINITY; G];
    let mut s = [0f32; G];
    let mut ring = [[(0usize, 0f32); SCORE_BATCH]; AHEAD + 1];
    let mut counts = [0usize; AHEAD + 1];
    let mut scores = [[0f32; SCORE_BATCH]; G];
    let fill = |b: &mut [(usize, f32); SCORE_BATCH],
                cells: &mut dyn Iterator<Item = (usize, f32)>| {
        let mut n = 0;
        while n < SCORE_BATCH {
            let Some(c) = cells.next() else { break };
            b[n] = c;
            n += 1;
        }
        n
    };
    // The next batch's K and V rows are asked for while this batch computes: between decode
    // steps the weights stream through the caches and evict the KV cells.
    let prefetch = |b: &[(usize, f32)]| {
        for &(ic, _) in b {
            let (k0, v0) = (ic * r.k_stride, ic * r.v_stride);
            for off in (0..2 * dk).step_by(64) {
                // SAFETY: a prefetch of an address inside `r.k` (no access is made).
                unsafe { _mm_prefetch::<_MM_HINT_T0>(r.k.as_ptr().add(k0 + off) as *const i8) };
            }
            for off in (0..2 * 8 * NV).step_by(64) {
                // SAFETY: as above, inside `r.v`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(r.v.as_ptr().add(v0 + off) as *const i8) };
            }
        }
    };
    // The batches `AHEAD` ahead are filled (and their rows asked for) before this one runs.
    let mut more = true;
    for k in 0..AHEAD + 1 {
        if more {
            counts[k] = fill(&mut ring[k], cells);
            more = counts[k] == SCORE_BATCH;
            prefetch(&ring[k][..counts[k]]);
        }
    }
    let mut cur = 0;
    while counts[cur] > 0 {
        let (n, batch) = (counts[cur], ring[cur]);
        counts[cur] = 0;
        if more {
            counts[cur] = fill(&mut ring[cur], cells);
            more = counts[cur] == SCORE_BATCH;
            prefetch(&ring[cur][..counts[cur]]);
        }
        cur = (cur + 1) % (AHEAD + 1);
        for (c, &(ic, _)) in batch.iter().enumerate().take(n) {
            let krow = &r.k[ic * r.k_stride..][..2 * dk];
            // SAFETY: `krow` holds `dk` f16 values and each query `dk` f32 values.
            let dots = unsafe { super::fdot::vec_dots_f16(dk, krow, qs) };
            for (sg, d) in scores.iter_mut().zip(dots) {
                sg[c] = d;
            }
        }
        for (c, &(ic, mval)) in batch.iter().enumerate().take(n) {
            let vrow = &r.v[ic * r.v_stride..][..2 * NV * 8];
            let mut vx = [_mm256_setzero_ps(); NV];
            for (j, x) in vx.iter_mut().enumerate() {
                // SAFETY: 8 f16 values at `8 * j < 8 * NV = dv` within `vrow`.
                *x = unsafe {
                    _mm256_cvtph_ps(_mm_loadu_si128(vrow.as_ptr().add(16 * j) as *const __m128i))
                };
            }
            for g in 0..G {
                let mut sc = scores[g][c] * r.scale;
                if r.softcap != 0.0 {
                    sc = r.softcap * sc.tanh();
                }
                sc += slopes[g] * mval;
                let (mut ms, mut vs) = (1f32, 1f32);
                // SAFETY (both blocks): register arithmetic.
                if sc > m[g] {
                    let m_old = m[g];
                    m[g] = sc;
                    ms = (m_old - sc).exp();
                    let vms = _mm256_set1_ps(ms);
                    for a in acc[g].iter_mut() {
                        *a = unsafe { round16(_mm256_mul_ps(*a, vms)) };
                    }
                } else {
                    vs = (sc - m[g]).exp();
                }
                let vvs = _mm256_set1_ps(vs);
                for (a, &x) in acc[g].iter_mut().zip(&vx) {
                    *a = unsafe { round16(_mm256_fmadd_ps(x, vvs, *a)) };
                }
                s[g] = s[g].mul_add(ms, vs);
            }
        }
    }
    for g in 0..G {
        for (j, a) in acc[g].iter().enumerate() {
            // SAFETY: `out` holds `G * dv` values, `dv = 8 * NV`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(g * 8 * NV + 8 * j), *a) };
        }
        states[g] = (m[g], s[g]);
    }
}

/// `ggml_vec_dot_bf16`'s AVX2 branch: four 8-lane FMA accumulators over steps of 32,
/// `(c1 + c3) + (c2 + c4)`, `hsum_float_8`, the leftovers in `double`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let np = n / 32 * 32;
    let mut sumf = 0f64;
    // SAFETY: loads of 8 values at offsets below `np <= n`; the slices hold `n` values.
    unsafe {
        if np > 0 {
            let mut c = [_mm256_setzero_ps(); 4];
            for i in (0..np).step_by(32) {
                for (j, cj) in c.iter_mut().enumerate() {
                    let e = i + 8 * j;
                    let vx = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                        _mm_loadu_si128(x.as_ptr().add(2 * e) as *const __m128i),
                    )));
                    let vy = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                        _mm_loadu_si128(y.as_ptr().add(2 * e) as *const __m128i),
                    )));
                    *cj = _mm256_fmadd_ps(vx, vy, *cj);
                }
            }
            let t = _mm256_add_ps(_mm256_add_ps(c[0], c[2]), _mm256_add_ps(c[1], c[3]));
            sumf += f64::from(crate::kernels::x86::hsum_float_8(t));
        }
    }
    for i in np..n {
        sumf += f64::from(crate::kernels::bf16s(x, i) * crate::kernels::bf16s(y, i));
    }
    sumf as f32
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_row_to_f32(x: &[u8], out: &mut [f32]) {
    let n = out.len();
    let nv = n / 8 * 8;
    // SAFETY: 8-value loads and stores below `nv <= n`; `x` holds `n` values.
    unsafe {
        for i in (0..nv).step_by(8) {
            let v = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(2 * i) as *const __m128i));
            _mm256_storeu_ps(out.as_mut_ptr().add(i), v);
        }
    }
    for i in nv..n {
        out[i] = crate::kernels::fp16_to_fp32(u16::from_le_bytes([x[2 * i], x[2 * i + 1]]));
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f32_row_to_f16(x: &[f32], out: &mut [u8]) {
    let n = x.len();
    let nv = n / 8 * 8;
    // SAFETY: 8-value loads and stores below `nv <= n`; `out` holds `n` values.
    unsafe {
        for i in (0..nv).step_by(8) {
            let h = _mm256_cvtps_ph::<0>(_mm256_loadu_ps(x.as_ptr().add(i)));
            _mm_storeu_si128(out.as_mut_ptr().add(2 * i) as *mut __m128i, h);
        }
    }
    for i in nv..n {
        out[2 * i..2 * i + 2].copy_from_slice(&crate::kernels::fp32_to_fp16(x[i]).to_le_bytes());
    }
}

/// `c += a·b` (`c` m×n, `a` m×k, `b` k×n, row-major) as ggml's `simd_gemm` tiles it on
/// AVX2: 6 rows × 16 columns held in 12 registers over the whole `k` loop (two loads of `b`
/// and six broadcasts per 12 FMAs; 12 independent chains cover the FMA latency), then
/// 8-column tiles and one tile of the leftover rows. Each output is one FMA chain in `k`
/// order whatever the tile, so any tiling gives the same bits; leftover columns (under 8)
/// by `mul_add`.
#[target_feature(enable = "avx2,fma")]
pub unsafe fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    assert!(c.len() >= m * n && a.len() >= m * k && b.len() >= k * n);
    let n8 = n / 8 * 8;
    let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
    let mut i = 0;
    // SAFETY (all rows): rows `i..i + RM <= m`, columns below `n8 <= n`, `kk < k`: inside
    // `c`, `a` and `b` (asserted above).
    unsafe {
        while i + 6 <= m {
            gemm_rows::<6>(cp.add(i * n), ap.add(i * k), bp, k, n, n8);
            i += 6;
        }
        // The leftover rows in one tile: single-row tiles would hold 2 chains, and the FMA
        // latency would leave them at a quarter of the rate (4 of a 64-row tile's rows took a
        // fifth of its time).
        let (c, a) = (cp.add(i * n), ap.add(i * k));
        match m - i {
            0 => {}
            1 => gemm_rows::<1>(c, a, bp, k, n, n8),
            2 => gemm_rows::<2>(c, a, bp, k, n, n8),
            3 => gemm_rows::<3>(c, a, bp, k, n, n8),
            4 => gemm_rows::<4>(c, a, bp, k, n, n8),
            _ => gemm_rows::<5>(c, a, bp, k, n, n8),
        }
    }
    if n8 < n {
        for i in 0..m {
            for kk in 0..k {
                let av = a[i * k + kk];
                for j in n8..n {
                    c[i * n + j] = av.mul_add(b[kk * n + j], c[i * n + j]);
                }
            }
        }
    }
}

/// `RM` rows of [`gemm_acc`] at `c`/`a`, columns `0..n8` in 16- then 8-column tiles.
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemm_rows<const RM: usize>(
    c: *mut f32,
    a: *const f32,
    b: *const f32,
    k: usize,
    n: usize,
    n8: usize,
) {
    let mut j = 0;
    // SAFETY: the caller's bounds.
    unsafe {
        while j + 16 <= n8 {
            gemm_tile::<RM, 2>(c.add(j), a, b.add(j), k, n);
            j += 16;
        }
        if j < n8 {
            gemm_tile::<RM, 1>(c.add(j), a, b.add(j), k, n);
        }
    }
}

/// One `RM` × `8·RN` tile of [`gemm_acc`] at `c` (row stride `n`), `a` (stride `k`), `b`
/// (stride `n`).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn gemm_tile<const RM: usize, const RN: usize>(
    c: *mut f32,
    a: *const f32,
    b: *const f32,
    k: usize,
    n: usize,
) {
    // SAFETY: the caller's bounds.
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); RN]; RM];
        for (i, row) in acc.iter_mut().enumerate() {
            for (r, v) in row.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(c.add(i * n + 8 * r));
            }
        }
        for kk in 0..k {
            let mut bv = [_mm256_setzero_ps(); RN];
            for (r, v) in bv.iter_mut().enumerate() {
                *v = _mm256_loadu_ps(b.add(kk * n + 8 * r));
            }
            for (i, row) in acc.iter_mut().enumerate() {
                let p = _mm256_set1_ps(*a.add(i * k + kk));
                for (r, v) in row.iter_mut().enumerate() {
                    *v = _mm256_fmadd_ps(p, bv[r], *v);
                }
            }
        }
        for (i, row) in acc.iter().enumerate() {
            for (r, v) in row.iter().enumerate() {
                _mm256_storeu_ps(c.add(i * n + 8 * r), *v);
            }
        }
    }
}

/// [`crate::kernels::fattn::transpose_into`] for 8 rows, values `0..n / 8 * 8`: each 8 × 8
/// block in registers (the tiles' 32-bit lane transpose).
///
/// # Safety
/// AVX present; `src` holds 8 rows of `n` values; `dst` holds `(n - 1) * stride + col0 + 8`
/// values.
#[target_feature(enable = "avx2")]
pub unsafe fn transpose8(src: *const f32, n: usize, dst: *mut f32, stride: usize, col0: usize) {
    // SAFETY: by the caller's contract.
    unsafe {
        for e in (0..n / 8 * 8).step_by(8) {
            // A plain loop: a closure would not inherit the target features.
            let mut r = [_mm256_setzero_si256(); 8];
            for (i, v) in r.iter_mut().enumerate() {
                *v = _mm256_castps_si256(_mm256_loadu_ps(src.add(i * n + e)));
            }
            let o = super::tile::transpose_8x8_epi32(r);
            for (k, v) in o.iter().enumerate() {
                _mm256_storeu_ps(dst.add((e + k) * stride + col0), _mm256_castsi256_ps(*v));
            }
        }
    }
}

/// [`crate::kernels::fattn::mask_row_f16`]: F16C's conversions (round to nearest even, as
/// `fp32_to_fp16`), 8 values at a time.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn mask_row_f16(src: &[f32], slope: f32, dst: &mut [f32]) -> bool {
    let n = dst.len();
    // SAFETY: loads and stores of 8 values below `n / 8 * 8`; `src` holds `n` values.
    unsafe {
        let sl = _mm256_set1_ps(slope);
        let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut all = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
        let mut i = 0;
        while i + 8 <= n {
            let h =
                _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.as_ptr().add(i)));
            let v = _mm256_mul_ps(sl, _mm256_cvtph_ps(h));
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
            all = _mm256_and_ps(all, _mm256_cmp_ps::<_CMP_EQ_OQ>(v, ninf));
            i += 8;
        }
        let tail = crate::kernels::fattn::mask_row_f16_scalar(&src[i..], slope, &mut dst[i..]);
        tail && _mm256_movemask_ps(all) == 0xff
    }
}

/// [`crate::kernels::fattn::row_max`] in 8 lanes, or `None` where only the in-order fold
/// gives the answer (a NaN in the row, or a zero result).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn row_max(row: &[f32]) -> Option<f32> {
    let n = row.len();
    // SAFETY: loads of 8 values below `n / 8 * 8`.
    unsafe {
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut nan = _mm256_setzero_ps();
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_loadu_ps(row.as_ptr().add(i));
            m = _mm256_max_ps(m, v);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            i += 8;
        }
        if _mm256_movemask_ps(nan) != 0 {
            return None;
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_movehdup_ps(h));
        let mut tmax = _mm_cvtss_f32(h);
        for &v in &row[i..] {
            if v.is_nan() {
                return None;
            }
            tmax = if tmax > v { tmax } else { v };
        }
        (tmax != 0.0).then_some(tmax)
    }
}
