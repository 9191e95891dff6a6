//! AVX2 versions of the f32/f16/bf16 dots of `kernels/fdot.rs` (`ggml_vec_dot_*`, tinyBLAS).

use crate::kernels::x86::hsum_float_8;
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn reduce4(s: [__m256; 4]) -> f32 {
    // SAFETY: register-only intrinsics; AVX enabled by the caller.
    unsafe {
        let a = _mm256_add_ps(s[0], s[2]);
        let b = _mm256_add_ps(s[1], s[3]);
        let x = _mm256_add_ps(a, b);
        let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tinyblas_f32(k: usize, a: &[f32], b: &[f32]) -> f32 {
    // SAFETY: the slices hold `k` values; loads stay below `k / 8 * 8`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for l in (0..k / 8 * 8).step_by(8) {
            acc = _mm256_fmadd_ps(
                _mm256_loadu_ps(a.as_ptr().add(l)),
                _mm256_loadu_ps(b.as_ptr().add(l)),
                acc,
            );
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tinyblas_f16(k: usize, a: &[u8], b: &[u8]) -> f32 {
    // SAFETY: the slices hold `k` f16 values; loads stay below `k / 8 * 8`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for l in (0..k / 8 * 8).step_by(8) {
            let va = _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(2 * l) as *const __m128i));
            let vb = _mm256_cvtph_ps(_mm_loadu_si128(b.as_ptr().add(2 * l) as *const __m128i));
            acc = _mm256_fmadd_ps(va, vb, acc);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn tinyblas_bf16(k: usize, a: &[u8], b: &[u8]) -> f32 {
    // SAFETY: the slices hold `k` bf16 values; loads stay below `k / 8 * 8`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        // No closure for the loads: it would not inherit the target features.
        for l in (0..k / 8 * 8).step_by(8) {
            let va = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(a.as_ptr().add(2 * l) as *const __m128i),
            )));
            let vb = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(
                _mm_loadu_si128(b.as_ptr().add(2 * l) as *const __m128i),
            )));
            acc = _mm256_fmadd_ps(va, vb, acc);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn vec_dot_f32(n: usize, x: &[f32], y: &[f32]) -> f32 {
    // SAFETY: the slices hold `n` values; vector loads stay below `n & !31`.
    unsafe {
        let np = n & !31;
        let mut s = [_mm256_setzero_ps(); 4];
        for i in (0..np).step_by(32) {
            for (j, sj) in s.iter_mut().enumerate() {
                let ax = _mm256_loadu_ps(x.as_ptr().add(i + 8 * j));
                let ay = _mm256_loadu_ps(y.as_ptr().add(i + 8 * j));
                *sj = _mm256_fmadd_ps(ax, ay, *sj);
            }
        }
        let mut sumf = reduce4(s);
        for i in np..n {
            sumf = x[i].mul_add(y[i], sumf);
        }
        sumf
    }
}

/// The second operand of [`vec_dot_f16`]: f16 bytes, or the same values widened to f32.
pub trait F16DotRhs {
    /// Values `k..k + 8` as f32.
    ///
    /// # Safety
    /// `k + 8` values are readable; AVX2/F16C present.
    unsafe fn load8(&self, k: usize) -> __m256;
    /// Value `i` as f32.
    fn at(&self, i: usize) -> f32;
}

impl F16DotRhs for &[u8] {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8(&self, k: usize) -> __m256 {
        // SAFETY: by the caller's contract.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(self.as_ptr().add(2 * k) as *const __m128i)) }
    }
    fn at(&self, i: usize) -> f32 {
        crate::kernels::fdot::f16s(self, i)
    }
}

impl F16DotRhs for &[f32] {
    #[target_feature(enable = "avx2,fma,f16c")]
    #[inline]
    unsafe fn load8(&self, k: usize) -> __m256 {
        // SAFETY: by the caller's contract.
        unsafe { _mm256_loadu_ps(self.as_ptr().add(k)) }
    }
    fn at(&self, i: usize) -> f32 {
        self[i]
    }
}

/// `ggml_vec_dot_f16` (AVX2 build): four 8-lane FMA accumulators over steps of 32, reduced,
/// the leftovers in `double`. `y` is f16 bytes, or (flash attention's decode rows, the query
/// widened once) the same values as f32: the same products, so the same bits.
///
/// # Safety
/// AVX2/FMA/F16C present; `x` holds `n` f16 values and `y` at least `n` values.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub unsafe fn vec_dot_f16<Y: F16DotRhs>(n: usize, x: &[u8], y: Y) -> f32 {
    // SAFETY: by the caller's contract.
    unsafe { vec_dots_f16(n, x, [y])[0] }
}

/// [`vec_dot_f16`] of one row `x` against `G` rows `ys` (the query heads that share a KV
/// head): each result is exactly `vec_dot_f16(n, x, ys[g])`, with `x` widened once for all.
///
/// # Safety
/// As [`vec_dot_f16`], for every `ys[g]`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub unsafe fn vec_dots_f16<Y: F16DotRhs, const G: usize>(
    n: usize,
    x: &[u8],
    ys: [Y; G],
) -> [f32; G] {
    // SAFETY: the slices hold `n` values; vector loads stay below `n & !31`.
    unsafe {
        let np = n & !31;
        let mut s = [[_mm256_setzero_ps(); 4]; G];
        // No closure for the loads: it would not inherit the target features.
        for i in (0..np).step_by(32) {
            for j in 0..4 {
                let k = i + 8 * j;
                let xv = _mm256_cvtph_ps(_mm_loadu_si128(x.as_ptr().add(2 * k) as *const __m128i));
                for (sg, y) in s.iter_mut().zip(&ys) {
                    sg[j] = _mm256_fmadd_ps(xv, y.load8(k), sg[j]);
                }
            }
        }
        let mut out = [0f32; G];
        for ((o, sg), y) in out.iter_mut().zip(s).zip(&ys) {
            let mut sumf = f64::from(reduce4(sg));
            for i in np..n {
                sumf += f64::from(crate::kernels::fdot::f16s(x, i) * y.at(i));
            }
            *o = sumf as f32;
        }
        out
    }
}
