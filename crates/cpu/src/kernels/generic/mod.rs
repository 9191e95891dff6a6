//! The scalar tier: the portable emulation of llama.cpp's x86 AVX2 arithmetic that every other
//! tier must match bit for bit, and that runs where no SIMD tier does.

use lamina_core::DType;

use super::table::{Kernel, KernelTable};
use super::{dot, fattn, fdot, matmul::as_f32, quantize, repack};

/// The grid i-quants, whose tiled kernel is one function of the type.
pub(super) const IQ_GRID: [DType; 7] = [
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ1_S,
    DType::IQ1_M,
];

/// The scalar tier's table.
pub(super) fn table() -> KernelTable {
    let mut t = KernelTable::new(
        super::Isa::Scalar,
        quantize::quantize_row_q8_0_scalar,
        quantize::quantize_row_q8_1_scalar,
        quantize::quantize_row_q8_k_scalar,
        q8_k_4x8,
    );
    for dtype in DType::ALL {
        if let Some(f) = dot::scalar_dot_fn(dtype) {
            t.of_mut(dtype).vec_dot = Some(Kernel::dot(f));
        }
    }
    let f32s = t.of_mut(DType::F32);
    f32s.vec_dot = Some(Kernel::dot(|k, w, a| {
        fdot::vec_dot_f32_scalar(k, as_f32(w), as_f32(a))
    }));
    f32s.tinyblas = Some(Kernel::dot(|k, w, a| {
        fdot::tinyblas_dot_f32_scalar(k, as_f32(w), as_f32(a))
    }));
    let f16s = t.of_mut(DType::F16);
    f16s.vec_dot = Some(Kernel::dot(fdot::vec_dot_f16_scalar));
    f16s.tinyblas = Some(Kernel::dot(fdot::tinyblas_dot_f16_scalar));
    let bf16s = t.of_mut(DType::BF16);
    bf16s.vec_dot = Some(Kernel::dot(fattn::vec_dot_bf16_scalar));
    bf16s.tinyblas = Some(Kernel::dot(fdot::tinyblas_dot_bf16_scalar));
    t.of_mut(DType::IQ4_NL).tinyblas = Some(Kernel::dot(repack::scalar::dot_iq4_nl_tinyblas));

    let tiled: [(DType, super::table::DotFn); 6] = [
        (DType::Q6_K, repack::dot_q6_k_tiled),
        (DType::Q4_K, |n, x, y| {
            repack::dot_q45_k_tiled(false, n, x, y)
        }),
        (DType::Q5_K, |n, x, y| {
            repack::dot_q45_k_tiled(true, n, x, y)
        }),
        (DType::Q3_K, repack::dot_q3_k_tiled),
        (DType::Q2_K, repack::dot_q2_k_tiled),
        (DType::IQ4_XS, repack::dot_iq4_xs_tiled),
    ];
    for (dtype, f) in tiled {
        t.of_mut(dtype).tiled = Some(Kernel::dot(f));
    }
    let grid: [super::table::DotFn; 7] = [
        |n, x, y| repack::dot_iq_grid_tiled(DType::IQ2_XXS, n, x, y),
        |n, x, y| repack::dot_iq_grid_tiled(DType::IQ2_XS, n, x, y),
        |n, x, y| repack::dot_iq_grid_tiled(DType::IQ2_S, n, x, y),
        |n, x, y| repack::dot_iq_grid_tiled(DType::IQ3_XXS, n, x, y),
        |n, x, y| repack::dot_iq_grid_tiled(DType::IQ3_S, n, x, y),
        |n, x, y| repack::dot_iq_grid_tiled(DType::IQ1_S, n, x, y),
        |n, x, y| repack::dot_iq_grid_tiled(DType::IQ1_M, n, x, y),
    ];
    for (dtype, f) in IQ_GRID.into_iter().zip(grid) {
        t.of_mut(dtype).tiled = Some(Kernel::dot(f));
    }

    let q4k = t.of_mut(DType::Q4_K);
    q4k.repacked = Some(Kernel::dot(repack::dot_q4_k_gemv));
    q4k.repacked_gemm = Some(Kernel::dot(repack::dot_q4_k_gemm));
    t.of_mut(DType::Q4_0).repacked = Some(Kernel::dot(|n, x, y| {
        repack::dot_q0_repacked(false, n, x, y)
    }));
    t.of_mut(DType::IQ4_NL).repacked = Some(Kernel::dot(|n, x, y| {
        repack::dot_q0_repacked(true, n, x, y)
    }));
    t.of_mut(DType::MXFP4).repacked = Some(Kernel::dot(repack::dot_mxfp4_repacked));
    t
}

/// `ggml_quantize_mat_q8_K_4x8`'s values (scalar).
pub(super) fn q8_k_4x8(x: &[f32], out: &mut [u8]) {
    repack::quantize_row_q8_k_4x8(x, out)
}
