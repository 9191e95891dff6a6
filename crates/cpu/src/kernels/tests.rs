//! SIMD paths against their scalar emulations: bit-identical on random data.

use lamina_core::DType;

use super::*;

/// xorshift64*: deterministic test data without dependencies.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn f32(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.f32() * scale).collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    /// A value in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    /// A finite f16 of magnitude ~`scale`.
    fn f16(&mut self, scale: f32) -> [u8; 2] {
        fp32_to_fp16(self.f32() * scale).to_le_bytes()
    }
}

/// Random weight blocks of `dtype` with finite scales.
fn random_weights(rng: &mut Rng, dtype: DType, nblocks: usize) -> Vec<u8> {
    let bs = dtype.type_size() as usize;
    let mut w = rng.bytes(bs * nblocks);
    for (n, b) in w.chunks_exact_mut(bs).enumerate() {
        if dtype == DType::MXFP4 && n % 3 == 0 {
            // The E8M0 scales below 2 (a subnormal half) and around them, every third block.
            b[0] = (n / 3 % 4) as u8;
        }
        let offs: &[usize] = match dtype {
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::IQ4_XS => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q2_K => &[80, 82],
            DType::Q6_K => &[208],
            DType::Q3_K => &[108],
            DType::TQ1_0 => &[52],
            DType::TQ2_0 => &[64],
            DType::Q1_0 | DType::Q2_0 => &[0],
            DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ2_S
            | DType::IQ3_XXS
            | DType::IQ3_S
            | DType::IQ1_S => &[0],
            _ => &[],
        };
        for &o in offs {
            let h = rng.f16(0.05);
            b[o..o + 2].copy_from_slice(&h);
        }
        if dtype == DType::IQ1_M {
            // The f16 scale lives in the top nibbles of the four scale words (bytes 48..56).
            let h = u16::from_le_bytes(rng.f16(0.05));
            for k in 0..4 {
                let nib = ((h >> (4 * k)) & 0xf) as u8;
                b[49 + 2 * k] = (b[49 + 2 * k] & 0x0f) | (nib << 4);
            }
        }
        if dtype == DType::MXFP4 {
            // An E8M0 scale around 2^-5 (random bytes would overflow).
            b[0] = 118 + b[0] % 8;
        }
    }
    w
}

fn activations(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    let x = rng.vec(n, 3.0);
    match lamina_core::quant::vec_dot_type(dtype).unwrap() {
        DType::Q8_0 => {
            let mut o = vec![0u8; n / 32 * 34];
            quantize_row_q8_0(&x, &mut o);
            o
        }
        DType::Q8_1 => {
            let mut o = vec![0u8; n / 32 * 36];
            quantize_row_q8_1(&x, &mut o);
            o
        }
        DType::Q8_K => {
            let mut o = vec![0u8; n / 256 * 292];
            quantize_row_q8_k(&x, &mut o);
            o
        }
        t => panic!("unexpected {t}"),
    }
}

#[test]
fn quantizers_simd_match_scalar() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for nb in [1usize, 2, 3, 7, 24, 49] {
        for scale in [1e-3f32, 1.0, 50.0] {
            let mut x = rng.vec(32 * nb, scale);
            // exact halves exercise round-half-to-even
            x[0] = 0.0;
            if nb > 1 {
                x[32..64].iter_mut().for_each(|v| *v = 0.0);
            }
            let mut a = vec![0u8; nb * 34];
            let mut b = vec![0u8; nb * 34];
            quantize_row_q8_0(&x, &mut a);
            quantize::quantize_row_q8_0_scalar(&x, &mut b);
            assert_eq!(a, b, "q8_0 nb={nb}");
            let mut a = vec![0u8; nb * 36];
            let mut b = vec![0u8; nb * 36];
            quantize_row_q8_1(&x, &mut a);
            quantize::quantize_row_q8_1_scalar(&x, &mut b);
            assert_eq!(a, b, "q8_1 nb={nb}");
        }
    }
}

/// The Q8_K quantizers (plain and the repacked kernels' 4x8 variant) against their scalar
/// scans, including ties for the largest magnitude, zero blocks and NaNs.
#[test]
fn q8_k_quantizers_simd_match_scalar() {
    let mut rng = Rng(0x0dd_ba11_cafe_f00d);
    for case in 0..8 {
        let mut x = rng.vec(3 * 256, 4.0);
        match case {
            // The largest magnitude twice, negative first.
            1 => {
                x[10] = -9.0;
                x[200] = 9.0;
            }
            // Positive first.
            2 => {
                x[3] = 9.0;
                x[77] = -9.0;
            }
            // A zero block.
            3 => x[256..512].iter_mut().for_each(|v| *v = 0.0),
            // NaNs at the start, in the middle and at the end of a block.
            4 => {
                x[0] = f32::NAN;
                x[300] = f32::NAN;
                x[767] = f32::NAN;
            }
            // A NaN after the largest magnitude.
            5 => {
                x[5] = 11.0;
                x[6] = f32::NAN;
            }
            // Infinities (a scale of 0 or -0: inf · 0 is NaN) and subnormals.
            6 => {
                x[9] = f32::INFINITY;
                x[300] = f32::NEG_INFINITY;
                x[600] = 1e-40;
            }
            // Halfway products (scale ±1: ties round to even), both signs.
            7 => {
                for (i, v) in x.iter_mut().enumerate() {
                    *v = (i % 100) as f32 - 49.5;
                }
                x[0] = 127.0;
                x[256] = -127.0;
                x[512] = 127.0;
                x[513] = -127.0;
            }
            _ => {}
        }
        let mut a = vec![0u8; 3 * 292];
        let mut b = vec![0u8; 3 * 292];
        quantize::quantize_row_q8_k(&x, &mut a);
        quantize::quantize_row_q8_k_scalar(&x, &mut b);
        assert_eq!(a, b, "q8_k case {case}");
        (super::table().convert_q8_k_4x8())(&x, &mut a);
        super::repack::quantize_row_q8_k_4x8(&x, &mut b);
        assert_eq!(a, b, "q8_k 4x8 case {case}");
    }
}

#[test]
fn dots_simd_match_scalar() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let quantized = crate::MATMUL_WEIGHT_TYPES
        .into_iter()
        .filter(|t| t.is_quantized());
    for dtype in quantized {
        let qk = dtype.block_size() as usize;
        for nb in [1usize, 2, 3, 5, 8, 17] {
            let n = nb * qk;
            for _ in 0..8 {
                let w = random_weights(&mut rng, dtype, nb);
                let y = activations(&mut rng, dtype, n);
                let s = vec_dot_scalar(dtype, n, &w, &y).unwrap();
                let v = vec_dot(dtype, n, &w, &y).unwrap();
                assert_eq!(s.to_bits(), v.to_bits(), "{dtype} nb={nb}: {s} vs {v}");
                let r = lamina_core::quant::vec_dot(dtype, n, &w, &y).unwrap();
                assert!(
                    (r - s).abs() <= 1e-3 * (1.0 + r.abs()),
                    "{dtype} nb={nb}: reference {r} vs {s}"
                );
            }
        }
    }
}

#[test]
fn float_dots_simd_match_scalar() {
    let mut rng = Rng(7);
    for n in [1usize, 7, 8, 31, 32, 33, 64, 100, 257] {
        let a = rng.vec(n, 2.0);
        let b = rng.vec(n, 2.0);
        let ah: Vec<u8> = a
            .iter()
            .flat_map(|v| fp32_to_fp16(*v).to_le_bytes())
            .collect();
        let bh: Vec<u8> = b
            .iter()
            .flat_map(|v| fp32_to_fp16(*v).to_le_bytes())
            .collect();
        let eq = |x: f32, y: f32, what: &str| assert_eq!(x.to_bits(), y.to_bits(), "{what} n={n}");
        eq(
            vec_dot_f32(n, &a, &b),
            fdot::vec_dot_f32_scalar(n, &a, &b),
            "vec_dot_f32",
        );
        eq(
            vec_dot_f16(n, &ah, &bh),
            fdot::vec_dot_f16_scalar(n, &ah, &bh),
            "vec_dot_f16",
        );
        #[cfg(target_arch = "x86_64")]
        if super::simd_available() {
            // The query-widened form flash attention's decode rows use.
            let bf: Vec<f32> = (0..n).map(|i| fdot::f16s(&bh, i)).collect();
            // SAFETY: AVX2/FMA/F16C present; `ah` holds n f16 values, `bf` n values.
            let got = unsafe { super::x86::avx2::fdot::vec_dot_f16(n, &ah, &bf[..]) };
            eq(
                got,
                fdot::vec_dot_f16_scalar(n, &ah, &bh),
                "vec_dot_f16, f32 query",
            );
        }
        let k = n / 8 * 8;
        eq(
            tinyblas_dot_f32(k, &a, &b),
            fdot::tinyblas_dot_f32_scalar(k, &a, &b),
            "tb f32",
        );
        eq(
            tinyblas_dot_f16(k, &ah, &bh),
            fdot::tinyblas_dot_f16_scalar(k, &ah, &bh),
            "tb f16",
        );
    }
}

#[test]
fn activations_simd_match_scalar() {
    let mut rng = Rng(99);
    for n in [1usize, 5, 8, 13, 64, 67, 576] {
        for scale in [1.0f32, 20.0, 150.0] {
            let x = rng.vec(n, scale);
            let g = rng.vec(n, 1.0);
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            silu_row(&x, &mut a);
            act::scalar::silu_row(&x, &mut b);
            assert_eq!(bits(&a), bits(&b), "silu n={n}");
            swiglu_row(&x, &g, &mut a);
            act::scalar::swiglu_row(&x, &g, &mut b);
            assert_eq!(bits(&a), bits(&b), "swiglu n={n}");
            // GeGLU, with the cut-offs and a NaN in reach.
            let mut xe = x.clone();
            for (i, v) in xe.iter_mut().enumerate() {
                match i % 11 {
                    3 => *v = -10.0,
                    5 => *v = 10.0,
                    7 if i % 2 == 1 => *v = f32::NAN,
                    _ => {}
                }
            }
            geglu_row(&xe, &g, &mut a);
            act::scalar::geglu_row(&xe, &g, &mut b);
            assert_eq!(bits(&a), bits(&b), "geglu n={n}");
            let mask: Vec<f32> = (0..n)
                .map(|i| if i % 5 == 4 { f32::NEG_INFINITY } else { 0.0 })
                .collect();
            softmax_row(&x, 0.125, Some(&mask), 1.0, &mut a);
            act::scalar::softmax_row(&x, 0.125, Some(&mask), 1.0, &mut b);
            assert_eq!(bits(&a), bits(&b), "softmax n={n}");
        }
    }
}

/// The vector maximum in `softmax_row` against the scalar scan: maxima of +0 and -0 in
/// either order, NaNs (where the scan's order decides), infinities, fully masked rows, and
/// lengths off the 8-lane grid.
#[test]
fn softmax_maximum_cases_match_scalar() {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    let mut rng = Rng(0x50f7_3a11_0000_0001);
    for n in [1usize, 7, 8, 9, 33, 100] {
        for case in 0..6 {
            let mut x: Vec<f32> = rng.vec(n, 2.0).iter().map(|v| -v.abs()).collect();
            let mut mask = vec![0f32; n];
            match case {
                1 => {
                    x[n / 2] = -0.0;
                    x[n - 1] = 0.0;
                }
                2 => {
                    x[0] = 0.0;
                    x[n - 1] = -0.0;
                }
                3 => x[n / 3] = f32::NAN,
                4 => x[n - 1] = f32::INFINITY,
                5 => mask.fill(f32::NEG_INFINITY),
                _ => {}
            }
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            softmax_row(&x, 1.0, Some(&mask), 1.0, &mut a);
            act::scalar::softmax_row(&x, 1.0, Some(&mask), 1.0, &mut b);
            assert_eq!(bits(&a), bits(&b), "softmax n={n} case {case}");
        }
    }
}

/// `unmasked_span` against its definition: causal and sliding-window rows, holes, fully
/// hidden rows, NaNs (not hidden), lengths off the 8-lane grid.
#[test]
fn unmasked_span_matches_its_definition() {
    let mut rng = Rng(0x5ba0_0000_0000_0002);
    for n in [0usize, 1, 7, 8, 9, 16, 31, 64, 100] {
        for case in 0..40 {
            let (a, b) = (rng.below(n + 1), rng.below(n + 1));
            let (a, b) = (a.min(b), a.max(b));
            let mut row: Vec<f32> = (0..n)
                .map(|i| {
                    if (a..b).contains(&i) {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            if case % 3 == 1 && b > a + 2 {
                row[a + 1] = f32::NEG_INFINITY; // a hole inside the span
            }
            if case % 7 == 2 && n > 0 {
                let i = rng.below(n);
                row[i] = f32::NAN;
            }
            let first = row.iter().position(|&v| v != f32::NEG_INFINITY);
            let last = row.iter().rposition(|&v| v != f32::NEG_INFINITY);
            let want = first.zip(last).map(|(f, l)| (f, l + 1));
            assert_eq!(
                super::unmasked_span(&row),
                want,
                "n={n} case {case}: {row:?}"
            );
        }
    }
}

#[test]
fn v_expf_lane_is_accurate() {
    for i in -1600..1700 {
        let x = i as f32 * 0.05;
        let e = act::v_expf_lane(x);
        let r = (f64::from(x)).exp();
        assert!(((f64::from(e) - r) / r).abs() < 1e-6, "{x}: {e} vs {r}");
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// `MatMul::dot_tile` (register-blocked SIMD tiles) and the SIMD activation converters against
/// the scalar emulation, bit for bit, for every plan a weight type can get (batch sizes that
/// select vec_dot, tinyBLAS, repacked gemv/gemm and the tiled K-quant path), random weight
/// bytes (every nibble, byte and scale pattern) and tiles of every shape and offset.
#[test]
fn tiles_match_scalar() {
    let mut rng = Rng(0x5151_7e57_0bad_cafe);
    // Every kernel tier this CPU has.
    let isas: Vec<Isa> = super::available_isas();
    // Every weight type with an exact kernel (BF16 has none).
    let types: Vec<DType> = crate::MATMUL_WEIGHT_TYPES
        .into_iter()
        .filter(|&t| t != DType::BF16)
        .collect();
    // 32-value blocks also at 20 blocks a row (Gemma 3's k = 640) and at 41: past the
    // kernels' 32-block scale chunks and tables (64 × 30: the rows-in-lanes tiles decode
    // each group again per chunk of 24 activation rows).
    let cases = types.into_iter().flat_map(|dtype| {
        let qk = dtype.block_size() as usize;
        let k = if qk == 1 { 72 } else { 3 * qk.max(32) };
        let more = if qk == 32 {
            &[20 * 32, 41 * 32][..]
        } else {
            &[]
        };
        std::iter::once((dtype, k.next_multiple_of(qk)))
            .chain(more.iter().map(move |&k| (dtype, k)))
    });
    for (dtype, k) in cases {
        let qk = dtype.block_size() as usize;
        let wrow = dtype.row_size(k as u64).unwrap() as usize;
        for (m, n) in [
            (8usize, 1usize),
            (12, 1),
            (16, 2),
            (8, 4),
            (16, 5),
            (9, 8),
            (8, 11),
            (8, 70),
            (36, 70),
            (64, 18),
            (64, 30),
            (64, 3),
            (40, 1),
        ] {
            let plan = matmul::MatMul::plan(super::table(), dtype, m, n, k, true, true).unwrap();
            let w = match dtype {
                DType::F16 => rng
                    .vec(k * m, 1.0)
                    .iter()
                    .flat_map(|v| fp32_to_fp16(*v).to_le_bytes())
                    .collect(),
                DType::F32 => rng
                    .vec(k * m, 1.0)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect(),
                _ => random_weights(&mut rng, dtype, k / qk * m),
            };
            assert_eq!(w.len(), wrow * m);
            let arow = plan.act_row_bytes(k).unwrap();
            // 4-aligned storage (f32 activation rows are read as f32).
            let mut abuf = vec![0u32; (arow * n).div_ceil(4)];
            // SAFETY: u32 storage viewed as bytes.
            let acts =
                unsafe { std::slice::from_raw_parts_mut(abuf.as_mut_ptr() as *mut u8, arow * n) };
            let mut scalar_act = vec![0u8; arow];
            for j in 0..n {
                let x = rng.vec(k, 3.0);
                let a = &mut acts[j * arow..(j + 1) * arow];
                plan.convert_act(j, &x, a);
                plan.convert_act_scalar(j, &x, &mut scalar_act);
                assert_eq!(
                    a,
                    &scalar_act[..],
                    "{dtype} m={m} n={n}: activation row {j}"
                );
            }
            let wr: Vec<&[u8]> = w.chunks_exact(wrow).collect();
            let ar: Vec<&[u8]> = acts.chunks_exact(arow).collect();
            // Every small tile, a weight-row group against all the activation rows, and all
            // the weight rows against them (what `mul_mat` hands the wide kernels: up to
            // `weight_rows_per_call` weight rows, here 64, and 70 activation rows; and a
            // decode step: 64 weight rows, 1 to 4 activation rows).
            let tiles = (1..=m.min(8))
                .flat_map(|rm| (1..=n.min(4)).map(move |rn| (rm, rn)))
                .chain([(m.min(8), n)])
                .chain((m > 8).then_some((m, n)));
            for (rm, rn) in tiles {
                {
                    for (i0, j0) in [(0, 0), (m - rm, n - rn)] {
                        let mut out = vec![0f32; rm * rn];
                        for isa in isas.iter().copied() {
                            plan.dot_tile_at(
                                isa,
                                k,
                                &wr[i0..i0 + rm],
                                &ar[j0..j0 + rn],
                                j0,
                                &mut out,
                            );
                            for i in 0..rm {
                                for j in 0..rn {
                                    let s = plan.dot_scalar(k, wr[i0 + i], ar[j0 + j], j0 + j);
                                    let v = out[j * rm + i];
                                    let d = plan.dot(k, wr[i0 + i], ar[j0 + j], j0 + j);
                                    assert_eq!(
                                        (v.to_bits(), d.to_bits()),
                                        (s.to_bits(), s.to_bits()),
                                        "{dtype} m={m} n={n} {isa:?} tile {rm}x{rn} at ({i0},{j0}) \
                                     output ({i},{j}): tile {v:e}, dot {d:e}, scalar {s:e}"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// Trimming the zero tail of tinyBLAS activation rows (causal attention weights) changes no
/// output bit: rows with ragged tails of +0 and -0, weights of both signs, every tier.
#[test]
fn trimmed_zero_tails_keep_every_bit() {
    let mut rng = Rng(0x7a11_5eed_0123_4567);
    let isas: Vec<Isa> = super::available_isas();
    for dtype in [DType::F16, DType::F32] {
        let (m, n, k) = (8usize, 11usize, 96usize);
        let plan = matmul::MatMul::plan(super::table(), dtype, m, n, k, true, true).unwrap();
        let w: Vec<u8> = match dtype {
            DType::F16 => rng
                .vec(k * m, 1.0)
                .iter()
                .flat_map(|v| fp32_to_fp16(*v).to_le_bytes())
                .collect(),
            _ => rng
                .vec(k * m, 1.0)
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
        };
        let arow = plan.act_row_bytes(k).unwrap();
        let mut abuf = vec![0u32; (arow * n).div_ceil(4)];
        // SAFETY: u32 storage viewed as bytes.
        let acts =
            unsafe { std::slice::from_raw_parts_mut(abuf.as_mut_ptr() as *mut u8, arow * n) };
        for j in 0..n {
            // Row j keeps 8j + 3 values (at most k); the rest alternate +0 and -0.
            let mut x = rng.vec(k, 3.0);
            for (i, v) in x.iter_mut().enumerate().skip(8 * j + 3) {
                *v = if i % 2 == 0 { 0.0 } else { -0.0 };
            }
            plan.convert_act(j, &x, &mut acts[j * arow..(j + 1) * arow]);
        }
        let wr: Vec<&[u8]> = w.chunks_exact(w.len() / m).collect();
        let ar: Vec<&[u8]> = acts.chunks_exact(arow).collect();
        for j0 in (0..n).step_by(4) {
            let rn = 4.min(n - j0);
            let kt = plan.trimmed_k(k, &ar[j0..j0 + rn]);
            let last = j0 + rn - 1;
            assert_eq!(
                kt,
                (8 * last + 3).min(k).next_multiple_of(8).min(k),
                "{dtype} rows {j0}.."
            );
            for isa in isas.iter().copied() {
                let mut full = vec![0f32; m * rn];
                let mut trimmed = vec![0f32; m * rn];
                plan.dot_tile_at(isa, k, &wr, &ar[j0..j0 + rn], j0, &mut full);
                plan.dot_tile_at(isa, kt, &wr, &ar[j0..j0 + rn], j0, &mut trimmed);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&full), bits(&trimmed), "{dtype} {isa:?} rows {j0}..");
            }
        }
    }
}

/// tinyBLAS f16/f32 tiles over long rows (attention over thousands of cells), many
/// activation rows and odd activation and weight row counts (the AVX-512 tiles pair
/// activation rows and take weight rows in fours): every output bit-identical to the scalar
/// emulation, on every tier, and with both AVX-512 float tiles where the CPU has AVX-512.
#[test]
fn long_float_tiles_match_scalar() {
    let mut rng = Rng(0x10f7_11e5_c0de_0042);
    let isas: Vec<Isa> = super::available_isas();
    for dtype in [DType::F16, DType::F32] {
        #[cfg(target_arch = "x86_64")]
        let mut direct = 0;
        for (m, n, k) in [(8usize, 62usize, 640usize), (7, 9, 4104), (5, 3, 1032)] {
            let plan = matmul::MatMul::plan(super::table(), dtype, m, n, k, true, true).unwrap();
            let vals = rng.vec(k * m, 1.0);
            let w: Vec<u8> = match dtype {
                DType::F16 => vals
                    .iter()
                    .flat_map(|v| fp32_to_fp16(*v).to_le_bytes())
                    .collect(),
                _ => vals.iter().flat_map(|v| v.to_le_bytes()).collect(),
            };
            let arow = plan.act_row_bytes(k).unwrap();
            let mut abuf = vec![0u32; (arow * n).div_ceil(4)];
            // SAFETY: u32 storage viewed as bytes.
            let acts =
                unsafe { std::slice::from_raw_parts_mut(abuf.as_mut_ptr() as *mut u8, arow * n) };
            for j in 0..n {
                plan.convert_act(j, &rng.vec(k, 3.0), &mut acts[j * arow..(j + 1) * arow]);
            }
            let wr: Vec<&[u8]> = w.chunks_exact(w.len() / m).collect();
            let ar: Vec<&[u8]> = acts.chunks_exact(arow).collect();
            let check = |out: &[f32], what: &str| {
                for i in 0..m {
                    for j in 0..n {
                        let s = plan.dot_scalar(k, wr[i], ar[j], j);
                        assert_eq!(
                            out[j * m + i].to_bits(),
                            s.to_bits(),
                            "{dtype} {m}x{n} k={k} {what} output ({i},{j})"
                        );
                    }
                }
            };
            for isa in isas.iter().copied() {
                let mut out = vec![0f32; m * n];
                plan.dot_tile_at(isa, k, &wr, &ar, 0, &mut out);
                check(&out, &format!("{isa:?}"));
            }
            // Both AVX-512 float tiles, whichever this core's tier takes (`splits_512`).
            #[cfg(target_arch = "x86_64")]
            if isas.contains(&Isa::Avx512) && plan.is_tinyblas() {
                use crate::kernels::x86::avx512::tile::{ftiny_tiles, ftiny_ymm_tiles};
                let nb = k / 8;
                for ymm in [false, true] {
                    let mut out = vec![0f32; m * n];
                    // SAFETY: AVX-512 present (the tier is available); rows hold `k / 8`
                    // groups of 8 values.
                    unsafe {
                        match (dtype, ymm) {
                            (DType::F16, false) => ftiny_tiles::<0>(nb, &wr, &ar, &mut out),
                            (DType::F16, true) => ftiny_ymm_tiles::<0>(nb, &wr, &ar, &mut out),
                            (_, false) => ftiny_tiles::<1>(nb, &wr, &ar, &mut out),
                            (_, true) => ftiny_ymm_tiles::<1>(nb, &wr, &ar, &mut out),
                        }
                    }
                    check(
                        &out,
                        if ymm {
                            "ftiny_ymm_tiles"
                        } else {
                            "ftiny_tiles"
                        },
                    );
                }
                direct += 1;
            }
        }
        #[cfg(target_arch = "x86_64")]
        if isas.contains(&Isa::Avx512) {
            assert!(direct > 0, "{dtype}: no case took tinyBLAS");
        }
    }
}

/// Softmax skips the exp of whole masked groups at the end of a row (writing +0): exact only
/// because exp(-inf) is +0 in both the scalar and the SIMD exp, which a masked group in the
/// middle of a row (not skipped) shows. A row with every value masked stays NaN, as in
/// llama.cpp.
#[test]
fn softmax_masked_groups_are_exact_zeros() {
    assert_eq!(act::v_expf_lane(f32::NEG_INFINITY).to_bits(), 0);
    let mut rng = Rng(7);
    let x = rng.vec(40, 4.0);
    // Masked: 8..16 (middle, computed) and 24..40 (tail, skipped), plus 3 (a lone one).
    let mask: Vec<f32> = (0..40)
        .map(|i| {
            if (8..16).contains(&i) || i >= 24 || i == 3 {
                f32::NEG_INFINITY
            } else {
                0.0
            }
        })
        .collect();
    let (mut a, mut b) = (vec![0f32; 40], vec![0f32; 40]);
    softmax_row(&x, 0.5, Some(&mask), 1.0, &mut a);
    act::scalar::softmax_row(&x, 0.5, Some(&mask), 1.0, &mut b);
    assert_eq!(bits(&a), bits(&b));
    for i in (8..16).chain(24..40).chain([3]) {
        assert_eq!(a[i].to_bits(), 0, "output {i}");
    }
    let total: f32 = a.iter().sum();
    assert!((total - 1.0).abs() < 1e-6);
    let all = vec![f32::NEG_INFINITY; 16];
    softmax_row(&x[..16], 1.0, Some(&all), 1.0, &mut a[..16]);
    assert!(a[..16].iter().all(|v| v.is_nan()));
}

/// Every quantized type's geometry as its dot kernels read it: weight block bytes, the bytes
/// of the activation blocks facing one weight block, values per weight block.
#[test]
fn geometry_of_every_dot_type() {
    use super::table::geometry;
    let want = [
        (DType::Q4_0, (18, 34, 32)),
        (DType::Q4_1, (20, 36, 32)),
        (DType::Q8_0, (34, 34, 32)),
        (DType::MXFP4, (17, 34, 32)),
        (DType::NVFP4, (36, 68, 64)),
        (DType::Q1_0, (18, 136, 128)),
        (DType::Q2_0, (18, 68, 64)),
        (DType::Q4_K, (144, 292, 256)),
        (DType::IQ2_XXS, (66, 292, 256)),
        (DType::TQ1_0, (54, 292, 256)),
    ];
    for (t, g) in want {
        assert_eq!(geometry(t), Some(g), "{t}");
    }
    assert_eq!(geometry(DType::Q8_K), None);
}

/// Flash attention's mask conversion and row maximum: the vector versions against the scalar
/// ones, on rows of ±0, ±inf, NaN, values that round to f16 and values past its range.
#[test]
fn mask_rows_and_row_max_match_scalar() {
    use super::fattn::{mask_row_f16, mask_row_f16_scalar, row_max, row_max_scalar};
    let mut rng = Rng(0x3a5c_0ffe_e123_4567);
    let specials = [
        0.0,
        -0.0,
        f32::NEG_INFINITY,
        f32::INFINITY,
        1e6,
        -7e4,
        65519.0,
        1e-8,
    ];
    for case in 0..2000 {
        let n = [8, 16, 64, 13, 71][case % 5];
        let row: Vec<f32> = (0..n)
            .map(|_| {
                let r = rng.next();
                match r % 7 {
                    0 => specials[(r >> 8) as usize % specials.len()],
                    1 if case % 9 == 0 => f32::NAN,
                    _ => {
                        (((r >> 16) as u32 as f32) / 2f32.powi(31) - 1.0)
                            * [1.0, 100.0, 1e-3][case % 3]
                    }
                }
            })
            .collect();
        let row = if case % 4 == 0 {
            vec![f32::NEG_INFINITY; n]
        } else {
            row
        };
        let slope = [1.0, 0.5, -2.0][case % 3];
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        let fa = mask_row_f16(&row, slope, &mut a);
        let fb = mask_row_f16_scalar(&row, slope, &mut b);
        assert_eq!(fa, fb, "case {case}");
        for (x, y) in a.iter().zip(&b) {
            assert!(
                x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan()),
                "case {case}"
            );
        }
        let (ma, mb) = (row_max(&row), row_max_scalar(&row));
        assert!(
            ma.to_bits() == mb.to_bits() || (ma.is_nan() && mb.is_nan()),
            "case {case}"
        );
    }
}

/// `fattn::transpose_into` against its definition: every row count, lengths on and off the
/// 8-value grid, columns at any offset of a wider destination.
#[test]
fn transpose_into_matches_its_definition() {
    let mut rng = Rng(0x7a05_e000_0000_0003);
    for n in [0usize, 1, 5, 8, 16, 64, 67, 256] {
        for g in 1..=8 {
            for col0 in [0usize, 3, 8] {
                let stride = 16;
                let src = rng.vec(g * n, 2.0);
                let mut dst = rng.vec(n * stride + 8, 1.0);
                let mut want = dst.clone();
                for e in 0..n {
                    for r in 0..g {
                        want[e * stride + col0 + r] = src[r * n + e];
                    }
                }
                super::fattn::transpose_into(&src, g, n, &mut dst, stride, col0);
                assert_eq!(bits(&dst), bits(&want), "n={n} g={g} col0={col0}");
            }
        }
    }
}

/// `fattn::f16_rows_online` against `_one_chunk`'s scalar steps, one head at a time: 1 to 4
/// heads sharing the K and V rows, every head size it takes, cells out of order with gaps,
/// per-head slopes, masks of 0, -inf-free finite values, and scores whose maximum moves.
#[test]
fn f16_rows_online_matches_the_scalar_steps() {
    use super::fattn::{F16Rows, f16_rows_online, mad_f16_scalar, scale_f16_scalar};
    use super::fdot::vec_dot_f16_scalar;
    if !super::fattn::f16_rows_online_supported(64, 64) {
        return;
    }
    let mut rng = Rng(0x5eed_fa11);
    for &(dk, dv) in &[(64, 64), (80, 128), (256, 256), (96, 64)] {
        for g in 1..=super::fattn::MAX_ROWS_HEADS {
            let (n_kv, stride_k, stride_v) = (70, 2 * dk + 32, 2 * dv + 64);
            let f16s = |rng: &mut Rng, n: usize, s: f32| -> Vec<u8> {
                (0..n).flat_map(|_| rng.f16(s)).collect()
            };
            let k = f16s(&mut rng, n_kv * stride_k / 2, 1.0);
            let v = f16s(&mut rng, n_kv * stride_v / 2, 2.0);
            let qs: Vec<Vec<u8>> = (0..g).map(|_| f16s(&mut rng, dk, 1.5)).collect();
            let qrefs: Vec<&[u8]> = qs.iter().map(|q| &q[..]).collect();
            let slopes: Vec<f32> = (0..g).map(|h| 1.0 / (1 + h) as f32).collect();
            // Every third cell left out; a few masks are finite non-zero values (ALiBi-like).
            let cells: Vec<(usize, f32)> = (0..n_kv)
                .filter(|c| c % 3 != 1)
                .map(|c| (c, if c % 7 == 0 { -(c as f32) / 8.0 } else { 0.0 }))
                .collect();
            let r = F16Rows {
                k: &k,
                k_stride: stride_k,
                v: &v,
                v_stride: stride_v,
                dk,
                dv,
                q: &qrefs,
                scale: 0.125,
                softcap: 0.0,
            };
            let mut out = vec![0f32; g * dv];
            let mut states = vec![(0f32, 0f32); g];
            let mut it = cells.iter().copied();
            assert!(f16_rows_online(&r, &mut it, &slopes, &mut out, &mut states));
            for h in 0..g {
                let (mut m, mut s) = (f32::NEG_INFINITY, 0f32);
                let mut acc = vec![0u16; dv];
                for &(c, mval) in &cells {
                    let krow = &k[c * stride_k..][..2 * dk];
                    let mut sc = vec_dot_f16_scalar(dk, krow, &qs[h]) * r.scale;
                    sc += slopes[h] * mval;
                    let (mut ms, mut vs) = (1f32, 1f32);
                    if sc > m {
                        ms = (m - sc).exp();
                        m = sc;
                        scale_f16_scalar(&mut acc, ms);
                    } else {
                        vs = (sc - m).exp();
                    }
                    mad_f16_scalar(&mut acc, &v[c * stride_v..][..2 * dv], vs);
                    s = s.mul_add(ms, vs);
                }
                let want: Vec<f32> = acc.iter().map(|&x| fp16_to_fp32(x)).collect();
                let ctx = format!("dk {dk} dv {dv} heads {g} head {h}");
                assert_eq!(bits(&out[h * dv..][..dv]), bits(&want), "{ctx}");
                assert_eq!(states[h].0.to_bits(), m.to_bits(), "{ctx}: M");
                assert_eq!(states[h].1.to_bits(), s.to_bits(), "{ctx}: S");
            }
        }
    }
}

/// Weights packed in groups of 16 rows ([`pack16`]): the layout puts every byte where the
/// packed tiles read it, and, on a tier with packed tiles, every output of a packed call is
/// bit-identical to the tile on the file's rows and to the scalar emulation (calls of 16 to
/// 64 rows at every group offset; 1 to 40 activation rows; rows of 1 to 64 blocks, past the
/// tiles' 32-block tables).
#[test]
fn packed_tiles_match_rows() {
    use pack16::{GROUP, PackLayout, Packed16};
    let mut rng = Rng(0x9ac4_ed16_0f0f_1234);
    for dtype in [DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0] {
        let l = PackLayout::of(dtype).unwrap();
        for (m, nb) in [(16usize, 1usize), (64, 18), (48, 41), (128, 64), (32, 20)] {
            let k = nb * 32;
            let w = random_weights(&mut rng, dtype, nb * m);
            let wr: Vec<&[u8]> = w.chunks_exact(nb * l.block).collect();
            let p = Packed16::pack(dtype, m, nb, |i| wr[i]).unwrap();
            assert_eq!(p.size_bytes(), m / GROUP * l.group_bytes(nb));
            // Shared out in 3 parts (more than some weights have groups), run in any order:
            // the same bytes, every row reported packed once; a part left out is not passed
            // off as packed.
            let seen = std::sync::Mutex::new(vec![0u8; m]);
            let parts = Packed16::pack_on(
                dtype,
                m,
                nb,
                |i| wr[i],
                |part| {
                    (0..3).rev().for_each(|i| part(i, 3));
                    true
                },
                |rows| seen.lock().unwrap()[rows].iter_mut().for_each(|s| *s += 1),
            );
            assert_eq!(parts.unwrap().groups(0, m), p.groups(0, m));
            assert!(seen.into_inner().unwrap().iter().all(|&s| s == 1));
            let none = Packed16::pack_on(dtype, m, nb, |i| wr[i], |_| false, |_| {});
            assert!(none.is_none());
            // Every row read back from the copy as the file holds it.
            let mut back = vec![0u8; nb * l.block];
            for (i, row) in wr.iter().enumerate() {
                p.row_into(i, &mut back);
                assert_eq!(&back[..], &row[..nb * l.block], "{dtype} row {i}");
            }
            // Layout: quants word `q` of row `r`, block `b` at line `q` of the block; the
            // header's d, m and qh lanes.
            let g = p.groups(0, m);
            let gb = l.group_bytes(nb);
            for _ in 0..200 {
                let (i, b) = (rng.below(m), rng.below(nb));
                let (grp, r) = (&g[i / GROUP * gb..][..gb], i % GROUP);
                let blk = &wr[i][b * l.block..][..l.block];
                let q = rng.below(l.words);
                let at = b * l.payload() + 64 * q + 4 * r;
                assert_eq!(
                    &grp[at..at + 4],
                    &blk[l.qs + 4 * q..][..4],
                    "{dtype} quants"
                );
                let h = nb * l.payload() + b * l.header();
                assert_eq!(&grp[h + 2 * r..h + 2 * r + 2], &blk[..2], "{dtype} d");
                if let Some(mo) = l.m {
                    let at = h + l.header_m() + 2 * r;
                    assert_eq!(&grp[at..at + 2], &blk[mo..mo + 2], "{dtype} m");
                }
                if let Some(qo) = l.qh {
                    let at = h + l.header_qh() + 4 * r;
                    assert_eq!(&grp[at..at + 4], &blk[qo..qo + 4], "{dtype} qh");
                }
            }
            let table = super::table();
            if table.packed16().is_none() {
                continue;
            }
            for n in [1usize, 2, 3, 5, 17, 40] {
                let plan = matmul::MatMul::plan(table, dtype, m, n, k, true, true).unwrap();
                assert!(plan.takes_packed(), "{dtype} {m}x{n}");
                let arow = plan.act_row_bytes(k).unwrap();
                let mut acts = vec![0u8; arow * n];
                for j in 0..n {
                    plan.convert_act(j, &rng.vec(k, 3.0), &mut acts[j * arow..(j + 1) * arow]);
                }
                let ar: Vec<&[u8]> = acts.chunks_exact(arow).collect();
                for i0 in (0..m).step_by(GROUP) {
                    let rows = (m - i0).min(64) / GROUP * GROUP;
                    let mut out = vec![0f32; rows * n];
                    plan.dot_packed(&p, i0, rows, &ar, &mut out);
                    let mut want = vec![0f32; rows * n];
                    plan.dot_tile(k, &wr[i0..i0 + rows], &ar, 0, &mut want);
                    for j in 0..n {
                        for i in 0..rows {
                            let s = plan.dot_scalar(k, wr[i0 + i], ar[j], j);
                            assert_eq!(
                                out[j * rows + i].to_bits(),
                                want[j * rows + i].to_bits(),
                                "{dtype} {m}x{n} nb={nb} packed vs rows at ({},{j})",
                                i0 + i
                            );
                            assert_eq!(out[j * rows + i].to_bits(), s.to_bits());
                        }
                    }
                }
            }
        }
    }
}
