//! `Graph::mul_mat_masked` (attention scores whose masked entries need not be computed)
//! followed by `soft_max_ext` gives exactly the bits of `mul_mat` + `soft_max_ext`, for a
//! causal mask over several sequences and for a mask with holes, with f16 keys broadcast over
//! query heads, on devices with 1, 2 and 3 threads. Unmasked scores are the same bits too.

mod common;

use std::sync::Arc;

use common::{Rng, bytes_f32, run_graph};
use lamina_backend::Device;
use lamina_core::DType;
use lamina_core::graph::Graph;
use lamina_cpu::{CpuBackendReg, CpuConfig, quant};

/// `(scores, softmax)` of keys `[k, n_kv, kv_heads]` (f16) and queries `[k, n_tok, heads]`.
#[allow(clippy::too_many_arguments)]
fn run(
    dev: &dyn Device,
    masked: bool,
    (k, n_kv, n_tok, kv_heads, heads): (usize, usize, usize, usize, usize),
    keys: &[u8],
    queries: &[f32],
    mask: &[f32],
) -> (Vec<f32>, Vec<f32>) {
    let mut g = Graph::new();
    let a = g.new_input(DType::F16, &[k, n_kv, kv_heads]).unwrap();
    let b = g.new_input(DType::F32, &[k, n_tok, heads]).unwrap();
    let m = g.new_input(DType::F32, &[n_kv, n_tok]).unwrap();
    let kq = if masked {
        g.mul_mat_masked(a, b, m).unwrap()
    } else {
        g.mul_mat(a, b).unwrap()
    };
    let sm = g.soft_max_ext(kq, Some(m), 0.125, 0.0).unwrap();
    g.set_output(kq).unwrap();
    g.set_output(sm).unwrap();
    let inputs = vec![
        (a, keys.to_vec()),
        (b, bytes_f32(queries)),
        (m, bytes_f32(mask)),
    ];
    let mut out = run_graph(dev, g, inputs, &[kq, sm]);
    let sm = out.pop().unwrap();
    (out.pop().unwrap(), sm)
}

#[test]
fn masked_scores_give_the_same_softmax() {
    let (k, n_kv, n_tok, kv_heads, heads) = (64, 72, 37, 2, 6);
    let mut rng = Rng(0x6d61_736b_6564);
    let kv: Vec<f32> = (0..k * n_kv * kv_heads).map(|_| rng.next()).collect();
    let mut keys = vec![0u8; kv.len() * 2];
    quant::quantize_row(DType::F16, &kv, &mut keys).unwrap();
    let queries: Vec<f32> = (0..k * n_tok * heads).map(|_| rng.next() * 3.0).collect();
    // Causal over two sequences: tokens 0..20 are sequence A at cache cells 30..50, tokens
    // 20..37 sequence B at cells 50..67 (cells 0..30 hold A's earlier tokens).
    let causal: Vec<f32> = (0..n_tok)
        .flat_map(|t| {
            (0..n_kv).map(move |c| {
                let visible = if t < 20 {
                    c <= 30 + t
                } else {
                    (50..=50 + (t - 20)).contains(&c)
                };
                if visible { 0.0 } else { f32::NEG_INFINITY }
            })
        })
        .collect();
    // Holes anywhere, including whole rows and the first cells.
    let holes: Vec<f32> = (0..n_tok * n_kv)
        .map(|i| {
            let (t, c) = (i / n_kv, i % n_kv);
            if t == 5 || c < 9 || (c * 7 + t * 3) % 5 == 0 {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    for threads in [1, 2, 3] {
        let reg =
            CpuBackendReg::new(CpuConfig::default().with_devices(1).with_threads(threads)).unwrap();
        let dev = reg.cpu_devices()[0].clone() as Arc<dyn Device>;
        for (name, mask) in [("causal", &causal), ("holes", &holes)] {
            let shape = (k, n_kv, n_tok, kv_heads, heads);
            let (kq, sm) = run(&*dev, false, shape, &keys, &queries, mask);
            let (kqm, smm) = run(&*dev, true, shape, &keys, &queries, mask);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&sm), bits(&smm), "{name}, {threads} threads: softmax");
            let mut skipped = 0;
            for (i, (&full, &part)) in kq.iter().zip(&kqm).enumerate() {
                let (c, t) = (i % n_kv, (i / n_kv) % n_tok);
                if mask[t * n_kv + c] == 0.0 {
                    assert_eq!(full.to_bits(), part.to_bits(), "{name}: score {i}");
                } else if part != full {
                    assert_eq!(part, 0.0, "{name}: masked score {i}");
                    skipped += 1;
                }
            }
            if name == "causal" {
                assert!(skipped > 0, "the causal mask spared no products");
            }
        }
    }
}
