//! `Graph::attention` (fused: no score tensor) gives exactly the bits of the unfused graph
//! `cont(permute(mul_mat(v, soft_max_ext(mul_mat_masked(k, q, mask), mask, scale)), [0, 2, 1, 3]))`
//! that it replaces, at batch sizes 1, 4, 8, 23 and 512, for a causal mask over two sequences and
//! for a mask with holes (whole rows included), with and without attention sinks
//! (`attention_add_sinks` / `soft_max_add_sinks`), with f16 and f32 caches, query heads sharing
//! KV heads, head sizes 64 and 256, on devices with 1, 2 and 3 threads.

mod common;

use std::sync::Arc;

use common::{Rng, bytes_f32, run_graph};
use lamina_backend::Device;
use lamina_core::DType;
use lamina_core::graph::Graph;
use lamina_cpu::{CpuBackendReg, CpuConfig, quant};

struct Case {
    head: usize,
    n_kv: usize,
    n_tok: usize,
    kv_heads: usize,
    heads: usize,
    dtype: DType,
}

/// The attention output `[head, heads, n_tok]`, fused or not.
#[allow(clippy::too_many_arguments)]
fn run(
    dev: &dyn Device,
    fused: bool,
    c: &Case,
    k: &[u8],
    v: &[u8],
    q: &[f32],
    mask: &[f32],
    sinks: Option<&[f32]>,
) -> Vec<f32> {
    let mut g = Graph::new();
    let kt = g.new_input(c.dtype, &[c.head, c.n_kv, c.kv_heads]).unwrap();
    let vt = g.new_input(c.dtype, &[c.n_kv, c.head, c.kv_heads]).unwrap();
    let qt = g
        .new_input(DType::F32, &[c.head, c.heads, c.n_tok])
        .unwrap();
    let mt = g.new_input(DType::F32, &[c.n_kv, c.n_tok]).unwrap();
    let st = g.new_input(DType::F32, &[c.heads]).unwrap();
    let qp = g.permute(qt, [0, 2, 1, 3]).unwrap();
    let out = if fused {
        let out = g.attention(qp, kt, vt, mt, 0.125).unwrap();
        if sinks.is_some() {
            g.attention_add_sinks(out, st).unwrap();
        }
        out
    } else {
        let kq = g.mul_mat_masked(kt, qp, mt).unwrap();
        let kq = g.soft_max_ext(kq, Some(mt), 0.125, 0.0).unwrap();
        if sinks.is_some() {
            g.soft_max_add_sinks(kq, st).unwrap();
        }
        let kqv = g.mul_mat(vt, kq).unwrap();
        let merged = g.permute(kqv, [0, 2, 1, 3]).unwrap();
        g.cont(merged).unwrap()
    };
    g.set_output(out).unwrap();
    let inputs = vec![
        (kt, k.to_vec()),
        (vt, v.to_vec()),
        (qt, bytes_f32(q)),
        (mt, bytes_f32(mask)),
        (st, bytes_f32(sinks.unwrap_or(&vec![0.0; c.heads]))),
    ];
    run_graph(dev, g, inputs, &[out]).remove(0)
}

fn encode(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; x.len() * dtype.type_size() as usize];
    quant::quantize_row(dtype, x, &mut out).unwrap();
    out
}

/// Causal over two sequences: the first half of the batch is sequence A (whose earlier tokens
/// fill the first cells), the rest sequence B; cells past the batch's last are padding.
fn causal(n_kv: usize, n_tok: usize) -> Vec<f32> {
    let past = n_kv - n_tok - n_kv / 8;
    let half = n_tok / 2;
    (0..n_tok)
        .flat_map(|t| {
            (0..n_kv).map(move |c| {
                let visible = if t < half {
                    c <= past + t && (c < past || c < past + half)
                } else {
                    (past + half..=past + t).contains(&c)
                };
                if visible { 0.0 } else { f32::NEG_INFINITY }
            })
        })
        .collect()
}

/// Holes anywhere, including a whole row and the first cells.
fn holes(n_kv: usize, n_tok: usize) -> Vec<f32> {
    (0..n_tok * n_kv)
        .map(|i| {
            let (t, c) = (i / n_kv, i % n_kv);
            if t == 2 || c < 9 || (c * 7 + t * 3) % 5 == 0 {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect()
}

#[test]
fn fused_attention_matches_the_unfused_graph_bit_for_bit() {
    let mut cases = Vec::new();
    for n_tok in [1usize, 4, 8, 23, 512] {
        let n_kv = (n_tok + n_tok / 2 + 40).next_multiple_of(8);
        cases.push(Case {
            head: 64,
            n_kv,
            n_tok,
            kv_heads: 2,
            heads: 6,
            dtype: DType::F16,
        });
    }
    cases.push(Case {
        head: 256,
        n_kv: 96,
        n_tok: 23,
        kv_heads: 1,
        heads: 4,
        dtype: DType::F16,
    });
    cases.push(Case {
        head: 64,
        n_kv: 72,
        n_tok: 23,
        kv_heads: 3,
        heads: 3,
        dtype: DType::F32,
    });
    let mut rng = Rng::new(0x6174_746e);
    for threads in [1, 2, 3] {
        let reg =
            CpuBackendReg::new(CpuConfig::default().with_devices(1).with_threads(threads)).unwrap();
        let dev = reg.cpu_devices()[0].clone() as Arc<dyn Device>;
        for c in &cases {
            let k = encode(c.dtype, &rng.vec(c.head * c.n_kv * c.kv_heads, 1.0));
            let v = encode(c.dtype, &rng.vec(c.n_kv * c.head * c.kv_heads, 1.0));
            let q = rng.vec(c.head * c.heads * c.n_tok, 3.0);
            let sink_vals = rng.vec(c.heads, 4.0);
            for (name, mask, sinks) in [
                ("causal", causal(c.n_kv, c.n_tok), None),
                ("holes", holes(c.n_kv, c.n_tok), None),
                (
                    "causal+sinks",
                    causal(c.n_kv, c.n_tok),
                    Some(&sink_vals[..]),
                ),
                ("holes+sinks", holes(c.n_kv, c.n_tok), Some(&sink_vals[..])),
            ] {
                let want = run(&*dev, false, c, &k, &v, &q, &mask, sinks);
                let got = run(&*dev, true, c, &k, &v, &q, &mask, sinks);
                if name.starts_with("causal") {
                    assert!(
                        want.iter().all(|x| x.is_finite()) && want.iter().any(|&x| x != 0.0),
                        "every causal row attends to something"
                    );
                }
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{name}, {threads} threads, {} tokens, head {} {}",
                    c.n_tok,
                    c.head,
                    c.dtype
                );
            }
        }
    }
}
