//! NEON kernels for the i-quants (IQ4_NL, IQ4_XS and the grid types), the FP4 types (MXFP4,
//! NVFP4), the ternary TQ1_0/TQ2_0 and the low-bit Q1_0/Q2_0, bit-identical to the scalar
//! emulation in `dot.rs` (see `neon.rs` for the shared helpers and the float order).
//!
//! The grid types share [`grid32`]: the grid bytes (all below 128, so `maddubs` never
//! saturates) against the activations with the element signs applied by a wrapping negation,
//! in the 8 lanes of one 32-element sub-block times its one or two scales.

use std::arch::aarch64::*;

use lamina_core::quant::{
    IQ1S_DELTA, IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID,
    KSIGNS_IQ2XS, KVALUES_IQ4NL, KVALUES_MXFP4,
};

use super::dot::{
    bsum, bytes_from_bits, dot4, f32_at, fma8, hsum, lanes_ss, lanes_us, maddubs, negate_where,
    nibbles, u32_at, zero_acc, zero_i32,
};
use crate::kernels::f16_at;

/// IQ4_NL and MXFP4 (`ggml_vec_dot_{iq4_nl,mxfp4}_q8_0`): `bx`-byte blocks with the nibbles
/// at byte 1 or 2, mapped through `table`; block scale `scale(x block, y block)`. Even and odd
/// blocks go to two accumulators summed lane by lane before the `hsum`; an odd last block is
/// added as `sumf = fma(d, sumi, sumf)`.
#[inline(always)]
unsafe fn nl4(
    nb: usize,
    x: &[u8],
    y: &[u8],
    bx: usize,
    table: &[i8; 16],
    scale: impl Fn(&[u8], &[u8]) -> f32,
) -> f32 {
    // SAFETY: `nb` blocks of `bx` and 34 bytes are in bounds (`run`); the caller enables NEON.
    unsafe {
        let tbl = vld1q_s8(table.as_ptr());
        let block = |ib: usize| {
            let (xb, yb) = (&x[ib * bx..ib * bx + bx], &y[ib * 34..ib * 34 + 34]);
            let (lo, hi) = nibbles(xb.as_ptr().add(bx - 16));
            let yp = yb.as_ptr().add(2) as *const i8;
            let q = [vqtbl1q_s8(tbl, lo), vqtbl1q_s8(tbl, hi)];
            (scale(xb, yb), q, [vld1q_s8(yp), vld1q_s8(yp.add(16))])
        };
        let mut acc = [zero_acc(); 2];
        let mut ib = 0;
        while ib + 1 < nb {
            for (k, a) in acc.iter_mut().enumerate() {
                let (d, q, y8) = block(ib + k);
                fma8(a, d, lanes_ss(q[0], y8[0]), lanes_ss(q[1], y8[1]));
            }
            ib += 2;
        }
        let sum = [
            vaddq_f32(acc[0][0], acc[1][0]),
            vaddq_f32(acc[0][1], acc[1][1]),
        ];
        let mut sumf = hsum(&sum);
        if ib < nb {
            let (d, q, y8) = block(ib);
            let sumi = vaddvq_s32(vaddq_s32(dot4(q[0], y8[0]), dot4(q[1], y8[1])));
            sumf = d.mul_add(sumi as f32, sumf);
        }
        sumf
    }
}

/// `ggml_vec_dot_iq4_nl_q8_0`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq4_nl(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `nl4`; NEON enabled.
    unsafe {
        nl4(nb, x, y, 18, &KVALUES_IQ4NL, |xb, yb| {
            f16_at(yb, 0) * f16_at(xb, 0)
        })
    }
}

/// `ggml_vec_dot_mxfp4_q8_0`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn mxfp4(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::e8m0_to_fp32_half;
    // SAFETY: as in `nl4`; NEON enabled.
    unsafe {
        nl4(nb, x, y, 17, &KVALUES_MXFP4, |xb, yb| {
            f16_at(yb, 0) * e8m0_to_fp32_half(xb[0])
        })
    }
}

/// `ggml_vec_dot_iq4_xs_q8_K`: per 32 values the IQ4_NL-level lanes (sign trick) times the
/// 6-bit scale minus 32; one FMA per superblock.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq4_xs(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 136 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let tbl = vld1q_s8(KVALUES_IQ4NL.as_ptr());
        let mut acc = zero_acc();
        for i in 0..nb {
            let xb = &x[i * 136..i * 136 + 136];
            let yb = &y[i * 292..i * 292 + 292];
            let d = f16_at(xb, 0) * f32_at(yb, 0);
            let sh = u16::from_le_bytes([xb[2], xb[3]]);
            let q8 = yb.as_ptr().add(4) as *const i8;
            let mut s = zero_i32();
            for ib in 0..8 {
                let ls = i32::from((xb[4 + ib / 2] >> (4 * (ib % 2))) & 0xf)
                    | (i32::from((sh >> (2 * ib)) & 3) << 4);
                let (lo, hi) = nibbles(xb.as_ptr().add(8 + 16 * ib));
                let y0 = vld1q_s8(q8.add(32 * ib));
                let y1 = vld1q_s8(q8.add(32 * ib + 16));
                s[0] = vmlaq_n_s32(s[0], lanes_ss(vqtbl1q_s8(tbl, lo), y0), ls - 32);
                s[1] = vmlaq_n_s32(s[1], lanes_ss(vqtbl1q_s8(tbl, hi), y1), ls - 32);
            }
            fma8(&mut acc, d, s[0], s[1]);
        }
        hsum(&acc)
    }
}

/// The end of both ternary kernels: the 16 i16 sums (bytes 0..16 and 16..32 of every 32)
/// minus the Q8_K block sums (16-bit wrapping), widened in pairs to 8 lanes, then
/// `acc = fma(lanes, d, acc)`.
#[inline(always)]
unsafe fn ternary_acc(acc: &mut [float32x4_t; 2], d: f32, s16: [int16x8_t; 2], yb: &[u8]) {
    // SAFETY: `yb` is a whole Q8_K block (the 32 bytes of bsums at 260); NEON in the caller.
    unsafe {
        let bs = yb.as_ptr().add(260) as *const i16;
        let w0 = vsubq_s16(s16[0], vld1q_s16(bs));
        let w1 = vsubq_s16(s16[1], vld1q_s16(bs.add(8)));
        fma8(acc, d, vpaddlq_s16(w0), vpaddlq_s16(w1));
    }
}

/// `ggml_vec_dot_tq2_0_q8_K`: the 2-bit values (0..=3) times the activations in `maddubs`
/// i16 lanes, summed with 16-bit wrapping, then [`ternary_acc`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn tq2_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 66 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let m3 = vdupq_n_u8(3);
        let mut acc = zero_acc();
        for i in 0..nb {
            let xb = &x[i * 66..i * 66 + 66];
            let yb = &y[i * 292..i * 292 + 292];
            let d = f32_at(yb, 0) * f16_at(xb, 64);
            let q8 = yb.as_ptr().add(4) as *const i8;
            let mut s16 = [vdupq_n_s16(0); 2];
            for j in [0usize, 32] {
                for (h, s) in s16.iter_mut().enumerate() {
                    let q = vld1q_u8(xb.as_ptr().add(j + 16 * h));
                    let v = [
                        vandq_u8(q, m3),
                        vandq_u8(vshrq_n_u8::<2>(q), m3),
                        vandq_u8(vshrq_n_u8::<4>(q), m3),
                        vshrq_n_u8::<6>(q),
                    ];
                    for (l, vl) in v.into_iter().enumerate() {
                        let y8 = vld1q_s8(q8.add(4 * j + 32 * l + 16 * h));
                        *s = vaddq_s16(*s, maddubs(vl, y8));
                    }
                }
            }
            ternary_acc(&mut acc, d, s16, yb);
        }
        hsum(&acc)
    }
}

/// `tq1_trit` of every byte of `q` times `pow` (mod 256): `((q·pow mod 256) · 3) >> 8`.
#[inline(always)]
unsafe fn trits(q: uint8x16_t, pow: uint8x16_t) -> uint8x16_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        let q = vmulq_u8(q, pow);
        let three = vdup_n_u8(3);
        let lo = vshrn_n_u16::<8>(vmull_u8(vget_low_u8(q), three));
        let hi = vshrn_n_u16::<8>(vmull_high_u8(q, vdupq_n_u8(3)));
        vcombine_u8(lo, hi)
    }
}

/// `ggml_vec_dot_tq1_0_q8_K`: the trits (0, 1, 2) of the 5-trit bytes (0..48) and the
/// 4-trit ones (48..52) in the scalar code's element order, as in [`tq2_0`].
#[target_feature(enable = "neon")]
pub(crate) unsafe fn tq1_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    const POW_QH: [u8; 16] = [1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27];
    const IDX_QH: [u8; 16] = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3];
    // SAFETY: `nb` blocks of 54 and 292 bytes are in bounds (`run`); the constant tables are
    // 16 bytes; NEON enabled.
    unsafe {
        let pow = |p: u8| vdupq_n_u8(p);
        let mut acc = zero_acc();
        for i in 0..nb {
            let xb = &x[i * 54..i * 54 + 54];
            let yb = &y[i * 292..i * 292 + 292];
            let d = f32_at(yb, 0) * f16_at(xb, 52);
            let q8 = yb.as_ptr().add(4) as *const i8;
            let qy = |o: usize| vld1q_s8(q8.add(o));
            let mut s16 = [vdupq_n_s16(0); 2];
            // Bytes 0..32, trits 0..5: activations 32k..32k+32.
            for (h, s) in s16.iter_mut().enumerate() {
                let q = vld1q_u8(xb.as_ptr().add(16 * h));
                for (k, p) in [1u8, 3, 9, 27, 81].into_iter().enumerate() {
                    *s = vaddq_s16(*s, maddubs(trits(q, pow(p)), qy(32 * k + 16 * h)));
                }
            }
            // Bytes 32..48: trits 0, 2, 4 to the first 16 of activations 160, 192, 224,
            // trits 1, 3 to the second 16 of 160 and 192; bytes 48..52 (4 trits each) to the
            // second 16 of 224.
            let q = vld1q_u8(xb.as_ptr().add(32));
            let qh = vqtbl1q_u8(
                vreinterpretq_u8_u32(vdupq_n_u32(u32_at(xb, 48))),
                vld1q_u8(IDX_QH.as_ptr()),
            );
            let parts = [
                (trits(q, pow(1)), trits(q, pow(3))),
                (trits(q, pow(9)), trits(q, pow(27))),
                (trits(q, pow(81)), trits(qh, vld1q_u8(POW_QH.as_ptr()))),
            ];
            for (k, (a, b)) in parts.into_iter().enumerate() {
                s16[0] = vaddq_s16(s16[0], maddubs(a, qy(160 + 32 * k)));
                s16[1] = vaddq_s16(s16[1], maddubs(b, qy(176 + 32 * k)));
            }
            ternary_acc(&mut acc, d, s16, yb);
        }
        hsum(&acc)
    }
}

/// One 32-element sub-block of a grid i-quant: the grid bytes `g` (4 × 8, each below 128)
/// against the activations at `q8` negated where bit `i` of `neg` is set; adds
/// `ls[h] · lanes` of bytes `16h..16h+16` to `s[h]`.
#[inline(always)]
unsafe fn grid32(s: &mut [int32x4_t; 2], g: [u64; 4], neg: u32, q8: *const i8, ls: [i32; 2]) {
    // SAFETY: `q8` points at 32 readable bytes; the caller runs with NEON.
    unsafe {
        let (m0, m1) = bytes_from_bits(neg);
        for (h, m) in [m0, m1].into_iter().enumerate() {
            let w = vcombine_u8(vcreate_u8(g[2 * h]), vcreate_u8(g[2 * h + 1]));
            let q = negate_where(vld1q_s8(q8.add(16 * h)), m);
            s[h] = vmlaq_n_s32(s[h], lanes_us(w, q), ls[h]);
        }
    }
}

/// The grid i-quants' outer loop: `sub(x block, ib, s, q8 of ib)` adds sub-block `ib`'s lanes
/// to `s`; per block `acc = fma(f16 d · y d, lanes, acc)`; the result `scale · hsum`.
#[inline(always)]
unsafe fn grid_dot(
    nb: usize,
    x: &[u8],
    y: &[u8],
    bx: usize,
    scale: f32,
    sub: impl Fn(&[u8], usize, &mut [int32x4_t; 2], *const i8),
) -> f32 {
    // SAFETY: `nb` blocks of `bx` and 292 bytes are in bounds (`run`); NEON in the caller.
    unsafe {
        let mut acc = zero_acc();
        for i in 0..nb {
            let xb = &x[i * bx..i * bx + bx];
            let yb = &y[i * 292..i * 292 + 292];
            let d = f16_at(xb, 0) * f32_at(yb, 0);
            let q8 = yb.as_ptr().add(4) as *const i8;
            let mut s = zero_i32();
            for ib in 0..8 {
                sub(xb, ib, &mut s, q8.add(32 * ib));
            }
            fma8(&mut acc, d, s[0], s[1]);
        }
        scale * hsum(&acc)
    }
}

/// Four KSIGNS_IQ2XS sign bytes of 7-bit indices `a >> 7l` as one 32-bit mask.
#[inline(always)]
fn ksigns4(a: u32) -> u32 {
    (0..4).fold(0, |m, l| {
        m | u32::from(KSIGNS_IQ2XS[((a >> (7 * l)) & 127) as usize]) << (8 * l)
    })
}

/// Two scales of 2·nibble + 1 from a byte.
#[inline(always)]
fn scales2(b: u8) -> [i32; 2] {
    [2 * i32::from(b & 0xf) + 1, 2 * i32::from(b >> 4) + 1]
}

/// Pairs of 4-byte grid words as 8-byte ones.
#[inline(always)]
fn pairs(g: [u32; 8]) -> [u64; 4] {
    std::array::from_fn(|l| u64::from(g[2 * l]) | (u64::from(g[2 * l + 1]) << 32))
}

/// `ggml_vec_dot_iq2_xxs_q8_K`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq2_xxs(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `grid_dot`; NEON enabled.
    unsafe {
        grid_dot(nb, x, y, 66, 0.125, |xb, ib, s, q8| {
            let (a0, a1) = (u32_at(xb, 2 + 8 * ib), u32_at(xb, 6 + 8 * ib));
            let g = std::array::from_fn(|l| IQ2XXS_GRID[((a0 >> (8 * l)) & 0xff) as usize]);
            let ls = 2 * (a1 >> 28) as i32 + 1;
            grid32(s, g, ksigns4(a1), q8, [ls, ls]);
        })
    }
}

/// `ggml_vec_dot_iq2_xs_q8_K`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq2_xs(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `grid_dot`; NEON enabled.
    unsafe {
        grid_dot(nb, x, y, 74, 0.125, |xb, ib, s, q8| {
            let q = |l: usize| u16::from_le_bytes([xb[2 + 8 * ib + 2 * l], xb[3 + 8 * ib + 2 * l]]);
            let g = std::array::from_fn(|l| IQ2XS_GRID[usize::from(q(l) & 511)]);
            let neg = (0..4).fold(0u32, |m, l| {
                m | u32::from(KSIGNS_IQ2XS[usize::from(q(l) >> 9)]) << (8 * l)
            });
            grid32(s, g, neg, q8, scales2(xb[66 + ib]));
        })
    }
}

/// `ggml_vec_dot_iq2_s_q8_K`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq2_s(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `grid_dot`; NEON enabled.
    unsafe {
        grid_dot(nb, x, y, 82, 0.125, |xb, ib, s, q8| {
            let h = usize::from(xb[66 + ib]);
            let g = std::array::from_fn(|l| {
                IQ2S_GRID[usize::from(xb[2 + 4 * ib + l]) | ((h << (8 - 2 * l)) & 0x300)]
            });
            grid32(s, g, u32_at(xb, 34 + 4 * ib), q8, scales2(xb[74 + ib]));
        })
    }
}

/// `ggml_vec_dot_iq3_xxs_q8_K`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq3_xxs(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `grid_dot`; NEON enabled.
    unsafe {
        grid_dot(nb, x, y, 98, 0.25, |xb, ib, s, q8| {
            let g = std::array::from_fn(|k| IQ3XXS_GRID[usize::from(xb[2 + 8 * ib + k])]);
            let aux = u32_at(xb, 66 + 4 * ib);
            let ls = 2 * (aux >> 28) as i32 + 1;
            grid32(s, pairs(g), ksigns4(aux), q8, [ls, ls]);
        })
    }
}

/// `ggml_vec_dot_iq3_s_q8_K`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq3_s(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `grid_dot`; NEON enabled.
    unsafe {
        grid_dot(nb, x, y, 110, 1.0, |xb, ib, s, q8| {
            let h = usize::from(xb[66 + ib]);
            let g = std::array::from_fn(|k| {
                IQ3S_GRID[usize::from(xb[2 + 8 * ib + k]) | ((h << (8 - k)) & 256)]
            });
            let ls = 2 * i32::from((xb[106 + ib / 2] >> (4 * (ib % 2))) & 0xf) + 1;
            grid32(s, pairs(g), u32_at(xb, 74 + 4 * ib), q8, [ls, ls]);
        })
    }
}

/// The IQ1 grid entries (signed bytes -1, 0, 1) of groups `g` against the activations at
/// `q8`: `maddubs(|g|, sign(q8, g))` lanes of bytes `16h..16h+16` times `ls[h]`, into `s[h]`.
#[inline(always)]
unsafe fn grid32_iq1(s: &mut [int32x4_t; 2], g: [u64; 4], q8: *const i8, ls: [i32; 2]) {
    // SAFETY: `q8` points at 32 readable bytes; the caller runs with NEON.
    unsafe {
        for h in 0..2 {
            let w =
                vreinterpretq_s8_u8(vcombine_u8(vcreate_u8(g[2 * h]), vcreate_u8(g[2 * h + 1])));
            s[h] = vmlaq_n_s32(s[h], lanes_ss(w, vld1q_s8(q8.add(16 * h))), ls[h]);
        }
    }
}

/// `ggml_vec_dot_iq1_s_q8_K`: the grid lanes with `acc = fma(d, lanes, acc)`, the shifts as
/// `accum1 = fma(d, sumi1, accum1)` over the block sums, then `fma(DELTA, accum1, hsum)`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq1_s(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 50 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        let mut accum1 = 0f32;
        for i in 0..nb {
            let xb = &x[i * 50..i * 50 + 50];
            let yb = &y[i * 292..i * 292 + 292];
            let q8 = yb.as_ptr().add(4) as *const i8;
            let mut s = zero_i32();
            let mut sumi1 = 0i32;
            for ib in 0..8 {
                let qh = usize::from(u16::from_le_bytes([xb[34 + 2 * ib], xb[35 + 2 * ib]]));
                let g = std::array::from_fn(|l| {
                    IQ1S_GRID[usize::from(xb[2 + 4 * ib + l]) | (((qh >> (3 * l)) & 7) << 8)]
                });
                let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                grid32_iq1(&mut s, g, q8.add(32 * ib), [ls, ls]);
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                let bs = i32::from(bsum(yb, 2 * ib)) + i32::from(bsum(yb, 2 * ib + 1));
                sumi1 = sumi1.wrapping_add(bs.wrapping_mul(delta).wrapping_mul(ls));
            }
            let d = f32_at(yb, 0) * f16_at(xb, 0);
            fma8(&mut acc, d, s[0], s[1]);
            accum1 = d.mul_add(sumi1 as f32, accum1);
        }
        IQ1S_DELTA.mul_add(accum1, hsum(&acc))
    }
}

/// `ggml_vec_dot_iq1_m_q8_K`: grid lanes and shift lanes (`maddubs(1, ±q8)`) in two
/// accumulators, then `fma(DELTA, hsum(acc2), hsum(acc1))`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn iq1_m(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{iq1_m_d, iq1_m_ls};
    // SAFETY: `nb` blocks of 56 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let ones = vdupq_n_u8(1);
        let mut acc1 = zero_acc();
        let mut acc2 = zero_acc();
        for i in 0..nb {
            let xb = &x[i * 56..i * 56 + 56];
            let yb = &y[i * 292..i * 292 + 292];
            let q8 = yb.as_ptr().add(4) as *const i8;
            let sc: [u16; 4] =
                std::array::from_fn(|k| u16::from_le_bytes([xb[48 + 2 * k], xb[49 + 2 * k]]));
            let mut s1 = zero_i32();
            let mut s2 = zero_i32();
            for ib in 0..8 {
                let mut g = [0u64; 4];
                let mut neg = [0u64; 4];
                for l in 0..4 {
                    let h = u16::from(xb[32 + 2 * ib + l / 2]);
                    let (idx, n) = if l % 2 == 0 {
                        ((h << 8) & 0x700, h & 0x08 != 0)
                    } else {
                        ((h << 4) & 0x700, h & 0x80 != 0)
                    };
                    g[l] = IQ1S_GRID[usize::from(u16::from(xb[4 * ib + l]) | idx)];
                    neg[l] = if n { u64::MAX } else { 0 };
                }
                let ls = [iq1_m_ls(&sc, ib, 0), iq1_m_ls(&sc, ib, 1)];
                let q = q8.add(32 * ib);
                grid32_iq1(&mut s1, g, q, ls);
                for h in 0..2 {
                    let m = vcombine_u8(vcreate_u8(neg[2 * h]), vcreate_u8(neg[2 * h + 1]));
                    let b = negate_where(vld1q_s8(q.add(16 * h)), m);
                    s2[h] = vmlaq_n_s32(s2[h], lanes_us(ones, b), ls[h]);
                }
            }
            let d = f32_at(yb, 0) * iq1_m_d(&sc).to_f32();
            fma8(&mut acc1, d, s1[0], s1[1]);
            fma8(&mut acc2, d, s2[0], s2[1]);
        }
        IQ1S_DELTA.mul_add(hsum(&acc2), hsum(&acc1))
    }
}

/// `ggml_vec_dot_nvfp4_q8_0`: per half block (one Q8_0 block) the level lanes (sign trick),
/// lanes 0-3 scaled by the first sub-block's `ue4m3(d) · dy`, lanes 4-7 by the second's.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn nvfp4(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::ue4m3_to_fp32 as ue;
    // SAFETY: `nb` blocks of 36 and 68 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let tbl = vld1q_s8(KVALUES_MXFP4.as_ptr());
        let mut acc = zero_acc();
        for ib in 0..nb {
            let xb = &x[ib * 36..ib * 36 + 36];
            let yb = &y[ib * 68..ib * 68 + 68];
            for h in 0..2 {
                let dy = f16_at(yb, 34 * h);
                let (lo, hi) = nibbles(xb.as_ptr().add(4 + 16 * h));
                // Sub-block r: the low nibbles of its 8 bytes, then the high ones.
                let x0 = vcombine_u8(vget_low_u8(lo), vget_low_u8(hi));
                let x1 = vcombine_u8(vget_high_u8(lo), vget_high_u8(hi));
                let yp = yb.as_ptr().add(34 * h + 2) as *const i8;
                let l0 = lanes_ss(vqtbl1q_s8(tbl, x0), vld1q_s8(yp));
                let l1 = lanes_ss(vqtbl1q_s8(tbl, x1), vld1q_s8(yp.add(16)));
                acc[0] = vfmaq_n_f32(acc[0], vcvtq_f32_s32(l0), ue(xb[2 * h]) * dy);
                acc[1] = vfmaq_n_f32(acc[1], vcvtq_f32_s32(l1), ue(xb[2 * h + 1]) * dy);
            }
        }
        hsum(&acc)
    }
}

/// `ggml_vec_dot_q1_0_q8_0`: per Q8_0 block the lane sums of the activations negated
/// (wrapping) where the weight bit is clear, scaled by `dy` into a block accumulator (a
/// product for the first of the 4, FMAs after), then `acc = fma(d, block, acc)`.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn q1_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 18 and 136 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        for ib in 0..nb {
            let xb = &x[ib * 18..ib * 18 + 18];
            let yb = &y[ib * 136..ib * 136 + 136];
            let mut blk = zero_acc();
            for k in 0..4 {
                let dy = f16_at(yb, 34 * k);
                let (m0, m1) = bytes_from_bits(!u32_at(xb, 2 + 4 * k));
                let yp = yb.as_ptr().add(34 * k + 2) as *const i8;
                let lanes = [
                    negate_where(vld1q_s8(yp), m0),
                    negate_where(vld1q_s8(yp.add(16)), m1),
                ]
                .map(|v| vcvtq_f32_s32(vpaddlq_s16(vpaddlq_s8(v))));
                for (b, l) in blk.iter_mut().zip(lanes) {
                    *b = if k == 0 {
                        vmulq_n_f32(l, dy)
                    } else {
                        vfmaq_n_f32(*b, l, dy)
                    };
                }
            }
            let d0 = f16_at(xb, 0);
            acc[0] = vfmaq_n_f32(acc[0], blk[0], d0);
            acc[1] = vfmaq_n_f32(acc[1], blk[1], d0);
        }
        hsum(&acc)
    }
}

/// `ggml_vec_dot_q2_0_q8_0` (x86's generic C): the exact Σ (v - 1)·q per Q8_0 block, then
/// `sumi = fma(dy, sumi_block, sumi)` and `sumf = fma(d, sumi, sumf)` in scalar.
#[target_feature(enable = "neon")]
pub(crate) unsafe fn q2_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    const IDX: [u8; 16] = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3];
    const SHR: [i8; 16] = [0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6];
    // SAFETY: `nb` blocks of 18 and 68 bytes are in bounds (`run`); the constant tables are 16
    // bytes; NEON enabled.
    unsafe {
        let (idx, shr) = (vld1q_u8(IDX.as_ptr()), vld1q_s8(SHR.as_ptr()));
        let (m3, one) = (vdupq_n_u8(3), vdupq_n_s8(1));
        let mut sumf = 0f32;
        for ib in 0..nb {
            let xb = &x[ib * 18..ib * 18 + 18];
            let yb = &y[ib * 68..ib * 68 + 68];
            let mut sumi = 0f32;
            for k in 0..2 {
                let yp = yb.as_ptr().add(34 * k + 2) as *const i8;
                let mut s = vdupq_n_s32(0);
                for h in 0..2 {
                    // Bytes 4h..4h+4 of the 8, four 2-bit values each.
                    let b = vreinterpretq_u8_u32(vdupq_n_u32(u32_at(xb, 2 + 8 * k + 4 * h)));
                    let v = vandq_u8(vshlq_u8(vqtbl1q_u8(b, idx), shr), m3);
                    let v = vsubq_s8(vreinterpretq_s8_u8(v), one);
                    s = vaddq_s32(s, dot4(v, vld1q_s8(yp.add(16 * h))));
                }
                sumi = f16_at(yb, 34 * k).mul_add(vaddvq_s32(s) as f32, sumi);
            }
            sumf = f16_at(xb, 0).mul_add(sumi, sumf);
        }
        sumf
    }
}
