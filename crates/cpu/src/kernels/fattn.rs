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

/// `dst[i] = slope * f32(f16(src[i]))` (the mask as ggml's flash attention reads it: stored
/// as f16); returns whether every `dst[i]` is -inf.
pub fn mask_row_f16(src: &[f32], slope: f32, dst: &mut [f32]) -> bool {
    let src = &src[..dst.len()];
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present; `src` holds `dst.len()` values.
        return unsafe { avx2::mask_row_f16(src, slope, dst) };
    }
    mask_row_f16_scalar(src, slope, dst)
}

/// Scalar [`mask_row_f16`].
pub fn mask_row_f16_scalar(src: &[f32], slope: f32, dst: &mut [f32]) -> bool {
    let mut all_masked = true;
    for (o, &m) in dst.iter_mut().zip(src) {
        *o = slope * fp16_to_fp32(super::fp32_to_fp16(m));
        all_masked &= *o == f32::NEG_INFINITY;
    }
    all_masked
}

/// The fold `max = if max > v { max } else { v }` from -inf over `row`. Without NaNs and
/// zeros the largest value is the same in any order, so lanes may fold it; a row whose
/// result is a zero (whose sign the order picks) or that holds a NaN is folded in order.
pub fn row_max(row: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd_available() && row.len() >= 8 {
        // SAFETY: AVX2 present.
        if let Some(m) = unsafe { avx2::row_max(row) } {
            return m;
        }
    }
    row_max_scalar(row)
}

/// Scalar [`row_max`]: the fold in order.
pub fn row_max_scalar(row: &[f32]) -> f32 {
    let mut tmax = f32::NEG_INFINITY;
    for &v in row {
        tmax = if tmax > v { tmax } else { v };
    }
    tmax
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
/// f16 accumulator), for one or more query heads that share a KV head: the converted f16
/// queries and where K and V rows start.
pub struct F16Rows<'a> {
    /// Cell 0's K row of this KV head, and the byte stride between cells.
    pub k: &'a [u8],
    pub k_stride: usize,
    pub v: &'a [u8],
    pub v_stride: usize,
    pub dk: usize,
    pub dv: usize,
    /// Per head, the query as f16 bytes (`dk` values).
    pub q: &'a [&'a [u8]],
    /// The score scale (already divided by the cap when soft-capping).
    pub scale: f32,
    pub softcap: f32,
}

/// Heads [`f16_rows_online`] takes in one pass.
pub const MAX_ROWS_HEADS: usize = 4;

/// Whether [`f16_rows_online`] has a kernel for these head sizes on this machine.
pub fn f16_rows_online_supported(dk: usize, dv: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        return dk <= 256 && matches!(dv, 64 | 128 | 256);
    }
    let _ = (dk, dv);
    false
}

/// Runs [`F16Rows`]'s online softmax for each head over `cells` (`(cell, mask value)`,
/// masked cells left out; head `g` adds `slopes[g] * mask value`), writing head `g`'s
/// unnormalized output (the f16 accumulator, widened) to `out[g * dv..][..dv]` and its
/// `(M, S)` to `states[g]`. Returns `false` when this machine, `dv`, `dk` or the head count
/// has no register-resident kernel (the caller then runs the generic loop, which gives the
/// same bits).
pub fn f16_rows_online(
    r: &F16Rows<'_>,
    cells: &mut dyn Iterator<Item = (usize, f32)>,
    slopes: &[f32],
    out: &mut [f32],
    states: &mut [(f32, f32)],
) -> bool {
    let g = r.q.len();
    if r.dk > 256 || slopes.len() != g || states.len() != g || out.len() < g * r.dv {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        macro_rules! run {
            ($nv:literal) => {
                // SAFETY: AVX2/FMA/F16C present; `out` holds `g * dv` values and the K and
                // V rows are bounds-checked per cell inside.
                unsafe {
                    match g {
                        1 => avx2::f16_rows_online::<$nv, 1>(r, cells, slopes, out, states),
                        2 => avx2::f16_rows_online::<$nv, 2>(r, cells, slopes, out, states),
                        3 => avx2::f16_rows_online::<$nv, 3>(r, cells, slopes, out, states),
                        4 => avx2::f16_rows_online::<$nv, 4>(r, cells, slopes, out, states),
                        _ => return false,
                    }
                }
            };
        }
        match r.dv {
            64 => run!(8),
            128 => run!(16),
            256 => run!(32),
            _ => return false,
        }
        return true;
    }
    let _ = (r, cells, out);
    false
}

/// `dst[e * stride + col0 + r] = src[r * n + e]` for rows `r < g` (at most 8) and `e < n`:
/// `g` rows of `n` values written as columns (flash attention's transposed K tile). Pure
/// data movement; 8 × 8 blocks in registers where the CPU has AVX2.
pub fn transpose_into(
    src: &[f32],
    g: usize,
    n: usize,
    dst: &mut [f32],
    stride: usize,
    col0: usize,
) {
    assert!(g <= 8 && src.len() >= g * n && col0 + g <= stride);
    assert!(n == 0 || dst.len() >= (n - 1) * stride + col0 + g);
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut e0 = 0;
    #[cfg(target_arch = "x86_64")]
    if simd_available() && g == 8 {
        // SAFETY: AVX present; 8 rows of `n` values in `src` and every column written lies
        // inside `dst` (asserted above).
        unsafe { avx2::transpose8(src.as_ptr(), n, dst.as_mut_ptr(), stride, col0) };
        e0 = n / 8 * 8;
    }
    for e in e0..n {
        for r in 0..g {
            dst[e * stride + col0 + r] = src[r * n + e];
        }
    }
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
pub(crate) use super::x86::avx2::fattn as avx2;

#[cfg(target_arch = "x86_64")]
use super::x86::avx512::fattn as avx512;

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

        // Every count of leftover rows past the 6-row tiles, and a flash-attention tile.
        for m in (1..=13).chain([64]) {
            let (k, n) = (7, 19 + 64);
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
            let mut c1: Vec<f32> = (0..m * n).map(|i| i as f32 * 1e-3).collect();
            let mut c2 = c1.clone();
            #[cfg(target_arch = "x86_64")]
            let mut c3 = c1.clone();
            gemm_acc(&mut c1, &a, &b, m, k, n);
            gemm_acc_impl(&mut c2, &a, &b, m, k, n);
            let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&c1), bits(&c2), "gemm_acc of {m} rows");
            // The AVX2 tiles also where the tier in use is another.
            #[cfg(target_arch = "x86_64")]
            if simd_available() {
                // SAFETY: AVX2/FMA present; the slices have the sizes given.
                unsafe { avx2::gemm_acc(&mut c3, &a, &b, m, k, n) };
                assert_eq!(bits(&c3), bits(&c2), "AVX2 gemm_acc of {m} rows");
            }
        }
    }
}
