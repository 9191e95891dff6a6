//! Activation quantizers as ggml-cpu runs them on x86: `quantize_row_q8_0` and
//! `quantize_row_q8_1` (AVX2 code in `arch/x86/quants.c`: `d = amax/127` stored as f16,
//! multiplier `id = 127/amax` (not `1/d`), round-half-to-even with `_mm256_round_ps`), and
//! `quantize_row_q8_K`, which on x86 is `quantize_row_q8_K_ref` (ggml-base, built without FMA:
//! `nearest_int(iscale*x)` with a separately rounded product).

use lamina_core::DType;

use super::fp32_to_fp16;

/// Bytes of one Q8_0 block (f16 scale + 32 quants).
pub const Q8_0_BLOCK: usize = 34;
/// Bytes of one Q8_1 block (f16 scale, f16 `d*Σq`, 32 quants).
pub const Q8_1_BLOCK: usize = 36;
/// Bytes of one Q8_K block (f32 scale, 256 quants, 16 i16 sums).
pub const Q8_K_BLOCK: usize = 292;

/// `_mm256_cvtps_epi32` of an already integral value, then the saturating packs to i8.
#[inline(always)]
fn cvt_pack_i8(v: f32) -> (i32, i8) {
    // x86 turns NaN and out-of-range values into i32::MIN.
    let i = if (-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        v as i32
    } else {
        i32::MIN
    };
    (i, i.clamp(-128, 127) as i8)
}

/// One 32-value block: `(d, id)` of ggml's AVX2 quantizer.
#[inline(always)]
fn block_scale(x: &[f32]) -> (f32, f32) {
    // `_mm256_max_ps` keeps the second operand on unordered compares; for numbers this is max.
    let mut amax = 0f32;
    for &v in x {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    (d, id)
}

fn quantize_q8_scalar(x: &[f32], out: &mut [u8], with_sum: bool) {
    let bs = if with_sum { Q8_1_BLOCK } else { Q8_0_BLOCK };
    let qo = bs - 32;
    for (xb, ob) in x.chunks_exact(32).zip(out.chunks_exact_mut(bs)) {
        let (d, id) = block_scale(xb);
        ob[0..2].copy_from_slice(&fp32_to_fp16(d).to_le_bytes());
        let mut sum = 0i32;
        for (o, &v) in ob[qo..].iter_mut().zip(xb) {
            let (i, q) = cvt_pack_i8((v * id).round_ties_even());
            sum = sum.wrapping_add(i);
            *o = q as u8;
        }
        if with_sum {
            ob[2..4].copy_from_slice(&fp32_to_fp16(d * sum as f32).to_le_bytes());
        }
    }
}

/// The tier in use's conversion to `act` (Q8_0, Q8_1 or Q8_K).
fn convert(act: DType) -> super::table::ConvertFn {
    super::table()
        .convert(act)
        .expect("every kernel table quantizes to Q8_0, Q8_1 and Q8_K")
}

/// ggml-cpu's x86 `quantize_row_q8_0`: `x.len()` a multiple of 32, `out` 34 bytes per block.
pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
    convert(DType::Q8_0)(x, out)
}

/// ggml-cpu's x86 `quantize_row_q8_1` (adds `s = f16(d * Σq)`): 36 bytes per block.
pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
    convert(DType::Q8_1)(x, out)
}

/// `quantize_row_q8_K_ref` (what ggml-cpu's x86 `quantize_row_q8_K` calls): `x.len()` a
/// multiple of 256, `out` 292 bytes per block.
pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
    convert(DType::Q8_K)(x, out)
}

/// The lengths every Q8_0 (`with_sum` false) or Q8_1 quantizer checks before it writes.
pub(crate) fn check_q8(x: &[f32], out: &[u8], with_sum: bool) {
    let bs = if with_sum { Q8_1_BLOCK } else { Q8_0_BLOCK };
    assert!(x.len().is_multiple_of(32) && out.len() >= x.len() / 32 * bs);
}

/// The lengths every Q8_K quantizer checks before it writes.
pub(crate) fn check_q8_k(x: &[f32], out: &[u8]) {
    assert!(x.len().is_multiple_of(256) && out.len() >= x.len() / 256 * Q8_K_BLOCK);
}

/// Scalar emulation of [`quantize_row_q8_0`] (the scalar tier's, and the reference).
pub fn quantize_row_q8_0_scalar(x: &[f32], out: &mut [u8]) {
    check_q8(x, out, false);
    quantize_q8_scalar(x, out, false);
}

/// Scalar emulation of [`quantize_row_q8_1`].
pub fn quantize_row_q8_1_scalar(x: &[f32], out: &mut [u8]) {
    check_q8(x, out, true);
    quantize_q8_scalar(x, out, true);
}

/// Scalar emulation of [`quantize_row_q8_k`] (never compiled for AVX2).
pub fn quantize_row_q8_k_scalar(x: &[f32], out: &mut [u8]) {
    check_q8_k(x, out);
    quantize_q8_k_impl(x, out);
}

#[inline(always)]
fn quantize_q8_k_impl(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BLOCK)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        quantize_q8_k_block(xb, ob, amax, max);
    }
}

/// One Q8_K block of `quantize_row_q8_K_ref`, given the block's largest `|v|` and its first
/// element of that magnitude.
#[inline(always)]
pub(crate) fn quantize_q8_k_block(xb: &[f32], ob: &mut [u8], amax: f32, max: f32) {
    if amax == 0.0 {
        ob.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    let (d, rest) = ob.split_at_mut(4);
    let (qs, bsums) = rest.split_at_mut(256);
    for (q, &v) in qs.iter_mut().zip(xb) {
        // nearest_int: `fval + 1.5*2^23` rounds to nearest, ties to even.
        let p = iscale * v;
        let n = if p.abs() <= 4_194_303.0 {
            p.round_ties_even() as i32
        } else {
            ((p + 12_582_912.0).to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
        };
        *q = n.min(127) as i8 as u8;
    }
    q8_k_bsums(qs, bsums);
    d.copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

/// A Q8_K block's 16 sums of 16 quants each, as i16 (the block's `bsums`).
#[inline(always)]
pub(crate) fn q8_k_bsums(qs: &[u8], bsums: &mut [u8]) {
    for (j, s) in bsums.chunks_exact_mut(2).enumerate() {
        let sum: i32 = qs[j * 16..j * 16 + 16]
            .iter()
            .map(|&b| i32::from(b as i8))
            .sum();
        s.copy_from_slice(&(sum as i16).to_le_bytes());
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{Q8_0_BLOCK, Q8_1_BLOCK, Q8_K_BLOCK};
    use crate::kernels::fp32_to_fp16;
    use std::arch::x86_64::*;

    /// The AVX2 tier's `quantize_row_q8_0`.
    pub fn quantize_row_q8_0(x: &[f32], out: &mut [u8]) {
        super::check_q8(x, out, false);
        // SAFETY: reached only through the AVX2 and AVX-512 kernel tables, which exist only
        // where AVX2/FMA/F16C are present; lengths checked above.
        unsafe { quantize_q8(x, out, false) }
    }

    /// The AVX2 tier's `quantize_row_q8_1`.
    pub fn quantize_row_q8_1(x: &[f32], out: &mut [u8]) {
        super::check_q8(x, out, true);
        // SAFETY: as in `quantize_row_q8_0`.
        unsafe { quantize_q8(x, out, true) }
    }

    /// The AVX2 tier's `quantize_row_q8_K` (the reference's operations, with SSE4.1 rounding
    /// instead of a libm call and a vector search for the largest magnitude).
    pub fn quantize_row_q8_k(x: &[f32], out: &mut [u8]) {
        super::check_q8_k(x, out);
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn fast(x: &[f32], out: &mut [u8]) {
            for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(Q8_K_BLOCK)) {
                // SAFETY: AVX enabled here. The exact max of the non-NaN `|v|`, as the
                // scalar scan finds it; `max` is its first element, as there.
                let (amax, _) = unsafe { crate::kernels::x86::absmax(xb) };
                let max = xb.iter().copied().find(|v| v.abs() == amax).unwrap_or(0.0);
                super::quantize_q8_k_block(xb, ob, amax, max);
            }
        }
        // SAFETY: as in `quantize_row_q8_0`; the same operations as the scalar code (there is
        // no `mul_add` in it, so nothing is contracted).
        unsafe { fast(x, out) }
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
}
