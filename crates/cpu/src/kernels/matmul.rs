//! Which kernel llama.cpp's `ggml_compute_forward_mul_mat` (plus the CPU repack buffer and the
//! tiled K-quant path) uses for a product, on an x86 AVX2 build with default settings, and the
//! per-output arithmetic of that kernel:
//!
//! 1. Q4_K, Q4_0, IQ4_NL and MXFP4 weights with a multiple of 8 rows live in the `CPU_REPACK`
//!    buffer: for Q4_K, rows of the activation plane in groups of 4 go to
//!    `ggml_gemm_q4_K_8x8_q8_K` (activations quantized by `ggml_quantize_mat_q8_K_4x8`), the
//!    rest to the gemv kernel; Q4_0/IQ4_NL/MXFP4 use the 8x8 gemv/gemm pair, which agree per
//!    output ([`super::repack`]).
//! 2. Else K-quant and i-quant weights (Q2_K…Q6_K, IQ4_XS, and the grid i-quants IQ2_XXS,
//!    IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with at least 8 activation rows take the
//!    tiled path (per superblock `fma(d_w * (float)Σ scale·v·q8, d_a, acc)`).
//! 3. Else llamafile's tinyBLAS when it accepts the product: f32 (activations contiguous) and,
//!    after converting activations to f16, f16 weights when `n >= 2`, `k % 8 == 0`,
//!    `m % 4 == 0`; Q8_0/Q4_0/Q5_0/IQ4_NL weights when `n >= 2` (one FMA chain per output, the
//!    same arithmetic as `ggml_vec_dot_*` except for IQ4_NL); bf16 weights (activations
//!    converted to bf16) under the same conditions as f16 (`tinyBLAS<8, __m256, __m256,
//!    ggml_bf16_t, …>`).
//! 4. Else `ggml_vec_dot_<type>` per output (one row at a time on x86).
//!
//! TQ1_0, TQ2_0, NVFP4, Q1_0 and Q2_0 have no tinyBLAS, x86 repack or tiled kernels in
//! llama.cpp: they take step 4, as the grid i-quants do below 8 activation rows.
//!
//! `ggml_compute_forward_mul_mat_id` picks differently (no tinyBLAS, gemv only for repacked
//! experts): see [`MatMul::plan_id`].

use lamina_core::DType;

use super::dot::{self, DotFn};
use super::tile::{self, TileKind};
use super::{fdot, quantize, repack};

/// How one activation row is converted before the dot products.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ActKind {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q8_1,
    Q8K,
    /// `ggml_quantize_mat_q8_K_4x8` values for rows below `gemm_rows`, else Q8_K.
    Q8KRepack,
}

#[derive(Clone, Copy, Debug)]
enum DotKind {
    TinyF32,
    VecF32,
    TinyF16,
    VecF16,
    TinyBf16,
    VecBf16,
    /// A quantized row·row kernel (also tinyBLAS_Q0 where it shares the arithmetic).
    Quant(DotFn),
    /// tinyBLAS_Q0 for IQ4_NL (one FMA chain, unlike `ggml_vec_dot_iq4_nl_q8_0`).
    TinyIq4Nl,
    Q4KRepack,
    /// Q4_0 (`false`) or IQ4_NL (`true`) repacked to 8x8 (gemv/gemm agree per output).
    Q0Repack(bool),
    /// MXFP4 repacked to 8x8 (gemv/gemm agree per output).
    Mxfp4Repack,
    Q6KTiled,
    Q4KTiled,
    Q5KTiled,
    Q2KTiled,
    Q3KTiled,
    Iq4XsTiled,
    /// The grid i-quants (IQ2_*, IQ3_*, IQ1_*) through the tiled kernel.
    IqGridTiled(DType),
}

/// The plan of one matrix product (one weight type and shape).
#[derive(Clone, Copy, Debug)]
pub struct MatMul {
    weight: DType,
    act: ActKind,
    kind: DotKind,
    gemm_rows: usize,
    /// Whether the kernel replicates llama.cpp's arithmetic exactly.
    pub exact: bool,
}

impl MatMul {
    /// The plan for `weight` rows of `k` values (`m` rows, 2-D unless `weight_2d` is false)
    /// times `n` activation rows per plane (`ne11`); `src1_contiguous` as ggml's
    /// `ggml_is_contiguous(src1)`. `None` when the type has no kernel here.
    pub fn plan(
        weight: DType,
        m: usize,
        n: usize,
        k: usize,
        src1_contiguous: bool,
        weight_2d: bool,
    ) -> Option<MatMul> {
        let simple = |act, kind| MatMul {
            weight,
            act,
            kind,
            gemm_rows: 0,
            exact: true,
        };
        let tiny_f = fdot::tinyblas_f_applies(m, n, k);
        Some(match weight {
            DType::F32 => simple(
                ActKind::F32,
                if tiny_f && src1_contiguous {
                    DotKind::TinyF32
                } else {
                    DotKind::VecF32
                },
            ),
            DType::F16 => simple(
                ActKind::F16,
                if tiny_f {
                    DotKind::TinyF16
                } else {
                    DotKind::VecF16
                },
            ),
            DType::BF16 => simple(
                ActKind::Bf16,
                if tiny_f {
                    DotKind::TinyBf16
                } else {
                    DotKind::VecBf16
                },
            ),
            DType::Q4_K if weight_2d && repack::q4_k_repacked(m) => MatMul {
                weight,
                act: ActKind::Q8KRepack,
                kind: DotKind::Q4KRepack,
                gemm_rows: repack::q4_k_gemm_rows(n),
                exact: true,
            },
            DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ2_S
            | DType::IQ3_XXS
            | DType::IQ3_S
            | DType::IQ1_S
            | DType::IQ1_M
                if repack::tiled_applies(weight, false, n) =>
            {
                simple(ActKind::Q8K, DotKind::IqGridTiled(weight))
            }
            DType::Q6_K | DType::Q4_K | DType::Q5_K | DType::Q3_K | DType::Q2_K | DType::IQ4_XS
                if repack::tiled_applies(weight, false, n) =>
            {
                let kind = match weight {
                    DType::Q6_K => DotKind::Q6KTiled,
                    DType::Q4_K => DotKind::Q4KTiled,
                    DType::Q5_K => DotKind::Q5KTiled,
                    DType::Q2_K => DotKind::Q2KTiled,
                    DType::Q3_K => DotKind::Q3KTiled,
                    _ => DotKind::Iq4XsTiled,
                };
                simple(ActKind::Q8K, kind)
            }
            DType::Q4_0 | DType::IQ4_NL if weight_2d && repack::q0_repacked(weight, m) => {
                simple(ActKind::Q8_0, DotKind::Q0Repack(weight == DType::IQ4_NL))
            }
            DType::MXFP4 if weight_2d && repack::mxfp4_repacked(m) => {
                simple(ActKind::Q8_0, DotKind::Mxfp4Repack)
            }
            DType::IQ4_NL if n >= 2 => simple(ActKind::Q8_0, DotKind::TinyIq4Nl),
            _ => {
                let act = match lamina_core::quant::vec_dot_type(weight)? {
                    DType::Q8_0 => ActKind::Q8_0,
                    DType::Q8_1 => ActKind::Q8_1,
                    DType::Q8_K => ActKind::Q8K,
                    _ => return None,
                };
                let f = dot::dot_fn(weight)?;
                let tiled = repack::tiled_applies(weight, false, n);
                MatMul {
                    exact: !tiled,
                    ..simple(act, DotKind::Quant(f))
                }
            }
        })
    }

    /// The plan of one expert's product in `ggml_compute_forward_mul_mat_id` (weights
    /// `[k, m, n_expert]`, `rows` activation rows routed to the expert), which differs from
    /// `mul_mat`'s: there is no tinyBLAS, so f32/f16 weights and the Q0 types take
    /// `ggml_vec_dot_*` per output; Q4_0, IQ4_NL and Q4_K weights with a multiple of 8 rows
    /// sit in the `CPU_REPACK` buffer when the tensor is 3-D (`n_expert > 1`), whose
    /// `forward_mul_mat_id` runs the gemv kernel for every row (Q4_K activations are plain
    /// Q8_K); other K-quant experts with at least 8 rows take the tiled kernels (the same
    /// per-output arithmetic as `mul_mat`'s tiled path). Every expert of one product converts
    /// its activations to the same type, whatever `rows` is. `None` when the type has no
    /// kernel here.
    pub fn plan_id(weight: DType, m: usize, n_expert: usize, rows: usize) -> Option<MatMul> {
        let simple = |act, kind| MatMul {
            weight,
            act,
            kind,
            gemm_rows: 0,
            exact: true,
        };
        let repacked = n_expert > 1;
        Some(match weight {
            DType::F32 => simple(ActKind::F32, DotKind::VecF32),
            DType::F16 => simple(ActKind::F16, DotKind::VecF16),
            DType::BF16 => simple(ActKind::Bf16, DotKind::VecBf16),
            DType::Q4_K if repacked && repack::q4_k_repacked(m) => {
                simple(ActKind::Q8K, DotKind::Q4KRepack)
            }
            DType::Q4_0 | DType::IQ4_NL if repacked && repack::q0_repacked(weight, m) => {
                simple(ActKind::Q8_0, DotKind::Q0Repack(weight == DType::IQ4_NL))
            }
            DType::IQ2_XXS
            | DType::IQ2_XS
            | DType::IQ2_S
            | DType::IQ3_XXS
            | DType::IQ3_S
            | DType::IQ1_S
            | DType::IQ1_M
                if repack::tiled_applies(weight, false, rows) =>
            {
                simple(ActKind::Q8K, DotKind::IqGridTiled(weight))
            }
            DType::Q6_K | DType::Q4_K | DType::Q5_K | DType::Q3_K | DType::Q2_K | DType::IQ4_XS
                if repack::tiled_applies(weight, false, rows) =>
            {
                let kind = match weight {
                    DType::Q6_K => DotKind::Q6KTiled,
                    DType::Q4_K => DotKind::Q4KTiled,
                    DType::Q5_K => DotKind::Q5KTiled,
                    DType::Q2_K => DotKind::Q2KTiled,
                    DType::Q3_K => DotKind::Q3KTiled,
                    _ => DotKind::Iq4XsTiled,
                };
                simple(ActKind::Q8K, kind)
            }
            DType::MXFP4 if repacked && repack::mxfp4_repacked(m) => {
                simple(ActKind::Q8_0, DotKind::Mxfp4Repack)
            }
            _ => {
                let act = match lamina_core::quant::vec_dot_type(weight)? {
                    DType::Q8_0 => ActKind::Q8_0,
                    DType::Q8_1 => ActKind::Q8_1,
                    DType::Q8_K => ActKind::Q8K,
                    _ => return None,
                };
                simple(act, DotKind::Quant(dot::dot_fn(weight)?))
            }
        })
    }

    /// The storage type of converted activation rows.
    pub fn act_type(&self) -> DType {
        match self.act {
            ActKind::F32 => DType::F32,
            ActKind::F16 => DType::F16,
            ActKind::Bf16 => DType::BF16,
            ActKind::Q8_0 => DType::Q8_0,
            ActKind::Q8_1 => DType::Q8_1,
            ActKind::Q8K | ActKind::Q8KRepack => DType::Q8_K,
        }
    }

    /// Bytes of one converted activation row of `k` values (`None` if `k` does not fit).
    pub fn act_row_bytes(&self, k: usize) -> Option<usize> {
        self.act_type().row_size(k as u64).ok().map(|b| b as usize)
    }

    /// Converts activation row `j` (its index within its plane, `ne11`) into `out`.
    pub fn convert_act(&self, j: usize, x: &[f32], out: &mut [u8]) {
        match self.act {
            ActKind::F32 => {
                for (o, v) in out.chunks_exact_mut(4).zip(x) {
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            ActKind::F16 => {
                // SAFETY: f16 is a plain u16 wrapper with no invalid bit patterns; only the
                // aligned middle part is used.
                let (pre, mid, _) = unsafe { out.align_to_mut::<half::f16>() };
                if pre.is_empty() && mid.len() >= x.len() {
                    // F16C `vcvtps2ph` (round to nearest even) where available, like
                    // `fp32_to_fp16` element by element.
                    half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut mid[..x.len()], x);
                } else {
                    for (o, v) in out.chunks_exact_mut(2).zip(x) {
                        o.copy_from_slice(&super::fp32_to_fp16(*v).to_le_bytes());
                    }
                }
            }
            ActKind::Bf16 => {
                for (o, &v) in out.chunks_exact_mut(2).zip(x) {
                    o.copy_from_slice(&lamina_core::quant::f32_to_bf16(v).to_bits().to_le_bytes());
                }
            }
            ActKind::Q8_0 => quantize::quantize_row_q8_0(x, out),
            ActKind::Q8_1 => quantize::quantize_row_q8_1(x, out),
            ActKind::Q8K => quantize::quantize_row_q8_k(x, out),
            ActKind::Q8KRepack => {
                if j < self.gemm_rows {
                    repack::quantize_row_q8_k_4x8(x, out)
                } else {
                    quantize::quantize_row_q8_k(x, out)
                }
            }
        }
    }

    /// One output: weight row `w` (k values) against converted activation row `act` (row `j`
    /// of its plane).
    #[inline]
    pub fn dot(&self, k: usize, w: &[u8], act: &[u8], j: usize) -> f32 {
        match self.kind {
            DotKind::TinyF32 => fdot::tinyblas_dot_f32(k, as_f32(w), as_f32(act)),
            DotKind::VecF32 => fdot::vec_dot_f32(k, as_f32(w), as_f32(act)),
            DotKind::TinyF16 => fdot::tinyblas_dot_f16(k, w, act),
            DotKind::VecF16 => fdot::vec_dot_f16(k, w, act),
            DotKind::TinyBf16 => fdot::tinyblas_dot_bf16(k, w, act),
            DotKind::VecBf16 => super::fattn::vec_dot_bf16(k, w, act),
            DotKind::Quant(f) => f(k, w, act),
            DotKind::TinyIq4Nl => dot::dot_iq4_nl_tinyblas(k, w, act),
            DotKind::Q4KRepack => {
                if j < self.gemm_rows {
                    repack::dot_q4_k_gemm(k, w, act)
                } else {
                    repack::dot_q4_k_gemv(k, w, act)
                }
            }
            DotKind::Q0Repack(iq4nl) => repack::dot_q0_repacked(iq4nl, k, w, act),
            DotKind::Mxfp4Repack => repack::dot_mxfp4_repacked(k, w, act),
            DotKind::Q6KTiled => repack::dot_q6_k_tiled(k, w, act),
            DotKind::Q4KTiled => repack::dot_q45_k_tiled(false, k, w, act),
            DotKind::Q5KTiled => repack::dot_q45_k_tiled(true, k, w, act),
            DotKind::Q2KTiled => repack::dot_q2_k_tiled(k, w, act),
            DotKind::Q3KTiled => repack::dot_q3_k_tiled(k, w, act),
            DotKind::Iq4XsTiled => repack::dot_iq4_xs_tiled(k, w, act),
            DotKind::IqGridTiled(t) => repack::dot_iq_grid_tiled(t, k, w, act),
        }
    }
}

impl MatMul {
    /// Activation rows `0..act_boundary()` and the rest use different kernels (Q4_K repacked:
    /// gemm, then gemv); a tile passed to [`MatMul::dot_tile`] should not straddle it.
    pub fn act_boundary(&self) -> usize {
        match self.kind {
            DotKind::Q4KRepack => self.gemm_rows,
            _ => 0,
        }
    }

    /// The tile kernel for activation rows `j0..j0 + n`, if there is one.
    fn tile_kind(&self, j0: usize, n: usize) -> Option<TileKind> {
        Some(match self.kind {
            DotKind::TinyF32 => TileKind::F32Tiny,
            DotKind::TinyF16 => TileKind::F16Tiny,
            DotKind::Quant(_) if self.exact => match self.weight {
                DType::Q4_0 => TileKind::Q0(0),
                DType::Q5_0 => TileKind::Q0(1),
                DType::Q8_0 => TileKind::Q0(2),
                DType::Q4_1 => TileKind::Q1(false),
                DType::Q5_1 => TileKind::Q1(true),
                _ => return None,
            },
            DotKind::TinyIq4Nl => TileKind::Q0(3),
            DotKind::Q0Repack(iq4nl) => TileKind::Q0Chain(if iq4nl { 3 } else { 0 }),
            DotKind::Mxfp4Repack => TileKind::Q0Chain(4),
            DotKind::Iq4XsTiled => TileKind::Iq4XsTiled,
            DotKind::Q2KTiled => TileKind::Q2KTiled,
            DotKind::IqGridTiled(t) => TileKind::IqGridTiled(t),
            DotKind::Q4KRepack if j0 + n <= self.gemm_rows => TileKind::Q4KGemm,
            DotKind::Q4KRepack if j0 >= self.gemm_rows => TileKind::Q4KGemv,
            DotKind::Q6KTiled => TileKind::Q6KTiled,
            _ => return None,
        })
    }

    /// Outputs of weight rows `w` (each `k` values) against converted activation rows `acts`
    /// (rows `j0..j0 + acts.len()` of their plane): `out[j * w.len() + i]` is
    /// `self.dot(k, w[i], acts[j], j0 + j)`, bit for bit, computed in register-blocked tiles
    /// where a SIMD tile kernel exists.
    pub fn dot_tile(&self, k: usize, w: &[&[u8]], acts: &[&[u8]], j0: usize, out: &mut [f32]) {
        self.dot_tile_at(super::isa(), k, w, acts, j0, out);
    }

    /// [`MatMul::dot_tile`] with the tile kernels of tier `isa` (at most
    /// [`super::detected_isa`]): every tier must give the same bits.
    pub fn dot_tile_at(
        &self,
        isa: super::Isa,
        k: usize,
        w: &[&[u8]],
        acts: &[&[u8]],
        j0: usize,
        out: &mut [f32],
    ) {
        let na = acts.len();
        assert!(out.len() >= w.len() * na, "tile output too short");
        // A single activation row (token generation) streams the weights once: row after row
        // reads memory sequentially, which is faster than interleaving several rows.
        // The repacked Q0 kernels' 4×1 tiles still beat one row at a time there (their
        // single-row kernel is scalar).
        if let Some(t) = self.tile_kind(j0, na)
            && (na > 1 || matches!(t, TileKind::Q0Chain(_)))
            && tile::tile_at(isa, t, k, w, acts, out)
        {
            return;
        }
        for (i, wr) in w.iter().enumerate() {
            super::prefetch_ahead(wr);
            for (j, act) in acts.iter().enumerate() {
                out[j * w.len() + i] = self.dot(k, wr, act, j0 + j);
            }
        }
    }

    /// The `k` that gives the same outputs as `k` for activation rows `acts`: shorter when
    /// the plan is a tinyBLAS f16/f32 one and every row ends in whole groups of 8 zeros (a
    /// causal attention row's weights after its position). Skipping those groups keeps every
    /// output's bits: `fma(±0, w, acc)` is `acc` for finite `w` and an accumulator that is
    /// not -0, and a chain that starts at +0 never reaches -0 (an exactly-zero FMA result is
    /// +0 unless both the product and the addend are -0). A non-finite weight facing a zero
    /// would make llama.cpp's output NaN where this one stays finite.
    pub fn trimmed_k(&self, k: usize, acts: &[&[u8]]) -> usize {
        let (elem, zero_mask): (usize, u64) = match self.kind {
            DotKind::TinyF16 | DotKind::TinyBf16 => (2, 0x7fff_7fff_7fff_7fff),
            DotKind::TinyF32 => (4, 0x7fff_ffff_7fff_ffff),
            _ => return k,
        };
        let words_per_group = elem; // 8 values of `elem` bytes = `elem` u64 words
        let mut keep = 0; // groups every row needs so far
        // The last row usually reaches furthest (causal rows grow), so it goes first.
        for act in acts.iter().rev() {
            let row = &act[..k * elem];
            let word = |i: usize| {
                u64::from_le_bytes(row[8 * i..8 * i + 8].try_into().expect("8 bytes")) & zero_mask
            };
            // Words from the end while zero, down to the groups already kept.
            let mut end = k / 8 * words_per_group;
            let floor = keep * words_per_group;
            while end > floor && word(end - 1) == 0 {
                end -= 1;
            }
            keep = keep.max(end.div_ceil(words_per_group));
            if keep == k / 8 {
                break;
            }
        }
        keep * 8
    }

    /// [`MatMul::dot`] computed by the portable scalar emulation only (never SIMD): the
    /// reference the SIMD paths must match bit for bit.
    pub fn dot_scalar(&self, k: usize, w: &[u8], act: &[u8], j: usize) -> f32 {
        match self.kind {
            DotKind::TinyF32 => fdot::tinyblas_dot_f32_scalar(k, as_f32(w), as_f32(act)),
            DotKind::VecF32 => fdot::vec_dot_f32_scalar(k, as_f32(w), as_f32(act)),
            DotKind::TinyF16 => fdot::tinyblas_dot_f16_scalar(k, w, act),
            DotKind::VecF16 => fdot::vec_dot_f16_scalar(k, w, act),
            DotKind::TinyBf16 => fdot::tinyblas_dot_bf16(k, w, act),
            DotKind::VecBf16 => super::fattn::vec_dot_bf16(k, w, act),
            DotKind::Quant(f) => match dot::scalar_dot_fn(self.weight) {
                Some(s) => s(k, w, act),
                None => f(k, w, act),
            },
            DotKind::TinyIq4Nl => repack::scalar::dot_iq4_nl_tinyblas(k, w, act),
            DotKind::Q4KRepack => {
                if j < self.gemm_rows {
                    repack::scalar::dot_q4_k_gemm(k, w, act)
                } else {
                    repack::scalar::dot_q4_k_gemv(k, w, act)
                }
            }
            DotKind::Q0Repack(iq4nl) => repack::scalar::dot_q0_repacked(iq4nl, k, w, act),
            DotKind::Mxfp4Repack => repack::scalar::dot_mxfp4_repacked(k, w, act),
            DotKind::Q6KTiled => repack::scalar::dot_q6_k_tiled(k, w, act),
            DotKind::Q4KTiled => repack::dot_q45_k_tiled(false, k, w, act),
            DotKind::Q5KTiled => repack::dot_q45_k_tiled(true, k, w, act),
            DotKind::Q2KTiled => repack::dot_q2_k_tiled(k, w, act),
            DotKind::Q3KTiled => repack::dot_q3_k_tiled(k, w, act),
            DotKind::Iq4XsTiled => repack::dot_iq4_xs_tiled(k, w, act),
            DotKind::IqGridTiled(t) => repack::dot_iq_grid_tiled(t, k, w, act),
        }
    }

    /// Converts activation row `j` like [`MatMul::convert_act`] with the scalar emulation of
    /// the quantizers only.
    pub fn convert_act_scalar(&self, j: usize, x: &[f32], out: &mut [u8]) {
        match self.act {
            ActKind::Q8_0 => quantize::quantize_row_q8_0_scalar(x, out),
            ActKind::Q8_1 => quantize::quantize_row_q8_1_scalar(x, out),
            ActKind::Q8K => quantize::quantize_row_q8_k_scalar(x, out),
            ActKind::Q8KRepack if j < self.gemm_rows => {
                repack::scalar::quantize_row_q8_k_4x8(x, out)
            }
            ActKind::Q8KRepack => quantize::quantize_row_q8_k_scalar(x, out),
            ActKind::F32 | ActKind::F16 | ActKind::Bf16 => self.convert_act(j, x, out),
        }
    }
}

/// f32 view of 4-aligned little-endian bytes (rows of f32 tensors and of the work buffer).
fn as_f32(b: &[u8]) -> &[f32] {
    // SAFETY: f32 has no invalid bit patterns; `align_to` yields only the aligned middle part.
    let (pre, mid, _) = unsafe { b.align_to::<f32>() };
    assert!(pre.is_empty(), "f32 row not 4-byte aligned");
    mid
}
