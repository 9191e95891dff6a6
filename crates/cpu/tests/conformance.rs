//! Op conformance in the spirit of llama.cpp's test-backend-ops: every op × type × shape
//! against a plain scalar reference with f64 accumulation, with ggml's normalized-MSE limits
//! (1e-7 exact ops, 5e-4 mul_mat), sentinel bytes around every tensor to catch out-of-bounds
//! writes, inputs uploaded with `set_async` and outputs read with `get_async`. The whole suite
//! runs on one device (3 worker threads) and again on each of 3 virtual devices.

#![allow(clippy::needless_range_loop)] // index loops mirror the reference formulas

mod common;

use std::sync::Arc;

use common::Rng;
use common::conf::*;
use lamina_core::DType;
use lamina_core::graph::{GluOp, Graph, RopeMode, RopeParams, build_kq_mask};

const WEIGHT_TYPES: [DType; lamina_cpu::MATMUL_WEIGHT_TYPES.len()] =
    lamina_cpu::MATMUL_WEIGHT_TYPES;

#[test]
fn mul_mat_all_types() {
    let mut seed = 1;
    for_devices(|dev| {
        let types: &[DType] = if cfg!(miri) {
            &[DType::F16, DType::BF16, DType::Q4_0, DType::Q4_K]
        } else {
            &WEIGHT_TYPES
        };
        for &dtype in types {
            let blck = dtype.block_size() as usize;
            let ks: Vec<usize> = if blck == 1 {
                vec![7, 33, 256]
            } else {
                vec![blck, 2 * blck]
            };
            let ks = if cfg!(miri) { &ks[..1] } else { &ks[..] };
            for &k in ks {
                // (M, N, a batch, b batch, transposed b)
                let shapes: &[(usize, usize, usize, usize, bool)] = &[
                    (7, 1, 1, 1, false),
                    (13, 3, 2, 4, false),
                    (5, 9, 1, 3, true),
                ];
                let shapes = if cfg!(miri) { &shapes[1..2] } else { shapes };
                for &(m, n, ab, bb, tb) in shapes {
                    seed += 1;
                    let mut rng = Rng::new(seed);
                    let mut g = Graph::new();
                    let a = rand_leaf(&mut g, &mut rng, dtype, &[k, m, ab]);
                    let (b, b_id, b_vals) = if tb {
                        let x = rand_leaf(&mut g, &mut rng, DType::F32, &[n, k, bb]);
                        let t = g.transpose(x.id).unwrap();
                        let v = logical(&g, t, &x.vals);
                        (x, t, v)
                    } else {
                        let x = rand_leaf(&mut g, &mut rng, DType::F32, &[k, n, bb]);
                        let v = x.vals.clone();
                        let id = x.id;
                        (x, id, v)
                    };
                    let out = g.mul_mat(a.id, b_id).unwrap();
                    let got = run(dev, g, &[&a, &b], out);
                    let mut reference = vec![0f64; m * n * bb];
                    for i2 in 0..bb {
                        for j in 0..n {
                            for i in 0..m {
                                let ai = i2 / (bb / ab);
                                let mut s = 0f64;
                                for kk in 0..k {
                                    s += a.vals[kk + k * (i + m * ai)]
                                        * b_vals[kk + k * (j + n * i2)];
                                }
                                reference[i + m * (j + n * i2)] = s;
                            }
                        }
                    }
                    let limit = if dtype == DType::F32 { EXACT } else { MUL_MAT };
                    check(
                        &format!("mul_mat {dtype} k={k} m={m} n={n}"),
                        dev,
                        &got,
                        &reference,
                        limit,
                    );
                }
            }
        }
    });
}

#[test]
fn get_rows_all_types() {
    for_devices(|dev| {
        for (s, dtype) in WEIGHT_TYPES.into_iter().chain([DType::Q8_0]).enumerate() {
            let ne0 = if dtype.block_size() == 1 {
                13
            } else {
                dtype.block_size() as usize * 2
            };
            let mut rng = Rng::new(100 + s as u64);
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, dtype, &[ne0, 5, 2]);
            let idx_vals = [4.0, 0.0, 2.0, 2.0, 1.0, 3.0];
            let b = leaf(&mut g, DType::I32, &[3, 2], &idx_vals);
            let out = g.get_rows(a.id, b.id).unwrap();
            let got = run(dev, g, &[&a, &b], out);
            let mut reference = Vec::new();
            for i11 in 0..2 {
                for i10 in 0..3 {
                    let r = idx_vals[i10 + 3 * i11] as usize;
                    reference
                        .extend_from_slice(&a.vals[ne0 * (r + 5 * i11)..ne0 * (r + 5 * i11 + 1)]);
                }
            }
            check(&format!("get_rows {dtype}"), dev, &got, &reference, EXACT);
        }
    });
}

#[test]
fn binary_ops_broadcast_and_views() {
    for_devices(|dev| {
        let cases: &[(&[usize], &[usize], bool)] = &[
            (&[13, 5, 3, 2], &[13, 5, 3, 2], false),
            (&[13, 5, 3, 2], &[13, 1, 3, 1], false),
            (&[10, 5, 3, 1], &[1, 5, 1, 1], false),
            (&[7, 6], &[7, 1], true),
        ];
        for (ci, &(ane, bne, transposed)) in cases.iter().enumerate() {
            for add in [true, false] {
                let mut rng = Rng::new(200 + ci as u64);
                let mut g = Graph::new();
                let (a, a_id, a_vals) = if transposed {
                    let x = rand_leaf(&mut g, &mut rng, DType::F32, &[ane[1], ane[0]]);
                    let t = g.transpose(x.id).unwrap();
                    let v = logical(&g, t, &x.vals);
                    (x, t, v)
                } else {
                    let x = rand_leaf(&mut g, &mut rng, DType::F32, ane);
                    let v = x.vals.clone();
                    let id = x.id;
                    (x, id, v)
                };
                let b = rand_leaf(&mut g, &mut rng, DType::F32, bne);
                let out = if add {
                    g.add(a_id, b.id)
                } else {
                    g.mul(a_id, b.id)
                }
                .unwrap();
                let got = run(dev, g, &[&a, &b], out);
                let (an, bn) = (full(ane), full(bne));
                let mut reference = vec![0f64; an.iter().product()];
                for_each_index(an, |i| {
                    let bi = [i[0] % bn[0], i[1] % bn[1], i[2] % bn[2], i[3] % bn[3]];
                    let (x, y) = (a_vals[idx4(an, i)], b.vals[idx4(bn, bi)]);
                    reference[idx4(an, i)] = if add { x + y } else { x * y };
                });
                check(
                    &format!("{} {ane:?} {bne:?}", if add { "add" } else { "mul" }),
                    dev,
                    &got,
                    &reference,
                    EXACT,
                );
            }
        }
    });
}

/// Row-wise unary ops against f64 references.
#[test]
fn row_ops() {
    type RowRef = fn(&[f64]) -> Vec<f64>;
    let silu = |x: f64| x / (1.0 + (-x).exp());
    let gelu = |x: f64| {
        0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
    };
    let _ = (silu, gelu);
    let ops: Vec<(&str, RowRef)> = vec![
        ("scale", |x| x.iter().map(|v| v * 0.75 + 0.25).collect()),
        ("rms_norm", |x| {
            let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
            x.iter().map(|v| v / (ms + 1e-6).sqrt()).collect()
        }),
        ("norm", |x| {
            let mean = x.iter().sum::<f64>() / x.len() as f64;
            let var = x.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / x.len() as f64;
            x.iter().map(|v| (v - mean) / (var + 1e-5).sqrt()).collect()
        }),
        ("silu", |x| {
            x.iter().map(|&v| v / (1.0 + (-v).exp())).collect()
        }),
        ("gelu", |x| {
            x.iter()
                .map(|&v| {
                    0.5 * v
                        * (1.0
                            + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v))
                                .tanh())
                })
                .collect()
        }),
        ("soft_max", |x| {
            let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = x.iter().map(|v| (v - m).exp()).sum();
            x.iter().map(|v| (v - m).exp() / s).collect()
        }),
    ];
    for_devices(|dev| {
        for (oi, (name, f)) in ops.iter().enumerate() {
            for ne in [[13usize, 7, 2, 1], [100, 3, 1, 1], [1, 4, 1, 1]] {
                let mut rng = Rng::new(300 + oi as u64);
                let mut g = Graph::new();
                let a = rand_leaf(&mut g, &mut rng, DType::F32, &ne);
                let out = match *name {
                    "scale" => g.scale_bias(a.id, 0.75, 0.25),
                    "rms_norm" => g.rms_norm(a.id, 1e-6),
                    "norm" => g.norm(a.id, 1e-5),
                    "silu" => g.silu(a.id),
                    "gelu" => g.gelu(a.id),
                    _ => g.soft_max(a.id),
                }
                .unwrap();
                let got = run(dev, g, &[&a], out);
                let reference: Vec<f64> = a.vals.chunks(ne[0]).flat_map(f).collect();
                let limit = if *name == "norm" && ne[0] == 1 {
                    f64::INFINITY
                } else if *name == "gelu" {
                    GELU_F16_TABLE
                } else {
                    EXACT
                };
                check(&format!("{name} {ne:?}"), dev, &got, &reference, limit);
            }
        }
    });
}

#[test]
fn glu_ops() {
    // SwiGluOai and SwiGluClamp take parameters: see ops_moe.rs.
    let act = |op: GluOp, v: f64| match op {
        GluOp::SwiGlu => v / (1.0 + (-v).exp()),
        GluOp::GeGlu => {
            0.5 * v
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (v + 0.044715 * v * v * v)).tanh())
        }
        GluOp::ReGlu => v.max(0.0),
        GluOp::GeGluErf => 0.5 * v * (1.0 + erf64(v / std::f64::consts::SQRT_2)),
        GluOp::SwiGluOai | GluOp::SwiGluClamp => unreachable!(),
    };
    for_devices(|dev| {
        for op in [GluOp::SwiGlu, GluOp::GeGlu, GluOp::ReGlu, GluOp::GeGluErf] {
            let mut rng = Rng::new(400);
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, DType::F32, &[11, 3, 2]);
            let b = rand_leaf(&mut g, &mut rng, DType::F32, &[11, 3, 2]);
            let out = match op {
                GluOp::SwiGlu => g.swiglu_split(a.id, b.id),
                GluOp::GeGlu => g.geglu_split(a.id, b.id),
                _ => g.glu_split(op, a.id, b.id),
            }
            .unwrap();
            let got = run(dev, g, &[&a, &b], out);
            let reference: Vec<f64> = a
                .vals
                .iter()
                .zip(&b.vals)
                .map(|(x, y)| act(op, *x) * y)
                .collect();
            let limit = match op {
                GluOp::GeGlu => GELU_F16_TABLE,
                _ => EXACT,
            };
            check(&format!("{op:?} split"), dev, &got, &reference, limit);
            for swapped in [false, true] {
                let mut g = Graph::new();
                let a = rand_leaf(&mut g, &mut rng, DType::F32, &[14, 5]);
                let out = g.glu(op, a.id, swapped).unwrap();
                let got = run(dev, g, &[&a], out);
                let reference: Vec<f64> = a
                    .vals
                    .chunks(14)
                    .flat_map(|r| {
                        let (x, y) = if swapped {
                            (&r[7..], &r[..7])
                        } else {
                            (&r[..7], &r[7..])
                        };
                        x.iter()
                            .zip(y)
                            .map(|(x, y)| act(op, *x) * y)
                            .collect::<Vec<_>>()
                    })
                    .collect();
                check(
                    &format!("{op:?} fused swapped={swapped}"),
                    dev,
                    &got,
                    &reference,
                    limit,
                );
            }
        }
    });
}

/// f64 RoPE reference following ggml (YaRN included).
fn rope_ref(
    x: &[f64],
    ne: [usize; 4],
    pos: &[i32],
    ff: Option<&[f64]>,
    p: &RopeParams,
) -> Vec<f64> {
    let nd = p.n_dims;
    let theta_scale = (p.freq_base as f64).powf(-2.0 / nd as f64);
    let corr = |n_rot: f64| {
        nd as f64 * (p.n_ctx_orig as f64 / (n_rot * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (p.freq_base as f64).ln())
    };
    let c0 = corr(p.beta_fast as f64).floor().max(0.0);
    let c1 = corr(p.beta_slow as f64).ceil().min(nd as f64 - 1.0);
    let mut out = x.to_vec();
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                let base = ne[0] * (i1 + ne[1] * (i2 + ne[2] * i3));
                for i0 in (0..nd).step_by(2) {
                    let f = ff.map_or(1.0, |f| f[i0 / 2]);
                    let extrap = pos[i2] as f64 * theta_scale.powi((i0 / 2) as i32) / f;
                    let interp = p.freq_scale as f64 * extrap;
                    let mut mscale = p.attn_factor as f64;
                    let mut theta = interp;
                    if p.ext_factor != 0.0 {
                        let y = ((i0 / 2) as f64 - c0) / (c1 - c0).max(0.001);
                        let mix = (1.0 - y.clamp(0.0, 1.0)) * p.ext_factor as f64;
                        theta = interp * (1.0 - mix) + extrap * mix;
                        mscale *= 1.0 + 0.1 * (1.0 / p.freq_scale as f64).ln();
                    }
                    let (c, s) = (theta.cos() * mscale, theta.sin() * mscale);
                    let (j0, j1) = match p.mode {
                        RopeMode::Normal => (i0, i0 + 1),
                        RopeMode::Neox => (i0 / 2, i0 / 2 + nd / 2),
                    };
                    let (a, b) = (x[base + j0], x[base + j1]);
                    out[base + j0] = a * c - b * s;
                    out[base + j1] = a * s + b * c;
                }
            }
        }
    }
    out
}

#[test]
fn rope_modes() {
    for_devices(|dev| {
        let ne = [16usize, 3, 5, 1];
        let pos = [0, 1, 7, 100, 1000];
        for mode in [RopeMode::Normal, RopeMode::Neox] {
            for (n_dims, yarn, with_ff) in [(16, false, false), (8, false, true), (12, true, false)]
            {
                let mut rng = Rng::new(500);
                let mut g = Graph::new();
                let a = rand_leaf(&mut g, &mut rng, DType::F32, &ne);
                let p_t = leaf(&mut g, DType::I32, &[5], &pos.map(|p| p as f32));
                let ff_vals: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + i as f32 * 0.5).collect();
                let ff = with_ff.then(|| leaf(&mut g, DType::F32, &[n_dims / 2], &ff_vals));
                let mut p = RopeParams::new(n_dims, mode, 10000.0);
                if yarn {
                    p.freq_scale = 0.25;
                    p.ext_factor = 1.0;
                    p.n_ctx_orig = 4096;
                    p.attn_factor = 1.0;
                }
                let out = g
                    .rope_ext(a.id, p_t.id, ff.as_ref().map(|f| f.id), p)
                    .unwrap();
                let mut inputs = vec![&a, &p_t];
                if let Some(f) = &ff {
                    inputs.push(f);
                }
                let got = run(dev, g, &inputs, out);
                let reference = rope_ref(&a.vals, ne, &pos, ff.as_ref().map(|f| &f.vals[..]), &p);
                check(
                    &format!("rope {mode:?} n_dims={n_dims} yarn={yarn} ff={with_ff}"),
                    dev,
                    &got,
                    &reference,
                    EXACT,
                );
            }
        }
    });
}

#[test]
fn soft_max_masks_and_alibi() {
    for_devices(|dev| {
        let (n_kv, n_q, n_head) = (9usize, 4usize, 3usize);
        let kv_pos: Vec<i32> = (0..n_kv as i32).collect();
        let q_pos: Vec<i32> = (5..5 + n_q as i32).collect();
        for (window, mask_type, max_bias) in [
            (None, DType::F32, 0.0f32),
            (Some(3u32), DType::F16, 0.0),
            (None, DType::F32, 8.0),
        ] {
            let mut rng = Rng::new(600);
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, DType::F32, &[n_kv, n_q, n_head]);
            let mask_vals = build_kq_mask(&kv_pos, &q_pos, window);
            // Pad the mask with an extra row, as llama.cpp pads to a multiple of the batch.
            let mut padded = mask_vals.clone();
            padded.extend(std::iter::repeat_n(0.0, n_kv));
            let m = leaf(&mut g, mask_type, &[n_kv, n_q + 1], &padded);
            let scale = 0.125;
            let out = g.soft_max_ext(a.id, Some(m.id), scale, max_bias).unwrap();
            let got = run(dev, g, &[&a, &m], out);
            let n_head_log2 = 1usize << (usize::BITS - 1 - n_head.leading_zeros());
            let m0 = 2f64.powf(-(max_bias as f64) / n_head_log2 as f64);
            let m1 = 2f64.powf(-(max_bias as f64) / 2.0 / n_head_log2 as f64);
            let mut reference = Vec::new();
            for h in 0..n_head {
                let slope = if max_bias == 0.0 {
                    1.0
                } else if h < n_head_log2 {
                    m0.powi(h as i32 + 1)
                } else {
                    m1.powi(2 * (h - n_head_log2) as i32 + 1)
                };
                for q in 0..n_q {
                    let row: Vec<f64> = (0..n_kv)
                        .map(|j| {
                            a.vals[j + n_kv * (q + n_q * h)] * scale as f64
                                + slope * f64::from(mask_vals[j + n_kv * q])
                        })
                        .collect();
                    let mx = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let s: f64 = row.iter().map(|v| (v - mx).exp()).sum();
                    reference.extend(row.iter().map(|v| (v - mx).exp() / s));
                }
            }
            check(
                &format!("soft_max window={window:?} mask={mask_type} bias={max_bias}"),
                dev,
                &got,
                &reference,
                EXACT,
            );
            // Masked positions must be exactly zero.
            for (i, v) in got.iter().enumerate() {
                if mask_vals[i % (n_kv * n_q)] == f32::NEG_INFINITY {
                    assert_eq!(*v, 0.0);
                }
            }
        }
    });
}

#[test]
fn set_rows_kv_cache_writes() {
    for_devices(|dev| {
        for dst_type in [DType::F32, DType::F16, DType::BF16, DType::Q8_0] {
            // One-value rows too: the transposed V cache of attention without flash attention.
            let widths: &[usize] = if dst_type.is_quantized() {
                &[64]
            } else {
                &[12, 1]
            };
            for (idx_type, &ne0) in [DType::I32, DType::I64]
                .into_iter()
                .flat_map(|t| widths.iter().map(move |w| (t, w)))
            {
                let mut rng = Rng::new(700);
                let mut g = Graph::new();
                let cache = rand_leaf(&mut g, &mut rng, dst_type, &[ne0, 10, 2]);
                let src = rand_leaf(&mut g, &mut rng, DType::F32, &[ne0, 3, 2]);
                let rows = [7.0, 0.0, 3.0];
                let idx = leaf(&mut g, idx_type, &[3], &rows);
                let out = g.set_rows(cache.id, src.id, idx.id).unwrap();
                let cache_id = cache.id;
                let got = run(dev, g, &[&cache, &src, &idx], cache_id);
                let _ = out;
                let mut reference = cache.vals.clone();
                for i2 in 0..2 {
                    for (i1, &r) in rows.iter().enumerate() {
                        let s = &src.vals[ne0 * (i1 + 3 * i2)..ne0 * (i1 + 3 * i2 + 1)];
                        let s32: Vec<f32> = s.iter().map(|v| *v as f32).collect();
                        let (_, back) = encode(dst_type, ne0, &s32);
                        let d = ne0 * (r as usize + 10 * i2);
                        reference[d..d + ne0].copy_from_slice(&back);
                    }
                }
                check(
                    &format!("set_rows {dst_type} {idx_type} ne0={ne0}"),
                    dev,
                    &got,
                    &reference,
                    EXACT,
                );
            }
        }
    });
}

#[test]
fn cpy_into_cache_views_and_cont() {
    for_devices(|dev| {
        for (src_type, dst_type) in [
            (DType::F32, DType::F16),
            (DType::F32, DType::F32),
            (DType::F16, DType::F32),
            (DType::F32, DType::BF16),
        ] {
            let mut rng = Rng::new(800);
            let mut g = Graph::new();
            let cache = rand_leaf(&mut g, &mut rng, dst_type, &[8, 6]);
            let src = rand_leaf(&mut g, &mut rng, src_type, &[8, 2]);
            let row = dst_type.type_size() as usize * 8;
            // Write 2 rows at row 3 of the cache, like a KV-cache append.
            let view = g.view_2d(cache.id, 8, 2, row, 3 * row).unwrap();
            let _w = g.cpy(src.id, view).unwrap();
            let cache_id = cache.id;
            let got = run(dev, g, &[&cache, &src], cache_id);
            let mut reference = cache.vals.clone();
            let s32: Vec<f32> = src.vals.iter().map(|v| *v as f32).collect();
            let (_, back) = encode(dst_type, 8, &s32);
            reference[24..40].copy_from_slice(&back);
            check(
                &format!("cpy {src_type}->{dst_type}"),
                dev,
                &got,
                &reference,
                EXACT,
            );
        }
        // Different shapes, same element count: flat ggml order.
        let mut rng = Rng::new(801);
        let mut g = Graph::new();
        let a = rand_leaf(&mut g, &mut rng, DType::F32, &[6, 4]);
        let b = rand_leaf(&mut g, &mut rng, DType::F32, &[3, 8]);
        let _ = g.cpy(a.id, b.id).unwrap();
        let b_id = b.id;
        let got = run(dev, g, &[&a, &b], b_id);
        check("cpy reshape", dev, &got, &a.vals, EXACT);
        // cont of permuted and transposed views.
        for axes in [[1, 0, 2, 3], [2, 0, 1, 3], [0, 2, 1, 3], [3, 2, 1, 0]] {
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, DType::F32, &[5, 3, 4, 2]);
            let p = g.permute(a.id, axes).unwrap();
            let reference = logical(&g, p, &a.vals);
            let out = g.cont(p).unwrap();
            let got = run(dev, g, &[&a], out);
            check(
                &format!("cont(permute {axes:?})"),
                dev,
                &got,
                &reference,
                0.0,
            );
        }
        // reshape + view chains feed ops correctly.
        let mut g = Graph::new();
        let a = rand_leaf(&mut g, &mut rng, DType::F32, &[6, 4]);
        let r = g.reshape(a.id, &[3, 8]).unwrap();
        let v = g.view_2d(r, 2, 8, 12, 4).unwrap();
        let reference = logical(&g, v, &a.vals);
        let out = g.cont(v).unwrap();
        let got = run(dev, g, &[&a], out);
        check("cont(view(reshape))", dev, &got, &reference, 0.0);
    });
}

#[test]
fn concat_every_dim() {
    for_devices(|dev| {
        for dim in 0..4 {
            let mut ane = [3usize, 4, 2, 2];
            let mut bne = ane;
            ane[dim] = 2;
            bne[dim] = 3;
            let mut rng = Rng::new(900 + dim as u64);
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, DType::F32, &ane);
            let b = rand_leaf(&mut g, &mut rng, DType::F32, &bne);
            let out = g.concat(a.id, b.id, dim).unwrap();
            let got = run(dev, g, &[&a, &b], out);
            let mut one = ane;
            one[dim] += bne[dim];
            let mut reference = vec![0f64; one.iter().product()];
            for_each_index(one, |i| {
                let v = if i[dim] < ane[dim] {
                    a.vals[idx4(ane, i)]
                } else {
                    let mut j = i;
                    j[dim] -= ane[dim];
                    b.vals[idx4(bne, j)]
                };
                reference[idx4(one, i)] = v;
            });
            check(&format!("concat dim {dim}"), dev, &got, &reference, 0.0);
        }
    });
}

#[test]
fn argmax_rows() {
    for_devices(|dev| {
        let mut rng = Rng::new(1000);
        let mut g = Graph::new();
        let a = rand_leaf(&mut g, &mut rng, DType::F32, &[37, 9]);
        let out = g.argmax(a.id).unwrap();
        let got = run(dev, g, &[&a], out);
        let reference: Vec<f64> = a
            .vals
            .chunks(37)
            .map(|r| {
                let mut best = 0;
                for (i, v) in r.iter().enumerate() {
                    if *v > r[best] {
                        best = i;
                    }
                }
                best as f64
            })
            .collect();
        assert_eq!(got, reference, "argmax on {}", dev.name());
    });
}

/// A small attention block chains many ops through a graph allocator's compute buffer; the
/// result must match the same ops run one at a time.
#[test]
fn attention_block_through_allocator() {
    use lamina_backend::{GraphAllocator, tensor_get_f32, tensor_set_f32, tensor_set_i32};
    for_devices(|dev| {
        let (hd, nh, nt) = (8usize, 2usize, 3usize);
        let mut rng = Rng::new(1100);
        let x_vals = rng.vec(hd * nh * nt, 1.0);
        let w_vals = rng.vec(hd * nh * hd * nh, 1.0);
        let build = |g: &mut Graph| {
            let w = g.new_input(DType::F32, &[hd * nh, hd * nh]).unwrap();
            let x = g.new_input(DType::F32, &[hd * nh, nt]).unwrap();
            let pos = g.new_input(DType::I32, &[nt]).unwrap();
            let mask = g.new_input(DType::F32, &[nt, nt]).unwrap();
            let q = g.mul_mat(w, x).unwrap();
            let q = g.reshape(q, &[hd, nh, nt]).unwrap();
            let q = g
                .rope_ext(q, pos, None, RopeParams::new(hd, RopeMode::Neox, 10000.0))
                .unwrap();
            let qp = g.permute(q, [0, 2, 1, 3]).unwrap();
            let kq = g.mul_mat(qp, qp).unwrap();
            let kq = g.soft_max_ext(kq, Some(mask), 0.3, 0.0).unwrap();
            let n = g.rms_norm(kq, 1e-6).unwrap();
            let out = g.silu(n).unwrap();
            g.set_output(out).unwrap();
            (w, x, pos, mask, out)
        };
        let mut g = Graph::new();
        let (w, x, pos, mask, out) = build(&mut g);
        let mut alloc = GraphAllocator::new(dev.buffer_type());
        alloc.reserve(&g).unwrap();
        alloc.allocate(&mut g).unwrap();
        let mask_vals = build_kq_mask(&[0, 1, 2], &[0, 1, 2], None);
        tensor_set_f32(&g, w, &w_vals).unwrap();
        tensor_set_f32(&g, x, &x_vals).unwrap();
        tensor_set_i32(&g, pos, &[0, 1, 2]).unwrap();
        tensor_set_f32(&g, mask, &mask_vals).unwrap();
        let g = Arc::new(g);
        dev.stream().compute(g.clone()).unwrap();
        let fused = tensor_get_f32(&g, out).unwrap();
        // The allocator must have reused memory: the buffer is smaller than all tensors.
        let total: usize = g
            .tensors()
            .iter()
            .filter(|t| t.view_src.is_none())
            .map(|t| t.layout.span_bytes())
            .sum();
        assert!(alloc.buffer().unwrap().size() < total + 64 * g.len());
        // Same graph, every tensor in its own memory with sentinels (no reuse).
        let mut g2 = Graph::new();
        let (w2, x2, pos2, mask2, out2) = build(&mut g2);
        let mk = |g: &mut Graph, id, v: &[f32], dt| {
            let (bytes, vals) = encode(dt, g.layout(id).ne[0], v);
            let _ = g;
            HostTensor { id, bytes, vals }
        };
        let hw = mk(&mut g2, w2, &w_vals, DType::F32);
        let hx = mk(&mut g2, x2, &x_vals, DType::F32);
        let hp = mk(&mut g2, pos2, &[0.0, 1.0, 2.0], DType::I32);
        let hm = mk(&mut g2, mask2, &mask_vals, DType::F32);
        let separate = run(dev, g2, &[&hw, &hx, &hp, &hm], out2);
        let fused64: Vec<f64> = fused.iter().map(|v| f64::from(*v)).collect();
        if cfg!(miri) {
            // Miri perturbs transcendental functions by a few ULPs on every call.
            check("allocator reuse", dev, &fused64, &separate, 1e-10);
        } else {
            assert_eq!(
                fused64,
                separate,
                "allocator reuse changed results on {}",
                dev.name()
            );
        }
    });
}

/// Row ops read non-contiguous inputs (permuted views) correctly.
#[test]
fn row_ops_on_strided_views() {
    for_devices(|dev| {
        for op in ["rms_norm", "soft_max", "silu", "scale"] {
            let mut rng = Rng::new(1200);
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, DType::F32, &[5, 9, 3]);
            let p = g.permute(a.id, [1, 0, 2, 3]).unwrap();
            let vals = logical(&g, p, &a.vals);
            let out = match op {
                "rms_norm" => g.rms_norm(p, 1e-6),
                "soft_max" => g.soft_max_ext(p, None, 0.5, 0.0),
                "silu" => g.silu(p),
                _ => g.scale(p, -2.0),
            }
            .unwrap();
            let got = run(dev, g, &[&a], out);
            let reference: Vec<f64> = vals
                .chunks(9)
                .flat_map(|x| -> Vec<f64> {
                    match op {
                        "rms_norm" => {
                            let ms = x.iter().map(|v| v * v).sum::<f64>() / 9.0;
                            x.iter().map(|v| v / (ms + 1e-6).sqrt()).collect()
                        }
                        "soft_max" => {
                            let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                            let s: f64 = x.iter().map(|v| ((v - m) * 0.5).exp()).sum();
                            x.iter().map(|v| ((v - m) * 0.5).exp() / s).collect()
                        }
                        "silu" => x.iter().map(|&v| v / (1.0 + (-v).exp())).collect(),
                        _ => x.iter().map(|v| v * -2.0).collect(),
                    }
                })
                .collect();
            check(
                &format!("{op} on a permuted view"),
                dev,
                &got,
                &reference,
                EXACT,
            );
        }
    });
}

/// `cont` of i32 data is bit-exact (no trip through f32).
#[test]
fn cont_i32_is_exact() {
    for_devices(|dev| {
        let vals: Vec<f32> = (0..12).map(|i| (i * 3 - 7) as f32).collect();
        let mut g = Graph::new();
        let a = leaf(&mut g, DType::I32, &[4, 3], &vals);
        let big = (1i32 << 30) + 1;
        let mut a_bytes = a.bytes.clone();
        a_bytes[..4].copy_from_slice(&big.to_le_bytes());
        let a = HostTensor {
            id: a.id,
            bytes: a_bytes,
            vals: a.vals,
        };
        let t = g.transpose(a.id).unwrap();
        let out = g.cont(t).unwrap();
        let got = run(dev, g, &[&a], out);
        // Transposed: element (i1, i0) of the output is a[i0, i1].
        let mut reference = vec![0f64; 12];
        for i1 in 0..3 {
            for i0 in 0..4 {
                reference[i1 + 3 * i0] = if i0 == 0 && i1 == 0 {
                    f64::from(big)
                } else {
                    a.vals[i0 + 4 * i1]
                };
            }
        }
        assert_eq!(got, reference, "on {}", dev.name());
    });
}
