//! The 4-bit non-linear formats IQ4_NL and IQ4_XS: ggml's `quantize_row_iq4_nl_impl`
//! (reference entry points `quantize_row_iq4_nl_ref` and `quantize_row_iq4_xs_ref`) and the
//! dequantizers.

use super::blocks::*;
use super::float::{f16_to_f32, f32_to_f16};
use super::kquants::nearest_int;

const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `best_index_int8` for a sorted table of power-of-two length: the level nearest to
/// `x`, ties going up, from the midpoints (doubled to stay exact).
#[inline]
fn best_index_int8(values: &[i8; 16], x: f32) -> usize {
    // llama.cpp binary-searches the midpoints; the levels increase, so its answer is the number
    // of midpoints at or below `x` (ties up, NaN to 0). Counting them has no data-dependent
    // branch, where the search's four go either way on real weights: IQ4_XS of SmolLM2 went
    // from 25.5 to 15.6 s.
    let x2 = x + x;
    (1..16)
        .filter(|&j| x2 >= (values[j - 1] as i32 + values[j] as i32) as f32)
        .count()
}

/// Where the IQ4_XS sub-block scales go; absent for IQ4_NL (one block = one super-block).
struct XsScales<'a> {
    scales_h: &'a mut u16,
    scales_l: &'a mut [u8; QK_K / 64],
}

/// `quantize_row_iq4_nl_impl` with `nvalues = 16` and `block_size = 32`, for one super-block
/// `x` (32 elements for IQ4_NL, 256 for IQ4_XS) with optional importance weights `qw` (one
/// per element of `x`).
fn quantize_iq4_impl(
    x: &[f32],
    dh: &mut half::f16,
    q4: &mut [u8],
    xs: Option<XsScales<'_>>,
    qw: Option<&[f32]>,
    ntry: i32,
) {
    const BLOCK: usize = 32;
    let values = &KVALUES_IQ4NL;
    let super_block_size = x.len();
    let nb = super_block_size / BLOCK;
    let mut l_all = [0u8; QK_K];
    let l_all = &mut l_all[..super_block_size];
    let mut scales = [0f32; QK_K / BLOCK];
    let mut weight = [0f32; BLOCK];

    let mut sigma2 = 0.0f32;
    for &v in x {
        sigma2 += v * v;
    }
    sigma2 *= 2.0 / super_block_size as f32;

    q4.fill(0);
    *dh = f32_to_f16(0.0);

    let mut max_scale = 0.0f32;
    let mut amax_scale = 0.0f32;
    for ib in 0..nb {
        let xb = &x[ib * BLOCK..(ib + 1) * BLOCK];
        let lb = &mut l_all[ib * BLOCK..(ib + 1) * BLOCK];
        match qw {
            Some(qw) => {
                let qwb = &qw[ib * BLOCK..(ib + 1) * BLOCK];
                for ((w, &v), &q) in weight.iter_mut().zip(xb).zip(qwb) {
                    *w = q * (sigma2 + v * v).sqrt();
                }
            }
            None => {
                for (w, &v) in weight.iter_mut().zip(xb) {
                    *w = v * v;
                }
            }
        }
        let mut amax = 0.0f32;
        let mut max = 0.0f32;
        for &v in xb {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            scales[ib] = 0.0;
            lb.fill(0);
            continue;
        }
        let v0 = values[0] as f32;
        let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
        let mut id = 1.0 / d;
        let mut sumqx = 0.0f32;
        let mut sumq2 = 0.0f32;
        for j in 0..BLOCK {
            let al = id * xb[j];
            let l = best_index_int8(values, al);
            lb[j] = l as u8;
            let q = values[l] as f32;
            let w = weight[j];
            sumqx += w * q * xb[j];
            sumq2 += w * q * q;
        }
        d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
        let mut best = d * sumqx;
        for itry in -ntry..=ntry {
            id = (itry + values[0] as i32) as f32 / max;
            sumqx = 0.0;
            sumq2 = 0.0;
            for j in 0..BLOCK {
                let al = id * xb[j];
                let l = best_index_int8(values, al);
                let q = values[l] as f32;
                let w = weight[j];
                sumqx += w * q * xb[j];
                sumq2 += w * q * q;
            }
            if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
                d = sumqx / sumq2;
                best = d * sumqx;
            }
        }
        scales[ib] = d;
        let abs_d = d.abs();
        if abs_d > amax_scale {
            amax_scale = abs_d;
            max_scale = d;
        }
    }

    match xs {
        Some(XsScales { scales_h, scales_l }) if nb > 1 => {
            *scales_h = 0;
            let d = -max_scale / 32.0;
            *dh = f32_to_f16(d);
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            for ib in 0..nb {
                let l = nearest_int(id * scales[ib]).clamp(-32, 31);
                let dl = d * l as f32;
                let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
                let xb = &x[ib * BLOCK..(ib + 1) * BLOCK];
                let lb = &mut l_all[ib * BLOCK..(ib + 1) * BLOCK];
                for (lj, &v) in lb.iter_mut().zip(xb) {
                    *lj = best_index_int8(values, idl * v) as u8;
                }
                let l = (l + 32) as u8;
                let l_l = l & 0xf;
                let l_h = (l >> 4) as u16;
                if ib % 2 == 0 {
                    scales_l[ib / 2] = l_l;
                } else {
                    scales_l[ib / 2] |= l_l << 4;
                }
                *scales_h |= l_h << (2 * (ib % 8));
            }
        }
        _ => {
            *dh = f32_to_f16(scales[0]);
            if ntry > 0 {
                let id = if scales[0] != 0.0 {
                    1.0 / scales[0]
                } else {
                    0.0
                };
                for (lj, &v) in l_all.iter_mut().zip(x) {
                    *lj = best_index_int8(values, id * v) as u8;
                }
            }
        }
    }

    for i in 0..super_block_size / 32 {
        for j in 0..16 {
            q4[16 * i + j] = l_all[32 * i + j] | (l_all[32 * i + 16 + j] << 4);
        }
    }
}

/// `quantize_row_iq4_nl_ref`.
pub fn quantize_row_iq4_nl(x: &[f32], y: &mut [BlockIQ4NL]) {
    for (xb, yb) in x.chunks_exact(QK4_NL).zip(y.iter_mut()) {
        quantize_iq4_impl(xb, &mut yb.d, &mut yb.qs, None, None, -1);
    }
}

/// ggml's `quantize_iq4_nl` (what quantizing a tensor runs, unlike the `_ref` row quantizer:
/// seven scale trials) with optional importance weights, one per element.
pub fn quantize_row_iq4_nl_weighted(x: &[f32], y: &mut [BlockIQ4NL], qw: Option<&[f32]>) {
    for (ib, (xb, yb)) in x.chunks_exact(QK4_NL).zip(y.iter_mut()).enumerate() {
        let w = qw.map(|w| &w[ib * QK4_NL..(ib + 1) * QK4_NL]);
        quantize_iq4_impl(xb, &mut yb.d, &mut yb.qs, None, w, 7);
    }
}

/// ggml's `quantize_iq4_xs` with optional importance weights, one per element.
pub fn quantize_row_iq4_xs_weighted(x: &[f32], y: &mut [BlockIQ4XS], qw: Option<&[f32]>) {
    for (ib, (xb, yb)) in x.chunks_exact(QK_K).zip(y.iter_mut()).enumerate() {
        let xs = XsScales {
            scales_h: &mut yb.scales_h,
            scales_l: &mut yb.scales_l,
        };
        let w = qw.map(|w| &w[ib * QK_K..(ib + 1) * QK_K]);
        quantize_iq4_impl(xb, &mut yb.d, &mut yb.qs, Some(xs), w, 7);
    }
}

/// `quantize_row_iq4_xs_ref` (ggml's `quantize_iq4_xs` without importance weights).
pub fn quantize_row_iq4_xs(x: &[f32], y: &mut [BlockIQ4XS]) {
    for (xb, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let xs = XsScales {
            scales_h: &mut yb.scales_h,
            scales_l: &mut yb.scales_l,
        };
        quantize_iq4_impl(xb, &mut yb.d, &mut yb.qs, Some(xs), None, 7);
    }
}

/// `dequantize_row_iq4_nl`.
pub fn dequantize_row_iq4_nl(x: &[BlockIQ4NL], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_NL)) {
        let d = f16_to_f32(xb.d);
        for j in 0..QK4_NL / 2 {
            yb[j] = d * KVALUES_IQ4NL[(xb.qs[j] & 0xf) as usize] as f32;
            yb[j + QK4_NL / 2] = d * KVALUES_IQ4NL[(xb.qs[j] >> 4) as usize] as f32;
        }
    }
}

/// The 6-bit scale (biased by 32) of sub-block `ib` of an IQ4_XS block.
#[inline]
pub fn iq4_xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let low = ((b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf) as i32;
    let high = ((b.scales_h >> (2 * ib)) & 3) as i32;
    low | (high << 4)
}

/// `dequantize_row_iq4_xs`.
pub fn dequantize_row_iq4_xs(x: &[BlockIQ4XS], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for (ib, out) in yb.chunks_exact_mut(32).enumerate() {
            let dl = d * (iq4_xs_scale(xb, ib) - 32) as f32;
            let qs = &xb.qs[16 * ib..16 * ib + 16];
            for j in 0..16 {
                out[j] = dl * KVALUES_IQ4NL[(qs[j] & 0xf) as usize] as f32;
                out[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_zero_blocks_quantize_to_zero_bytes() {
        // Upstream ggml zeroes the levels of an all-zero group (older copies left the previous
        // block's levels there); the scale is zero either way.
        let mut x = [0f32; 64];
        for (i, v) in x[..32].iter_mut().enumerate() {
            *v = i as f32 - 10.0;
        }
        let mut y = [bytemuck::Zeroable::zeroed(); 2];
        quantize_row_iq4_nl(&x, &mut y);
        let z: &BlockIQ4NL = &y[1];
        assert_eq!(bytemuck::bytes_of(z), &[0u8; 18][..]);
        let mut out = [1f32; 64];
        dequantize_row_iq4_nl(&y, &mut out);
        assert!(out[32..].iter().all(|&v| v == 0.0));
    }

    #[test]
    fn best_index_matches_llamas_binary_search() {
        fn binary_search(values: &[i8; 16], x: f32) -> usize {
            let x2 = x + x;
            let mut idx = 0;
            let mut step = values.len() >> 1;
            while step > 0 {
                let j = idx + step;
                if x2 >= (values[j - 1] as i32 + values[j] as i32) as f32 {
                    idx = j;
                }
                step >>= 1;
            }
            idx
        }
        let v = &KVALUES_IQ4NL;
        let mut xs = vec![f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 0.0];
        for i in -140_000..=140_000 {
            let x = i as f32 / 1000.0;
            xs.extend([
                x,
                f32::from_bits(x.to_bits() + 1),
                f32::from_bits(x.to_bits().wrapping_sub(1)),
            ]);
        }
        for x in xs {
            assert_eq!(best_index_int8(v, x), binary_search(v, x), "x = {x}");
        }
    }

    #[test]
    fn best_index_picks_nearest_level_ties_up() {
        let v = &KVALUES_IQ4NL;
        assert_eq!(best_index_int8(v, -1000.0), 0);
        assert_eq!(best_index_int8(v, 1000.0), 15);
        for i in 0..16 {
            assert_eq!(best_index_int8(v, v[i] as f32), i);
        }
        // Midpoint of -10 and 1 is -4.5: ties go to the upper level.
        assert_eq!(best_index_int8(v, -4.5), 8);
        assert_eq!(best_index_int8(v, -4.51), 7);
    }
}
