//! Quantized block formats: layouts and scalar reference quantize/dequantize/dot routines.
//!
//! Everything here reproduces ggml bit for bit: block layouts from `ggml-common.h`, quantizers
//! and dequantizers from `ggml-quants.c` (the `*_ref` reference quantizers), activation
//! quantizers and dot products from ggml-cpu's generic (non-SIMD) code. These are the reference
//! that SIMD kernels elsewhere are tested against; they avoid allocation except to realign
//! byte slices that are not aligned for their block type.
//!
//! Row-level entry points take raw bytes and a [`DType`]: [`dequantize_row`], [`quantize_row`],
//! [`vec_dot`]. Typed per-format functions (`dequantize_row_q4_k`, `vec_dot_q4_k_q8_k`, …) work
//! on block slices.

// The kernels index blocks the way ggml's C does, which keeps their arithmetic order easy to
// compare line by line with the reference.
#![allow(clippy::needless_range_loop)]

mod blocks;
mod dot;
mod float;
mod iq4;
mod iq_kgrids;
mod iq_quant;
mod iq_tables;
mod iquants;
mod kquants;
mod legacy;
mod lowbit;
mod mxfp4;
mod ternary;
mod weighted;

use std::borrow::Cow;

use half::{bf16, f16};

use crate::DType;

pub use blocks::*;
pub use dot::*;
pub use float::*;
pub use iq_quant::{
    quantize_row_iq1_m_weighted, quantize_row_iq1_s_weighted, quantize_row_iq2_s_weighted,
    quantize_row_iq2_xs_weighted, quantize_row_iq2_xxs_weighted, quantize_row_iq3_s_weighted,
    quantize_row_iq3_xxs_weighted,
};
pub use iq_tables::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
};
pub use iq4::{
    dequantize_row_iq4_nl, dequantize_row_iq4_xs, iq4_xs_scale, quantize_row_iq4_nl,
    quantize_row_iq4_xs,
};
pub use iquants::{
    IQ1S_DELTA, dequantize_row_iq1_m, dequantize_row_iq1_s, dequantize_row_iq2_s,
    dequantize_row_iq2_xs, dequantize_row_iq2_xxs, dequantize_row_iq3_s, dequantize_row_iq3_xxs,
    iq1_m_d, iq1_m_group, iq1_m_ls, iq1_m_sc, iq1_s_group, iq2_s_group, iq2_xs_group, iq2_xxs_sub,
    iq3_s_grid, iq3_xxs_sub, vec_dot_iq1_m_q8_k, vec_dot_iq1_s_q8_k, vec_dot_iq2_s_q8_k,
    vec_dot_iq2_xs_q8_k, vec_dot_iq2_xxs_q8_k, vec_dot_iq3_s_q8_k, vec_dot_iq3_xxs_q8_k,
};
pub use kquants::{
    dequantize_row_q2_k, dequantize_row_q3_k, dequantize_row_q4_k, dequantize_row_q5_k,
    dequantize_row_q6_k, dequantize_row_q8_k, get_scale_min_k4, q3_k_scales, quantize_row_q2_k,
    quantize_row_q3_k, quantize_row_q4_k, quantize_row_q5_k, quantize_row_q6_k, quantize_row_q8_k,
};
pub use legacy::*;
pub use lowbit::{
    dequantize_row_q1_0, dequantize_row_q2_0, q2_0_value, quantize_row_q1_0, quantize_row_q2_0,
};
pub use mxfp4::{
    dequantize_row_mxfp4, dequantize_row_nvfp4, e8m0_to_fp32_half, fp32_to_ue4m3,
    quantize_row_mxfp4, quantize_row_nvfp4, ue4m3_to_fp32,
};
pub use ternary::{
    dequantize_row_tq1_0, dequantize_row_tq2_0, quantize_row_tq1_0, quantize_row_tq2_0,
    tq1_0_trits, tq1_trit, tq2_0_values,
};
pub use weighted::quantize_row_weighted;

/// Errors from the row-level quantization routines.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantError {
    /// No scalar routine exists for this type (for the operation asked).
    #[error("operation not supported for tensor type {0}")]
    UnsupportedType(DType),
    /// The element count is not a whole number of blocks.
    #[error("{len} elements is not a multiple of {dtype}'s block size {block}")]
    NotBlockMultiple {
        dtype: DType,
        len: usize,
        block: usize,
    },
    /// A buffer does not have the size the element count implies.
    #[error("{what}: expected {expected} bytes for {len} {dtype} elements, got {actual}")]
    LengthMismatch {
        what: &'static str,
        dtype: DType,
        len: usize,
        expected: usize,
        actual: usize,
    },
    /// A byte slice does not hold a whole number of blocks.
    #[error("{len} bytes is not a whole number of {block_bytes}-byte blocks")]
    PartialBlock { len: usize, block_bytes: usize },
    /// The row's byte size does not fit in `usize`.
    #[error("a row of {len} {dtype} elements is too large to address")]
    RowTooLarge { dtype: DType, len: usize },
}

/// Bytes a row of `n` elements of `dtype` takes, or why it has no such size.
pub fn row_bytes(dtype: DType, n: usize) -> Result<usize, QuantError> {
    let block = dtype.block_size() as usize;
    if !n.is_multiple_of(block) {
        return Err(QuantError::NotBlockMultiple {
            dtype,
            len: n,
            block,
        });
    }
    (n / block)
        .checked_mul(dtype.type_size() as usize)
        .ok_or(QuantError::RowTooLarge { dtype, len: n })
}

pub(crate) fn check_len(
    what: &'static str,
    dtype: DType,
    n: usize,
    actual: usize,
) -> Result<(), QuantError> {
    let expected = row_bytes(dtype, n)?;
    if expected != actual {
        return Err(QuantError::LengthMismatch {
            what,
            dtype,
            len: n,
            expected,
            actual,
        });
    }
    Ok(())
}

/// Views `bytes` as blocks of `B`: borrowed when suitably aligned, copied otherwise. Errors if
/// `bytes` is not a whole number of blocks.
pub fn blocks_from_bytes<B: bytemuck::Pod>(bytes: &[u8]) -> Result<Cow<'_, [B]>, QuantError> {
    let size = std::mem::size_of::<B>();
    if size == 0 || !bytes.len().is_multiple_of(size) {
        return Err(QuantError::PartialBlock {
            len: bytes.len(),
            block_bytes: size,
        });
    }
    Ok(match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => Cow::Borrowed(blocks),
        Err(_) => Cow::Owned(
            bytes
                .chunks_exact(size)
                .map(bytemuck::pod_read_unaligned)
                .collect(),
        ),
    })
}

/// Runs `f` on `bytes` viewed as mutable blocks, through an aligned copy if needed.
pub(crate) fn with_blocks_mut<B: bytemuck::Pod>(bytes: &mut [u8], f: impl FnOnce(&mut [B])) {
    match bytemuck::try_cast_slice_mut::<u8, B>(bytes) {
        Ok(blocks) => f(blocks),
        Err(_) => {
            let mut tmp: Vec<B> = vec![B::zeroed(); bytes.len() / std::mem::size_of::<B>()];
            f(&mut tmp);
            bytes.copy_from_slice(bytemuck::cast_slice(&tmp));
        }
    }
}

/// Whether [`dequantize_row`] handles `dtype`.
pub fn supports_dequantize(dtype: DType) -> bool {
    use DType::*;
    matches!(
        dtype,
        F32 | F16
            | BF16
            | Q4_0
            | Q4_1
            | Q5_0
            | Q5_1
            | Q8_0
            | Q8_1
            | Q2_K
            | Q3_K
            | Q4_K
            | Q5_K
            | Q6_K
            | Q8_K
            | IQ4_NL
            | IQ4_XS
            | MXFP4
            | TQ1_0
            | TQ2_0
            | NVFP4
            | Q1_0
            | Q2_0
            | IQ2_XXS
            | IQ2_XS
            | IQ2_S
            | IQ3_XXS
            | IQ3_S
            | IQ1_S
            | IQ1_M
    )
}

/// Whether [`quantize_row`] handles `dtype`: the [`supports_dequantize`] set less the grid
/// i-quants (IQ2_*, IQ3_*, IQ1_*), whose ggml quantizers need importance weights or search
/// tables (`quantize_row_iq*_weighted`).
pub fn supports_quantize(dtype: DType) -> bool {
    use DType::*;
    supports_dequantize(dtype)
        && !matches!(
            dtype,
            IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M
        )
}

/// Converts a row of `dst.len()` elements stored as `dtype` in `src` to f32.
/// `src.len()` must be exactly the row size of `dst.len()` elements.
pub fn dequantize_row(dtype: DType, src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    if !supports_dequantize(dtype) {
        return Err(QuantError::UnsupportedType(dtype));
    }
    check_len("dequantize source", dtype, dst.len(), src.len())?;
    macro_rules! run {
        ($b:ty, $f:path) => {{
            let blocks = blocks_from_bytes::<$b>(src)?;
            $f(&blocks, dst)
        }};
    }
    use DType::*;
    match dtype {
        F32 => run!(f32, copy_f32),
        F16 => run!(f16, f16_to_f32_row),
        BF16 => run!(bf16, bf16_to_f32_row),
        Q4_0 => run!(BlockQ4_0, dequantize_row_q4_0),
        Q4_1 => run!(BlockQ4_1, dequantize_row_q4_1),
        Q5_0 => run!(BlockQ5_0, dequantize_row_q5_0),
        Q5_1 => run!(BlockQ5_1, dequantize_row_q5_1),
        Q8_0 => run!(BlockQ8_0, dequantize_row_q8_0),
        Q8_1 => run!(BlockQ8_1, dequantize_row_q8_1),
        Q2_K => run!(BlockQ2K, dequantize_row_q2_k),
        Q3_K => run!(BlockQ3K, dequantize_row_q3_k),
        Q4_K => run!(BlockQ4K, dequantize_row_q4_k),
        Q5_K => run!(BlockQ5K, dequantize_row_q5_k),
        Q6_K => run!(BlockQ6K, dequantize_row_q6_k),
        Q8_K => run!(BlockQ8K, dequantize_row_q8_k),
        IQ4_NL => run!(BlockIQ4NL, dequantize_row_iq4_nl),
        IQ4_XS => run!(BlockIQ4XS, dequantize_row_iq4_xs),
        MXFP4 => run!(BlockMXFP4, dequantize_row_mxfp4),
        TQ1_0 => run!(BlockTQ1_0, dequantize_row_tq1_0),
        TQ2_0 => run!(BlockTQ2_0, dequantize_row_tq2_0),
        NVFP4 => run!(BlockNVFP4, dequantize_row_nvfp4),
        Q1_0 => run!(BlockQ1_0, dequantize_row_q1_0),
        Q2_0 => run!(BlockQ2_0, dequantize_row_q2_0),
        IQ2_XXS => run!(BlockIQ2XXS, dequantize_row_iq2_xxs),
        IQ2_XS => run!(BlockIQ2XS, dequantize_row_iq2_xs),
        IQ2_S => run!(BlockIQ2S, dequantize_row_iq2_s),
        IQ3_XXS => run!(BlockIQ3XXS, dequantize_row_iq3_xxs),
        IQ3_S => run!(BlockIQ3S, dequantize_row_iq3_s),
        IQ1_S => run!(BlockIQ1S, dequantize_row_iq1_s),
        IQ1_M => run!(BlockIQ1M, dequantize_row_iq1_m),
        _ => return Err(QuantError::UnsupportedType(dtype)),
    }
    Ok(())
}

/// Quantizes the row `src` into `dst` as one of the grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S,
/// IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) with ggml's `quantize_iq*` and importance weights `qw` (one per
/// element; for IQ2_XXS, IQ2_XS and IQ1_S, which ggml quantizes only with weights, `None`
/// means a weight of 1 for every element). `dst.len()` must be exactly the row size.
pub fn quantize_row_iq(
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
    qw: Option<&[f32]>,
) -> Result<(), QuantError> {
    check_len("quantize destination", dtype, src.len(), dst.len())?;
    if let Some(w) = qw
        && w.len() != src.len()
    {
        return Err(QuantError::LengthMismatch {
            what: "importance weights",
            dtype: DType::F32,
            len: src.len(),
            expected: 4 * src.len(),
            actual: 4 * w.len(),
        });
    }
    macro_rules! run {
        ($b:ty, $f:path) => {
            with_blocks_mut::<$b>(dst, |blocks| $f(src, blocks, qw))
        };
    }
    use DType::*;
    match dtype {
        IQ2_XXS => run!(BlockIQ2XXS, quantize_row_iq2_xxs_weighted),
        IQ2_XS => run!(BlockIQ2XS, quantize_row_iq2_xs_weighted),
        IQ2_S => run!(BlockIQ2S, quantize_row_iq2_s_weighted),
        IQ3_XXS => run!(BlockIQ3XXS, quantize_row_iq3_xxs_weighted),
        IQ3_S => run!(BlockIQ3S, quantize_row_iq3_s_weighted),
        IQ1_S => run!(BlockIQ1S, quantize_row_iq1_s_weighted),
        IQ1_M => run!(BlockIQ1M, quantize_row_iq1_m_weighted),
        _ => return Err(QuantError::UnsupportedType(dtype)),
    }
    Ok(())
}

fn copy_f32(src: &[f32], dst: &mut [f32]) {
    dst.copy_from_slice(src);
}

/// Quantizes the row `src` into `dst` as `dtype` with ggml's reference quantizer
/// (`quantize_row_*_ref`; no importance matrix). `dst.len()` must be exactly the row size.
pub fn quantize_row(dtype: DType, src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    if !supports_quantize(dtype) {
        return Err(QuantError::UnsupportedType(dtype));
    }
    check_len("quantize destination", dtype, src.len(), dst.len())?;
    macro_rules! run {
        ($b:ty, $f:path) => {
            with_blocks_mut::<$b>(dst, |blocks| $f(src, blocks))
        };
    }
    use DType::*;
    match dtype {
        F32 => run!(f32, copy_f32),
        F16 => run!(f16, f32_to_f16_row),
        BF16 => run!(bf16, f32_to_bf16_row),
        Q4_0 => run!(BlockQ4_0, quantize_row_q4_0),
        Q4_1 => run!(BlockQ4_1, quantize_row_q4_1),
        Q5_0 => run!(BlockQ5_0, quantize_row_q5_0),
        Q5_1 => run!(BlockQ5_1, quantize_row_q5_1),
        Q8_0 => run!(BlockQ8_0, quantize_row_q8_0),
        Q8_1 => run!(BlockQ8_1, quantize_row_q8_1),
        Q2_K => run!(BlockQ2K, quantize_row_q2_k),
        Q3_K => run!(BlockQ3K, quantize_row_q3_k),
        Q4_K => run!(BlockQ4K, quantize_row_q4_k),
        Q5_K => run!(BlockQ5K, quantize_row_q5_k),
        Q6_K => run!(BlockQ6K, quantize_row_q6_k),
        Q8_K => run!(BlockQ8K, quantize_row_q8_k),
        IQ4_NL => run!(BlockIQ4NL, quantize_row_iq4_nl),
        IQ4_XS => run!(BlockIQ4XS, quantize_row_iq4_xs),
        MXFP4 => run!(BlockMXFP4, quantize_row_mxfp4),
        TQ1_0 => run!(BlockTQ1_0, quantize_row_tq1_0),
        TQ2_0 => run!(BlockTQ2_0, quantize_row_tq2_0),
        NVFP4 => run!(BlockNVFP4, quantize_row_nvfp4),
        Q1_0 => run!(BlockQ1_0, quantize_row_q1_0),
        Q2_0 => run!(BlockQ2_0, quantize_row_q2_0),
        _ => return Err(QuantError::UnsupportedType(dtype)),
    }
    Ok(())
}

/// The type ggml-cpu quantizes the other operand to for a dot product with a row of `dtype`
/// (its `vec_dot_type`), or `None` when ggml-cpu has no dot product for `dtype` (Q8_1, Q8_K and
/// every type not implemented here).
pub const fn vec_dot_type(dtype: DType) -> Option<DType> {
    use DType::*;
    match dtype {
        F32 => Some(F32),
        F16 => Some(F16),
        BF16 => Some(BF16),
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | MXFP4 | NVFP4 | Q1_0 | Q2_0 => Some(Q8_0),
        Q4_1 | Q5_1 => Some(Q8_1),
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS | TQ1_0 | TQ2_0 | IQ2_XXS | IQ2_XS | IQ2_S
        | IQ3_XXS | IQ3_S | IQ1_S | IQ1_M => Some(Q8_K),
        _ => None,
    }
}

/// Dot product of `n` elements: `x` holds them as `dtype`, `y` as [`vec_dot_type`]`(dtype)`
/// (quantized with [`quantize_row`] where that is Q8_0/Q8_1/Q8_K). Computed like ggml-cpu's
/// generic kernels.
pub fn vec_dot(dtype: DType, n: usize, x: &[u8], y: &[u8]) -> Result<f32, QuantError> {
    let dot_type = vec_dot_type(dtype).ok_or(QuantError::UnsupportedType(dtype))?;
    check_len("vec_dot x", dtype, n, x.len())?;
    check_len("vec_dot y", dot_type, n, y.len())?;
    macro_rules! run {
        ($bx:ty, $by:ty, $f:path) => {{
            let xb = blocks_from_bytes::<$bx>(x)?;
            let yb = blocks_from_bytes::<$by>(y)?;
            $f(&xb, &yb)
        }};
    }
    use DType::*;
    Ok(match dtype {
        F32 => run!(f32, f32, vec_dot_f32),
        F16 => run!(f16, f16, vec_dot_f16),
        BF16 => run!(bf16, bf16, vec_dot_bf16),
        Q4_0 => run!(BlockQ4_0, BlockQ8_0, vec_dot_q4_0_q8_0),
        Q4_1 => run!(BlockQ4_1, BlockQ8_1, vec_dot_q4_1_q8_1),
        Q5_0 => run!(BlockQ5_0, BlockQ8_0, vec_dot_q5_0_q8_0),
        Q5_1 => run!(BlockQ5_1, BlockQ8_1, vec_dot_q5_1_q8_1),
        Q8_0 => run!(BlockQ8_0, BlockQ8_0, vec_dot_q8_0_q8_0),
        IQ4_NL => run!(BlockIQ4NL, BlockQ8_0, vec_dot_iq4_nl_q8_0),
        Q2_K => run!(BlockQ2K, BlockQ8K, vec_dot_q2_k_q8_k),
        Q3_K => run!(BlockQ3K, BlockQ8K, vec_dot_q3_k_q8_k),
        Q4_K => run!(BlockQ4K, BlockQ8K, vec_dot_q4_k_q8_k),
        Q5_K => run!(BlockQ5K, BlockQ8K, vec_dot_q5_k_q8_k),
        Q6_K => run!(BlockQ6K, BlockQ8K, vec_dot_q6_k_q8_k),
        IQ4_XS => run!(BlockIQ4XS, BlockQ8K, vec_dot_iq4_xs_q8_k),
        MXFP4 => run!(BlockMXFP4, BlockQ8_0, vec_dot_mxfp4_q8_0),
        TQ1_0 => run!(BlockTQ1_0, BlockQ8K, vec_dot_tq1_0_q8_k),
        TQ2_0 => run!(BlockTQ2_0, BlockQ8K, vec_dot_tq2_0_q8_k),
        NVFP4 => run!(BlockNVFP4, BlockQ8_0, vec_dot_nvfp4_q8_0),
        Q1_0 => run!(BlockQ1_0, BlockQ8_0, vec_dot_q1_0_q8_0),
        Q2_0 => run!(BlockQ2_0, BlockQ8_0, vec_dot_q2_0_q8_0),
        IQ2_XXS => run!(BlockIQ2XXS, BlockQ8K, vec_dot_iq2_xxs_q8_k),
        IQ2_XS => run!(BlockIQ2XS, BlockQ8K, vec_dot_iq2_xs_q8_k),
        IQ2_S => run!(BlockIQ2S, BlockQ8K, vec_dot_iq2_s_q8_k),
        IQ3_XXS => run!(BlockIQ3XXS, BlockQ8K, vec_dot_iq3_xxs_q8_k),
        IQ3_S => run!(BlockIQ3S, BlockQ8K, vec_dot_iq3_s_q8_k),
        IQ1_S => run!(BlockIQ1S, BlockQ8K, vec_dot_iq1_s_q8_k),
        IQ1_M => run!(BlockIQ1M, BlockQ8K, vec_dot_iq1_m_q8_k),
        _ => return Err(QuantError::UnsupportedType(dtype)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_typed() {
        let mut out = [0f32; 32];
        assert!(matches!(
            dequantize_row(DType::Q4_0, &[0u8; 17], &mut out),
            Err(QuantError::LengthMismatch {
                expected: 18,
                actual: 17,
                ..
            })
        ));
        assert!(matches!(
            dequantize_row(DType::Q4_K, &[0u8; 144], &mut out),
            Err(QuantError::NotBlockMultiple { block: 256, .. })
        ));
        assert!(matches!(
            dequantize_row(DType::F64, &[], &mut []),
            Err(QuantError::UnsupportedType(DType::F64))
        ));
        assert!(matches!(
            vec_dot(DType::Q8_K, 256, &[], &[]),
            Err(QuantError::UnsupportedType(DType::Q8_K))
        ));
        let mut q = [0u8; 18];
        assert!(quantize_row(DType::Q4_0, &out[..16], &mut q).is_err());
    }

    #[test]
    fn hostile_values_never_panic() {
        // NaN, infinities, huge and subnormal inputs, and random bytes as quantized data: results
        // may be meaningless but nothing panics (overflow checks are on in test builds).
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
            1e-45,
            -0.0,
            3.0e38,
        ];
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for dtype in DType::ALL.into_iter().filter(|t| supports_quantize(*t)) {
            for round in 0..8 {
                let src: Vec<f32> = (0..512)
                    .map(|i| match (round + i) % 5 {
                        0 => specials[(rand() % specials.len() as u64) as usize],
                        _ => f32::from_bits(rand() as u32),
                    })
                    .collect();
                let size = row_bytes(dtype, src.len()).unwrap();
                let mut q = vec![0u8; size];
                quantize_row(dtype, &src, &mut q).unwrap();
                let mut out = vec![0f32; src.len()];
                dequantize_row(dtype, &q, &mut out).unwrap();
                let noise: Vec<u8> = (0..size).map(|_| rand() as u8).collect();
                dequantize_row(dtype, &noise, &mut out).unwrap();
                if let Some(dot_type) = vec_dot_type(dtype) {
                    let y: Vec<u8> = (0..row_bytes(dot_type, src.len()).unwrap())
                        .map(|_| rand() as u8)
                        .collect();
                    vec_dot(dtype, src.len(), &noise, &y).unwrap();
                    vec_dot(dtype, src.len(), &q, &y).unwrap();
                }
            }
        }
    }

    #[test]
    fn misaligned_bytes_give_the_same_result() {
        let src: Vec<f32> = (0..512).map(|i| ((i as f32) * 0.37).sin() * 3.0).collect();
        for dtype in DType::ALL.into_iter().filter(|t| supports_quantize(*t)) {
            let size = row_bytes(dtype, src.len()).unwrap();
            let mut aligned = vec![0u64; size / 8 + 2];
            let aligned_bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut aligned)[..size];
            quantize_row(dtype, &src, aligned_bytes).unwrap();
            let mut buf = vec![0u64; size / 8 + 2];
            let shifted = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[1..size + 1];
            quantize_row(dtype, &src, shifted).unwrap();
            assert_eq!(&*aligned_bytes, &*shifted, "{dtype}");
            let mut a = vec![0f32; src.len()];
            let mut b = vec![0f32; src.len()];
            dequantize_row(dtype, aligned_bytes, &mut a).unwrap();
            dequantize_row(dtype, shifted, &mut b).unwrap();
            assert_eq!(a, b, "{dtype}");
        }
    }
}
