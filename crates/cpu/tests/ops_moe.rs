//! Conformance of the ops that MoE and the other llama.cpp architectures need (mul_mat_id,
//! argsort / top_k, sigmoid … gelu_erf, clamp, div, sum_rows, add_id, repeat, fill, the GLU
//! variants, softmax with sinks, 3-D get_rows), in the style of `conformance.rs`: several
//! shapes, odd sizes and strided views, against f64 references with ggml's NMSE limits,
//! sentinel bytes around every tensor, on one device and on each of 3 virtual devices.
//! `ops_exact.rs` holds the same ops to llama.cpp's bits; here also: mul_mat_id's rows equal
//! plain mul_mat's bit for bit, and bad expert ids are errors, not undefined behaviour.

#![allow(clippy::needless_range_loop)] // index loops mirror the reference formulas

mod common;

use std::sync::Arc;

use common::Rng;
use common::conf::*;
use lamina_backend::{BufferSlice, Device, GraphAllocator};
use lamina_core::DType;
use lamina_core::graph::{GluOp, Graph, SortOrder, TensorId, UnaryOp};

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// Runs `g` and returns the stream's error, if any (nothing panics).
fn compute_error(
    dev: &dyn Device,
    mut g: Graph,
    inputs: Vec<(TensorId, Vec<u8>)>,
) -> Option<String> {
    GraphAllocator::new(dev.buffer_type())
        .allocate(&mut g)
        .unwrap();
    let g = Arc::new(g);
    let stream = dev.stream();
    for (id, data) in inputs {
        stream
            .set_async(&BufferSlice::of_tensor(&g, id).unwrap(), data)
            .unwrap();
    }
    let queued = stream.compute_async(g.clone());
    let synced = stream.synchronize();
    queued.err().or(synced.err()).map(|e| e.to_string())
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn unary_ops_and_clamp() {
    type Ref = fn(f64) -> f64;
    let ops: [(UnaryOp, Ref); 8] = [
        (UnaryOp::Sigmoid, sigmoid),
        (UnaryOp::Softplus, |x| {
            if x > 20.0 { x } else { x.exp().ln_1p() }
        }),
        (UnaryOp::Tanh, f64::tanh),
        (UnaryOp::Relu, |x| x.max(0.0)),
        (UnaryOp::Sqr, |x| x * x),
        (UnaryOp::Sqrt, |x| x.abs().sqrt()),
        (UnaryOp::Exp, f64::exp),
        (UnaryOp::GeluErf, |x| {
            0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2))
        }),
    ];
    for_devices(|dev| {
        for (oi, &(op, f)) in ops.iter().enumerate() {
            for (si, ne) in [[13usize, 7, 2, 1], [100, 3, 1, 1], [1, 4, 1, 1]]
                .into_iter()
                .enumerate()
            {
                for view in [false, true] {
                    let mut rng = Rng::new(3000 + 10 * oi as u64 + si as u64);
                    let mut g = Graph::new();
                    let n: usize = ne.iter().product();
                    let mut v = rng.vec(n, 6.0);
                    if op == UnaryOp::Sqrt {
                        v.iter_mut().for_each(|x| *x = x.abs());
                    }
                    // Softplus's cut-over at 20 and a large input.
                    if op == UnaryOp::Softplus && n > 3 {
                        v[0] = 20.0;
                        v[1] = 20.5;
                        v[2] = 25.0;
                    }
                    let a = leaf(&mut g, DType::F32, &ne, &v);
                    let (src, vals) = if view {
                        let p = g.permute(a.id, [1, 0, 2, 3]).unwrap();
                        let vals = logical(&g, p, &a.vals);
                        (p, vals)
                    } else {
                        (a.id, a.vals.clone())
                    };
                    let out = g.unary(src, op).unwrap();
                    let got = run(dev, g, &[&a], out);
                    let reference: Vec<f64> = vals.iter().map(|&x| f(x)).collect();
                    check(
                        &format!("{op:?} {ne:?} view={view}"),
                        dev,
                        &got,
                        &reference,
                        EXACT,
                    );
                }
            }
        }
        // clamp, with the MoE weight-sum bounds and a NaN (ggml's MIN/MAX make it `max`)
        for (min, max) in [
            (-0.5f32, 0.25f32),
            (
                6.103_515_6e-5, /* 2^-14, llama.cpp's 6.103515625e-5 */
                f32::INFINITY,
            ),
        ] {
            let mut rng = Rng::new(3100);
            let mut g = Graph::new();
            let mut v = rng.vec(37 * 3, 1.0);
            v[5] = f32::NAN;
            let a = leaf(&mut g, DType::F32, &[37, 3], &v);
            let out = g.clamp(a.id, min, max).unwrap();
            let got = run(dev, g, &[&a], out);
            let reference: Vec<f64> = v
                .iter()
                .map(|&x| {
                    if x.is_nan() {
                        f64::from(max)
                    } else {
                        f64::from(x.clamp(min, max))
                    }
                })
                .collect();
            assert_eq!(got, reference, "clamp({min}, {max}) on {}", dev.name());
        }
    });
}

#[test]
fn glu_oai_and_clamp() {
    let (alpha, limit) = (1.702f64, 7.0f64);
    for_devices(|dev| {
        for (si, ne) in [[11usize, 3, 2, 1], [64, 2, 1, 1], [1, 5, 1, 1]]
            .into_iter()
            .enumerate()
        {
            for op in [GluOp::SwiGluOai, GluOp::SwiGluClamp] {
                let mut rng = Rng::new(3200 + si as u64);
                let mut g = Graph::new();
                let n: usize = ne.iter().product();
                // Beyond the limit on both sides.
                let a = leaf(&mut g, DType::F32, &ne, &rng.vec(n, 10.0));
                let b = leaf(&mut g, DType::F32, &ne, &rng.vec(n, 10.0));
                let out = match op {
                    GluOp::SwiGluOai => g.swiglu_oai(a.id, b.id, alpha as f32, limit as f32),
                    _ => g.swiglu_clamp(a.id, b.id, limit as f32),
                }
                .unwrap();
                let got = run(dev, g, &[&a, &b], out);
                let reference: Vec<f64> = a
                    .vals
                    .iter()
                    .zip(&b.vals)
                    .map(|(&x, &y)| {
                        let x = x.min(limit);
                        let y = y.clamp(-limit, limit);
                        match op {
                            GluOp::SwiGluOai => x * sigmoid(alpha * x) * (y + 1.0),
                            _ => x * sigmoid(x) * y,
                        }
                    })
                    .collect();
                check(&format!("{op:?} {ne:?}"), dev, &got, &reference, EXACT);
            }
        }
    });
}

/// div (and mul/add) with every ggml_can_repeat broadcast, including `b.ne0 == 1`
/// (`[n_embd, n_used, n_tokens] * [1, n_used, n_tokens]`), strided views of both operands.
#[test]
fn div_broadcast_and_views() {
    for_devices(|dev| {
        let cases: &[(&[usize], &[usize])] = &[
            (&[13, 5, 3, 2], &[13, 5, 3, 2]),
            (&[13, 5, 3, 2], &[13, 1, 3, 1]),
            (&[10, 5, 3, 1], &[1, 5, 1, 1]),
            (&[16, 4, 7, 1], &[1, 4, 7, 1]),
            (&[12, 4, 3, 1], &[4, 1, 3, 1]),
            (&[7, 6, 1, 1], &[1, 1, 1, 1]),
        ];
        for (ci, &(ane, bne)) in cases.iter().enumerate() {
            for (opi, name) in ["div", "mul", "add"].into_iter().enumerate() {
                for view in [false, true] {
                    let mut rng = Rng::new(3300 + 10 * ci as u64 + opi as u64);
                    let mut g = Graph::new();
                    let (an, bn) = (full(ane), full(bne));
                    // Views: `a` is the second half of rows twice as long (as build_moe_ffn's
                    // `up` view of a fused gate_up product), `b` a permuted copy.
                    let (a, a_id, a_vals) = if view {
                        let x = rand_leaf(
                            &mut g,
                            &mut rng,
                            DType::F32,
                            &[2 * an[0], an[1], an[2], an[3]],
                        );
                        let nb1 = 2 * an[0] * 4;
                        let (nb2, nb3) = (nb1 * an[1], nb1 * an[1] * an[2]);
                        let v = g.view_4d(x.id, an, nb1, nb2, nb3, an[0] * 4).unwrap();
                        let vals = logical(&g, v, &x.vals);
                        (x, v, vals)
                    } else {
                        let x = rand_leaf(&mut g, &mut rng, DType::F32, ane);
                        let (id, vals) = (x.id, x.vals.clone());
                        (x, id, vals)
                    };
                    let (b, b_id, b_vals) = if view {
                        let x =
                            rand_leaf(&mut g, &mut rng, DType::F32, &[bn[1], bn[0], bn[2], bn[3]]);
                        let p = g.permute(x.id, [1, 0, 2, 3]).unwrap();
                        let vals = logical(&g, p, &x.vals);
                        (x, p, vals)
                    } else {
                        let mut x = rand_leaf(&mut g, &mut rng, DType::F32, bne);
                        if opi == 0 {
                            // keep divisors away from 0
                            x.vals
                                .iter_mut()
                                .for_each(|v| *v = v.signum() * (v.abs() + 0.5));
                            let v32: Vec<f32> = x.vals.iter().map(|&v| v as f32).collect();
                            x.bytes = common::bytes_f32(&v32);
                        }
                        let (id, vals) = (x.id, x.vals.clone());
                        (x, id, vals)
                    };
                    let out = match opi {
                        0 => g.div(a_id, b_id),
                        1 => g.mul(a_id, b_id),
                        _ => g.add(a_id, b_id),
                    }
                    .unwrap();
                    let got = run(dev, g, &[&a, &b], out);
                    let mut reference = vec![0f64; an.iter().product()];
                    for_each_index(an, |i| {
                        let bi = [i[0] % bn[0], i[1] % bn[1], i[2] % bn[2], i[3] % bn[3]];
                        let (x, y) = (a_vals[idx4(an, i)], b_vals[idx4(bn, bi)]);
                        reference[idx4(an, i)] = match opi {
                            0 => x / y,
                            1 => x * y,
                            _ => x + y,
                        };
                    });
                    // Division by a value near 0 (views) can be large; relative error stays
                    // at f32 rounding.
                    check(
                        &format!("{name} {ane:?} {bne:?} view={view}"),
                        dev,
                        &got,
                        &reference,
                        EXACT,
                    );
                }
            }
        }
    });
}

#[test]
fn sum_rows_repeat_fill() {
    for_devices(|dev| {
        for (si, ne) in [[13usize, 7, 2, 1], [1, 4, 1, 1], [100, 3, 2, 2]]
            .into_iter()
            .enumerate()
        {
            let mut rng = Rng::new(3400 + si as u64);
            // sum_rows of a transposed view
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, DType::F32, &[ne[1], ne[0], ne[2], ne[3]]);
            let t = g.transpose(a.id).unwrap();
            let vals = logical(&g, t, &a.vals);
            let out = g.sum_rows(t).unwrap();
            assert_eq!(g.layout(out).ne, [1, ne[1], ne[2], ne[3]]);
            let got = run(dev, g, &[&a], out);
            let reference: Vec<f64> = vals.chunks(ne[0]).map(|r| r.iter().sum()).collect();
            check(&format!("sum_rows {ne:?}"), dev, &got, &reference, EXACT);
            // fill
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, DType::F32, &ne);
            let out = g.fill(a.id, -3.5).unwrap();
            let got = run(dev, g, &[&a], out);
            assert!(got.iter().all(|&v| v == -3.5), "fill on {}", dev.name());
        }
        // repeat / repeat_4d, f32 and i32, from a view
        for (src, to) in [
            ([7usize, 1, 4, 1], [14usize, 3, 4, 1]),
            ([1, 5, 1, 1], [3, 5, 2, 2]),
            ([4, 3, 2, 1], [4, 3, 2, 1]),
        ] {
            for dtype in [DType::F32, DType::I32] {
                let mut rng = Rng::new(3450);
                let mut g = Graph::new();
                let n: usize = src.iter().product();
                let v: Vec<f32> = rng.vec(n, 100.0).iter().map(|x| x.round()).collect();
                let a = leaf(&mut g, dtype, &[src[1], src[0], src[2], src[3]], &v);
                let t = g.transpose(a.id).unwrap();
                let vals = logical(&g, t, &a.vals);
                let target = g.new_tensor(DType::F32, &to).unwrap();
                let out = if to == src {
                    g.repeat(t, target).unwrap()
                } else {
                    g.repeat_4d(t, to).unwrap()
                };
                let got = run(dev, g, &[&a], out);
                let mut reference = vec![0f64; to.iter().product()];
                for_each_index(to, |i| {
                    let j = [i[0] % src[0], i[1] % src[1], i[2] % src[2], i[3] % src[3]];
                    reference[idx4(to, i)] = vals[idx4(src, j)];
                });
                assert_eq!(got, reference, "repeat {src:?} -> {to:?} {dtype}");
            }
        }
    });
}

/// ids as build_moe_ffn makes them: a strided view of an argsort.
fn topk_ids(
    g: &mut Graph,
    rng: &mut Rng,
    n_expert: usize,
    n_used: usize,
    n_tok: usize,
) -> (HostTensor, TensorId) {
    let logits = rand_leaf(g, rng, DType::F32, &[n_expert, n_tok]);
    let ids = g.argsort_top_k(logits.id, n_used).unwrap();
    (logits, ids)
}

/// The ids `argsort_top_k` gives (descending, ties broken by the lower index first is not
/// guaranteed, but the random logits here have no ties).
fn topk_ref(logits: &[f64], n_expert: usize, n_used: usize) -> Vec<Vec<usize>> {
    logits
        .chunks(n_expert)
        .map(|r| {
            let mut idx: Vec<usize> = (0..n_expert).collect();
            idx.sort_by(|&a, &b| r[b].total_cmp(&r[a]));
            idx.truncate(n_used);
            idx
        })
        .collect()
}

#[test]
fn add_id_with_argsort_ids() {
    for_devices(|dev| {
        for (n_embd, n_expert, n_used, n_tok) in [(16, 8, 2, 5), (7, 5, 4, 3), (33, 60, 4, 1)] {
            let mut rng = Rng::new(3500 + n_embd as u64);
            let mut g = Graph::new();
            let (logits, ids) = topk_ids(&mut g, &mut rng, n_expert, n_used, n_tok);
            // `a` is the `up` half of a fused gate_up output (a strided view).
            let x = rand_leaf(&mut g, &mut rng, DType::F32, &[2 * n_embd, n_used, n_tok]);
            let nb1 = 2 * n_embd * 4;
            let a = g
                .view_3d(x.id, n_embd, n_used, n_tok, nb1, nb1 * n_used, n_embd * 4)
                .unwrap();
            let a_vals = logical(&g, a, &x.vals);
            let b = rand_leaf(&mut g, &mut rng, DType::F32, &[n_embd, n_expert]);
            let out = g.add_id(a, b.id, ids).unwrap();
            let got = run(dev, g, &[&logits, &x, &b], out);
            let sel = topk_ref(&logits.vals, n_expert, n_used);
            let mut reference = Vec::new();
            for t in 0..n_tok {
                for u in 0..n_used {
                    let e = sel[t][u];
                    for i in 0..n_embd {
                        reference
                            .push(a_vals[i + n_embd * (u + n_used * t)] + b.vals[i + n_embd * e]);
                    }
                }
            }
            check(
                &format!("add_id {n_embd}x{n_used}x{n_tok} of {n_expert}"),
                dev,
                &got,
                &reference,
                EXACT,
            );
        }
    });
}

/// A bias row outside `b` is a compute error.
#[test]
fn add_id_bad_rows_are_errors() {
    for_devices(|dev| {
        for bad in [4i32, -1, i32::MIN] {
            let mut g = Graph::new();
            let a = g.new_input(DType::F32, &[8, 2, 2]).unwrap();
            let bias = g.new_input(DType::F32, &[8, 4]).unwrap();
            let ids = g.new_input(DType::I32, &[2, 2]).unwrap();
            let out = g.add_id(a, bias, ids).unwrap();
            g.set_output(out).unwrap();
            let inputs = vec![
                (a, common::bytes_f32(&[0.5; 32])),
                (bias, common::bytes_f32(&[1.0; 32])),
                (ids, i32_bytes(&[0, 1, bad, 3])),
            ];
            let e = compute_error(dev, g, inputs).expect("a bad row must be an error");
            assert!(e.contains("ADD_ID"), "row {bad}: unexpected error {e}");
        }
    });
}

#[test]
fn argsort_orders_and_top_k() {
    for_devices(|dev| {
        for (ne0, ne1, levels) in [
            (5usize, 3usize, 0u32),
            (16, 4, 3),
            (33, 2, 0),
            (257, 2, 7),
            (1, 2, 0),
        ] {
            for k in [1, ne0.div_ceil(2), ne0] {
                let mut rng = Rng::new(3600 + ne0 as u64);
                let mut g = Graph::new();
                let mut v = rng.vec(ne0 * ne1, 1.0);
                if levels > 0 {
                    v.iter_mut()
                        .for_each(|x| *x = ((*x + 1.0) * levels as f32 / 2.0).floor());
                }
                // Rows of a transposed view.
                let a = leaf(&mut g, DType::F32, &[ne1, ne0], &v);
                let t = g.transpose(a.id).unwrap();
                let vals = logical(&g, t, &a.vals);
                let asc = g.argsort(t, SortOrder::Asc).unwrap();
                let desc = g.argsort(t, SortOrder::Desc).unwrap();
                let tk = g.top_k(t, k).unwrap();
                let atk = g.argsort_top_k(t, k).unwrap();
                assert_eq!(g.layout(atk).ne, [k, ne1, 1, 1]);
                let atk_c = g.cont(atk).unwrap();
                let run_one = |out: TensorId| {
                    let mut g2 = g.clone();
                    g2.set_output(out).unwrap();
                    run(dev, g2, &[&a], out)
                };
                let (asc_v, desc_v, tk_v, atk_v) =
                    (run_one(asc), run_one(desc), run_one(tk), run_one(atk_c));
                for r in 0..ne1 {
                    let row = &vals[r * ne0..(r + 1) * ne0];
                    let mut sorted = row.to_vec();
                    sorted.sort_by(f64::total_cmp);
                    let pick = |idx: &[f64]| -> Vec<f64> {
                        idx.iter().map(|&i| row[i as usize]).collect()
                    };
                    let perm = |idx: &[f64]| {
                        let mut s: Vec<usize> = idx.iter().map(|&i| i as usize).collect();
                        s.sort();
                        s.dedup();
                        s.len() == idx.len() && s.iter().all(|&i| i < ne0)
                    };
                    let a_row = &asc_v[r * ne0..(r + 1) * ne0];
                    let d_row = &desc_v[r * ne0..(r + 1) * ne0];
                    assert!(perm(a_row) && perm(d_row), "argsort permutation");
                    assert_eq!(pick(a_row), sorted, "argsort asc {ne0} on {}", dev.name());
                    let rev: Vec<f64> = sorted.iter().rev().copied().collect();
                    assert_eq!(pick(d_row), rev, "argsort desc {ne0}");
                    let t_row = &tk_v[r * k..(r + 1) * k];
                    assert!(perm(t_row), "top_k indices distinct");
                    let mut top = pick(t_row);
                    top.sort_by(|a, b| b.total_cmp(a));
                    assert_eq!(top, rev[..k], "top_k {k} of {ne0}");
                    // argsort_top_k is the first k of the descending argsort.
                    assert_eq!(&atk_v[r * k..(r + 1) * k], &d_row[..k], "argsort_top_k");
                }
            }
        }
    });
}

/// build_moe_ffn's `get_rows(reshape_3d(probs, 1, n_expert, n_tokens), selected_experts)`
/// with `selected_experts` a strided view of an argsort, and get_rows of i32 data.
#[test]
fn get_rows_3d_moe_weights() {
    for_devices(|dev| {
        for (n_expert, n_used, n_tok) in [(8usize, 2usize, 5usize), (60, 4, 3), (4, 4, 1)] {
            let mut rng = Rng::new(3700 + n_expert as u64);
            let mut g = Graph::new();
            let (logits, ids) = topk_ids(&mut g, &mut rng, n_expert, n_used, n_tok);
            let probs = g.soft_max(logits.id).unwrap();
            let p3 = g.reshape(probs, &[1, n_expert, n_tok]).unwrap();
            let w = g.get_rows(p3, ids).unwrap();
            assert_eq!(g.layout(w).ne, [1, n_used, n_tok, 1]);
            let got = run(dev, g, &[&logits], w);
            let sel = topk_ref(&logits.vals, n_expert, n_used);
            let mut reference = Vec::new();
            for t in 0..n_tok {
                let row = &logits.vals[t * n_expert..(t + 1) * n_expert];
                let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
                for u in 0..n_used {
                    reference.push((row[sel[t][u]] - m).exp() / s);
                }
            }
            check(
                &format!("moe weights {n_expert}/{n_used}"),
                dev,
                &got,
                &reference,
                EXACT,
            );
        }
        // i32 rows (e.g. selected experts gathered by token) stay i32 and exact.
        let mut g = Graph::new();
        let vals: Vec<f32> = (0..24)
            .map(|i| (i * 1_000_003 % 97) as f32 - 40.0)
            .collect();
        let a = leaf(&mut g, DType::I32, &[4, 3, 2], &vals);
        let b = leaf(&mut g, DType::I32, &[2, 2], &[2.0, 0.0, 1.0, 1.0]);
        let out = g.get_rows(a.id, b.id).unwrap();
        assert_eq!(g.layout(out).dtype, DType::I32);
        let got = run(dev, g, &[&a, &b], out);
        let mut reference = Vec::new();
        for (i, &r) in [2usize, 0, 1, 1].iter().enumerate() {
            let plane = i / 2;
            reference.extend_from_slice(&a.vals[4 * (r + 3 * plane)..4 * (r + 3 * plane + 1)]);
        }
        assert_eq!(got, reference, "get_rows i32 on {}", dev.name());
    });
}

#[test]
fn soft_max_with_sinks() {
    for_devices(|dev| {
        for (n_kv, n_q, n_head, masked, max_bias, sink_scale) in [
            (9usize, 4usize, 3usize, true, 0.0f32, 2.0f32),
            (32, 3, 2, false, 0.0, 2.0),
            (16, 2, 4, true, 8.0, 1.0),
            (7, 1, 2, true, 0.0, 400.0),
        ] {
            let mut rng = Rng::new(3800 + n_kv as u64);
            let mut g = Graph::new();
            let a = rand_leaf(&mut g, &mut rng, DType::F32, &[n_kv, n_q, n_head]);
            let kv_pos: Vec<i32> = (0..n_kv as i32).collect();
            let q_pos: Vec<i32> = (n_kv as i32 - n_q as i32..n_kv as i32).collect();
            let mask_vals = lamina_core::graph::build_kq_mask(&kv_pos, &q_pos, Some(5));
            let m = leaf(&mut g, DType::F32, &[n_kv, n_q], &mask_vals);
            let sinks = leaf(&mut g, DType::F32, &[n_head], &rng.vec(n_head, sink_scale));
            let scale = 0.3;
            let out = g
                .soft_max_ext(a.id, masked.then_some(m.id), scale, max_bias)
                .unwrap();
            g.soft_max_add_sinks(out, sinks.id).unwrap();
            let got = run(dev, g, &[&a, &m, &sinks], out);
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
                            let mv = if masked {
                                f64::from(mask_vals[j + n_kv * q])
                            } else {
                                0.0
                            };
                            a.vals[j + n_kv * (q + n_q * h)] * scale as f64 + slope * mv
                        })
                        .collect();
                    let sink = sinks.vals[h];
                    let mx = row.iter().cloned().fold(sink, f64::max);
                    let s: f64 =
                        row.iter().map(|v| (v - mx).exp()).sum::<f64>() + (sink - mx).exp();
                    reference.extend(row.iter().map(|v| (v - mx).exp() / s));
                }
            }
            check(
                &format!("soft_max sinks n_kv={n_kv} masked={masked} bias={max_bias}"),
                dev,
                &got,
                &reference,
                EXACT,
            );
        }
    });
}

/// One mul_mat_id configuration: weights `[k, m, n_expert]`, `ids[t][u]`, `n_b1` rows of
/// activations per token.
struct MmidCase {
    k: usize,
    m: usize,
    n_expert: usize,
    n_b1: usize,
    ids: Vec<Vec<i32>>,
}

fn mmid_cases(blck: usize) -> Vec<MmidCase> {
    let k = if blck == 1 { 33 } else { blck };
    vec![
        // decode: one token, broadcast activations
        MmidCase {
            k,
            m: 7,
            n_expert: 4,
            n_b1: 1,
            ids: vec![vec![2, 0]],
        },
        // activations per used expert, an unused expert (3), a repeated one within a token
        MmidCase {
            k: 2 * k,
            m: 16,
            n_expert: 4,
            n_b1: 3,
            ids: vec![
                vec![0, 2, 1],
                vec![2, 2, 0],
                vec![1, 0, 2],
                vec![0, 1, 2],
                vec![2, 1, 0],
            ],
        },
        // expert 1 gets 10 rows (tiled K-quant kernels, Q4_K included: m % 8 != 0)
        MmidCase {
            k,
            m: 12,
            n_expert: 3,
            n_b1: 1,
            ids: (0..10).map(|t| vec![1, (t % 2) * 2]).collect(),
        },
    ]
}

/// mul_mat_id for every weight type mul_mat takes, against an f64 reference.
#[test]
fn mul_mat_id_all_types() {
    let mut seed = 4000;
    for_devices(|dev| {
        let types: &[DType] = if cfg!(miri) {
            &[DType::F16, DType::Q4_0, DType::Q4_K]
        } else {
            &lamina_cpu::MATMUL_WEIGHT_TYPES
        };
        for &dtype in types {
            for (ci, c) in mmid_cases(dtype.block_size() as usize).iter().enumerate() {
                for strided_b in [false, true] {
                    seed += 1;
                    let mut rng = Rng::new(seed);
                    let mut g = Graph::new();
                    let (n_used, n_tok) = (c.ids[0].len(), c.ids.len());
                    let w = rand_leaf(&mut g, &mut rng, dtype, &[c.k, c.m, c.n_expert]);
                    // Activations, optionally a permuted view (strided rows).
                    let (b, b_id, b_vals) = if strided_b {
                        let x = rand_leaf(&mut g, &mut rng, DType::F32, &[c.n_b1, c.k, n_tok]);
                        let p = g.permute(x.id, [1, 0, 2, 3]).unwrap();
                        let vals = logical(&g, p, &x.vals);
                        (x, p, vals)
                    } else {
                        let x = rand_leaf(&mut g, &mut rng, DType::F32, &[c.k, c.n_b1, n_tok]);
                        let (id, vals) = (x.id, x.vals.clone());
                        (x, id, vals)
                    };
                    let flat: Vec<f32> = c.ids.iter().flatten().map(|&i| i as f32).collect();
                    let ids = leaf(&mut g, DType::I32, &[n_used, n_tok], &flat);
                    let out = g.mul_mat_id(w.id, b_id, ids.id).unwrap();
                    assert_eq!(g.layout(out).ne, [c.m, n_used, n_tok, 1]);
                    let got = run(dev, g, &[&w, &b, &ids], out);
                    let mut reference = Vec::new();
                    for t in 0..n_tok {
                        for u in 0..n_used {
                            let e = c.ids[t][u] as usize;
                            let brow = &b_vals[c.k * (u % c.n_b1 + c.n_b1 * t)..][..c.k];
                            for i in 0..c.m {
                                let wrow = &w.vals[c.k * (i + c.m * e)..][..c.k];
                                reference.push(wrow.iter().zip(brow).map(|(a, b)| a * b).sum());
                            }
                        }
                    }
                    let limit = if dtype == DType::F32 { EXACT } else { MUL_MAT };
                    check(
                        &format!("mul_mat_id {dtype} case {ci} strided={strided_b}"),
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

/// Whether ggml-cpu's `mul_mat` of `n` activation rows uses the same per-output arithmetic as
/// `mul_mat_id` of the same rows (else `mul_mat` of one row at a time does): tinyBLAS (f32,
/// f16, bf16, IQ4_NL) and the repacked Q4_K gemm are `mul_mat`-only.
fn mul_mat_batch_matches_id(dtype: DType, m: usize) -> bool {
    let repacked = m.is_multiple_of(8);
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 => false,
        // not repacked: tinyBLAS in mul_mat, vec_dot in mul_mat_id
        DType::IQ4_NL => repacked,
        // repacked: gemm for groups of 4 rows in mul_mat, gemv only in mul_mat_id
        DType::Q4_K => !repacked,
        _ => true,
    }
}

/// mul_mat_id's output rows are, bit for bit, those of plain mul_mat of the same expert's
/// weight matrix with the same activation rows.
#[test]
fn mul_mat_id_rows_equal_mul_mat() {
    for_devices(|dev| {
        for &dtype in &lamina_cpu::MATMUL_WEIGHT_TYPES {
            for c in mmid_cases(dtype.block_size() as usize) {
                let mut rng = Rng::new(4500);
                let (n_used, n_tok) = (c.ids[0].len(), c.ids.len());
                let wn = c.k * c.m * c.n_expert;
                let w_f = rng.vec(wn, 1.0);
                let x_f = rng.vec(c.k * c.n_b1 * n_tok, 1.0);
                let flat: Vec<f32> = c.ids.iter().flatten().map(|&i| i as f32).collect();
                let mut g = Graph::new();
                let w = leaf(&mut g, dtype, &[c.k, c.m, c.n_expert], &w_f);
                let x = leaf(&mut g, DType::F32, &[c.k, c.n_b1, n_tok], &x_f);
                let ids = leaf(&mut g, DType::I32, &[n_used, n_tok], &flat);
                let out = g.mul_mat_id(w.id, x.id, ids.id).unwrap();
                let got = run(dev, g, &[&w, &x, &ids], out);
                let wrow = w.bytes.len() / (c.m * c.n_expert);
                for e in 0..c.n_expert {
                    let rows: Vec<(usize, usize)> = (0..n_tok)
                        .flat_map(|t| (0..n_used).map(move |u| (u, t)))
                        .filter(|&(u, t)| c.ids[t][u] as usize == e)
                        .collect();
                    if rows.is_empty() {
                        continue;
                    }
                    let x_rows: Vec<f32> = rows
                        .iter()
                        .flat_map(|&(u, t)| x_f[c.k * (u % c.n_b1 + c.n_b1 * t)..][..c.k].to_vec())
                        .collect();
                    let batches: Vec<Vec<usize>> = if mul_mat_batch_matches_id(dtype, c.m) {
                        vec![(0..rows.len()).collect()]
                    } else {
                        (0..rows.len()).map(|j| vec![j]).collect()
                    };
                    for batch in batches {
                        let mut g = Graph::new();
                        let we = g.new_input(dtype, &[c.k, c.m]).unwrap();
                        let we_t = HostTensor {
                            id: we,
                            bytes: w.bytes[e * c.m * wrow..(e + 1) * c.m * wrow].to_vec(),
                            vals: Vec::new(),
                        };
                        let xs: Vec<f32> = batch
                            .iter()
                            .flat_map(|&j| x_rows[j * c.k..(j + 1) * c.k].to_vec())
                            .collect();
                        let xe = leaf(&mut g, DType::F32, &[c.k, batch.len()], &xs);
                        let o = g.mul_mat(we, xe.id).unwrap();
                        let plain = run(dev, g, &[&we_t, &xe], o);
                        for (bj, &j) in batch.iter().enumerate() {
                            let (u, t) = rows[j];
                            let col = &got[c.m * (u + n_used * t)..][..c.m];
                            let want = &plain[c.m * bj..][..c.m];
                            assert!(
                                col.iter()
                                    .zip(want)
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "{dtype} expert {e} row ({u}, {t}) of {} (k {}, m {}) on {}: \
                                 {col:?} vs mul_mat {want:?}",
                                rows.len(),
                                c.k,
                                c.m,
                                dev.name()
                            );
                        }
                    }
                }
            }
        }
    });
}

/// An expert id outside the weights is a compute error.
#[test]
fn bad_expert_ids_are_errors() {
    for_devices(|dev| {
        for bad in [4i32, -1, i32::MAX, i32::MIN] {
            let mut g = Graph::new();
            let w = g.new_input(DType::Q8_0, &[32, 8, 4]).unwrap();
            let x = g.new_input(DType::F32, &[32, 1, 2]).unwrap();
            let ids = g.new_input(DType::I32, &[2, 2]).unwrap();
            let out = g.mul_mat_id(w, x, ids).unwrap();
            g.set_output(out).unwrap();
            let inputs = vec![
                (w, vec![0u8; 34 * 8 * 4]),
                (x, common::bytes_f32(&[0.5; 64])),
                (ids, i32_bytes(&[0, 1, bad, 3])),
            ];
            let e = compute_error(dev, g, inputs).expect("a bad id must be an error");
            assert!(e.contains("MUL_MAT_ID"), "id {bad}: unexpected error {e}");
        }
    });
}
