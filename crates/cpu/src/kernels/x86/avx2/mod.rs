//! The AVX2 tier (AVX2, FMA and F16C): ports of ggml's AVX2 kernels, and the scalar kernels
//! compiled with these features where ggml has no SIMD code of its own (the same operations,
//! so the same bits: `mul_add` is one fused rounding either way).

pub mod act;
pub mod dot;
pub mod fattn;
pub mod fdot;
pub mod quantize;
pub mod tile;

use lamina_core::DType;

use crate::kernels::generic::IQ_GRID;
use crate::kernels::table::{DotFn, Kernel, KernelTable, TileFn};
use crate::kernels::tile::{TileKind, x86_tiles};
use crate::kernels::{generic, matmul::as_f32, repack};

/// Defines `fn $name(n, x, y) -> f32` running `$body` compiled with AVX2/FMA/F16C (the body's
/// kernels are `#[inline(always)]`, so they are compiled into it).
macro_rules! with_fma {
    ($($name:ident($n:ident, $x:ident, $y:ident) => $body:expr;)*) => {$(
        fn $name($n: usize, $x: &[u8], $y: &[u8]) -> f32 {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn fast($n: usize, $x: &[u8], $y: &[u8]) -> f32 {
                $body
            }
            // SAFETY: reached only through the AVX2 and AVX-512 tables, which exist only where
            // AVX2/FMA/F16C are present.
            unsafe { fast($n, $x, $y) }
        }
    )*};
}

with_fma! {
    iq4_nl_tinyblas(n, x, y) => crate::kernels::dot::dot_iq4_nl_tinyblas(n, x, y);
    q6_k_tiled(n, x, y) => repack::dot_q6_k_tiled(n, x, y);
    q4_k_tiled(n, x, y) => repack::dot_q45_k_tiled(false, n, x, y);
    q5_k_tiled(n, x, y) => repack::dot_q45_k_tiled(true, n, x, y);
    q3_k_tiled(n, x, y) => repack::dot_q3_k_tiled(n, x, y);
    q2_k_tiled(n, x, y) => repack::dot_q2_k_tiled(n, x, y);
    iq4_xs_tiled(n, x, y) => repack::dot_iq4_xs_tiled(n, x, y);
    iq2_xxs_tiled(n, x, y) => repack::dot_iq_grid_tiled(DType::IQ2_XXS, n, x, y);
    iq2_xs_tiled(n, x, y) => repack::dot_iq_grid_tiled(DType::IQ2_XS, n, x, y);
    iq2_s_tiled(n, x, y) => repack::dot_iq_grid_tiled(DType::IQ2_S, n, x, y);
    iq3_xxs_tiled(n, x, y) => repack::dot_iq_grid_tiled(DType::IQ3_XXS, n, x, y);
    iq3_s_tiled(n, x, y) => repack::dot_iq_grid_tiled(DType::IQ3_S, n, x, y);
    iq1_s_tiled(n, x, y) => repack::dot_iq_grid_tiled(DType::IQ1_S, n, x, y);
    iq1_m_tiled(n, x, y) => repack::dot_iq_grid_tiled(DType::IQ1_M, n, x, y);
    q4_k_gemm(n, x, y) => repack::dot_q4_k_gemm(n, x, y);
    q4_0_repacked(n, x, y) => repack::dot_q0_repacked(false, n, x, y);
    iq4_nl_repacked(n, x, y) => repack::dot_q0_repacked(true, n, x, y);
    mxfp4_repacked(n, x, y) => repack::dot_mxfp4_repacked(n, x, y);
}

/// `ggml_gemv_q4_K_8x8_q8_K`'s value for one weight row (Q4_K) and one activation row
/// (Q8_K), as [`repack::dot_q4_k_gemv`], with each superblock's two exact integer sums formed
/// in vector lanes: `maddubs` pair sums (at most `2·15·128`) and their `madd` with the 6-bit
/// scales cannot overflow, so any order gives the same integers, and the two FMAs that follow
/// are the scalar ones. (The scalar loop, compiled with these features, was 4× llama.cpp's
/// time for this kernel: Gemma 3 tg128 on one Zen 4 core, 13 % against 3 % of the run.)
fn q4_k_gemv(n: usize, x: &[u8], y: &[u8]) -> f32 {
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fast(n: usize, x: &[u8], y: &[u8]) -> f32 {
        use std::arch::x86_64::*;
        let (mut acc, mut acc_min) = (0f32, 0f32);
        for (xb, yb) in x.chunks_exact(144).zip(y.chunks_exact(292)).take(n / 256) {
            let yd = f32::from_le_bytes([yb[0], yb[1], yb[2], yb[3]]);
            let (sc, mn) = crate::kernels::dot::q4k_scales_mins_pub(&xb[4..16]);
            // SAFETY: `xb` holds 144 bytes and `yb` 292 (whole chunks): the loads read
            // bytes 16..144 of `xb` and 4..292 of `yb`; AVX2 enabled by this function.
            let (sum, smin) = unsafe {
                let m4 = _mm256_set1_epi8(0xF);
                let mut s = _mm256_setzero_si256();
                for sb in 0..4 {
                    let bits = _mm256_loadu_si256(xb.as_ptr().add(16 + 32 * sb).cast());
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                    let y = yb.as_ptr().add(4 + 64 * sb);
                    let p = dot::k_pair_lanes(lo, hi, y, sc[2 * sb], sc[2 * sb + 1]);
                    s = _mm256_add_epi32(s, p);
                }
                // Σ min·bsum: bsum `i` (16 values) belongs to sub-block `i / 2`.
                let m = |i: usize| i16::from(mn[i]);
                let mins = _mm256_setr_epi16(
                    m(0),
                    m(0),
                    m(1),
                    m(1),
                    m(2),
                    m(2),
                    m(3),
                    m(3),
                    m(4),
                    m(4),
                    m(5),
                    m(5),
                    m(6),
                    m(6),
                    m(7),
                    m(7),
                );
                let bsums = _mm256_loadu_si256(yb.as_ptr().add(260).cast());
                (
                    tile::hsum_i32(s),
                    tile::hsum_i32(_mm256_madd_epi16(bsums, mins)),
                )
            };
            acc = (sum as f32).mul_add(crate::kernels::f16_at(xb, 0) * yd, acc);
            acc_min = (smin as f32).mul_add(crate::kernels::f16_at(xb, 2) * yd, acc_min);
        }
        acc - acc_min
    }
    // SAFETY: reached only through the AVX2 and AVX-512 tables, which exist only where
    // AVX2/FMA/F16C are present.
    unsafe { fast(n, x, y) }
}

/// `tiles!(Kind)`: the AVX2 tile kernel of one [`TileKind`], as a table entry.
macro_rules! tiles {
    ($kind:expr) => {
        Some((|k, w, a, out| x86_tiles::<false, { tile::DOT_AVX2 }>($kind, k, w, a, out)) as TileFn)
    };
}

fn vec_dot_f32(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (&as_f32(w)[..k], &as_f32(a)[..k]);
    // SAFETY: as in `with_fma!`; the slices hold `k` values.
    unsafe { fdot::vec_dot_f32(k, w, a) }
}

fn tinyblas_f32(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (&as_f32(w)[..k], &as_f32(a)[..k]);
    // SAFETY: as in `with_fma!`; the slices hold `k` values.
    unsafe { fdot::tinyblas_f32(k, w, a) }
}

fn vec_dot_f16(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (&w[..2 * k], &a[..2 * k]);
    // SAFETY: as in `with_fma!`; the slices hold `k` f16 values.
    unsafe { fdot::vec_dot_f16(k, w, a) }
}

fn tinyblas_f16(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (&w[..2 * k], &a[..2 * k]);
    // SAFETY: as in `with_fma!`; the slices hold `k` f16 values.
    unsafe { fdot::tinyblas_f16(k, w, a) }
}

fn vec_dot_bf16(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (&w[..2 * k], &a[..2 * k]);
    // SAFETY: as in `with_fma!`; the slices hold `k` bf16 values.
    unsafe { fattn::vec_dot_bf16(k, w, a) }
}

fn tinyblas_bf16(k: usize, w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (&w[..2 * k], &a[..2 * k]);
    // SAFETY: as in `with_fma!`; the slices hold `k` bf16 values.
    unsafe { fdot::tinyblas_bf16(k, w, a) }
}

/// `ggml_quantize_mat_q8_K_4x8`'s values with an AVX2 search for the block maximum.
fn q8_k_4x8(x: &[f32], out: &mut [u8]) {
    crate::kernels::quantize::check_q8_k(x, out);
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn fast(x: &[f32], out: &mut [u8]) {
        for (xb, ob) in x.chunks_exact(256).zip(out.chunks_exact_mut(292)) {
            // SAFETY: AVX enabled here. Without NaNs the scalar scan's maximum is the plain
            // maximum; with one, the scan's result depends on the order: take it.
            let (amax, nan) = unsafe { crate::kernels::x86::absmax(xb) };
            let amax = if nan { repack::scan_amax(xb) } else { amax };
            // SAFETY: AVX2 enabled here; a whole block of each.
            unsafe { q8_k_4x8_block(xb, ob, amax) };
        }
    }
    /// `repack::quantize_q8_k_4x8_block` in vectors: the same product, ties-to-even
    /// rounding, out-of-range and NaN to `i32::MIN` (what `cvtps_epi32` gives), clamped by
    /// two saturating packs.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn q8_k_4x8_block(xb: &[f32], ob: &mut [u8], amax: f32) {
        use std::arch::x86_64::*;
        // SAFETY: 256 values in `xb`, 292 bytes in `ob` (the caller's chunks).
        unsafe {
            let xp = xb.as_ptr();
            let target = _mm256_set1_ps(amax);
            let mut hit = _mm256_setzero_ps();
            for c in 0..32 {
                hit = _mm256_or_ps(
                    hit,
                    _mm256_cmp_ps(_mm256_loadu_ps(xp.add(8 * c)), target, _CMP_EQ_OQ),
                );
            }
            let (iscale, d) = repack::q8_k_4x8_scales(amax, _mm256_movemask_ps(hit) != 0);
            ob[..4].copy_from_slice(&d.to_le_bytes());
            let mul = _mm256_set1_ps(iscale);
            let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
            let q = ob.as_mut_ptr().add(4);
            for c in 0..8 {
                // (A plain loop: a closure would not inherit the target features.)
                let mut i = [_mm256_setzero_si256(); 4];
                for (v, iv) in i.iter_mut().enumerate() {
                    let x = _mm256_loadu_ps(xp.add(32 * c + 8 * v));
                    *iv = _mm256_cvtps_epi32(_mm256_round_ps(
                        _mm256_mul_ps(x, mul),
                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
                    ));
                }
                let p = _mm256_packs_epi16(
                    _mm256_packs_epi32(i[0], i[1]),
                    _mm256_packs_epi32(i[2], i[3]),
                );
                let p = _mm256_permutevar8x32_epi32(p, order);
                _mm256_storeu_si256(q.add(32 * c).cast(), p);
            }
        }
        // SAFETY: AVX2 enabled here; the block's quants and bsums.
        unsafe { quantize::q8_k_bsums(ob.as_ptr().add(4), ob.as_mut_ptr().add(260)) };
    }
    // SAFETY: as in `with_fma!`; the same operations (no `mul_add`, so nothing is
    // contracted), with SSE4.1 rounding instead of a libm call.
    unsafe { fast(x, out) }
}

/// The AVX2 tier's table: its kernels where it has them, the scalar tier's elsewhere.
pub(crate) fn table() -> KernelTable {
    let mut t = KernelTable::new(
        crate::kernels::Isa::Avx2,
        quantize::quantize_row_q8_0,
        quantize::quantize_row_q8_1,
        quantize::quantize_row_q8_k,
        q8_k_4x8,
    );
    for dtype in DType::ALL {
        if let Some(f) = dot::dot_fn(dtype) {
            t.of_mut(dtype).vec_dot = Some(Kernel::dot(f));
        }
    }
    // ggml_vec_dot_* (and tinyBLAS_Q0, the same per output) in tiles.
    let vec_dot_tiles: [(DType, Option<TileFn>); 5] = [
        (DType::Q4_0, tiles!(TileKind::Q0(0))),
        (DType::Q5_0, tiles!(TileKind::Q0(1))),
        (DType::Q8_0, tiles!(TileKind::Q0(2))),
        (DType::Q4_1, tiles!(TileKind::Q1(false))),
        (DType::Q5_1, tiles!(TileKind::Q1(true))),
    ];
    for (dtype, tile) in vec_dot_tiles {
        if let Some(k) = &mut t.of_mut(dtype).vec_dot {
            k.tile = tile;
        }
    }
    let f32s = t.of_mut(DType::F32);
    f32s.vec_dot = Some(Kernel::dot(vec_dot_f32));
    f32s.tinyblas = Some(Kernel {
        dot: tinyblas_f32,
        tile: tiles!(TileKind::F32Tiny),
    });
    let f16s = t.of_mut(DType::F16);
    f16s.vec_dot = Some(Kernel::dot(vec_dot_f16));
    f16s.tinyblas = Some(Kernel {
        dot: tinyblas_f16,
        tile: tiles!(TileKind::F16Tiny),
    });
    let bf16s = t.of_mut(DType::BF16);
    bf16s.vec_dot = Some(Kernel::dot(vec_dot_bf16));
    bf16s.tinyblas = Some(Kernel::dot(tinyblas_bf16));
    t.of_mut(DType::IQ4_NL).tinyblas = Some(Kernel {
        dot: iq4_nl_tinyblas,
        tile: tiles!(TileKind::Q0(3)),
    });

    let tiled: [(DType, DotFn, Option<TileFn>); 6] = [
        (DType::Q6_K, q6_k_tiled, tiles!(TileKind::Q6KTiled)),
        (DType::Q4_K, q4_k_tiled, tiles!(TileKind::Q45KTiled(false))),
        (DType::Q5_K, q5_k_tiled, tiles!(TileKind::Q45KTiled(true))),
        (DType::Q3_K, q3_k_tiled, tiles!(TileKind::Q3KTiled)),
        (DType::Q2_K, q2_k_tiled, tiles!(TileKind::Q2KTiled)),
        (DType::IQ4_XS, iq4_xs_tiled, tiles!(TileKind::Iq4XsTiled)),
    ];
    for (dtype, dot, tile) in tiled {
        t.of_mut(dtype).tiled = Some(Kernel { dot, tile });
    }
    let grid: [(DotFn, Option<TileFn>); 7] = [
        (iq2_xxs_tiled, tiles!(TileKind::IqGridTiled(DType::IQ2_XXS))),
        (iq2_xs_tiled, tiles!(TileKind::IqGridTiled(DType::IQ2_XS))),
        (iq2_s_tiled, tiles!(TileKind::IqGridTiled(DType::IQ2_S))),
        (iq3_xxs_tiled, tiles!(TileKind::IqGridTiled(DType::IQ3_XXS))),
        (iq3_s_tiled, tiles!(TileKind::IqGridTiled(DType::IQ3_S))),
        (iq1_s_tiled, tiles!(TileKind::IqGridTiled(DType::IQ1_S))),
        (iq1_m_tiled, tiles!(TileKind::IqGridTiled(DType::IQ1_M))),
    ];
    for (dtype, (dot, tile)) in IQ_GRID.into_iter().zip(grid) {
        t.of_mut(dtype).tiled = Some(Kernel { dot, tile });
    }

    let q4k = t.of_mut(DType::Q4_K);
    q4k.repacked = Some(Kernel {
        dot: q4_k_gemv,
        tile: tiles!(TileKind::Q4KGemv),
    });
    q4k.repacked_gemm = Some(Kernel {
        dot: q4_k_gemm,
        tile: tiles!(TileKind::Q4KGemm),
    });
    t.of_mut(DType::Q4_0).repacked = Some(Kernel {
        dot: q4_0_repacked,
        tile: tiles!(TileKind::Q0Chain(0)),
    });
    t.of_mut(DType::IQ4_NL).repacked = Some(Kernel {
        dot: iq4_nl_repacked,
        tile: tiles!(TileKind::Q0Chain(3)),
    });
    t.of_mut(DType::MXFP4).repacked = Some(Kernel {
        dot: mxfp4_repacked,
        tile: tiles!(TileKind::Q0Chain(4)),
    });

    t.fill_from(&generic::table());
    t
}
