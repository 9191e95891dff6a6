//! test-backend-ops for the GPU backend: each op the GPU runs, over its types and a few shapes,
//! as a one-op graph on the GPU device and on the CPU backend, compared by NMSE with ggml's
//! limits (5e-4 for matrix products, 1e-7 otherwise), or bit for bit where the GPU repeats the
//! CPU's arithmetic (the exact matrix products, softmax). This is the CPU *backend* as the model
//! uses it (its activation quantization included), not a scalar reference: the kernels'
//! own reference tests are in `kernels.rs`. Skips without an adapter (CI sets
//! LAMINA_REQUIRE_WGPU).

use std::sync::Arc;

use lamina_backend::{Device, Scheduler};
use lamina_core::DType;
use lamina_core::graph::{Graph, RopeMode, RopeParams, TensorId};
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_wgpu::WgpuBackendReg;

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect()
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `rows` rows of `k` random values, quantized to `dtype`.
fn quantized(dtype: DType, k: usize, rows: usize, seed: u64) -> Vec<u8> {
    let row = dtype.row_size(k as u64).unwrap() as usize;
    let x = values(k * rows, seed);
    let mut out = vec![0u8; row * rows];
    for (xr, or) in x.chunks_exact(k).zip(out.chunks_exact_mut(row)) {
        match dtype {
            DType::F32 => or.copy_from_slice(&f32_bytes(xr)),
            DType::F16 => or.copy_from_slice(&f16_bytes(xr)),
            _ => lamina_core::quant::quantize_row(dtype, xr, or).unwrap(),
        }
    }
    out
}

/// A one-op test: graph inputs with their bytes, the output, and tensors an op writes into
/// (bound to a buffer of the device, as the KV cache is).
struct Built {
    inputs: Vec<(TensorId, Vec<u8>)>,
    out: TensorId,
    bound: Vec<(TensorId, Vec<u8>)>,
}

struct Case {
    name: String,
    max_nmse: f64,
    build: Box<dyn Fn(&mut Graph) -> Built>,
}

fn case(
    name: impl Into<String>,
    max_nmse: f64,
    build: impl Fn(&mut Graph) -> Built + 'static,
) -> Case {
    Case {
        name: name.into(),
        max_nmse,
        build: Box::new(build),
    }
}

fn input(
    g: &mut Graph,
    inputs: &mut Vec<(TensorId, Vec<u8>)>,
    dtype: DType,
    ne: &[usize],
    bytes: Vec<u8>,
) -> TensorId {
    let id = g.new_input(dtype, ne).unwrap();
    inputs.push((id, bytes));
    id
}

fn f32_input(
    g: &mut Graph,
    inputs: &mut Vec<(TensorId, Vec<u8>)>,
    ne: &[usize],
    seed: u64,
) -> TensorId {
    let n = ne.iter().product();
    input(g, inputs, DType::F32, ne, f32_bytes(&values(n, seed)))
}

fn cases() -> Vec<Case> {
    let mut v = Vec::new();
    for (name, mul) in [("ADD", false), ("MUL", true)] {
        v.push(case(name, 1e-7, move |g| {
            let mut i = Vec::new();
            let a = f32_input(g, &mut i, &[64, 5, 3], 1);
            let b = f32_input(g, &mut i, &[64, 1, 3], 2);
            let out = if mul { g.mul(a, b) } else { g.add(a, b) }.unwrap();
            Built {
                inputs: i,
                out,
                bound: Vec::new(),
            }
        }));
    }
    v.push(case("SCALE", 1e-7, |g| {
        let mut i = Vec::new();
        let a = f32_input(g, &mut i, &[64, 7], 3);
        Built {
            bound: Vec::new(),
            out: g.scale(a, 0.7).unwrap(),
            inputs: i,
        }
    }));
    v.push(case("RMS_NORM", 1e-7, |g| {
        let mut i = Vec::new();
        let a = f32_input(g, &mut i, &[640, 5], 4);
        Built {
            bound: Vec::new(),
            out: g.rms_norm(a, 1e-6).unwrap(),
            inputs: i,
        }
    }));
    v.push(case("NORM", 1e-7, |g| {
        let mut i = Vec::new();
        let a = f32_input(g, &mut i, &[576, 5], 5);
        Built {
            bound: Vec::new(),
            out: g.norm(a, 1e-5).unwrap(),
            inputs: i,
        }
    }));
    for mask_type in [DType::F16, DType::F32] {
        v.push(case(format!("SOFT_MAX mask {mask_type}"), 0.0, move |g| {
            let mut i = Vec::new();
            let a = f32_input(g, &mut i, &[96, 7, 2], 6);
            // A causal mask: -inf above the diagonal.
            let m: Vec<f32> = (0..96 * 7)
                .map(|x| {
                    if x % 96 > x / 96 + 80 {
                        f32::NEG_INFINITY
                    } else {
                        0.0
                    }
                })
                .collect();
            let bytes = if mask_type == DType::F16 {
                f16_bytes(&m)
            } else {
                f32_bytes(&m)
            };
            let mask = input(g, &mut i, mask_type, &[96, 7], bytes);
            Built {
                bound: Vec::new(),
                out: g.soft_max_ext(a, Some(mask), 0.125, 0.0).unwrap(),
                inputs: i,
            }
        }));
    }
    for (mode, n_dims) in [
        (RopeMode::Normal, 64),
        (RopeMode::Neox, 64),
        (RopeMode::Neox, 32),
    ] {
        v.push(case(
            format!("ROPE {mode:?} {n_dims} dims"),
            // The angles' cosf/sinf are glibc's algorithm on both (see `libm_sincos`):
            // one-step reduction below 120, the 4/π table above, negative positions.
            0.0,
            move |g| {
                let mut i = Vec::new();
                let a = f32_input(g, &mut i, &[64, 4, 8], 7);
                let pos = input(
                    g,
                    &mut i,
                    DType::I32,
                    &[8],
                    i32_bytes(&[0, 1, 7, 100, 3000, -5, 131071, 1_000_000]),
                );
                let mut p = RopeParams::new(n_dims, mode, 10000.0);
                p.freq_scale = 0.25;
                Built {
                    bound: Vec::new(),
                    out: g.rope_ext(a, pos, None, p).unwrap(),
                    inputs: i,
                }
            },
        ));
    }
    // Flash attention (ggml-cpu's rows path; one query over 600 cells: the split-KV path in
    // 3 chunks; 64 or more queries: the tiled path, with a tile masked for every query and a
    // partial last one): f16 and f32 caches, GQA, a causal mask with -inf and finite values.
    // Fused attention (the standard path's prompt node): K·Q, softmax, V·KQ with their kernels.
    for (kvt, n_q, n_kv) in [(DType::F16, 5, 96), (DType::F32, 9, 40)] {
        v.push(case(
            format!("ATTENTION {kvt} n_q={n_q} n_kv={n_kv}"),
            0.0,
            move |g| {
                let (d, h, h_kv) = (64usize, 4usize, 2usize);
                let mut i = Vec::new();
                let q = f32_input(g, &mut i, &[d, h, n_q], 30);
                let q = g.permute(q, [0, 2, 1, 3]).unwrap();
                let cache = |seed, ne: [usize; 3]| {
                    let x = values(ne.iter().product(), seed);
                    let bytes = if kvt == DType::F16 {
                        f16_bytes(&x)
                    } else {
                        f32_bytes(&x)
                    };
                    (bytes, ne)
                };
                let (kb, kne) = cache(31, [d, n_kv, h_kv]);
                let k = input(g, &mut i, kvt, &kne, kb);
                let (vb, vne) = cache(32, [n_kv, d, h_kv]);
                let vv = input(g, &mut i, kvt, &vne, vb);
                let m: Vec<f32> = (0..n_kv * n_q)
                    .map(|x| {
                        let (c, r) = (x % n_kv, x / n_kv);
                        if c > n_kv - n_q + r {
                            f32::NEG_INFINITY
                        } else {
                            0.0
                        }
                    })
                    .collect();
                let mask = input(g, &mut i, DType::F32, &[n_kv, n_q], f32_bytes(&m));
                Built {
                    out: g.attention(q, k, vv, mask, 0.125).unwrap(),
                    inputs: i,
                    bound: Vec::new(),
                }
            },
        ));
    }
    // `pad`: cells from there on are masked for every query (a padded cache).
    for (kvt, n_q, n_kv, pad, chunks) in [
        (DType::F16, 5, 96, 96, 1),
        (DType::F32, 5, 96, 96, 1),
        (DType::F16, 1, 600, 590, 3),
        (DType::F16, 70, 200, 128, 1),
        (DType::F32, 64, 70, 70, 1),
    ] {
        v.push(case(
            format!("FLASH_ATTN_EXT {kvt} n_q={n_q} n_kv={n_kv}"),
            0.0,
            move |g| {
                let (d, h, h_kv) = (64usize, 4usize, 2usize);
                let mut i = Vec::new();
                let q = f32_input(g, &mut i, &[d, n_q, h], 27);
                let cache = |seed| {
                    let x = values(d * n_kv * h_kv, seed);
                    if kvt == DType::F16 {
                        f16_bytes(&x)
                    } else {
                        f32_bytes(&x)
                    }
                };
                let k = input(g, &mut i, kvt, &[d, n_kv, h_kv], cache(28));
                let vv = input(g, &mut i, kvt, &[d, n_kv, h_kv], cache(29));
                let m: Vec<f32> = (0..n_kv * n_q)
                    .map(|x| {
                        let (c, r) = (x % n_kv, x / n_kv);
                        if c > n_kv - n_q + r || c >= pad {
                            f32::NEG_INFINITY
                        } else {
                            (c % 7) as f32 * -0.3
                        }
                    })
                    .collect();
                let mask = input(g, &mut i, DType::F32, &[n_kv, n_q], f32_bytes(&m));
                Built {
                    out: g
                        .flash_attn_ext(q, k, vv, mask, 0.125, 0.0, 0.0, chunks)
                        .unwrap(),
                    inputs: i,
                    bound: Vec::new(),
                }
            },
        ));
    }
    v.push(case("SILU", 1e-7, |g| {
        let mut i = Vec::new();
        let a = f32_input(g, &mut i, &[256, 3], 8);
        Built {
            bound: Vec::new(),
            out: g.silu(a).unwrap(),
            inputs: i,
        }
    }));
    v.push(case("GELU", 1e-7, |g| {
        let mut i = Vec::new();
        let a = f32_input(g, &mut i, &[256, 3], 9);
        Built {
            bound: Vec::new(),
            out: g.gelu(a).unwrap(),
            inputs: i,
        }
    }));
    for geglu in [false, true] {
        v.push(case(
            if geglu { "GEGLU" } else { "SWIGLU" },
            1e-7,
            move |g| {
                let mut i = Vec::new();
                let a = f32_input(g, &mut i, &[256, 3], 10);
                let b = f32_input(g, &mut i, &[256, 3], 11);
                let out = if geglu {
                    g.geglu_split(a, b)
                } else {
                    g.swiglu_split(a, b)
                }
                .unwrap();
                Built {
                    out,
                    inputs: i,
                    bound: Vec::new(),
                }
            },
        ));
    }
    // Model-sized products (other CPU kernel plans: tiles, tinyBLAS).
    for (dtype, k, m) in [
        (DType::Q8_0, 640, 1024),
        (DType::Q5_0, 640, 1024),
        (DType::Q4_K, 2048, 640),
        (DType::Q6_K, 2048, 640),
        (DType::Q4_0, 576, 1536),
        // Rows not in eights: llama.cpp repacks neither Q4_0 nor Q4_K (vec_dot, tiled).
        (DType::Q4_0, 576, 44),
        (DType::Q4_K, 512, 44),
        (DType::Q4_1, 576, 1536),
        (DType::F16, 256, 256),
    ] {
        for n in [1, 8, 13] {
            v.push(case(
                format!("MUL_MAT {dtype} {k}x{m} n={n}"),
                0.0,
                move |g| {
                    let mut i = Vec::new();
                    let w = input(g, &mut i, dtype, &[k, m], quantized(dtype, k, m, 23));
                    let x = f32_input(g, &mut i, &[k, n], 24);
                    Built {
                        out: g.mul_mat(w, x).unwrap(),
                        inputs: i,
                        bound: Vec::new(),
                    }
                },
            ));
        }
    }
    // Attention's products: K·Q with GQA and a permuted q, then V·KQ.
    v.push(case("MUL_MAT K·Q (GQA, permuted q)", 0.0, |g| {
        let mut i = Vec::new();
        let k = input(
            g,
            &mut i,
            DType::F16,
            &[64, 32, 2],
            f16_bytes(&values(64 * 64, 19)),
        );
        let q = f32_input(g, &mut i, &[64, 4, 5], 20);
        let q = g.permute(q, [0, 2, 1, 3]).unwrap();
        Built {
            out: g.mul_mat(k, q).unwrap(),
            inputs: i,
            bound: Vec::new(),
        }
    }));
    // One query row over a padded cache (a generation step): ggml_vec_dot_f16's order.
    for (kv, n) in [(256, 1), (40, 1), (256, 3)] {
        v.push(case(
            format!("MUL_MAT V·KQ kv={kv} n={n}"),
            0.0,
            move |g| {
                let mut i = Vec::new();
                let v = input(
                    g,
                    &mut i,
                    DType::F16,
                    &[kv, 64, 3],
                    f16_bytes(&values(kv * 64 * 3, 25)),
                );
                let kq = f32_input(g, &mut i, &[kv, n, 9], 26);
                Built {
                    out: g.mul_mat(v, kq).unwrap(),
                    inputs: i,
                    bound: Vec::new(),
                }
            },
        ));
    }
    v.push(case("MUL_MAT V·KQ (GQA)", 0.0, |g| {
        let mut i = Vec::new();
        let v = input(
            g,
            &mut i,
            DType::F16,
            &[32, 64, 2],
            f16_bytes(&values(64 * 64, 21)),
        );
        let kq = f32_input(g, &mut i, &[32, 5, 4], 22);
        Built {
            out: g.mul_mat(v, kq).unwrap(),
            inputs: i,
            bound: Vec::new(),
        }
    }));
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
    ] {
        v.push(case(format!("GET_ROWS {dtype}"), 1e-7, move |g| {
            let mut i = Vec::new();
            let w = input(g, &mut i, dtype, &[256, 10], quantized(dtype, 256, 10, 12));
            let ids = input(g, &mut i, DType::I32, &[4], i32_bytes(&[9, 0, 3, 3]));
            Built {
                bound: Vec::new(),
                out: g.get_rows(w, ids).unwrap(),
                inputs: i,
            }
        }));
    }
    v.push(case("SET_ROWS f16", 1e-7, |g| {
        let mut i = Vec::new();
        let dst = g.new_tensor(DType::F16, &[64, 16]).unwrap();
        let src = f32_input(g, &mut i, &[64, 3], 14);
        let idx = input(g, &mut i, DType::I32, &[3], i32_bytes(&[15, 2, 7]));
        let out = g.set_rows(dst, src, idx).unwrap();
        let bound = vec![(dst, f16_bytes(&values(64 * 16, 13)))];
        Built {
            out,
            inputs: i,
            bound,
        }
    }));
    v.push(case("CPY f32 to f16", 1e-7, |g| {
        let mut i = Vec::new();
        let a = f32_input(g, &mut i, &[64, 6], 15);
        let b = g.new_tensor(DType::F16, &[64, 6]).unwrap();
        let out = g.cpy(a, b).unwrap();
        Built {
            out,
            inputs: i,
            bound: vec![(b, vec![0; 64 * 6 * 2])],
        }
    }));
    v.push(case("CONT of a permutation", 1e-7, |g| {
        let mut i = Vec::new();
        let a = f32_input(g, &mut i, &[32, 5, 3], 16);
        let p = g.permute(a, [0, 2, 1, 3]).unwrap();
        Built {
            bound: Vec::new(),
            out: g.cont(p).unwrap(),
            inputs: i,
        }
    }));
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        for n in [1, 3, 9] {
            v.push(case(format!("MUL_MAT {dtype} n={n}"), 0.0, move |g| {
                let mut i = Vec::new();
                let w = input(g, &mut i, dtype, &[256, 48], quantized(dtype, 256, 48, 17));
                let x = f32_input(g, &mut i, &[256, n], 18);
                Built {
                    bound: Vec::new(),
                    out: g.mul_mat(w, x).unwrap(),
                    inputs: i,
                }
            }));
        }
    }
    v
}

fn run_on(device: &Arc<dyn Device>, c: &Case) -> Vec<f32> {
    let mut g = Graph::new();
    let built = (c.build)(&mut g);
    let mut buffers = Vec::new();
    for (id, bytes) in &built.bound {
        let b = device.buffer_type().alloc_buffer(bytes.len()).unwrap();
        b.write(0, bytes).unwrap();
        g.bind(*id, b.memory(), 0).unwrap();
        buffers.push(b);
    }
    let out_type = g.tensor(built.out).layout.dtype;
    g.set_output(built.out).unwrap();
    let mut sched = Scheduler::new(vec![device.clone()], false).unwrap();
    let sg = sched.schedule(g, &[]).unwrap();
    for (id, bytes) in &built.inputs {
        sched.set_input(&sg, *id, bytes).unwrap();
    }
    sched.compute_async(&sg).unwrap();
    let out = sched.get_async(&sg, built.out).unwrap();
    sched.synchronize().unwrap();
    let bytes = out.wait().unwrap();
    match out_type {
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        _ => lamina_backend::bytes_to_f32(&bytes),
    }
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    let (mut e, mut n) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        e += (g as f64 - w as f64).powi(2);
        n += (w as f64).powi(2);
    }
    e / n.max(f64::MIN_POSITIVE)
}

#[test]
fn every_gpu_op_matches_the_cpu_backend() {
    let reg = WgpuBackendReg::new(1).unwrap();
    let Some(gpu) = reg
        .wgpu_devices()
        .first()
        .map(|d| d.clone() as Arc<dyn Device>)
    else {
        assert!(
            std::env::var_os("LAMINA_REQUIRE_WGPU").is_none(),
            "no wgpu adapter, and LAMINA_REQUIRE_WGPU is set"
        );
        eprintln!("skipping: no wgpu adapter");
        return;
    };
    let cpu_reg = CpuBackendReg::new(CpuConfig::default().with_threads(2)).unwrap();
    let cpu: Arc<dyn Device> = cpu_reg.cpu_devices()[0].clone();
    let mut failures = Vec::new();
    for c in cases() {
        let want = run_on(&cpu, &c);
        let got = run_on(&gpu, &c);
        let e = nmse(&got, &want);
        eprintln!("{:<28} NMSE {e:.2e}", c.name);
        // SHOW_DIFFS=1 prints the first differing elements with their bits.
        if std::env::var_os("SHOW_DIFFS").is_some() {
            for (k, (a, b)) in got
                .iter()
                .zip(&want)
                .enumerate()
                .filter(|(_, (a, b))| a != b)
                .take(4)
            {
                eprintln!(
                    "   [{k}] gpu {a:e} ({:#x}) cpu {b:e} ({:#x})",
                    a.to_bits(),
                    b.to_bits()
                );
            }
        }
        // NaN fails too.
        let within = e <= c.max_nmse;
        if !within || got.len() != want.len() {
            failures.push(format!("{}: NMSE {e:e} > {:e}", c.name, c.max_nmse));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
