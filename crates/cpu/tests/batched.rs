//! `mul_mat` through the CPU backend's batched paths (register-blocked tiles, threads split over
//! weight rows or over activation rows) for every weight type at activation batch sizes 1, 4, 8,
//! 23 and 512, with weight row counts that are a multiple of 8 (so Q4_K, Q4_0 and IQ4_NL take
//! the repacked kernels) and that are not. Each output must be bit-identical to the scalar
//! emulation of the kernel llama.cpp would use (`MatMul::convert_act_scalar` +
//! `MatMul::dot_scalar`, which never take a SIMD path) and close to an f64 product of the
//! dequantized operands (normalized MSE, as in the conformance suite).

mod common;

use std::sync::Arc;

use common::{Rng, bytes_f32, run_graph};
use lamina_backend::Device;
use lamina_core::DType;
use lamina_core::graph::Graph;
use lamina_cpu::kernels::MatMul;
use lamina_cpu::{CpuBackendReg, CpuConfig, quant};

const WEIGHT_TYPES: [DType; lamina_cpu::MATMUL_WEIGHT_TYPES.len()] =
    lamina_cpu::MATMUL_WEIGHT_TYPES;

/// Normalized MSE limit for quantized products (ggml's test-backend-ops value).
const MUL_MAT_NMSE: f64 = 5e-4;

/// Devices with 2 and 3 worker threads (so both ways of splitting the work are exercised).
fn devices() -> Vec<(usize, Arc<dyn Device>)> {
    [2, 3]
        .into_iter()
        .map(|t| {
            let reg =
                CpuBackendReg::new(CpuConfig::default().with_devices(1).with_threads(t)).unwrap();
            (t, reg.cpu_devices()[0].clone() as Arc<dyn Device>)
        })
        .collect()
}

/// `dtype` rows of `k` values: bytes and dequantized values.
fn encode(dtype: DType, k: usize, vals: &[f32]) -> (Vec<u8>, Vec<f32>) {
    let row = dtype.row_size(k as u64).unwrap() as usize;
    let mut bytes = vec![0u8; vals.len() / k * row];
    let mut back = vec![0f32; vals.len()];
    for (r, chunk) in vals.chunks(k).enumerate() {
        let b = &mut bytes[r * row..(r + 1) * row];
        if lamina_core::quant::supports_quantize(dtype) {
            quant::quantize_row(dtype, chunk, b).unwrap();
        } else {
            lamina_core::quant::quantize_row_iq(dtype, chunk, b, None).unwrap();
        }
        quant::dequantize_row(dtype, b, &mut back[r * k..(r + 1) * k]).unwrap();
    }
    (bytes, back)
}

/// `weights [k, m, wb] × acts [k, n, ab]` on `dev`: the f32 output `[m, n, ab]`.
#[allow(clippy::too_many_arguments)]
fn run_mul_mat(
    dev: &dyn Device,
    dtype: DType,
    k: usize,
    m: usize,
    n: usize,
    wb: usize,
    ab: usize,
    w: &[u8],
    x: &[f32],
) -> Vec<f32> {
    let mut g = Graph::new();
    let a = g.new_input(dtype, &[k, m, wb]).unwrap();
    let b = g.new_input(DType::F32, &[k, n, ab]).unwrap();
    let out = g.mul_mat(a, b).unwrap();
    g.set_output(out).unwrap();
    let inputs = vec![(a, w.to_vec()), (b, bytes_f32(x))];
    run_graph(dev, g, inputs, &[out]).remove(0)
}

fn nmse(out: &[f32], reference: &[f64]) -> f64 {
    let (mut err, mut norm) = (0.0, 0.0);
    for (&a, &b) in out.iter().zip(reference) {
        assert!(a.is_finite(), "non-finite output");
        err += (f64::from(a) - b) * (f64::from(a) - b);
        norm += b * b;
    }
    if norm == 0.0 { err } else { err / norm }
}

/// One product on every device: bit-exact against the scalar emulation, NMSE against f64.
#[allow(clippy::too_many_arguments)]
fn check(dtype: DType, k: usize, m: usize, n: usize, wb: usize, ab: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let (w, wvals) = encode(dtype, k, &rng.vec(k * m * wb, 1.0));
    let x = rng.vec(k * n * ab, 2.0);
    let wrow = dtype.row_size(k as u64).unwrap() as usize;
    let what = format!("{dtype} k={k} m={m} n={n} planes={wb}x{ab}");

    // The f64 reference of the dequantized operands.
    let mut reference = vec![0f64; m * n * ab];
    for p in 0..ab {
        let wp = p / (ab / wb);
        for j in 0..n {
            for i in 0..m {
                let wr = &wvals[(wp * m + i) * k..(wp * m + i + 1) * k];
                let xr = &x[(p * n + j) * k..(p * n + j + 1) * k];
                reference[(p * n + j) * m + i] = wr
                    .iter()
                    .zip(xr)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
            }
        }
    }
    // The scalar emulation of the exact kernel, where there is one.
    let plan = MatMul::plan(lamina_cpu::kernels::table(), dtype, m, n, k, true, wb == 1);
    let scalar = plan.map(|plan| {
        let arow = plan.act_row_bytes(k).unwrap();
        // 4-aligned storage: f32 activation rows are read as f32.
        let mut abuf = vec![0u32; arow.div_ceil(4)];
        let mut want = vec![0f32; m * n * ab];
        for p in 0..ab {
            let wp = p / (ab / wb);
            for j in 0..n {
                // SAFETY: u32 storage viewed as `arow` bytes.
                let act =
                    unsafe { std::slice::from_raw_parts_mut(abuf.as_mut_ptr() as *mut u8, arow) };
                plan.convert_act_scalar(j, &x[(p * n + j) * k..(p * n + j + 1) * k], act);
                for i in 0..m {
                    let wr = &w[(wp * m + i) * wrow..(wp * m + i + 1) * wrow];
                    want[(p * n + j) * m + i] = plan.dot_scalar(k, wr, act, j);
                }
            }
        }
        want
    });
    for (threads, dev) in devices() {
        let got = run_mul_mat(&*dev, dtype, k, m, n, wb, ab, &w, &x);
        if let Some(want) = &scalar {
            for (idx, (g, s)) in got.iter().zip(want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    s.to_bits(),
                    "{what}, {threads} threads: output {idx} (activation row {}, weight row {}): {g:e} vs scalar {s:e}",
                    idx / m,
                    idx % m
                );
            }
        }
        let e = nmse(&got, &reference);
        let limit = if dtype == DType::F32 {
            1e-7
        } else {
            MUL_MAT_NMSE
        };
        assert!(e <= limit, "{what}: NMSE {e:e} > {limit:e}");
    }
}

fn k_for(dtype: DType) -> usize {
    // One superblock for the K types; several blocks otherwise (small: the 512-row cases).
    match dtype.block_size() {
        1 => 64,
        32 => 128,
        _ => 256,
    }
}

/// Every weight type, batch sizes 1, 4, 8, 23 and 512, 16 rows (repacked where llama.cpp
/// repacks) and 12 rows (not a multiple of 8), 2-D weights.
#[test]
fn batched_mul_mat_matches_scalar_kernels() {
    let mut seed = 1;
    for dtype in WEIGHT_TYPES {
        let k = k_for(dtype);
        for m in [16, 12] {
            for n in [1, 4, 8, 23, 512] {
                seed += 1;
                check(dtype, k, m, n, 1, 1, seed);
            }
        }
    }
}

/// Broadcast 3-D products (2 weight planes, 4 activation planes) and odd row counts.
#[test]
fn batched_mul_mat_planes_match_scalar_kernels() {
    let mut seed = 1000;
    for dtype in WEIGHT_TYPES {
        let k = k_for(dtype);
        for (m, n) in [(8, 9), (13, 23), (24, 3)] {
            seed += 1;
            check(dtype, k, m, n, 2, 4, seed);
        }
    }
}

/// A larger K so the tiles run many blocks per output (rows a multiple of 8 and not; 100
/// rows: calls of up to 64 weight rows, cut before the short last group, in a prompt-sized
/// product, a 3-row decode step and, with 3 threads, 20 rows split over the weight rows in
/// calls of 16 and 4 activation rows).
#[test]
fn batched_mul_mat_long_rows_match_scalar_kernels() {
    let mut seed = 2000;
    for dtype in WEIGHT_TYPES {
        let k = 8 * k_for(dtype);
        for (m, n) in [(40, 33), (36, 5), (8, 1), (100, 3), (100, 20), (100, 130)] {
            seed += 1;
            check(dtype, k, m, n, 1, 1, seed);
        }
    }
}
