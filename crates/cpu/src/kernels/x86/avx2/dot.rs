//! Ports of the AVX2 branches of `arch/x86/quants.c`.
use crate::kernels::dot::DotFn;
use crate::kernels::x86::*;
use lamina_core::DType;

/// The f16 at byte `off` of `b` as f32, with F16C and no bounds check (exact, as ggml's
/// `GGML_CPU_FP16_TO_FP32`). The kernels below call it inside blocks that [`check`] has
/// already bounds-checked; a checked, software conversion per scale was a third of the
/// time of a short dot product.
///
/// # Safety
/// `off + 2 <= b.len()`; F16C is enabled in the caller.
#[inline(always)]
unsafe fn f16_at(b: &[u8], off: usize) -> f32 {
    debug_assert!(off + 2 <= b.len());
    // SAFETY: in bounds by the caller's contract (4 bytes read only when they are); F16C
    // enabled by the caller.
    unsafe {
        let p = b.as_ptr().add(off);
        // A 32-bit load becomes a zero-extending `vmovd`; a 16-bit one an insert into some
        // live register, which would make every scale conversion wait for that register's
        // last writer (the loop-carried FMA) and halve the speed of short dot products.
        let v = if off + 4 <= b.len() {
            p.cast::<i32>().read_unaligned()
        } else {
            i32::from(p.cast::<u16>().read_unaligned())
        };
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(v)))
    }
}

/// [`f16_at`] for a scale that at least 2 more bytes of the block follow: one unconditional
/// 32-bit load, zero-extending into a fresh vector (`vmovd`).
///
/// # Safety
/// `off + 4 <= b.len()`; F16C is enabled in the caller.
#[inline(always)]
unsafe fn f16_in_block(b: &[u8], off: usize) -> f32 {
    debug_assert!(off + 4 <= b.len());
    // SAFETY: in bounds by the caller's contract; F16C enabled by the caller.
    unsafe {
        let v: __m128i;
        // `vmovd` from memory zero-extends into a fresh register; written as asm because
        // LLVM narrows any 32-bit load feeding one f16 to a `vpinsrw` into a live register.
        core::arch::asm!(
            "vmovd {v}, dword ptr [{p}]",
            p = in(reg) b.as_ptr().add(off),
            v = lateout(xmm_reg) v,
            options(pure, readonly, nostack, preserves_flags)
        );
        _mm_cvtss_f32(_mm_cvtph_ps(v))
    }
}

/// The two little-endian f16 at `b[off..off + 4]` as lanes 0 and 1 (lanes 2 and 3 zero): one
/// load and one conversion for a block's pair of scales (`d` and `m`, or `d` and `s`), where
/// [`f16_in_block`] twice would convert twice.
///
/// # Safety
/// `off + 4 <= b.len()`; F16C is enabled in the caller.
#[inline(always)]
unsafe fn f16x2_in_block(b: &[u8], off: usize) -> __m128 {
    debug_assert!(off + 4 <= b.len());
    // SAFETY: in bounds by the caller's contract; F16C enabled by the caller.
    unsafe {
        let v: __m128i;
        // As in `f16_in_block`: a fresh zero-extended register, not an insert.
        core::arch::asm!(
            "vmovd {v}, dword ptr [{p}]",
            p = in(reg) b.as_ptr().add(off),
            v = lateout(xmm_reg) v,
            options(pure, readonly, nostack, preserves_flags)
        );
        _mm_cvtph_ps(v)
    }
}

pub fn dot_fn(dtype: DType) -> Option<DotFn> {
    Some(match dtype {
        DType::Q4_0 => |n, x, y| check(n, x, y, DType::Q4_0, q4_0),
        DType::Q4_1 => |n, x, y| check(n, x, y, DType::Q4_1, q4_1),
        DType::Q5_0 => |n, x, y| check(n, x, y, DType::Q5_0, q5_0),
        DType::Q5_1 => |n, x, y| check(n, x, y, DType::Q5_1, q5_1),
        DType::Q8_0 => |n, x, y| check(n, x, y, DType::Q8_0, q8_0),
        DType::Q4_K => |n, x, y| check(n, x, y, DType::Q4_K, q4_k),
        DType::Q6_K => |n, x, y| check(n, x, y, DType::Q6_K, q6_k),
        DType::IQ4_NL => |n, x, y| check(n, x, y, DType::IQ4_NL, iq4_nl),
        DType::MXFP4 => |n, x, y| check(n, x, y, DType::MXFP4, mxfp4),
        DType::Q5_K => |n, x, y| check(n, x, y, DType::Q5_K, q5_k),
        DType::Q2_K => |n, x, y| check(n, x, y, DType::Q2_K, q2_k),
        DType::IQ4_XS => |n, x, y| check(n, x, y, DType::IQ4_XS, iq4_xs),
        DType::Q3_K => |n, x, y| check(n, x, y, DType::Q3_K, q3_k),
        DType::TQ1_0 => |n, x, y| check(n, x, y, DType::TQ1_0, tq1_0),
        DType::TQ2_0 => |n, x, y| check(n, x, y, DType::TQ2_0, tq2_0),
        DType::NVFP4 => |n, x, y| check(n, x, y, DType::NVFP4, nvfp4),
        DType::Q1_0 => |n, x, y| check(n, x, y, DType::Q1_0, q1_0),
        DType::Q2_0 => |n, x, y| check(n, x, y, DType::Q2_0, q2_0),
        DType::IQ2_XXS => |n, x, y| check(n, x, y, DType::IQ2_XXS, iq2_xxs),
        DType::IQ2_XS => |n, x, y| check(n, x, y, DType::IQ2_XS, iq2_xs),
        DType::IQ2_S => |n, x, y| check(n, x, y, DType::IQ2_S, iq2_s),
        DType::IQ3_XXS => |n, x, y| check(n, x, y, DType::IQ3_XXS, iq3_xxs),
        DType::IQ3_S => |n, x, y| check(n, x, y, DType::IQ3_S, iq3_s),
        DType::IQ1_S => |n, x, y| check(n, x, y, DType::IQ1_S, iq1_s),
        DType::IQ1_M => |n, x, y| check(n, x, y, DType::IQ1_M, iq1_m),
        _ => return None,
    })
}

type Kernel = unsafe fn(usize, &[u8], &[u8]) -> f32;

/// Bounds check, then the AVX2 kernel over `n / qk` blocks.
#[inline(always)]
fn check(n: usize, x: &[u8], y: &[u8], dtype: DType, k: Kernel) -> f32 {
    let (bx, by, qk) = crate::kernels::table::geometry(dtype).expect("a quantized type");
    let nb = n / qk;
    assert!(
        x.len() >= nb * bx && y.len() >= nb * by,
        "dot rows too short"
    );
    // SAFETY: `dot_fn`'s kernels are reached only through the AVX2 and AVX-512 tables,
    // which exist only where AVX2/FMA/F16C are present; the rows hold
    // `nb` blocks (checked above).
    unsafe { k(nb, x, y) }
}

/// ggml's `keven_signs_q2xs` as u64: byte `j` of entry `s` is -1 where bit `j` of
/// `ksigns_iq2xs[s]` (the 7 bits of `s` and their parity) is set, else +1.
pub(crate) const KEVEN_SIGNS: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut s = 0;
    while s < 128 {
        let full = s | (((s as u32).count_ones() as usize & 1) << 7);
        let mut v = 0u64;
        let mut j = 0;
        while j < 8 {
            let b: u64 = if (full >> j) & 1 != 0 { 0xff } else { 0x01 };
            v |= b << (8 * j);
            j += 1;
        }
        t[s] = v;
        s += 1;
    }
    t
};

/// The little-endian u32 at `p`.
///
/// # Safety
/// `p..p + 4` readable.
#[inline(always)]
pub(crate) unsafe fn rd32(p: *const u8) -> u32 {
    // SAFETY: by the caller's contract.
    unsafe { u32::from_le_bytes(*(p as *const [u8; 4])) }
}

/// Four u64 lanes (`a[0]` lowest) as a vector.
#[inline(always)]
pub(crate) fn set4(a: [u64; 4]) -> __m256i {
    // SAFETY: `_mm256_set_epi64x` only moves values (AVX, enabled in every caller).
    unsafe { _mm256_set_epi64x(a[3] as i64, a[2] as i64, a[1] as i64, a[0] as i64) }
}

/// Eight u32 lanes (`a[0]` lowest) as a vector.
#[inline(always)]
fn set8(a: [u32; 8]) -> __m256i {
    // SAFETY: as in `set4`.
    unsafe {
        _mm256_set_epi32(
            a[7] as i32,
            a[6] as i32,
            a[5] as i32,
            a[4] as i32,
            a[3] as i32,
            a[2] as i32,
            a[1] as i32,
            a[0] as i32,
        )
    }
}

/// `ggml_vec_dot_iq{2_s,3_s}`'s sign expansion: 32 sign bits (4 bytes at `s`) to 0/-1 bytes.
///
/// # Safety
/// `s..s + 4` readable; AVX2 enabled in the caller.
#[inline(always)]
unsafe fn sign_mask32(s: *const u8) -> __m256i {
    // SAFETY: by the caller's contract.
    unsafe {
        let mask1 = _mm256_set_epi64x(
            0x0303_0303_0303_0303,
            0x0202_0202_0202_0202,
            0x0101_0101_0101_0101,
            0,
        );
        let mask2 = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let aux = _mm256_set1_epi32(rd32(s) as i32);
        let aux = _mm256_and_si256(_mm256_shuffle_epi8(aux, mask1), mask2);
        _mm256_cmpeq_epi8(aux, mask2)
    }
}

/// `(q8 ^ s) - s`: the activations negated where `s` is -1.
#[inline(always)]
unsafe fn apply_mask(q8: __m256i, s: __m256i) -> __m256i {
    // SAFETY: AVX2 enabled in the caller.
    unsafe { _mm256_sub_epi8(_mm256_xor_si256(s, q8), s) }
}

/// `madd(maddubs(grid, q8s), scales)`: 8 i32 lanes.
#[inline(always)]
unsafe fn grid_dot(grid: __m256i, q8s: __m256i, scales: __m256i) -> __m256i {
    // SAFETY: AVX2 enabled in the caller.
    unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(grid, q8s), scales) }
}

/// The scale vector of 32 values: i16 lanes 0-7 (values 0..16) `lo`, 8-15 `hi`.
#[inline(always)]
unsafe fn scales2(lo: i32, hi: i32) -> __m256i {
    // SAFETY: AVX2 enabled in the caller.
    unsafe { _mm256_set_m128i(_mm_set1_epi16(hi as i16), _mm_set1_epi16(lo as i16)) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq2_xxs(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::IQ2XXS_GRID as G;
    // SAFETY: `nb` blocks in bounds (checked by `check`); AVX2/FMA/F16C enabled.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 66);
            let yb = y.as_ptr().add(i * 292);
            let d = f16_in_block(x, i * 66) * f32::from_le_bytes(*(yb as *const [u8; 4]));
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..8 {
                let a0 = rd32(xb.add(2 + 8 * ib));
                let a1 = rd32(xb.add(6 + 8 * ib));
                let q2 = set4(std::array::from_fn(|l| {
                    G[((a0 >> (8 * l)) & 0xff) as usize]
                }));
                let s2 = set4(std::array::from_fn(|l| {
                    KEVEN_SIGNS[((a1 >> (7 * l)) & 127) as usize]
                }));
                let q8 = _mm256_loadu_si256(yb.add(4 + 32 * ib) as *const __m256i);
                let ls = (2 * (a1 >> 28) + 1) as i16;
                let p = grid_dot(q2, _mm256_sign_epi8(q8, s2), _mm256_set1_epi16(ls));
                sumi = _mm256_add_epi32(sumi, p);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        0.125 * hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq2_xs(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::IQ2XS_GRID as G;
    // SAFETY: as in `iq2_xxs`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 74);
            let yb = y.as_ptr().add(i * 292);
            let d = f16_in_block(x, i * 74) * f32::from_le_bytes(*(yb as *const [u8; 4]));
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..8 {
                let q =
                    |l: usize| u16::from_le_bytes(*(xb.add(2 + 8 * ib + 2 * l) as *const [u8; 2]));
                let q2 = set4(std::array::from_fn(|l| G[usize::from(q(l) & 511)]));
                let s2 = set4(std::array::from_fn(|l| KEVEN_SIGNS[usize::from(q(l) >> 9)]));
                let q8 = _mm256_loadu_si256(yb.add(4 + 32 * ib) as *const __m256i);
                let sc = *xb.add(66 + ib);
                let scales = scales2(2 * i32::from(sc & 0xf) + 1, 2 * i32::from(sc >> 4) + 1);
                let p = grid_dot(q2, _mm256_sign_epi8(q8, s2), scales);
                sumi = _mm256_add_epi32(sumi, p);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        0.125 * hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq2_s(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::IQ2S_GRID as G;
    // SAFETY: as in `iq2_xxs`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 82);
            let yb = y.as_ptr().add(i * 292);
            let d = f16_in_block(x, i * 82) * f32::from_le_bytes(*(yb as *const [u8; 4]));
            let qs = xb.add(2);
            let qh = xb.add(66);
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..8 {
                let h = usize::from(*qh.add(ib));
                let q2 = set4(std::array::from_fn(|l| {
                    G[usize::from(*qs.add(4 * ib + l)) | ((h << (8 - 2 * l)) & 0x300)]
                }));
                let q8 = _mm256_loadu_si256(yb.add(4 + 32 * ib) as *const __m256i);
                let q8s = apply_mask(q8, sign_mask32(qs.add(32 + 4 * ib)));
                let sc = *xb.add(74 + ib);
                let scales = scales2(2 * i32::from(sc & 0xf) + 1, 2 * i32::from(sc >> 4) + 1);
                sumi = _mm256_add_epi32(sumi, grid_dot(q2, q8s, scales));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        0.125 * hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3_xxs(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::IQ3XXS_GRID as G;
    // SAFETY: as in `iq2_xxs`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 98);
            let yb = y.as_ptr().add(i * 292);
            let d = f16_in_block(x, i * 98) * f32::from_le_bytes(*(yb as *const [u8; 4]));
            let q3 = xb.add(2);
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..8 {
                let g = set8(std::array::from_fn(|k| G[usize::from(*q3.add(8 * ib + k))]));
                let aux = rd32(q3.add(64 + 4 * ib));
                let s2 = set4(std::array::from_fn(|l| {
                    KEVEN_SIGNS[((aux >> (7 * l)) & 127) as usize]
                }));
                let q8 = _mm256_loadu_si256(yb.add(4 + 32 * ib) as *const __m256i);
                let ls = (2 * (aux >> 28) + 1) as i16;
                let p = grid_dot(g, _mm256_sign_epi8(q8, s2), _mm256_set1_epi16(ls));
                sumi = _mm256_add_epi32(sumi, p);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        0.25 * hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq3_s(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::IQ3S_GRID as G;
    // SAFETY: as in `iq2_xxs`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 110);
            let yb = y.as_ptr().add(i * 292);
            let d = f16_in_block(x, i * 110) * f32::from_le_bytes(*(yb as *const [u8; 4]));
            let qs = xb.add(2);
            let qh = xb.add(66);
            let signs = xb.add(74);
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..8 {
                let h = usize::from(*qh.add(ib));
                let g = set8(std::array::from_fn(|k| {
                    G[usize::from(*qs.add(8 * ib + k)) | ((h << (8 - k)) & 256)]
                }));
                let q8 = _mm256_loadu_si256(yb.add(4 + 32 * ib) as *const __m256i);
                let q8s = apply_mask(q8, sign_mask32(signs.add(4 * ib)));
                let sc = *xb.add(106 + ib / 2) >> (4 * (ib % 2));
                let ls = (2 * i32::from(sc & 0xf) + 1) as i16;
                sumi = _mm256_add_epi32(sumi, grid_dot(g, q8s, _mm256_set1_epi16(ls)));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_float_8(acc)
    }
}

/// `mul_add_epi8`: `maddubs(|x|, sign(y, x))`.
#[inline(always)]
unsafe fn mul_add_epi8(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: AVX2 enabled in the caller.
    unsafe { _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)) }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_s(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{IQ1S_DELTA, IQ1S_GRID as G};
    // SAFETY: as in `iq2_xxs`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut accum1 = 0f32;
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 50);
            let yb = y.as_ptr().add(i * 292);
            let qs = xb.add(2);
            let bsum =
                |t: usize| i32::from(i16::from_le_bytes(*(yb.add(260 + 2 * t) as *const [u8; 2])));
            let mut sumi = _mm256_setzero_si256();
            let mut sumi1 = 0i32;
            for ib in 0..8 {
                let qh = usize::from(u16::from_le_bytes(*(xb.add(34 + 2 * ib) as *const [u8; 2])));
                let g = set4(std::array::from_fn(|l| {
                    G[usize::from(*qs.add(4 * ib + l)) | (((qh >> (3 * l)) & 7) << 8)]
                }));
                let q8 = _mm256_loadu_si256(yb.add(4 + 32 * ib) as *const __m256i);
                let ls = 2 * ((qh >> 12) & 7) as i32 + 1;
                let p = _mm256_madd_epi16(mul_add_epi8(g, q8), _mm256_set1_epi16(ls as i16));
                sumi = _mm256_add_epi32(sumi, p);
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                sumi1 = sumi1.wrapping_add(
                    (bsum(2 * ib) + bsum(2 * ib + 1))
                        .wrapping_mul(delta)
                        .wrapping_mul(ls),
                );
            }
            let d = f32::from_le_bytes(*(yb as *const [u8; 4])) * f16_in_block(x, i * 50);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
            accum1 = d.mul_add(sumi1 as f32, accum1);
        }
        IQ1S_DELTA.mul_add(accum1, hsum_float_8(acc))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq1_m(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{IQ1S_DELTA, IQ1S_GRID as G};
    // SAFETY: as in `iq2_xxs`.
    unsafe {
        let mut acc1 = _mm256_setzero_ps();
        let mut acc2 = _mm256_setzero_ps();
        let ones = _mm256_set1_epi8(1);
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 56);
            let yb = y.as_ptr().add(i * 292);
            let qs = xb;
            let qh = xb.add(32);
            let sc: [u16; 4] = std::array::from_fn(|k| {
                u16::from_le_bytes(*(xb.add(48 + 2 * k) as *const [u8; 2]))
            });
            let mut sumi1 = _mm256_setzero_si256();
            let mut sumi2 = _mm256_setzero_si256();
            for ib in 0..8 {
                let mut g = [0u64; 4];
                let mut dl = [0u64; 4];
                for l in 0..4 {
                    let h = u16::from(*qh.add(2 * ib + l / 2));
                    let (idx, neg) = if l % 2 == 0 {
                        ((h << 8) & 0x700, h & 0x08 != 0)
                    } else {
                        ((h << 4) & 0x700, h & 0x80 != 0)
                    };
                    g[l] = G[usize::from(u16::from(*qs.add(4 * ib + l)) | idx)];
                    dl[l] = if neg { u64::MAX } else { 0x0101_0101_0101_0101 };
                }
                let q8 = _mm256_loadu_si256(yb.add(4 + 32 * ib) as *const __m256i);
                let ls = |k: usize| 2 * i32::from((sc[ib / 2] >> (6 * (ib % 2) + 3 * k)) & 7) + 1;
                let scales = scales2(ls(0), ls(1));
                let p1 = _mm256_madd_epi16(mul_add_epi8(set4(g), q8), scales);
                let p2 = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(ones, _mm256_sign_epi8(q8, set4(dl))),
                    scales,
                );
                sumi1 = _mm256_add_epi32(sumi1, p1);
                sumi2 = _mm256_add_epi32(sumi2, p2);
            }
            let scale = (sc[0] >> 12)
                | ((sc[1] >> 8) & 0x00f0)
                | ((sc[2] >> 4) & 0x0f00)
                | (sc[3] & 0xf000);
            let d =
                f32::from_le_bytes(*(yb as *const [u8; 4])) * half::f16::from_bits(scale).to_f32();
            let dv = _mm256_set1_ps(d);
            acc1 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(sumi1), acc1);
            acc2 = _mm256_fmadd_ps(dv, _mm256_cvtepi32_ps(sumi2), acc2);
        }
        IQ1S_DELTA.mul_add(hsum_float_8(acc2), hsum_float_8(acc1))
    }
}

/// Kernels without hand-written intrinsics: the scalar emulation compiled with FMA
/// enabled (same operations, so the same bits; `mul_add` becomes `vfmadd`).
macro_rules! fma_build {
    ($($name:ident => $scalar:ident, $bx:expr, $by:expr, $qk:expr;)*) => {$(
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(nb: usize, x: &[u8], y: &[u8]) -> f32 {
            crate::kernels::dot::$scalar(nb * $qk, &x[..nb * $bx], &y[..nb * $by])
        }
    )*};
}
fma_build! {
    iq4_nl => dot_iq4_nl, 18, 34, 32;
    mxfp4 => dot_mxfp4, 17, 34, 32;
    q3_k => dot_q3_k, 110, 292, 256;
    q2_0 => dot_q2_0, 18, 68, 64;
}

/// `ggml_vec_dot_q2_K_q8_K`: per block `acc = fmadd(dmin, madd(mins, bsums), acc)`, then
/// `acc = fmadd(d, Σ madd(maddubs(q2, q8), scales), acc)`; `hsum_float_8`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q2_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks in bounds (checked by `check`); AVX2/FMA/F16C enabled.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 84);
            let yb = y.as_ptr().add(i * 292);
            let yd = f32::from_le_bytes(*(yb as *const [u8; 4]));
            let d = yd * f16_in_block(x, i * 84 + 80);
            // The block's last 2 bytes: a 16-bit load (a 4-byte one could leave the row).
            let hm = u16::from_le_bytes([*xb.add(82), *xb.add(83)]);
            let dmin = -yd * _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(hm))));
            let sc = _mm_loadu_si128(xb as *const __m128i);
            let mins =
                _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(sc, 4), _mm_set1_epi8(15)));
            let bsums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
            let prod = _mm256_madd_epi16(mins, bsums);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dmin), _mm256_cvtepi32_ps(prod), acc);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..2 {
                let bits = _mm256_loadu_si256(xb.add(16 + 32 * j) as *const __m256i);
                for k in 0..4 {
                    let v = _mm256_and_si256(
                        _mm256_srl_epi16(bits, _mm_cvtsi32_si128(2 * k as i32)),
                        m3,
                    );
                    let y8 = _mm256_loadu_si256(yb.add(4 + 128 * j + 32 * k) as *const __m256i);
                    let s = 8 * j + 2 * k;
                    let scales = _mm256_set_m128i(
                        _mm_set1_epi16(i16::from(*xb.add(s + 1) & 15)),
                        _mm_set1_epi16(i16::from(*xb.add(s) & 15)),
                    );
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(v, y8), scales);
                    sumi = _mm256_add_epi32(sumi, p);
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_float_8(acc)
    }
}

/// The i32 lanes of a pair of 32-value K-quant sub-blocks against their 64 Q8_K values at
/// `y`: `madd(maddubs(lo, y[..32]), sc_lo) + madd(maddubs(hi, y[32..]), sc_hi)`, with `lo`/`hi`
/// the sub-blocks' unsigned values (below 32) and `sc_*` their 6-bit scales. Exact: no
/// `maddubs` pair sum reaches 2^15.
///
/// # Safety
/// 64 readable bytes at `y`; AVX2 enabled by the caller.
#[inline(always)]
pub(crate) unsafe fn k_pair_lanes(
    lo: __m256i,
    hi: __m256i,
    y: *const u8,
    sc_lo: u8,
    sc_hi: u8,
) -> __m256i {
    // SAFETY: by the caller's contract.
    unsafe {
        let yl = _mm256_loadu_si256(y.cast());
        let yh = _mm256_loadu_si256(y.add(32).cast());
        let pl = _mm256_madd_epi16(
            _mm256_maddubs_epi16(lo, yl),
            _mm256_set1_epi16(i16::from(sc_lo)),
        );
        let ph = _mm256_madd_epi16(
            _mm256_maddubs_epi16(hi, yh),
            _mm256_set1_epi16(i16::from(sc_hi)),
        );
        _mm256_add_epi32(pl, ph)
    }
}

/// `ggml_vec_dot_q5_K_q8_K`: Q4_K's lanes with 5-bit values; the mins to a scalar
/// `summs = fma(dmin, (float)Σ min·bsum, summs)`; `hsum_float_8(acc) + summs`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks in bounds (checked by `check`); AVX2/FMA/F16C enabled.
    unsafe {
        let m15 = _mm256_set1_epi8(15);
        let one = _mm256_set1_epi8(1);
        let mut acc = _mm256_setzero_ps();
        let mut summs = 0f32;
        for i in 0..nb {
            let xs = &x[i * 176..i * 176 + 176];
            let xb = xs.as_ptr();
            let yb = y.as_ptr().add(i * 292);
            let yd = f32::from_le_bytes(*(yb as *const [u8; 4]));
            let d = yd * f16_in_block(x, i * 176);
            let dmin = -yd * f16_in_block(x, i * 176 + 2);
            let (scales, mins) = crate::kernels::dot::q4k_scales_mins(&xs[4..16]);
            let bsum = |t: usize| i16::from_le_bytes([*yb.add(260 + 2 * t), *yb.add(261 + 2 * t)]);
            let mut prod = 0i32;
            for k in 0..8 {
                let q8s = bsum(2 * k).wrapping_add(bsum(2 * k + 1));
                prod = prod.wrapping_add(i32::from(mins[k]) * i32::from(q8s));
            }
            summs = dmin.mul_add(prod as f32, summs);
            let qh = _mm256_loadu_si256(xb.add(16) as *const __m256i);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..4 {
                let bits = _mm256_loadu_si256(xb.add(48 + 32 * j) as *const __m256i);
                let hl =
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32)), one);
                let hh = _mm256_and_si256(
                    _mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * j as i32 + 1)),
                    one,
                );
                let lo = _mm256_or_si256(_mm256_and_si256(bits, m15), _mm256_slli_epi16(hl, 4));
                let hi = _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(bits, 4), m15),
                    _mm256_slli_epi16(hh, 4),
                );
                let p = k_pair_lanes(lo, hi, yb.add(4 + 64 * j), scales[2 * j], scales[2 * j + 1]);
                sumi = _mm256_add_epi32(sumi, p);
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_float_8(acc) + summs
    }
}

/// `ggml_vec_dot_iq4_xs_q8_K`: per 32 values `madd(mul_add_epi8(q4, q8), ls - 32)` into
/// 8 i32 lanes, one `fmadd(d, lanes, acc)` per superblock, `hsum_float_8`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn iq4_xs(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks in bounds (checked by `check`); AVX2/FMA/F16C enabled.
    unsafe {
        let t = _mm_loadu_si128(crate::kernels::dot::KVALUES_IQ4NL.as_ptr() as *const __m128i);
        let table = _mm256_insertf128_si256(_mm256_castsi128_si256(t), t, 1);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 136);
            let yb = y.as_ptr().add(i * 292);
            let d = f16_in_block(x, i * 136) * f32::from_le_bytes(*(yb as *const [u8; 4]));
            let sh = u32::from(u16::from_le_bytes([*xb.add(2), *xb.add(3)]));
            let mut sumi = _mm256_setzero_si256();
            for ib in 0..8 {
                let lo = (u32::from(*xb.add(4 + ib / 2)) >> (4 * (ib % 2))) & 0xf;
                let ls = (lo | (((sh >> (2 * ib)) & 3) << 4)) as i16 - 32;
                let q = _mm256_shuffle_epi8(table, bytes_from_nibbles_32(xb.add(8 + 16 * ib)));
                let q8 = _mm256_loadu_si256(yb.add(4 + 32 * ib) as *const __m256i);
                let dot = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(q8, q));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(dot, _mm256_set1_epi16(ls)));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: `nb` blocks in bounds (checked by `check`); AVX2 enabled.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for ib in 0..nb {
            let xb = x.as_ptr().add(ib * 18);
            let yb = y.as_ptr().add(ib * 34);
            let d = _mm256_set1_ps(f16_in_block(x, ib * 18) * f16_in_block(y, ib * 34));
            let qx = _mm256_sub_epi8(bytes_from_nibbles_32(xb.add(2)), _mm256_set1_epi8(8));
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for ib in 0..nb {
            let xb = x.as_ptr().add(ib * 22);
            let yb = y.as_ptr().add(ib * 34);
            let d = _mm256_set1_ps(f16_in_block(x, ib * 22) * f16_in_block(y, ib * 34));
            let mut qx = bytes_from_nibbles_32(xb.add(6));
            let qh = u32::from_le_bytes([*xb.add(2), *xb.add(3), *xb.add(4), *xb.add(5)]);
            let bxhi = _mm256_andnot_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0xF0u8 as i8));
            qx = _mm256_or_si256(qx, bxhi);
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q8_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for ib in 0..nb {
            let xb = x.as_ptr().add(ib * 34);
            let yb = y.as_ptr().add(ib * 34);
            let d = _mm256_set1_ps(f16_in_block(x, ib * 34) * f16_in_block(y, ib * 34));
            let qx = _mm256_loadu_si256(xb.add(2) as *const __m256i);
            let qy = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            acc = _mm256_fmadd_ps(d, mul_sum_i8_pairs_float(qx, qy), acc);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_1(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut summs = _mm_setzero_ps();
        for ib in 0..nb {
            let xb = x.as_ptr().add(ib * 20);
            let yb = y.as_ptr().add(ib * 36);
            // (d, m) and (d, s) side by side: lane 0 of their product is `d·d`, lane 1 of the
            // running FMA ggml's `summs` (lane 0 of it is never read), with the roundings of
            // the scalar steps. Two conversions a block instead of four: llvm-mca puts the
            // loop at 4.2 instead of 4.7 cycles a block on znver3, 5.0 instead of 6.8 on
            // skylake and icelake-server.
            let xs = f16x2_in_block(x, ib * 20);
            let ys = f16x2_in_block(y, ib * 36);
            summs = _mm_fmadd_ps(xs, ys, summs);
            let d0d1 = _mm256_broadcastss_ps(_mm_mul_ps(xs, ys));
            let qx = bytes_from_nibbles_32(xb.add(4));
            let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            acc = _mm256_fmadd_ps(d0d1, mul_sum_us8_pairs_float(qx, qy), acc);
        }
        hsum_float_8(acc) + _mm_cvtss_f32(_mm_movehdup_ps(summs))
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q5_1(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        let mut summs = _mm_setzero_ps();
        for ib in 0..nb {
            let xb = x.as_ptr().add(ib * 24);
            let yb = y.as_ptr().add(ib * 36);
            // As in `q4_1`: (d, m)·(d, s) in one conversion per side.
            let xs = f16x2_in_block(x, ib * 24);
            let ys = f16x2_in_block(y, ib * 36);
            summs = _mm_fmadd_ps(xs, ys, summs);
            let mut qx = bytes_from_nibbles_32(xb.add(8));
            let qh = u32::from_le_bytes([*xb.add(4), *xb.add(5), *xb.add(6), *xb.add(7)]);
            let bxhi = _mm256_and_si256(bytes_from_bits_32(qh), _mm256_set1_epi8(0x10));
            qx = _mm256_or_si256(qx, bxhi);
            let qy = _mm256_loadu_si256(yb.add(4) as *const __m256i);
            let q = mul_sum_us8_pairs_float(qx, qy);
            acc = _mm256_fmadd_ps(q, _mm256_broadcastss_ps(_mm_mul_ps(xs, ys)), acc);
        }
        hsum_float_8(acc) + _mm_cvtss_f32(_mm_movehdup_ps(summs))
    }
}

const K4_SHUFFLE: [[u8; 32]; 8] = {
    let mut t = [[0u8; 32]; 8];
    let mut i = 0;
    while i < 8 {
        let mut b = 0;
        while b < 32 {
            t[i][b] = (2 * i + b % 2) as u8;
            b += 1;
        }
        i += 1;
    }
    t
};

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let m4 = _mm256_set1_epi8(0xF);
        let mut acc = _mm256_setzero_ps();
        let mut acc_m = _mm_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 144);
            let yb = y.as_ptr().add(i * 292);
            let yd = f32::from_le_bytes([*yb, *yb.add(1), *yb.add(2), *yb.add(3)]);
            let d = yd * f16_in_block(x, i * 144);
            let dmin = -yd * f16_in_block(x, i * 144 + 2);
            let (sc, mn) =
                crate::kernels::dot::q4k_scales_mins(std::slice::from_raw_parts(xb.add(4), 12));
            let mut sm = [0u8; 16];
            sm[..8].copy_from_slice(&sc);
            sm[8..].copy_from_slice(&mn);
            let mins_and_scales =
                _mm256_cvtepu8_epi16(_mm_loadu_si128(sm.as_ptr() as *const __m128i));
            let q8sums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
            let q8s = _mm_hadd_epi16(
                _mm256_extracti128_si256(q8sums, 0),
                _mm256_extracti128_si256(q8sums, 1),
            );
            let prod = _mm_madd_epi16(_mm256_extracti128_si256(mins_and_scales, 1), q8s);
            acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
            let sc128 = _mm256_extracti128_si256(mins_and_scales, 0);
            let scales = _mm256_insertf128_si256(_mm256_castsi128_si256(sc128), sc128, 1);
            let mut sumi = _mm256_setzero_si256();
            let mut q4 = xb.add(16);
            let mut q8 = yb.add(4);
            for j in 0..4 {
                let scale_l = _mm256_shuffle_epi8(
                    scales,
                    _mm256_loadu_si256(K4_SHUFFLE[2 * j].as_ptr() as *const __m256i),
                );
                let scale_h = _mm256_shuffle_epi8(
                    scales,
                    _mm256_loadu_si256(K4_SHUFFLE[2 * j + 1].as_ptr() as *const __m256i),
                );
                let q4bits = _mm256_loadu_si256(q4 as *const __m256i);
                q4 = q4.add(32);
                let q4l = _mm256_and_si256(q4bits, m4);
                let q4h = _mm256_and_si256(_mm256_srli_epi16(q4bits, 4), m4);
                let q8l = _mm256_loadu_si256(q8 as *const __m256i);
                q8 = q8.add(32);
                let p16l = _mm256_madd_epi16(scale_l, _mm256_maddubs_epi16(q4l, q8l));
                let q8h = _mm256_loadu_si256(q8 as *const __m256i);
                q8 = q8.add(32);
                let p16h = _mm256_madd_epi16(scale_h, _mm256_maddubs_epi16(q4h, q8h));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16l, p16h));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
        acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
        hsum_float_8(acc) + _mm_cvtss_f32(acc_m)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6_k(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 210);
            let yb = y.as_ptr().add(i * 292);
            let yd = f32::from_le_bytes([*yb, *yb.add(1), *yb.add(2), *yb.add(3)]);
            let d = yd * f16_at(x, i * 210 + 208);
            let mut q4 = xb;
            let mut qh = xb.add(128);
            let mut q8 = yb.add(4);
            let q8sums = _mm256_loadu_si256(yb.add(260) as *const __m256i);
            let scales = _mm_loadu_si128(xb.add(192) as *const __m128i);
            let scales_16 = _mm256_cvtepi8_epi16(scales);
            let q8sclsub = _mm256_slli_epi32(_mm256_madd_epi16(q8sums, scales_16), 5);
            let mut sumi = _mm256_setzero_si256();
            for j in 0..2 {
                let q4bits1 = _mm256_loadu_si256(q4 as *const __m256i);
                let q4bits2 = _mm256_loadu_si256(q4.add(32) as *const __m256i);
                q4 = q4.add(64);
                let q4bits_h = _mm256_loadu_si256(qh as *const __m256i);
                qh = qh.add(32);
                let q4h_0 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, m3), 4);
                let q4h_1 = _mm256_slli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(12)), 2);
                let q4h_2 = _mm256_and_si256(q4bits_h, _mm256_set1_epi8(48));
                let q4h_3 = _mm256_srli_epi16(_mm256_and_si256(q4bits_h, _mm256_set1_epi8(-64)), 2);
                let q4_0 = _mm256_or_si256(_mm256_and_si256(q4bits1, m15), q4h_0);
                let q4_1 = _mm256_or_si256(_mm256_and_si256(q4bits2, m15), q4h_1);
                let q4_2 =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits1, 4), m15), q4h_2);
                let q4_3 =
                    _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q4bits2, 4), m15), q4h_3);
                let q8_0 = _mm256_loadu_si256(q8 as *const __m256i);
                let q8_1 = _mm256_loadu_si256(q8.add(32) as *const __m256i);
                let q8_2 = _mm256_loadu_si256(q8.add(64) as *const __m256i);
                let q8_3 = _mm256_loadu_si256(q8.add(96) as *const __m256i);
                q8 = q8.add(128);
                let is = 4 * j;
                let sh = [
                    q6k_scale_shuffle(scales, is),
                    q6k_scale_shuffle(scales, is + 1),
                    q6k_scale_shuffle(scales, is + 2),
                    q6k_scale_shuffle(scales, is + 3),
                ];
                let p16_0 = _mm256_madd_epi16(sh[0], _mm256_maddubs_epi16(q4_0, q8_0));
                let p16_1 = _mm256_madd_epi16(sh[1], _mm256_maddubs_epi16(q4_1, q8_1));
                let p16_2 = _mm256_madd_epi16(sh[2], _mm256_maddubs_epi16(q4_2, q8_2));
                let p16_3 = _mm256_madd_epi16(sh[3], _mm256_maddubs_epi16(q4_3, q8_3));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_0, p16_1));
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p16_2, p16_3));
            }
            sumi = _mm256_sub_epi32(sumi, q8sclsub);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
        hsum_float_8(acc)
    }
}

/// `trit(q) = (q * 3) >> 8` of every byte, as ggml computes it without 8-bit multiplies:
/// `subs(q, 1)`, two rounding averages (`q * 3/4`), then the top 2 bits.
#[inline(always)]
unsafe fn trits(q: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller.
    unsafe {
        let q = _mm256_subs_epu8(q, _mm256_set1_epi8(1));
        let q = _mm256_avg_epu8(q, _mm256_avg_epu8(q, _mm256_setzero_si256()));
        _mm256_and_si256(_mm256_srli_epi16(q, 6), _mm256_set1_epi8(3))
    }
}

/// Times 3 and times 9 of every byte, modulo 256 (`x + x + x`, `(x << 3 & 0xF8) + x`).
#[inline(always)]
unsafe fn times3(x: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller.
    unsafe { _mm256_add_epi8(x, _mm256_add_epi8(x, x)) }
}

#[inline(always)]
unsafe fn times9(x: __m256i) -> __m256i {
    // SAFETY: register-only intrinsics; AVX2 enabled by the caller.
    unsafe {
        _mm256_add_epi8(
            _mm256_and_si256(_mm256_slli_epi16(x, 3), _mm256_set1_epi8(-8)),
            x,
        )
    }
}

/// The end of both ternary kernels: `(sumi - bsums)` widened to 8 i32 lanes, then
/// `acc + lanes * d` (fused, as GCC compiles ggml's `_mm256_add_ps(_mm256_mul_ps(..))`).
#[inline(always)]
unsafe fn ternary_acc(acc: __m256, sumi: __m256i, yb: *const u8, d: f32) -> __m256 {
    // SAFETY: `yb` points at a whole Q8_K block (bsums at byte 260, 32 bytes); AVX2/FMA
    // enabled by the caller.
    unsafe {
        let ysum = _mm256_loadu_si256(yb.add(260) as *const __m256i);
        let s = _mm256_madd_epi16(_mm256_sub_epi16(sumi, ysum), _mm256_set1_epi16(1));
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_set1_ps(d), acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq2_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 66);
            let yb = y.as_ptr().add(i * 292);
            let q8 = yb.add(4);
            let mut sumi0 = _mm256_setzero_si256();
            let mut sumi1 = _mm256_setzero_si256();
            for j in [0usize, 32] {
                let qx0 = _mm256_loadu_si256(xb.add(j) as *const __m256i);
                let qx1 = _mm256_and_si256(_mm256_srli_epi16(qx0, 2), m3);
                let qx2 = _mm256_and_si256(_mm256_srli_epi16(qx0, 4), m3);
                let qx3 = _mm256_and_si256(_mm256_srli_epi16(qx0, 6), m3);
                let qx0 = _mm256_and_si256(qx0, m3);
                let qy = |k: usize| _mm256_loadu_si256(q8.add(4 * j + 32 * k) as *const __m256i);
                let p0 = _mm256_maddubs_epi16(qx0, qy(0));
                let p1 = _mm256_maddubs_epi16(qx1, qy(1));
                let p2 = _mm256_maddubs_epi16(qx2, qy(2));
                let p3 = _mm256_maddubs_epi16(qx3, qy(3));
                sumi0 = _mm256_add_epi16(sumi0, _mm256_add_epi16(p0, p1));
                sumi1 = _mm256_add_epi16(sumi1, _mm256_add_epi16(p2, p3));
            }
            let d = f32::from_le_bytes([*yb, *yb.add(1), *yb.add(2), *yb.add(3)])
                * f16_at(x, i * 66 + 64);
            acc = ternary_acc(acc, _mm256_add_epi16(sumi0, sumi1), yb, d);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tq1_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let mut acc = _mm256_setzero_ps();
        for i in 0..nb {
            let xb = x.as_ptr().add(i * 54);
            let yb = y.as_ptr().add(i * 292);
            let q8 = yb.add(4);
            let qy = |o: usize| _mm256_loadu_si256(q8.add(o) as *const __m256i);
            // First 32 bytes of 5 trits: elements 0..160.
            let qx0 = _mm256_loadu_si256(xb as *const __m256i);
            let qx1 = times3(qx0);
            let qx2 = times9(qx0);
            let qx3 = times9(qx1);
            let qx4 = times9(qx2);
            let p0 = _mm256_maddubs_epi16(trits(qx0), qy(0));
            let p1 = _mm256_maddubs_epi16(trits(qx1), qy(32));
            let p2 = _mm256_maddubs_epi16(trits(qx2), qy(64));
            let p3 = _mm256_maddubs_epi16(trits(qx3), qy(96));
            let p4 = _mm256_maddubs_epi16(trits(qx4), qy(128));
            let mut sumi0 = _mm256_add_epi16(p0, p1);
            let mut sumi1 = _mm256_add_epi16(p2, p3);
            let mut sumi2 = p4;
            // The last 16 bytes of 5 trits (elements 160..240) and the 4 of 4 (240..256).
            let q0 = _mm_loadu_si128(xb.add(32) as *const __m128i);
            let qh = (xb.add(48) as *const i32).read_unaligned();
            let qx5_l = _mm256_cvtepu8_epi16(_mm_set1_epi32(qh));
            let q0w = _mm256_castsi128_si256(q0);
            let q1 = _mm256_castsi256_si128(times3(q0w));
            let q2 = _mm256_castsi256_si128(times9(q0w));
            let q3 = _mm256_castsi256_si128(times9(times3(q0w)));
            let q4 = _mm256_castsi256_si128(times9(times9(q0w)));
            let qx5_l = _mm256_and_si256(
                _mm256_mullo_epi16(
                    qx5_l,
                    _mm256_set_epi16(27, 27, 27, 27, 9, 9, 9, 9, 3, 3, 3, 3, 1, 1, 1, 1),
                ),
                _mm256_set1_epi16(0xFF),
            );
            let q5 = _mm_packus_epi16(
                _mm256_castsi256_si128(qx5_l),
                _mm256_extracti128_si256(qx5_l, 1),
            );
            let qx01 = _mm256_set_m128i(q1, q0);
            let qx23 = _mm256_set_m128i(q3, q2);
            let qx45 = _mm256_set_m128i(q5, q4);
            sumi0 = _mm256_add_epi16(sumi0, _mm256_maddubs_epi16(trits(qx01), qy(160)));
            sumi1 = _mm256_add_epi16(sumi1, _mm256_maddubs_epi16(trits(qx23), qy(192)));
            sumi2 = _mm256_add_epi16(sumi2, _mm256_maddubs_epi16(trits(qx45), qy(224)));
            let d = f32::from_le_bytes([*yb, *yb.add(1), *yb.add(2), *yb.add(3)])
                * f16_at(x, i * 54 + 52);
            // ggml: `sumi0 - ysum + (sumi1 + sumi2)`, all 16-bit wrapping (the order does
            // not change the bits).
            let sumi = _mm256_add_epi16(sumi0, _mm256_add_epi16(sumi1, sumi2));
            acc = ternary_acc(acc, sumi, yb, d);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nvfp4(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`; the level table is 16 bytes.
    unsafe {
        let values = _mm_loadu_si128(crate::kernels::dot::KVALUES_MXFP4.as_ptr() as *const __m128i);
        let m4b = _mm_set1_epi8(0x0f);
        // The 16 levels of 16 bytes, low nibbles then high ones per 8-byte sub-block:
        // sub-block 2h in the low half, 2h + 1 in the high one.
        let levels = |q: __m128i| {
            let lo = _mm_shuffle_epi8(values, _mm_and_si128(q, m4b));
            let hi = _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16(q, 4), m4b));
            _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi))
        };
        let ue = lamina_core::quant::ue4m3_to_fp32;
        let mut acc = _mm256_setzero_ps();
        for ib in 0..nb {
            let xb = x.as_ptr().add(ib * 36);
            let yb = y.as_ptr().add(ib * 68);
            let q4_01 = levels(_mm_loadu_si128(xb.add(4) as *const __m128i));
            let q4_23 = levels(_mm_loadu_si128(xb.add(20) as *const __m128i));
            let q8_01 = _mm256_loadu_si256(yb.add(2) as *const __m256i);
            let q8_23 = _mm256_loadu_si256(yb.add(36) as *const __m256i);
            let p1 = mul_sum_i8_pairs_float(q4_01, q8_01);
            let p2 = mul_sum_i8_pairs_float(q4_23, q8_23);
            let dy0 = f16_in_block(y, ib * 68);
            let dy1 = f16_in_block(y, ib * 68 + 34);
            let s0 = ue(*xb) * dy0;
            let s1 = ue(*xb.add(1)) * dy0;
            let s2 = ue(*xb.add(2)) * dy1;
            let s3 = ue(*xb.add(3)) * dy1;
            let scales01 = _mm256_set_m128(_mm_set1_ps(s1), _mm_set1_ps(s0));
            let scales23 = _mm256_set_m128(_mm_set1_ps(s3), _mm_set1_ps(s2));
            acc = _mm256_fmadd_ps(scales01, p1, acc);
            acc = _mm256_fmadd_ps(scales23, p2, acc);
        }
        hsum_float_8(acc)
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q1_0(nb: usize, x: &[u8], y: &[u8]) -> f32 {
    // SAFETY: as in `q4_0`.
    unsafe {
        let ones_8 = _mm256_set1_epi8(1);
        let ones_16 = _mm256_set1_epi16(1);
        #[rustfmt::skip]
        let byte_shuf = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
        );
        let bit_masks = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let zero = _mm256_setzero_si256();
        let mut acc = _mm256_setzero_ps();
        for ib in 0..nb {
            let xb = x.as_ptr().add(ib * 18);
            let yb = y.as_ptr().add(ib * 136);
            let d0 = f16_in_block(x, ib * 18);
            let mut acc_block = _mm256_setzero_ps();
            for k in 0..4 {
                let qy = _mm256_loadu_si256(yb.add(34 * k + 2) as *const __m256i);
                let bits = (xb.add(2 + 4 * k) as *const i32).read_unaligned();
                let sel = _mm256_shuffle_epi8(_mm256_set1_epi32(bits), byte_shuf);
                let sm = _mm256_cmpeq_epi8(_mm256_and_si256(sel, bit_masks), zero);
                let sy = _mm256_sub_epi8(_mm256_xor_si256(qy, sm), sm);
                let s32 = _mm256_madd_epi16(_mm256_maddubs_epi16(ones_8, sy), ones_16);
                let dy = _mm256_set1_ps(f16_in_block(y, ib * 136 + 34 * k));
                acc_block = if k == 0 {
                    _mm256_mul_ps(dy, _mm256_cvtepi32_ps(s32))
                } else {
                    _mm256_fmadd_ps(dy, _mm256_cvtepi32_ps(s32), acc_block)
                };
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d0), acc_block, acc);
        }
        hsum_float_8(acc)
    }
}
