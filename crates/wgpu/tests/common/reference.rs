//! Scalar CPU references (ggml-cpu semantics) and reference quantizers.
//! Inputs/outputs are logical, contiguous arrays in ggml order (ne[0] fastest).

use half::f16;
use lamina_wgpu::kernels::DType;

pub fn f16_bits(v: f32) -> u16 {
    f16::from_f32(v).to_bits()
}

pub fn f16_val(b: u16) -> f32 {
    f16::from_bits(b).to_f32()
}

fn rd16(b: &[u8], o: usize) -> f32 {
    f16_val(u16::from_le_bytes([b[o], b[o + 1]]))
}

/// ggml get_scale_min_k4.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes `n` elements of one row (`n` a multiple of the block size),
/// transcribing ggml's `dequantize_row_*`.
pub fn dequantize_row(dt: DType, src: &[u8], n: usize) -> Vec<f32> {
    let mut y = Vec::with_capacity(n);
    let qk = dt.block_elems() as usize;
    let bb = dt.block_bytes() as usize;
    for blk in 0..n / qk {
        let x = &src[blk * bb..(blk + 1) * bb];
        match dt {
            DType::F32 => y.push(f32::from_le_bytes([x[0], x[1], x[2], x[3]])),
            DType::F16 => y.push(rd16(x, 0)),
            DType::I32 => y.push(i32::from_le_bytes([x[0], x[1], x[2], x[3]]) as f32),
            DType::Q4_0 => {
                let d = rd16(x, 0);
                let mut o = [0f32; 32];
                for j in 0..16 {
                    o[j] = ((x[2 + j] & 0xF) as i32 - 8) as f32 * d;
                    o[j + 16] = ((x[2 + j] >> 4) as i32 - 8) as f32 * d;
                }
                y.extend_from_slice(&o);
            }
            DType::Q4_1 => {
                let (d, m) = (rd16(x, 0), rd16(x, 2));
                let mut o = [0f32; 32];
                for j in 0..16 {
                    o[j] = (x[4 + j] & 0xF) as f32 * d + m;
                    o[j + 16] = (x[4 + j] >> 4) as f32 * d + m;
                }
                y.extend_from_slice(&o);
            }
            DType::Q5_0 => {
                let d = rd16(x, 0);
                let qh = u32::from_le_bytes([x[2], x[3], x[4], x[5]]);
                let mut o = [0f32; 32];
                for j in 0..16 {
                    let xh0 = ((qh >> j) << 4) & 0x10;
                    let xh1 = (qh >> (j + 12)) & 0x10;
                    let x0 = ((x[6 + j] as u32 & 0xF) | xh0) as i32 - 16;
                    let x1 = ((x[6 + j] as u32 >> 4) | xh1) as i32 - 16;
                    o[j] = x0 as f32 * d;
                    o[j + 16] = x1 as f32 * d;
                }
                y.extend_from_slice(&o);
            }
            DType::Q8_0 => {
                let d = rd16(x, 0);
                for j in 0..32 {
                    y.push(x[2 + j] as i8 as f32 * d);
                }
            }
            DType::Q4_K | DType::Q5_K => {
                let (d, min) = (rd16(x, 0), rd16(x, 2));
                let scales = &x[4..16];
                let (qh, ql) = if dt == DType::Q5_K {
                    (&x[16..48], &x[48..176])
                } else {
                    (&x[0..0], &x[16..144])
                };
                let (mut u1, mut u2) = (1u8, 2u8);
                for (p, q) in ql.chunks_exact(32).enumerate() {
                    let (sc, m) = scale_min_k4(2 * p, scales);
                    let (d1, m1) = (d * sc as f32, min * m as f32);
                    let (sc, m) = scale_min_k4(2 * p + 1, scales);
                    let (d2, m2) = (d * sc as f32, min * m as f32);
                    for l in 0..32 {
                        let h = if dt == DType::Q5_K && qh[l] & u1 != 0 {
                            16
                        } else {
                            0
                        };
                        y.push(d1 * ((q[l] & 0xF) + h) as f32 - m1);
                    }
                    for l in 0..32 {
                        let h = if dt == DType::Q5_K && qh[l] & u2 != 0 {
                            16
                        } else {
                            0
                        };
                        y.push(d2 * ((q[l] >> 4) + h) as f32 - m2);
                    }
                    u1 <<= 2;
                    u2 <<= 2;
                }
            }
            DType::Q6_K => {
                let d = rd16(x, 208);
                let mut o = [0f32; 256];
                for half in 0..2 {
                    let ql = &x[64 * half..];
                    let qh = &x[128 + 32 * half..];
                    let sc = &x[192 + 8 * half..];
                    for l in 0..32 {
                        let is = l / 16;
                        let q1 = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i32 - 32;
                        let q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
                        let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
                        let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
                        let base = 128 * half;
                        o[base + l] = d * (sc[is] as i8) as f32 * q1 as f32;
                        o[base + l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
                        o[base + l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
                        o[base + l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
                    }
                }
                y.extend_from_slice(&o);
            }
        }
    }
    y
}

/// Tiny deterministic PRNG (xorshift64*), so tests need no extra crates.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u32(&mut self) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545F4914F6CDD1D) >> 32) as u32
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u32() >> 8) as f32 / (1u32 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

/// Quantizes one row. Legacy types use ggml's `quantize_row_*_ref`; K types
/// get random blocks with sane scales (the kernels only need valid blocks).
pub fn quantize_row(dt: DType, x: &[f32], rng: &mut Rng) -> Vec<u8> {
    let qk = dt.block_elems() as usize;
    let mut out = Vec::new();
    for b in x.chunks_exact(qk) {
        match dt {
            DType::F32 => out.extend_from_slice(&b[0].to_le_bytes()),
            DType::F16 => out.extend_from_slice(&f16_bits(b[0]).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(b[0] as i32).to_le_bytes()),
            DType::Q4_0 | DType::Q5_0 => {
                let (nq, off) = if dt == DType::Q4_0 {
                    (-8.0f32, 8.5f32)
                } else {
                    (-16.0, 16.5)
                };
                let mut max = 0f32;
                for &v in b {
                    if v.abs() > max.abs() {
                        max = v;
                    }
                }
                let d = max / nq;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16_bits(d).to_le_bytes());
                let lim = if dt == DType::Q4_0 { 15 } else { 31 };
                let q: Vec<u8> = b
                    .iter()
                    .map(|&v| ((v * id + off) as i8).min(lim) as u8)
                    .collect();
                if dt == DType::Q5_0 {
                    let mut qh = 0u32;
                    for j in 0..16 {
                        qh |= (((q[j] & 0x10) >> 4) as u32) << j;
                        qh |= (((q[j + 16] & 0x10) >> 4) as u32) << (j + 16);
                    }
                    out.extend_from_slice(&qh.to_le_bytes());
                }
                for j in 0..16 {
                    out.push((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
                }
            }
            DType::Q4_1 => {
                let min = b.iter().cloned().fold(f32::INFINITY, f32::min);
                let max = b.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16_bits(d).to_le_bytes());
                out.extend_from_slice(&f16_bits(min).to_le_bytes());
                for j in 0..16 {
                    let x0 = (((b[j] - min) * id + 0.5) as i8).min(15) as u8;
                    let x1 = (((b[j + 16] - min) * id + 0.5) as i8).min(15) as u8;
                    out.push(x0 | (x1 << 4));
                }
            }
            DType::Q8_0 => {
                let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                out.extend_from_slice(&f16_bits(d).to_le_bytes());
                for &v in b {
                    out.push((v * id).round() as i8 as u8);
                }
            }
            DType::Q4_K | DType::Q5_K | DType::Q6_K => {
                let mut blk: Vec<u8> = (0..dt.block_bytes())
                    .map(|_| rng.next_u32() as u8)
                    .collect();
                let d = f16_bits(0.002 + 0.004 * (rng.uniform() + 1.0)).to_le_bytes();
                if dt == DType::Q6_K {
                    blk[208..210].copy_from_slice(&d);
                } else {
                    blk[0..2].copy_from_slice(&d);
                    blk[2..4].copy_from_slice(
                        &f16_bits(0.001 + 0.002 * (rng.uniform() + 1.0)).to_le_bytes(),
                    );
                }
                out.extend_from_slice(&blk);
            }
        }
    }
    out
}

/// Iterates the logical index (i0, i1, i2, i3) of a contiguous [ne] array.
fn idx(ne: [usize; 4], i: [usize; 4]) -> usize {
    i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))
}

fn for_each(ne: [usize; 4], mut f: impl FnMut([usize; 4])) {
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    f([i0, i1, i2, i3]);
                }
            }
        }
    }
}

/// `op(a, b)` with b broadcast (index modulo b's ne).
pub fn binary(
    a: &[f32],
    ane: [usize; 4],
    b: &[f32],
    bne: [usize; 4],
    op: impl Fn(f32, f32) -> f32,
) -> Vec<f32> {
    let mut out = vec![0f32; a.len()];
    for_each(ane, |i| {
        let bi = [i[0] % bne[0], i[1] % bne[1], i[2] % bne[2], i[3] % bne[3]];
        out[idx(ane, i)] = op(a[idx(ane, i)], b[idx(bne, bi)]);
    });
    out
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

pub fn gelu(x: f32) -> f32 {
    // ggml-cpu's f16 table: the entry of x rounded to f16, rounded to f16.
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let r = |v: f32| half::f16::from_f32(v).to_f32();
    let x = r(x);
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    r(0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + 0.044715 * x * x)).tanh()))
}

/// ggml-cpu rms_norm (sum in double).
pub fn rms_norm(x: &[f32], ne0: usize, eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(ne0) {
        let sum: f64 = row.iter().map(|&v| (v * v) as f64).sum();
        let mean = (sum / ne0 as f64) as f32;
        let scale = 1.0 / (mean + eps).sqrt();
        out.extend(row.iter().map(|&v| v * scale));
    }
    out
}

/// ggml-cpu norm (mean/variance in double).
pub fn norm(x: &[f32], ne0: usize, eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(x.len());
    for row in x.chunks_exact(ne0) {
        let mean = (row.iter().map(|&v| v as f64).sum::<f64>() / ne0 as f64) as f32;
        let var: f64 = row
            .iter()
            .map(|&v| ((v - mean) * (v - mean)) as f64)
            .sum::<f64>()
            / ne0 as f64;
        let scale = 1.0 / (var as f32 + eps).sqrt();
        out.extend(row.iter().map(|&v| (v - mean) * scale));
    }
    out
}

/// softmax(x*scale + mask) per row; mask [ne0m, m1, m2, m3] broadcast by modulo.
/// Fully -inf rows give zeros (matching the kernel, not ggml's NaN).
pub fn soft_max(
    x: &[f32],
    ne: [usize; 4],
    mask: Option<(&[f32], [usize; 4])>,
    scale: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; x.len()];
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                let base = idx(ne, [0, i1, i2, i3]);
                let v: Vec<f32> = (0..ne[0])
                    .map(|i0| {
                        let m = mask.map_or(0.0, |(m, mne)| {
                            m[idx(mne, [i0, i1 % mne[1], i2 % mne[2], i3 % mne[3]])]
                        });
                        x[base + i0] * scale + m
                    })
                    .collect();
                let max = v.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                if max == f32::NEG_INFINITY {
                    continue;
                }
                let e: Vec<f64> = v.iter().map(|&t| ((t - max) as f64).exp()).collect();
                let sum: f64 = e.iter().sum();
                for i0 in 0..ne[0] {
                    out[base + i0] = (e[i0] / sum) as f32;
                }
            }
        }
    }
    out
}

/// ggml-cpu rope (ext_factor = 0, attn_factor = 1): x [ne0, n_head, n_tokens, ne3].
pub fn rope(
    x: &[f32],
    ne: [usize; 4],
    pos: &[i32],
    n_dims: usize,
    neox: bool,
    base: f32,
    fscale: f32,
) -> Vec<f32> {
    let mut out = x.to_vec();
    let theta_scale = base.powf(-2.0 / n_dims as f32);
    for i3 in 0..ne[3] {
        for (i2, &p) in pos.iter().enumerate().take(ne[2]) {
            // ggml_rope_cache_init: theta accumulates by repeated multiplication.
            let mut cache = vec![(0f32, 0f32); n_dims / 2];
            let mut theta = p as f32;
            for c in cache.iter_mut() {
                let t = fscale * theta;
                *c = (t.cos(), t.sin());
                theta *= theta_scale;
            }
            for i1 in 0..ne[1] {
                let b = idx(ne, [0, i1, i2, i3]);
                for (ic, &(c, s)) in cache.iter().enumerate() {
                    let (ia, ib) = if neox {
                        (ic, ic + n_dims / 2)
                    } else {
                        (2 * ic, 2 * ic + 1)
                    };
                    let (x0, x1) = (x[b + ia], x[b + ib]);
                    out[b + ia] = x0 * c - x1 * s;
                    out[b + ib] = x0 * s + x1 * c;
                }
            }
        }
    }
    out
}

/// mul_mat: w [K, M, w2, w3] (dequantized), x [K, N, b2, b3] -> [M, N, b2, b3], f64 sums.
pub fn mul_mat(w: &[f32], wne: [usize; 4], x: &[f32], xne: [usize; 4]) -> Vec<f32> {
    let (k, m, n) = (wne[0], wne[1], xne[1]);
    let (r2, r3) = (xne[2] / wne[2], xne[3] / wne[3]);
    let mut out = vec![0f32; m * n * xne[2] * xne[3]];
    for i13 in 0..xne[3] {
        for i12 in 0..xne[2] {
            for j in 0..n {
                let xr = &x[idx(xne, [0, j, i12, i13])..][..k];
                for i in 0..m {
                    let wr = &w[idx(wne, [0, i, i12 / r2, i13 / r3])..][..k];
                    let s: f64 = wr.iter().zip(xr).map(|(&a, &b)| a as f64 * b as f64).sum();
                    out[idx([m, n, xne[2], xne[3]], [i, j, i12, i13])] = s as f32;
                }
            }
        }
    }
    out
}

/// Normalized mean squared error `sum((a-b)^2) / sum(b^2)` (b = reference).
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let mut num = 0f64;
    let mut den = 0f64;
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    if den == 0.0 {
        if num == 0.0 { 0.0 } else { f64::INFINITY }
    } else {
        num / den
    }
}

/// Attention reference: q [D, n_q, H], k/v [D, n_kv, H_kv], mask [mne0, mne1, mne2] (row iq,
/// head h % mne2), output [D, H, n_q]. Softcap as in ggml: `c * tanh(s * scale / c)`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (d, n_q, h, n_kv, h_kv): (usize, usize, usize, usize, usize),
    mask: Option<(&[f32], [usize; 3])>,
    scale: f32,
    softcap: f32,
) -> Vec<f32> {
    let mut out = vec![0f32; d * h * n_q];
    for hh in 0..h {
        let hk = hh / (h / h_kv);
        for iq in 0..n_q {
            let qr = &q[d * (iq + n_q * hh)..][..d];
            let s: Vec<f64> = (0..n_kv)
                .map(|j| {
                    let kr = &k[d * (j + n_kv * hk)..][..d];
                    let mut x = qr
                        .iter()
                        .zip(kr)
                        .map(|(&a, &b)| a as f64 * b as f64)
                        .sum::<f64>()
                        * scale as f64;
                    if softcap > 0.0 {
                        x = softcap as f64 * (x / softcap as f64).tanh();
                    }
                    if let Some((m, mne)) = mask {
                        x += m[j + mne[0] * (iq + mne[1] * (hh % mne[2]))] as f64;
                    }
                    x
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            if mx == f64::NEG_INFINITY {
                continue;
            }
            let e: Vec<f64> = s.iter().map(|&x| (x - mx).exp()).collect();
            let sum: f64 = e.iter().sum();
            for dd in 0..d {
                let acc: f64 = (0..n_kv)
                    .map(|j| e[j] * v[dd + d * (j + n_kv * hk)] as f64)
                    .sum();
                out[dd + d * (hh + h * iq)] = (acc / sum) as f32;
            }
        }
    }
    out
}
