//! AVX2 activation quantizers (`quantize_row_q8_0`/`_q8_1`/`_q8_K`), as `kernels/quantize.rs`
//! describes them.

use crate::kernels::fp32_to_fp16;
use crate::kernels::quantize::{Q8_0_BLOCK, Q8_1_BLOCK, Q8_K_BLOCK};
use std::arch::x86_64::*;

/// The AVX2 tier's `quantize_row_q8_0`.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    crate::kernels::quantize::check_q8(x, out, false);
    // SAFETY: reached only through the AVX2 and AVX-512 kernel tables, which exist only
    // where AVX2/FMA/F16C are present; lengths checked above.
    unsafe { quantize_q8(x, out, false) }
}

/// The AVX2 tier's `quantize_row_q8_1`.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
    crate::kernels::quantize::check_q8(x, out, true);
    // SAFETY: as in `quantize_row_q8_0`.
    unsafe { quantize_q8(x, out, true) }
}

/// The AVX2 tier's `quantize_row_q8_K` (the reference's operations, with SSE4.1 rounding
/// instead of a libm call and a vector search for the largest magnitude).
pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    crate::kernels::quantize::check_q8_k(x, out);
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fast(x: &[f32], out: &mut [u8]) {
        for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BLOCK)) {
            // SAFETY: AVX enabled here. The exact max of the non-NaN `|v|`, as the
            // scalar scan finds it; `max` is its first element, as there.
            let (amax, _) = unsafe { crate::kernels::x86::absmax(xb) };
            let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
            if amax == 0.0 {
                crate::kernels::quantize::quantize_q8_k_block(xb, ob, amax, max);
            } else {
                // SAFETY: AVX2 enabled here; whole blocks.
                unsafe { q8_k_block(xb, ob, max) };
            }
        }
    }
    /// `quantize_q8_k_block` (amax ≠ 0) in vectors: `nearest_int`'s magic-number rounding
    /// for every value (what the scalar code's two branches both compute), `min(127)`, and
    /// the low byte (`as i8`).
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_k_block(xb: &[f32], ob: &mut [u8], max: f32) {
        let iscale = -127.0 / max;
        // SAFETY: 256 values in `xb`, 292 bytes in `ob` (the caller's chunks).
        unsafe {
            let mul = _mm256_set1_ps(iscale);
            let magic = _mm256_set1_ps(12_582_912.0);
            let mant = _mm256_set1_epi32(0x007f_ffff);
            let half = _mm256_set1_epi32(0x0040_0000);
            let top = _mm256_set1_epi32(127);
            let low = _mm256_set1_epi32(0xFF);
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let q = ob.as_mut_ptr().add(4);
            for c in 0..8 {
                let mut n = [_mm256_setzero_si256(); 4];
                for (v, nv) in n.iter_mut().enumerate() {
                    let p = _mm256_mul_ps(_mm256_loadu_ps(xb.as_ptr().add(32 * c + 8 * v)), mul);
                    let bits = _mm256_castps_si256(_mm256_add_ps(p, magic));
                    let i = _mm256_sub_epi32(_mm256_and_si256(bits, mant), half);
                    *nv = _mm256_and_si256(_mm256_min_epi32(i, top), low);
                }
                let b = _mm256_packus_epi16(
                    _mm256_packus_epi32(n[0], n[1]),
                    _mm256_packus_epi32(n[2], n[3]),
                );
                _mm256_storeu_si256(q.add(32 * c).cast(), _mm256_permutevar8x32_epi32(b, order));
            }
            q8_k_bsums(q, ob.as_mut_ptr().add(260));
        }
        ob[..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
    }
    // SAFETY: as in `quantize_row_q8_0`; the same operations as the scalar code (there is
    // no `mul_add` in it, so nothing is contracted).
    unsafe { fast(x, out) }
}

/// A Q8_K block's 16 sums of 16 quants (`quantize::q8_k_bsums`) from the 256 quants at `q`
/// into the 32 bytes at `out`.
///
/// # Safety
/// AVX2 present; 256 readable bytes at `q`, 32 writable at `out`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_k_bsums(q: *const u8, out: *mut u8) {
    // SAFETY: by the caller's contract.
    unsafe {
        let ones8 = _mm256_set1_epi8(1);
        let ones16 = _mm256_set1_epi16(1);
        // Per 32 quants: 8 sums of 4 (`maddubs(1, q)` pairs, then `madd` pairs).
        let mut s = [_mm256_setzero_si256(); 8];
        for (c, sc) in s.iter_mut().enumerate() {
            let v = _mm256_loadu_si256(q.add(32 * c).cast());
            *sc = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, v), ones16);
        }
        let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        let mut half = [_mm256_setzero_si256(); 2];
        for (h, hv) in half.iter_mut().enumerate() {
            let s = &s[4 * h..4 * h + 4];
            // Lane c (c < 4): the first 16 of chunk c; lane 4 + c: its second 16.
            let t = _mm256_hadd_epi32(_mm256_hadd_epi32(s[0], s[1]), _mm256_hadd_epi32(s[2], s[3]));
            *hv = _mm256_permutevar8x32_epi32(t, order);
        }
        // |sum| ≤ 16 · 128: the saturating pack is exact.
        let packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(half[0], half[1]), 0b11_01_10_00);
        _mm256_storeu_si256(out.cast(), packed);
    }
}

/// Port of the AVX2 branch of `quantize_row_q8_0` / `quantize_row_q8_1`.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn quantize_q8(x: &[f32], out: &mut [u8], with_sum: bool) {
    let bs = if with_sum { Q8_1_BLOCK } else { Q8_0_BLOCK };
    let nb = x.len() / 32;
    for i in 0..nb {
        // SAFETY: block i of `x` (32 floats) and of `out` (bs bytes) are in bounds.
        unsafe {
            let xp = x.as_ptr().add(i * 32);
            let op = out.as_mut_ptr().add(i * bs);
            let mut v0 = _mm256_loadu_ps(xp);
            let mut v1 = _mm256_loadu_ps(xp.add(8));
            let mut v2 = _mm256_loadu_ps(xp.add(16));
            let mut v3 = _mm256_loadu_ps(xp.add(24));
            let sign = _mm256_set1_ps(-0.0);
            let mut max_abs = _mm256_andnot_ps(sign, v0);
            max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign, v1));
            max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign, v2));
            max_abs = _mm256_max_ps(max_abs, _mm256_andnot_ps(sign, v3));
            let mut max4 = _mm_max_ps(
                _mm256_extractf128_ps(max_abs, 1),
                _mm256_castps256_ps128(max_abs),
            );
            max4 = _mm_max_ps(max4, _mm_movehl_ps(max4, max4));
            max4 = _mm_max_ss(max4, _mm_movehdup_ps(max4));
            let max_scalar = _mm_cvtss_f32(max4);
            let d = max_scalar / 127.0;
            let db = fp32_to_fp16(d).to_le_bytes();
            *op = db[0];
            *op.add(1) = db[1];
            let id = if max_scalar != 0.0 {
                127.0 / max_scalar
            } else {
                0.0
            };
            let mul = _mm256_set1_ps(id);
            v0 = _mm256_round_ps(_mm256_mul_ps(v0, mul), _MM_FROUND_TO_NEAREST_INT);
            v1 = _mm256_round_ps(_mm256_mul_ps(v1, mul), _MM_FROUND_TO_NEAREST_INT);
            v2 = _mm256_round_ps(_mm256_mul_ps(v2, mul), _MM_FROUND_TO_NEAREST_INT);
            v3 = _mm256_round_ps(_mm256_mul_ps(v3, mul), _MM_FROUND_TO_NEAREST_INT);
            let mut i0 = _mm256_cvtps_epi32(v0);
            let i1 = _mm256_cvtps_epi32(v1);
            let mut i2 = _mm256_cvtps_epi32(v2);
            let i3 = _mm256_cvtps_epi32(v3);
            if with_sum {
                let s = _mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3));
                let sum128 =
                    _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extractf128_si256(s, 1));
                let hi64 = _mm_unpackhi_epi64(sum128, sum128);
                let sum64 = _mm_add_epi32(hi64, sum128);
                let hi32 = _mm_shuffle_epi32(sum64, 0b10_11_00_01);
                let total = _mm_cvtsi128_si32(_mm_add_epi32(sum64, hi32));
                let sb = fp32_to_fp16(d * total as f32).to_le_bytes();
                *op.add(2) = sb[0];
                *op.add(3) = sb[1];
            }
            i0 = _mm256_packs_epi32(i0, i1);
            i2 = _mm256_packs_epi32(i2, i3);
            i0 = _mm256_packs_epi16(i0, i2);
            let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            i0 = _mm256_permutevar8x32_epi32(i0, perm);
            _mm256_storeu_si256(op.add(bs - 32) as *mut __m256i, i0);
        }
    }
}
