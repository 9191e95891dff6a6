//! Bit-exactness of `lamina_cpu::kernels` against llama.cpp itself: `data/exact_vectors.bin`
//! holds inputs and outputs of ggml-cpu (llama.cpp 0c1e570 as vendored in llama-cpp-python
//! 0.3.36, built for AVX2/FMA/F16C like the reference outputs), written by
//! `data/exact_harness.c` via `data/gen_exact_vectors.sh`. Each case is checked with the
//! dispatching kernel and with the scalar emulation.

use lamina_core::DType;
use lamina_cpu::kernels::{self, act, dot, quantize};

mod common;

use common::Record;

const VECTORS: &[u8] = include_bytes!("data/exact_vectors.bin");

fn records() -> Vec<Record<'static>> {
    common::records(VECTORS)
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn i32s(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: {g:e} vs llama.cpp {w:e}"
        );
    }
}

fn dtype_named(s: &str) -> DType {
    match s {
        "q4_0" => DType::Q4_0,
        "q4_1" => DType::Q4_1,
        "q5_0" => DType::Q5_0,
        "q5_1" => DType::Q5_1,
        "q8_0" => DType::Q8_0,
        "q8_1" => DType::Q8_1,
        "q8_K" => DType::Q8_K,
        "iq4_nl" => DType::IQ4_NL,
        "q2_K" => DType::Q2_K,
        "q3_K" => DType::Q3_K,
        "q4_K" => DType::Q4_K,
        "q5_K" => DType::Q5_K,
        "q6_K" => DType::Q6_K,
        "iq4_xs" => DType::IQ4_XS,
        "f16" => DType::F16,
        _ => panic!("unknown type {s}"),
    }
}

/// Quantizes `x` to `dtype` (Q8_0, Q8_1 or Q8_K) with the dispatching or the scalar kernel.
fn quantize_act(dtype: DType, x: &[f32], scalar: bool) -> Vec<u8> {
    let mut o = vec![0u8; dtype.row_size(x.len() as u64).unwrap() as usize];
    match (dtype, scalar) {
        (DType::Q8_0, false) => kernels::quantize_row_q8_0(x, &mut o),
        (DType::Q8_0, true) => quantize::quantize_row_q8_0_scalar(x, &mut o),
        (DType::Q8_1, false) => kernels::quantize_row_q8_1(x, &mut o),
        (DType::Q8_1, true) => quantize::quantize_row_q8_1_scalar(x, &mut o),
        (DType::Q8_K, _) => kernels::quantize_row_q8_k(x, &mut o),
        _ => panic!("no quantizer for {dtype}"),
    }
    o
}

#[test]
fn quantizers_match_llama_cpp() {
    let mut n = 0;
    for r in records().iter().filter(|r| r.name.starts_with("quant:")) {
        let dtype = dtype_named(&r.name[6..]);
        let x = f32s(r.arrays[0]);
        for scalar in [false, true] {
            assert_eq!(
                quantize_act(dtype, &x, scalar),
                r.arrays[1],
                "{} scalar={scalar}",
                r.name
            );
        }
        n += 1;
    }
    assert!(n >= 9);
}

#[test]
fn dots_match_llama_cpp() {
    let mut checked = Vec::new();
    for r in records().iter().filter(|r| r.name.starts_with("dot:")) {
        let dtype = dtype_named(&r.name[4..]);
        let (w, x, xq) = (r.arrays[0], f32s(r.arrays[1]), r.arrays[2]);
        let want = f32s(r.arrays[3])[0];
        let n = x.len();
        let vdt = lamina_core::quant::vec_dot_type(dtype).unwrap();
        assert_eq!(
            quantize_act(vdt, &x, false),
            xq,
            "{}: activation quantization",
            r.name
        );
        let Some(got) = dot::vec_dot(dtype, n, w, xq) else {
            continue;
        };
        let scalar = dot::vec_dot_scalar(dtype, n, w, xq).unwrap();
        assert_bits(&[got, scalar], &[want, want], &format!("{} n={n}", r.name));
        checked.push(dtype);
    }
    for t in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
    ] {
        assert!(checked.contains(&t), "{t} not checked");
    }
    for t in [
        DType::IQ4_NL,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        assert!(checked.contains(&t), "{t} not checked");
    }
}

/// Splits `x` into rows of `n` and applies `f(row_index, row, out_row)`.
fn rows(x: &[f32], n: usize, mut f: impl FnMut(usize, &[f32], &mut [f32])) -> Vec<f32> {
    let mut y = vec![0f32; x.len()];
    for (i, (xr, yr)) in x.chunks(n).zip(y.chunks_mut(n)).enumerate() {
        f(i, xr, yr);
    }
    y
}

#[test]
fn row_ops_match_llama_cpp() {
    let mut n_checked = 0;
    for r in records() {
        let mut parts = r.name.split(':');
        let op = parts.next().unwrap();
        if !matches!(
            op,
            "silu" | "gelu" | "swiglu" | "geglu" | "rms_norm" | "softmax" | "rope"
        ) {
            continue;
        }
        let a = f32s(r.arrays[0]);
        let b = f32s(r.arrays[1]);
        let want = f32s(r.arrays[2]);
        let got = match op {
            "silu" | "gelu" | "swiglu" | "geglu" | "rms_norm" => {
                let n: usize = parts.next().unwrap().parse().unwrap();
                let brow = |i: usize| &b[i * n..(i + 1) * n];
                match op {
                    "silu" => rows(&a, n, |_, x, y| kernels::silu_row(x, y)),
                    "gelu" => rows(&a, n, |_, x, y| kernels::gelu_row(x, y)),
                    "swiglu" => rows(&a, n, |i, x, y| kernels::swiglu_row(x, brow(i), y)),
                    "geglu" => rows(&a, n, |i, x, y| kernels::geglu_row(x, brow(i), y)),
                    _ => rows(&a, n, |_, x, y| kernels::rms_norm_row(x, 1e-6, y)),
                }
            }
            "softmax" => {
                let nkv: usize = parts.next().unwrap().parse().unwrap();
                let scale: f32 = parts.next().unwrap().parse().unwrap();
                let g = rows(&a, nkv, |i, x, y| {
                    kernels::softmax_row(x, scale, Some(&b[i * nkv..(i + 1) * nkv]), 1.0, y)
                });
                let s = rows(&a, nkv, |i, x, y| {
                    act::scalar::softmax_row(x, scale, Some(&b[i * nkv..(i + 1) * nkv]), 1.0, y)
                });
                assert_bits(&s, &want, &format!("{} (scalar)", r.name));
                g
            }
            "rope" => {
                let mode: i32 = parts.next().unwrap().parse().unwrap();
                let head: usize = parts.next().unwrap().parse().unwrap();
                let n_dims: usize = parts.next().unwrap().parse().unwrap();
                let base: f32 = parts.next().unwrap().parse().unwrap();
                let pos = i32s(r.arrays[1]);
                let n_head = a.len() / head / pos.len();
                let prm = act::RopeCacheParams {
                    freq_scale: 1.0,
                    ext_factor: 0.0,
                    attn_factor: 1.0,
                    corr_dims: [0.0, 0.0],
                    theta_scale: base.powf(-2.0 / n_dims as f32),
                    sin_sign: 1.0,
                };
                let mut cache = vec![0f32; head];
                let mut y = vec![0f32; a.len()];
                for (t, &p) in pos.iter().enumerate() {
                    kernels::rope_cache(p as f32, &prm, None, &mut cache);
                    for h in 0..n_head {
                        let o = (t * n_head + h) * head;
                        let (x, yr) = (&a[o..o + head], &mut y[o..o + head]);
                        kernels::rope_rotate(mode == 2, n_dims, &cache, x, yr);
                        yr[n_dims..].copy_from_slice(&x[n_dims..]);
                    }
                }
                y
            }
            _ => continue,
        };
        assert_bits(&got, &want, r.name);
        n_checked += 1;
    }
    assert!(n_checked >= 20, "{n_checked} row cases");
}

/// Every product through [`kernels::MatMul`]'s plan, as the CPU backend runs it.
#[test]
fn mul_mat_plans_match_llama_cpp() {
    let mut n_checked = 0;
    for r in records()
        .iter()
        .filter(|r| r.name.starts_with("mulmat") && !r.name.starts_with("mulmat_repack"))
    {
        let f: Vec<&str> = r.name.split(':').collect();
        let (dtype, rest) = if f[0] == "mulmat_f16" {
            (DType::F16, &f[1..])
        } else {
            (dtype_named(f[1]), &f[2..])
        };
        let dims: Vec<usize> = rest.iter().map(|s| s.parse().unwrap()).collect();
        let (m, n, k) = (dims[0], dims[1], dims[2]);
        let (w, x, want) = (r.arrays[0], f32s(r.arrays[1]), f32s(r.arrays[2]));
        let plan = kernels::MatMul::plan(kernels::table(), dtype, m, n, k, true, true).unwrap();
        let wrow = dtype.row_size(k as u64).unwrap() as usize;
        let arow = plan.act_row_bytes(k).unwrap();
        // 4-aligned activation buffer (f32 rows are read as f32)
        let mut abuf = vec![0u32; (arow * n).div_ceil(4)];
        // SAFETY: u32 storage viewed as bytes.
        let acts =
            unsafe { std::slice::from_raw_parts_mut(abuf.as_mut_ptr() as *mut u8, arow * n) };
        for j in 0..n {
            plan.convert_act(
                j,
                &x[j * k..(j + 1) * k],
                &mut acts[j * arow..(j + 1) * arow],
            );
        }
        let mut got = vec![0f32; m * n];
        for j in 0..n {
            for i in 0..m {
                let wr = &w[i * wrow..(i + 1) * wrow];
                got[j * m + i] = plan.dot(k, wr, &acts[j * arow..(j + 1) * arow], j);
            }
        }
        assert_bits(&got, &want, r.name);
        let tiled = tiled_products(&plan, k, m, n, &w[..m * wrow], &acts[..n * arow]);
        assert_bits(&tiled, &want, &format!("{} (tiles)", r.name));
        n_checked += 1;
    }
    assert!(n_checked >= 14, "{n_checked} products");
}

/// Products whose weights llama.cpp keeps in its `CPU_REPACK` buffer (Q4_K, Q4_0, IQ4_NL with
/// a multiple of 8 rows), through [`kernels::MatMul`].
#[test]
fn repacked_mul_mat_matches_llama_cpp() {
    let mut n_checked = 0;
    for r in records()
        .iter()
        .filter(|r| r.name.starts_with("mulmat_repack:"))
    {
        let f: Vec<&str> = r.name.split(':').collect();
        let dtype = dtype_named(f[1]);
        let dims: Vec<usize> = f[2..].iter().map(|s| s.parse().unwrap()).collect();
        let (m, n, k) = (dims[0], dims[1], dims[2]);
        let (w, x, want) = (r.arrays[0], f32s(r.arrays[1]), f32s(r.arrays[2]));
        let plan = kernels::MatMul::plan(kernels::table(), dtype, m, n, k, true, true).unwrap();
        let wrow = dtype.row_size(k as u64).unwrap() as usize;
        let arow = plan.act_row_bytes(k).unwrap();
        let mut acts = vec![0u8; arow * n];
        for j in 0..n {
            plan.convert_act(
                j,
                &x[j * k..(j + 1) * k],
                &mut acts[j * arow..(j + 1) * arow],
            );
        }
        let mut got = vec![0f32; m * n];
        for j in 0..n {
            for i in 0..m {
                let wr = &w[i * wrow..(i + 1) * wrow];
                got[j * m + i] = plan.dot(k, wr, &acts[j * arow..(j + 1) * arow], j);
            }
        }
        assert_bits(&got, &want, r.name);
        let tiled = tiled_products(&plan, k, m, n, &w[..m * wrow], &acts[..n * arow]);
        assert_bits(&tiled, &want, &format!("{} (tiles)", r.name));
        n_checked += 1;
    }
    assert!(n_checked >= 5);
}

/// All `m × n` outputs through [`kernels::MatMul::dot_tile`] in the CPU backend's tiling (8
/// weight rows × 4 activation rows, never across the plan's activation boundary), laid out
/// `[j * m + i]`.
fn tiled_products(
    plan: &kernels::MatMul,
    k: usize,
    m: usize,
    n: usize,
    w: &[u8],
    acts: &[u8],
) -> Vec<f32> {
    let (wrow, arow) = (w.len() / m, acts.len() / n);
    let wr: Vec<&[u8]> = w.chunks_exact(wrow).collect();
    let ar: Vec<&[u8]> = acts.chunks_exact(arow).collect();
    let boundary = plan.act_boundary().min(n);
    let mut got = vec![0f32; m * n];
    let mut out = [0f32; 32];
    for i0 in (0..m).step_by(8) {
        let rm = (m - i0).min(8);
        let mut j0 = 0;
        while j0 < n {
            let end = if j0 < boundary {
                boundary.min(j0 + 4)
            } else {
                n.min(j0 + 4)
            };
            let rn = end - j0;
            plan.dot_tile(k, &wr[i0..i0 + rm], &ar[j0..end], j0, &mut out[..rm * rn]);
            for i in 0..rm {
                for j in 0..rn {
                    got[(j0 + j) * m + i0 + i] = out[j * rm + i];
                }
            }
            j0 = end;
        }
    }
    got
}

/// llama.cpp 0c1e570's x86 `ggml_vec_dot_*` (its AVX2 kernels, or the generic code renamed for
/// x86, built with gcc -O3 -march=haswell) for the types newer than this file's harness: kind-4
/// records of lamina-core's `tests/data/ggml_0c1e570_vectors.bin` (written by
/// `gen_ggml_0c1e570_vectors.py`), weight row then activation row (quantized by llama.cpp's
/// x86 `quantize_row_q8_K`/`q8_0`), and ggml's result. Records of types this build does not
/// know are skipped; `WANT` says which must be there.
#[test]
fn new_type_dots_match_llama_cpp_x86() {
    x86_dot_records_match(
        include_bytes!("../../core/tests/data/ggml_0c1e570_vectors.bin"),
        &[
            DType::TQ1_0,
            DType::TQ2_0,
            DType::NVFP4,
            DType::Q1_0,
            DType::Q2_0,
        ],
    );
}

/// As [`new_type_dots_match_llama_cpp_x86`] for the grid i-quants: kind-4 records of
/// `ggml_0c1e570_iq_vectors.bin` (`gen_ggml_0c1e570_iq_vectors.py`; random weight blocks,
/// activations from llama.cpp's x86 `quantize_row_q8_K`).
#[test]
fn iq_type_dots_match_llama_cpp_x86() {
    x86_dot_records_match(
        include_bytes!("../../core/tests/data/ggml_0c1e570_iq_vectors.bin"),
        &[
            DType::IQ2_XXS,
            DType::IQ2_XS,
            DType::IQ2_S,
            DType::IQ3_XXS,
            DType::IQ3_S,
            DType::IQ1_S,
            DType::IQ1_M,
        ],
    );
}

fn x86_dot_records_match(buf: &[u8], types: &[DType]) {
    let u32_at = |p: usize| u32::from_le_bytes(buf[p..p + 4].try_into().unwrap());
    assert_eq!(&buf[..4], b"LQG1");
    let count = u32_at(4);
    let mut pos = 8;
    let mut seen = Vec::new();
    for _ in 0..count {
        let (kind, id, n, m) = (
            u32_at(pos),
            u32_at(pos + 4),
            u32_at(pos + 8),
            u32_at(pos + 12),
        );
        let (n, m) = (n as usize, m as usize);
        pos += 16;
        let bytes = &buf[pos..pos + m];
        pos += m;
        let floats = match kind {
            2 | 4 => 1,
            5 => 2 * n,
            _ => n,
        };
        let want = f32s(&buf[pos..pos + 4 * floats]);
        pos += 4 * floats;
        let Ok(dtype) = DType::from_id(id) else {
            continue;
        };
        if kind != 4 {
            continue;
        }
        let (x, y) = bytes.split_at(dtype.row_size(n as u64).unwrap() as usize);
        let got = dot::vec_dot(dtype, n, x, y).expect("kernel");
        assert_bits(&[got], &want, &format!("{dtype} dot (dispatch) n={n}"));
        let got = dot::vec_dot_scalar(dtype, n, x, y).expect("kernel");
        assert_bits(&[got], &want, &format!("{dtype} dot (scalar) n={n}"));
        for isa in kernels::available_isas() {
            let plan =
                kernels::MatMul::plan(kernels::table(), dtype, 1, 1, n, true, true).expect("plan");
            let mut out = [0f32];
            plan.dot_tile_at(isa, n, &[x], &[y], 0, &mut out);
            assert_bits(
                &out,
                &want,
                &format!("{dtype} mul_mat tile ({isa:?}) n={n}"),
            );
        }
        seen.push(dtype);
    }
    assert_eq!(pos, buf.len());
    for t in types {
        assert!(seen.contains(t), "no x86 dot vectors for {t}");
    }
}
