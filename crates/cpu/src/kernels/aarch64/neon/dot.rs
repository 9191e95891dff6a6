//! NEON (aarch64) versions of the quantized dot kernels of `dot.rs`, bit-identical to the
//! scalar emulation of llama.cpp's x86 AVX2 arithmetic: the exact integer lane sums are
//! computed with NEON (including `maddubs`'s i16 saturation and `sign_epi8`'s wrapping
//! negation), then the float steps run in the scalar code's order — one fused multiply-add per
//! lane per block (`vfmaq` is fused like `f32::mul_add`), the block scales and min terms in
//! scalar, and `hsum8` at the end. They make up the NEON tier's kernel table
//! (`aarch64::neon`), used when the CPU has NEON; `LAMINA_FORCE_SCALAR=1` turns them off.
//! This file has the shared helpers, the legacy types and the K-quants; `iq.rs` the
//! i-quants, the FP4 and the ternary and low-bit types.

use std::arch::aarch64::*;

use lamina_core::DType;

use crate::kernels::dot::DotFn;
use crate::kernels::{f16_at, hsum8};

/// The NEON kernel for weights of `dtype`, or `None` (the caller falls back to scalar).
pub(crate) fn dot_fn(dtype: DType) -> Option<DotFn> {
    use super::iq;
    Some(match dtype {
        DType::Q4_0 => |n, x, y| run(n, x, y, DType::Q4_0, q4_0),
        DType::Q4_1 => |n, x, y| run(n, x, y, DType::Q4_1, q4_1),
        DType::Q5_0 => |n, x, y| run(n, x, y, DType::Q5_0, q5_0),
        DType::Q5_1 => |n, x, y| run(n, x, y, DType::Q5_1, q5_1),
        DType::Q8_0 => |n, x, y| run(n, x, y, DType::Q8_0, q8_0),
        DType::Q4_K => |n, x, y| run(n, x, y, DType::Q4_K, q4_k),
        DType::Q6_K => |n, x, y| run(n, x, y, DType::Q6_K, q6_k),
        DType::Q5_K => |n, x, y| run(n, x, y, DType::Q5_K, q5_k),
        DType::Q2_K => |n, x, y| run(n, x, y, DType::Q2_K, q2_k),
        DType::Q3_K => |n, x, y| run(n, x, y, DType::Q3_K, q3_k),
        DType::IQ4_NL => |n, x, y| run(n, x, y, DType::IQ4_NL, iq::iq4_nl),
        DType::MXFP4 => |n, x, y| run(n, x, y, DType::MXFP4, iq::mxfp4),
        DType::IQ4_XS => |n, x, y| run(n, x, y, DType::IQ4_XS, iq::iq4_xs),
        DType::TQ1_0 => |n, x, y| run(n, x, y, DType::TQ1_0, iq::tq1_0),
        DType::TQ2_0 => |n, x, y| run(n, x, y, DType::TQ2_0, iq::tq2_0),
        DType::IQ2_XXS => |n, x, y| run(n, x, y, DType::IQ2_XXS, iq::iq2_xxs),
        DType::IQ2_XS => |n, x, y| run(n, x, y, DType::IQ2_XS, iq::iq2_xs),
        DType::IQ2_S => |n, x, y| run(n, x, y, DType::IQ2_S, iq::iq2_s),
        DType::IQ3_XXS => |n, x, y| run(n, x, y, DType::IQ3_XXS, iq::iq3_xxs),
        DType::IQ3_S => |n, x, y| run(n, x, y, DType::IQ3_S, iq::iq3_s),
        DType::IQ1_S => |n, x, y| run(n, x, y, DType::IQ1_S, iq::iq1_s),
        DType::IQ1_M => |n, x, y| run(n, x, y, DType::IQ1_M, iq::iq1_m),
        DType::NVFP4 => |n, x, y| run(n, x, y, DType::NVFP4, iq::nvfp4),
        DType::Q1_0 => |n, x, y| run(n, x, y, DType::Q1_0, iq::q1_0),
        DType::Q2_0 => |n, x, y| run(n, x, y, DType::Q2_0, iq::q2_0),
        _ => return None,
    })
}

type Kernel = unsafe fn(usize, &[u8], &[u8]) -> f32;

/// Runs kernel `k` over the blocks the scalar code would use: `n / qk`, limited (like its
/// `zip` of `chunks_exact`) by the whole blocks both rows hold.
#[inline(always)]
fn run(n: usize, x: &[u8], y: &[u8], dtype: DType, k: Kernel) -> f32 {
    let (bx, by, qk) = crate::kernels::table::geometry(dtype).expect("a quantized type");
    let nb = (n / qk).min(x.len() / bx).min(y.len() / by);
    // SAFETY: `dot_fn`'s kernels are reached only through the NEON table (NEON present); `x` and `y` hold `nb`
    // whole blocks of `bx` and `by` bytes.
    unsafe { k(nb, x, y) }
}

/// `maddubs_epi16` on 16 bytes: i16 lane `k` (of 8) is `a[2k]·b[2k] + a[2k+1]·b[2k+1]`
/// (u8·i8), added with i16 saturation.
#[inline(always)]
pub(crate) unsafe fn maddubs(a: uint8x16_t, b: int8x16_t) -> int16x8_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        // u8 (≤ 255) · i8 fits i16 exactly.
        let a_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(a)));
        let a_hi = vreinterpretq_s16_u16(vmovl_high_u8(a));
        let p_lo = vmulq_s16(a_lo, vmovl_s8(vget_low_s8(b)));
        let p_hi = vmulq_s16(a_hi, vmovl_high_s8(b));
        // Even and odd products of the 16 bytes, added with saturation: pair k of 8.
        vqaddq_s16(vuzp1q_s16(p_lo, p_hi), vuzp2q_s16(p_lo, p_hi))
    }
}

/// `maddubs_epi16` + `madd_epi16(1, ·)` on 16 bytes: lane `j` (of 4) is the sum of the u8·i8
/// products of bytes `4j..4j+3`, adjacent pairs first summed with i16 saturation.
#[inline(always)]
pub(crate) unsafe fn lanes_us(a: uint8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe { vpaddlq_s16(maddubs(a, b)) }
}

/// `_mm256_sign_epi8(y, x)`: `y` negated with wrap-around where `x < 0`, zero where `x == 0`.
#[inline(always)]
pub(crate) unsafe fn sign_epi8(y: int8x16_t, x: int8x16_t) -> int8x16_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        let sy = vbslq_s8(vcltzq_s8(x), vnegq_s8(y), y);
        vandq_s8(sy, vreinterpretq_s8_u8(vtstq_s8(x, x)))
    }
}

/// `mul_sum_i8_pairs` on 16 bytes: `|x|` times `sign_epi8(y, x)`, then [`lanes_us`].
#[inline(always)]
pub(crate) unsafe fn lanes_ss(x: int8x16_t, y: int8x16_t) -> int32x4_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        // vabsq_s8(-128) is -128, i.e. 128 as u8, like `_mm256_sign_epi8(x, x)` read unsigned.
        lanes_us(vreinterpretq_u8_s8(vabsq_s8(x)), sign_epi8(y, x))
    }
}

/// Exact i8·i8 dot of bytes `4j..4j+3` in lane `j` (no saturation anywhere).
#[inline(always)]
pub(crate) unsafe fn dot4(a: int8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        // |i8·i8| ≤ 2^14 fits i16; pairs are widened before they are added.
        let lo = vpaddlq_s16(vmull_s8(vget_low_s8(a), vget_low_s8(b)));
        let hi = vpaddlq_s16(vmull_high_s8(a, b));
        vpaddq_s32(lo, hi)
    }
}

/// `(q ^ m) - m`: the bytes of `q` negated (wrapping) where the mask `m` is all ones.
#[inline(always)]
pub(crate) unsafe fn negate_where(q: int8x16_t, m: uint8x16_t) -> int8x16_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        let m = vreinterpretq_s8_u8(m);
        vsubq_s8(veorq_s8(q, m), m)
    }
}

/// `acc[l] = fma(d, (f32)lanes[l], acc[l])` for the 8 lanes (`f32::mul_add` per lane).
#[inline(always)]
pub(crate) unsafe fn fma8(acc: &mut [float32x4_t; 2], d: f32, lo: int32x4_t, hi: int32x4_t) {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        acc[0] = vfmaq_n_f32(acc[0], vcvtq_f32_s32(lo), d);
        acc[1] = vfmaq_n_f32(acc[1], vcvtq_f32_s32(hi), d);
    }
}

/// `hsum_float_8` of the 8 accumulator lanes (in the scalar code's order).
#[inline(always)]
pub(crate) unsafe fn hsum(acc: &[float32x4_t; 2]) -> f32 {
    let mut a = [0f32; 8];
    // SAFETY: `a` has room for two 4-lane stores.
    unsafe {
        vst1q_f32(a.as_mut_ptr(), acc[0]);
        vst1q_f32(a.as_mut_ptr().add(4), acc[1]);
    }
    hsum8(&a)
}

#[inline(always)]
pub(crate) unsafe fn zero_acc() -> [float32x4_t; 2] {
    // SAFETY: register-only NEON intrinsic.
    unsafe { [vdupq_n_f32(0.0); 2] }
}

#[inline(always)]
pub(crate) unsafe fn zero_i32() -> [int32x4_t; 2] {
    // SAFETY: register-only NEON intrinsic.
    unsafe { [vdupq_n_s32(0); 2] }
}

/// Low nibbles (values 0..16) and high nibbles (values 16..32) of the 16 bytes at `p`.
#[inline(always)]
pub(crate) unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the caller passes 16 readable bytes and runs with NEON.
    unsafe {
        let v = vld1q_u8(p);
        (vandq_u8(v, vdupq_n_u8(15)), vshrq_n_u8::<4>(v))
    }
}

/// `bytes_from_bits_32`: byte `i` (of 32) is 0xFF when bit `i` of `bits` is set.
#[inline(always)]
pub(crate) unsafe fn bytes_from_bits(bits: u32) -> (uint8x16_t, uint8x16_t) {
    const IDX_LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const IDX_HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const MASK: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    // SAFETY: loads from the constant arrays above (16 bytes each); NEON present.
    unsafe {
        let b = vreinterpretq_u8_u32(vdupq_n_u32(bits));
        let m = vld1q_u8(MASK.as_ptr());
        let lo = vqtbl1q_u8(b, vld1q_u8(IDX_LO.as_ptr()));
        let hi = vqtbl1q_u8(b, vld1q_u8(IDX_HI.as_ptr()));
        (vtstq_u8(lo, m), vtstq_u8(hi, m))
    }
}

#[inline(always)]
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
pub(crate) fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

/// Q8_K block sum `t` of the block `yb`.
#[inline(always)]
pub(crate) fn bsum(yb: &[u8], t: usize) -> i16 {
    i16::from_le_bytes([yb[260 + 2 * t], yb[261 + 2 * t]])
}

/// `ggml_vec_dot_q4_0_q8_0`.
#[target_feature(enable = "neon")]
unsafe fn q4_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 18 and 34 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        for ib in 0..nb {
            let (xo, yo) = (ib * 18, ib * 34);
            let d = f16_at(x, xo) * f16_at(y, yo);
            let (lo, hi) = nibbles(x.as_ptr().add(xo + 2));
            let eight = vdupq_n_s8(8);
            let x0 = vsubq_s8(vreinterpretq_s8_u8(lo), eight);
            let x1 = vsubq_s8(vreinterpretq_s8_u8(hi), eight);
            let yp = y.as_ptr().add(yo + 2) as *const i8;
            let (y0, y1) = (vld1q_s8(yp), vld1q_s8(yp.add(16)));
            fma8(&mut acc, d, lanes_ss(x0, y0), lanes_ss(x1, y1));
        }
        hsum(&acc)
    }
}

/// `ggml_vec_dot_q5_0_q8_0`.
#[target_feature(enable = "neon")]
unsafe fn q5_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 22 and 34 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        for ib in 0..nb {
            let (xo, yo) = (ib * 22, ib * 34);
            let d = f16_at(x, xo) * f16_at(y, yo);
            let (hb0, hb1) = bytes_from_bits(u32_at(x, xo + 2));
            let (lo, hi) = nibbles(x.as_ptr().add(xo + 6));
            let (b16, s16) = (vdupq_n_u8(16), vdupq_n_s8(16));
            let x0 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(lo, vandq_u8(hb0, b16))), s16);
            let x1 = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(hi, vandq_u8(hb1, b16))), s16);
            let yp = y.as_ptr().add(yo + 2) as *const i8;
            let (y0, y1) = (vld1q_s8(yp), vld1q_s8(yp.add(16)));
            fma8(&mut acc, d, lanes_ss(x0, y0), lanes_ss(x1, y1));
        }
        hsum(&acc)
    }
}

/// `ggml_vec_dot_q8_0_q8_0`.
#[target_feature(enable = "neon")]
unsafe fn q8_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 34 bytes are in bounds in both rows (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        for ib in 0..nb {
            let o = ib * 34;
            let d = f16_at(x, o) * f16_at(y, o);
            let xp = x.as_ptr().add(o + 2) as *const i8;
            let yp = y.as_ptr().add(o + 2) as *const i8;
            let l0 = lanes_ss(vld1q_s8(xp), vld1q_s8(yp));
            let l1 = lanes_ss(vld1q_s8(xp.add(16)), vld1q_s8(yp.add(16)));
            fma8(&mut acc, d, l0, l1);
        }
        hsum(&acc)
    }
}

/// `ggml_vec_dot_q4_1_q8_1`.
#[target_feature(enable = "neon")]
unsafe fn q4_1(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 20 and 36 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        let mut summs = 0f32;
        for ib in 0..nb {
            let (xo, yo) = (ib * 20, ib * 36);
            summs = f16_at(x, xo + 2).mul_add(f16_at(y, yo + 2), summs);
            let d = f16_at(x, xo) * f16_at(y, yo);
            let (lo, hi) = nibbles(x.as_ptr().add(xo + 4));
            let yp = y.as_ptr().add(yo + 4) as *const i8;
            let (y0, y1) = (vld1q_s8(yp), vld1q_s8(yp.add(16)));
            fma8(&mut acc, d, lanes_us(lo, y0), lanes_us(hi, y1));
        }
        hsum(&acc) + summs
    }
}

/// `ggml_vec_dot_q5_1_q8_1`.
#[target_feature(enable = "neon")]
unsafe fn q5_1(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 24 and 36 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        let mut summs = 0f32;
        for ib in 0..nb {
            let (xo, yo) = (ib * 24, ib * 36);
            summs = f16_at(x, xo + 2).mul_add(f16_at(y, yo + 2), summs);
            let d = f16_at(x, xo) * f16_at(y, yo);
            let (hb0, hb1) = bytes_from_bits(u32_at(x, xo + 4));
            let (lo, hi) = nibbles(x.as_ptr().add(xo + 8));
            let b16 = vdupq_n_u8(16);
            let x0 = vorrq_u8(lo, vandq_u8(hb0, b16));
            let x1 = vorrq_u8(hi, vandq_u8(hb1, b16));
            let yp = y.as_ptr().add(yo + 4) as *const i8;
            let (y0, y1) = (vld1q_s8(yp), vld1q_s8(yp.add(16)));
            fma8(&mut acc, d, lanes_us(x0, y0), lanes_us(x1, y1));
        }
        hsum(&acc) + summs
    }
}

/// `ggml_vec_dot_q4_K_q8_K`.
#[target_feature(enable = "neon")]
unsafe fn q4_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 144 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        let mut acc_m = [0f32; 4];
        for i in 0..nb {
            let xb = &x[i * 144..i * 144 + 144];
            let yb = &y[i * 292..i * 292 + 292];
            let yd = f32_at(yb, 0);
            let d = yd * f16_at(xb, 0);
            let dmin = -yd * f16_at(xb, 2);
            let (scales, mins) = crate::kernels::dot::q4k_scales_mins_pub(&xb[4..16]);
            // The min terms exactly as the scalar code (4 lanes of hadd+madd, fused).
            let bsum = |i: usize| i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]);
            let q8s: [i16; 8] = std::array::from_fn(|k| bsum(2 * k).wrapping_add(bsum(2 * k + 1)));
            for (l, a) in acc_m.iter_mut().enumerate() {
                let prod = i32::from(mins[2 * l]) * i32::from(q8s[2 * l])
                    + i32::from(mins[2 * l + 1]) * i32::from(q8s[2 * l + 1]);
                *a = dmin.mul_add(prod as f32, *a);
            }
            let q4 = xb.as_ptr().add(16);
            let q8 = yb.as_ptr().add(4) as *const i8;
            let mut s0 = vdupq_n_s32(0);
            let mut s1 = vdupq_n_s32(0);
            for j in 0..4 {
                let (sl, sh) = (i32::from(scales[2 * j]), i32::from(scales[2 * j + 1]));
                let (lo0, hi0) = nibbles(q4.add(32 * j));
                let (lo1, hi1) = nibbles(q4.add(32 * j + 16));
                let yl = q8.add(64 * j);
                let yh = q8.add(64 * j + 32);
                let pl0 = vmulq_n_s32(lanes_us(lo0, vld1q_s8(yl)), sl);
                let pl1 = vmulq_n_s32(lanes_us(lo1, vld1q_s8(yl.add(16))), sl);
                let ph0 = vmulq_n_s32(lanes_us(hi0, vld1q_s8(yh)), sh);
                let ph1 = vmulq_n_s32(lanes_us(hi1, vld1q_s8(yh.add(16))), sh);
                s0 = vaddq_s32(s0, vaddq_s32(pl0, ph0));
                s1 = vaddq_s32(s1, vaddq_s32(pl1, ph1));
            }
            fma8(&mut acc, d, s0, s1);
        }
        let m = (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
        hsum(&acc) + m
    }
}

/// `ggml_vec_dot_q6_K_q8_K`.
#[target_feature(enable = "neon")]
unsafe fn q6_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 210 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        let (m15, m3, m12, m48, m192) = (
            vdupq_n_u8(15),
            vdupq_n_u8(3),
            vdupq_n_u8(12),
            vdupq_n_u8(48),
            vdupq_n_u8(192),
        );
        for i in 0..nb {
            let xb = &x[i * 210..i * 210 + 210];
            let yb = &y[i * 292..i * 292 + 292];
            let yd = f32_at(yb, 0);
            let d = yd * f16_at(xb, 208);
            let scales: [i32; 16] = std::array::from_fn(|k| i32::from(xb[192 + k] as i8));
            let q8 = yb.as_ptr().add(4) as *const i8;
            // Lanes 0..3 (bytes 0..15 of each 32) and 4..7 (bytes 16..31).
            let mut s = [vdupq_n_s32(0); 2];
            for j in 0..2 {
                for h in 0..2 {
                    let ql1 = vld1q_u8(xb.as_ptr().add(64 * j + 16 * h));
                    let ql2 = vld1q_u8(xb.as_ptr().add(64 * j + 32 + 16 * h));
                    let qh = vld1q_u8(xb.as_ptr().add(128 + 32 * j + 16 * h));
                    let q = [
                        vorrq_u8(vandq_u8(ql1, m15), vshlq_n_u8::<4>(vandq_u8(qh, m3))),
                        vorrq_u8(vandq_u8(ql2, m15), vshlq_n_u8::<2>(vandq_u8(qh, m12))),
                        vorrq_u8(vshrq_n_u8::<4>(ql1), vandq_u8(qh, m48)),
                        vorrq_u8(vshrq_n_u8::<4>(ql2), vshrq_n_u8::<2>(vandq_u8(qh, m192))),
                    ];
                    for (k, qk) in q.into_iter().enumerate() {
                        let is = 4 * j + k;
                        let sc = scales[2 * is + h];
                        let y8 = vld1q_s8(q8.add(128 * j + 32 * k + 16 * h));
                        s[h] = vaddq_s32(s[h], vmulq_n_s32(lanes_us(qk, y8), sc));
                    }
                }
            }
            let bsum = |i: usize| i32::from(i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]));
            let sub: [i32; 8] = std::array::from_fn(|l| {
                (bsum(2 * l) * scales[2 * l] + bsum(2 * l + 1) * scales[2 * l + 1]).wrapping_shl(5)
            });
            let s0 = vsubq_s32(s[0], vld1q_s32(sub.as_ptr()));
            let s1 = vsubq_s32(s[1], vld1q_s32(sub.as_ptr().add(4)));
            fma8(&mut acc, d, s0, s1);
        }
        hsum(&acc)
    }
}

/// `ggml_vec_dot_q5_K_q8_K`: the Q4_K lanes with 5-bit values; the mins as the scalar code's
/// `summs += dmin * (float)Σ min·bsum` (fused).
#[target_feature(enable = "neon")]
unsafe fn q5_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 176 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        let mut summs = 0f32;
        let (m15, b16) = (vdupq_n_u8(15), vdupq_n_u8(16));
        for i in 0..nb {
            let xb = &x[i * 176..i * 176 + 176];
            let yb = &y[i * 292..i * 292 + 292];
            let yd = f32_at(yb, 0);
            let d = yd * f16_at(xb, 0);
            let dmin = -yd * f16_at(xb, 2);
            let (scales, mins) = crate::kernels::dot::q4k_scales_mins_pub(&xb[4..16]);
            let mut prod = 0i32;
            for k in 0..8 {
                let q8s = bsum(yb, 2 * k).wrapping_add(bsum(yb, 2 * k + 1));
                prod = prod.wrapping_add(i32::from(mins[k]) * i32::from(q8s));
            }
            summs = dmin.mul_add(prod as f32, summs);
            let q8 = yb.as_ptr().add(4) as *const i8;
            let mut s = zero_i32();
            for h in 0..2 {
                let qh = vld1q_u8(xb.as_ptr().add(16 + 16 * h));
                for j in 0..4 {
                    let bits = vld1q_u8(xb.as_ptr().add(48 + 32 * j + 16 * h));
                    let hl = vandq_u8(vtstq_u8(qh, vdupq_n_u8(1 << (2 * j))), b16);
                    let hh = vandq_u8(vtstq_u8(qh, vdupq_n_u8(2 << (2 * j))), b16);
                    let lo = vorrq_u8(vandq_u8(bits, m15), hl);
                    let hi = vorrq_u8(vshrq_n_u8::<4>(bits), hh);
                    let yl = vld1q_s8(q8.add(64 * j + 16 * h));
                    let yh = vld1q_s8(q8.add(64 * j + 32 + 16 * h));
                    let pl = vmulq_n_s32(lanes_us(lo, yl), i32::from(scales[2 * j]));
                    let ph = vmulq_n_s32(lanes_us(hi, yh), i32::from(scales[2 * j + 1]));
                    s[h] = vaddq_s32(s[h], vaddq_s32(pl, ph));
                }
            }
            fma8(&mut acc, d, s[0], s[1]);
        }
        hsum(&acc) + summs
    }
}

/// `ggml_vec_dot_q2_K_q8_K`: per block `acc = fma(dmin, Σ min·bsum lanes, acc)`, then
/// `acc = fma(d, lanes, acc)`.
#[target_feature(enable = "neon")]
unsafe fn q2_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 84 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        let m3 = vdupq_n_u8(3);
        for i in 0..nb {
            let xb = &x[i * 84..i * 84 + 84];
            let yb = &y[i * 292..i * 292 + 292];
            let yd = f32_at(yb, 0);
            let d = yd * f16_at(xb, 80);
            let dmin = -yd * f16_at(xb, 82);
            // Lane l: min(2l)·bsum(2l) + min(2l+1)·bsum(2l+1), exact.
            let mins = vshrq_n_u8::<4>(vld1q_u8(xb.as_ptr()));
            let bs = yb.as_ptr().add(260) as *const i16;
            let m_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
            let m_hi = vreinterpretq_s16_u16(vmovl_high_u8(mins));
            let (b_lo, b_hi) = (vld1q_s16(bs), vld1q_s16(bs.add(8)));
            let p = |m: int16x8_t, b: int16x8_t| {
                vpaddq_s32(
                    vmull_s16(vget_low_s16(m), vget_low_s16(b)),
                    vmull_high_s16(m, b),
                )
            };
            fma8(&mut acc, dmin, p(m_lo, b_lo), p(m_hi, b_hi));
            let q8 = yb.as_ptr().add(4) as *const i8;
            let mut s = zero_i32();
            for j in 0..2 {
                for h in 0..2 {
                    let bits = vld1q_u8(xb.as_ptr().add(16 + 32 * j + 16 * h));
                    let v = [
                        vandq_u8(bits, m3),
                        vandq_u8(vshrq_n_u8::<2>(bits), m3),
                        vandq_u8(vshrq_n_u8::<4>(bits), m3),
                        vshrq_n_u8::<6>(bits),
                    ];
                    for (k, vk) in v.into_iter().enumerate() {
                        let y8 = vld1q_s8(q8.add(128 * j + 32 * k + 16 * h));
                        let sc = i32::from(xb[8 * j + 2 * k + h] & 15);
                        s[h] = vaddq_s32(s[h], vmulq_n_s32(lanes_us(vk, y8), sc));
                    }
                }
            }
            fma8(&mut acc, d, s[0], s[1]);
        }
        hsum(&acc)
    }
}

/// `ggml_vec_dot_q3_K_q8_K`: lanes like Q2_K with the signed 3-bit values (`low2 - 4` unless
/// the high bit is set, exact products) and the 6-bit scales minus 32.
#[target_feature(enable = "neon")]
unsafe fn q3_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks of 110 and 292 bytes are in bounds (`run`); NEON enabled.
    unsafe {
        let mut acc = zero_acc();
        let (m3, four) = (vdupq_n_u8(3), vdupq_n_u8(4));
        for i in 0..nb {
            let xb = &x[i * 110..i * 110 + 110];
            let yb = &y[i * 292..i * 292 + 292];
            let d = f32_at(yb, 0) * f16_at(xb, 108);
            let sc_bytes: &[u8; 12] = xb[96..108].try_into().unwrap();
            let scales = lamina_core::quant::q3_k_scales(sc_bytes);
            let q8 = yb.as_ptr().add(4) as *const i8;
            let mut s = zero_i32();
            for h in 0..2 {
                let hm = vld1q_u8(xb.as_ptr().add(16 * h));
                for j in 0..2 {
                    let bits = vld1q_u8(xb.as_ptr().add(32 + 32 * j + 16 * h));
                    for k in 0..4 {
                        let low = vandq_u8(vshlq_u8(bits, vdupq_n_s8(-2 * k as i8)), m3);
                        let set = vtstq_u8(hm, vdupq_n_u8(1 << (4 * j + k)));
                        let v = vreinterpretq_s8_u8(vsubq_u8(low, vbicq_u8(four, set)));
                        let y8 = vld1q_s8(q8.add(128 * j + 32 * k + 16 * h));
                        let sc = i32::from(scales[8 * j + 2 * k + h]);
                        s[h] = vaddq_s32(s[h], vmulq_n_s32(dot4(v, y8), sc));
                    }
                }
            }
            fma8(&mut acc, d, s[0], s[1]);
        }
        hsum(&acc)
    }
}

#[cfg(test)]
mod tests {
    //! NEON against the scalar emulation, bit for bit, on random blocks — including raw random
    //! activation bytes (-128, saturating pairs) that real quantizers never produce.
    use super::*;
    use crate::kernels::dot::scalar_dot_fn;
    use crate::kernels::{fp32_to_fp16, quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k};

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn f32(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
        fn f16(&mut self, scale: f32) -> [u8; 2] {
            fp32_to_fp16(self.f32() * scale).to_le_bytes()
        }
    }

    /// Every type with a NEON kernel.
    const TYPES: [DType; 25] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::Q5_K,
        DType::Q2_K,
        DType::Q3_K,
        DType::IQ4_NL,
        DType::MXFP4,
        DType::IQ4_XS,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ1_S,
        DType::IQ1_M,
        DType::NVFP4,
        DType::Q1_0,
        DType::Q2_0,
    ];

    /// Offsets of the f16 scales in a weight block.
    fn weight_scales(dtype: DType) -> &'static [usize] {
        match dtype {
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q6_K => &[208],
            DType::Q2_K => &[80, 82],
            DType::Q3_K => &[108],
            DType::TQ1_0 => &[52],
            DType::TQ2_0 => &[64],
            DType::MXFP4 | DType::NVFP4 | DType::IQ1_M => &[],
            _ => &[0],
        }
    }

    /// Writes finite scales into weight block `b`: the f16 `h` at every f16 scale, E8M0 `e[0]`
    /// (MXFP4), the UE4M3 `e` (NVFP4), or `h` spread over IQ1_M's scale words' top nibbles.
    fn set_scales(dtype: DType, b: &mut [u8], h: [u8; 2], e: [u8; 4]) {
        for &o in weight_scales(dtype) {
            b[o..o + 2].copy_from_slice(&h);
        }
        match dtype {
            DType::MXFP4 => b[0] = e[0],
            DType::NVFP4 => b[..4].copy_from_slice(&e),
            DType::IQ1_M => {
                let h = u16::from_le_bytes(h);
                for k in 0..4 {
                    let o = 48 + 2 * k;
                    let w = u16::from_le_bytes([b[o], b[o + 1]]) & 0x0fff;
                    let w = w | (((h >> (4 * k)) & 0xf) << 12);
                    b[o..o + 2].copy_from_slice(&w.to_le_bytes());
                }
            }
            _ => {}
        }
    }

    fn weights(rng: &mut Rng, dtype: DType, nb: usize) -> Vec<u8> {
        let bs = dtype.type_size() as usize;
        let mut w = rng.bytes(bs * nb);
        for b in w.chunks_exact_mut(bs) {
            let h = rng.f16(0.05);
            let e = match dtype {
                DType::MXFP4 => [118 + (rng.next() % 16) as u8; 4],
                // UE4M3 exponents 2..=10 (0x7F, a NaN, is avoided).
                _ => std::array::from_fn(|_| 0x10 + (rng.next() % 0x48) as u8),
            };
            set_scales(dtype, b, h, e);
        }
        w
    }

    /// Activations of `n` values: quantized from random floats, or (`raw`) random bytes with
    /// finite scales (and, for Q8_K, raw random bsums).
    fn activations(rng: &mut Rng, dtype: DType, n: usize, raw: bool) -> Vec<u8> {
        let vt = lamina_core::quant::vec_dot_type(dtype).unwrap();
        if raw {
            let bs = vt.type_size() as usize;
            let mut o = rng.bytes(n / vt.block_size() as usize * bs);
            for b in o.chunks_exact_mut(bs) {
                match vt {
                    DType::Q8_0 => b[0..2].copy_from_slice(&rng.f16(0.1)),
                    DType::Q8_1 => {
                        b[0..2].copy_from_slice(&rng.f16(0.1));
                        b[2..4].copy_from_slice(&rng.f16(10.0));
                    }
                    DType::Q8_K => b[0..4].copy_from_slice(&(rng.f32() * 0.1).to_le_bytes()),
                    t => panic!("unexpected {t}"),
                }
            }
            return o;
        }
        let v: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0).collect();
        let mut o = vec![0u8; n / vt.block_size() as usize * vt.type_size() as usize];
        match vt {
            DType::Q8_0 => quantize_row_q8_0(&v, &mut o),
            DType::Q8_1 => quantize_row_q8_1(&v, &mut o),
            DType::Q8_K => quantize_row_q8_k(&v, &mut o),
            t => panic!("unexpected {t}"),
        }
        o
    }

    #[test]
    fn neon_dots_match_scalar_bit_for_bit() {
        assert_eq!(
            crate::kernels::detected_isa(),
            crate::kernels::Isa::Neon,
            "NEON should be detected on aarch64"
        );
        let mut rng = Rng(0x0123_4567_89ab_cdef);
        for dtype in TYPES {
            let neon = dot_fn(dtype).unwrap();
            let scalar = scalar_dot_fn(dtype).unwrap();
            let qk = dtype.block_size() as usize;
            let mut nonzero = 0;
            for nb in [1usize, 2, 3, 5, 8, 17] {
                let n = nb * qk;
                for trial in 0..12 {
                    let raw = trial % 2 == 1;
                    let w = weights(&mut rng, dtype, nb);
                    let y = activations(&mut rng, dtype, n, raw);
                    let s = scalar(n, &w, &y);
                    let v = neon(n, &w, &y);
                    assert_eq!(
                        s.to_bits(),
                        v.to_bits(),
                        "{dtype} nb={nb} raw={raw}: {s} vs {v}"
                    );
                    nonzero += usize::from(s != 0.0 && s.is_finite());
                }
            }
            assert!(nonzero > 60, "{dtype}: only {nonzero} finite nonzero dots");
        }
    }

    #[test]
    fn extreme_bytes_match_scalar() {
        // All -128 / all 127 / alternating: the sign-trick wrap-around, i16 saturation and
        // (ternary types) wrapping, the extreme grid indices and signs.
        for dtype in TYPES {
            let neon = dot_fn(dtype).unwrap();
            let scalar = scalar_dot_fn(dtype).unwrap();
            let qk = dtype.block_size() as usize;
            let vt = lamina_core::quant::vec_dot_type(dtype).unwrap();
            let (bx, by) = (dtype.type_size() as usize, vt.type_size() as usize);
            let cases = [
                (0x80u8, 0x80u8),
                (0x7f, 0x80),
                (0x80, 0x7f),
                (0xff, 0x80),
                (0x00, 0x80),
                (0x55, 0x80),
                (0xaa, 0x7f),
                (0xff, 0x7f),
            ];
            for (wb, yb) in cases {
                let nb = 3;
                let mut w = vec![wb; bx * nb];
                for b in w.chunks_exact_mut(bx) {
                    let h = fp32_to_fp16(0.01).to_le_bytes();
                    set_scales(
                        dtype,
                        b,
                        h,
                        [if dtype == DType::MXFP4 { 121 } else { 0x38 }; 4],
                    );
                }
                let n = nb * qk;
                let mut y = vec![yb; by * (n / vt.block_size() as usize)];
                for b in y.chunks_exact_mut(by) {
                    match vt {
                        DType::Q8_K => b[0..4].copy_from_slice(&0.02f32.to_le_bytes()),
                        _ => b[0..2].copy_from_slice(&fp32_to_fp16(0.02).to_le_bytes()),
                    }
                }
                let (s, v) = (scalar(n, &w, &y), neon(n, &w, &y));
                assert_eq!(
                    s.to_bits(),
                    v.to_bits(),
                    "{dtype} {wb:#x}/{yb:#x}: {s} vs {v}"
                );
            }
        }
    }

    #[test]
    fn short_rows_use_the_blocks_present_like_scalar() {
        let mut rng = Rng(5);
        // The scalar IQ4_NL and MXFP4 kernels index by `n` (they need whole rows).
        for dtype in TYPES
            .into_iter()
            .filter(|t| !matches!(t, DType::IQ4_NL | DType::MXFP4))
        {
            let qk = dtype.block_size() as usize;
            let w = weights(&mut rng, dtype, 4);
            let y = activations(&mut rng, dtype, 3 * qk, false);
            let s = scalar_dot_fn(dtype).unwrap()(4 * qk, &w, &y);
            let v = dot_fn(dtype).unwrap()(4 * qk, &w, &y);
            assert_eq!(s.to_bits(), v.to_bits(), "{dtype}");
        }
    }
}
