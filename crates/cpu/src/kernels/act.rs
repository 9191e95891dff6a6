//! Row kernels other than dot products, as ggml-cpu's AVX2 build computes them:
//!
//! * softmax: `ggml_compute_forward_soft_max_f32` (scale, `w += slope*mask` fused, max,
//!   `ggml_vec_soft_max_f32` with the AVX2 `ggml_v_expf` polynomial on groups of 8 and libm
//!   `expf` on the tail, a `double` sum of per-group horizontal sums, then `y *= (float)(1/sum)`);
//! * SiLU / SwiGLU: `ggml_vec_silu_f32` / `ggml_vec_swiglu_f32` (`ggml_v_silu` on groups of 8,
//!   `x/(1+expf(-x))` on the tail);
//! * GELU / GeGLU: `ggml_vec_gelu_f32` / `ggml_vec_geglu_f32` with `GGML_GELU_FP16`: the f16
//!   lookup table `ggml_table_gelu_f16` (built as GCC compiled `ggml_gelu_f32`, with one FMA),
//!   0 below -10 and identity above 10;
//! * RMS norm: `ggml_compute_forward_rms_norm_f32` (a `double` sum of f32 squares);
//! * RoPE: `ggml_rope_cache_init` + `rope_yarn` and `rotate_pairs` with the FMA contractions
//!   GCC made (normal mode vectorized with `vfmaddsub`, neox scalar).
//!
//! The libm calls (`expf`, `tanhf`, `cosf`, `sinf`, `powf`, `logf`) are the platform's, as in
//! llama.cpp, so they agree with it on the same C library.

use std::sync::OnceLock;

use super::{fp16_to_fp32, fp32_to_fp16, simd_available};

/// One lane of the AVX2 `ggml_v_expf` (ARM-optimized-routines polynomial, ≤1.5 ulp).
#[inline(always)]
pub fn v_expf_lane(x: f32) -> f32 {
    let r = f32::from_bits(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(f32::from_bits(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(
        f32::from_bits(0x35bf_be8e),
        (-n).mul_add(f32::from_bits(0x3f31_7200), x),
    );
    let e = z.to_bits() << 23;
    let k = f32::from_bits(e.wrapping_add(1f32.to_bits()));
    let c = n.abs() > 126.0;
    let u = b * b;
    let j = f32::from_bits(0x3c07_2010)
        .mul_add(b, f32::from_bits(0x3d2b_9f17))
        .mul_add(
            u,
            f32::from_bits(0x3e2a_af33).mul_add(b, f32::from_bits(0x3eff_fedb)),
        )
        .mul_add(u, f32::from_bits(0x3f7f_fff6) * b);
    if !c {
        return j.mul_add(k, k);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = f32::from_bits(g.wrapping_add(0x7f00_0000));
    let s2 = f32::from_bits(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

/// One lane of `ggml_v_silu`: `x / (1 + v_expf(0 - x))`.
#[inline(always)]
fn v_silu_lane(x: f32) -> f32 {
    x / (1.0 + v_expf_lane(0.0 - x))
}

/// `ggml_silu_f32`: `x/(1.0f + expf(-x))`.
#[inline(always)]
pub fn silu_f32(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// The vector part (`nv`, a multiple of 8, values) of SiLU/SwiGLU, AVX2 when `simd`.
fn silu_vec(nv: usize, x: &[f32], y: &mut [f32], g: Option<&[f32]>, simd: bool) {
    #[cfg(target_arch = "x86_64")]
    if simd {
        // SAFETY: AVX2/FMA present (`simd` comes from `simd_available`); callers pass `nv`
        // no larger than every slice.
        unsafe { avx2::silu(nv, x, y, g) };
        return;
    }
    let _ = simd;
    silu_scalar(nv, x, y, g);
}

fn silu_impl(x: &[f32], g: Option<&[f32]>, y: &mut [f32], simd: bool) {
    let n = x.len().min(y.len()).min(g.map_or(usize::MAX, <[f32]>::len));
    let nv = n / 8 * 8;
    silu_vec(nv, x, y, g, simd);
    for i in nv..n {
        let s = silu_f32(x[i]);
        y[i] = match g {
            Some(g) => s * g[i],
            None => s,
        };
    }
}

/// `ggml_vec_silu_f32`.
pub fn silu_row(x: &[f32], y: &mut [f32]) {
    silu_impl(x, None, y, simd_available());
}

/// `ggml_vec_swiglu_f32`: `silu(x) * g`.
pub fn swiglu_row(x: &[f32], g: &[f32], y: &mut [f32]) {
    silu_impl(x, Some(g), y, simd_available());
}

/// Scalar emulation of the vector part of [`silu_row`] / [`swiglu_row`].
pub fn silu_scalar(nv: usize, x: &[f32], y: &mut [f32], g: Option<&[f32]>) {
    for i in 0..nv {
        let s = v_silu_lane(x[i]);
        y[i] = match g {
            Some(g) => s * g[i],
            None => s,
        };
    }
}

/// Scalar versions of the row kernels, for tests: [`silu_row`], [`swiglu_row`] and
/// [`softmax_row`] computed without AVX2.
pub mod scalar {
    /// [`super::silu_row`] without AVX2.
    pub fn silu_row(x: &[f32], y: &mut [f32]) {
        super::silu_impl(x, None, y, false);
    }

    /// [`super::geglu_row`] without AVX2.
    pub fn geglu_row(x: &[f32], g: &[f32], y: &mut [f32]) {
        super::geglu_scalar(x, g, y, super::gelu_table());
    }

    /// [`super::swiglu_row`] without AVX2.
    pub fn swiglu_row(x: &[f32], g: &[f32], y: &mut [f32]) {
        super::silu_impl(x, Some(g), y, false);
    }

    /// [`super::softmax_row`] without AVX2.
    pub fn softmax_row(x: &[f32], scale: f32, mask: Option<&[f32]>, slope: f32, y: &mut [f32]) {
        super::softmax_impl(x, scale, mask, slope, None, y, false);
    }
}

/// `ggml_vec_soft_max_f32` in place: `y = exp(y - max)`, returning the `double` sum.
pub fn vec_soft_max_f32(y: &mut [f32], max: f32) -> f64 {
    vec_soft_max(y, max, simd_available())
}

/// [`vec_soft_max_f32`], with or without the AVX2 code.
fn vec_soft_max(y: &mut [f32], max: f32, simd: bool) -> f64 {
    let n = y.len();
    let nv_all = n / 8 * 8;
    let mut nv = nv_all;
    if max > f32::NEG_INFINITY {
        // Whole groups of 8 masked (-inf) values at the end of the vector part, as in a
        // causal row, give exp = +0 exactly and add +0 to the sum: write the zeros, skip the
        // work. (With max = -inf every value would be NaN, so then nothing is skipped.)
        while nv > 0 && y[nv - 8..nv].iter().all(|&v| v == f32::NEG_INFINITY) {
            nv -= 8;
        }
        y[nv..nv_all].fill(0.0);
    }
    let mut sum = 0f64;
    #[cfg(target_arch = "x86_64")]
    let done = if simd {
        // SAFETY: AVX2/FMA present (`simd` comes from `simd_available`); `nv <= n`.
        sum = unsafe { avx2::soft_max(nv, y, max) };
        true
    } else {
        false
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = {
        let _ = simd;
        false
    };
    if !done {
        for i in (0..nv).step_by(8) {
            let mut v = [0f32; 8];
            for l in 0..8 {
                v[l] = v_expf_lane(y[i + l] - max);
                y[i + l] = v[l];
            }
            sum += f64::from(super::hsum8(&v));
        }
    }
    for v in &mut y[nv_all..] {
        let e = (*v - max).exp();
        sum += f64::from(e);
        *v = e;
    }
    sum
}

#[inline(always)]
fn softmax_impl(
    x: &[f32],
    scale: f32,
    mask: Option<&[f32]>,
    slope: f32,
    sink: Option<f32>,
    y: &mut [f32],
    simd: bool,
) {
    let y = &mut y[..x.len()];
    for (o, v) in y.iter_mut().zip(x) {
        *o = v * scale;
    }
    if let Some(m) = mask {
        // GCC contracts `wp[i] += slope*mp[i]` into an FMA.
        for (o, mv) in y.iter_mut().zip(m) {
            *o = slope.mul_add(*mv, *o);
        }
    }
    let mut max = f32::NEG_INFINITY;
    // Without NaNs the scan's result is the largest value (a zero's sign, which the order
    // would pick, changes no `exp(v - max)`), which vectors find 8 at a time.
    #[cfg(target_arch = "x86_64")]
    let scanned = simd && {
        // SAFETY: `simd` is set only where AVX2 is present (`softmax_row_sink`).
        let (m, nan) = unsafe { crate::kernels::x86::max_f32(y) };
        max = m;
        !nan
    };
    #[cfg(not(target_arch = "x86_64"))]
    let scanned = false;
    if !scanned {
        max = f32::NEG_INFINITY;
        for &v in y.iter() {
            max = if max > v { max } else { v };
        }
    }
    // Sinks: `max = MAX(max, sk)`, and `expf(sk - max)` joins the sum after the row's.
    if let Some(s) = sink {
        max = if max > s { max } else { s };
    }
    let mut sum = vec_soft_max(y, max, simd);
    if let Some(s) = sink {
        sum += f64::from((s - max).exp());
    }
    let inv = (1.0 / sum) as f32;
    for v in y.iter_mut() {
        *v *= inv;
    }
}

/// `ggml_compute_forward_soft_max_f32` for one row: `y = softmax(x*scale + slope*mask)`.
pub fn softmax_row(x: &[f32], scale: f32, mask: Option<&[f32]>, slope: f32, y: &mut [f32]) {
    softmax_row_sink(x, scale, mask, slope, None, y);
}

/// [`softmax_row`] with an optional attention sink (`ggml_soft_max_add_sinks`): the sink
/// logit joins the maximum and the normalizing sum; without one the result is
/// [`softmax_row`]'s.
pub fn softmax_row_sink(
    x: &[f32],
    scale: f32,
    mask: Option<&[f32]>,
    slope: f32,
    sink: Option<f32>,
    y: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn fast(
            x: &[f32],
            scale: f32,
            mask: Option<&[f32]>,
            slope: f32,
            sink: Option<f32>,
            y: &mut [f32],
        ) {
            softmax_impl(x, scale, mask, slope, sink, y, true)
        }
        // SAFETY: AVX2/FMA/F16C present; the same operations, with `mul_add` as one `vfmadd`
        // instead of a libm call (same result).
        unsafe { fast(x, scale, mask, slope, sink, y) };
        return;
    }
    softmax_impl(x, scale, mask, slope, sink, y, false);
}

/// `ggml_gelu_f32` as GCC compiled it for the table: `0.5x * (1 + tanhf(S*x * fma(A*x, x, 1)))`.
fn gelu_f32_table_entry(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    (0.5 * x) * (1.0 + ((SQRT_2_OVER_PI * x) * inner).tanh())
}

/// `ggml_table_gelu_f16`: GELU of every f16 value, as f16 bits.
pub fn gelu_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| fp32_to_fp16(gelu_f32_table_entry(fp16_to_fp32(h))))
            .collect()
    })
}

#[inline(always)]
fn gelu_lookup(t: &[u16], x: f32) -> f32 {
    fp16_to_fp32(t[usize::from(fp32_to_fp16(x))])
}

/// `ggml_vec_gelu_f32` with `GGML_GELU_FP16` (the f16 table).
pub fn gelu_row(x: &[f32], y: &mut [f32]) {
    let t = gelu_table();
    for (o, &v) in y.iter_mut().zip(x) {
        *o = if v <= -10.0 {
            0.0
        } else if v >= 10.0 {
            v
        } else {
            gelu_lookup(t, v)
        };
    }
}

/// `ggml_vec_geglu_f32` with `GGML_GELU_FP16`: `gelu(x) * g`.
pub fn geglu_row(x: &[f32], g: &[f32], y: &mut [f32]) {
    let t = gelu_table();
    let n = y.len().min(x.len()).min(g.len());
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        // SAFETY: AVX2/FMA/F16C present; the slices hold `n` values.
        done = unsafe { avx2::geglu(n, x, g, y, t) };
    }
    geglu_scalar(&x[done..n], &g[done..n], &mut y[done..n], t);
}

fn geglu_scalar(x: &[f32], g: &[f32], y: &mut [f32], t: &[u16]) {
    for ((o, &v), &gv) in y.iter_mut().zip(x).zip(g) {
        *o = if v <= -10.0 {
            0.0
        } else if v >= 10.0 {
            v * gv
        } else {
            gelu_lookup(t, v) * gv
        };
    }
}

// SAFETY: `erff` is the C library's, a pure function of one float (std links libm).
unsafe extern "C" {
    safe fn erff(x: f32) -> f32;
}

/// The C library's `erff`, which ggml's exact GELU calls.
#[inline(always)]
pub fn erf_f32(x: f32) -> f32 {
    erff(x)
}

/// `SQRT_2_INV` of ggml-cpu.
const SQRT_2_INV: f32 = std::f32::consts::FRAC_1_SQRT_2;

/// The scalar element functions of ggml-cpu's `unary-ops.cpp` / `vec.h` (`op_sigmoid`, ...):
/// GCC compiles them without vectorizing or contracting anything (the libm calls stay scalar),
/// so these are the same operations on the same libm.
pub mod elem {
    use super::{SQRT_2_INV, erf_f32};

    /// `1.f / (1.f + expf(-x))`.
    #[inline(always)]
    pub fn sigmoid(x: f32) -> f32 {
        1.0 / (1.0 + (-x).exp())
    }

    /// `(x > 20.0f) ? x : logf(1.0f + expf(x))`.
    #[inline(always)]
    pub fn softplus(x: f32) -> f32 {
        if x > 20.0 { x } else { (1.0 + x.exp()).ln() }
    }

    /// `tanhf(x)`.
    #[inline(always)]
    pub fn tanh(x: f32) -> f32 {
        x.tanh()
    }

    /// `(x > 0.f) ? x : 0.f`.
    #[inline(always)]
    pub fn relu(x: f32) -> f32 {
        if x > 0.0 { x } else { 0.0 }
    }

    #[inline(always)]
    pub fn sqr(x: f32) -> f32 {
        x * x
    }

    #[inline(always)]
    pub fn sqrt(x: f32) -> f32 {
        x.sqrt()
    }

    /// `expf(x)`.
    #[inline(always)]
    pub fn exp(x: f32) -> f32 {
        x.exp()
    }

    /// `0.5f*x*(1.0f + erff(x*SQRT_2_INV))`.
    #[inline(always)]
    pub fn gelu_erf(x: f32) -> f32 {
        0.5 * x * (1.0 + erf_f32(x * SQRT_2_INV))
    }

    /// `MAX(MIN(x, max), min)` with ggml's `MIN`/`MAX` macros (`a < b ? a : b`), so NaN
    /// becomes `max`.
    #[inline(always)]
    pub fn clamp(x: f32, min: f32, max: f32) -> f32 {
        let lo = if x < max { x } else { max };
        if lo > min { lo } else { min }
    }

    /// `std::min(a, b)`: `(b < a) ? b : a`.
    #[inline(always)]
    pub fn std_min(a: f32, b: f32) -> f32 {
        if b < a { b } else { a }
    }

    /// `std::clamp(v, lo, hi)`: `(v < lo) ? lo : (hi < v) ? hi : v`.
    #[inline(always)]
    pub fn std_clamp(v: f32, lo: f32, hi: f32) -> f32 {
        if v < lo {
            lo
        } else if hi < v {
            hi
        } else {
            v
        }
    }

    /// `ggml_vec_reglu_f32`: `(x > 0.f) ? x * g : 0.f`.
    #[inline(always)]
    pub fn reglu(x: f32, g: f32) -> f32 {
        if x > 0.0 { x * g } else { 0.0 }
    }

    /// `ggml_vec_geglu_erf_f32`: `0.5f * x * (1.0f + erff(x*SQRT_2_INV)) * g`.
    #[inline(always)]
    pub fn geglu_erf(x: f32, g: f32) -> f32 {
        0.5 * x * (1.0 + erf_f32(x * SQRT_2_INV)) * g
    }

    /// `ggml_compute_forward_swiglu_oai_f32`'s element.
    #[inline(always)]
    pub fn swiglu_oai(a: f32, b: f32, alpha: f32, limit: f32) -> f32 {
        let x = std_min(a, limit);
        let y = std_clamp(b, -limit, limit);
        let out_glu = x / (1.0 + (alpha * (-x)).exp());
        out_glu * (y + 1.0)
    }

    /// `ggml_compute_forward_swiglu_clamp_f32`'s element: `gate / (1.f + expf(-gate)) * up`.
    #[inline(always)]
    pub fn swiglu_clamp(a: f32, b: f32, limit: f32) -> f32 {
        let gate = std_min(a, limit);
        let up = std_clamp(b, -limit, limit);
        gate / (1.0 + (-gate).exp()) * up
    }
}

/// `ggml_compute_forward_rms_norm_f32` for one row: `y = x * (1/sqrtf(mean + eps))` with
/// `mean = (float)(Σ (double)(x*x) / n)`.
pub fn rms_norm_row(x: &[f32], eps: f32, y: &mut [f32]) {
    let mut sum = 0f64;
    for &v in x {
        sum += f64::from(v * v);
    }
    rms_norm_scale(x, sum, eps, y);
}

/// `Σ (double)(x*x)` of 4 rows of one length, each summed in order as [`rms_norm_row`] does:
/// four independent chains, where one row's chain waits on each double add's latency (about
/// 2 % of Gemma 3's prompt, whose norms run over 3840 values a token and layer).
pub fn sum_sq_rows4(x: [&[f32]; 4]) -> [f64; 4] {
    let n = x[0].len();
    let x = x.map(|r| &r[..n]);
    let mut sum = [0f64; 4];
    for i in 0..n {
        for (s, r) in sum.iter_mut().zip(&x) {
            *s += f64::from(r[i] * r[i]);
        }
    }
    sum
}

/// The rest of [`rms_norm_row`] once its row's `sum` is known.
pub fn rms_norm_scale(x: &[f32], sum: f64, eps: f32, y: &mut [f32]) {
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v * scale;
    }
}

/// `ggml_compute_forward_norm_f32` for one row, with the arithmetic of ggml's x86 AVX2 build:
/// the mean is `(float)Σ(double)x / n` in f32; `ggml_vec_cvar_f32` sums the squared deviations
/// in f32 eight at a time (its `_mm256` horizontal sum: halves, then pairs, then the last two),
/// each group's sum added in double, the tail element by element; then
/// `y = (x - mean) * (1/sqrtf(var + eps))`.
pub fn norm_row(x: &[f32], eps: f32, y: &mut [f32]) {
    let n = x.len();
    let mut sum = 0f64;
    for &v in x {
        sum += f64::from(v);
    }
    let mean = sum as f32 / n as f32;
    let mut var = 0f64;
    let groups = n / 8 * 8;
    for (xs, ys) in x[..groups]
        .chunks_exact(8)
        .zip(y[..groups].chunks_exact_mut(8))
    {
        let mut sq = [0f32; 8];
        for i in 0..8 {
            ys[i] = xs[i] - mean;
            sq[i] = ys[i] * ys[i];
        }
        let h = [sq[0] + sq[4], sq[1] + sq[5], sq[2] + sq[6], sq[3] + sq[7]];
        let p = [h[0] + h[2], h[1] + h[3]];
        var += f64::from(p[0] + p[1]);
    }
    for (o, &v) in y[groups..].iter_mut().zip(&x[groups..]) {
        *o = v - mean;
        var += f64::from(*o * *o);
    }
    let var = (var / n as f64) as f32;
    let scale = 1.0 / (var + eps).sqrt();
    for o in y.iter_mut() {
        *o *= scale;
    }
}

/// Parameters of [`rope_cache`] (ggml's rope op parameters).
#[derive(Clone, Copy, Debug)]
pub struct RopeCacheParams {
    pub freq_scale: f32,
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub corr_dims: [f32; 2],
    /// `powf(freq_base, -2.0f/n_dims)`.
    pub theta_scale: f32,
    /// 1 forward, -1 backward.
    pub sin_sign: f32,
}

/// `ggml_rope_cache_init` for position `p`: `cache[i0] = cos`, `cache[i0+1] = sin` for every
/// even `i0 < cache.len()`; `freq_factors` indexed by `i0/2` when present.
pub fn rope_cache(p: f32, prm: &RopeCacheParams, freq_factors: Option<&[f32]>, cache: &mut [f32]) {
    let mut theta = p;
    for i0 in (0..cache.len() / 2 * 2).step_by(2) {
        let ff = freq_factors.map_or(1.0, |f| f.get(i0 / 2).copied().unwrap_or(1.0));
        let theta_extrap = theta / ff;
        let theta_interp = prm.freq_scale * theta_extrap;
        let mut th = theta_interp;
        let mut mscale = prm.attn_factor;
        if prm.ext_factor != 0.0 {
            let y = ((i0 / 2) as f32 - prm.corr_dims[0])
                / (prm.corr_dims[1] - prm.corr_dims[0]).max(0.001);
            let ramp = 1.0 - y.clamp(0.0, 1.0);
            let ramp_mix = ramp * prm.ext_factor;
            th = theta_interp.mul_add(1.0 - ramp_mix, theta_extrap * ramp_mix);
            mscale *= 0.1f32.mul_add((1.0 / prm.freq_scale).ln(), 1.0);
        }
        cache[i0] = th.cos() * mscale;
        cache[i0 + 1] = th.sin() * mscale * prm.sin_sign;
        theta *= prm.theta_scale;
    }
}

/// `rotate_pairs<float>` over the first `n_dims` values of a row (pairs `(i, i + n_dims/2)`
/// for neox, adjacent pairs otherwise), with GCC's contractions: `y0 = fma(x0, cos, -(x1*sin))`,
/// `y1 = fma(x0, sin, x1*cos)` (its scalar neox loop and its `vfmaddsub` vector loops for normal
/// mode), except that normal mode's last pair of an odd count takes the unfused
/// `vmulps`/`vaddsubps` tail: `y0 = cos*x0 - sin*x1`, `y1 = cos*x1 + sin*x0`.
pub fn rope_rotate(neox: bool, n_dims: usize, cache: &[f32], x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn fast(neox: bool, n_dims: usize, cache: &[f32], x: &[f32], y: &mut [f32]) {
            rope_rotate_impl(neox, n_dims, cache, x, y)
        }
        // SAFETY: AVX2/FMA present; the same operations, with `mul_add` as one `vfmadd`
        // instead of a call to the software `fmaf` (same result).
        unsafe { fast(neox, n_dims, cache, x, y) };
        return;
    }
    rope_rotate_impl(neox, n_dims, cache, x, y);
}

#[inline(always)]
fn rope_rotate_impl(neox: bool, n_dims: usize, cache: &[f32], x: &[f32], y: &mut [f32]) {
    let pairs = n_dims / 2;
    let (step, off) = if neox { (1, pairs) } else { (2, 1) };
    let fused = if neox { pairs } else { pairs / 2 * 2 };
    for i in 0..pairs {
        let (c, s) = (cache[2 * i], cache[2 * i + 1]);
        let j = i * step;
        let (x0, x1) = (x[j], x[j + off]);
        if i < fused {
            y[j] = x0.mul_add(c, -(x1 * s));
            y[j + off] = x0.mul_add(s, x1 * c);
        } else {
            y[j] = c * x0 - s * x1;
            y[j + off] = c * x1 + s * x0;
        }
    }
}

#[cfg(target_arch = "x86_64")]
use super::x86::avx2::act as avx2;
