//! Tensor quantization as `ggml_quantize_chunk` does it: ggml's `quantize_<type>` entry points,
//! which take per-column importance weights (`quant_weights`, the mean squared activations
//! llama-imatrix collects). Without weights most of them are the reference quantizers of
//! [`quantize_row`](super::quantize_row); IQ4_NL is not (it tries more scales).

use crate::DType;

use super::blocks::*;
use super::float::{f16_to_f32, f32_to_f16};
use super::iq4::{quantize_row_iq4_nl_weighted, quantize_row_iq4_xs_weighted};
use super::kquants::{get_scale_min_k4, make_qx_quants, nearest_int};
use super::{QuantError, check_len, quantize_row, quantize_row_iq, with_blocks_mut};

/// Quantizes one row as ggml's `quantize_<type>(src, dst, 1, n_per_row, quant_weights)` does
/// (what llama-quantize runs). `weights` (one per element of the row) is the importance of
/// each column. Types whose weighted quantizer is not here yet refuse weights.
pub fn quantize_row_weighted(
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
    weights: Option<&[f32]>,
) -> Result<(), QuantError> {
    use DType::*;
    if let Some(w) = weights
        && w.len() != src.len()
    {
        return Err(QuantError::LengthMismatch {
            what: "importance weights",
            dtype,
            len: src.len(),
            expected: src.len(),
            actual: w.len(),
        });
    }
    if matches!(
        dtype,
        IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M
    ) {
        return quantize_row_iq(dtype, src, dst, weights);
    }
    if matches!(dtype, IQ4_NL | IQ4_XS) {
        check_len("quantize destination", dtype, src.len(), dst.len())?;
        match dtype {
            IQ4_NL => with_blocks_mut::<BlockIQ4NL>(dst, |b| {
                quantize_row_iq4_nl_weighted(src, b, weights)
            }),
            _ => with_blocks_mut::<BlockIQ4XS>(dst, |b| {
                quantize_row_iq4_xs_weighted(src, b, weights)
            }),
        }
        return Ok(());
    }
    let Some(w) = weights else {
        return quantize_row(dtype, src, dst);
    };
    check_len("quantize destination", dtype, src.len(), dst.len())?;
    macro_rules! run {
        ($b:ty, $f:path) => {
            with_blocks_mut::<$b>(dst, |blocks| $f(src, blocks, w))
        };
    }
    match dtype {
        Q4_0 => run!(BlockQ4_0, quantize_q4_0_impl),
        Q4_1 => run!(BlockQ4_1, quantize_q4_1_impl),
        Q5_0 => run!(BlockQ5_0, quantize_q5_0_impl),
        Q5_1 => run!(BlockQ5_1, quantize_q5_1_impl),
        Q2_K => run!(BlockQ2K, quantize_q2_k_impl),
        Q3_K => run!(BlockQ3K, quantize_q3_k_impl),
        Q4_K => run!(BlockQ4K, quantize_q4_k_impl),
        Q5_K => run!(BlockQ5K, quantize_q5_k_impl),
        Q6_K => run!(BlockQ6K, quantize_q6_k_impl),
        // No weighted variant in ggml: the weights are ignored.
        F32 | F16 | BF16 | Q8_0 | MXFP4 | NVFP4 | TQ1_0 | TQ2_0 | Q1_0 | Q2_0 => {
            return quantize_row(dtype, src, dst);
        }
        _ => return Err(QuantError::UnsupportedType(dtype)),
    }
    Ok(())
}

/// `sqrtf(sigma2 + x*x)`-scaled importance, ggml's weighting of `quant_weights` by the value.
fn scaled_weights(out: &mut [f32], qw: &[f32], x: &[f32], sigma2: f32) {
    for ((o, &q), &v) in out.iter_mut().zip(qw).zip(x) {
        *o = q * (sigma2 + v * v).sqrt();
    }
}

/// Mean square of a row (the legacy types) or a super-block, as ggml sums it.
fn sum_sq(x: &[f32]) -> f32 {
    let mut s = 0.0f32;
    for &v in x {
        s += v * v;
    }
    s
}

/// Q5_0/Q5_1: the 5th bits of 32 levels, packed as ggml packs them.
fn pack5(l: &[u8; 32], qs: &mut [u8; 16], qh: &mut [u8; 4]) {
    let mut h = 0u32;
    for j in 0..16 {
        let (a, b) = (l[j], l[j + 16]);
        qs[j] = (a & 0x0f) | ((b & 0x0f) << 4);
        h |= (((a & 0x10) >> 4) as u32) << j;
        h |= (((b & 0x10) >> 4) as u32) << (j + 16);
    }
    *qh = h.to_le_bytes();
}

/// `quantize_row_q4_0_impl`.
fn quantize_q4_0_impl(x: &[f32], y: &mut [BlockQ4_0], qw: &[f32]) {
    let sigma2 = sum_sq(x) / x.len() as f32;
    let mut weight = [0f32; 32];
    let mut l = [0i8; 32];
    for (ib, yb) in y.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * ib + 32];
        scaled_weights(&mut weight, &qw[32 * ib..], xb, sigma2);
        let d = make_qx_quants(8, xb, &mut l, 1, Some(&weight));
        yb.d = f32_to_f16(d);
        for j in 0..16 {
            yb.qs[j] = (l[j] as u8) | ((l[j + 16] as u8) << 4);
        }
    }
}

/// `quantize_row_q4_1_impl`.
fn quantize_q4_1_impl(x: &[f32], y: &mut [BlockQ4_1], qw: &[f32]) {
    let sigma2 = sum_sq(x) / x.len() as f32;
    let mut weight = [0f32; 32];
    let (mut l, mut aux) = ([0u8; 32], [0u8; 32]);
    for (ib, yb) in y.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * ib + 32];
        scaled_weights(&mut weight, &qw[32 * ib..], xb, sigma2);
        let mut min = 0.0;
        let d = make_qkx3_quants(
            15,
            xb,
            Some(&weight),
            &mut l,
            &mut min,
            &mut aux,
            -0.9,
            0.05,
            36,
            false,
        );
        yb.d = f32_to_f16(d);
        yb.m = f32_to_f16(-min);
        for j in 0..16 {
            yb.qs[j] = l[j] | (l[j + 16] << 4);
        }
    }
}

/// `quantize_row_q5_0_impl`.
fn quantize_q5_0_impl(x: &[f32], y: &mut [BlockQ5_0], qw: &[f32]) {
    let sigma2 = sum_sq(x) / x.len() as f32;
    let mut weight = [0f32; 32];
    let mut l = [0i8; 32];
    for (ib, yb) in y.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * ib + 32];
        scaled_weights(&mut weight, &qw[32 * ib..], xb, sigma2);
        let d = make_qx_quants(16, xb, &mut l, 1, Some(&weight));
        yb.d = f32_to_f16(d);
        pack5(&l.map(|v| v as u8), &mut yb.qs, &mut yb.qh);
    }
}

/// `quantize_row_q5_1_impl`.
fn quantize_q5_1_impl(x: &[f32], y: &mut [BlockQ5_1], qw: &[f32]) {
    let sigma2 = sum_sq(x) / x.len() as f32;
    let mut weight = [0f32; 32];
    let (mut l, mut aux) = ([0u8; 32], [0u8; 32]);
    for (ib, yb) in y.iter_mut().enumerate() {
        let xb = &x[32 * ib..32 * ib + 32];
        scaled_weights(&mut weight, &qw[32 * ib..], xb, sigma2);
        let mut min = 0.0;
        let d = make_qkx3_quants(
            31,
            xb,
            Some(&weight),
            &mut l,
            &mut min,
            &mut aux,
            -0.9,
            0.05,
            36,
            false,
        );
        yb.d = f32_to_f16(d);
        yb.m = f32_to_f16(-min);
        pack5(&l, &mut yb.qs, &mut yb.qh);
    }
}

/// `quantize_row_q2_K_impl`.
fn quantize_q2_k_impl(x: &[f32], y: &mut [BlockQ2K], qw: &[f32]) {
    let mut l = [0u8; QK_K];
    let mut aux = [0u8; 16];
    let (mut mins, mut scales, mut sw) = ([0f32; 16], [0f32; 16], [0f32; 16]);
    let mut weight = [0f32; 16];
    let (mut ls, mut lm) = ([0u8; 16], [0u8; 16]);
    for (i, yb) in y.iter_mut().enumerate() {
        let x = &x[QK_K * i..QK_K * (i + 1)];
        let qw = &qw[QK_K * i..QK_K * (i + 1)];
        sw.fill(0.0);
        let sigma2 = sum_sq(x) / QK_K as f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            scaled_weights(&mut weight, &qw[16 * j..], xs, sigma2);
            for w in weight {
                sw[j] += w;
            }
            scales[j] = make_qkx3_quants(
                3,
                xs,
                Some(&weight),
                &mut l[16 * j..16 * j + 16],
                &mut mins[j],
                &mut aux,
                -0.9,
                0.05,
                36,
                false,
            );
        }
        let dm = make_qp_quants(15, &scales, &mut ls, &sw);
        let mm = make_qp_quants(15, &mins, &mut lm, &sw);
        yb.d = f32_to_f16(dm);
        yb.dmin = f32_to_f16(mm);
        let dm = f16_to_f32(yb.d);
        let mm = f16_to_f32(yb.dmin);
        for j in 0..16 {
            yb.scales[j] = ls[j] | (lm[j] << 4);
        }
        for j in 0..16 {
            let d = dm * (yb.scales[j] & 0xf) as f32;
            if d == 0.0 {
                continue;
            }
            let m = mm * (yb.scales[j] >> 4) as f32;
            for ii in 0..16 {
                let q = nearest_int((x[16 * j + ii] + m) / d).clamp(0, 3);
                l[16 * j + ii] = q as u8;
            }
        }
        for j in (0..QK_K).step_by(128) {
            for k in 0..32 {
                yb.qs[j / 4 + k] =
                    l[j + k] | (l[j + k + 32] << 2) | (l[j + k + 64] << 4) | (l[j + k + 96] << 6);
            }
        }
    }
}

/// `quantize_row_q3_K_impl` (with weights).
fn quantize_q3_k_impl(x: &[f32], y: &mut [BlockQ3K], qw: &[f32]) {
    let mut l = [0i8; QK_K];
    let (mut scales, mut sw) = ([0f32; 16], [0f32; 16]);
    let mut weight = [0f32; 16];
    let mut ls = [0i8; 16];
    for (i, yb) in y.iter_mut().enumerate() {
        let x = &x[QK_K * i..QK_K * (i + 1)];
        let qw = &qw[QK_K * i..QK_K * (i + 1)];
        let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            scaled_weights(&mut weight, &qw[16 * j..], xs, sigma2);
            let mut sumw = 0.0f32;
            for w in weight {
                sumw += w;
            }
            sw[j] = sumw;
            scales[j] = make_qx_quants(4, xs, &mut l[16 * j..16 * j + 16], 1, Some(&weight));
        }
        yb.scales = [0; 12];
        let d_block = make_qx_quants(32, &scales, &mut ls, 1, Some(&sw));
        for j in 0..16 {
            let mut v = ls[j] as i32;
            if j < 8 {
                yb.scales[j] = (v & 0xf) as u8;
            } else {
                yb.scales[j - 8] |= ((v & 0xf) << 4) as u8;
            }
            v >>= 4;
            yb.scales[j % 4 + 8] |= (v << (2 * (j / 4))) as u8;
        }
        yb.d = f32_to_f16(d_block);
        for j in 0..16 {
            let low = if j < 8 {
                yb.scales[j] & 0xf
            } else {
                yb.scales[j - 8] >> 4
            } as i8;
            let sc =
                (low | ((((yb.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) as i8)) as i32 - 32;
            let d = f16_to_f32(yb.d) * sc as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
                l[16 * j + ii] = (q + 4) as i8;
            }
        }
        yb.hmask = [0; QK_K / 8];
        let (mut m, mut hm) = (0usize, 1u8);
        for v in l.iter_mut() {
            if *v > 3 {
                yb.hmask[m] |= hm;
                *v -= 4;
            }
            m += 1;
            if m == QK_K / 8 {
                m = 0;
                hm <<= 1;
            }
        }
        for j in (0..QK_K).step_by(128) {
            for k in 0..32 {
                yb.qs[j / 4 + k] = (l[j + k] as u8)
                    | ((l[j + k + 32] as u8) << 2)
                    | ((l[j + k + 64] as u8) << 4)
                    | ((l[j + k + 96] as u8) << 6);
            }
        }
    }
}

/// The per-sub-block scales and mins of Q4_K/Q5_K with importance weights; returns the levels
/// and fills `scales` packed (ls/lm ≤ `cap`).
fn k45_scales(
    x: &[f32],
    qw: &[f32],
    nmax: i32,
    l: &mut [u8; QK_K],
    cap: u8,
) -> ([u8; 12], f32, f32) {
    let sigma2 = 2.0 * sum_sq(x) / QK_K as f32;
    let mut weights = [0f32; 32];
    let mut aux = [0u8; 32];
    let (mut sw, mut mins, mut scales) = ([0f32; 8], [0f32; 8], [0f32; 8]);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        scaled_weights(&mut weights, &qw[32 * j..], xs, sigma2);
        let mut sumw = 0.0f32;
        for w in weights {
            sumw += w;
        }
        sw[j] = sumw;
        scales[j] = make_qkx3_quants(
            nmax,
            xs,
            Some(&weights),
            &mut l[32 * j..32 * j + 32],
            &mut mins[j],
            &mut aux,
            -0.9,
            0.05,
            36,
            false,
        );
    }
    let (mut ls, mut lm) = ([0u8; 8], [0u8; 8]);
    let d_block = make_qp_quants(63, &scales, &mut ls, &sw);
    let m_block = make_qp_quants(63, &mins, &mut lm, &sw);
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let (ls, lm) = (ls[j].min(cap), lm[j].min(cap));
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    (packed, d_block, m_block)
}

/// Requantizes a super-block's levels to the final scales (`nmax` 15 or 31).
fn k45_levels(
    x: &[f32],
    scales: &[u8; 12],
    d: half::f16,
    dmin: half::f16,
    nmax: i32,
    l: &mut [u8; QK_K],
) {
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, scales);
        let d = f16_to_f32(d) * sc as f32;
        if d == 0.0 {
            continue;
        }
        let dm = f16_to_f32(dmin) * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

/// `quantize_row_q4_K_impl` (with weights).
fn quantize_q4_k_impl(x: &[f32], y: &mut [BlockQ4K], qw: &[f32]) {
    let mut l = [0u8; QK_K];
    for (i, yb) in y.iter_mut().enumerate() {
        let x = &x[QK_K * i..QK_K * (i + 1)];
        let (scales, d, m) = k45_scales(x, &qw[QK_K * i..QK_K * (i + 1)], 15, &mut l, u8::MAX);
        yb.scales = scales;
        yb.d = f32_to_f16(d);
        yb.dmin = f32_to_f16(m);
        k45_levels(x, &yb.scales, yb.d, yb.dmin, 15, &mut l);
        for (jj, j) in (0..QK_K).step_by(64).enumerate() {
            for k in 0..32 {
                yb.qs[32 * jj + k] = l[j + k] | (l[j + k + 32] << 4);
            }
        }
    }
}

/// `quantize_row_q5_K_impl` (with weights).
fn quantize_q5_k_impl(x: &[f32], y: &mut [BlockQ5K], qw: &[f32]) {
    let mut l = [0u8; QK_K];
    for (i, yb) in y.iter_mut().enumerate() {
        let x = &x[QK_K * i..QK_K * (i + 1)];
        let (scales, d, m) = k45_scales(x, &qw[QK_K * i..QK_K * (i + 1)], 31, &mut l, 63);
        yb.scales = scales;
        yb.d = f32_to_f16(d);
        yb.dmin = f32_to_f16(m);
        k45_levels(x, &yb.scales, yb.d, yb.dmin, 31, &mut l);
        yb.qh = [0; QK_K / 8];
        let (mut m1, mut m2) = (1u8, 2u8);
        for (nn, n) in (0..QK_K).step_by(64).enumerate() {
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
                yb.qs[32 * nn + j] = l1 | (l2 << 4);
            }
            m1 <<= 2;
            m2 <<= 2;
        }
    }
}

/// `quantize_row_q6_K_impl` (with weights: they go to `make_qx_quants` as they are).
fn quantize_q6_k_impl(x: &[f32], y: &mut [BlockQ6K], qw: &[f32]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    for (i, yb) in y.iter_mut().enumerate() {
        let x = &x[QK_K * i..QK_K * (i + 1)];
        let qw = &qw[QK_K * i..QK_K * (i + 1)];
        let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
        for ib in 0..16 {
            let scale = make_qx_quants(
                32,
                &x[16 * ib..16 * ib + 16],
                &mut l[16 * ib..16 * ib + 16],
                1,
                Some(&qw[16 * ib..16 * ib + 16]),
            );
            scales[ib] = scale;
            if scale.abs() > max_abs_scale {
                max_abs_scale = scale.abs();
                max_scale = scale;
            }
        }
        if max_abs_scale < 1e-15 {
            *yb = bytemuck::Zeroable::zeroed();
            yb.d = f32_to_f16(0.0);
            continue;
        }
        let iscale = -128.0 / max_scale;
        yb.d = f32_to_f16(1.0 / iscale);
        for ib in 0..16 {
            yb.scales[ib] = nearest_int(iscale * scales[ib]).min(127) as i8;
        }
        for j in 0..16 {
            let d = f16_to_f32(yb.d) * yb.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
                l[16 * j + ii] = (q + 32) as i8;
            }
        }
        for (jj, j) in (0..QK_K).step_by(128).enumerate() {
            for k in 0..32 {
                let q = |o: usize| l[j + k + o] as u8;
                yb.ql[64 * jj + k] = (q(0) & 0xf) | ((q(64) & 0xf) << 4);
                yb.ql[64 * jj + k + 32] = (q(32) & 0xf) | ((q(96) & 0xf) << 4);
                yb.qh[32 * jj + k] =
                    (q(0) >> 4) | ((q(32) >> 4) << 2) | ((q(64) >> 4) << 4) | ((q(96) >> 4) << 6);
            }
        }
    }
}

/// ggml's `make_qkx3_quants` (asymmetric levels `[0, nmax]` with a min, weighted; without
/// weights the weight of `x` is `x²`); returns the scale and writes `-min` to `the_min`.
#[allow(clippy::too_many_arguments)]
fn make_qkx3_quants(
    nmax: i32,
    x: &[f32],
    weights: Option<&[f32]>,
    l_out: &mut [u8],
    the_min: &mut f32,
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> f32 {
    let n = x.len();
    let w = |i: usize| weights.map_or(x[i] * x[i], |w| w[i]);
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w(0);
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let wi = w(i);
        sum_w += wi;
        sum_x += wi * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max <= min {
        l_out[..n].fill(0);
        *the_min = -min;
        return 0.0;
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_mad = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        let diff = scale * l_out[i] as f32 + min - x[i];
        let diff = if use_mad { diff.abs() } else { diff * diff };
        best_mad += w(i) * diff;
    }
    if nstep < 1 {
        *the_min = -min;
        return scale;
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            l_aux[i] = l as u8;
            let wi = w(i);
            let lf = l as f32;
            sum_l += wi * lf;
            sum_l2 += wi * lf * lf;
            sum_xl += wi * lf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut mad = 0.0f32;
            for i in 0..n {
                let diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                let diff = if use_mad { diff.abs() } else { diff * diff };
                mad += w(i) * diff;
            }
            if mad < best_mad {
                l_out[..n].copy_from_slice(&l_aux[..n]);
                best_mad = mad;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    scale
}

/// ggml's `make_qp_quants`: non-negative levels `[0, nmax]` for the sub-block scales, weighted.
/// ggml stores levels in `uint8_t` without a lower clamp; the wrap is kept.
pub(crate) fn make_qp_quants(nmax: i32, x: &[f32], l_out: &mut [u8], qw: &[f32]) -> f32 {
    let n = x.len();
    let mut max = 0.0f32;
    for &v in x {
        max = if max > v { max } else { v };
    }
    if max < 1e-15 {
        l_out[..n].fill(0);
        return 0.0;
    }
    let mut iscale = nmax as f32 / max;
    for i in 0..n {
        l_out[i] = nearest_int(iscale * x[i]) as u8;
    }
    let scale = 1.0 / iscale;
    let mut best_mse = 0.0f32;
    for i in 0..n {
        let diff = x[i] - scale * l_out[i] as f32;
        best_mse += qw[i] * diff * diff;
    }
    for is in -4..=4 {
        if is == 0 {
            continue;
        }
        let iscale_is = (0.1 * is as f32 + nmax as f32) / max;
        let scale_is = 1.0 / iscale_is;
        let mut mse = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale_is * x[i]).min(nmax);
            let diff = x[i] - scale_is * l as f32;
            mse += qw[i] * diff * diff;
        }
        if mse < best_mse {
            best_mse = mse;
            iscale = iscale_is;
        }
    }
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).min(nmax);
        l_out[i] = l as u8;
        let w = qw[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = qw[i];
            let li = l_out[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            let mut sl2 = suml2 - w * li * li;
            if slx > 0.0 && sl2 > 0.0 {
                let new_l = nearest_int(x[i] * sl2 / slx).min(nmax);
                if new_l != l_out[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l_out[i] = new_l as u8;
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
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}
