//! The grid i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M: ggml's
//! `dequantize_row_iq*` (`ggml-quants.c`) and `ggml_vec_dot_iq*_q8_K_generic`
//! (`ggml-cpu/quants.c`), with the per-32-element unpacking shared with the SIMD kernels.

use super::blocks::{
    BlockIQ1M, BlockIQ1S, BlockIQ2S, BlockIQ2XS, BlockIQ2XXS, BlockIQ3S, BlockIQ3XXS, BlockQ8K,
    QK_K,
};
use super::float::f16_to_f32;
use super::iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
use half::f16;

/// The shift of the IQ1_S and IQ1_M values (`IQ1S_DELTA`, `IQ1M_DELTA`).
pub const IQ1S_DELTA: f32 = 0.125;

/// Byte `j` of an 8-byte grid entry.
#[inline]
fn g8(v: u64, j: usize) -> u8 {
    (v >> (8 * j)) as u8
}

/// Byte `j` of a 4-byte grid entry.
#[inline]
fn g4(v: u32, j: usize) -> u8 {
    (v >> (8 * j)) as u8
}

/// `±1.f` as `(signs & kmask_iq2xs[j] ? -1.f : 1.f)`.
#[inline]
fn sign_f(signs: u8, j: usize) -> f32 {
    if signs & (1 << j) != 0 { -1.0 } else { 1.0 }
}

/// The little-endian u32 at byte `at` of `b`.
#[inline]
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// IQ2_XXS, 32 elements `ib32`: (the 4-bit scale, grid bytes, sign bytes) of the four groups
/// of 8.
#[inline]
pub fn iq2_xxs_sub(b: &BlockIQ2XXS, ib32: usize) -> (u32, [u64; 4], [u8; 4]) {
    let q = &b.qs[4 * ib32..4 * ib32 + 4];
    let a0 = u32::from(q[0]) | (u32::from(q[1]) << 16);
    let a1 = u32::from(q[2]) | (u32::from(q[3]) << 16);
    let mut grid = [0u64; 4];
    let mut signs = [0u8; 4];
    for l in 0..4 {
        grid[l] = IQ2XXS_GRID[((a0 >> (8 * l)) & 0xff) as usize];
        signs[l] = KSIGNS_IQ2XS[((a1 >> (7 * l)) & 127) as usize];
    }
    (a1 >> 28, grid, signs)
}

/// IQ2_XS, group of 8 `g`: (grid bytes, sign byte).
#[inline]
pub fn iq2_xs_group(b: &BlockIQ2XS, g: usize) -> (u64, u8) {
    let q = b.qs[g];
    (
        IQ2XS_GRID[(q & 511) as usize],
        KSIGNS_IQ2XS[(q >> 9) as usize],
    )
}

/// IQ2_S, group of 8 `g` (= 4 ib32 + l): (grid bytes, sign byte).
#[inline]
pub fn iq2_s_group(b: &BlockIQ2S, g: usize) -> (u64, u8) {
    let (ib32, l) = (g / 4, g % 4);
    let idx = usize::from(b.qs[g]) | ((usize::from(b.qh[ib32]) << (8 - 2 * l)) & 0x300);
    (IQ2S_GRID[idx], b.qs[QK_K / 8 + g])
}

/// IQ3_XXS, 32 elements `ib32`: (the 4-bit scale, grid words of the 8 groups of 4, sign bytes
/// of the four groups of 8).
#[inline]
pub fn iq3_xxs_sub(b: &BlockIQ3XXS, ib32: usize) -> (u32, [u32; 8], [u8; 4]) {
    let aux = le32(&b.qs, QK_K / 4 + 4 * ib32);
    let mut grid = [0u32; 8];
    for (k, g) in grid.iter_mut().enumerate() {
        *g = IQ3XXS_GRID[usize::from(b.qs[8 * ib32 + k])];
    }
    let mut signs = [0u8; 4];
    for (l, s) in signs.iter_mut().enumerate() {
        *s = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
    }
    (aux >> 28, grid, signs)
}

/// IQ3_S, 32 elements `ib32`: grid words of the 8 groups of 4 (the sign bytes are
/// `signs[4 ib32..]`, the scale nibble `ib32 % 2` of `scales[ib32 / 2]`).
#[inline]
pub fn iq3_s_grid(b: &BlockIQ3S, ib32: usize) -> [u32; 8] {
    let qh = usize::from(b.qh[ib32]);
    let qs = &b.qs[8 * ib32..8 * ib32 + 8];
    let mut grid = [0u32; 8];
    for l in 0..4 {
        grid[2 * l] = IQ3S_GRID[usize::from(qs[2 * l]) | ((qh << (8 - 2 * l)) & 256)];
        grid[2 * l + 1] = IQ3S_GRID[usize::from(qs[2 * l + 1]) | ((qh << (7 - 2 * l)) & 256)];
    }
    grid
}

/// IQ1_S, group of 8 `g`: the grid entry (8 signed bytes -1, 0, 1).
#[inline]
pub fn iq1_s_group(b: &BlockIQ1S, g: usize) -> u64 {
    let (ib, l) = (g / 4, g % 4);
    let qh = usize::from(b.qh[ib]);
    IQ1S_GRID[usize::from(b.qs[g]) | (((qh >> (3 * l)) & 7) << 8)]
}

/// IQ1_M's four scale words.
#[inline]
pub fn iq1_m_sc(b: &BlockIQ1M) -> [u16; 4] {
    let s = &b.scales;
    [
        u16::from_le_bytes([s[0], s[1]]),
        u16::from_le_bytes([s[2], s[3]]),
        u16::from_le_bytes([s[4], s[5]]),
        u16::from_le_bytes([s[6], s[7]]),
    ]
}

/// IQ1_M's super-block scale (the f16 spread over the top nibbles of the scale words).
#[inline]
pub fn iq1_m_d(sc: &[u16; 4]) -> f16 {
    f16::from_bits(
        (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000),
    )
}

/// IQ1_M, group of 8 `g`: (the grid entry, whether the shift is negative).
#[inline]
pub fn iq1_m_group(b: &BlockIQ1M, g: usize) -> (u64, bool) {
    let qh = u16::from(b.qh[g / 2]);
    let (idx, neg) = if g.is_multiple_of(2) {
        ((qh << 8) & 0x700, qh & 0x08 != 0)
    } else {
        ((qh << 4) & 0x700, qh & 0x80 != 0)
    };
    (IQ1S_GRID[usize::from(u16::from(b.qs[g]) | idx)], neg)
}

/// `dequantize_row_iq2_xxs`.
pub fn dequantize_row_iq2_xxs(x: &[BlockIQ2XXS], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for ib32 in 0..QK_K / 32 {
            let (ls, grid, signs) = iq2_xxs_sub(xb, ib32);
            let db = d * (0.5 + ls as f32) * 0.25;
            for l in 0..4 {
                for j in 0..8 {
                    yb[32 * ib32 + 8 * l + j] =
                        db * f32::from(g8(grid[l], j)) * sign_f(signs[l], j);
                }
            }
        }
    }
}

/// `dequantize_row_iq2_xs`.
pub fn dequantize_row_iq2_xs(x: &[BlockIQ2XS], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for ib32 in 0..QK_K / 32 {
            let sc = xb.scales[ib32];
            let db = [
                d * (0.5 + f32::from(sc & 0xf)) * 0.25,
                d * (0.5 + f32::from(sc >> 4)) * 0.25,
            ];
            for l in 0..4 {
                let (grid, signs) = iq2_xs_group(xb, 4 * ib32 + l);
                for j in 0..8 {
                    yb[32 * ib32 + 8 * l + j] =
                        db[l / 2] * f32::from(g8(grid, j)) * sign_f(signs, j);
                }
            }
        }
    }
}

/// `dequantize_row_iq2_s`.
pub fn dequantize_row_iq2_s(x: &[BlockIQ2S], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for ib32 in 0..QK_K / 32 {
            let sc = xb.scales[ib32];
            let db = [
                d * (0.5 + f32::from(sc & 0xf)) * 0.25,
                d * (0.5 + f32::from(sc >> 4)) * 0.25,
            ];
            for l in 0..4 {
                let (grid, signs) = iq2_s_group(xb, 4 * ib32 + l);
                for j in 0..8 {
                    yb[32 * ib32 + 8 * l + j] =
                        db[l / 2] * f32::from(g8(grid, j)) * sign_f(signs, j);
                }
            }
        }
    }
}

/// `dequantize_row_iq3_xxs`.
pub fn dequantize_row_iq3_xxs(x: &[BlockIQ3XXS], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for ib32 in 0..QK_K / 32 {
            let (ls, grid, signs) = iq3_xxs_sub(xb, ib32);
            let db = d * (0.5 + ls as f32) * 0.5;
            for l in 0..4 {
                for j in 0..4 {
                    let o = 32 * ib32 + 8 * l;
                    yb[o + j] = db * f32::from(g4(grid[2 * l], j)) * sign_f(signs[l], j);
                    yb[o + j + 4] =
                        db * f32::from(g4(grid[2 * l + 1], j)) * sign_f(signs[l], j + 4);
                }
            }
        }
    }
}

/// `dequantize_row_iq3_s`.
pub fn dequantize_row_iq3_s(x: &[BlockIQ3S], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for ib32 in 0..QK_K / 32 {
            let ls = (xb.scales[ib32 / 2] >> (4 * (ib32 % 2))) & 0xf;
            let db = d * (1 + 2 * i32::from(ls)) as f32;
            let grid = iq3_s_grid(xb, ib32);
            for l in 0..4 {
                let signs = xb.signs[4 * ib32 + l];
                for j in 0..4 {
                    let o = 32 * ib32 + 8 * l;
                    yb[o + j] = db * f32::from(g4(grid[2 * l], j)) * sign_f(signs, j);
                    yb[o + j + 4] = db * f32::from(g4(grid[2 * l + 1], j)) * sign_f(signs, j + 4);
                }
            }
        }
    }
}

/// `dequantize_row_iq1_s`.
pub fn dequantize_row_iq1_s(x: &[BlockIQ1S], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for ib in 0..QK_K / 32 {
            let qh = xb.qh[ib];
            let dl = d * (2 * i32::from((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1S_DELTA
            } else {
                IQ1S_DELTA
            };
            for l in 0..4 {
                let grid = iq1_s_group(xb, 4 * ib + l);
                for j in 0..8 {
                    yb[32 * ib + 8 * l + j] = dl * (f32::from(g8(grid, j) as i8) + delta);
                }
            }
        }
    }
}

/// IQ1_M's 3-bit scale `k` (0 or 1) of the 32 elements `ib`, as `2 s + 1`.
#[inline]
pub fn iq1_m_ls(sc: &[u16; 4], ib: usize, k: usize) -> i32 {
    2 * i32::from((sc[ib / 2] >> (6 * (ib % 2) + 3 * k)) & 0x7) + 1
}

/// `dequantize_row_iq1_m`.
pub fn dequantize_row_iq1_m(x: &[BlockIQ1M], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let sc = iq1_m_sc(xb);
        let d = f16_to_f32(iq1_m_d(&sc));
        for ib in 0..QK_K / 32 {
            let dl = [
                d * iq1_m_ls(&sc, ib, 0) as f32,
                d * iq1_m_ls(&sc, ib, 1) as f32,
            ];
            for l in 0..4 {
                let (grid, neg) = iq1_m_group(xb, 4 * ib + l);
                let delta = if neg { -IQ1S_DELTA } else { IQ1S_DELTA };
                for j in 0..8 {
                    yb[32 * ib + 8 * l + j] = dl[l / 2] * (f32::from(g8(grid, j) as i8) + delta);
                }
            }
        }
    }
}

/// Signed dot of 8 grid bytes (unsigned) with 8 activations, signs applied.
#[inline]
fn sdot8(grid: u64, signs: u8, q8: &[i8]) -> i32 {
    let mut s = 0i32;
    for j in 0..8 {
        let v = i32::from(g8(grid, j)) * i32::from(q8[j]);
        s += if signs & (1 << j) != 0 { -v } else { v };
    }
    s
}

/// Signed dot of two 4-byte grid words (the 8 values of a group) with 8 activations.
#[inline]
fn sdot4x2(g1: u32, g2: u32, signs: u8, q8: &[i8]) -> i32 {
    let mut s = 0i32;
    for j in 0..4 {
        let v1 = i32::from(g4(g1, j)) * i32::from(q8[j]);
        let v2 = i32::from(g4(g2, j)) * i32::from(q8[j + 4]);
        s += if signs & (1 << j) != 0 { -v1 } else { v1 };
        s += if signs & (1 << (j + 4)) != 0 { -v2 } else { v2 };
    }
    s
}

/// `ggml_vec_dot_iq2_xxs_q8_K_generic`.
pub fn vec_dot_iq2_xxs_q8_k(x: &[BlockIQ2XXS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(xb.d) * yb.d;
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let (ls, grid, signs) = iq2_xxs_sub(xb, ib32);
            let mut sumi = 0i32;
            for l in 0..4 {
                let o = 32 * ib32 + 8 * l;
                sumi += sdot8(grid[l], signs[l], &yb.qs[o..o + 8]);
            }
            bsum = bsum.wrapping_add(sumi.wrapping_mul((2 * ls + 1) as i32));
        }
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

/// The IQ2_XS / IQ2_S dot of one block: `Σ ls1 · sumi1 + ls2 · sumi2` over the 32-element
/// groups, given each group of 8's grid and signs.
#[inline]
fn iq2_two_scale_bsum(
    scales: &[u8; QK_K / 32],
    q8: &[i8; QK_K],
    group: impl Fn(usize) -> (u64, u8),
) -> i32 {
    let mut bsum = 0i32;
    for ib32 in 0..QK_K / 32 {
        let ls1 = 2 * i32::from(scales[ib32] & 0xf) + 1;
        let ls2 = 2 * i32::from(scales[ib32] >> 4) + 1;
        let mut s = [0i32; 2];
        for l in 0..4 {
            let (grid, signs) = group(4 * ib32 + l);
            let o = 32 * ib32 + 8 * l;
            s[l / 2] += sdot8(grid, signs, &q8[o..o + 8]);
        }
        bsum = bsum.wrapping_add(ls1 * s[0] + ls2 * s[1]);
    }
    bsum
}

/// `ggml_vec_dot_iq2_xs_q8_K_generic`.
pub fn vec_dot_iq2_xs_q8_k(x: &[BlockIQ2XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(xb.d) * yb.d;
        let bsum = iq2_two_scale_bsum(&xb.scales, &yb.qs, |g| iq2_xs_group(xb, g));
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

/// `ggml_vec_dot_iq2_s_q8_K_generic`.
pub fn vec_dot_iq2_s_q8_k(x: &[BlockIQ2S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(xb.d) * yb.d;
        let bsum = iq2_two_scale_bsum(&xb.scales, &yb.qs, |g| iq2_s_group(xb, g));
        sumf += d * bsum as f32;
    }
    0.125 * sumf
}

/// `ggml_vec_dot_iq3_xxs_q8_K_generic`.
pub fn vec_dot_iq3_xxs_q8_k(x: &[BlockIQ3XXS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(xb.d) * yb.d;
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let (ls, grid, signs) = iq3_xxs_sub(xb, ib32);
            let mut sumi = 0i32;
            for l in 0..4 {
                let o = 32 * ib32 + 8 * l;
                sumi += sdot4x2(grid[2 * l], grid[2 * l + 1], signs[l], &yb.qs[o..o + 8]);
            }
            bsum = bsum.wrapping_add(sumi.wrapping_mul((2 * ls + 1) as i32));
        }
        sumf += d * bsum as f32;
    }
    0.25 * sumf
}

/// `ggml_vec_dot_iq3_s_q8_K_generic`.
pub fn vec_dot_iq3_s_q8_k(x: &[BlockIQ3S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let d = f16_to_f32(xb.d) * yb.d;
        let mut bsum = 0i32;
        for ib32 in 0..QK_K / 32 {
            let ls = 2 * i32::from((xb.scales[ib32 / 2] >> (4 * (ib32 % 2))) & 0xf) + 1;
            let grid = iq3_s_grid(xb, ib32);
            let mut sumi = 0i32;
            for l in 0..4 {
                let o = 32 * ib32 + 8 * l;
                let signs = xb.signs[4 * ib32 + l];
                sumi += sdot4x2(grid[2 * l], grid[2 * l + 1], signs, &yb.qs[o..o + 8]);
            }
            bsum = bsum.wrapping_add(sumi.wrapping_mul(ls));
        }
        sumf += d * bsum as f32;
    }
    sumf
}

/// Dot of 8 signed grid bytes with 8 activations.
#[inline]
fn idot8(grid: u64, q8: &[i8]) -> i32 {
    let mut s = 0i32;
    for j in 0..8 {
        s += i32::from(g8(grid, j) as i8) * i32::from(q8[j]);
    }
    s
}

/// `ggml_vec_dot_iq1_s_q8_K_generic`.
pub fn vec_dot_iq1_s_q8_k(x: &[BlockIQ1S], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let mut sumi = 0i32;
        let mut sumi1 = 0i32;
        for ib in 0..QK_K / 32 {
            let qh = xb.qh[ib];
            let ls = 2 * i32::from((qh >> 12) & 7) + 1;
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            let mut lsum = 0i32;
            for l in 0..4 {
                let o = 32 * ib + 8 * l;
                lsum += idot8(iq1_s_group(xb, 4 * ib + l), &yb.qs[o..o + 8]);
            }
            sumi += ls * lsum;
            sumi1 += ls * delta * (i32::from(yb.bsums[2 * ib]) + i32::from(yb.bsums[2 * ib + 1]));
        }
        sumf += f16_to_f32(xb.d) * yb.d * (sumi as f32 + IQ1S_DELTA * sumi1 as f32);
    }
    sumf
}

/// `ggml_vec_dot_iq1_m_q8_K_generic`.
pub fn vec_dot_iq1_m_q8_k(x: &[BlockIQ1M], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (xb, yb) in x.iter().zip(y) {
        let sc = iq1_m_sc(xb);
        let mut sumi1 = 0i32;
        let mut sumi2 = 0i32;
        for ib in 0..QK_K / 32 {
            let mut sum1 = [0i32; 2];
            let mut sum2 = [0i32; 2];
            for l in 0..4 {
                let (grid, neg) = iq1_m_group(xb, 4 * ib + l);
                let o = 32 * ib + 8 * l;
                let q8 = &yb.qs[o..o + 8];
                let lsum2: i32 = q8.iter().map(|&q| i32::from(q)).sum();
                sum1[l / 2] += idot8(grid, q8);
                sum2[l / 2] += if neg { -lsum2 } else { lsum2 };
            }
            let ls1 = iq1_m_ls(&sc, ib, 0);
            let ls2 = iq1_m_ls(&sc, ib, 1);
            sumi1 += sum1[0] * ls1 + sum1[1] * ls2;
            sumi2 += sum2[0] * ls1 + sum2[1] * ls2;
        }
        sumf += f16_to_f32(iq1_m_d(&sc)) * yb.d * (sumi1 as f32 + IQ1S_DELTA * sumi2 as f32);
    }
    sumf
}

#[cfg(test)]
mod tests {
    use crate::DType;
    use crate::quant::{dequantize_row, row_bytes, vec_dot, vec_dot_type};

    #[test]
    fn random_bytes_never_panic() {
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        };
        use DType::*;
        for dtype in [IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M] {
            for fill in [None, Some(0u8), Some(0xff)] {
                let n = 512;
                let mut gen_bytes = |len: usize| -> Vec<u8> {
                    (0..len).map(|_| fill.unwrap_or_else(&mut rand)).collect()
                };
                let x = gen_bytes(row_bytes(dtype, n).unwrap());
                let y = gen_bytes(row_bytes(vec_dot_type(dtype).unwrap(), n).unwrap());
                let mut out = vec![0f32; n];
                dequantize_row(dtype, &x, &mut out).unwrap();
                vec_dot(dtype, n, &x, &y).unwrap();
            }
        }
    }
}
