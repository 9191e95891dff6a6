//! One table of matrix-product kernels per instruction set (scalar, AVX2, AVX-512, NEON),
//! indexed by type: for each weight type the per-output kernel of every path llama.cpp may
//! take (`ggml_vec_dot_*`, tinyBLAS, the tiled K/i-quant path, the repacked gemv/gemm) with the
//! tier's register-blocked tile kernel beside it, and for each activation type the row
//! conversion (the Q8 quantizers). Every tier's kernels give the bits of the scalar ones; a
//! tier only fills in what it does faster. Tables are built once ([`table_for`]); the CPU
//! device's workers hold the one for [`super::isa`], and [`super::MatMul`] looks its kernels up
//! here after choosing llama.cpp's path.

use std::sync::OnceLock;

use lamina_core::DType;

use super::Isa;

/// A row·row kernel: `(k, weight_row, activation_row) -> f32`, one output.
pub type DotFn = fn(usize, &[u8], &[u8]) -> f32;

/// Converts one f32 activation row to the kernel's activation type.
pub type ConvertFn = fn(&[f32], &mut [u8]);

/// A tile kernel: `out[j * w.len() + i]` = the output of weight row `w[i]` and activation row
/// `a[j]` (rows of `k` values), bit for bit the per-output kernel's. Returns `false`, leaving
/// `out` alone, when this tier computes that shape no faster than output by output.
pub type TileFn = fn(usize, &[&[u8]], &[&[u8]], &mut [f32]) -> bool;

/// A tile on weights packed in groups of 16 rows ([`super::pack16`]): `out[j * rows + i]` =
/// packed row `i0 + i` times activation row `acts[j]` (`i0`, `rows` whole groups, at most 64
/// rows), bit for bit the tile on the file's rows. Arguments: `(packed, i0, rows, acts, out)`.
pub type PackedTileFn = fn(&super::pack16::Packed16, usize, usize, &[&[u8]], &mut [f32]);

/// A tier's tile on packed weights and the longest rows (in blocks) it takes.
#[derive(Clone, Copy)]
pub struct PackedTile {
    pub tile: PackedTileFn,
    pub max_blocks: usize,
}

/// How one path computes its outputs: one at a time, or in tiles where the tier has them.
#[derive(Clone, Copy)]
pub struct Kernel {
    pub dot: DotFn,
    pub tile: Option<TileFn>,
}

impl Kernel {
    /// A kernel without tiles.
    pub const fn dot(dot: DotFn) -> Kernel {
        Kernel { dot, tile: None }
    }
}

/// The kernels of one weight type, by the path of llama.cpp's `mul_mat` that uses them.
#[derive(Clone, Copy, Default)]
pub struct TypeKernels {
    /// `ggml_vec_dot_<type>_<vec_dot_type>` (which tinyBLAS shares per output for Q4_0, Q5_0
    /// and Q8_0).
    pub vec_dot: Option<Kernel>,
    /// llamafile's tinyBLAS where its per-output arithmetic is its own (f32, f16, bf16,
    /// IQ4_NL).
    pub tinyblas: Option<Kernel>,
    /// ggml's tiled path for K and i-quant weights (at least 8 activation rows).
    pub tiled: Option<Kernel>,
    /// The `CPU_REPACK` buffer's gemv (Q4_0, IQ4_NL and MXFP4: its gemm agrees per output).
    pub repacked: Option<Kernel>,
    /// The `CPU_REPACK` buffer's gemm where it differs from the gemv (Q4_K).
    pub repacked_gemm: Option<Kernel>,
}

/// One slot per ggml type id (the largest is 42).
const SLOTS: usize = 43;

/// The kernels of one instruction-set tier.
pub struct KernelTable {
    isa: Isa,
    types: [TypeKernels; SLOTS],
    converts: [Option<ConvertFn>; SLOTS],
    /// `ggml_quantize_mat_q8_K_4x8`'s values (Q4_K's repacked gemm).
    convert_q8_k_4x8: ConvertFn,
    /// The tile on packed weights (Q4_1, Q5_0, Q5_1, Q8_0), where the tier has one.
    packed16: Option<PackedTile>,
}

impl KernelTable {
    /// A table whose type entries are all empty, with `converts` for Q8_0, Q8_1, Q8_K and the
    /// 4x8 Q8_K of the repacked gemm (the f32, f16 and bf16 conversions are the same on every
    /// tier).
    pub(super) fn new(
        isa: Isa,
        q8_0: ConvertFn,
        q8_1: ConvertFn,
        q8_k: ConvertFn,
        q8_k_4x8: ConvertFn,
    ) -> KernelTable {
        let mut t = KernelTable {
            isa,
            types: [TypeKernels::default(); SLOTS],
            converts: [None; SLOTS],
            convert_q8_k_4x8: q8_k_4x8,
            packed16: None,
        };
        t.converts[DType::F32 as usize] = Some(super::matmul::convert_f32);
        t.converts[DType::F16 as usize] = Some(super::matmul::convert_f16);
        t.converts[DType::BF16 as usize] = Some(super::matmul::convert_bf16);
        t.converts[DType::Q8_0 as usize] = Some(q8_0);
        t.converts[DType::Q8_1 as usize] = Some(q8_1);
        t.converts[DType::Q8_K as usize] = Some(q8_k);
        t
    }

    /// Marks a table derived from another tier's as this tier's.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn set_isa(&mut self, isa: Isa) {
        self.isa = isa;
    }

    /// The tier these kernels belong to.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The kernels for weights of type `t`.
    pub fn of(&self, t: DType) -> &TypeKernels {
        &self.types[t as usize]
    }

    /// The kernels for weights of type `t`, to fill in.
    pub(super) fn of_mut(&mut self, t: DType) -> &mut TypeKernels {
        &mut self.types[t as usize]
    }

    /// The tier's tile on weights packed in groups of 16 rows, if it has one.
    pub fn packed16(&self) -> Option<PackedTile> {
        self.packed16
    }

    /// Gives the tier a tile on packed weights.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(super) fn set_packed16(&mut self, tile: PackedTile) {
        self.packed16 = Some(tile);
    }

    /// The conversion of f32 activation rows to `act` (f32, f16, bf16, Q8_0, Q8_1 or Q8_K).
    pub fn convert(&self, act: DType) -> Option<ConvertFn> {
        self.converts.get(act as usize).copied().flatten()
    }

    /// `ggml_quantize_mat_q8_K_4x8`'s values for one row (in the plain Q8_K layout).
    pub fn convert_q8_k_4x8(&self) -> ConvertFn {
        self.convert_q8_k_4x8
    }

    /// Every tier's types, for the ones this tier has nothing faster for: entries of `self`
    /// left empty are taken from `base`.
    pub(super) fn fill_from(&mut self, base: &KernelTable) {
        for (t, b) in self.types.iter_mut().zip(&base.types) {
            t.vec_dot = t.vec_dot.or(b.vec_dot);
            t.tinyblas = t.tinyblas.or(b.tinyblas);
            t.tiled = t.tiled.or(b.tiled);
            t.repacked = t.repacked.or(b.repacked);
            t.repacked_gemm = t.repacked_gemm.or(b.repacked_gemm);
        }
    }
}

/// The table of the tier in use ([`super::isa`]).
pub fn table() -> &'static KernelTable {
    table_for(super::isa())
}

/// The table of tier `isa`, built on first use. Panics if this CPU lacks the tier (its
/// kernels could not run here).
pub fn table_for(isa: Isa) -> &'static KernelTable {
    assert!(
        super::isa_available(isa),
        "{isa:?} is not available on this CPU"
    );
    static TABLES: [OnceLock<KernelTable>; 5] = [const { OnceLock::new() }; 5];
    TABLES[isa as usize].get_or_init(|| match isa {
        Isa::Scalar => super::generic::table(),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => super::x86::avx2::table(),
        #[cfg(target_arch = "x86_64")]
        Isa::AvxVnni => super::x86::avxvnni::table(),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => super::x86::avx512::table(),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => super::aarch64::neon::table(),
        #[allow(unreachable_patterns)]
        _ => unreachable!("{isa:?} checked available above"),
    })
}

/// Bytes of a weight block, bytes of the activation values facing it (its `vec_dot_type`, in
/// as many blocks as cover the weight block's values) and values per weight block (`None`: no
/// quantized dot product).
#[inline]
pub const fn geometry(weight: DType) -> Option<(usize, usize, usize)> {
    match lamina_core::quant::vec_dot_type(weight) {
        Some(act) => {
            let qk = weight.block_size();
            Some((
                weight.type_size() as usize,
                (act.type_size() * (qk / act.block_size())) as usize,
                qk as usize,
            ))
        }
        None => None,
    }
}
