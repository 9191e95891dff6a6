//! One matrix-product call per kernel and tier: `MatMul::dot_tile` over 64 weight rows × 128
//! activation rows (the wide calls of a prompt), × 16, × 4 (a 4-slot decode step) and × 1 row
//! (token generation), for the weight types of the test models and the tinyBLAS float tiles,
//! at every kernel tier this CPU has. And the `stream` group: a decode step's products over
//! 96 MiB of weights (more than any cache here), 64 rows per call as `mul_mat` hands them
//! out, where the weights come from memory and a kernel's access pattern shows.
//!
//! Each sample reports the *fastest* call of its batch (`iter_custom` returns `min · iters`):
//! on a shared VM a whole run's mean moves by ±20 % with the other guests, while the fastest
//! of many short calls is what the kernel does when it has the core; that is how the kernels'
//! GMAC/s in the issue notes were read. Run with `cargo bench -p lamina-cpu --bench tiles`
//! (pin it: `taskset -c 0 cargo bench …`), or a subset: `… --bench tiles -- q5_0`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use lamina_core::DType;
use lamina_cpu::kernels::{available_isas, matmul::MatMul, pack16::Packed16, table::table};

// The integration tests' deterministic generator (xorshift).
#[path = "../tests/common/mod.rs"]
mod common;
use common::Rng;

/// `m` weight rows of `dtype` with `k` values each: random bytes with every block's leading
/// f16 scale(s) set to a small normal value (random scales would give infinities and NaNs).
fn weights(rng: &mut Rng, dtype: DType, m: usize, k: usize) -> Vec<u8> {
    let row = dtype.row_size(k as u64).expect("whole blocks") as usize;
    let mut w: Vec<u8> = (0..row * m).map(|_| rng.next_u64() as u8).collect();
    match dtype {
        DType::F16 => {
            for v in w.chunks_exact_mut(2) {
                v.copy_from_slice(&lamina_cpu::kernels::fp32_to_fp16(0.01).to_le_bytes());
            }
        }
        DType::F32 => {
            for v in w.chunks_exact_mut(4) {
                v.copy_from_slice(&0.01f32.to_le_bytes());
            }
        }
        _ => {
            let qk = dtype.block_size() as usize;
            let bytes = dtype.row_size(qk as u64).expect("one block") as usize;
            let scales = if matches!(dtype, DType::Q4_1 | DType::Q5_1 | DType::Q4_K) {
                2
            } else {
                1
            };
            for block in w.chunks_exact_mut(bytes) {
                // Q6_K keeps its scale last.
                let at = if dtype == DType::Q6_K { bytes - 2 } else { 0 };
                for s in 0..scales {
                    let o = at + 2 * s;
                    block[o..o + 2].copy_from_slice(&0x2000u16.to_le_bytes());
                }
            }
        }
    }
    w
}

fn bench_tiles(c: &mut Criterion) {
    let mut g = c.benchmark_group("tiles");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    let cases = [
        (DType::Q4_0, 1024),
        (DType::Q5_0, 1024),
        (DType::Q5_0, 640),
        (DType::Q8_0, 1024),
        (DType::Q4_1, 1024),
        (DType::Q4_1, 1536),
        (DType::Q4_K, 1024),
        (DType::Q6_K, 1024),
        (DType::F16, 256),
        (DType::F32, 256),
    ];
    let mut rng = Rng::new(0x7113_5eed_0bad_f00d);
    for (dtype, k) in cases {
        let m = 64;
        let w = weights(&mut rng, dtype, m, k);
        let wrows: Vec<&[u8]> = w.chunks_exact(w.len() / m).collect();
        for n in [128usize, 16, 4, 1] {
            let Some(plan) = MatMul::plan(table(), dtype, m, n, k, true, true) else {
                continue;
            };
            let (mut abuf, arow) = activations(&mut rng, &plan, n, k);
            let arows: Vec<&[u8]> = bytemuck_bytes(&mut abuf, arow * n)
                .chunks_exact(arow)
                .collect();
            let mut out = vec![0f32; m * n];
            g.throughput(Throughput::Elements((m * n * k) as u64));
            for isa in available_isas() {
                let id = BenchmarkId::new(format!("{dtype}_{m}x{n}x{k}"), isa.name());
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let mut best = Duration::MAX;
                        for _ in 0..iters {
                            let t = Instant::now();
                            plan.dot_tile_at(isa, k, &wrows, &arows, 0, &mut out);
                            best = best.min(t.elapsed());
                            black_box(&out);
                        }
                        best * u32::try_from(iters).unwrap_or(u32::MAX)
                    })
                });
            }
        }
    }
    g.finish();
}

/// `n` activation rows of `k` random values converted for `plan`, in 4-aligned storage (f32
/// activation rows are read as f32), and the bytes of one row.
fn activations(rng: &mut Rng, plan: &MatMul, n: usize, k: usize) -> (Vec<u32>, usize) {
    let arow = plan.act_row_bytes(k).expect("whole blocks");
    let mut abuf = vec![0u32; (arow * n).div_ceil(4)];
    let acts = bytemuck_bytes(&mut abuf, arow * n);
    for j in 0..n {
        let x: Vec<f32> = (0..k).map(|_| rng.next() * 1.6).collect();
        plan.convert_act(j, &x, &mut acts[j * arow..(j + 1) * arow]);
    }
    (abuf, arow)
}

/// The first `len` bytes of `buf`.
fn bytemuck_bytes(buf: &mut [u32], len: usize) -> &mut [u8] {
    assert!(len <= buf.len() * 4);
    // SAFETY: u32 storage viewed as bytes (no invalid bit patterns, alignment 4 ≥ 1), within
    // its length.
    unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr().cast::<u8>(), len) }
}

/// A decode step's products with weights from memory: 96 MiB of Q4_1, Q5_0 or Q8_0 rows
/// (SmolLM2's, Gemma 3's k; SmolLM2's Q8_0 output), 64 rows per `dot_tile` call, against 8, 4, 2
/// or 1 activation rows; the best pass of each batch, as weight bytes per second. Set
/// `STREAM_MIB` to another size (`STREAM_MIB=1`: weights in L2) to see the kernels' own pace.
fn bench_stream(c: &mut Criterion) {
    let mut g = c.benchmark_group("stream");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2));
    let mut rng = Rng::new(0x57e4_a11d_0bad_f00d);
    for (dtype, k) in [(DType::Q4_1, 576), (DType::Q5_0, 640), (DType::Q8_0, 576)] {
        let row = dtype.row_size(k as u64).expect("whole blocks") as usize;
        let mib: usize = std::env::var("STREAM_MIB")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(96);
        let m = (mib << 20) / row / 64 * 64;
        let w = weights(&mut rng, dtype, m, k);
        let wrows: Vec<&[u8]> = w.chunks_exact(row).collect();
        let packed = table()
            .packed16()
            .and_then(|_| Packed16::pack(dtype, m, k / 32, |i| wrows[i]));
        for n in [8usize, 4, 2, 1] {
            let plan = MatMul::plan(table(), dtype, 64, n, k, true, true).expect("a kernel");
            let (mut abuf, arow) = activations(&mut rng, &plan, n, k);
            let arows: Vec<&[u8]> = bytemuck_bytes(&mut abuf, arow * n)
                .chunks_exact(arow)
                .collect();
            let mut out = vec![0f32; 64 * n];
            g.throughput(Throughput::Bytes((row * m) as u64));
            // (The scalar tier needs seconds a pass: it would only measure itself.)
            for isa in available_isas()
                .into_iter()
                .filter(|&i| i != lamina_cpu::kernels::Isa::Scalar)
            {
                let id = BenchmarkId::new(format!("{dtype}_96MiBx{n}x{k}"), isa.name());
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let mut best = Duration::MAX;
                        for _ in 0..iters {
                            let t = Instant::now();
                            for chunk in wrows.chunks(64) {
                                plan.dot_tile_at(isa, k, chunk, &arows, 0, &mut out);
                                black_box(&out);
                            }
                            best = best.min(t.elapsed());
                        }
                        best * u32::try_from(iters).unwrap_or(u32::MAX)
                    })
                });
            }
            // The same products from the weights packed in groups of 16 rows.
            if let Some(p) = packed.as_ref().filter(|_| plan.takes_packed()) {
                let id = BenchmarkId::new(format!("{dtype}_96MiBx{n}x{k}"), "packed16");
                g.bench_function(id, |b| {
                    b.iter_custom(|iters| {
                        let mut best = Duration::MAX;
                        for _ in 0..iters {
                            let t = Instant::now();
                            for i0 in (0..m).step_by(64) {
                                plan.dot_packed(p, i0, 64, &arows, &mut out);
                                black_box(&out);
                            }
                            best = best.min(t.elapsed());
                        }
                        best * u32::try_from(iters).unwrap_or(u32::MAX)
                    })
                });
            }
        }
    }
    g.finish();
}

criterion_group!(benches, bench_tiles, bench_stream);
criterion_main!(benches);
