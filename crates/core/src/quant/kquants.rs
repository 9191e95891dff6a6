//! K-quants (Q2_K … Q6_K) and Q8_K: ggml's reference quantizers (`quantize_row_*_ref`, with the
//! `make_q*_quants` scale searches) and dequantizers, in ggml's arithmetic order.
//!
//! Each function handles as many whole super-blocks as both slices hold.

use super::blocks::*;
use super::float::{f16_to_f32, f32_to_f16};

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this quantize to zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: round half to even via the 1.5·2^23 trick (valid for |x| ≤ 2^22; other
/// inputs give garbage but never panic, as in ggml).
#[inline]
pub(crate) fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// ggml's `make_qx_quants` (symmetric, signed levels in `[-nmax, nmax)` stored with `+nmax`).
pub(crate) fn make_qx_quants(
    nmax: i32,
    x: &[f32],
    l_out: &mut [i8],
    rmse_type: i32,
    qw: Option<&[f32]>,
) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (l_i, &v) in l_out.iter_mut().zip(x) {
            let l = nearest_int(iscale * v);
            *l_i = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let mut rmse_type = rmse_type;
    let mut return_early = false;
    if rmse_type < 0 {
        rmse_type = -rmse_type;
        return_early = true;
    }
    let weight = |i: usize| -> f32 {
        match qw {
            Some(w) => w[i],
            None => match rmse_type {
                1 => x[i] * x[i],
                2 => 1.0,
                3 => x[i].abs(),
                _ => x[i].abs().sqrt(),
            },
        }
    };
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
        let w = weight(i);
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 {
            0.5 * (scale + 1.0 / iscale)
        } else {
            1.0 / iscale
        };
    }
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            let w = weight(i);
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                let l = nearest_int(iscale * x[i]);
                l_out[i] = (nmax + l.clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants`.
fn make_q3_quants(nmax: i32, x: &[f32], l_out: &mut [i8], do_rmse: bool) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out[..n].fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            l_out[i] = l as i8;
            let w = x[i] * x[i];
            sumlx += w * x[i] * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        for _itry in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l_out[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                    if new_l != l_out[i] as i32 {
                        slx += w * x[i] * new_l as f32;
                        sl2 += w * new_l as f32 * new_l as f32;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l_out[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for l in l_out[..n].iter_mut() {
            *l += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l_out[i] = (l + nmax) as i8;
    }
    1.0 / iscale
}

/// ggml's `make_qkx2_quants` (asymmetric levels `[0, nmax]` with a min); returns the scale and
/// writes `-min` to `the_min`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    the_min: &mut f32,
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> f32 {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out[..n].fill(0);
        *the_min = -min;
        return 0.0;
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        l_out[i] = l.clamp(0, nmax) as u8;
        let mut diff = scale * l_out[i] as f32 + min - x[i];
        diff = if use_mad { diff.abs() } else { diff * diff };
        best_error += weights[i] * diff;
    }
    if nstep < 1 {
        *the_min = -min;
        return scale;
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let mut diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                diff = if use_mad { diff.abs() } else { diff * diff };
                cur_error += weights[i] * diff;
            }
            if cur_error < best_error {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    scale
}

/// ggml's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of Q4_K / Q5_K.
#[inline]
pub fn get_scale_min_k4(j: usize, q: &[u8; K_SCALE_SIZE]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The 16 signed 6-bit scales of a Q3_K block (already minus 32).
#[inline]
pub fn q3_k_scales(scales: &[u8; K_SCALE_SIZE]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 {
            scales[j] & 0xF
        } else {
            scales[j - 8] >> 4
        };
        let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Packs 2-bit levels of a super-block the way Q2_K and Q3_K store `qs`.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// `quantize_row_q2_K_ref`.
pub fn quantize_row_q2_k(x: &[f32], y: &mut [BlockQ2K]) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut l_aux = [0u8; 16];
    let mut weights = [0f32; 16];
    let mut mins = [0f32; QK_K / 16];
    let mut scales = [0f32; QK_K / 16];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..QK_K / 16 {
            let xs = &x[16 * j..16 * j + 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            scales[j] = make_qkx2_quants(
                3,
                xs,
                &weights,
                &mut l[16 * j..16 * j + 16],
                &mut mins[j],
                &mut l_aux,
                -0.5,
                0.1,
                15,
                true,
            );
            if scales[j] > max_scale {
                max_scale = scales[j];
            }
            if mins[j] > max_min {
                max_min = mins[j];
            }
        }
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for j in 0..QK_K / 16 {
                yb.scales[j] = nearest_int(iscale * scales[j]) as u8;
            }
            yb.d = f32_to_f16(max_scale / Q4SCALE);
        } else {
            yb.scales = [0; QK_K / 16];
            yb.d = f32_to_f16(0.0);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for j in 0..QK_K / 16 {
                let lm = nearest_int(iscale * mins[j]);
                yb.scales[j] |= (lm << 4) as u8;
            }
            yb.dmin = f32_to_f16(max_min / Q4SCALE);
        } else {
            yb.dmin = f32_to_f16(0.0);
        }
        for j in 0..QK_K / 16 {
            let d = f16_to_f32(yb.d) * (yb.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = f16_to_f32(yb.dmin) * (yb.scales[j] >> 4) as f32;
            for ii in 0..16 {
                let li = nearest_int((x[16 * j + ii] + dm) / d);
                l[16 * j + ii] = li.clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut yb.qs);
    }
}

/// `dequantize_row_q2_K`.
pub fn dequantize_row_q2_k(x: &[BlockQ2K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        let min = f16_to_f32(xb.dmin);
        let mut out = 0;
        let mut is = 0;
        for n in (0..QK_K).step_by(128) {
            let q = &xb.qs[n / 4..n / 4 + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let sc = xb.scales[is];
                    is += 1;
                    let dl = d * (sc & 0xF) as f32;
                    let ml = min * (sc >> 4) as f32;
                    for &qv in &q[16 * half..16 * half + 16] {
                        yb[out] = dl * ((qv >> shift) & 3) as f32 - ml;
                        out += 1;
                    }
                }
            }
        }
    }
}

/// `quantize_row_q3_K_ref`.
pub fn quantize_row_q3_k(x: &[f32], y: &mut [BlockQ3K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..QK_K / 16 {
            scales[j] = make_q3_quants(
                4,
                &x[16 * j..16 * j + 16],
                &mut l[16 * j..16 * j + 16],
                true,
            );
            let scale = scales[j].abs();
            if scale > amax {
                amax = scale;
                max_scale = scales[j];
            }
        }
        yb.scales = [0; K_SCALE_SIZE];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..QK_K / 16 {
                let li = nearest_int(iscale * scales[j]) as i8;
                let li = (li.clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    yb.scales[j] = li & 0xF;
                } else {
                    yb.scales[j - 8] |= (li & 0xF) << 4;
                }
                let hi = li >> 4;
                yb.scales[j % 4 + 8] |= hi << (2 * (j / 4));
            }
            yb.d = f32_to_f16(1.0 / iscale);
        } else {
            yb.d = f32_to_f16(0.0);
        }
        let sc = q3_k_scales(&yb.scales);
        for j in 0..QK_K / 16 {
            let d = f16_to_f32(yb.d) * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let li = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (li + 4) as i8;
            }
        }
        yb.hmask = [0; QK_K / 8];
        let mut m = 0;
        let mut hm = 1u8;
        let mut lu = [0u8; QK_K];
        for j in 0..QK_K {
            let mut v = l[j] as u8;
            if l[j] > 3 {
                yb.hmask[m] |= hm;
                v -= 4;
            }
            lu[j] = v;
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm <<= 1;
            }
        }
        pack_2bit(&lu, &mut yb.qs);
    }
}

/// `dequantize_row_q3_K`.
pub fn dequantize_row_q3_k(x: &[BlockQ3K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = f16_to_f32(xb.d);
        let scales = q3_k_scales(&xb.scales);
        let mut out = 0;
        let mut is = 0;
        let mut m = 1u8;
        for n in (0..QK_K).step_by(128) {
            let q = &xb.qs[n / 4..n / 4 + 32];
            for shift in [0, 2, 4, 6] {
                for half in 0..2 {
                    let dl = d_all * scales[is] as f32;
                    is += 1;
                    for l in 16 * half..16 * half + 16 {
                        let low = ((q[l] >> shift) & 3) as i32;
                        let sub = if xb.hmask[l] & m != 0 { 0 } else { 4 };
                        yb[out] = dl * (low - sub) as f32;
                        out += 1;
                    }
                }
                m <<= 1;
            }
        }
    }
}

/// Packs 6-bit sub-block scales and mins the way Q4_K and Q5_K store them.
fn pack_scale_min_k4(ls: &[u8; 8], lm: &[u8; 8], scales: &mut [u8; K_SCALE_SIZE]) {
    for j in 0..QK_K / 32 {
        if j < 4 {
            scales[j] = ls[j];
            scales[j + 4] = lm[j];
        } else {
            scales[j + 4] = (ls[j] & 0xF) | ((lm[j] & 0xF) << 4);
            scales[j - 4] |= (ls[j] >> 4) << 6;
            scales[j] |= (lm[j] >> 4) << 6;
        }
    }
}

/// Shared first half of `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref`: per-sub-block
/// scale search, 6-bit scale packing and requantization. Returns the levels in `l`.
#[allow(clippy::too_many_arguments)]
fn quantize_k4_scales(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    d_out: &mut half::f16,
    dmin_out: &mut half::f16,
    scales_out: &mut [u8; K_SCALE_SIZE],
    l: &mut [u8; QK_K],
) {
    let mut l_aux = [0u8; 32];
    let mut weights = [0f32; 32];
    let mut mins = [0f32; QK_K / 32];
    let mut scales = [0f32; QK_K / 32];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        scales[j] = make_qkx2_quants(
            nmax,
            xs,
            &weights,
            &mut l[32 * j..32 * j + 32],
            &mut mins[j],
            &mut l_aux,
            rmin,
            rdelta,
            nstep,
            false,
        );
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..QK_K / 32 {
        ls[j] = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        lm[j] = (nearest_int(inv_min * mins[j]) as u8).min(63);
    }
    pack_scale_min_k4(&ls, &lm, scales_out);
    *d_out = f32_to_f16(max_scale / 63.0);
    *dmin_out = f32_to_f16(max_min / 63.0);
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, scales_out);
        let d = f16_to_f32(*d_out) * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = f16_to_f32(*dmin_out) * m as f32;
        for ii in 0..32 {
            let li = nearest_int((x[32 * j + ii] + dm) / d);
            l[32 * j + ii] = li.clamp(0, nmax) as u8;
        }
    }
}

/// `quantize_row_q4_K_ref`.
pub fn quantize_row_q4_k(x: &[f32], y: &mut [BlockQ4K]) {
    let mut l = [0u8; QK_K];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_k4_scales(
            x,
            15,
            -1.0,
            0.1,
            20,
            &mut yb.d,
            &mut yb.dmin,
            &mut yb.scales,
            &mut l,
        );
        for (k, j) in (0..QK_K).step_by(64).enumerate() {
            for i in 0..32 {
                yb.qs[32 * k + i] = l[j + i] | (l[j + i + 32] << 4);
            }
        }
    }
}

/// `dequantize_row_q4_K`.
pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        let min = f16_to_f32(xb.dmin);
        for (k, out) in yb.chunks_exact_mut(64).enumerate() {
            let q = &xb.qs[32 * k..32 * k + 32];
            let (sc, m) = get_scale_min_k4(2 * k, &xb.scales);
            let d1 = d * sc as f32;
            let m1 = min * m as f32;
            let (sc, m) = get_scale_min_k4(2 * k + 1, &xb.scales);
            let d2 = d * sc as f32;
            let m2 = min * m as f32;
            for l in 0..32 {
                out[l] = d1 * (q[l] & 0xF) as f32 - m1;
                out[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
            }
        }
    }
}

/// `quantize_row_q5_K_ref`.
pub fn quantize_row_q5_k(x: &[f32], y: &mut [BlockQ5K]) {
    let mut l = [0u8; QK_K];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_k4_scales(
            x,
            31,
            -0.5,
            0.1,
            15,
            &mut yb.d,
            &mut yb.dmin,
            &mut yb.scales,
            &mut l,
        );
        yb.qh = [0; QK_K / 8];
        let mut m1 = 1u8;
        let mut m2 = 2u8;
        for (k, n) in (0..QK_K).step_by(64).enumerate() {
            for j in 0..32 {
                let mut l1 = l[n + j];
                if l1 > 15 {
                    l1 -= 16;
                    yb.qh[j] |= m1;
                }
                let mut l2 = l[n + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    yb.qh[j] |= m2;
                }
                yb.qs[32 * k + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

/// `dequantize_row_q5_K`.
pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        let min = f16_to_f32(xb.dmin);
        let mut u1 = 1u8;
        let mut u2 = 2u8;
        for (k, out) in yb.chunks_exact_mut(64).enumerate() {
            let ql = &xb.qs[32 * k..32 * k + 32];
            let (sc, m) = get_scale_min_k4(2 * k, &xb.scales);
            let d1 = d * sc as f32;
            let m1 = min * m as f32;
            let (sc, m) = get_scale_min_k4(2 * k + 1, &xb.scales);
            let d2 = d * sc as f32;
            let m2 = min * m as f32;
            for l in 0..32 {
                let h1 = if xb.qh[l] & u1 != 0 { 16 } else { 0 };
                let h2 = if xb.qh[l] & u2 != 0 { 16 } else { 0 };
                out[l] = d1 * ((ql[l] & 0xF) + h1) as f32 - m1;
                out[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
            }
            u1 <<= 2;
            u2 <<= 2;
        }
    }
}

/// `quantize_row_q6_K_ref`.
pub fn quantize_row_q6_k(x: &[f32], y: &mut [BlockQ6K]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; QK_K / 16];
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..QK_K / 16 {
            let scale = make_qx_quants(
                32,
                &x[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                1,
                None,
            );
            scales[ib] = scale;
            let abs_scale = scale.abs();
            if abs_scale > max_abs_scale {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if max_abs_scale < GROUP_MAX_EPS {
            *yb = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -128.0 / max_scale;
        yb.d = f32_to_f16(1.0 / iscale);
        for ib in 0..QK_K / 16 {
            yb.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        for j in 0..QK_K / 16 {
            let d = f16_to_f32(yb.d) * yb.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let li = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (li + 32) as i8;
            }
        }
        for (k, j) in (0..QK_K).step_by(128).enumerate() {
            let ql = &mut yb.ql[64 * k..64 * k + 64];
            let qh = &mut yb.qh[32 * k..32 * k + 32];
            for i in 0..32 {
                let l0 = l[j + i] as u8;
                let l1 = l[j + i + 32] as u8;
                let l2 = l[j + i + 64] as u8;
                let l3 = l[j + i + 96] as u8;
                ql[i] = (l0 & 0xF) | ((l2 & 0xF) << 4);
                ql[i + 32] = (l1 & 0xF) | ((l3 & 0xF) << 4);
                qh[i] = (l0 >> 4) | ((l1 >> 4) << 2) | ((l2 >> 4) << 4) | ((l3 >> 4) << 6);
            }
        }
    }
}

/// `dequantize_row_q6_K`.
pub fn dequantize_row_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = f16_to_f32(xb.d);
        for (k, out) in yb.chunks_exact_mut(128).enumerate() {
            let ql = &xb.ql[64 * k..64 * k + 64];
            let qh = &xb.qh[32 * k..32 * k + 32];
            let sc = &xb.scales[8 * k..8 * k + 8];
            for l in 0..32 {
                let is = l / 16;
                let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                out[l] = d * sc[is] as f32 * q1 as f32;
                out[l + 32] = d * sc[is + 2] as f32 * q2 as f32;
                out[l + 64] = d * sc[is + 4] as f32 * q3 as f32;
                out[l + 96] = d * sc[is + 6] as f32 * q4 as f32;
            }
        }
    }
}

/// `quantize_row_q8_K_ref` (= ggml-cpu's generic `quantize_row_q8_K`), bsums included.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (x, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        if amax == 0.0 {
            // ggml leaves bsums untouched here; zero is what they sum to.
            *yb = bytemuck::Zeroable::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in yb.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (j, bsum) in yb.bsums.iter_mut().enumerate() {
            *bsum = yb.qs[16 * j..16 * j + 16]
                .iter()
                .map(|&q| q as i32)
                .sum::<i32>() as i16;
        }
        yb.d = 1.0 / iscale;
    }
}

/// `dequantize_row_q8_K`.
pub fn dequantize_row_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = xb.d * q as f32;
        }
    }
}
