//! The 1- and 2-bit formats Q1_0 (signs times the mean magnitude) and Q2_0 (levels -1, 0, 1, 2
//! times the absolute maximum): ggml's `quantize_row_q{1,2}_0_ref` and dequantizers.

use super::blocks::{BlockQ1_0, BlockQ2_0, QK1_0, QK2_0};
use super::float::{f16_to_f32, f32_to_f16};

/// `quantize_row_q1_0_ref`.
pub fn quantize_row_q1_0(x: &[f32], y: &mut [BlockQ1_0]) {
    for (xb, yb) in x.chunks_exact(QK1_0).zip(y.iter_mut()) {
        let mut sum_abs = 0.0f32;
        for &v in xb {
            sum_abs += v.abs();
        }
        yb.d = f32_to_f16(sum_abs / QK1_0 as f32);
        yb.qs = [0; QK1_0 / 8];
        for (j, &v) in xb.iter().enumerate() {
            if v >= 0.0 {
                yb.qs[j / 8] |= 1 << (j % 8);
            }
        }
    }
}

/// `dequantize_row_q1_0`.
pub fn dequantize_row_q1_0(x: &[BlockQ1_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK1_0)) {
        let d = f16_to_f32(xb.d);
        for (j, o) in yb.iter_mut().enumerate() {
            *o = if (xb.qs[j / 8] >> (j % 8)) & 1 != 0 {
                d
            } else {
                -d
            };
        }
    }
}

/// C's `(int)` of a float on x86-64 (`cvttss2si`): truncation, and `INT_MIN` for NaN and
/// values out of range.
#[inline]
fn c_int(v: f32) -> i32 {
    if v.is_finite() && (-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        v as i32
    } else {
        i32::MIN
    }
}

/// `quantize_row_q2_0_ref`.
pub fn quantize_row_q2_0(x: &[f32], y: &mut [BlockQ2_0]) {
    for (xb, yb) in x.chunks_exact(QK2_0).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        for &v in xb {
            if v.abs() > amax {
                amax = v.abs();
            }
        }
        let d = amax;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        yb.qs = [0; QK2_0 / 4];
        for (j, &w) in xb.iter().enumerate() {
            // `(int)roundf(w * id) + 1`, clamped to 0..=3.
            let q = c_int((w * id).round()).wrapping_add(1).clamp(0, 3);
            yb.qs[j / 4] |= (q as u8) << ((j % 4) * 2);
        }
    }
}

/// The 2-bit value (0..=3) of element `j` of a Q2_0 block.
#[inline]
pub fn q2_0_value(b: &BlockQ2_0, j: usize) -> u8 {
    (b.qs[j / 4] >> ((j % 4) * 2)) & 3
}

/// `dequantize_row_q2_0`.
pub fn dequantize_row_q2_0(x: &[BlockQ2_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK2_0)) {
        let d = f16_to_f32(xb.d);
        for (j, o) in yb.iter_mut().enumerate() {
            *o = (i32::from(q2_0_value(xb, j)) - 1) as f32 * d;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_round_trip() {
        // The quantizer's scale is the absolute maximum, so level 2 (2d) is never chosen.
        let x: Vec<f32> = (0..QK1_0)
            .map(|i| [-2.0f32, 0.0, 2.0, 1.5][i % 4])
            .collect();
        let mut q2 = [bytemuck::Zeroable::zeroed(); 2];
        quantize_row_q2_0(&x, &mut q2);
        let mut back = vec![0f32; QK1_0];
        dequantize_row_q2_0(&q2, &mut back);
        let want: Vec<f32> = x.iter().map(|&v| if v == 1.5 { 2.0 } else { v }).collect();
        assert_eq!(back, want);
        let mut q1 = [bytemuck::Zeroable::zeroed(); 1];
        quantize_row_q1_0(&x, &mut q1);
        dequantize_row_q1_0(&q1, &mut back);
        // mean |x| = 1.375; zero counts as positive
        for (b, v) in back.iter().zip(&x) {
            assert_eq!(*b, if *v >= 0.0 { 1.375 } else { -1.375 });
        }
        assert_eq!(c_int(f32::NAN), i32::MIN);
        assert_eq!(c_int(-2.7), -2);
    }
}
