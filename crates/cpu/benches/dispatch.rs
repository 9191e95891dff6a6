//! Per-op dispatch overhead of Lamina's persistent `WorkerPool` against rayon.
//!
//! A graph is a sequence of ops ("nodes"), each split across the threads and separated from the
//! next by a barrier, as `exec.rs` runs it: one `WorkerPool::run` for the whole graph and
//! `ctx.barrier.wait()` after each node. Every benchmark reports the time of ONE op (criterion's
//! `iter_custom` gets `iters` ops and returns their total time), so the numbers are directly
//! "ns per op":
//!
//! - `lamina_barrier`: one `run` of `iters` nodes (the executor's shape; the single `run` is
//!   amortised away);
//! - `lamina_run_per_op`: one `run` per node (dispatch through the pool's wake-up path);
//! - `rayon_broadcast`: one `ThreadPool::broadcast` per op from outside the pool;
//! - `rayon_par_iter`: the whole graph inside `ThreadPool::install`, one `par_iter().for_each`
//!   over the thread slices per op (how a rayon-based executor would be written).
//!
//! Each for 1 and 2 threads, with empty work and with a small fixed amount of work per op (an
//! f32 dot of `SMALL_WORK` elements split across the threads). Run with
//! `cargo bench -p lamina-cpu --bench dispatch`; on a shared 2-core machine the numbers are noisy.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use lamina_cpu::WorkerPool;
use rayon::prelude::*;

/// Elements of the small per-op work (a hidden-size-like row).
const SMALL_WORK: usize = 2048;

/// The work of thread `ith` of `nth` for one op: its slice of a dot product.
#[inline(never)]
fn op_work(data: &[f32], ith: usize, nth: usize) -> f32 {
    let per = data.len().div_ceil(nth);
    let lo = (ith * per).min(data.len());
    let hi = (lo + per).min(data.len());
    data[lo..hi].iter().map(|v| v * v).sum()
}

fn bench_dispatch(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispatch");
    g.warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(20);
    let small: Vec<f32> = (0..SMALL_WORK).map(|i| (i % 7) as f32 * 0.25).collect();
    let empty: Vec<f32> = Vec::new();
    for nth in [1usize, 2] {
        let mut pool = WorkerPool::new("bench", nth).expect("spawn pool");
        let rayon_pool = rayon::ThreadPoolBuilder::new()
            .num_threads(nth)
            .build()
            .expect("rayon pool");
        for (label, data) in [("empty", &empty), ("small", &small)] {
            let data = data.as_slice();
            let id = |name: &str| BenchmarkId::new(name, format!("{nth}t/{label}"));

            g.bench_function(id("lamina_barrier"), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    let ok = pool.run(&|ctx| {
                        for _ in 0..iters {
                            black_box(op_work(black_box(data), ctx.ith, ctx.nth));
                            ctx.barrier.wait();
                        }
                    });
                    assert!(ok);
                    start.elapsed()
                })
            });

            g.bench_function(id("lamina_run_per_op"), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let ok = pool.run(&|ctx| {
                            black_box(op_work(black_box(data), ctx.ith, ctx.nth));
                        });
                        assert!(ok);
                    }
                    start.elapsed()
                })
            });

            g.bench_function(id("rayon_broadcast"), |b| {
                b.iter_custom(|iters| {
                    let start = Instant::now();
                    for _ in 0..iters {
                        rayon_pool.broadcast(|ctx| {
                            black_box(op_work(black_box(data), ctx.index(), ctx.num_threads()));
                        });
                    }
                    start.elapsed()
                })
            });

            g.bench_function(id("rayon_par_iter"), |b| {
                b.iter_custom(|iters| {
                    rayon_pool.install(|| {
                        let start = Instant::now();
                        for _ in 0..iters {
                            (0..nth).into_par_iter().for_each(|ith| {
                                black_box(op_work(black_box(data), ith, nth));
                            });
                        }
                        start.elapsed()
                    })
                })
            });
        }
    }
    g.finish();
}

criterion_group!(benches, bench_dispatch);
criterion_main!(benches);
