//! lamina-core's quant module against references: the `gguf` Python package's quantizers and
//! dequantizers (vectors in tests/data/quant_vectors.bin, made by tests/data/gen_quant_vectors.py),
//! llama.cpp's test-quantize-fns error limits, and f64 dot products of dequantized rows.

use lamina_core::DType;
use lamina_core::quant::*;

const VECTORS: &[u8] = include_bytes!("data/quant_vectors.bin");

struct Record {
    kind: u32,
    dtype: DType,
    /// Element count of the row.
    n: usize,
    bytes: Vec<u8>,
    floats: Vec<f32>,
}

fn read_u32(buf: &[u8], pos: &mut usize) -> u32 {
    let v = u32::from_le_bytes(buf[*pos..*pos + 4].try_into().unwrap());
    *pos += 4;
    v
}

fn records() -> Vec<Record> {
    assert_eq!(&VECTORS[..4], b"LQV1");
    let mut pos = 4;
    let count = read_u32(VECTORS, &mut pos);
    let mut out = Vec::new();
    for _ in 0..count {
        let kind = read_u32(VECTORS, &mut pos);
        let dtype = DType::from_id(read_u32(VECTORS, &mut pos)).unwrap();
        let n = read_u32(VECTORS, &mut pos) as usize;
        let m = read_u32(VECTORS, &mut pos) as usize;
        let bytes = VECTORS[pos..pos + m].to_vec();
        pos += m;
        let floats = VECTORS[pos..pos + 4 * n]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        pos += 4 * n;
        out.push(Record {
            kind,
            dtype,
            n,
            bytes,
            floats,
        });
    }
    assert_eq!(pos, VECTORS.len());
    out
}

#[test]
fn dequantize_matches_gguf_py_bit_for_bit() {
    let mut seen = Vec::new();
    for r in records().into_iter().filter(|r| r.kind == 0) {
        let mut out = vec![0f32; r.floats.len()];
        dequantize_row(r.dtype, &r.bytes, &mut out).unwrap();
        for (i, (a, b)) in out.iter().zip(&r.floats).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{} element {i}: ours {a:e}, gguf {b:e}",
                r.dtype
            );
        }
        seen.push(r.dtype);
    }
    use DType::*;
    for t in [
        F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
    ] {
        assert!(seen.contains(&t), "no dequantize vectors for {t}");
    }
}

#[test]
fn quantize_matches_gguf_py_bit_for_bit() {
    let mut seen = Vec::new();
    for r in records().into_iter().filter(|r| r.kind == 1) {
        let mut out = vec![0u8; r.bytes.len()];
        quantize_row(r.dtype, &r.floats, &mut out).unwrap();
        let size = r.dtype.type_size() as usize;
        for (b, (ours, theirs)) in out.chunks(size).zip(r.bytes.chunks(size)).enumerate() {
            assert_eq!(ours, theirs, "{} block {b}", r.dtype);
        }
        seen.push(r.dtype);
    }
    use DType::*;
    for t in [F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0] {
        assert!(seen.contains(&t), "no quantize vectors for {t}");
    }
}

/// llama.cpp tests/test-quantize-fns.cpp `generate_data`.
fn generate_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0.1f64 + (2.0f32 * (i as f32 + offset).cos()) as f64) as f32)
        .collect()
}

/// test-quantize-fns `array_rmse` (which is in fact sqrt(Σd²)/n).
fn array_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
        .sum();
    (sum.sqrt() as f32) / a.len() as f32
}

/// test-quantize-fns `dot_product`: f32 products summed in f64.
fn dot_product(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(&x, &y)| (x * y) as f64).sum::<f64>() as f32
}

fn quantize(dtype: DType, x: &[f32]) -> Vec<u8> {
    let mut q = vec![0u8; row_bytes(dtype, x.len()).unwrap()];
    quantize_row(dtype, x, &mut q).unwrap();
    q
}

fn dequantize(dtype: DType, q: &[u8], n: usize) -> Vec<f32> {
    let mut y = vec![0f32; n];
    dequantize_row(dtype, q, &mut y).unwrap();
    y
}

fn all_types() -> impl Iterator<Item = DType> {
    DType::ALL.into_iter().filter(|t| supports_quantize(*t))
}

#[test]
fn round_trip_and_dot_within_test_quantize_fns_limits() {
    const TEST_SIZE: usize = 32 * 128;
    let data = generate_data(0.0, TEST_SIZE);
    let data2 = generate_data(1.0, TEST_SIZE);
    for dtype in all_types() {
        let q = quantize(dtype, &data);
        let out = dequantize(dtype, &q, TEST_SIZE);
        let err = array_rmse(&data, &out);
        // test-quantize-fns' MAX_QUANTIZATION_TOTAL_ERROR{,_2BITS,_3BITS,_TERNARY,_BINARY,_FP4}.
        let limit = match dtype {
            DType::Q2_K => 0.0075,
            DType::Q3_K => 0.0040,
            DType::TQ1_0 | DType::TQ2_0 | DType::Q2_0 => 0.01,
            DType::Q1_0 => 0.025,
            DType::NVFP4 => 0.0030,
            _ => 0.002,
        };
        assert!(err < limit, "{dtype}: quantization error {err} >= {limit}");

        let Some(dot_type) = vec_dot_type(dtype) else {
            continue;
        };
        let qy = quantize(dot_type, &data2);
        let result = vec_dot(dtype, TEST_SIZE, &q, &qy).unwrap();
        let err = (result - dot_product(&data, &data2)).abs() / TEST_SIZE as f32;
        // MAX_DOT_PRODUCT_ERROR{,_LOWBIT,_TERNARY,_BINARY,_FP4}.
        let limit = match dtype {
            DType::Q2_K => 0.04,
            DType::TQ1_0 | DType::TQ2_0 | DType::Q2_0 => 0.15,
            DType::Q1_0 => 0.40,
            DType::NVFP4 => 0.03,
            _ => 0.02,
        };
        assert!(err < limit, "{dtype}: dot product error {err} >= {limit}");
    }
}

/// Deterministic pseudo-random rows (xorshift) with per-block changes of scale and offset, so
/// blocks of every kind (wide, narrow, offset, signed) show up.
fn varied_row(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut out = Vec::with_capacity(n);
    let mut scale = 1.0;
    let mut offset = 0.0;
    for i in 0..n {
        if i % 32 == 0 {
            scale = 10f64.powf(next() * 4.0 - 2.0);
            offset = if next() < 0.3 {
                (next() - 0.5) * 4.0 * scale
            } else {
                0.0
            };
        }
        out.push(((next() * 2.0 - 1.0) * scale + offset) as f32);
    }
    out
}

/// Σ over blocks of |m| · |s − f16(d)·Σq|: how far ggml's Q8_1 `s` can move a Q4_1/Q5_1 dot.
fn q8_1_sum_rounding(dtype: DType, qx: &[u8], qy: &[u8]) -> f64 {
    let mins: Vec<f32> = match dtype {
        DType::Q4_1 => blocks_from_bytes::<BlockQ4_1>(qx)
            .unwrap()
            .iter()
            .map(|b| b.m.to_f32())
            .collect(),
        DType::Q5_1 => blocks_from_bytes::<BlockQ5_1>(qx)
            .unwrap()
            .iter()
            .map(|b| b.m.to_f32())
            .collect(),
        _ => return 0.0,
    };
    let ys = blocks_from_bytes::<BlockQ8_1>(qy).unwrap();
    mins.iter()
        .zip(ys.iter())
        .map(|(&m, y)| {
            let sum_q: f64 = y.qs.iter().map(|&q| q as f64).sum();
            m.abs() as f64 * (y.s.to_f64() - y.d.to_f64() * sum_q).abs()
        })
        .sum()
}

#[test]
fn vec_dot_equals_f64_dot_of_dequantized_rows() {
    const N: usize = 4096;
    for (seed, (x, y)) in [
        (generate_data(0.0, N), generate_data(1.0, N)),
        (varied_row(N, 1), varied_row(N, 2)),
        (varied_row(N, 3), generate_data(0.5, N)),
    ]
    .into_iter()
    .enumerate()
    {
        for dtype in all_types() {
            let Some(dot_type) = vec_dot_type(dtype) else {
                continue;
            };
            let qx = quantize(dtype, &x);
            let qy = quantize(dot_type, &y);
            let dx = dequantize(dtype, &qx, N);
            let dy = dequantize(dot_type, &qy, N);
            let exact: f64 = dx.iter().zip(&dy).map(|(&a, &b)| a as f64 * b as f64).sum();
            let magnitude: f64 = dx
                .iter()
                .zip(&dy)
                .map(|(&a, &b)| (a as f64 * b as f64).abs())
                .sum();
            let got = vec_dot(dtype, N, &qx, &qy).unwrap() as f64;
            // f32 accumulation over N/32 block terms, each rounded a few times; for Q4_1/Q5_1
            // also ggml's Q8_1 block sum `s`, an f16 of d·Σq rather than the exact Σ of the
            // dequantized values, which the min term multiplies.
            let tol = 4e-6 * magnitude + q8_1_sum_rounding(dtype, &qx, &qy) + 1e-30;
            assert!(
                (got - exact).abs() <= tol,
                "{dtype} (data set {seed}): vec_dot {got} vs f64 {exact}, diff {} > {tol}",
                (got - exact).abs()
            );
        }
    }
}

#[test]
fn q8_activation_quantizers_match_ggml_semantics() {
    let x = varied_row(1024, 7);
    // Q8_1: s is d·Σq rounded to f16, with d the unrounded f32 scale.
    let mut q81 = vec![
        BlockQ8_1 {
            d: half::f16::ZERO,
            s: half::f16::ZERO,
            qs: [0; 32]
        };
        32
    ];
    quantize_row_q8_1(&x, &mut q81);
    for (b, xb) in q81.iter().zip(x.chunks_exact(32)) {
        let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let sum: i32 = b.qs.iter().map(|&q| q as i32).sum();
        assert_eq!(b.s, f32_to_f16(sum as f32 * d));
        assert_eq!(b.d, f32_to_f16(d));
    }
    // Q8_K: bsums are the sums of each 16 quants, d = max/-127 kept as f32, |q| <= 127.
    let mut q8k = vec![bytemuck::Zeroable::zeroed(); 4];
    quantize_row_q8_k(&x, &mut q8k);
    for (b, xb) in q8k.iter().zip(x.chunks_exact(256)) {
        let b: &BlockQ8K = b;
        for (j, s) in b.bsums.iter().enumerate() {
            assert_eq!(
                *s as i32,
                b.qs[16 * j..16 * j + 16]
                    .iter()
                    .map(|&q| q as i32)
                    .sum::<i32>()
            );
        }
        let max = xb
            .iter()
            .copied()
            .fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
        assert_eq!(b.d, 1.0 / (-127.0 / max));
        assert!(b.qs.iter().all(|&q| q >= -127));
    }
    // An all-zero super-block quantizes to an all-zero block.
    let zeros = [0f32; 256];
    let mut z = [bytemuck::Zeroable::zeroed(); 1];
    quantize_row_q8_k(&zeros, &mut z);
    let z: &BlockQ8K = &z[0];
    assert_eq!(bytemuck::bytes_of(z), &[0u8; 292][..]);
}

#[test]
fn dequantize_of_quantize_is_a_fixed_point_for_legacy_types() {
    // Re-quantizing dequantized values must reproduce the levels (the scale may re-round).
    let x = varied_row(2048, 11);
    for dtype in [DType::Q8_0, DType::Q4_0, DType::Q5_0] {
        let q = quantize(dtype, &x);
        let y = dequantize(dtype, &q, x.len());
        let y2 = dequantize(dtype, &quantize(dtype, &y), x.len());
        let err = array_rmse(&y, &y2);
        assert!(err < 1e-6, "{dtype}: {err}");
    }
}

/// Vectors from ggml's C code itself (tests/data/gen_ggml_vectors.py): quantizers the `gguf`
/// package lacks, and the generic dot-product kernels.
const GGML_VECTORS: &[u8] = include_bytes!("data/ggml_vectors.bin");

fn ggml_records() -> Vec<Record> {
    assert_eq!(&GGML_VECTORS[..4], b"LQG1");
    let mut pos = 4;
    let count = read_u32(GGML_VECTORS, &mut pos);
    let mut out = Vec::new();
    for _ in 0..count {
        let kind = read_u32(GGML_VECTORS, &mut pos);
        let dtype = DType::from_id(read_u32(GGML_VECTORS, &mut pos)).unwrap();
        let n = read_u32(GGML_VECTORS, &mut pos) as usize;
        let m = read_u32(GGML_VECTORS, &mut pos) as usize;
        let bytes = GGML_VECTORS[pos..pos + m].to_vec();
        pos += m;
        let n_floats = if kind == 2 { 1 } else { n };
        let floats = GGML_VECTORS[pos..pos + 4 * n_floats]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        pos += 4 * n_floats;
        // Dot records: `bytes` is x then y, `floats` ggml's result.
        out.push(Record {
            kind,
            dtype,
            n,
            bytes,
            floats,
        });
    }
    assert_eq!(pos, GGML_VECTORS.len());
    out
}

#[test]
fn quantize_matches_ggml_c_bit_for_bit() {
    let mut seen = Vec::new();
    for r in ggml_records().into_iter().filter(|r| r.kind == 1) {
        let mut out = vec![0u8; r.bytes.len()];
        quantize_row(r.dtype, &r.floats, &mut out).unwrap();
        let size = r.dtype.type_size() as usize;
        for (b, (ours, theirs)) in out.chunks(size).zip(r.bytes.chunks(size)).enumerate() {
            assert_eq!(ours, theirs, "{} block {b}", r.dtype);
        }
        seen.push(r.dtype);
    }
    use DType::*;
    for t in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ4_NL, IQ4_XS,
    ] {
        assert!(seen.contains(&t), "no ggml quantize vectors for {t}");
    }
}

#[test]
fn vec_dot_matches_ggml_generic_kernels_bit_for_bit() {
    let mut seen = Vec::new();
    for r in ggml_records().into_iter().filter(|r| r.kind == 2) {
        let x_len = row_bytes(r.dtype, r.n).unwrap();
        let (x, y) = r.bytes.split_at(x_len);
        let got = vec_dot(r.dtype, r.n, x, y).unwrap();
        assert_eq!(
            got.to_bits(),
            r.floats[0].to_bits(),
            "{}: ours {got:e}, ggml {:e}",
            r.dtype,
            r.floats[0]
        );
        seen.push(r.dtype);
    }
    use DType::*;
    for t in [
        Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS,
    ] {
        assert!(seen.contains(&t), "no ggml vec_dot vectors for {t}");
    }
}

/// Vectors from llama.cpp 0c1e570 (tests/data/gen_ggml_0c1e570_vectors.py) for the types the
/// older references lack: kind 0 gguf-py dequantization, 1 quantization, 2 generic dot, 3 C
/// dequantization, 4 x86 AVX2 dot (checked by lamina-cpu). Records of types this build does not
/// know are skipped; the coverage lists below say which must be there.
const GGML_0C1E570_VECTORS: &[u8] = include_bytes!("data/ggml_0c1e570_vectors.bin");

fn ggml_0c1e570_records() -> Vec<Record> {
    lqg1_records(GGML_0C1E570_VECTORS)
}

/// Reads an `LQG1` file: kinds 2 and 4 carry one float, kind 5 (a quantizer with importance
/// weights) 2n (the row, then the weights), the others n.
fn lqg1_records(buf: &[u8]) -> Vec<Record> {
    assert_eq!(&buf[..4], b"LQG1");
    let mut pos = 4;
    let count = read_u32(buf, &mut pos);
    let mut out = Vec::new();
    for _ in 0..count {
        let kind = read_u32(buf, &mut pos);
        let id = read_u32(buf, &mut pos);
        let n = read_u32(buf, &mut pos) as usize;
        let m = read_u32(buf, &mut pos) as usize;
        let bytes = buf[pos..pos + m].to_vec();
        pos += m;
        let n_floats = match kind {
            2 | 4 => 1,
            5 => 2 * n,
            _ => n,
        };
        let floats = buf[pos..pos + 4 * n_floats]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        pos += 4 * n_floats;
        if let Ok(dtype) = DType::from_id(id) {
            out.push(Record {
                kind,
                dtype,
                n,
                bytes,
                floats,
            });
        }
    }
    assert_eq!(pos, buf.len());
    out
}

/// The types of this build that ggml_0c1e570_vectors.bin must cover.
const TYPES_0C1E570: &[DType] = &[
    DType::TQ1_0,
    DType::TQ2_0,
    DType::NVFP4,
    DType::Q1_0,
    DType::Q2_0,
];

#[test]
fn new_types_dequantize_like_gguf_py_and_ggml_c() {
    let mut seen = Vec::new();
    for r in ggml_0c1e570_records()
        .into_iter()
        .filter(|r| r.kind == 0 || r.kind == 3)
    {
        let mut out = vec![0f32; r.n];
        dequantize_row(r.dtype, &r.bytes, &mut out).unwrap();
        for (i, (a, b)) in out.iter().zip(&r.floats).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{} (kind {}) element {i}: ours {a:e}, reference {b:e}",
                r.dtype,
                r.kind
            );
        }
        seen.push((r.kind, r.dtype));
    }
    for &t in TYPES_0C1E570 {
        assert!(
            seen.contains(&(3, t)),
            "no ggml C dequantize vectors for {t}"
        );
    }
    for t in [DType::TQ1_0, DType::TQ2_0] {
        assert!(
            seen.contains(&(0, t)),
            "no gguf-py dequantize vectors for {t}"
        );
    }
}

#[test]
fn new_types_quantize_like_ggml_c() {
    let mut seen = Vec::new();
    for r in ggml_0c1e570_records().into_iter().filter(|r| r.kind == 1) {
        let mut out = vec![0u8; r.bytes.len()];
        quantize_row(r.dtype, &r.floats, &mut out).unwrap();
        let size = r.dtype.type_size() as usize;
        for (b, (ours, theirs)) in out.chunks(size).zip(r.bytes.chunks(size)).enumerate() {
            assert_eq!(ours, theirs, "{} block {b}", r.dtype);
        }
        seen.push(r.dtype);
    }
    for &t in TYPES_0C1E570 {
        assert!(seen.contains(&t), "no ggml quantize vectors for {t}");
    }
}

#[test]
fn new_types_vec_dot_like_ggml_generic() {
    let mut seen = Vec::new();
    for r in ggml_0c1e570_records().into_iter().filter(|r| r.kind == 2) {
        let x_len = row_bytes(r.dtype, r.n).unwrap();
        let (x, y) = r.bytes.split_at(x_len);
        let got = vec_dot(r.dtype, r.n, x, y).unwrap();
        assert_eq!(
            got.to_bits(),
            r.floats[0].to_bits(),
            "{}: ours {got:e}, ggml {:e}",
            r.dtype,
            r.floats[0]
        );
        seen.push(r.dtype);
    }
    for &t in TYPES_0C1E570 {
        assert!(seen.contains(&t), "no ggml vec_dot vectors for {t}");
    }
}

/// Vectors for the grid i-quants from llama.cpp 0c1e570
/// (tests/data/gen_ggml_0c1e570_iq_vectors.py): kinds as above, plus 1 = `quantize_iq3_*`
/// without weights and 5 = `quantize_iq*` with importance weights.
const GGML_0C1E570_IQ_VECTORS: &[u8] = include_bytes!("data/ggml_0c1e570_iq_vectors.bin");

const IQ_TYPES: &[DType] = &[
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ1_S,
    DType::IQ1_M,
];

#[test]
fn iq_types_dequantize_like_gguf_py_and_ggml_c() {
    let mut seen = Vec::new();
    for r in lqg1_records(GGML_0C1E570_IQ_VECTORS)
        .into_iter()
        .filter(|r| r.kind == 0 || r.kind == 3)
    {
        let mut out = vec![0f32; r.n];
        dequantize_row(r.dtype, &r.bytes, &mut out).unwrap();
        for (i, (a, b)) in out.iter().zip(&r.floats).enumerate() {
            assert_eq!(
                a.to_bits(),
                b.to_bits(),
                "{} (kind {}) element {i}: ours {a:e}, reference {b:e}",
                r.dtype,
                r.kind
            );
        }
        seen.push((r.kind, r.dtype));
    }
    for &t in IQ_TYPES {
        assert!(
            seen.contains(&(3, t)),
            "no ggml C dequantize vectors for {t}"
        );
        assert!(
            seen.contains(&(0, t)),
            "no gguf-py dequantize vectors for {t}"
        );
    }
}

#[test]
fn iq_types_vec_dot_like_ggml_generic() {
    let mut seen = Vec::new();
    for r in lqg1_records(GGML_0C1E570_IQ_VECTORS)
        .into_iter()
        .filter(|r| r.kind == 2)
    {
        let x_len = row_bytes(r.dtype, r.n).unwrap();
        let (x, y) = r.bytes.split_at(x_len);
        let got = vec_dot(r.dtype, r.n, x, y).unwrap();
        assert_eq!(
            got.to_bits(),
            r.floats[0].to_bits(),
            "{}: ours {got:e}, ggml {:e}",
            r.dtype,
            r.floats[0]
        );
        seen.push(r.dtype);
    }
    for &t in IQ_TYPES {
        assert!(seen.contains(&t), "no ggml vec_dot vectors for {t}");
    }
}

/// ggml's `quantize_iq*` on one row of `r` (kind 1: no weights, kind 5: with weights).
fn quantize_iq_weighted(r: &Record) -> Option<Vec<u8>> {
    let n = r.n;
    let (x, qw) = match r.kind {
        1 => (&r.floats[..], None),
        5 => (&r.floats[..n], Some(&r.floats[n..])),
        _ => return None,
    };
    let mut out = vec![0u8; r.bytes.len()];
    macro_rules! run {
        ($b:ty, $f:path) => {{
            let mut blocks = vec![<$b as bytemuck::Zeroable>::zeroed(); n / 256];
            $f(x, &mut blocks, qw);
            out.copy_from_slice(bytemuck::cast_slice(&blocks));
        }};
    }
    match r.dtype {
        DType::IQ3_S => run!(BlockIQ3S, quantize_row_iq3_s_weighted),
        DType::IQ3_XXS => run!(BlockIQ3XXS, quantize_row_iq3_xxs_weighted),
        DType::IQ2_XXS => run!(BlockIQ2XXS, quantize_row_iq2_xxs_weighted),
        DType::IQ2_XS => run!(BlockIQ2XS, quantize_row_iq2_xs_weighted),
        DType::IQ2_S => run!(BlockIQ2S, quantize_row_iq2_s_weighted),
        DType::IQ1_S => run!(BlockIQ1S, quantize_row_iq1_s_weighted),
        DType::IQ1_M => run!(BlockIQ1M, quantize_row_iq1_m_weighted),
        _ => return None,
    }
    Some(out)
}

#[test]
fn iq_types_quantize_like_ggml_c() {
    let mut seen = Vec::new();
    for r in lqg1_records(GGML_0C1E570_IQ_VECTORS) {
        let Some(out) = quantize_iq_weighted(&r) else {
            continue;
        };
        let size = r.dtype.type_size() as usize;
        for (b, (ours, theirs)) in out.chunks(size).zip(r.bytes.chunks(size)).enumerate() {
            assert_eq!(
                ours, theirs,
                "{} (kind {}, n {}) block {b}",
                r.dtype, r.kind, r.n
            );
        }
        seen.push((r.kind, r.dtype));
    }
    // IQ2_XXS, IQ2_XS and IQ1_S need importance weights in ggml; the others also run without.
    for &t in IQ_TYPES {
        assert!(
            seen.contains(&(5, t)),
            "no weighted quantize vectors for {t}"
        );
    }
    for t in [DType::IQ3_S, DType::IQ3_XXS, DType::IQ2_S, DType::IQ1_M] {
        assert!(
            seen.contains(&(1, t)),
            "no unweighted quantize vectors for {t}"
        );
    }
}
