//! The 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 (`ggml-quants.c`).
//!
//! Quantizers are ggml's `quantize_row_*_ref`; for Q8_0/Q8_1 these are also what ggml-cpu's
//! generic `quantize_row_q8_0/q8_1` run to quantize activations. Each function handles as many
//! whole blocks as both slices hold.

use super::blocks::*;
use super::float::{f16_to_f32, f32_to_f16};

/// `quantize_row_q4_0_ref`.
pub fn quantize_row_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    for (xb, yb) in x.chunks_exact(QK4_0).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -8.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        for j in 0..QK4_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK4_0 / 2 + j] * id;
            let xi0 = ((x0 + 8.5) as i8).min(15) as u8;
            let xi1 = ((x1 + 8.5) as i8).min(15) as u8;
            yb.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

/// `quantize_row_q4_1_ref`.
pub fn quantize_row_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    for (xb, yb) in x.chunks_exact(QK4_1).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        yb.m = f32_to_f16(min);
        for j in 0..QK4_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK4_1 / 2 + j] - min) * id;
            let xi0 = ((x0 + 0.5) as i8).min(15) as u8;
            let xi1 = ((x1 + 0.5) as i8).min(15) as u8;
            yb.qs[j] = xi0 | (xi1 << 4);
        }
    }
}

/// `quantize_row_q5_0_ref`.
pub fn quantize_row_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    for (xb, yb) in x.chunks_exact(QK5_0).zip(y.iter_mut()) {
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            if amax < v.abs() {
                amax = v.abs();
                max = v;
            }
        }
        let d = max / -16.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        let mut qh = 0u32;
        for j in 0..QK5_0 / 2 {
            let x0 = xb[j] * id;
            let x1 = xb[QK5_0 / 2 + j] * id;
            let xi0 = ((x0 + 16.5) as i8).min(31) as u8;
            let xi1 = ((x1 + 16.5) as i8).min(31) as u8;
            yb.qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK5_0 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// `quantize_row_q5_1_ref`.
pub fn quantize_row_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    for (xb, yb) in x.chunks_exact(QK5_1).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        yb.m = f32_to_f16(min);
        let mut qh = 0u32;
        for j in 0..QK5_1 / 2 {
            let x0 = (xb[j] - min) * id;
            let x1 = (xb[QK5_1 / 2 + j] - min) * id;
            let xi0 = (x0 + 0.5) as u8;
            let xi1 = (x1 + 0.5) as u8;
            yb.qs[j] = (xi0 & 0x0F) | ((xi1 & 0x0F) << 4);
            qh |= (((xi0 & 0x10) >> 4) as u32) << j;
            qh |= (((xi1 & 0x10) >> 4) as u32) << (j + QK5_1 / 2);
        }
        yb.qh = qh.to_le_bytes();
    }
}

/// `quantize_row_q8_0_ref` (= ggml-cpu's generic `quantize_row_q8_0`).
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let amax = xb
            .iter()
            .fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        for (q, &v) in yb.qs.iter_mut().zip(xb) {
            *q = (v * id).round() as i8;
        }
    }
}

/// `quantize_row_q8_1_ref` (= ggml-cpu's generic `quantize_row_q8_1`); `s` is the f16 of
/// `d * Σq` with the unrounded f32 `d`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(QK8_1).zip(y.iter_mut()) {
        let amax = xb
            .iter()
            .fold(0.0f32, |a, v| if a > v.abs() { a } else { v.abs() });
        let d = amax / 127.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        yb.d = f32_to_f16(d);
        let mut sum = 0i32;
        for j in 0..QK8_1 / 2 {
            let v0 = xb[j] * id;
            let v1 = xb[QK8_1 / 2 + j] * id;
            yb.qs[j] = v0.round() as i8;
            yb.qs[QK8_1 / 2 + j] = v1.round() as i8;
            sum += yb.qs[j] as i32 + yb.qs[QK8_1 / 2 + j] as i32;
        }
        yb.s = f32_to_f16(sum as f32 * d);
    }
}

/// Minimum and maximum as ggml's Q4_1/Q5_1 quantizers find them.
fn min_max(xb: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in xb {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// `dequantize_row_q4_0`.
pub fn dequantize_row_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_0)) {
        let d = f16_to_f32(xb.d);
        for j in 0..QK4_0 / 2 {
            let x0 = (xb.qs[j] & 0x0F) as i32 - 8;
            let x1 = (xb.qs[j] >> 4) as i32 - 8;
            yb[j] = x0 as f32 * d;
            yb[j + QK4_0 / 2] = x1 as f32 * d;
        }
    }
}

/// `dequantize_row_q4_1`.
pub fn dequantize_row_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_1)) {
        let d = f16_to_f32(xb.d);
        let m = f16_to_f32(xb.m);
        for j in 0..QK4_1 / 2 {
            let x0 = (xb.qs[j] & 0x0F) as f32;
            let x1 = (xb.qs[j] >> 4) as f32;
            yb[j] = x0 * d + m;
            yb[j + QK4_1 / 2] = x1 * d + m;
        }
    }
}

/// `dequantize_row_q5_0`.
pub fn dequantize_row_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_0)) {
        let d = f16_to_f32(xb.d);
        let qh = u32::from_le_bytes(xb.qh);
        for j in 0..QK5_0 / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((xb.qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as i32 - 16;
            yb[j] = x0 as f32 * d;
            yb[j + QK5_0 / 2] = x1 as f32 * d;
        }
    }
}

/// `dequantize_row_q5_1`.
pub fn dequantize_row_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK5_1)) {
        let d = f16_to_f32(xb.d);
        let m = f16_to_f32(xb.m);
        let qh = u32::from_le_bytes(xb.qh);
        for j in 0..QK5_1 / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((xb.qs[j] & 0x0F) | xh_0) as f32;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as f32;
            yb[j] = x0 * d + m;
            yb[j + QK5_1 / 2] = x1 * d + m;
        }
    }
}

/// `dequantize_row_q8_0`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = f16_to_f32(xb.d);
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Q8_1 to f32 (ggml has no `dequantize_row_q8_1`; this is value = q * d, like Q8_0).
pub fn dequantize_row_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_1)) {
        let d = f16_to_f32(xb.d);
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = q as f32 * d;
        }
    }
}
