//! x86-64 kernels: the AVX2 tier (`avx2`), the AVX-VNNI tier (`avxvnni`), the AVX-512 tier
//! (`avx512`), and the AVX2 helpers
//! they share (ports of ggml's `hsum_float_8`, `mul_sum_i8_pairs_float`, ...).
use std::arch::x86_64::*;

pub mod avx2;
pub mod avx512;
pub mod avxvnni;

/// `hsum_float_8`.
#[inline(always)]
pub unsafe fn hsum_float_8(x: __m256) -> f32 {
    // SAFETY: register-only intrinsics; the caller runs with AVX2 enabled.
    unsafe {
        let mut res = _mm256_extractf128_ps(x, 1);
        res = _mm_add_ps(res, _mm256_castps256_ps128(x));
        res = _mm_add_ps(res, _mm_movehl_ps(res, res));
        res = _mm_add_ss(res, _mm_movehdup_ps(res));
        _mm_cvtss_f32(res)
    }
}

/// `mul_sum_i8_pairs_float`: signed·signed bytes, pairs summed twice, as 8 floats.
#[inline(always)]
pub unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    // SAFETY: register-only intrinsics; the caller runs with AVX2 enabled.
    unsafe {
        let ax = _mm256_sign_epi8(x, x);
        let sy = _mm256_sign_epi8(y, x);
        mul_sum_us8_pairs_float(ax, sy)
    }
}

/// `mul_sum_us8_pairs_float`: unsigned·signed bytes, pairs summed twice, as 8 floats.
#[inline(always)]
pub unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
    // SAFETY: register-only intrinsics; the caller runs with AVX2 enabled.
    unsafe {
        let dot = _mm256_maddubs_epi16(ax, sy);
        _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
    }
}

/// Q6_K's scale shuffles: row `i` picks scale bytes `2i` (lanes 0–7) and `2i + 1` (8–15),
/// as ggml's `get_scale_shuffle`.
pub const K6_SHUFFLE: [[u8; 16]; 8] = {
    let mut t = [[0u8; 16]; 8];
    let mut i = 0;
    while i < 8 {
        let mut b = 0;
        while b < 16 {
            t[i][b] = (2 * i + b / 8) as u8;
            b += 1;
        }
        i += 1;
    }
    t
};

/// The largest `|v|` of `x` (a multiple of 8 values) and whether `x` holds a NaN; without
/// NaNs the maximum is exact whatever the order. NaNs are skipped.
#[inline(always)]
pub unsafe fn absmax(x: &[f32]) -> (f32, bool) {
    // SAFETY: reads within `x`; AVX enabled by the caller.
    unsafe {
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_setzero_ps();
        let mut nan = _mm256_setzero_ps();
        for c in x.chunks_exact(8) {
            let v = _mm256_loadu_ps(c.as_ptr());
            // `max(a, m)` returns `m` when `a` is NaN.
            m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_movehdup_ps(h));
        (_mm_cvtss_f32(h), _mm256_movemask_ps(nan) != 0)
    }
}

/// The largest of `x` (at least `-inf`), and whether `x` holds a NaN (then the caller's
/// order-dependent scalar scan decides).
///
/// # Safety
/// AVX present.
#[inline(always)]
pub unsafe fn max_f32(x: &[f32]) -> (f32, bool) {
    // SAFETY: reads within `x`; AVX enabled by the caller.
    unsafe {
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut nan = _mm256_setzero_ps();
        let chunks = x.chunks_exact(8);
        let tail = chunks.remainder();
        for c in chunks {
            let v = _mm256_loadu_ps(c.as_ptr());
            m = _mm256_max_ps(v, m);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let h = _mm_max_ss(h, _mm_movehdup_ps(h));
        let mut best = _mm_cvtss_f32(h);
        let mut any_nan = _mm256_movemask_ps(nan) != 0;
        for &v in tail {
            any_nan |= v.is_nan();
            best = if best > v { best } else { v };
        }
        (best, any_nan)
    }
}

/// Q6_K scales `2i` and `2i + 1` of the 16 in `scales`, each in 8 i16 lanes.
#[inline(always)]
pub unsafe fn q6k_scale_shuffle(scales: __m128i, i: usize) -> __m256i {
    // SAFETY: reads row `i` of the table (`i < 8`, checked by the index); AVX2 enabled by
    // the caller.
    unsafe {
        _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
            scales,
            _mm_loadu_si128(K6_SHUFFLE[i].as_ptr() as *const __m128i),
        ))
    }
}

/// `bytes_from_nibbles_32`: low nibbles of 16 bytes, then their high nibbles.
#[inline(always)]
pub unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
    // SAFETY: the caller passes 16 readable bytes and runs with AVX2 enabled.
    unsafe {
        let tmp = _mm_loadu_si128(p as *const __m128i);
        let bytes = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
        _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
    }
}

/// `bytes_from_bits_32`: byte `b` is 0xFF when bit `b` of the 32 bits is set.
#[inline(always)]
pub unsafe fn bytes_from_bits_32(x32: u32) -> __m256i {
    // SAFETY: register-only intrinsics; the caller runs with AVX2 enabled.
    unsafe {
        let shuf_mask = _mm256_set_epi64x(
            0x0303030303030303,
            0x0202020202020202,
            0x0101010101010101,
            0x0000000000000000,
        );
        let mut bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf_mask);
        let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
        bytes = _mm256_or_si256(bytes, bit_mask);
        _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
    }
}
