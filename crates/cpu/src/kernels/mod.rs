//! Kernels that replicate the arithmetic of llama.cpp's CPU backend (ggml-cpu built for x86-64
//! with AVX2/FMA/F16C, GCC `-O3`, default `-ffp-contract=fast`) bit for bit: the activation
//! quantizers, the per-type dot products with ggml's lane structure and reduction order, the
//! f16/f32 dots of `ggml_vec_dot_*` and of llamafile's tinyBLAS, softmax, SiLU/SwiGLU,
//! GELU/GeGLU (f16 table), RMS norm and RoPE.
//!
//! Every kernel has a portable scalar emulation that produces the same bits as the AVX2 code
//! (integer lane sums are exact; float steps are done in the same order with the same fused
//! multiply-adds), and SIMD versions chosen at run time. Results therefore do not depend on the
//! machine. The matrix-product kernels (activation quantizers, dots, tiles) sit in one
//! [`KernelTable`] per tier ([`Isa`]: `generic`, `x86::avx2`, `x86::avxvnni`, `x86::avx512`,
//! `aarch64::neon`), indexed by type and built once; [`MatMul`] chooses llama.cpp's path and
//! looks its kernels up there.

// Index loops mirror the C code they replicate (lanes, blocks); keep them readable side by side.
#![allow(clippy::needless_range_loop)]

#[cfg(target_arch = "aarch64")]
mod aarch64;
pub mod act;
pub mod dot;
pub mod fattn;
pub mod fdot;
mod generic;
pub mod matmul;
pub mod pack16;
pub mod quantize;
pub mod repack;
pub mod sort;
pub mod table;
mod tile;

use std::sync::OnceLock;

pub use act::{
    geglu_row, gelu_row, norm_row, rms_norm_row, rms_norm_scale, rope_cache, rope_rotate, silu_row,
    softmax_row, softmax_row_sink, sum_sq_rows4, swiglu_row,
};
pub use dot::{vec_dot, vec_dot_scalar};
pub use fdot::{tinyblas_dot_f16, tinyblas_dot_f32, tinyblas_f_applies, vec_dot_f16, vec_dot_f32};
pub use matmul::MatMul;
pub use quantize::{quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k};
pub use table::{KernelTable, table, table_for};

/// Environment variable that, set to `1`, makes every kernel use its scalar emulation (same
/// results, slower; for checking machine independence).
pub const FORCE_SCALAR_ENV: &str = "LAMINA_FORCE_SCALAR";

/// Environment variable capping the x86 kernel tier: `scalar`, `avx2`, `avxvnni` or `avx512`
/// (the default is the best the CPU has). Every tier gives the same bits; this is for measuring
/// and for checking exactly that.
pub const ISA_ENV: &str = "LAMINA_CPU_ISA";

/// Kernel tiers: the portable scalar code and the instruction sets with kernels of their own.
/// Every tier produces the bits of the scalar code (integer sums are exact however they are
/// formed; float steps keep their order and fusing); each has its [`KernelTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Isa {
    /// The portable scalar emulation.
    Scalar = 0,
    /// x86-64: AVX2, FMA and F16C.
    Avx2 = 1,
    /// x86-64: also AVX-512 F/BW/VL and VNNI (32 vector registers, mask registers and
    /// `vpdpbusd`); the AVX2 kernels where it has none of its own.
    Avx512 = 2,
    /// aarch64: NEON.
    Neon = 3,
    /// x86-64: AVX2 with AVX-VNNI (`vpdpbusd` in its VEX form), without AVX-512: the AVX2
    /// kernels, with the Q0/Q1 offset tiles on `vpdpbusd`.
    AvxVnni = 4,
}

impl Isa {
    /// The tier's name, as [`ISA_ENV`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }
}

/// The kernel tier in use: the best the CPU supports, capped by [`ISA_ENV`] and
/// [`FORCE_SCALAR_ENV`]; checked once.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var(FORCE_SCALAR_ENV).is_ok_and(|v| v == "1") {
            return Isa::Scalar;
        }
        match (detected_isa(), std::env::var(ISA_ENV).as_deref()) {
            (_, Ok("scalar")) => Isa::Scalar,
            (Isa::Avx512 | Isa::AvxVnni, Ok("avx2")) => Isa::Avx2,
            // A cap: on an AVX-512 CPU without the VEX form, the tier below it.
            (Isa::Avx512, Ok("avxvnni")) if isa_available(Isa::AvxVnni) => Isa::AvxVnni,
            (Isa::Avx512, Ok("avxvnni")) => Isa::Avx2,
            (best, _) => best,
        }
    })
}

/// The best tier this CPU supports; checked once.
pub fn detected_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(detect_isa)
}

/// Whether this CPU can run tier `isa`'s kernels.
pub fn isa_available(isa: Isa) -> bool {
    match (isa, detected_isa()) {
        (Isa::Scalar, _) => true,
        (Isa::Avx2, best) => matches!(best, Isa::Avx2 | Isa::AvxVnni | Isa::Avx512),
        (Isa::AvxVnni, best) => matches!(best, Isa::AvxVnni | Isa::Avx512) && has_avx_vnni(),
        (wanted, best) => wanted == best,
    }
}

/// The tiers this CPU can run, scalar first.
pub fn available_isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512, Isa::Neon]
        .into_iter()
        .filter(|&i| isa_available(i))
        .collect()
}

/// Whether the CPU runs 512-bit vector operations as two 256-bit halves with the 256-bit
/// throughput (AMD Zen 4: family 19h with AVX-512), so that 16-lane registers buy no
/// arithmetic and kernels that pair two 8-lane chains in one lose to plain 8-lane ones with
/// AVX-512's 32 registers (tinyBLAS f16 tiles: 34 against 49 GMAC/s on one Zen 4 core). Zen 5
/// and Intel cores with AVX-512 are taken to have the full width (Golden Cove measured);
/// checked once.
pub fn splits_512() -> bool {
    static SPLITS: OnceLock<bool> = OnceLock::new();
    *SPLITS.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::__cpuid;
            let (vendor, sig) = (__cpuid(0), __cpuid(1).eax);
            let amd =
                (vendor.ebx, vendor.edx, vendor.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163);
            let base = (sig >> 8) & 0xF;
            let family = if base == 0xF {
                base + ((sig >> 20) & 0xFF)
            } else {
                base
            };
            amd && family == 0x19
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// Whether the CPU has AVX-VNNI (the VEX form of `vpdpbusd`).
fn has_avx_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avxvnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

fn detect_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if !(has!("avx2") && has!("fma") && has!("f16c")) {
            return Isa::Scalar;
        }
        if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
            return Isa::Avx512;
        }
        if has_avx_vnni() {
            return Isa::AvxVnni;
        }
        Isa::Avx2
    }
    #[cfg(target_arch = "aarch64")]
    {
        if std::arch::is_aarch64_feature_detected!("neon") {
            return Isa::Neon;
        }
        Isa::Scalar
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        Isa::Scalar
    }
}

/// Whether the x86 AVX2 implementations may run (the tier in use is AVX2, AVX-VNNI or
/// AVX-512).
pub fn simd_available() -> bool {
    matches!(isa(), Isa::Avx2 | Isa::AvxVnni | Isa::Avx512)
}

/// The range of `row` outside which every value is `-inf`: (index of the first other value,
/// one past the last), or `None` when the whole row is `-inf` (a mask row: columns outside
/// the range are hidden). Eight values at a time where the CPU has AVX2.
pub fn unmasked_span(row: &[f32]) -> Option<(usize, usize)> {
    let hidden = |v: &f32| *v == f32::NEG_INFINITY;
    #[cfg(target_arch = "x86_64")]
    if simd_available() {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn fast(row: &[f32]) -> Option<(usize, usize)> {
            use std::arch::x86_64::*;
            /// Whether a group of 8 holds a value other than `-inf`. (A function, not a
            /// closure: inlined here, it takes this function's target features.)
            #[inline(always)]
            fn open(c: &[f32]) -> bool {
                // SAFETY: 8 values at `c` (whole chunks); AVX enabled by the caller.
                unsafe {
                    let v = _mm256_loadu_ps(c.as_ptr());
                    let ninf = _mm256_set1_ps(f32::NEG_INFINITY);
                    _mm256_movemask_ps(_mm256_cmp_ps(v, ninf, _CMP_NEQ_UQ)) != 0
                }
            }
            let n8 = row.len() / 8 * 8;
            let hidden = |v: &f32| *v == f32::NEG_INFINITY;
            // First: whole groups of 8, then within the group (or the tail).
            let g = row[..n8]
                .chunks_exact(8)
                .position(open)
                .map_or(n8, |g| 8 * g);
            let first = g + row[g..].iter().position(|v| !hidden(v))?;
            let tail_last = row[n8..].iter().rposition(|v| !hidden(v));
            let last = match tail_last {
                Some(i) => n8 + i,
                None => {
                    let g = row[..n8].chunks_exact(8).rposition(open)?;
                    8 * g + row[8 * g..8 * g + 8].iter().rposition(|v| !hidden(v))?
                }
            };
            Some((first, last + 1))
        }
        // SAFETY: AVX2 present (`simd_available`).
        return unsafe { fast(row) };
    }
    let first = row.iter().position(|v| !hidden(v))?;
    let last = row.iter().rposition(|v| !hidden(v))?;
    Some((first, last + 1))
}

/// How far ahead of the weight row being read [`prefetch_ahead`] fetches. Token generation
/// streams every weight once; on some machines (seen: an Intel Xeon VM) the hardware
/// prefetcher leaves a row-at-a-time dot waiting on memory (SmolLM2 Q4_1 tg128 at one
/// thread: 37 t/s without, 73 with; the distance swept with a prefetch per block inside the
/// kernel: 320 bytes 40, 1280 60, 2560 63, 4096 64, 8192 63).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const PREFETCH_DISTANCE: usize = 4096;

/// Asks the cache for the `len` bytes that lie [`PREFETCH_DISTANCE`] past `row`: the rows
/// a gemv reads next (weight rows sit one after another). A hint only: no result changes.
#[inline(always)]
pub(crate) fn prefetch_ahead(row: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        let start = row.as_ptr().wrapping_add(PREFETCH_DISTANCE);
        for off in (0..row.len()).step_by(64) {
            // SAFETY: a prefetch never faults, whatever the address (it may lie past the
            // tensor or the mapping); SSE is part of x86-64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(off) as *const i8) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// [`prefetch_ahead`] for each of `rows`: a tile kernel's group of weight rows, so a decode
/// step (which streams the weights once, as a gemv does) finds the rows after them cached.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[inline(always)]
pub(crate) fn prefetch_rows(rows: &[&[u8]]) {
    for row in rows {
        prefetch_ahead(row);
    }
}

/// `GGML_CPU_FP16_TO_FP32` of the little-endian f16 at `b[off..off + 2]`.
#[inline(always)]
pub(crate) fn f16_at(b: &[u8], off: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[off], b[off + 1]])).to_f32()
}

/// bf16 value `i` of little-endian bytes `b`, widened to f32 (exact).
#[inline(always)]
pub(crate) fn bf16s(b: &[u8], i: usize) -> f32 {
    f32::from_bits(u32::from(u16::from_le_bytes([b[2 * i], b[2 * i + 1]])) << 16)
}

/// `GGML_CPU_FP32_TO_FP16` (F16C `vcvtps2ph` with round-to-nearest-even) as bits.
#[inline(always)]
pub fn fp32_to_fp16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

/// `GGML_CPU_FP16_TO_FP32` of f16 bits.
#[inline(always)]
pub fn fp16_to_fp32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

/// ggml's `hsum_float_8` (and tinyBLAS's `hsum(__m256)`):
/// `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`.
#[inline(always)]
pub(crate) fn hsum8(a: &[f32; 8]) -> f32 {
    let t = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (t[0] + t[2]) + (t[1] + t[3])
}

/// `GGML_F32x8_REDUCE` over four 8-lane accumulators (used by `ggml_vec_dot_f32/f16`):
/// pairwise adds of the accumulators, then `hadd(hadd(lo + hi))`, i.e.
/// `(t0+t1)+(t2+t3)` with `t = lo + hi`.
#[inline(always)]
pub(crate) fn reduce_f32x8x4(s: &mut [[f32; 8]; 4]) -> f32 {
    for l in 0..8 {
        s[0][l] += s[2][l];
        s[1][l] += s[3][l];
    }
    for l in 0..8 {
        s[0][l] += s[1][l];
    }
    let t = [
        s[0][0] + s[0][4],
        s[0][1] + s[0][5],
        s[0][2] + s[0][6],
        s[0][3] + s[0][7],
    ];
    (t[0] + t[1]) + (t[2] + t[3])
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

#[cfg(test)]
mod tests;
