//! f32 and f16 dot products as llama.cpp computes them on x86 AVX2:
//!
//! * `ggml_vec_dot_f32` / `ggml_vec_dot_f16` (`vec.cpp`, AVX branch of `simd-mappings.h`): four
//!   8-lane FMA accumulators over steps of 32, reduced by `GGML_F32x8_REDUCE`; leftovers added
//!   in scalar (f32 with a fused multiply-add for f32; a `double` sum of f32 products for f16).
//! * llamafile's tinyBLAS (`sgemm.cpp`, `tinyBLAS<8, __m256, __m256, T, T, float>`): one 8-lane
//!   FMA accumulator over `k` (a multiple of 8), then `hsum`. ggml's `mul_mat` uses it when
//!   [`tinyblas_f_applies`] says so.

#[cfg_attr(not(target_arch = "x86_64"), allow(unused_imports))]
use super::{fp16_to_fp32, hsum8, reduce_f32x8x4, simd_available};

/// Whether `ggml_compute_forward_mul_mat` hands an f32·f32 or f16·f16 product (after converting
/// the activations to the weight type) to tinyBLAS on an AVX2 build: `n` (activation rows,
/// `ne11`) at least 2, `k` (`ne00`) a multiple of 8, `m` (weight rows, `ne01`) a multiple of 4.
/// For f32 weights the activations must also be contiguous (there is no conversion pass).
pub fn tinyblas_f_applies(m: usize, n: usize, k: usize) -> bool {
    n >= 2 && k.is_multiple_of(8) && m.is_multiple_of(4)
}

#[inline(always)]
pub(crate) fn f16s(b: &[u8], i: usize) -> f32 {
    fp16_to_fp32(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))
}

/// tinyBLAS's per-output arithmetic for f32 rows of `k` values (`k % 8 == 0`).
pub fn tinyblas_dot_f32(k: usize, a: &[f32], b: &[f32]) -> f32 {
    let (a, b) = (&a[..k], &b[..k]);
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present; slices hold `k` values.
        return unsafe { avx2::tinyblas_f32(k, a, b) };
    }
    tinyblas_dot_f32_scalar(k, a, b)
}

/// Scalar emulation of [`tinyblas_dot_f32`].
pub fn tinyblas_dot_f32_scalar(k: usize, a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    for l in (0..k / 8 * 8).step_by(8) {
        for i in 0..8 {
            acc[i] = a[l + i].mul_add(b[l + i], acc[i]);
        }
    }
    hsum8(&acc)
}

/// tinyBLAS's per-output arithmetic for f16 rows (little-endian bytes) of `k` values.
pub fn tinyblas_dot_f16(k: usize, a: &[u8], b: &[u8]) -> f32 {
    let (a, b) = (&a[..2 * k], &b[..2 * k]);
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present; slices hold `k` f16 values.
        return unsafe { avx2::tinyblas_f16(k, a, b) };
    }
    tinyblas_dot_f16_scalar(k, a, b)
}

/// Scalar emulation of [`tinyblas_dot_f16`].
pub fn tinyblas_dot_f16_scalar(k: usize, a: &[u8], b: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for l in (0..k / 8 * 8).step_by(8) {
        for i in 0..8 {
            acc[i] = f16s(a, l + i).mul_add(f16s(b, l + i), acc[i]);
        }
    }
    hsum8(&acc)
}

/// tinyBLAS's per-output arithmetic for bf16 rows (little-endian bytes) of `k` values: one
/// 8-lane FMA accumulator over whole groups of 8, then `hsum` (bf16 widens exactly, so the
/// scalar loop below is every tier's arithmetic; LLVM vectorizes the lanes).
pub fn tinyblas_dot_bf16(k: usize, a: &[u8], b: &[u8]) -> f32 {
    let (a, b) = (&a[..2 * k], &b[..2 * k]);
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA present; slices hold `k` bf16 values.
        return unsafe { avx2::tinyblas_bf16(k, a, b) };
    }
    tinyblas_dot_bf16_scalar(k, a, b)
}

/// Scalar emulation of [`tinyblas_dot_bf16`].
pub fn tinyblas_dot_bf16_scalar(k: usize, a: &[u8], b: &[u8]) -> f32 {
    let (a, b) = (&a[..2 * k], &b[..2 * k]);
    let mut acc = [0f32; 8];
    for l in (0..k / 8 * 8).step_by(8) {
        for i in 0..8 {
            acc[i] = super::bf16s(a, l + i).mul_add(super::bf16s(b, l + i), acc[i]);
        }
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_f32` (AVX2 build).
pub fn vec_dot_f32(n: usize, x: &[f32], y: &[f32]) -> f32 {
    let (x, y) = (&x[..n], &y[..n]);
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present; slices hold `n` values.
        return unsafe { avx2::vec_dot_f32(n, x, y) };
    }
    vec_dot_f32_scalar(n, x, y)
}

/// Scalar emulation of [`vec_dot_f32`].
pub fn vec_dot_f32_scalar(n: usize, x: &[f32], y: &[f32]) -> f32 {
    let np = n & !31;
    let mut sum = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, s) in sum.iter_mut().enumerate() {
            for l in 0..8 {
                let k = i + 8 * j + l;
                s[l] = x[k].mul_add(y[k], s[l]);
            }
        }
    }
    let mut sumf = reduce_f32x8x4(&mut sum);
    for i in np..n {
        sumf = x[i].mul_add(y[i], sumf);
    }
    sumf
}

/// `ggml_vec_dot_f16` (AVX2 build) over little-endian f16 rows.
pub fn vec_dot_f16(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let (x, y) = (&x[..2 * n], &y[..2 * n]);
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present; slices hold `n` f16 values.
        return unsafe { avx2::vec_dot_f16(n, x, y) };
    }
    vec_dot_f16_scalar(n, x, y)
}

/// Scalar emulation of [`vec_dot_f16`].
pub fn vec_dot_f16_scalar(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let np = n & !31;
    let mut sum = [[0f32; 8]; 4];
    for i in (0..np).step_by(32) {
        for (j, s) in sum.iter_mut().enumerate() {
            for l in 0..8 {
                let k = i + 8 * j + l;
                s[l] = f16s(x, k).mul_add(f16s(y, k), s[l]);
            }
        }
    }
    let mut sumf = f64::from(reduce_f32x8x4(&mut sum));
    for i in np..n {
        sumf += f64::from(f16s(x, i) * f16s(y, i));
    }
    sumf as f32
}

#[cfg(target_arch = "x86_64")]
pub(crate) use super::x86::avx2::fdot as avx2;
