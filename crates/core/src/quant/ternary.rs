//! The ternary formats TQ1_0 and TQ2_0 (BitNet b1.58 and TriLMs): ggml's
//! `quantize_row_tq1_0_ref`, `quantize_row_tq2_0_ref` and the dequantizers.

use super::blocks::{BlockTQ1_0, BlockTQ2_0, QK_K};
use super::float::{f16_to_f32, f32_to_f16};

/// Bytes of `qs` in a TQ1_0 block (48: 32 + 16) and of `qh` (4).
const TQ1_QS: usize = (QK_K - 4 * QK_K / 64) / 5;
const TQ1_QH: usize = QK_K / 64;

/// Powers of 3 as ggml's `pow3` table (u8).
pub(crate) const POW3: [u8; 6] = [1, 3, 9, 27, 81, 243];

/// C's `lroundf` on x86-64 glibc, as `long`: round half away from zero, and `LONG_MIN` (the
/// "integer indefinite" of `cvttss2si`) for NaN, infinities and values out of range.
#[inline]
fn lroundf(v: f32) -> i64 {
    if v.is_finite() && v.abs() < 9_223_372_036_854_775_808.0 {
        v.round() as i64
    } else {
        i64::MIN
    }
}

/// `int xi = lroundf(v) + 1;`: the `long` sum converted to `int` (GCC truncates).
#[inline]
fn trit(v: f32) -> i32 {
    lroundf(v).wrapping_add(1) as i32
}

/// ggml's `MAX(a, b)` (`a > b ? a : b`), which keeps `b` when either is NaN.
#[inline]
fn c_max(a: f32, b: f32) -> f32 {
    if a > b { a } else { b }
}

/// The absolute maximum of `x` and its reciprocal (0 for an all-zero block), as ggml's TQ
/// quantizers compute them.
#[inline]
fn amax_and_inverse(x: &[f32]) -> (f32, f32) {
    let mut amax = 0.0f32;
    for &v in x {
        amax = c_max(amax, v.abs());
    }
    let id = if amax != 0.0 { 1.0 / amax } else { 0.0 };
    (amax, id)
}

/// Packs trits as a base-3 fraction of 256, rounding up: `(q * 256 + 242) / 243`.
#[inline]
fn pack_trits(q: u8) -> u8 {
    (u32::from(q) * 256).div_ceil(243) as u8
}

/// `quantize_row_tq1_0_ref`.
pub fn quantize_row_tq1_0(x: &[f32], y: &mut [BlockTQ1_0]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (d, id) = amax_and_inverse(xb);
        yb.d = f32_to_f16(d);
        let mut pos = 0;
        // 5 elements per byte, along 32 bytes, then along 16.
        for (start, width) in [(0usize, 32usize), (32, 16)] {
            for m in 0..width {
                let mut q = 0u8;
                for n in 0..5 {
                    let xi = trit(xb[pos + m + n * width] * id);
                    q = q.wrapping_mul(3);
                    q = (i32::from(q).wrapping_add(xi)) as u8;
                }
                yb.qs[start + m] = pack_trits(q);
            }
            pos += 5 * width;
        }
        // 4 elements per byte, the first value in the most significant trit.
        for j in 0..TQ1_QH {
            let mut q = 0u8;
            for m in 0..4 {
                let xi = trit(xb[pos + j + m * TQ1_QH] * id);
                q = q.wrapping_mul(3);
                q = (i32::from(q).wrapping_add(xi)) as u8;
            }
            q = q.wrapping_mul(3);
            yb.qh[j] = pack_trits(q);
        }
    }
}

/// `quantize_row_tq2_0_ref`.
pub fn quantize_row_tq2_0(x: &[f32], y: &mut [BlockTQ2_0]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (d, id) = amax_and_inverse(xb);
        yb.d = f32_to_f16(d);
        for j in (0..QK_K / 4).step_by(32) {
            let xs = &xb[4 * j..4 * j + 128];
            for m in 0..32 {
                let mut q = 0u8;
                for n in 0..4 {
                    let xi = trit(xs[m + n * 32] * id);
                    q = q.wrapping_add(((xi & 3) << (2 * n)) as u8);
                }
                yb.qs[j + m] = q;
            }
        }
    }
}

/// The trit a TQ1_0 byte holds at position `n` (0 = most significant): `((q * 3^n) mod 256
/// * 3) >> 8`, in 0..=2.
#[inline]
pub fn tq1_trit(q: u8, n: usize) -> i32 {
    let q = q.wrapping_mul(POW3[n]);
    ((u16::from(q) * 3) >> 8) as i32
}

/// The 256 ternary values (0, 1, 2 for -1, 0, +1) of a TQ1_0 block, in element order.
#[inline]
pub fn tq1_0_trits(b: &BlockTQ1_0) -> [i8; QK_K] {
    let mut out = [0i8; QK_K];
    let mut k = 0;
    for (start, width) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for m in 0..width {
                out[k] = tq1_trit(b.qs[start + m], n) as i8;
                k += 1;
            }
        }
    }
    for n in 0..4 {
        for j in 0..TQ1_QH {
            out[k] = tq1_trit(b.qh[j], n) as i8;
            k += 1;
        }
    }
    debug_assert_eq!(k, QK_K);
    debug_assert_eq!(TQ1_QS, 48);
    out
}

/// The 256 2-bit values (0..=3, value + 1) of a TQ2_0 block, in element order.
#[inline]
pub fn tq2_0_values(b: &BlockTQ2_0) -> [u8; QK_K] {
    let mut out = [0u8; QK_K];
    for j in (0..QK_K / 4).step_by(32) {
        for l in 0..4 {
            for m in 0..32 {
                out[4 * j + 32 * l + m] = (b.qs[j + m] >> (2 * l)) & 3;
            }
        }
    }
    out
}

/// `dequantize_row_tq1_0`.
pub fn dequantize_row_tq1_0(x: &[BlockTQ1_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for (o, t) in yb.iter_mut().zip(tq1_0_trits(xb)) {
            *o = (i32::from(t) - 1) as f32 * d;
        }
    }
}

/// `dequantize_row_tq2_0`.
pub fn dequantize_row_tq2_0(x: &[BlockTQ2_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for (o, q) in yb.iter_mut().zip(tq2_0_values(xb)) {
            *o = (i32::from(q) - 1) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trits_round_trip() {
        let mut x = [0f32; QK_K];
        for (i, v) in x.iter_mut().enumerate() {
            *v = [(-1.5f32), 0.0, 1.5][(i * 7 + i / 3) % 3];
        }
        let mut q1 = [bytemuck::Zeroable::zeroed(); 1];
        quantize_row_tq1_0(&x, &mut q1);
        let mut q2 = [bytemuck::Zeroable::zeroed(); 1];
        quantize_row_tq2_0(&x, &mut q2);
        let mut a = [0f32; QK_K];
        let mut b = [0f32; QK_K];
        dequantize_row_tq1_0(&q1, &mut a);
        dequantize_row_tq2_0(&q2, &mut b);
        assert_eq!(a, x);
        assert_eq!(b, x);
    }

    #[test]
    fn lroundf_matches_c() {
        assert_eq!(lroundf(0.5), 1);
        assert_eq!(lroundf(-0.5), -1);
        assert_eq!(lroundf(0.49999997), 0);
        assert_eq!(lroundf(f32::NAN), i64::MIN);
        assert_eq!(lroundf(f32::INFINITY), i64::MIN);
        assert_eq!(trit(f32::NAN), 1);
    }
}
