//! Scalar dot products of a weight row against an activation row quantized to the weight type's
//! `vec_dot_type`, with ggml-cpu's generic (non-SIMD) arithmetic order (`ggml-cpu/quants.c`,
//! `vec.cpp`), so SIMD kernels can be checked against them.
//!
//! Each function pairs blocks up to the shorter of its two slices.

use half::{bf16, f16};

use super::blocks::*;
use super::float::{bf16_to_f32, f16_to_f32};
use super::iq4::iq4_xs_scale;
use super::kquants::{get_scale_min_k4, q3_k_scales};
use super::lowbit::q2_0_value;
use super::mxfp4::ue4m3_to_fp32;
use super::ternary::{tq1_0_trits, tq2_0_values};

/// `ggml_vec_dot_f32` (scalar): f32 products summed in f64.
pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let mut sumf = 0.0f64;
    for (&a, &b) in x.iter().zip(y) {
        sumf += (a * b) as f64;
    }
    sumf as f32
}

/// `ggml_vec_dot_f16` (scalar): f32 products of the widened values summed in f64.
pub fn vec_dot_f16(x: &[f16], y: &[f16]) -> f32 {
    let mut sumf = 0.0f64;
    for (&a, &b) in x.iter().zip(y) {
        sumf += (f16_to_f32(a) * f16_to_f32(b)) as f64;
    }
    sumf as f32
}

/// `ggml_vec_dot_bf16` (scalar): f32 products of the widened values summed in f64.
pub fn vec_dot_bf16(x: &[bf16], y: &[bf16]) -> f32 {
    let mut sumf = 0.0f64;
    for (&a, &b) in x.iter().zip(y) {
        sumf += (bf16_to_f32(a) * bf16_to_f32(b)) as f64;
    }
    sumf as f32
}

/// `ggml_vec_dot_q4_0_q8_0_generic`.
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK8_0 / 2 {
            let v0 = (xb.qs[j] & 0x0F) as i32 - 8;
            let v1 = (xb.qs[j] >> 4) as i32 - 8;
            sumi0 += v0 * yb.qs[j] as i32;
            sumi1 += v1 * yb.qs[j + QK8_0 / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += sumi as f32 * f16_to_f32(xb.d) * f16_to_f32(yb.d);
    }
    sumf
}

/// `ggml_vec_dot_q4_1_q8_1_generic`.
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK8_1 / 2 {
            let v0 = (xb.qs[j] & 0x0F) as i32;
            let v1 = (xb.qs[j] >> 4) as i32;
            sumi0 += v0 * yb.qs[j] as i32;
            sumi1 += v1 * yb.qs[j + QK8_1 / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32
            + f16_to_f32(xb.m) * f16_to_f32(yb.s);
    }
    sumf
}

/// `ggml_vec_dot_q5_0_q8_0_generic`.
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let qh = u32::from_le_bytes(xb.qh);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK8_0 / 2 {
            let xh_0 = (((qh >> j) & 1) << 4) as u8;
            let xh_1 = (((qh >> (j + 16)) & 1) << 4) as u8;
            let x0 = ((xb.qs[j] & 0x0F) | xh_0) as i32 - 16;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as i32 - 16;
            sumi0 += x0 * yb.qs[j] as i32;
            sumi1 += x1 * yb.qs[j + QK8_0 / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32;
    }
    sumf
}

/// `ggml_vec_dot_q5_1_q8_1_generic`.
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let qh = u32::from_le_bytes(xb.qh);
        let mut sumi0 = 0i32;
        let mut sumi1 = 0i32;
        for j in 0..QK8_1 / 2 {
            let xh_0 = (((qh >> j) << 4) & 0x10) as u8;
            let xh_1 = ((qh >> (j + 12)) & 0x10) as u8;
            let x0 = ((xb.qs[j] & 0xF) | xh_0) as i32;
            let x1 = ((xb.qs[j] >> 4) | xh_1) as i32;
            sumi0 += x0 * yb.qs[j] as i32;
            sumi1 += x1 * yb.qs[j + QK8_1 / 2] as i32;
        }
        let sumi = sumi0 + sumi1;
        sumf += (f16_to_f32(xb.d) * f16_to_f32(yb.d)) * sumi as f32
            + f16_to_f32(xb.m) * f16_to_f32(yb.s);
    }
    sumf
}

/// `ggml_vec_dot_q8_0_q8_0_generic`.
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for (&a, &b) in xb.qs.iter().zip(&yb.qs) {
            sumi += a as i32 * b as i32;
        }
        sumf += sumi as f32 * (f16_to_f32(xb.d) * f16_to_f32(yb.d));
    }
    sumf
}

/// `ggml_vec_dot_iq4_nl_q8_0_generic`.
pub fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(yb.d) * f16_to_f32(xb.d);
        let mut sumi1 = 0i32;
        let mut sumi2 = 0i32;
        for j in 0..QK4_NL / 2 {
            sumi1 += yb.qs[j] as i32 * KVALUES_IQ4NL[(xb.qs[j] & 0xf) as usize] as i32;
            sumi2 += yb.qs[j + QK4_NL / 2] as i32 * KVALUES_IQ4NL[(xb.qs[j] >> 4) as usize] as i32;
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}

/// `ggml_vec_dot_mxfp4_q8_0_generic`.
pub fn vec_dot_mxfp4_q8_0(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(yb.d) * super::e8m0_to_fp32_half(xb.e);
        let mut sumi1 = 0i32;
        let mut sumi2 = 0i32;
        for j in 0..QK_MXFP4 / 2 {
            sumi1 += yb.qs[j] as i32 * KVALUES_MXFP4[(xb.qs[j] & 0xf) as usize] as i32;
            sumi2 +=
                yb.qs[j + QK_MXFP4 / 2] as i32 * KVALUES_MXFP4[(xb.qs[j] >> 4) as usize] as i32;
        }
        sumf += d * (sumi1 + sumi2) as f32;
    }
    sumf
}

/// `ggml_vec_dot_q2_K_q8_K_generic`.
pub fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sc = &xb.scales;
        let mut summs = 0i32;
        for j in 0..16 {
            summs += yb.bsums[j] as i32 * (sc[j] >> 4) as i32;
        }
        let dall = yb.d * f16_to_f32(xb.d);
        let dmin = yb.d * f16_to_f32(xb.dmin);
        let mut isum = 0i32;
        let mut is = 0;
        let mut q8 = 0;
        for k in 0..QK_K / 128 {
            let q2 = &xb.qs[32 * k..32 * k + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let d = (sc[is] & 0xF) as i32;
                    is += 1;
                    let mut isuml = 0i32;
                    for l in 16 * half..16 * half + 16 {
                        isuml += yb.qs[q8 + l] as i32 * ((q2[l] >> shift) & 3) as i32;
                    }
                    isum += d * isuml;
                }
                q8 += 32;
            }
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// The per-lane integer accumulation shared by ggml's generic Q3_K…Q6_K dot products: element
/// `e` of the super-block goes to lane `e % 8`, weighted by the scale of its group of `group`.
#[inline]
fn lanes_accumulate(
    a: &[i8; QK_K],
    q8: &[i8; QK_K],
    scale: impl Fn(usize) -> i32,
    group: usize,
) -> [i32; 8] {
    let mut aux32 = [0i32; 8];
    for (g, (ag, qg)) in a
        .chunks_exact(group)
        .zip(q8.chunks_exact(group))
        .enumerate()
    {
        let s = scale(g);
        for (a8, q8c) in ag.chunks_exact(8).zip(qg.chunks_exact(8)) {
            for l in 0..8 {
                // ggml keeps the product in an int16, which it always fits.
                let p = (q8c[l] as i32 * a8[l] as i32) as i16;
                aux32[l] += s * p as i32;
            }
        }
    }
    aux32
}

/// `ggml_vec_dot_q3_K_q8_K_generic`.
pub fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut sums = [0f32; 8];
    for (xb, yb) in x.iter().zip(y) {
        let mut a = [0i8; QK_K];
        let mut m = 1u8;
        let mut ai = 0;
        for k in 0..QK_K / 128 {
            let q3 = &xb.qs[32 * k..32 * k + 32];
            for shift in [0, 2, 4, 6] {
                for l in 0..32 {
                    let low = ((q3[l] >> shift) & 3) as i8;
                    a[ai + l] = low - if xb.hmask[l] & m != 0 { 0 } else { 4 };
                }
                ai += 32;
                m <<= 1;
            }
        }
        let scales = q3_k_scales(&xb.scales);
        let aux32 = lanes_accumulate(&a, &yb.qs, |g| scales[g] as i32, 16);
        let d = f16_to_f32(xb.d) * yb.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0.0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// Scales and mins of a Q4_K/Q5_K block in ggml's `utmp` order.
#[inline]
fn scales_mins_k4(scales: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = get_scale_min_k4(j, scales);
    }
    (sc, mn)
}

/// `ggml_vec_dot_q4_K_q8_K_generic`.
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut sums = [0f32; 8];
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut a = [0i8; QK_K];
        for k in 0..QK_K / 64 {
            let q4 = &xb.qs[32 * k..32 * k + 32];
            for l in 0..32 {
                a[64 * k + l] = (q4[l] & 0xF) as i8;
                a[64 * k + 32 + l] = (q4[l] >> 4) as i8;
            }
        }
        let (scales, mins) = scales_mins_k4(&xb.scales);
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            sumi += yb.bsums[j] as i32 * mins[j / 2] as i32;
        }
        let aux32 = lanes_accumulate(&a, &yb.qs, |g| scales[g] as i32, 32);
        let d = f16_to_f32(xb.d) * yb.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = f16_to_f32(xb.dmin) * yb.d;
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// `ggml_vec_dot_q5_K_q8_K_generic`.
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut sums = [0f32; 8];
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut a = [0i8; QK_K];
        let mut m = 1u8;
        for k in 0..QK_K / 64 {
            let q4 = &xb.qs[32 * k..32 * k + 32];
            for l in 0..32 {
                a[64 * k + l] = (q4[l] & 0xF) as i8 + if xb.qh[l] & m != 0 { 16 } else { 0 };
            }
            m <<= 1;
            for l in 0..32 {
                a[64 * k + 32 + l] = (q4[l] >> 4) as i8 + if xb.qh[l] & m != 0 { 16 } else { 0 };
            }
            m <<= 1;
        }
        let (scales, mins) = scales_mins_k4(&xb.scales);
        let mut sumi = 0i32;
        for j in 0..QK_K / 16 {
            sumi += yb.bsums[j] as i32 * mins[j / 2] as i32;
        }
        let aux32 = lanes_accumulate(&a, &yb.qs, |g| scales[g] as i32, 32);
        let d = f16_to_f32(xb.d) * yb.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
        let dmin = f16_to_f32(xb.dmin) * yb.d;
        sumf -= dmin * sumi as f32;
    }
    for s in sums {
        sumf += s;
    }
    sumf
}

/// `ggml_vec_dot_q6_K_q8_K_generic`.
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut sums = [0f32; 8];
    for (xb, yb) in x.iter().zip(y) {
        let mut a = [0i8; QK_K];
        for k in 0..QK_K / 128 {
            let ql = &xb.ql[64 * k..64 * k + 64];
            let qh = &xb.qh[32 * k..32 * k + 32];
            let a = &mut a[128 * k..128 * k + 128];
            for l in 0..32 {
                a[l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                a[l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                a[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                a[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        let aux32 = lanes_accumulate(&a, &yb.qs, |g| xb.scales[g] as i32, 16);
        let d = f16_to_f32(xb.d) * yb.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    let mut sumf = 0.0f32;
    for s in sums {
        sumf += s;
    }
    sumf
}

/// `ggml_vec_dot_iq4_xs_q8_K_generic`.
pub fn vec_dot_iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d4d8 = f16_to_f32(xb.d) * yb.d;
        for ib in 0..QK_K / 32 {
            let dl = d4d8 * (iq4_xs_scale(xb, ib) - 32) as f32;
            let qs = &xb.qs[16 * ib..16 * ib + 16];
            let q8 = &yb.qs[32 * ib..32 * ib + 32];
            let mut sumi1 = 0i32;
            let mut sumi2 = 0i32;
            for j in 0..16 {
                sumi1 += q8[j] as i32 * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as i32;
                sumi2 += q8[j + 16] as i32 * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as i32;
            }
            sumf += dl * (sumi1 + sumi2) as f32;
        }
    }
    sumf
}

/// `ggml_vec_dot_tq1_0_q8_K_generic`.
pub fn vec_dot_tq1_0_q8_k(x: &[BlockTQ1_0], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sum = 0i32;
        for (&t, &q) in tq1_0_trits(xb).iter().zip(&yb.qs) {
            sum += (i32::from(t) - 1) * i32::from(q);
        }
        sumf += sum as f32 * (f16_to_f32(xb.d) * yb.d);
    }
    sumf
}

/// `ggml_vec_dot_tq2_0_q8_K_generic`.
pub fn vec_dot_tq2_0_q8_k(x: &[BlockTQ2_0], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = 0i32;
        for (&v, &q) in tq2_0_values(xb).iter().zip(&yb.qs) {
            sumi += i32::from(q) * (i32::from(v) - 1);
        }
        let d = yb.d * f16_to_f32(xb.d);
        sumf += sumi as f32 * d;
    }
    sumf
}

/// `ggml_vec_dot_nvfp4_q8_0_generic`: one NVFP4 block against two Q8_0 blocks, one f32 term
/// per sub-block of 16.
pub fn vec_dot_nvfp4_q8_0(x: &[BlockNVFP4], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y.chunks_exact(2)) {
        for s in 0..4 {
            let d = ue4m3_to_fp32(xb.d[s]);
            let y8 = &yb[s / 2];
            let off = (s % 2) * QK_NVFP4_SUB;
            let dy = f16_to_f32(y8.d);
            let mut sumi_lo = 0i32;
            let mut sumi_hi = 0i32;
            for j in 0..QK_NVFP4_SUB / 2 {
                let qv = xb.qs[s * (QK_NVFP4_SUB / 2) + j];
                sumi_lo += y8.qs[off + j] as i32 * KVALUES_MXFP4[(qv & 0xf) as usize] as i32;
                sumi_hi += y8.qs[off + j + QK_NVFP4_SUB / 2] as i32
                    * KVALUES_MXFP4[(qv >> 4) as usize] as i32;
            }
            sumf += dy * d * (sumi_lo + sumi_hi) as f32;
        }
    }
    sumf
}

/// `ggml_vec_dot_q1_0_q8_0_generic`: one Q1_0 block against four Q8_0 blocks.
pub fn vec_dot_q1_0_q8_0(x: &[BlockQ1_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y.chunks_exact(4)) {
        let d0 = f16_to_f32(xb.d);
        let mut sumi = 0.0f32;
        for (k, y8) in yb.iter().enumerate() {
            let d1 = f16_to_f32(y8.d);
            let mut sumi_block = 0i32;
            for (p, &q) in y8.qs.iter().enumerate() {
                let bit = (xb.qs[4 * k + p / 8] >> (p % 8)) & 1;
                sumi_block += if bit != 0 { q as i32 } else { -(q as i32) };
            }
            sumi += d1 * sumi_block as f32;
        }
        sumf += d0 * sumi;
    }
    sumf
}

/// `ggml_vec_dot_q2_0_q8_0_generic`: one Q2_0 block against two Q8_0 blocks.
pub fn vec_dot_q2_0_q8_0(x: &[BlockQ2_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y.chunks_exact(2)) {
        let d0 = f16_to_f32(xb.d);
        let mut sumi = 0.0f32;
        for (k, y8) in yb.iter().enumerate() {
            let d1 = f16_to_f32(y8.d);
            let mut sumi_block = 0i32;
            for (p, &q) in y8.qs.iter().enumerate() {
                sumi_block += (i32::from(q2_0_value(xb, 32 * k + p)) - 1) * q as i32;
            }
            sumi += d1 * sumi_block as f32;
        }
        sumf += d0 * sumi;
    }
    sumf
}
