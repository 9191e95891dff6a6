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
