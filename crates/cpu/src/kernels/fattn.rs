//! The vector steps of ggml-cpu's flash attention (`ops.cpp`, `vec.h`, `simd-gemm.h`) with the
//! arithmetic of its AVX2 build:
//!
//! * `ggml_vec_mad_f16` / `ggml_vec_scale_f16`: the f16 output accumulator of the per-row
//!   path, each element widened, fused-multiply-added (or multiplied) in f32 and rounded back
//!   to f16 at every step;
//! * `ggml_vec_mad_f32` (fused) and `ggml_vec_scale_f32`;
//! * `simd_gemm` (`C += A·B`): every output is one FMA chain over `k` in order, whatever the
//!   register tiling, so any vector width gives the same bits;
//! * `ggml_vec_dot_bf16` (AVX2: four 8-lane FMA accumulators, the leftovers in `double`).
//!
//! Every step is element-wise or has a fixed order, so the scalar versions give the same bits.

use super::fp16_to_fp32;
#[cfg(target_arch = "x86_64")]
use super::simd_available;

/// `y[i] = f16(f32(y[i]) + f32(x[i]) * v)`, the product fused (`ggml_vec_mad_f16`); `x` is
/// little-endian f16 bytes, `y` f16 bits.
pub fn mad_f16(y: &mut [u16], x: &[u8], v: f32) {
    let x = &x[..2 * y.len()];
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present; `x` holds `y.len()` f16 values.
        return unsafe { avx2::mad_f16(y, x, v) };
    }
    mad_f16_scalar(y, x, v);
}

/// Scalar [`mad_f16`].
pub fn mad_f16_scalar(y: &mut [u16], x: &[u8], v: f32) {
    for (i, o) in y.iter_mut().enumerate() {
        let xv = fp16_to_fp32(u16::from_le_bytes([x[2 * i], x[2 * i + 1]]));
        *o = super::fp32_to_fp16(xv.mul_add(v, fp16_to_fp32(*o)));
    }
}

/// `y[i] = f16(f32(y[i]) * v)` (`ggml_vec_scale_f16`).
pub fn scale_f16(y: &mut [u16], v: f32) {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present.
        return unsafe { avx2::scale_f16(y, v) };
    }
    scale_f16_scalar(y, v);
}

/// Scalar [`scale_f16`].
pub fn scale_f16_scalar(y: &mut [u16], v: f32) {
    for o in y.iter_mut() {
        *o = super::fp32_to_fp16(fp16_to_fp32(*o) * v);
    }
}

/// `y[i] = fma(x[i], v, y[i])` (`ggml_vec_mad_f32`; GCC fuses the leftovers too).
pub fn mad_f32(y: &mut [f32], x: &[f32], v: f32) {
    let x = &x[..y.len()];
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA present.
        return unsafe { avx2::mad_f32(y, x, v) };
    }
    for (o, &xv) in y.iter_mut().zip(x) {
        *o = xv.mul_add(v, *o);
    }
}

/// `y[i] *= v` (`ggml_vec_scale_f32`).
#[inline]
pub fn scale_f32(y: &mut [f32], v: f32) {
    for o in y.iter_mut() {
        *o *= v;
    }
}

/// `simd_gemm`: `c[m×n] += a[m×k] · b[k×n]`, all row-major; `c[i][j]` is the FMA chain
/// `c = fma(a[i][kk], b[kk][j], c)` for `kk = 0..k`.
pub fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    let (c, a, b) = (&mut c[..m * n], &a[..m * k], &b[..k * n]);
    #[cfg(target_arch = "x86_64")]
    if super::isa() == super::Isa::Avx512 {
        // SAFETY: AVX-512F present (the tier is checked); the slices have the sizes above.
        return unsafe { avx512::gemm_acc(c, a, b, m, k, n) };
    }
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA present; the slices have the sizes above.
        return unsafe { avx2::gemm_acc(c, a, b, m, k, n) };
    }
    gemm_acc_impl(c, a, b, m, k, n);
}

#[inline(always)]
fn gemm_acc_impl(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
    for i in 0..m {
        let ci = &mut c[i * n..(i + 1) * n];
        for kk in 0..k {
            let av = a[i * k + kk];
            let bk = &b[kk * n..(kk + 1) * n];
            for (o, &bv) in ci.iter_mut().zip(bk) {
                *o = av.mul_add(bv, *o);
            }
        }
    }
}

/// One query row of the per-row flash-attention path for f16 K and V (`_one_chunk` with its
/// f16 accumulator): the cells to visit with their mask values, the converted f16 query, and
/// where K and V rows start.
pub struct F16Row<'a> {
    /// Cell 0's K row of this KV head, and the byte stride between cells.
    pub k: &'a [u8],
    pub k_stride: usize,
    pub v: &'a [u8],
    pub v_stride: usize,
    pub dk: usize,
    pub dv: usize,
    /// The query as f16 bytes (`dk` values).
    pub q: &'a [u8],
    /// The score scale (already divided by the cap when soft-capping).
    pub scale: f32,
    pub softcap: f32,
}

/// Runs [`F16Row`]'s online softmax over `cells` (`(cell, mask value)`, masked cells left out),
/// writing the unnormalized output (the f16 accumulator, widened) to `out` (`dv` values) and
/// returning `(M, S)`, or `None` when this machine or `dv` has no register-resident kernel
/// (the caller then runs the generic loop, which gives the same bits).
pub fn f16_row_online(
    r: &F16Row<'_>,
    cells: &mut dyn Iterator<Item = (usize, f32)>,
    out: &mut [f32],
) -> Option<(f32, f32)> {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present; the rows are bounds-checked per cell inside.
        return unsafe {
            match r.dv {
                64 => Some(avx2::f16_row_online::<8>(r, cells, out)),
                128 => Some(avx2::f16_row_online::<16>(r, cells, out)),
                256 => Some(avx2::f16_row_online::<32>(r, cells, out)),
                _ => None,
            }
        };
    }
    let _ = (r, cells, out);
    None
}

/// f16 values (little-endian bytes) to f32 (exact).
pub fn f16_row_to_f32(x: &[u8], out: &mut [f32]) {
    let x = &x[..2 * out.len()];
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: F16C present; `x` holds `out.len()` values.
        return unsafe { avx2::f16_row_to_f32(x, out) };
    }
    for (o, b) in out.iter_mut().zip(x.chunks_exact(2)) {
        *o = fp16_to_fp32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// f32 values to f16 bits, rounding to nearest even (F16C `vcvtps2ph`).
pub fn f32_row_to_f16(x: &[f32], out: &mut [u8]) {
    let out = &mut out[..2 * x.len()];
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: F16C present; `out` holds `x.len()` values.
        return unsafe { avx2::f32_row_to_f16(x, out) };
    }
    for (o, &v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&super::fp32_to_fp16(v).to_le_bytes());
    }
}

/// `ggml_vec_dot_bf16` (AVX2 build) of `n` bf16 values (little-endian bytes).
pub fn vec_dot_bf16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (&x[..2 * n], &y[..2 * n]);
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA present; the slices hold `n` bf16 values.
        return unsafe { avx2::vec_dot_bf16(n, x, y) };
    }
    vec_dot_bf16_scalar(n, x, y)
}

/// Scalar [`vec_dot_bf16`].
pub fn vec_dot_bf16_scalar(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let np = n / 32 * 32;
    let mut c = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, cj) in c.iter_mut().enumerate() {
            for l in 0..8 {
                let e = i + 8 * j + l;
                cj[l] = super::bf16s(x, e).mul_add(super::bf16s(y, e), cj[l]);
            }
        }
    }
    let mut sumf = 0f64;
    if np > 0 {
        let mut t = [0f32; 8];
        for l in 0..8 {
            t[l] = (c[0][l] + c[2][l]) + (c[1][l] + c[3][l]);
        }
        sumf += f64::from(super::hsum8(&t));
    }
    for i in np..n {
        sumf += f64::from(super::bf16s(x, i) * super::bf16s(y, i));
    }
    sumf as f32
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
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
        super::mad_f16_scalar(&mut y[nv..], &x[2 * nv..], v);
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
        super::scale_f16_scalar(&mut y[nv..], v);
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mad_f32(y: &mut [f32], x: &[f32], v: f32) {
        for (o, &xv) in y.iter_mut().zip(x) {
            *o = xv.mul_add(v, *o);
        }
    }

    /// [`super::f16_row_online`] with the accumulator held as `NV` vectors of f32 values that
    /// are always exactly f16 (each step rounds through `vcvtps2ph`, as ggml's store does), so
    /// no accumulator round trip goes through memory.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn f16_row_online<const NV: usize>(
        r: &super::F16Row<'_>,
        cells: &mut dyn Iterator<Item = (usize, f32)>,
        out: &mut [f32],
    ) -> (f32, f32) {
        #[inline(always)]
        unsafe fn round16(x: __m256) -> __m256 {
            // SAFETY: register-only; F16C enabled by the caller.
            unsafe { _mm256_cvtph_ps(_mm256_cvtps_ph::<0>(x)) }
        }
        let mut acc = [_mm256_setzero_ps(); NV];
        let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
        for (ic, mv) in cells {
            let krow = &r.k[ic * r.k_stride..][..2 * r.dk];
            let vrow = &r.v[ic * r.v_stride..][..2 * NV * 8];
            // SAFETY: `krow` and `q` hold `dk` f16 values; AVX2 present.
            let mut sc =
                unsafe { crate::kernels::fdot::avx2::vec_dot_f16(r.dk, krow, r.q) } * r.scale;
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
                        let vx =
                            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                                _mm_loadu_si128(x.as_ptr().add(2 * e) as *const __m128i),
                            )));
                        let vy =
                            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
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
            sumf += f64::from(super::super::bf16s(x, i) * super::super::bf16s(y, i));
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
            out[i] = super::fp16_to_fp32(u16::from_le_bytes([x[2 * i], x[2 * i + 1]]));
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
            out[2 * i..2 * i + 2].copy_from_slice(&super::super::fp32_to_fp16(x[i]).to_le_bytes());
        }
    }

    /// Rows in pairs and columns in blocks of 32 held in registers over the whole `k` loop
    /// (each output is still one FMA chain in `k` order); leftover columns by the generic loop.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
        let n32 = n / 32 * 32;
        // SAFETY: every load and store is inside `c` (m×n), `a` (m×k) and `b` (k×n): rows
        // `i, i + 1 < m`, columns `j..j + 32 <= n32 <= n`, `kk < k`.
        unsafe {
            let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
            let mut i = 0;
            while i < m {
                let two = i + 1 < m;
                for j in (0..n32).step_by(32) {
                    let c0 = cp.add(i * n + j);
                    let c1 = cp.add((i + usize::from(two)) * n + j);
                    let mut x0 = [_mm256_setzero_ps(); 4];
                    let mut x1 = [_mm256_setzero_ps(); 4];
                    for r in 0..4 {
                        x0[r] = _mm256_loadu_ps(c0.add(8 * r));
                        x1[r] = _mm256_loadu_ps(c1.add(8 * r));
                    }
                    let a0p = ap.add(i * k);
                    let a1p = ap.add((i + usize::from(two)) * k);
                    for kk in 0..k {
                        let a0 = _mm256_set1_ps(*a0p.add(kk));
                        let a1 = _mm256_set1_ps(*a1p.add(kk));
                        let brow = bp.add(kk * n + j);
                        for r in 0..4 {
                            let bv = _mm256_loadu_ps(brow.add(8 * r));
                            x0[r] = _mm256_fmadd_ps(a0, bv, x0[r]);
                            x1[r] = _mm256_fmadd_ps(a1, bv, x1[r]);
                        }
                    }
                    for r in 0..4 {
                        _mm256_storeu_ps(c0.add(8 * r), x0[r]);
                        if two {
                            _mm256_storeu_ps(c1.add(8 * r), x1[r]);
                        }
                    }
                }
                i += 2;
            }
        }
        if n32 < n {
            for i in 0..m {
                for kk in 0..k {
                    let av = a[i * k + kk];
                    for j in n32..n {
                        c[i * n + j] = av.mul_add(b[kk * n + j], c[i * n + j]);
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// [`super::avx2::gemm_acc`] with 16-lane registers: rows in pairs, columns in blocks of
    /// 64; the same FMA chain per output.
    #[target_feature(enable = "avx2,fma,avx512f")]
    pub unsafe fn gemm_acc(c: &mut [f32], a: &[f32], b: &[f32], m: usize, k: usize, n: usize) {
        let n64 = n / 64 * 64;
        // SAFETY: every load and store is inside `c` (m×n), `a` (m×k) and `b` (k×n): rows
        // `i, i + 1 < m`, columns `j..j + 64 <= n64 <= n`, `kk < k`.
        unsafe {
            let (cp, ap, bp) = (c.as_mut_ptr(), a.as_ptr(), b.as_ptr());
            let mut i = 0;
            while i < m {
                let two = i + 1 < m;
                let i1 = i + usize::from(two);
                for j in (0..n64).step_by(64) {
                    let (c0, c1) = (cp.add(i * n + j), cp.add(i1 * n + j));
                    let mut x0 = [_mm512_setzero_ps(); 4];
                    let mut x1 = [_mm512_setzero_ps(); 4];
                    for r in 0..4 {
                        x0[r] = _mm512_loadu_ps(c0.add(16 * r));
                        x1[r] = _mm512_loadu_ps(c1.add(16 * r));
                    }
                    let (a0p, a1p) = (ap.add(i * k), ap.add(i1 * k));
                    for kk in 0..k {
                        let a0 = _mm512_set1_ps(*a0p.add(kk));
                        let a1 = _mm512_set1_ps(*a1p.add(kk));
                        let brow = bp.add(kk * n + j);
                        for r in 0..4 {
                            let bv = _mm512_loadu_ps(brow.add(16 * r));
                            x0[r] = _mm512_fmadd_ps(a0, bv, x0[r]);
                            x1[r] = _mm512_fmadd_ps(a1, bv, x1[r]);
                        }
                    }
                    for r in 0..4 {
                        _mm512_storeu_ps(c0.add(16 * r), x0[r]);
                        if two {
                            _mm512_storeu_ps(c1.add(16 * r), x1[r]);
                        }
                    }
                }
                i += 2;
            }
        }
        if n64 < n {
            // The remaining columns (fewer than 64) through the AVX2 kernel, column by column
            // block: each output's chain is the same whoever computes it.
            for i in 0..m {
                for kk in 0..k {
                    let av = a[i * k + kk];
                    for j in n64..n {
                        c[i * n + j] = av.mul_add(b[kk * n + j], c[i * n + j]);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| super::super::fp32_to_fp16(x).to_le_bytes())
            .collect()
    }

    #[test]
    fn simd_and_scalar_agree() {
        let xs: Vec<f32> = (0..77)
            .map(|i| ((i * 37 % 19) as f32 - 9.0) * 0.173)
            .collect();
        let xb = f16_bytes(&xs);
        let mut y1: Vec<u16> = (0..77)
            .map(|i| super::super::fp32_to_fp16(i as f32 * 0.01))
            .collect();
        let mut y2 = y1.clone();
        mad_f16(&mut y1, &xb, 0.731);
        mad_f16_scalar(&mut y2, &xb, 0.731);
        assert_eq!(y1, y2);
        scale_f16(&mut y1, 0.377);
        scale_f16_scalar(&mut y2, 0.377);
        assert_eq!(y1, y2);

        let bf16s = |f: fn(f32) -> f32| -> Vec<u8> {
            (0..77)
                .flat_map(|i| {
                    let b = lamina_core::quant::f32_to_bf16(f(i as f32 * 0.37)).to_bits();
                    b.to_le_bytes()
                })
                .collect()
        };
        let (xb, yb) = (bf16s(f32::sin), bf16s(f32::cos));
        for n in [0, 5, 32, 64, 77] {
            assert_eq!(
                vec_dot_bf16(n, &xb, &yb).to_bits(),
                vec_dot_bf16_scalar(n, &xb, &yb).to_bits(),
                "bf16 dot of {n}"
            );
        }

        let (m, k, n) = (5, 7, 19 + 64);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut c1: Vec<f32> = (0..m * n).map(|i| i as f32 * 1e-3).collect();
        let mut c2 = c1.clone();
        gemm_acc(&mut c1, &a, &b, m, k, n);
        gemm_acc_impl(&mut c2, &a, &b, m, k, n);
        assert_eq!(
            c1.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            c2.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}
