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

/// Cells whose scores [`f16_row_online`] computes ahead of their softmax steps.
const SCORE_BATCH: usize = 8;

/// [`crate::kernels::fattn::f16_row_online`] with the accumulator held as `NV` vectors of f32 values that
/// are always exactly f16 (each step rounds through `vcvtps2ph`, as ggml's store does), so
/// no accumulator round trip goes through memory. The scores of up to [`SCORE_BATCH`] cells
/// are computed before their softmax steps (each as `ggml_vec_dot_f16` forms it, the query
/// widened once): independent dots overlap, where one dot per step left each step waiting
/// on its dot's reduction.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn f16_row_online<const NV: usize>(
    r: &crate::kernels::fattn::F16Row<'_>,
    cells: &mut dyn Iterator<Item = (usize, f32)>,
    out: &mut [f32],
) -> (f32, f32) {
    #[inline(always)]
    unsafe fn round16(x: __m256) -> __m256 {
        // SAFETY: register-only; F16C enabled by the caller.
        unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph::<0>(x)) }
    }
    // The query widened to f32 (the values `vec_dot_f16` converts at each call).
    let mut qf = [0f32; 256];
    let dk = r.dk.min(qf.len());
    for (i, v) in qf.iter_mut().enumerate().take(dk) {
        *v = crate::kernels::fdot::f16s(r.q, i);
    }
    let mut acc = [_mm256_setzero_ps(); NV];
    let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
    let mut batch = [(0usize, 0f32); SCORE_BATCH];
    let mut scores = [0f32; SCORE_BATCH];
    loop {
        let mut n = 0;
        while n < SCORE_BATCH {
            let Some(c) = cells.next() else { break };
            batch[n] = c;
            n += 1;
        }
        if n == 0 {
            break;
        }
        for (sc, &(ic, _)) in scores.iter_mut().zip(&batch).take(n) {
            let krow = &r.k[ic * r.k_stride..][..2 * r.dk];
            *sc = if r.dk <= qf.len() {
                // SAFETY: `krow` holds `dk` f16 values and `qf` `dk` f32 values; AVX2 present.
                unsafe { crate::kernels::fdot::avx2::vec_dot_f16(r.dk, krow, &qf[..]) }
            } else {
                // SAFETY: `krow` and `q` hold `dk` f16 values; AVX2 present.
                unsafe { crate::kernels::fdot::avx2::vec_dot_f16(r.dk, krow, r.q) }
            };
        }
        for (&sc0, &(ic, mv)) in scores.iter().zip(&batch).take(n) {
            let vrow = &r.v[ic * r.v_stride..][..2 * NV * 8];
            let mut sc = sc0 * r.scale;
            if r.softcap != 0.0 {
                sc = r.softcap * sc.tanh();
            }
            sc += mv;
            let (mut ms, mut vs) = (1f32, 1f32);
            // SAFETY (both blocks): register arithmetic, and loads of 8 f16 values at
            // `8 * j < 8 * NV = dv` within `vrow`.
            if sc > m {
                let m_old = m;
                m = sc;
                ms = (m_old - m).exp();
                let vms = _mm256_set1_ps(ms);
                for a in acc.iter_mut() {
                    *a = unsafe { round16(_mm256_mul_ps(*a, vms)) };
                }
            } else {
                vs = (sc - m).exp();
            }
            let vvs = _mm256_set1_ps(vs);
            for (j, a) in acc.iter_mut().enumerate() {
                unsafe {
                    let x = _mm256_cvtph_ps(_mm_loadu_si128(
                        vrow.as_ptr().add(16 * j) as *const __m128i
                    ));
                    *a = round16(_mm256_fmadd_ps(x, vvs, *a));
                }
            }
            s = s.mul_add(ms, vs);
        }
        if n < SCORE_BATCH {
            break;
        }
    }
    for (j, a) in acc.iter().enumerate() {
        // SAFETY: `out` holds `dv = 8 * NV` values.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * j), *a) };
    }
    (m, s)
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
