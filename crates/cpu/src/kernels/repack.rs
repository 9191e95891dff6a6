//! Q4_K matrix products as ggml-cpu runs them on AVX2 when the weights sit in its
//! `CPU_REPACK` buffer (llama.cpp's default for Q4_K weights with a multiple of 8 rows):
//! `ggml_gemm_q4_K_8x8_q8_K` for activation rows in groups of 4 (quantized by
//! `ggml_quantize_mat_q8_K_4x8`) and `ggml_gemv_q4_K_8x8_q8_K` for the remaining rows
//! (quantized by `quantize_row_q8_K`). The interleaved layout only changes where bytes live;
//! what matters for the result is where the f32 rounding happens:
//!
//! * gemv: per superblock one exact integer `Σ scale·(q4·q8)` and one `Σ min·bsum`, each
//!   accumulated with `fma(int, d_w*d_a, acc)`; result `acc - acc_min`;
//! * gemm: the same per pair of 32-value sub-blocks (4 FMAs per superblock).
//!
//! These functions take the ordinary (not interleaved) Q4_K and Q8_K blocks.

use super::f16_at;

/// Whether llama.cpp repacks a Q4_K weight with `rows` rows on AVX2 (`ne[1] % 8 == 0`).
pub fn q4_k_repacked(rows: usize) -> bool {
    rows.is_multiple_of(8)
}

/// Activation rows of a repacked product handled by the gemm kernel (the rest go to gemv):
/// `n - n % 4` when `n > 3`, else none.
pub fn q4_k_gemm_rows(n: usize) -> usize {
    if n > 3 { n - n % 4 } else { 0 }
}

/// `ggml_quantize_mat_q8_K_4x8`'s values for one row, in the ordinary Q8_K layout: like
/// `quantize_row_q8_K_ref` except for the sign of the scale, which is negative whenever some
/// element equals `+max|x|` (the reference takes the sign of the first element of largest
/// magnitude).
pub fn quantize_row_q8_k_4x8(x: &[f32], out: &mut [u8]) {
    assert!(x.len().is_multiple_of(256) && out.len() >= x.len() / 256 * 292);
    quantize_q8_k_4x8_impl(x, out);
}

#[inline(always)]
fn quantize_q8_k_4x8_impl(x: &[f32], out: &mut [u8]) {
    for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
        quantize_q8_k_4x8_block(xb, ob, scan_amax(xb));
    }
}

/// The reference's running `amax = amax > |v| ? amax : |v|` (a NaN resets it).
#[inline(always)]
pub(crate) fn scan_amax(xb: &[f32]) -> f32 {
    let mut amax = 0f32;
    for &v in xb {
        let a = v.abs();
        amax = if amax > a { amax } else { a };
    }
    amax
}

/// The 4x8 quantizer's (iscale, d) for a block of largest magnitude `amax`, which the block
/// holds as a positive value when `positive_max`.
#[inline(always)]
pub(crate) fn q8_k_4x8_scales(amax: f32, positive_max: bool) -> (f32, f32) {
    let iscale = if amax == 0.0 {
        0.0
    } else if positive_max {
        -127.0 / amax
    } else {
        127.0 / amax
    };
    (iscale, if amax != 0.0 { 1.0 / iscale } else { 0.0 })
}

/// One block of [`quantize_row_q8_k_4x8`], given the block's `amax`.
#[inline(always)]
pub(crate) fn quantize_q8_k_4x8_block(xb: &[f32], ob: &mut [u8], amax: f32) {
    let (iscale, d) = q8_k_4x8_scales(amax, xb.contains(&amax));
    let (db, rest) = ob.split_at_mut(4);
    let (qs, bsums) = rest.split_at_mut(256);
    for (q, &v) in qs.iter_mut().zip(xb) {
        let r = (v * iscale).round_ties_even();
        let i = if (-2_147_483_648.0..2_147_483_648.0).contains(&r) {
            r as i32
        } else {
            i32::MIN
        };
        *q = i.clamp(-128, 127) as i8 as u8;
    }
    super::quantize::q8_k_bsums(qs, bsums);
    db.copy_from_slice(&d.to_le_bytes());
}

/// Per superblock: `[Σ_j sc_j·dot_j for each pair of sub-blocks]` and the same for mins.
#[inline(always)]
fn q4k_pairs(xb: &[u8], yb: &[u8]) -> ([i32; 4], [i32; 4]) {
    let (sc, mn) = super::dot::q4k_scales_mins_pub(&xb[4..16]);
    let q4 = &xb[16..144];
    let q8 = &yb[4..260];
    let bsum = |i: usize| i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]);
    let mut iacc = [0i32; 4];
    let mut imin = [0i32; 4];
    for sb in 0..4 {
        let bits = &q4[32 * sb..32 * sb + 32];
        let mut lo = 0i32;
        let mut hi = 0i32;
        for i in 0..32 {
            lo += i32::from(bits[i] & 15) * i32::from(q8[64 * sb + i] as i8);
            hi += i32::from(bits[i] >> 4) * i32::from(q8[64 * sb + 32 + i] as i8);
        }
        iacc[sb] = i32::from(sc[2 * sb]) * lo + i32::from(sc[2 * sb + 1]) * hi;
        let p0 = bsum(4 * sb).wrapping_add(bsum(4 * sb + 1));
        let p1 = bsum(4 * sb + 2).wrapping_add(bsum(4 * sb + 3));
        imin[sb] =
            i32::from(mn[2 * sb]) * i32::from(p0) + i32::from(mn[2 * sb + 1]) * i32::from(p1);
    }
    (iacc, imin)
}

/// `ggml_gemv_q4_K_8x8_q8_K`'s value for one weight row (Q4_K) and one activation row (Q8_K).
#[inline(always)]
pub fn dot_q4_k_gemv(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    let mut acc_min = 0f32;
    for (xb, yb) in x.chunks_exact(144).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let (iacc, imin) = q4k_pairs(xb, yb);
        let sum: i32 = iacc.iter().sum();
        let smin: i32 = imin.iter().sum();
        acc = (sum as f32).mul_add(f16_at(xb, 0) * yd, acc);
        acc_min = (smin as f32).mul_add(f16_at(xb, 2) * yd, acc_min);
    }
    acc - acc_min
}

/// `ggml_gemm_q4_K_8x8_q8_K`'s value for one weight row and one activation row (quantized with
/// [`quantize_row_q8_k_4x8`]).
#[inline(always)]
pub fn dot_q4_k_gemm(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    let mut acc_min = 0f32;
    for (xb, yb) in x.chunks_exact(144).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let (d, dmin) = (f16_at(xb, 0) * yd, f16_at(xb, 2) * yd);
        let (iacc, imin) = q4k_pairs(xb, yb);
        for sb in 0..4 {
            acc = (iacc[sb] as f32).mul_add(d, acc);
            acc_min = (imin[sb] as f32).mul_add(dmin, acc_min);
        }
    }
    acc - acc_min
}

/// Whether `ggml_compute_forward_mul_mat` takes its "tiled" K-quant path (AVX2 build, default
/// environment): weights of a supported K/IQ type that are not repacked, at least 8 activation
/// rows.
pub fn tiled_applies(dtype: lamina_core::DType, repacked: bool, activation_rows: usize) -> bool {
    use lamina_core::DType::*;
    !repacked
        && activation_rows >= 8
        && matches!(
            dtype,
            Q6_K | Q5_K
                | Q4_K
                | Q3_K
                | Q2_K
                | IQ4_XS
                | IQ2_XXS
                | IQ2_XS
                | IQ2_S
                | IQ3_XXS
                | IQ3_S
                | IQ1_S
                | IQ1_M
        )
}

/// One grid i-quant block as ggml's tiled unpackers (`tiled_unpack_src0`) see it: the f32
/// scale (f16 times 1/8 for IQ2 and IQ1, 1/4 for IQ3_XXS), the integer scale of each 16
/// values, and the 256 signed values (IQ1: `8 * grid + delta`).
#[inline(always)]
pub(crate) fn iq_grid_tile(dtype: lamina_core::DType, xb: &[u8]) -> (f32, [i32; 16], [i8; 256]) {
    use lamina_core::DType::*;
    use lamina_core::quant as q;
    let mut ls = [0i32; 16];
    let mut v = [0i8; 256];
    let put8 = |v: &mut [i8; 256], o: usize, grid: u64, signs: u8| {
        for j in 0..8 {
            let g = (grid >> (8 * j)) as u8 as i8;
            v[o + j] = if signs & (1 << j) != 0 { -g } else { g };
        }
    };
    let d = match dtype {
        IQ2_XXS => {
            let b: q::BlockIQ2XXS = bytemuck_read(xb);
            for ib in 0..8 {
                let (s, grid, signs) = q::iq2_xxs_sub(&b, ib);
                ls[2 * ib] = 2 * s as i32 + 1;
                ls[2 * ib + 1] = 2 * s as i32 + 1;
                for l in 0..4 {
                    put8(&mut v, 32 * ib + 8 * l, grid[l], signs[l]);
                }
            }
            b.d.to_f32() * 0.125
        }
        IQ2_XS | IQ2_S => {
            let (d, scales) = if dtype == IQ2_XS {
                let b: q::BlockIQ2XS = bytemuck_read(xb);
                for g in 0..32 {
                    let (grid, signs) = q::iq2_xs_group(&b, g);
                    put8(&mut v, 8 * g, grid, signs);
                }
                (b.d, b.scales)
            } else {
                let b: q::BlockIQ2S = bytemuck_read(xb);
                for g in 0..32 {
                    let (grid, signs) = q::iq2_s_group(&b, g);
                    put8(&mut v, 8 * g, grid, signs);
                }
                (b.d, b.scales)
            };
            for ib in 0..8 {
                ls[2 * ib] = 2 * i32::from(scales[ib] & 0xf) + 1;
                ls[2 * ib + 1] = 2 * i32::from(scales[ib] >> 4) + 1;
            }
            d.to_f32() * 0.125
        }
        IQ3_XXS => {
            let b: q::BlockIQ3XXS = bytemuck_read(xb);
            for ib in 0..8 {
                let (s, grid, signs) = q::iq3_xxs_sub(&b, ib);
                ls[2 * ib] = 2 * s as i32 + 1;
                ls[2 * ib + 1] = 2 * s as i32 + 1;
                for l in 0..4 {
                    let g = u64::from(grid[2 * l]) | (u64::from(grid[2 * l + 1]) << 32);
                    put8(&mut v, 32 * ib + 8 * l, g, signs[l]);
                }
            }
            b.d.to_f32() * 0.25
        }
        IQ3_S => {
            let b: q::BlockIQ3S = bytemuck_read(xb);
            for ib in 0..8 {
                let s = 2 * i32::from((b.scales[ib / 2] >> (4 * (ib % 2))) & 0xf) + 1;
                ls[2 * ib] = s;
                ls[2 * ib + 1] = s;
                let grid = q::iq3_s_grid(&b, ib);
                for l in 0..4 {
                    let g = u64::from(grid[2 * l]) | (u64::from(grid[2 * l + 1]) << 32);
                    put8(&mut v, 32 * ib + 8 * l, g, b.signs[4 * ib + l]);
                }
            }
            b.d.to_f32()
        }
        IQ1_S => {
            let b: q::BlockIQ1S = bytemuck_read(xb);
            for ib in 0..8 {
                let qh = b.qh[ib];
                let s = 2 * i32::from((qh >> 12) & 7) + 1;
                ls[2 * ib] = s;
                ls[2 * ib + 1] = s;
                let delta: i8 = if qh & 0x8000 != 0 { -1 } else { 1 };
                for l in 0..4 {
                    let grid = q::iq1_s_group(&b, 4 * ib + l);
                    for j in 0..8 {
                        v[32 * ib + 8 * l + j] = 8 * ((grid >> (8 * j)) as u8 as i8) + delta;
                    }
                }
            }
            b.d.to_f32() * 0.125
        }
        _ => {
            let b: q::BlockIQ1M = bytemuck_read(xb);
            let sc = q::iq1_m_sc(&b);
            for ib in 0..8 {
                ls[2 * ib] = q::iq1_m_ls(&sc, ib, 0);
                ls[2 * ib + 1] = q::iq1_m_ls(&sc, ib, 1);
                for l in 0..4 {
                    let (grid, neg) = q::iq1_m_group(&b, 4 * ib + l);
                    let delta: i8 = if neg { -1 } else { 1 };
                    for j in 0..8 {
                        v[32 * ib + 8 * l + j] = 8 * ((grid >> (8 * j)) as u8 as i8) + delta;
                    }
                }
            }
            q::iq1_m_d(&sc).to_f32() * 0.125
        }
    };
    (d, ls, v)
}

/// A block of `B` read from the start of `b` (any alignment).
fn bytemuck_read<B: lamina_core::quant::Block>(b: &[u8]) -> B {
    let size = std::mem::size_of::<B>();
    let blocks = lamina_core::quant::blocks_from_bytes::<B>(&b[..size]).expect("whole block");
    blocks[0]
}

/// The tiled kernel's value for one grid i-quant weight row (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS,
/// IQ3_S, IQ1_S, IQ1_M) and one Q8_K activation row: per superblock the exact
/// `s1 = Σ scale·v·q8`, then `acc = fma(d_w * (float)s1, d_a, acc)` as for IQ4_XS.
#[inline(always)]
pub fn dot_iq_grid_tiled(dtype: lamina_core::DType, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let bs = dtype.type_size() as usize;
    let mut acc = 0f32;
    for (xb, yb) in x.chunks_exact(bs).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let q8 = &yb[4..260];
        let (d, ls, v) = iq_grid_tile(dtype, xb);
        let mut s1 = 0i32;
        for sub in 0..16 {
            let mut dot = 0i32;
            for i in 16 * sub..16 * sub + 16 {
                dot += i32::from(v[i]) * i32::from(q8[i] as i8);
            }
            s1 = s1.wrapping_add(ls[sub].wrapping_mul(dot));
        }
        acc = tiled_acc(acc, d, None, s1, 0, yd);
    }
    acc
}

/// The tiled kernel's value for one Q6_K weight row and one Q8_K activation row: per
/// superblock `res = d_w * (float)Σ scale·(q6-32)·q8`, then `acc = fma(res, d_a, acc)`.
#[inline(always)]
pub fn dot_q6_k_tiled(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (xb, yb) in x.chunks_exact(210).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let q8 = &yb[4..260];
        let mut s1 = 0i32;
        for j in 0..2 {
            let ql1 = &xb[64 * j..64 * j + 32];
            let ql2 = &xb[64 * j + 32..64 * j + 64];
            let qh = &xb[128 + 32 * j..128 + 32 * j + 32];
            for b in 0..32 {
                let q = [
                    (ql1[b] & 15) | ((qh[b] & 3) << 4),
                    (ql2[b] & 15) | ((qh[b] & 12) << 2),
                    (ql1[b] >> 4) | (qh[b] & 48),
                    (ql2[b] >> 4) | ((qh[b] & 192) >> 2),
                ];
                for (k, &qv) in q.iter().enumerate() {
                    let idx = 128 * j + 32 * k + b;
                    let sc = i32::from(xb[192 + idx / 16] as i8);
                    s1 += sc * (i32::from(qv) - 32) * i32::from(q8[idx] as i8);
                }
            }
        }
        let res = f16_at(xb, 208) * s1 as f32;
        acc = res.mul_add(yd, acc);
    }
    acc
}

/// The tiled kernel's per-output arithmetic given, per superblock, `(d_w, dmin_w, s1, s2)`
/// (weight scales and the exact integer sums `Σ scale·q·q8` and `Σ min·bsum`) and the activation
/// scale: `res = d_w*(float)s1`, `res = fma(-dmin_w, (float)s2, res)` (types with a min),
/// `acc = fma(res, d_a, acc)`.
#[inline(always)]
fn tiled_acc(acc: f32, d: f32, dmin: Option<f32>, s1: i32, s2: i32, da: f32) -> f32 {
    let mut res = d * s1 as f32;
    if let Some(dmin) = dmin {
        res = (-dmin).mul_add(s2 as f32, res);
    }
    res.mul_add(da, acc)
}

/// The tiled kernel's value for one Q4_K (`q5 = false`) or Q5_K (`q5 = true`) weight row and one
/// Q8_K activation row.
#[inline(always)]
pub fn dot_q45_k_tiled(q5: bool, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let bs = if q5 { 176 } else { 144 };
    let mut acc = 0f32;
    for (xb, yb) in x.chunks_exact(bs).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let (sc, mn) = super::dot::q4k_scales_mins_pub(&xb[4..16]);
        let (qh, qs) = if q5 {
            (Some(&xb[16..48]), &xb[48..176])
        } else {
            (None, &xb[16..144])
        };
        let q8 = &yb[4..260];
        let bsum = |i: usize| i32::from(i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]));
        let (mut s1, mut s2) = (0i32, 0i32);
        for sub in 0..8 {
            let (j, hi) = (sub / 2, sub % 2 == 1);
            let mut dot = 0i32;
            for i in 0..32 {
                let b = qs[32 * j + i];
                let mut q = i32::from(if hi { b >> 4 } else { b & 15 });
                if let Some(qh) = qh {
                    q |= i32::from((qh[i] >> sub) & 1) << 4;
                }
                dot += q * i32::from(q8[32 * sub + i] as i8);
            }
            s1 += i32::from(sc[sub]) * dot;
            s2 += i32::from(mn[sub]) * (bsum(2 * sub) + bsum(2 * sub + 1));
        }
        acc = tiled_acc(acc, f16_at(xb, 0), Some(f16_at(xb, 2)), s1, s2, yd);
    }
    acc
}

/// The tiled kernel's value for one Q2_K weight row and one Q8_K activation row.
#[inline(always)]
pub fn dot_q2_k_tiled(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (xb, yb) in x.chunks_exact(84).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let q8 = &yb[4..260];
        let bsum = |i: usize| i32::from(i16::from_le_bytes([yb[260 + 2 * i], yb[261 + 2 * i]]));
        let (mut s1, mut s2) = (0i32, 0i32);
        for sub in 0..16 {
            let (j, k, half) = (sub / 8, (sub % 8) / 2, sub % 2);
            let mut dot = 0i32;
            for i in 0..16 {
                let b = xb[16 + 32 * j + 16 * half + i];
                let q = i32::from((b >> (2 * k)) & 3);
                dot += q * i32::from(q8[16 * sub + i] as i8);
            }
            s1 += i32::from(xb[sub] & 15) * dot;
            s2 += i32::from(xb[sub] >> 4) * bsum(sub);
        }
        acc = tiled_acc(acc, f16_at(xb, 80), Some(f16_at(xb, 82)), s1, s2, yd);
    }
    acc
}

/// The tiled kernel's value for one IQ4_XS weight row and one Q8_K activation row.
#[inline(always)]
pub fn dot_iq4_xs_tiled(n: usize, x: &[u8], y: &[u8]) -> f32 {
    const KV: [i32; 16] = [
        -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
    ];
    let mut acc = 0f32;
    for (xb, yb) in x.chunks_exact(136).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let sh = u16::from_le_bytes([xb[2], xb[3]]);
        let q8 = &yb[4..260];
        let mut s1 = 0i32;
        for ib in 0..8 {
            let ls = i32::from((xb[4 + ib / 2] >> (4 * (ib % 2))) & 0xf)
                | (i32::from((sh >> (2 * ib)) & 3) << 4);
            let qs = &xb[8 + 16 * ib..24 + 16 * ib];
            let mut dot = 0i32;
            for i in 0..16 {
                dot += KV[usize::from(qs[i] & 15)] * i32::from(q8[32 * ib + i] as i8);
                dot += KV[usize::from(qs[i] >> 4)] * i32::from(q8[32 * ib + 16 + i] as i8);
            }
            s1 += (ls - 32) * dot;
        }
        acc = tiled_acc(acc, f16_at(xb, 0), None, s1, 0, yd);
    }
    acc
}

/// Whether llama.cpp repacks a Q4_0 or IQ4_NL weight with `rows` rows on AVX2 (`ne[1] % 8 == 0`).
pub fn q0_repacked(dtype: lamina_core::DType, rows: usize) -> bool {
    matches!(dtype, lamina_core::DType::Q4_0 | lamina_core::DType::IQ4_NL) && rows.is_multiple_of(8)
}

/// Whether llama.cpp repacks an MXFP4 weight with `rows` rows on AVX2 (`ne[1] % 8 == 0`).
pub fn mxfp4_repacked(rows: usize) -> bool {
    rows.is_multiple_of(8)
}

const KVALUES_MXFP4: [i32; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `gemv_q4_b32_8x8_q8_0_lut_avx<block_mxfp4x8>` / its gemm (they agree per output) for one
/// repacked MXFP4 weight row against one Q8_0 activation row: per block
/// `acc = fma((float)Σ q·q8, e8m0_half(e)*d_a, acc)`, one scalar chain.
#[inline(always)]
pub fn dot_mxfp4_repacked(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (xb, yb) in x.chunks_exact(17).zip(y.chunks_exact(34)).take(n / 32) {
        let mut sumi = 0i32;
        for i in 0..16 {
            let (lo, hi) = (usize::from(xb[1 + i] & 15), usize::from(xb[1 + i] >> 4));
            sumi += KVALUES_MXFP4[lo] * i32::from(yb[2 + i] as i8)
                + KVALUES_MXFP4[hi] * i32::from(yb[18 + i] as i8);
        }
        let d = lamina_core::quant::e8m0_to_fp32_half(xb[0]) * f16_at(yb, 0);
        acc = (sumi as f32).mul_add(d, acc);
    }
    acc
}

const KVALUES_IQ4NL: [i32; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `gemv_q4_b32_8x8_q8_0_lut_avx` / `gemm_q4_b32_8x8_q8_0_lut_avx`'s value (both kernels agree
/// per output) for one repacked Q4_0 (`iq4nl = false`) or IQ4_NL weight row against one Q8_0
/// activation row: per block `acc = fma((float)Σ q·q8, d_w*d_a, acc)`, one scalar chain.
#[inline(always)]
pub fn dot_q0_repacked(iq4nl: bool, n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (xb, yb) in x.chunks_exact(18).zip(y.chunks_exact(34)).take(n / 32) {
        let mut sumi = 0i32;
        for i in 0..16 {
            let (lo, hi) = (usize::from(xb[2 + i] & 15), usize::from(xb[2 + i] >> 4));
            let (vl, vh) = if iq4nl {
                (KVALUES_IQ4NL[lo], KVALUES_IQ4NL[hi])
            } else {
                (lo as i32 - 8, hi as i32 - 8)
            };
            sumi += vl * i32::from(yb[2 + i] as i8) + vh * i32::from(yb[18 + i] as i8);
        }
        acc = (sumi as f32).mul_add(f16_at(xb, 0) * f16_at(yb, 0), acc);
    }
    acc
}

/// The tiled kernel's value for one Q3_K weight row and one Q8_K activation row (signed 3-bit
/// values, 6-bit scales minus 32, no min).
#[inline(always)]
pub fn dot_q3_k_tiled(n: usize, x: &[u8], y: &[u8]) -> f32 {
    let mut acc = 0f32;
    for (xb, yb) in x.chunks_exact(110).zip(y.chunks_exact(292)).take(n / 256) {
        let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
        let q8 = &yb[4..260];
        let mut s1 = 0i32;
        for sub in 0..16 {
            let (j, k, half) = (sub / 8, (sub % 8) / 2, sub % 2);
            let sc = q3k_scale(&xb[96..108], sub);
            let mut dot = 0i32;
            for i in 0..16 {
                let b = 16 * half + i;
                let low = i32::from((xb[32 + 32 * j + b] >> (2 * k)) & 3);
                let h = i32::from((xb[b] >> (4 * j + k)) & 1);
                dot += (low - 4 + 4 * h) * i32::from(q8[16 * sub + i] as i8);
            }
            s1 += sc * dot;
        }
        acc = tiled_acc(acc, f16_at(xb, 108), None, s1, 0, yd);
    }
    acc
}

/// Q3_K's scale `i` (6 bits, minus 32).
pub(crate) fn q3k_scale(sc: &[u8], i: usize) -> i32 {
    let aux: [u32; 3] = std::array::from_fn(|t| {
        u32::from_le_bytes([sc[4 * t], sc[4 * t + 1], sc[4 * t + 2], sc[4 * t + 3]])
    });
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let w = match i / 4 {
        0 => (aux[0] & KMASK2) | ((aux[2] & KMASK1) << 4),
        1 => (aux[1] & KMASK2) | (((aux[2] >> 2) & KMASK1) << 4),
        2 => ((aux[0] >> 4) & KMASK2) | (((aux[2] >> 4) & KMASK1) << 4),
        _ => ((aux[1] >> 4) & KMASK2) | (((aux[2] >> 6) & KMASK1) << 4),
    };
    i32::from(w.to_le_bytes()[i % 4] as i8) - 32
}

/// An independent scalar reference for kernels written elsewhere.
pub mod scalar {
    use crate::kernels::f16_at;

    /// Scalar `dot::dot_iq4_nl_tinyblas`: per block `d = dx*dy`, 8 lanes of exact 4-product
    /// sums, `acc = fma(d, lane, acc)`, then `hsum_float_8`.
    pub fn dot_iq4_nl_tinyblas(n: usize, x: &[u8], y: &[u8]) -> f32 {
        let mut acc = [0f32; 8];
        for (xb, yb) in x.chunks_exact(18).zip(y.chunks_exact(34)).take(n / 32) {
            let d = f16_at(xb, 0) * f16_at(yb, 0);
            let q: [i32; 32] = std::array::from_fn(|i| {
                let b = xb[2 + i % 16];
                let v = if i < 16 { b & 15 } else { b >> 4 };
                super::KVALUES_IQ4NL[usize::from(v)]
            });
            for (l, a) in acc.iter_mut().enumerate() {
                let lane: i32 = (4 * l..4 * l + 4)
                    .map(|b| q[b] * i32::from(yb[2 + b] as i8))
                    .sum();
                *a = d.mul_add(lane as f32, *a);
            }
        }
        crate::kernels::hsum8(&acc)
    }
}
