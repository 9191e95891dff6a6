//! Register-blocked tiles of a matrix product: a few weight rows × a few activation rows per
//! call, each output computed with exactly the operation sequence of its single-output kernel
//! (same exact integer sums, same FMA chain in the same order, same horizontal sum), so the
//! results are bit-identical to [`super::matmul::MatMul::dot`]. What a tile shares is only work
//! that does not round: loading and unpacking a weight block once for several activation rows,
//! and an activation block once for several weight rows. Independent FMA chains of different
//! outputs also overlap, which a single dot product cannot do.
//!
//! AVX2 (with `vpdpbusd` in the offset tiles where the CPU has VNNI), plus AVX-512 VNNI tiles
//! for IQ4_NL and the repacked Q0 chains (`avx512`), reached through the x86 tiers' kernel
//! tables ([`x86_tiles`]). A tile kernel may decline a shape (returning `false`), and the
//! caller then computes the outputs one at a time.

use lamina_core::DType;

/// The per-output arithmetic a tile kernel reproduces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) enum TileKind {
    /// `ggml_vec_dot_<t>_q8_0` / tinyBLAS_Q0: one 8-lane FMA chain of `fma(dx*dy, lanes, acc)`,
    /// then `hsum_float_8`, for Q4_0 (0), Q5_0 (1), Q8_0 (2) and IQ4_NL under tinyBLAS (3).
    Q0(u8),
    /// Q4_0 (0), IQ4_NL (3) or MXFP4 (4, `dx` = `e8m0_to_fp32_half`) repacked to 8x8:
    /// `acc = fma((float)Σq·q8, dx*dy, acc)`.
    Q0Chain(u8),
    /// The tiled IQ4_XS kernel per output.
    Iq4XsTiled,
    /// The tiled kernel of a grid i-quant (IQ2_*, IQ3_*, IQ1_*) per output.
    IqGridTiled(lamina_core::DType),
    /// The tiled Q2_K kernel per output.
    Q2KTiled,
    /// The tiled Q4_K (`false`) or Q5_K (`true`) kernel per output.
    Q45KTiled(bool),
    /// The tiled Q3_K kernel per output.
    Q3KTiled,
    /// `ggml_vec_dot_q4_1_q8_1` (`false`) or `ggml_vec_dot_q5_1_q8_1` (`true`).
    Q1(bool),
    /// `ggml_gemv_q4_K_8x8_q8_K` per output.
    Q4KGemv,
    /// `ggml_gemm_q4_K_8x8_q8_K` per output.
    Q4KGemm,
    /// The tiled Q6_K kernel per output.
    Q6KTiled,
    /// tinyBLAS f16.
    F16Tiny,
    /// tinyBLAS f32.
    F32Tiny,
}

impl TileKind {
    /// The weight type whose rows the kernel reads.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fn dtype(self) -> DType {
        match self {
            TileKind::Q0(t) | TileKind::Q0Chain(t) => [
                DType::Q4_0,
                DType::Q5_0,
                DType::Q8_0,
                DType::IQ4_NL,
                DType::MXFP4,
            ][t as usize],
            TileKind::Iq4XsTiled => DType::IQ4_XS,
            TileKind::Q2KTiled => DType::Q2_K,
            TileKind::Q45KTiled(q5) => [DType::Q4_K, DType::Q5_K][q5 as usize],
            TileKind::Q3KTiled => DType::Q3_K,
            TileKind::IqGridTiled(t) => t,
            TileKind::Q1(q5) => [DType::Q4_1, DType::Q5_1][q5 as usize],
            TileKind::Q4KGemv | TileKind::Q4KGemm => DType::Q4_K,
            TileKind::Q6KTiled => DType::Q6_K,
            TileKind::F16Tiny => DType::F16,
            TileKind::F32Tiny => DType::F32,
        }
    }

    /// (values per block, weight block bytes, activation block bytes); the f32 and f16 tiles
    /// read groups of 8 values.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    #[inline]
    fn geometry(self) -> (usize, usize, usize) {
        match self.dtype() {
            f @ (DType::F16 | DType::F32) => {
                (8, 8 * f.type_size() as usize, 8 * f.type_size() as usize)
            }
            t => {
                let (bx, by, qk) = super::table::geometry(t).expect("a quantized type");
                (qk, bx, by)
            }
        }
    }
}

/// Checks that every row of a tile holds the `k / qk` blocks of `kind` that the kernels read,
/// and gives that block count.
#[cfg(target_arch = "x86_64")]
fn checked_blocks(kind: TileKind, k: usize, w: &[&[u8]], acts: &[&[u8]], out: &[f32]) -> usize {
    let (qk, bx, by) = kind.geometry();
    let nb = k / qk;
    // The shortest rows, without early exits: a branch per row costs more than the reads.
    let shortest = |rows: &[&[u8]]| rows.iter().fold(usize::MAX, |m, r| m.min(r.len()));
    assert!(
        out.len() >= w.len() * acts.len() && shortest(w) >= nb * bx && shortest(acts) >= nb * by,
        "tile rows too short"
    );
    nb
}

/// Whether a tile of one activation row beats output-by-output dots: a single activation row
/// (token generation) streams the weights once, and row after row reads memory sequentially,
/// except for the repacked Q0 chains, whose 4×1 tiles still win (their per-output kernel is
/// scalar).
#[cfg(target_arch = "x86_64")]
fn worth_it(kind: TileKind, na: usize) -> bool {
    na > 1 || matches!(kind, TileKind::Q0Chain(_))
}

/// The x86 tiers' tiles: `out[j * w.len() + i]` = the output of weight row `w[i]` and
/// activation row `acts[j]` (rows of `k` values); `false` (with `out` untouched) where a tile
/// would not be faster. `VNNI` names the `vpdpbusd` form the tier has (`avx2::DOT_*`): with
/// one, the Q4_0/Q5_0/Q8_0/Q4_1/Q5_1 products go to the offset tiles built on it
/// ([`avx2::run_vnni`]); then, where `AVX512` is set, the AVX-512 kernels take what they
/// cover ([`avx512::covers`]); the AVX2 ones the rest. The same bits either way. (The AVX-512
/// tier once had 4×4 Q4_K and Q6_K tiles too; the AVX2 `q4k_chain8`/`q6k_chain8` beat them
/// on a Golden Cove core, Gemma 3 pp512 +4–5 %, and took their place.)
#[cfg(target_arch = "x86_64")]
pub(crate) fn x86_tiles<const AVX512: bool, const VNNI: u8>(
    kind: TileKind,
    k: usize,
    w: &[&[u8]],
    acts: &[&[u8]],
    out: &mut [f32],
) -> bool {
    if !worth_it(kind, acts.len()) {
        return false;
    }
    let nb = checked_blocks(kind, k, w, acts, out);
    if AVX512 && avx512::rows16_covers(kind, nb, w.len(), acts.len()) {
        // SAFETY: as below; every row holds `nb` blocks (checked above); `rows16_covers` holds.
        unsafe { avx512::rows16(kind, nb, w, acts, out) };
        return true;
    }
    // SAFETY: a `VNNI` form is named only by the tables of the tiers that have it (AVX-VNNI,
    // AVX-512 with VNNI), which exist only where it is detected; every row holds `nb` blocks
    // (checked above).
    if VNNI != avx2::DOT_AVX2 && unsafe { avx2::run_vnni::<VNNI>(kind, nb, w, acts, out) } {
        return true;
    }
    if AVX512
        && matches!(kind, TileKind::Q0(_) | TileKind::Q1(_))
        && (acts.len() > avx2::MAX_A || w.len() > avx2::MAX_W)
        && avx512::covers(kind, nb, w.len().min(avx2::MAX_W), avx2::MAX_A)
    {
        // A wide call (`MatMul::wide_tiles`, `MatMul::weight_rows_per_call`, for the AVX2
        // tables) of a type the offset tiles do not take (IQ4_NL), in the AVX-512 kernels'
        // calls of up to `MAX_W` × `MAX_A` rows.
        let nw = w.len();
        let mut piece = [0f32; avx2::MAX_W * avx2::MAX_A];
        for (c, chunk) in acts.chunks(avx2::MAX_A).enumerate() {
            for (wc, rows) in w.chunks(avx2::MAX_W).enumerate() {
                let o = &mut piece[..chunk.len() * rows.len()];
                if avx512::covers(kind, nb, rows.len(), chunk.len()) {
                    // SAFETY: as below.
                    unsafe { avx512::run(kind, nb, rows, chunk, o) };
                } else {
                    // SAFETY: as below.
                    unsafe { avx2::run(kind, nb, rows, chunk, o) };
                }
                for (j, r) in o.chunks_exact(rows.len()).enumerate() {
                    let at = (c * avx2::MAX_A + j) * nw + wc * avx2::MAX_W;
                    out[at..at + rows.len()].copy_from_slice(r);
                }
            }
        }
    } else if AVX512 && avx512::covers(kind, nb, w.len(), acts.len()) {
        // SAFETY: `AVX512` is set only in the AVX-512 kernel table, which exists only where
        // that tier is detected; every row holds `nb` blocks (checked above); `covers` holds.
        unsafe { avx512::run(kind, nb, w, acts, out) };
    } else {
        // SAFETY: reached only through the x86 kernel tables, which exist only where
        // AVX2/FMA/F16C are present; every row holds `nb` blocks (checked above).
        unsafe { avx2::run(kind, nb, w, acts, out) };
    }
    true
}

/// `rows[start + i]` for `i < N`, the last of `rows` repeated past its end, as pointers. A
/// plain loop: the tile drivers run under target features, and a closure there (`from_fn`,
/// `map`) would not inherit them and would stay a call.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn row_ptrs<const N: usize>(rows: &[&[u8]], start: usize) -> [*const u8; N] {
    let mut p = [std::ptr::null(); N];
    for (i, pi) in p.iter_mut().enumerate() {
        *pi = rows[(start + i).min(rows.len() - 1)].as_ptr();
    }
    p
}

#[cfg(target_arch = "x86_64")]
use super::x86::avx512::tile as avx512;

#[cfg(target_arch = "x86_64")]
use super::x86::avx2::tile as avx2;
