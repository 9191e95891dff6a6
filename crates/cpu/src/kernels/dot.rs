//! Quantized row·row dot products with the arithmetic of ggml-cpu's x86 AVX2 `ggml_vec_dot_*`
//! (`arch/x86/quants.c`), which llamafile's `tinyBLAS_Q0_AVX` shares per output for
//! Q4_0/Q5_0/Q8_0 (same `fma(dA*dB, lanes, acc)` chain and the same final horizontal sum).
//!
//! The common shape: each block yields 8 exact i32 lane sums (lane `j` = products of bytes
//! `4j..4j+3`, via `maddubs`+`madd`, or a scaled sum for the K types), converted to f32 and
//! accumulated with one FMA per lane against the block's f32 scale product; the result is
//! `hsum_float_8` plus, for types with a min, a scalar f32 sum of `m*s` fused by GCC into FMAs.

use lamina_core::DType;

use super::{f16_at, hsum8};

pub use super::table::DotFn;

/// The dot kernel llama.cpp uses for weights of `dtype` against activations of
/// `lamina_core::quant::vec_dot_type(dtype)`, from the kernel table of the tier in use (all
/// tiers give the same bits); `None` for types without an exact kernel here.
pub fn dot_fn(dtype: DType) -> Option<DotFn> {
    super::table().of(dtype).vec_dot.map(|k| k.dot)
}

/// The scalar emulation of [`dot_fn`]'s kernel (identical results on every machine).
pub fn scalar_dot_fn(dtype: DType) -> Option<DotFn> {
    Some(match dtype {
        DType::Q4_0 => dot_q4_0,
        DType::Q4_1 => dot_q4_1,
        DType::Q5_0 => dot_q5_0,
        DType::Q5_1 => dot_q5_1,
        DType::Q8_0 => dot_q8_0,
        DType::IQ4_NL => dot_iq4_nl,
        DType::MXFP4 => dot_mxfp4,
        DType::Q4_K => dot_q4_k,
        DType::Q6_K => dot_q6_k,
        DType::Q5_K => dot_q5_k,
        DType::Q2_K => dot_q2_k,
        DType::IQ4_XS => dot_iq4_xs,
        DType::Q3_K => dot_q3_k,
        DType::TQ1_0 => dot_tq1_0,
        DType::TQ2_0 => dot_tq2_0,
        DType::NVFP4 => dot_nvfp4,
        DType::Q1_0 => dot_q1_0,
        DType::Q2_0 => dot_q2_0,
        DType::IQ2_XXS => dot_iq2_xxs,
        DType::IQ2_XS => dot_iq2_xs,
        DType::IQ2_S => dot_iq2_s,
        DType::IQ3_XXS => dot_iq3_xxs,
        DType::IQ3_S => dot_iq3_s,
        DType::IQ1_S => dot_iq1_s,
        DType::IQ1_M => dot_iq1_m,
        _ => return None,
    })
}

/// `ggml_vec_dot_<dtype>_<vec_dot_type>` of `n` values (dispatching AVX2/scalar); `None` when
/// the type has no exact kernel here.
pub fn vec_dot(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> Option<f32> {
    dot_fn(dtype).map(|f| f(n, x, y))
}

/// The scalar emulation of [`vec_dot`].
pub fn vec_dot_scalar(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> Option<f32> {
    scalar_dot_fn(dtype).map(|f| f(n, x, y))
}

/// `_mm256_maddubs_epi16` for one pair: u8·i8 products summed with i16 saturation.
#[inline(always)]
fn maddubs_pair(a0: u8, b0: i8, a1: u8, b1: i8) -> i32 {
    (i32::from(a0) * i32::from(b0) + i32::from(a1) * i32::from(b1)).clamp(-32768, 32767)
}

/// One lane of `mul_sum_us8_pairs_float` (unsigned·signed bytes `4j..4j+3`).
#[inline(always)]
fn lane_us(a: &[u8; 32], b: &[i8], j: usize) -> i32 {
    let k = 4 * j;
    maddubs_pair(a[k], b[k], a[k + 1], b[k + 1])
        + maddubs_pair(a[k + 2], b[k + 2], a[k + 3], b[k + 3])
}

/// `_mm256_sign_epi8(y, x)` for one byte.
#[inline(always)]
fn sign_i8(y: i8, x: i8) -> i8 {
    match x.signum() {
        1 => y,
        -1 => y.wrapping_neg(),
        _ => 0,
    }
}

/// One lane of `mul_sum_i8_pairs_float` (signed·signed with the sign trick).
#[inline(always)]
fn lane_ss(x: &[i8; 32], y: &[i8], j: usize) -> i32 {
    let k = 4 * j;
    let p = |i: usize| (x[i].unsigned_abs(), sign_i8(y[i], x[i]));
    let (a0, b0) = p(k);
    let (a1, b1) = p(k + 1);
    let (a2, b2) = p(k + 2);
    let (a3, b3) = p(k + 3);
    maddubs_pair(a0, b0, a1, b1) + maddubs_pair(a2, b2, a3, b3)
}

#[inline(always)]
fn as_i8(b: &[u8]) -> &[i8] {
    // SAFETY: u8 and i8 have the same size and alignment, every bit pattern is valid.
    unsafe { std::slice::from_raw_parts(b.as_ptr() as *const i8, b.len()) }
}

/// `bytes_from_nibbles_32`: low nibbles of the 16 bytes, then the high nibbles.
#[inline(always)]
fn nibbles(qs: &[u8]) -> [u8; 32] {
    let mut o = [0u8; 32];
    for i in 0..16 {
        o[i] = qs[i] & 15;
        o[i + 16] = qs[i] >> 4;
    }
    o
}

#[inline(always)]
fn fma8(acc: &mut [f32; 8], d: f32, lanes: impl Fn(usize) -> i32) {
    for (j, a) in acc.iter_mut().enumerate() {
        *a = d.mul_add(lanes(j) as f32, *a);
    }
}

/// Signed-weight legacy types (Q4_0, Q5_0, Q8_0, IQ4_NL): `acc = fma(dx*dy, lanes, acc)`.
#[inline(always)]
fn dot_signed_q8_0(
    n: usize,
    x: &[u8],
    y: &[u8],
    bsx: usize,
    vals: impl Fn(&[u8]) -> [i8; 32],
) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(bsx).zip(y.chunks_exact(34)).take(n / 32) {
        let d = f16_at(xb, 0) * f16_at(yb, 0);
        let qx = vals(xb);
        let qy = as_i8(&yb[2..34]);
        fma8(&mut acc, d, |j| lane_ss(&qx, qy, j));
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_q4_0_q8_0` (AVX2).
pub fn dot_q4_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_signed_q8_0(n, x, y, 18, |b| nibbles(&b[2..18]).map(|v| v as i8 - 8))
}

/// `ggml_vec_dot_q5_0_q8_0` (AVX2).
pub fn dot_q5_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_signed_q8_0(n, x, y, 22, |b| {
        let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
        let nib = nibbles(&b[6..22]);
        std::array::from_fn(|i| (nib[i] | (((qh >> i) & 1) as u8) << 4) as i8 - 16)
    })
}

/// `ggml_vec_dot_q8_0_q8_0` (AVX2).
pub fn dot_q8_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_signed_q8_0(n, x, y, 34, |b| std::array::from_fn(|i| b[2 + i] as i8))
}

pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `ggml_vec_dot_iq4_nl_q8_0` (AVX2): even and odd blocks in two accumulators, summed before
/// `hsum_float_8`; an odd last block is added in scalar (`sumf += d * sumi`, fused).
#[inline(always)]
pub fn dot_iq4_nl(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = n / 32;
    let mut acc = [[0f32; 8]; 2];
    let vals = |b: &[u8]| nibbles(&b[2..18]).map(|v| KVALUES_IQ4NL[v as usize]);
    let mut ib = 0;
    while ib + 1 < nb {
        for (k, a) in acc.iter_mut().enumerate() {
            let xb = &x[(ib + k) * 18..(ib + k + 1) * 18];
            let yb = &y[(ib + k) * 34..(ib + k + 1) * 34];
            let d = f16_at(yb, 0) * f16_at(xb, 0);
            let qx = vals(xb);
            let qy = as_i8(&yb[2..34]);
            fma8(a, d, |j| lane_ss(&qx, qy, j));
        }
        ib += 2;
    }
    let sum: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut sumf = hsum8(&sum);
    if ib < nb {
        let xb = &x[ib * 18..ib * 18 + 18];
        let yb = &y[ib * 34..ib * 34 + 34];
        let d = f16_at(xb, 0) * f16_at(yb, 0);
        let qx = vals(xb);
        let mut sumi = 0i32;
        for (i, q) in qx.iter().enumerate() {
            sumi += i32::from(*q) * i32::from(yb[2 + i] as i8);
        }
        sumf = d.mul_add(sumi as f32, sumf);
    }
    sumf
}

pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `ggml_vec_dot_mxfp4_q8_0` (AVX2): the shape of `ggml_vec_dot_iq4_nl_q8_0` (two
/// accumulators, an odd last block in scalar) with the MXFP4 levels, 17-byte blocks and
/// `d = dy * e8m0_half(e)`.
#[inline(always)]
pub fn dot_mxfp4(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let nb = n / 32;
    let mut acc = [[0f32; 8]; 2];
    let vals = |b: &[u8]| nibbles(&b[1..17]).map(|v| KVALUES_MXFP4[v as usize]);
    let scale = |xb: &[u8], yb: &[u8]| f16_at(yb, 0) * lamina_core::quant::e8m0_to_fp32_half(xb[0]);
    let mut ib = 0;
    while ib + 1 < nb {
        for (k, a) in acc.iter_mut().enumerate() {
            let xb = &x[(ib + k) * 17..(ib + k + 1) * 17];
            let yb = &y[(ib + k) * 34..(ib + k + 1) * 34];
            let d = scale(xb, yb);
            let qx = vals(xb);
            let qy = as_i8(&yb[2..34]);
            fma8(a, d, |j| lane_ss(&qx, qy, j));
        }
        ib += 2;
    }
    let sum: [f32; 8] = std::array::from_fn(|l| acc[0][l] + acc[1][l]);
    let mut sumf = hsum8(&sum);
    if ib < nb {
        let xb = &x[ib * 17..ib * 17 + 17];
        let yb = &y[ib * 34..ib * 34 + 34];
        let d = scale(xb, yb);
        let qx = vals(xb);
        let mut sumi = 0i32;
        for (i, q) in qx.iter().enumerate() {
            sumi += i32::from(*q) * i32::from(yb[2 + i] as i8);
        }
        sumf = d.mul_add(sumi as f32, sumf);
    }
    sumf
}

/// tinyBLAS_Q0_AVX's per-output arithmetic for IQ4_NL (`n >= 2` products): one FMA chain over
/// all blocks, then `hsum`.
#[inline(always)]
pub fn dot_iq4_nl_tinyblas(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_signed_q8_0(n, x, y, 18, |b| {
        nibbles(&b[2..18]).map(|v| KVALUES_IQ4NL[v as usize])
    })
}

/// Legacy types with a min (Q4_1, Q5_1) against Q8_1.
#[inline(always)]
fn dot_min_q8_1(n: usize, x: &[u8], y: &[u8], bsx: usize, vals: impl Fn(&[u8]) -> [u8; 32]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (xb, yb) in x.chunks_exact(bsx).zip(y.chunks_exact(36)).take(n / 32) {
        // GCC contracts `summs += m*s` into an FMA.
        summs = f16_at(xb, 2).mul_add(f16_at(yb, 2), summs);
        let d = f16_at(xb, 0) * f16_at(yb, 0);
        let qx = vals(xb);
        let qy = as_i8(&yb[4..36]);
        fma8(&mut acc, d, |j| lane_us(&qx, qy, j));
    }
    hsum8(&acc) + summs
}

/// `ggml_vec_dot_q4_1_q8_1` (AVX2).
pub fn dot_q4_1(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_min_q8_1(n, x, y, 20, |b| nibbles(&b[4..20]))
}

/// `ggml_vec_dot_q5_1_q8_1` (AVX2).
pub fn dot_q5_1(n: usize, x: &[u8], y: &[u8]) -> f32 {
    dot_min_q8_1(n, x, y, 24, |b| {
        let qh = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let nib = nibbles(&b[8..24]);
        std::array::from_fn(|i| nib[i] | (((qh >> i) & 1) as u8) << 4)
    })
}

/// Q4_K's 8 scales and 8 mins from its 12 packed bytes (the `utmp` shuffle of the AVX2 code).
#[inline(always)]
pub(crate) fn q4k_scales_mins(sc: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut utmp = [0u32; 4];
    for (i, u) in utmp.iter_mut().take(3).enumerate() {
        *u = u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    }
    const KMASK1: u32 = 0x3f3f3f3f;
    const KMASK2: u32 = 0x0f0f0f0f;
    const KMASK3: u32 = 0x03030303;
    utmp[3] = ((utmp[2] >> 4) & KMASK2) | (((utmp[1] >> 6) & KMASK3) << 4);
    let uaux = utmp[1] & KMASK1;
    utmp[1] = (utmp[2] & KMASK2) | (((utmp[0] >> 6) & KMASK3) << 4);
    utmp[2] = uaux;
    utmp[0] &= KMASK1;
    // Little-endian words are the bytes in order (no closures: this is inlined into
    // target-feature kernels).
    let mut scales = [0u8; 8];
    let mut mins = [0u8; 8];
    scales[..4].copy_from_slice(&utmp[0].to_le_bytes());
    scales[4..].copy_from_slice(&utmp[1].to_le_bytes());
    mins[..4].copy_from_slice(&utmp[2].to_le_bytes());
    mins[4..].copy_from_slice(&utmp[3].to_le_bytes());
    (scales, mins)
}

/// Q4_K's 8 scales and 8 mins (for the repacked kernels).
#[inline(always)]
pub(crate) fn q4k_scales_mins_pub(sc: &[u8]) -> ([u8; 8], [u8; 8]) {
    q4k_scales_mins(sc)
}

/// `ggml_vec_dot_q4_K_q8_K` (AVX2).
pub fn dot_q4_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut acc_m = [0f32; 4];
    for (xb, yb) in x.chunks_exact(144).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let d = yd * f16_at(xb, 0);
        let dmin = -yd * f16_at(xb, 2);
        let (scales, mins) = q4k_scales_mins(&xb[4..16]);
        let bsum = |i: usize| i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]);
        // hadd_epi16 of the bsums, then madd with the mins: 4 lanes.
        let q8s: [i16; 8] = std::array::from_fn(|k| bsum(2 * k).wrapping_add(bsum(2 * k + 1)));
        for (l, a) in acc_m.iter_mut().enumerate() {
            let prod = i32::from(mins[2 * l]) * i32::from(q8s[2 * l])
                + i32::from(mins[2 * l + 1]) * i32::from(q8s[2 * l + 1]);
            *a = dmin.mul_add(prod as f32, *a);
        }
        let q4 = &xb[16..144];
        let q8 = as_i8(&yb[4..260]);
        let mut sumi = [0i32; 8];
        for j in 0..4 {
            let bits = &q4[32 * j..32 * j + 32];
            let lo: [u8; 32] = std::array::from_fn(|i| bits[i] & 15);
            let hi: [u8; 32] = std::array::from_fn(|i| bits[i] >> 4);
            let q8l = &q8[64 * j..64 * j + 32];
            let q8h = &q8[64 * j + 32..64 * j + 64];
            let (sl, sh) = (i32::from(scales[2 * j]), i32::from(scales[2 * j + 1]));
            for (l, s) in sumi.iter_mut().enumerate() {
                let k = 4 * l;
                let pl = sl * maddubs_pair(lo[k], q8l[k], lo[k + 1], q8l[k + 1])
                    + sl * maddubs_pair(lo[k + 2], q8l[k + 2], lo[k + 3], q8l[k + 3]);
                let ph = sh * maddubs_pair(hi[k], q8h[k], hi[k + 1], q8h[k + 1])
                    + sh * maddubs_pair(hi[k + 2], q8h[k + 2], hi[k + 3], q8h[k + 3]);
                *s = s.wrapping_add(pl.wrapping_add(ph));
            }
        }
        fma8(&mut acc, d, |l| sumi[l]);
    }
    let m = (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
    hsum8(&acc) + m
}

/// `ggml_vec_dot_q6_K_q8_K` (AVX2).
pub fn dot_q6_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(210).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let d = yd * f16_at(xb, 208);
        let scales = as_i8(&xb[192..208]);
        let bsum = |i: usize| i32::from(i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]));
        let q8 = as_i8(&yb[4..260]);
        let mut sumi = [0i32; 8];
        for j in 0..2 {
            let ql1 = &xb[64 * j..64 * j + 32];
            let ql2 = &xb[64 * j + 32..64 * j + 64];
            let qh = &xb[128 + 32 * j..128 + 32 * j + 32];
            let q: [[u8; 32]; 4] = [
                std::array::from_fn(|b| (ql1[b] & 15) | ((qh[b] & 3) << 4)),
                std::array::from_fn(|b| (ql2[b] & 15) | ((qh[b] & 12) << 2)),
                std::array::from_fn(|b| (ql1[b] >> 4) | (qh[b] & 48)),
                std::array::from_fn(|b| (ql2[b] >> 4) | ((qh[b] & 192) >> 2)),
            ];
            for (k, qk) in q.iter().enumerate() {
                let is = 4 * j + k;
                let y8 = &q8[128 * j + 32 * k..128 * j + 32 * k + 32];
                for (l, s) in sumi.iter_mut().enumerate() {
                    let sc = i32::from(scales[2 * is + usize::from(l >= 4)]);
                    let b = 4 * l;
                    let v = sc * maddubs_pair(qk[b], y8[b], qk[b + 1], y8[b + 1])
                        + sc * maddubs_pair(qk[b + 2], y8[b + 2], qk[b + 3], y8[b + 3]);
                    *s = s.wrapping_add(v);
                }
            }
        }
        for (l, s) in sumi.iter_mut().enumerate() {
            let sub = (bsum(2 * l) * i32::from(scales[2 * l])
                + bsum(2 * l + 1) * i32::from(scales[2 * l + 1]))
            .wrapping_shl(5);
            *s = s.wrapping_sub(sub);
        }
        fma8(&mut acc, d, |l| sumi[l]);
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_q5_K_q8_K` (AVX2): lanes like Q4_K with 5-bit values; the mins go to a scalar
/// `summs += dmin * (float)Σ min·bsum` (fused by GCC).
#[inline(always)]
pub fn dot_q5_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    let mut summs = 0f32;
    for (xb, yb) in x.chunks_exact(176).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let d = yd * f16_at(xb, 0);
        let dmin = -yd * f16_at(xb, 2);
        let (scales, mins) = q4k_scales_mins(&xb[4..16]);
        let bsum = |i: usize| i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]);
        let mut prod = 0i32;
        for k in 0..8 {
            let q8s = bsum(2 * k).wrapping_add(bsum(2 * k + 1));
            prod = prod.wrapping_add(i32::from(mins[k]) * i32::from(q8s));
        }
        summs = dmin.mul_add(prod as f32, summs);
        let qh = &xb[16..48];
        let q5 = &xb[48..176];
        let q8 = as_i8(&yb[4..260]);
        let mut sumi = [0i32; 8];
        for j in 0..4 {
            let bits = &q5[32 * j..32 * j + 32];
            let lo: [u8; 32] =
                std::array::from_fn(|i| (bits[i] & 15) | (((qh[i] >> (2 * j)) & 1) << 4));
            let hi: [u8; 32] =
                std::array::from_fn(|i| (bits[i] >> 4) | (((qh[i] >> (2 * j + 1)) & 1) << 4));
            let q8l = &q8[64 * j..64 * j + 32];
            let q8h = &q8[64 * j + 32..64 * j + 64];
            let (sl, sh) = (i32::from(scales[2 * j]), i32::from(scales[2 * j + 1]));
            for (l, s) in sumi.iter_mut().enumerate() {
                *s = s.wrapping_add(sl * lane_us(&lo, q8l, l) + sh * lane_us(&hi, q8h, l));
            }
        }
        fma8(&mut acc, d, |l| sumi[l]);
    }
    hsum8(&acc) + summs
}

/// `ggml_vec_dot_q2_K_q8_K` (AVX2): per block first `acc = fma(dmin, Σ min·bsum lanes, acc)`,
/// then `acc = fma(d, lanes, acc)`.
#[inline(always)]
pub fn dot_q2_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(84).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let d = yd * f16_at(xb, 80);
        let dmin = -yd * f16_at(xb, 82);
        let sc = &xb[0..16];
        let bsum = |i: usize| i32::from(i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]));
        let prod: [i32; 8] = std::array::from_fn(|l| {
            i32::from(sc[2 * l] >> 4) * bsum(2 * l)
                + i32::from(sc[2 * l + 1] >> 4) * bsum(2 * l + 1)
        });
        fma8(&mut acc, dmin, |l| prod[l]);
        let q2 = &xb[16..80];
        let q8 = as_i8(&yb[4..260]);
        let mut sumi = [0i32; 8];
        for j in 0..2 {
            let bits = &q2[32 * j..32 * j + 32];
            for k in 0..4 {
                let v: [u8; 32] = std::array::from_fn(|i| (bits[i] >> (2 * k)) & 3);
                let y8 = &q8[128 * j + 32 * k..128 * j + 32 * k + 32];
                for (l, s) in sumi.iter_mut().enumerate() {
                    let scale = i32::from(sc[8 * j + 2 * k + usize::from(l >= 4)] & 15);
                    *s = s.wrapping_add(scale * lane_us(&v, y8, l));
                }
            }
        }
        fma8(&mut acc, d, |l| sumi[l]);
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_q3_K_q8_K` (AVX2): lanes like Q2_K with the signed 3-bit values (`low2 - 4`
/// unless the high bit is set) and 6-bit scales minus 32.
#[inline(always)]
pub fn dot_q3_k(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(110).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let d = yd * f16_at(xb, 108);
        let aux: [u32; 3] = std::array::from_fn(|i| {
            u32::from_le_bytes([
                xb[96 + 4 * i],
                xb[97 + 4 * i],
                xb[98 + 4 * i],
                xb[99 + 4 * i],
            ])
        });
        const KMASK1: u32 = 0x0303_0303;
        const KMASK2: u32 = 0x0f0f_0f0f;
        let words = [
            (aux[0] & KMASK2) | ((aux[2] & KMASK1) << 4),
            (aux[1] & KMASK2) | (((aux[2] >> 2) & KMASK1) << 4),
            ((aux[0] >> 4) & KMASK2) | (((aux[2] >> 4) & KMASK1) << 4),
            ((aux[1] >> 4) & KMASK2) | (((aux[2] >> 6) & KMASK1) << 4),
        ];
        let scale = |i: usize| i32::from(words[i / 4].to_le_bytes()[i % 4] as i8) - 32;
        let hmask = &xb[0..32];
        let q3 = &xb[32..96];
        let q8 = as_i8(&yb[4..260]);
        let mut sumi = [0i32; 8];
        for j in 0..2 {
            let bits = &q3[32 * j..32 * j + 32];
            for k in 0..4 {
                let bit = 4 * j + k;
                let v: [i8; 32] = std::array::from_fn(|i| {
                    let low = ((bits[i] >> (2 * k)) & 3) as i8;
                    if (hmask[i] >> bit) & 1 == 1 {
                        low
                    } else {
                        low - 4
                    }
                });
                let y8 = &q8[128 * j + 32 * k..128 * j + 32 * k + 32];
                for (l, s) in sumi.iter_mut().enumerate() {
                    let sc = scale(8 * j + 2 * k + usize::from(l >= 4));
                    let b = 4 * l;
                    let dot: i32 = (b..b + 4).map(|t| i32::from(v[t]) * i32::from(y8[t])).sum();
                    *s = s.wrapping_add(sc * dot);
                }
            }
        }
        fma8(&mut acc, d, |l| sumi[l]);
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_iq4_xs_q8_K` (AVX2): per 32-value block, lanes of the non-linear values
/// (sign trick) times the block's 6-bit scale minus 32; one FMA per superblock.
#[inline(always)]
pub fn dot_iq4_xs(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(136).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let d = f16_at(xb, 0) * yd;
        let sh = u16::from_le_bytes([xb[2], xb[3]]);
        let q8 = as_i8(&yb[4..260]);
        let mut sumi = [0i32; 8];
        for ib in 0..8 {
            let ls = i32::from((xb[4 + ib / 2] >> (4 * (ib % 2))) & 0xf)
                | (i32::from((sh >> (2 * ib)) & 3) << 4);
            let qx = nibbles(&xb[8 + 16 * ib..24 + 16 * ib]).map(|v| KVALUES_IQ4NL[v as usize]);
            let y8 = &q8[32 * ib..32 * ib + 32];
            for (l, s) in sumi.iter_mut().enumerate() {
                *s = s.wrapping_add((ls - 32) * lane_ss(&qx, y8, l));
            }
        }
        fma8(&mut acc, d, |l| sumi[l]);
    }
    hsum8(&acc)
}

/// The f32 step of the ternary kernels: `acc = acc + lanes * d` per lane, which GCC fuses
/// (`_mm256_add_ps(_mm256_mul_ps(..), acc)` under its default `-ffp-contract=fast`).
#[inline(always)]
fn ternary_acc(acc: &mut [f32; 8], d: f32, s16: &[i16; 16], bsums: &[u8]) {
    for (l, a) in acc.iter_mut().enumerate() {
        // `_mm256_sub_epi16(.., ysum)` then `_mm256_madd_epi16(.., 1)`: 16-bit wrapping.
        let w = |t: usize| {
            let bsum = i16::from_le_bytes([bsums[2 * t], bsums[2 * t + 1]]);
            i32::from(s16[t].wrapping_sub(bsum))
        };
        let lane = w(2 * l) + w(2 * l + 1);
        *a = (lane as f32).mul_add(d, *a);
    }
}

/// `_mm256_maddubs_epi16` of 32 unsigned bytes against 32 signed ones, added with 16-bit
/// wrapping into `s16`.
#[inline(always)]
fn maddubs_acc(s16: &mut [i16; 16], a: &[u8; 32], b: &[i8]) {
    for (t, s) in s16.iter_mut().enumerate() {
        let p = maddubs_pair(a[2 * t], b[2 * t], a[2 * t + 1], b[2 * t + 1]);
        *s = s.wrapping_add(p as i16);
    }
}

/// `ggml_vec_dot_tq1_0_q8_K` (AVX2): the trits (0, 1, 2) times the activations in 16-bit
/// lanes (`maddubs`), minus the Q8_K block sums for the -1 offset, widened to 8 i32 lanes
/// (`madd` by 1), then `acc += lanes * d` (fused by GCC) and `hsum_float_8`.
#[inline(always)]
pub fn dot_tq1_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(54).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let d = yd * f16_at(xb, 52);
        let q8 = as_i8(&yb[4..260]);
        let mut s16 = [0i16; 16];
        // Vector byte `p` of the one starting at activation `o` is element `o + p` in every
        // part; ggml's three accumulators differ only in association, which 16-bit wrapping
        // sums do not see.
        for k in 0..8 {
            let v: [u8; 32] = std::array::from_fn(|p| {
                let (byte, pow) = match k {
                    0..5 => (xb[p], k),
                    _ if p < 16 => (xb[32 + p], 2 * (k - 5)),
                    7 => (xb[48 + p % 4], (p - 16) / 4),
                    _ => (xb[32 + p - 16], 2 * (k - 5) + 1),
                };
                lamina_core::quant::tq1_trit(byte, pow) as u8
            });
            maddubs_acc(&mut s16, &v, &q8[32 * k..32 * k + 32]);
        }
        ternary_acc(&mut acc, d, &s16, &yb[260..292]);
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_tq2_0_q8_K` (AVX2): as [`dot_tq1_0`] with the 2-bit values (0..=3).
#[inline(always)]
pub fn dot_tq2_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(66).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let d = yd * f16_at(xb, 64);
        let q8 = as_i8(&yb[4..260]);
        let mut s16 = [0i16; 16];
        for j in [0, 32] {
            for l in 0..4 {
                let v: [u8; 32] = std::array::from_fn(|p| (xb[j + p] >> (2 * l)) & 3);
                let o = 4 * j + 32 * l;
                maddubs_acc(&mut s16, &v, &q8[o..o + 32]);
            }
        }
        ternary_acc(&mut acc, d, &s16, &yb[260..292]);
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_nvfp4_q8_0` (AVX2): per half block (32 values, one Q8_0 block) the 8 lanes
/// of the levels (sign trick), lanes 0-3 scaled by the first sub-block's
/// `ue4m3(d) * dy`, lanes 4-7 by the second's, one FMA each, then `hsum_float_8`.
#[inline(always)]
pub fn dot_nvfp4(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(36).zip(y.chunks_exact(68)).take(n / 64) {
        for h in 0..2 {
            let y8 = &yb[34 * h..34 * h + 34];
            let dy = f16_at(y8, 0);
            let s0 = lamina_core::quant::ue4m3_to_fp32(xb[2 * h]) * dy;
            let s1 = lamina_core::quant::ue4m3_to_fp32(xb[2 * h + 1]) * dy;
            let q = &xb[4 + 16 * h..20 + 16 * h];
            // Element r of sub-block `sub`: the low nibble of byte `8 sub + r` for r < 8, the
            // high nibble of byte `8 sub + r - 8` after.
            let qx: [i8; 32] = std::array::from_fn(|p| {
                let (sub, r) = (p / 16, p % 16);
                let b = q[8 * sub + r % 8];
                KVALUES_MXFP4[usize::from(if r < 8 { b & 15 } else { b >> 4 })]
            });
            let qy = as_i8(&y8[2..34]);
            for (l, a) in acc.iter_mut().enumerate() {
                let s = if l < 4 { s0 } else { s1 };
                *a = s.mul_add(lane_ss(&qx, qy, l) as f32, *a);
            }
        }
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_q1_0_q8_0` (AVX2): per Q8_0 block the 8 lanes of the activations with the
/// weight's signs applied (8-bit negation, which keeps -128), scaled by `dy` into a block
/// accumulator (a product for the first of the 4, FMAs after), then `acc = fma(d, block,
/// acc)` and `hsum_float_8`.
#[inline(always)]
pub fn dot_q1_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = [0f32; 8];
    for (xb, yb) in x.chunks_exact(18).zip(y.chunks_exact(4 * 34)).take(n / 128) {
        let d0 = f16_at(xb, 0);
        let mut blk = [0f32; 8];
        for k in 0..4 {
            let y8 = &yb[34 * k..34 * k + 34];
            let dy = f16_at(y8, 0);
            let qy = as_i8(&y8[2..34]);
            for (l, b) in blk.iter_mut().enumerate() {
                let mut s = 0i32;
                for p in 4 * l..4 * l + 4 {
                    let bit = (xb[2 + 4 * k + p / 8] >> (p % 8)) & 1;
                    let v = if bit != 0 {
                        qy[p]
                    } else {
                        qy[p].wrapping_neg()
                    };
                    s += i32::from(v);
                }
                *b = if k == 0 {
                    dy * s as f32
                } else {
                    dy.mul_add(s as f32, *b)
                };
            }
        }
        for (a, b) in acc.iter_mut().zip(blk) {
            *a = d0.mul_add(b, *a);
        }
    }
    hsum8(&acc)
}

/// `ggml_vec_dot_q2_0_q8_0` on x86: the generic C (arch/x86 has no Q2_0 kernel) as GCC
/// compiles it with FMA: `sumi = fma(d1, sumi_block, sumi)` per Q8_0 block, `sumf = fma(d0,
/// sumi, sumf)` per Q2_0 block.
#[inline(always)]
pub fn dot_q2_0(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut sumf = 0f32;
    for (xb, yb) in x.chunks_exact(18).zip(y.chunks_exact(2 * 34)).take(n / 64) {
        let d0 = f16_at(xb, 0);
        let mut sumi = 0f32;
        for k in 0..2 {
            let y8 = &yb[34 * k..34 * k + 34];
            let d1 = f16_at(y8, 0);
            let qy = as_i8(&y8[2..34]);
            let mut sumi_block = 0i32;
            for (p, &q) in qy.iter().enumerate() {
                let v = (xb[2 + 8 * k + p / 4] >> (2 * (p % 4))) & 3;
                sumi_block += (i32::from(v) - 1) * i32::from(q);
            }
            sumi = d1.mul_add(sumi_block as f32, sumi);
        }
        sumf = d0.mul_add(sumi, sumf);
    }
    sumf
}

/// The grid i-quants' AVX2 kernels (`ggml_vec_dot_iq{2_xxs,2_xs,2_s,3_xxs,3_s,1_s,1_m}_q8_K`)
/// share one integer shape: per element an unsigned weight byte `a` (the grid value, or |grid|
/// for IQ1) times the activation with the element's sign applied by `_mm256_sign_epi8` or
/// xor/sub (so -128 stays -128), two at a time in `maddubs` i16 lanes, then `madd` by the
/// scale of each 16 elements into 8 i32 lanes (lane `j` = bytes `4j..4j+3` of every 32).
/// Integer sums are exact, so the order within a block does not matter; per block
/// `acc = fma(d, lanes, acc)`, then `hsum_float_8`.
#[inline(always)]
fn iq_lanes(a: &[u8; 256], b: &[i8; 256], ls: &[i32; 16]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for ib in 0..8 {
        for (j, lane) in lanes.iter_mut().enumerate() {
            let k = 32 * ib + 4 * j;
            let p = maddubs_pair(a[k], b[k], a[k + 1], b[k + 1])
                + maddubs_pair(a[k + 2], b[k + 2], a[k + 3], b[k + 3]);
            *lane = lane.wrapping_add(p.wrapping_mul(ls[2 * ib + j / 4]));
        }
    }
    lanes
}

/// The activation `q` with the sign bit `neg` applied as the kernels do (wrapping).
#[inline(always)]
fn signed(q: i8, neg: bool) -> i8 {
    if neg { q.wrapping_neg() } else { q }
}

/// Q8_K block `yb`: (d, the 256 quants, bsum `t`).
#[inline(always)]
fn q8k(yb: &[u8]) -> (f32, &[i8]) {
    (
        f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]),
        as_i8(&yb[4..260]),
    )
}

#[inline(always)]
fn q8k_bsum(yb: &[u8], t: usize) -> i32 {
    i32::from(i16::from_le_bytes([yb[260 + 2 * t], yb[261 + 2 * t]]))
}

/// The IQ2/IQ3 kernels: `fill(block, q8, a, b, ls)` unpacks a block; the result is
/// `scale * hsum_float_8(acc)`.
#[inline(always)]
fn dot_iq_grid<B: lamina_core::quant::Block>(
    n: usize,
    x: &[u8],
    y: &[u8],
    scale: f32,
    d_of: impl Fn(&B) -> f32,
    fill: impl Fn(&B, &[i8], &mut [u8; 256], &mut [i8; 256], &mut [i32; 16]),
) -> f32 {
    let nb = n / 256;
    let bs = std::mem::size_of::<B>();
    let Ok(blocks) = lamina_core::quant::blocks_from_bytes::<B>(&x[..nb * bs]) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    let mut a = [0u8; 256];
    let mut b = [0i8; 256];
    let mut ls = [0i32; 16];
    for (xb, yb) in blocks.iter().zip(y.chunks_exact(292)) {
        let (yd, q8) = q8k(yb);
        let d = d_of(xb) * yd;
        fill(xb, q8, &mut a, &mut b, &mut ls);
        let lanes = iq_lanes(&a, &b, &ls);
        fma8(&mut acc, d, |j| lanes[j]);
    }
    scale * hsum8(&acc)
}

/// Unpacks 8 grid bytes with a sign byte into `a`/`b` at `o`.
#[inline(always)]
fn put8(a: &mut [u8; 256], b: &mut [i8; 256], q8: &[i8], o: usize, grid: u64, signs: u8) {
    for j in 0..8 {
        a[o + j] = (grid >> (8 * j)) as u8;
        b[o + j] = signed(q8[o + j], signs & (1 << j) != 0);
    }
}

/// Unpacks two 4-byte grid words with a sign byte into `a`/`b` at `o`.
#[inline(always)]
fn put4x2(a: &mut [u8; 256], b: &mut [i8; 256], q8: &[i8], o: usize, g: [u32; 2], signs: u8) {
    put8(
        a,
        b,
        q8,
        o,
        u64::from(g[0]) | (u64::from(g[1]) << 32),
        signs,
    );
}

/// `ggml_vec_dot_iq2_xxs_q8_K` (AVX2).
#[inline(always)]
pub fn dot_iq2_xxs(n: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{BlockIQ2XXS, iq2_xxs_sub};
    dot_iq_grid::<BlockIQ2XXS>(
        n,
        x,
        y,
        0.125,
        |xb| xb.d.to_f32(),
        |xb, q8, a, b, ls| {
            for ib in 0..8 {
                let (s, grid, signs) = iq2_xxs_sub(xb, ib);
                ls[2 * ib] = 2 * s as i32 + 1;
                ls[2 * ib + 1] = 2 * s as i32 + 1;
                for l in 0..4 {
                    put8(a, b, q8, 32 * ib + 8 * l, grid[l], signs[l]);
                }
            }
        },
    )
}

/// `ggml_vec_dot_iq2_xs_q8_K` (AVX2).
#[inline(always)]
pub fn dot_iq2_xs(n: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{BlockIQ2XS, iq2_xs_group};
    dot_iq_grid::<BlockIQ2XS>(
        n,
        x,
        y,
        0.125,
        |xb| xb.d.to_f32(),
        |xb, q8, a, b, ls| {
            for ib in 0..8 {
                ls[2 * ib] = 2 * i32::from(xb.scales[ib] & 0xf) + 1;
                ls[2 * ib + 1] = 2 * i32::from(xb.scales[ib] >> 4) + 1;
                for l in 0..4 {
                    let (grid, signs) = iq2_xs_group(xb, 4 * ib + l);
                    put8(a, b, q8, 32 * ib + 8 * l, grid, signs);
                }
            }
        },
    )
}

/// `ggml_vec_dot_iq2_s_q8_K` (AVX2).
#[inline(always)]
pub fn dot_iq2_s(n: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{BlockIQ2S, iq2_s_group};
    dot_iq_grid::<BlockIQ2S>(
        n,
        x,
        y,
        0.125,
        |xb| xb.d.to_f32(),
        |xb, q8, a, b, ls| {
            for ib in 0..8 {
                ls[2 * ib] = 2 * i32::from(xb.scales[ib] & 0xf) + 1;
                ls[2 * ib + 1] = 2 * i32::from(xb.scales[ib] >> 4) + 1;
                for l in 0..4 {
                    let (grid, signs) = iq2_s_group(xb, 4 * ib + l);
                    put8(a, b, q8, 32 * ib + 8 * l, grid, signs);
                }
            }
        },
    )
}

/// `ggml_vec_dot_iq3_xxs_q8_K` (AVX2).
#[inline(always)]
pub fn dot_iq3_xxs(n: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{BlockIQ3XXS, iq3_xxs_sub};
    dot_iq_grid::<BlockIQ3XXS>(
        n,
        x,
        y,
        0.25,
        |xb| xb.d.to_f32(),
        |xb, q8, a, b, ls| {
            for ib in 0..8 {
                let (s, grid, signs) = iq3_xxs_sub(xb, ib);
                ls[2 * ib] = 2 * s as i32 + 1;
                ls[2 * ib + 1] = 2 * s as i32 + 1;
                for l in 0..4 {
                    let g = [grid[2 * l], grid[2 * l + 1]];
                    put4x2(a, b, q8, 32 * ib + 8 * l, g, signs[l]);
                }
            }
        },
    )
}

/// `ggml_vec_dot_iq3_s_q8_K` (AVX2).
#[inline(always)]
pub fn dot_iq3_s(n: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{BlockIQ3S, iq3_s_grid};
    dot_iq_grid::<BlockIQ3S>(
        n,
        x,
        y,
        1.0,
        |xb| xb.d.to_f32(),
        |xb, q8, a, b, ls| {
            for ib in 0..8 {
                let s = 2 * i32::from((xb.scales[ib / 2] >> (4 * (ib % 2))) & 0xf) + 1;
                ls[2 * ib] = s;
                ls[2 * ib + 1] = s;
                let grid = iq3_s_grid(xb, ib);
                for l in 0..4 {
                    let g = [grid[2 * l], grid[2 * l + 1]];
                    put4x2(a, b, q8, 32 * ib + 8 * l, g, xb.signs[4 * ib + l]);
                }
            }
        },
    )
}

/// Unpacks 8 signed IQ1 grid bytes as `mul_add_epi8` sees them: |g| and `sign(q8, g)`.
#[inline(always)]
fn put_iq1(a: &mut [u8; 256], b: &mut [i8; 256], q8: &[i8], o: usize, grid: u64) {
    for j in 0..8 {
        let g = (grid >> (8 * j)) as u8 as i8;
        a[o + j] = g.unsigned_abs();
        b[o + j] = sign_i8(q8[o + j], g);
    }
}

/// `ggml_vec_dot_iq1_s_q8_K` (AVX2): the grid lanes as above with `acc = fma(d, lanes, acc)`,
/// the shifts as a scalar `accum1 += d * sumi1` over the Q8_K block sums (fused by GCC), and
/// `hsum_float_8(acc) + IQ1S_DELTA * accum1` (fused too).
#[inline(always)]
pub fn dot_iq1_s(n: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{BlockIQ1S, IQ1S_DELTA, iq1_s_group};
    let nb = n / 256;
    let Ok(blocks) = lamina_core::quant::blocks_from_bytes::<BlockIQ1S>(&x[..nb * 50]) else {
        return f32::NAN;
    };
    let mut acc = [0f32; 8];
    let mut accum1 = 0f32;
    let mut a = [0u8; 256];
    let mut b = [0i8; 256];
    let mut ls = [0i32; 16];
    for (xb, yb) in blocks.iter().zip(y.chunks_exact(292)) {
        let (yd, q8) = q8k(yb);
        let mut sumi1 = 0i32;
        for ib in 0..8 {
            let qh = xb.qh[ib];
            let s = 2 * i32::from((qh >> 12) & 7) + 1;
            ls[2 * ib] = s;
            ls[2 * ib + 1] = s;
            for l in 0..4 {
                put_iq1(
                    &mut a,
                    &mut b,
                    q8,
                    32 * ib + 8 * l,
                    iq1_s_group(xb, 4 * ib + l),
                );
            }
            let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
            sumi1 = sumi1.wrapping_add(
                (q8k_bsum(yb, 2 * ib) + q8k_bsum(yb, 2 * ib + 1))
                    .wrapping_mul(delta)
                    .wrapping_mul(s),
            );
        }
        let d = yd * xb.d.to_f32();
        let lanes = iq_lanes(&a, &b, &ls);
        fma8(&mut acc, d, |j| lanes[j]);
        accum1 = d.mul_add(sumi1 as f32, accum1);
    }
    IQ1S_DELTA.mul_add(accum1, hsum8(&acc))
}

/// `ggml_vec_dot_iq1_m_q8_K` (AVX2): grid lanes and shift lanes (`maddubs(1, ±q8)`) in two
/// accumulators, `hsum_float_8(accum1) + IQ1M_DELTA * hsum_float_8(accum2)` (fused by GCC).
#[inline(always)]
pub fn dot_iq1_m(n: usize, x: &[u8], y: &[u8]) -> f32 {
    use lamina_core::quant::{BlockIQ1M, IQ1S_DELTA, iq1_m_d, iq1_m_group, iq1_m_ls, iq1_m_sc};
    let nb = n / 256;
    let Ok(blocks) = lamina_core::quant::blocks_from_bytes::<BlockIQ1M>(&x[..nb * 56]) else {
        return f32::NAN;
    };
    let mut acc1 = [0f32; 8];
    let mut acc2 = [0f32; 8];
    let mut a = [0u8; 256];
    let mut b = [0i8; 256];
    let ones = [1u8; 256];
    let mut b2 = [0i8; 256];
    let mut ls = [0i32; 16];
    for (xb, yb) in blocks.iter().zip(y.chunks_exact(292)) {
        let (yd, q8) = q8k(yb);
        let sc = iq1_m_sc(xb);
        for ib in 0..8 {
            ls[2 * ib] = iq1_m_ls(&sc, ib, 0);
            ls[2 * ib + 1] = iq1_m_ls(&sc, ib, 1);
            for l in 0..4 {
                let o = 32 * ib + 8 * l;
                let (grid, neg) = iq1_m_group(xb, 4 * ib + l);
                put_iq1(&mut a, &mut b, q8, o, grid);
                for j in 0..8 {
                    b2[o + j] = signed(q8[o + j], neg);
                }
            }
        }
        let d = yd * iq1_m_d(&sc).to_f32();
        let l1 = iq_lanes(&a, &b, &ls);
        let l2 = iq_lanes(&ones, &b2, &ls);
        fma8(&mut acc1, d, |j| l1[j]);
        fma8(&mut acc2, d, |j| l2[j]);
    }
    IQ1S_DELTA.mul_add(hsum8(&acc2), hsum8(&acc1))
}
