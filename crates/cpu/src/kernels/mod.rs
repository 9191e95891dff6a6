//! Kernels that replicate the arithmetic of llama.cpp's CPU backend (ggml-cpu built for x86-64
//! with AVX2/FMA/F16C, GCC `-O3`, default `-ffp-contract=fast`) bit for bit: the activation
//! quantizers, the per-type dot products with ggml's lane structure and reduction order, the
//! f16/f32 dots of `ggml_vec_dot_*` and of llamafile's tinyBLAS, softmax, SiLU/SwiGLU,
//! GELU/GeGLU (f16 table), RMS norm and RoPE.
//!
//! Every kernel has a portable scalar emulation that produces the same bits as the AVX2 code
//! (integer lane sums are exact; float steps are done in the same order with the same fused
//! multiply-adds), and an AVX2 implementation chosen at run time when the CPU has
//! AVX2+FMA+F16C. Results therefore do not depend on the machine.

// Index loops mirror the C code they replicate (lanes, blocks); keep them readable side by side.
#![allow(clippy::needless_range_loop)]

pub mod act;
pub mod dot;
pub mod fattn;
pub mod fdot;
pub mod matmul;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(target_arch = "aarch64")]
mod neon_iq;
pub mod quantize;
pub mod repack;
pub mod sort;
mod tile;

use std::sync::OnceLock;

pub use act::{
    geglu_row, gelu_row, norm_row, rms_norm_row, rope_cache, rope_rotate, silu_row, softmax_row,
    softmax_row_sink, swiglu_row,
};
pub use dot::{vec_dot, vec_dot_scalar};
pub use fdot::{tinyblas_dot_f16, tinyblas_dot_f32, tinyblas_f_applies, vec_dot_f16, vec_dot_f32};
pub use matmul::MatMul;
pub use quantize::{quantize_row_q8_0, quantize_row_q8_1, quantize_row_q8_k};

/// Environment variable that, set to `1`, makes every kernel use its scalar emulation (same
/// results, slower; for checking machine independence).
pub const FORCE_SCALAR_ENV: &str = "LAMINA_FORCE_SCALAR";

/// Environment variable capping the x86 kernel tier: `scalar`, `avx2` or `avx512` (the
/// default is the best the CPU has). Every tier gives the same bits; this is for measuring
/// and for checking exactly that.
pub const ISA_ENV: &str = "LAMINA_CPU_ISA";

/// x86 kernel tiers, lowest first. A tier's kernels may use faster instructions but must
/// produce the bits of the AVX2 arithmetic (integer sums are exact however they are formed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// The portable scalar emulation.
    Scalar,
    /// AVX2, FMA and F16C.
    Avx2,
    /// Also AVX-512 F/BW/VL and VNNI: 32 vector registers, mask registers and `vpdpbusd`.
    Avx512,
}

/// The kernel tier in use: the best the CPU supports, capped by [`ISA_ENV`] and
/// [`FORCE_SCALAR_ENV`]; checked once.
pub fn isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if std::env::var(FORCE_SCALAR_ENV).is_ok_and(|v| v == "1") {
            return Isa::Scalar;
        }
        let cap = match std::env::var(ISA_ENV).as_deref() {
            Ok("scalar") => Isa::Scalar,
            Ok("avx2") => Isa::Avx2,
            _ => Isa::Avx512,
        };
        detected_isa().min(cap)
    })
}

/// The best tier this CPU supports; checked once.
pub fn detected_isa() -> Isa {
    static ISA: OnceLock<Isa> = OnceLock::new();
    *ISA.get_or_init(detect_isa)
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
        Isa::Avx2
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        Isa::Scalar
    }
}

/// Whether the AVX2 implementations may run (AVX2, FMA and F16C present, and
/// [`FORCE_SCALAR_ENV`] not set to `1`); checked once.
pub fn simd_available() -> bool {
    isa() >= Isa::Avx2
}

/// How far ahead of the weight row being read [`prefetch_ahead`] fetches. Token generation
/// streams every weight once; on some machines (seen: an Intel Xeon VM) the hardware
/// prefetcher leaves a row-at-a-time dot waiting on memory (SmolLM2 Q4_1 tg128 at one
/// thread: 37 t/s without, 73 with; the distance swept with a prefetch per block inside the
/// kernel: 320 bytes 40, 1280 60, 2560 63, 4096 64, 8192 63).
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
pub(crate) mod x86 {
    //! Shared AVX2 helpers (ports of ggml's `hsum_float_8`, `mul_sum_i8_pairs_float`, ...).
    use std::arch::x86_64::*;

    /// `hsum_float_8`.
    #[inline(always)]
    pub unsafe fn hsum_float_8(x: __m256) -> f32 {
        // SAFETY: register-only intrinsics; the caller runs with AVX2 enabled.
        unsafe {
            let mut res = _mm256_extractf128_ps(x, 1);
            res = _mm_add_ps(res, _mm256_castps256_ps128(x));
            res = _mm_add_ps(res, _mm_movehl_ps(res, res));
            res = _mm_add_ss(res, _mm_movehdup_ps(res));
            _mm_cvtss_f32(res)
        }
    }

    /// `mul_sum_i8_pairs_float`: signed·signed bytes, pairs summed twice, as 8 floats.
    #[inline(always)]
    pub unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
        // SAFETY: register-only intrinsics; the caller runs with AVX2 enabled.
        unsafe {
            let ax = _mm256_sign_epi8(x, x);
            let sy = _mm256_sign_epi8(y, x);
            mul_sum_us8_pairs_float(ax, sy)
        }
    }

    /// `mul_sum_us8_pairs_float`: unsigned·signed bytes, pairs summed twice, as 8 floats.
    #[inline(always)]
    pub unsafe fn mul_sum_us8_pairs_float(ax: __m256i, sy: __m256i) -> __m256 {
        // SAFETY: register-only intrinsics; the caller runs with AVX2 enabled.
        unsafe {
            let dot = _mm256_maddubs_epi16(ax, sy);
            _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_set1_epi16(1), dot))
        }
    }

    /// Q6_K's scale shuffles: row `i` picks scale bytes `2i` (lanes 0–7) and `2i + 1` (8–15),
    /// as ggml's `get_scale_shuffle`.
    pub const K6_SHUFFLE: [[u8; 16]; 8] = {
        let mut t = [[0u8; 16]; 8];
        let mut i = 0;
        while i < 8 {
            let mut b = 0;
            while b < 16 {
                t[i][b] = (2 * i + b / 8) as u8;
                b += 1;
            }
            i += 1;
        }
        t
    };

    /// The largest `|v|` of `x` (a multiple of 8 values) and whether `x` holds a NaN; without
    /// NaNs the maximum is exact whatever the order. NaNs are skipped.
    #[inline(always)]
    pub unsafe fn absmax(x: &[f32]) -> (f32, bool) {
        // SAFETY: reads within `x`; AVX enabled by the caller.
        unsafe {
            let sign = _mm256_set1_ps(-0.0);
            let mut m = _mm256_setzero_ps();
            let mut nan = _mm256_setzero_ps();
            for c in x.chunks_exact(8) {
                let v = _mm256_loadu_ps(c.as_ptr());
                // `max(a, m)` returns `m` when `a` is NaN.
                m = _mm256_max_ps(_mm256_andnot_ps(sign, v), m);
                nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            }
            let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
            let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
            let h = _mm_max_ss(h, _mm_movehdup_ps(h));
            (_mm_cvtss_f32(h), _mm256_movemask_ps(nan) != 0)
        }
    }

    /// Q6_K scales `2i` and `2i + 1` of the 16 in `scales`, each in 8 i16 lanes.
    #[inline(always)]
    pub unsafe fn q6k_scale_shuffle(scales: __m128i, i: usize) -> __m256i {
        // SAFETY: reads row `i` of the table (`i < 8`, checked by the index); AVX2 enabled by
        // the caller.
        unsafe {
            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(
                scales,
                _mm_loadu_si128(K6_SHUFFLE[i].as_ptr() as *const __m128i),
            ))
        }
    }

    /// `bytes_from_nibbles_32`: low nibbles of 16 bytes, then their high nibbles.
    #[inline(always)]
    pub unsafe fn bytes_from_nibbles_32(p: *const u8) -> __m256i {
        // SAFETY: the caller passes 16 readable bytes and runs with AVX2 enabled.
        unsafe {
            let tmp = _mm_loadu_si128(p as *const __m128i);
            let bytes =
                _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
            _mm256_and_si256(_mm256_set1_epi8(0xF), bytes)
        }
    }

    /// `bytes_from_bits_32`: byte `b` is 0xFF when bit `b` of the 32 bits is set.
    #[inline(always)]
    pub unsafe fn bytes_from_bits_32(x32: u32) -> __m256i {
        // SAFETY: register-only intrinsics; the caller runs with AVX2 enabled.
        unsafe {
            let shuf_mask = _mm256_set_epi64x(
                0x0303030303030303,
                0x0202020202020202,
                0x0101010101010101,
                0x0000000000000000,
            );
            let mut bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x32 as i32), shuf_mask);
            let bit_mask = _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe);
            bytes = _mm256_or_si256(bytes, bit_mask);
            _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1))
        }
    }
}

#[cfg(test)]
mod tests;
