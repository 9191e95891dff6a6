//! NEON (aarch64) versions of the main quantized dot kernels of `dot.rs`, bit-identical to the
//! scalar emulation of llama.cpp's x86 AVX2 arithmetic: the exact integer lane sums are
//! computed with NEON (including `maddubs`'s i16 saturation and `sign_epi8`'s wrapping
//! negation), then the float steps run in the scalar code's order — one fused multiply-add per
//! lane per block (`vfmaq` is fused like `f32::mul_add`), the block scales and min terms in
//! scalar, and `hsum8` at the end. Like the AVX2 code, they are picked at run time
//! ([`available`]); `LAMINA_FORCE_SCALAR=1` turns them off.

use std::arch::aarch64::*;
use std::sync::OnceLock;

use lamina_core::DType;

use super::dot::DotFn;
use super::{FORCE_SCALAR_ENV, f16_at, hsum8};

/// Whether the NEON kernels may run (NEON present and [`FORCE_SCALAR_ENV`] not `1`); checked
/// once.
pub(crate) fn available() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        !std::env::var(FORCE_SCALAR_ENV).is_ok_and(|v| v == "1")
            && std::arch::is_aarch64_feature_detected!("neon")
    })
}

/// The NEON kernel for weights of `dtype`, or `None` (the caller falls back to scalar).
pub(crate) fn dot_fn(dtype: DType) -> Option<DotFn> {
    Some(match dtype {
        DType::Q4_0 => |n, x, y| run(n, x, y, 18, 34, 32, q4_0),
        DType::Q4_1 => |n, x, y| run(n, x, y, 20, 36, 32, q4_1),
        DType::Q5_0 => |n, x, y| run(n, x, y, 22, 34, 32, q5_0),
        DType::Q5_1 => |n, x, y| run(n, x, y, 24, 36, 32, q5_1),
        DType::Q8_0 => |n, x, y| run(n, x, y, 34, 34, 32, q8_0),
        DType::Q4_K => |n, x, y| run(n, x, y, 144, 292, 256, q4_k),
        DType::Q6_K => |n, x, y| run(n, x, y, 210, 292, 256, q6_k),
        _ => return None,
    })
}

type Kernel = unsafe fn(usize, &[u8], &[u8]) -> f32;

/// Runs kernel `k` over the blocks the scalar code would use: `n / qk`, limited (like its
/// `zip` of `chunks_exact`) by the whole blocks both rows hold.
#[inline(always)]
fn run(n: usize, x: &[u8], y: &[u8], bx: usize, by: usize, qk: usize, k: Kernel) -> f32 {
    let nb = (n / qk).min(x.len() / bx).min(y.len() / by);
    // SAFETY: `dot_fn` is used only when `available()` (NEON present); `x` and `y` hold `nb`
    // whole blocks of `bx` and `by` bytes.
    unsafe { k(nb, x, y) }
}

/// `maddubs_epi16` + `madd_epi16(1, ·)` on 16 bytes: lane `j` (of 4) is the sum of the u8·i8
/// products of bytes `4j..4j+3`, adjacent pairs first summed with i16 saturation.
#[inline(always)]
unsafe fn lanes_us(a: uint8x16_t, b: int8x16_t) -> int32x4_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        // u8 (≤ 255) · i8 fits i16 exactly.
        let a_lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(a)));
        let a_hi = vreinterpretq_s16_u16(vmovl_high_u8(a));
        let p_lo = vmulq_s16(a_lo, vmovl_s8(vget_low_s8(b)));
        let p_hi = vmulq_s16(a_hi, vmovl_high_s8(b));
        // Even and odd products of the 16 bytes, added with saturation: pair k of 8.
        let pairs = vqaddq_s16(vuzp1q_s16(p_lo, p_hi), vuzp2q_s16(p_lo, p_hi));
        vpaddlq_s16(pairs)
    }
}

/// `mul_sum_i8_pairs` on 16 bytes: `|x|` times `sign_epi8(y, x)` (y negated with wrap-around
/// where x < 0, zero where x == 0), then [`lanes_us`].
#[inline(always)]
unsafe fn lanes_ss(x: int8x16_t, y: int8x16_t) -> int32x4_t {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        // vabsq_s8(-128) is -128, i.e. 128 as u8, like `_mm256_sign_epi8(x, x)` read unsigned.
        let ax = vreinterpretq_u8_s8(vabsq_s8(x));
        let sy = vbslq_s8(vcltzq_s8(x), vnegq_s8(y), y);
        let sy = vandq_s8(sy, vreinterpretq_s8_u8(vtstq_s8(x, x)));
        lanes_us(ax, sy)
    }
}

/// `acc[l] = fma(d, (f32)lanes[l], acc[l])` for the 8 lanes (`f32::mul_add` per lane).
#[inline(always)]
unsafe fn fma8(acc: &mut [float32x4_t; 2], d: f32, lo: int32x4_t, hi: int32x4_t) {
    // SAFETY: register-only NEON intrinsics; the caller runs with NEON.
    unsafe {
        acc[0] = vfmaq_n_f32(acc[0], vcvtq_f32_s32(lo), d);
        acc[1] = vfmaq_n_f32(acc[1], vcvtq_f32_s32(hi), d);
    }
}

/// `hsum_float_8` of the 8 accumulator lanes (in the scalar code's order).
#[inline(always)]
unsafe fn hsum(acc: &[float32x4_t; 2]) -> f32 {
    let mut a = [0f32; 8];
    // SAFETY: `a` has room for two 4-lane stores.
    unsafe {
        vst1q_f32(a.as_mut_ptr(), acc[0]);
        vst1q_f32(a.as_mut_ptr().add(4), acc[1]);
    }
    hsum8(&a)
}

#[inline(always)]
unsafe fn zero_acc() -> [float32x4_t; 2] {
    // SAFETY: register-only NEON intrinsic.
    unsafe { [vdupq_n_f32(0.0); 2] }
}

/// Low nibbles (values 0..16) and high nibbles (values 16..32) of the 16 bytes at `p`.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> (uint8x16_t, uint8x16_t) {
    // SAFETY: the caller passes 16 readable bytes and runs with NEON.
    unsafe {
        let v = vld1q_u8(p);
        (vandq_u8(v, vdupq_n_u8(15)), vshrq_n_u8::<4>(v))
    }
}

/// `bytes_from_bits_32`: byte `i` (of 32) is 0xFF when bit `i` of `bits` is set.
#[inline(always)]
unsafe fn bytes_from_bits(bits: u32) -> (uint8x16_t, uint8x16_t) {
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
fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}

#[inline(always)]
fn f32_at(b: &[u8], off: usize) -> f32 {
    f32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
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
            let (scales, mins) = super::dot::q4k_scales_mins_pub(&xb[4..16]);
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

    const TYPES: [DType; 7] = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ];

    /// Offsets of the f16 scales in a weight block.
    fn weight_scales(dtype: DType) -> &'static [usize] {
        match dtype {
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K => &[0, 2],
            DType::Q6_K => &[208],
            _ => unreachable!(),
        }
    }

    fn weights(rng: &mut Rng, dtype: DType, nb: usize) -> Vec<u8> {
        let bs = dtype.type_size() as usize;
        let mut w = rng.bytes(bs * nb);
        for b in w.chunks_exact_mut(bs) {
            for &o in weight_scales(dtype) {
                let h = rng.f16(0.05);
                b[o..o + 2].copy_from_slice(&h);
            }
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
        assert!(available(), "NEON should be detected on aarch64");
        let mut rng = Rng(0x0123_4567_89ab_cdef);
        for dtype in TYPES {
            let neon = dot_fn(dtype).unwrap();
            let scalar = scalar_dot_fn(dtype).unwrap();
            let qk = dtype.block_size() as usize;
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
                }
            }
        }
    }

    #[test]
    fn extreme_bytes_match_scalar() {
        // All -128 / all 127 / alternating: the sign-trick wrap-around and i16 saturation.
        for dtype in TYPES {
            let neon = dot_fn(dtype).unwrap();
            let scalar = scalar_dot_fn(dtype).unwrap();
            let qk = dtype.block_size() as usize;
            let vt = lamina_core::quant::vec_dot_type(dtype).unwrap();
            let (bx, by) = (dtype.type_size() as usize, vt.type_size() as usize);
            for (wb, yb) in [(0x80u8, 0x80u8), (0x7f, 0x80), (0x80, 0x7f), (0xff, 0x80)] {
                let nb = 3;
                let mut w = vec![wb; bx * nb];
                for b in w.chunks_exact_mut(bx) {
                    for &o in weight_scales(dtype) {
                        b[o..o + 2].copy_from_slice(&fp32_to_fp16(0.01).to_le_bytes());
                    }
                }
                let mut y = vec![yb; by * nb];
                for b in y.chunks_exact_mut(by) {
                    match vt {
                        DType::Q8_K => b[0..4].copy_from_slice(&0.02f32.to_le_bytes()),
                        _ => b[0..2].copy_from_slice(&fp32_to_fp16(0.02).to_le_bytes()),
                    }
                }
                let n = nb * qk;
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
        for dtype in TYPES {
            let qk = dtype.block_size() as usize;
            let w = weights(&mut rng, dtype, 4);
            let y = activations(&mut rng, dtype, 3 * qk, false);
            let s = scalar_dot_fn(dtype).unwrap()(4 * qk, &w, &y);
            let v = dot_fn(dtype).unwrap()(4 * qk, &w, &y);
            assert_eq!(s.to_bits(), v.to_bits(), "{dtype}");
        }
    }
}
