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

use super::table::{ConvertFn, Kernel, KernelTable};
use super::{fdot, repack};

/// Which of llama.cpp's paths computes a product (the choice does not depend on the tier).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Path {
    /// `ggml_vec_dot_<type>` per output (and tinyBLAS where it shares that arithmetic).
    VecDot,
    /// llamafile's tinyBLAS, with arithmetic of its own.
    TinyBlas,
    /// The tiled K/i-quant path.
    Tiled,
    /// The `CPU_REPACK` buffer: gemm for activation rows below `gemm_rows` (quantized by
    /// `ggml_quantize_mat_q8_K_4x8` for Q4_K), gemv for the rest.
    Repacked,
}

/// The plan of one matrix product (one weight type and shape): llama.cpp's path, and the
/// kernels of one tier's table for it.
#[derive(Clone, Copy)]
pub struct MatMul {
    table: &'static KernelTable,
    weight: DType,
    path: Path,
    /// The activation rows' type.
    act: DType,
    convert: ConvertFn,
    kernel: Kernel,
    /// Activation rows below this take `gemm` (Q4_K repacked).
    gemm_rows: usize,
    gemm: Option<(ConvertFn, Kernel)>,
}

impl std::fmt::Debug for MatMul {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MatMul")
            .field("isa", &self.table.isa())
            .field("weight", &self.weight)
            .field("path", &self.path)
            .field("act", &self.act)
            .field("gemm_rows", &self.gemm_rows)
            .finish()
    }
}

impl MatMul {
    /// The plan, with `table`'s kernels, for `weight` rows of `k` values (`m` rows, 2-D unless `weight_2d` is false)
    /// times `n` activation rows per plane (`ne11`); `src1_contiguous` as ggml's
    /// `ggml_is_contiguous(src1)`. `None` when the type has no kernel here.
    pub fn plan(
        table: &'static KernelTable,
        weight: DType,
        m: usize,
        n: usize,
        k: usize,
        src1_contiguous: bool,
        weight_2d: bool,
    ) -> Option<MatMul> {
        let tiny_f = fdot::tinyblas_f_applies(m, n, k);
        let (path, gemm_rows) = match weight {
            DType::F32 if tiny_f && src1_contiguous => (Path::TinyBlas, 0),
            DType::F16 | DType::BF16 if tiny_f => (Path::TinyBlas, 0),
            DType::Q4_K if weight_2d && repack::q4_k_repacked(m) => {
                (Path::Repacked, repack::q4_k_gemm_rows(n))
            }
            t if repack::tiled_applies(t, false, n) => (Path::Tiled, 0),
            DType::Q4_0 | DType::IQ4_NL if weight_2d && repack::q0_repacked(weight, m) => {
                (Path::Repacked, 0)
            }
            DType::MXFP4 if weight_2d && repack::mxfp4_repacked(m) => (Path::Repacked, 0),
            DType::IQ4_NL if n >= 2 => (Path::TinyBlas, 0),
            _ => (Path::VecDot, 0),
        };
        MatMul::resolve(table, weight, path, gemm_rows)
    }

    /// The plan, with `table`'s kernels, of one expert's product in `ggml_compute_forward_mul_mat_id` (weights
    /// `[k, m, n_expert]`, `rows` activation rows routed to the expert), which differs from
    /// `mul_mat`'s: there is no tinyBLAS, so f32/f16 weights and the Q0 types take
    /// `ggml_vec_dot_*` per output; Q4_0, IQ4_NL and Q4_K weights with a multiple of 8 rows
    /// sit in the `CPU_REPACK` buffer when the tensor is 3-D (`n_expert > 1`), whose
    /// `forward_mul_mat_id` runs the gemv kernel for every row (Q4_K activations are plain
    /// Q8_K); other K-quant experts with at least 8 rows take the tiled kernels (the same
    /// per-output arithmetic as `mul_mat`'s tiled path). Every expert of one product converts
    /// its activations to the same type, whatever `rows` is. `None` when the type has no
    /// kernel here.
    pub fn plan_id(
        table: &'static KernelTable,
        weight: DType,
        m: usize,
        n_expert: usize,
        rows: usize,
    ) -> Option<MatMul> {
        let repacked = n_expert > 1;
        let path = match weight {
            DType::Q4_K if repacked && repack::q4_k_repacked(m) => Path::Repacked,
            DType::Q4_0 | DType::IQ4_NL if repacked && repack::q0_repacked(weight, m) => {
                Path::Repacked
            }
            t if repack::tiled_applies(t, false, rows) => Path::Tiled,
            DType::MXFP4 if repacked && repack::mxfp4_repacked(m) => Path::Repacked,
            _ => Path::VecDot,
        };
        MatMul::resolve(table, weight, path, 0)
    }

    /// The kernels of `table` for `path`; `None` when it has none for the weight type.
    fn resolve(
        table: &'static KernelTable,
        weight: DType,
        path: Path,
        gemm_rows: usize,
    ) -> Option<MatMul> {
        let kernels = table.of(weight);
        let kernel = match path {
            Path::VecDot => kernels.vec_dot,
            Path::TinyBlas => kernels.tinyblas,
            Path::Tiled => kernels.tiled,
            Path::Repacked => kernels.repacked,
        }?;
        let act = lamina_core::quant::vec_dot_type(weight)?;
        let gemm = if gemm_rows > 0 {
            Some((table.convert_q8_k_4x8(), kernels.repacked_gemm?))
        } else {
            None
        };
        Some(MatMul {
            table,
            weight,
            path,
            act,
            convert: table.convert(act)?,
            kernel,
            gemm_rows,
            gemm,
        })
    }

    /// The same plan with the kernels of tier `isa` (one this CPU has): every tier gives the
    /// same bits.
    pub fn on(&self, isa: super::Isa) -> MatMul {
        MatMul::resolve(
            super::table_for(isa),
            self.weight,
            self.path,
            self.gemm_rows,
        )
        .expect("every tier has a kernel for every path of every type")
    }

    /// Whether the product takes llamafile's tinyBLAS, with its own arithmetic.
    #[cfg(all(test, target_arch = "x86_64"))]
    pub(crate) fn is_tinyblas(&self) -> bool {
        self.path == Path::TinyBlas
    }

    /// Whether the tier's tile on packed weights ([`super::pack16`]) gives this plan's bits:
    /// `ggml_vec_dot_*` per output, one kernel for every activation row.
    pub fn takes_packed(&self) -> bool {
        self.path == Path::VecDot && self.gemm.is_none() && self.table.packed16().is_some()
    }

    /// Outputs of packed weight rows `i0..i0 + rows` (whole groups, at most 64 rows) against
    /// converted activation rows `acts`: `out[j * rows + i]`, the bits of [`MatMul::dot_tile`]
    /// on the same rows. Only where [`MatMul::takes_packed`].
    pub fn dot_packed(
        &self,
        packed: &super::pack16::Packed16,
        i0: usize,
        rows: usize,
        acts: &[&[u8]],
        out: &mut [f32],
    ) {
        assert!(self.takes_packed() && packed.dtype() == self.weight);
        let tile = self.table.packed16().expect("checked above");
        (tile.tile)(packed, i0, rows, acts, out);
    }

    /// The storage type of converted activation rows.
    pub fn act_type(&self) -> DType {
        self.act
    }

    /// Bytes of one converted activation row of `k` values (`None` if `k` does not fit).
    pub fn act_row_bytes(&self, k: usize) -> Option<usize> {
        self.act_type().row_size(k as u64).ok().map(|b| b as usize)
    }

    /// The conversion and kernel of activation row `j` (its index within its plane, `ne11`).
    #[inline]
    fn for_row(&self, j: usize) -> (ConvertFn, Kernel) {
        match self.gemm {
            Some(gemm) if j < self.gemm_rows => gemm,
            _ => (self.convert, self.kernel),
        }
    }

    /// Converts activation row `j` (its index within its plane, `ne11`) into `out`.
    pub fn convert_act(&self, j: usize, x: &[f32], out: &mut [u8]) {
        (self.for_row(j).0)(x, out)
    }

    /// One output: weight row `w` (k values) against converted activation row `act` (row `j`
    /// of its plane).
    #[inline]
    pub fn dot(&self, k: usize, w: &[u8], act: &[u8], j: usize) -> f32 {
        (self.for_row(j).1.dot)(k, w, act)
    }
}

/// f32 activations as they are (little-endian bytes).
pub(crate) fn convert_f32(x: &[f32], out: &mut [u8]) {
    for (o, v) in out.chunks_exact_mut(4).zip(x) {
        o.copy_from_slice(&v.to_le_bytes());
    }
}

/// f32 activations to f16 (round to nearest even, F16C `vcvtps2ph` where the CPU has it).
pub(crate) fn convert_f16(x: &[f32], out: &mut [u8]) {
    // SAFETY: f16 is a plain u16 wrapper with no invalid bit patterns; only the aligned middle
    // part is used.
    let (pre, mid, _) = unsafe { out.align_to_mut::<half::f16>() };
    if pre.is_empty() && mid.len() >= x.len() {
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(&mut mid[..x.len()], x);
    } else {
        for (o, v) in out.chunks_exact_mut(2).zip(x) {
            o.copy_from_slice(&super::fp32_to_fp16(*v).to_le_bytes());
        }
    }
}

/// f32 activations to bf16 (as ggml rounds them).
pub(crate) fn convert_bf16(x: &[f32], out: &mut [u8]) {
    for (o, &v) in out.chunks_exact_mut(2).zip(x) {
        o.copy_from_slice(&lamina_core::quant::f32_to_bf16(v).to_bits().to_le_bytes());
    }
}

impl MatMul {
    /// Activation rows `0..act_boundary()` and the rest use different kernels (Q4_K repacked:
    /// gemm, then gemv); a tile passed to [`MatMul::dot_tile`] should not straddle it.
    pub fn act_boundary(&self) -> usize {
        self.gemm_rows
    }

    /// Whether [`MatMul::dot_tile`] gains from tiles of many more activation rows than usual:
    /// the tiled K/i-quant kernels decode each weight block once per tile (all but Q6_K,
    /// whose tiles are register-blocked), and so do the AVX2 tiles of Q4_0/Q5_0/Q4_1/Q5_1.
    pub fn wide_tiles(&self) -> bool {
        match self.path {
            Path::Tiled => self.weight != DType::Q6_K,
            Path::VecDot => matches!(
                self.weight,
                DType::Q4_0 | DType::Q5_0 | DType::Q4_1 | DType::Q5_1
            ),
            _ => false,
        }
    }

    /// Weight rows per [`MatMul::dot_tile`] call that a wide call (see
    /// [`MatMul::wide_tiles`]) should carry: the AVX2 Q4_0/Q5_0/Q4_1/Q5_1 drivers prepare
    /// the activation side (scale tables, unsigned bytes) once per call, so 64 weight rows
    /// spread that over 8 times the outputs of the usual 8 (about a tenth of Gemma 3's
    /// Q5_0 prompt time at 8).
    pub fn weight_rows_per_call(&self) -> usize {
        match (self.path, self.weight) {
            (Path::VecDot, DType::Q4_0 | DType::Q5_0 | DType::Q4_1 | DType::Q5_1) => 64,
            _ => 8,
        }
    }

    /// Outputs of weight rows `w` (each `k` values) against converted activation rows `acts`
    /// (rows `j0..j0 + acts.len()` of their plane): `out[j * w.len() + i]` is
    /// `self.dot(k, w[i], acts[j], j0 + j)`, bit for bit, computed in register-blocked tiles
    /// where the tier has a tile kernel for the shape.
    pub fn dot_tile(&self, k: usize, w: &[&[u8]], acts: &[&[u8]], j0: usize, out: &mut [f32]) {
        let na = acts.len();
        assert!(out.len() >= w.len() * na, "tile output too short");
        // A tile's rows must all take one kernel (never across the gemm/gemv boundary).
        let kernel = match self.gemm {
            Some((_, gemm)) if j0 + na <= self.gemm_rows => Some(gemm),
            Some(_) if j0 < self.gemm_rows => None,
            _ => Some(self.kernel),
        };
        if let Some(tile) = kernel.and_then(|k| k.tile)
            && tile(k, w, acts, out)
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

    /// [`MatMul::dot_tile`] with the kernels of tier `isa` (one this CPU has): every tier must
    /// give the same bits.
    pub fn dot_tile_at(
        &self,
        isa: super::Isa,
        k: usize,
        w: &[&[u8]],
        acts: &[&[u8]],
        j0: usize,
        out: &mut [f32],
    ) {
        self.on(isa).dot_tile(k, w, acts, j0, out)
    }

    /// The `k` that gives the same outputs as `k` for activation rows `acts`: shorter when
    /// the plan is a tinyBLAS f16/f32 one and every row ends in whole groups of 8 zeros (a
    /// causal attention row's weights after its position). Skipping those groups keeps every
    /// output's bits: `fma(±0, w, acc)` is `acc` for finite `w` and an accumulator that is
    /// not -0, and a chain that starts at +0 never reaches -0 (an exactly-zero FMA result is
    /// +0 unless both the product and the addend are -0). A non-finite weight facing a zero
    /// would make llama.cpp's output NaN where this one stays finite.
    pub fn trimmed_k(&self, k: usize, acts: &[&[u8]]) -> usize {
        let (elem, zero_mask): (usize, u64) = match (self.path, self.weight) {
            (Path::TinyBlas, DType::F16 | DType::BF16) => (2, 0x7fff_7fff_7fff_7fff),
            (Path::TinyBlas, DType::F32) => (4, 0x7fff_ffff_7fff_ffff),
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
        self.on(super::Isa::Scalar).dot(k, w, act, j)
    }

    /// Converts activation row `j` like [`MatMul::convert_act`] with the scalar emulation of
    /// the quantizers only.
    pub fn convert_act_scalar(&self, j: usize, x: &[f32], out: &mut [u8]) {
        self.on(super::Isa::Scalar).convert_act(j, x, out)
    }
}

/// f32 view of 4-aligned little-endian bytes (rows of f32 tensors and of the work buffer).
pub(crate) fn as_f32(b: &[u8]) -> &[f32] {
    // SAFETY: f32 has no invalid bit patterns; `align_to` yields only the aligned middle part.
    let (pre, mid, _) = unsafe { b.align_to::<f32>() };
    assert!(pre.is_empty(), "f32 row not 4-byte aligned");
    mid
}
