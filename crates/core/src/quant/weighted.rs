//! Tensor quantization as `ggml_quantize_chunk` does it: ggml's `quantize_<type>` entry points,
//! which take per-column importance weights (`quant_weights`, the mean squared activations
//! llama-imatrix collects). Without weights most of them are the reference quantizers of
//! [`quantize_row`](super::quantize_row); IQ4_NL is not (it tries more scales).

use crate::DType;

use super::blocks::{BlockIQ4NL, BlockIQ4XS};
use super::iq4::{quantize_row_iq4_nl_weighted, quantize_row_iq4_xs_weighted};
use super::{QuantError, check_len, quantize_row, with_blocks_mut};

/// Quantizes one row as ggml's `quantize_<type>(src, dst, 1, n_per_row, quant_weights)` does
/// (what llama-quantize runs). `weights` (one per element of the row) is the importance of
/// each column. Types whose weighted quantizer is not here yet refuse weights.
pub fn quantize_row_weighted(
    dtype: DType,
    src: &[f32],
    dst: &mut [u8],
    weights: Option<&[f32]>,
) -> Result<(), QuantError> {
    use DType::*;
    if let Some(w) = weights
        && w.len() != src.len()
    {
        return Err(QuantError::LengthMismatch {
            what: "importance weights",
            dtype,
            len: src.len(),
            expected: src.len(),
            actual: w.len(),
        });
    }
    if matches!(dtype, IQ4_NL | IQ4_XS) {
        check_len("quantize destination", dtype, src.len(), dst.len())?;
        match dtype {
            IQ4_NL => with_blocks_mut::<BlockIQ4NL>(dst, |b| {
                quantize_row_iq4_nl_weighted(src, b, weights)
            }),
            _ => with_blocks_mut::<BlockIQ4XS>(dst, |b| {
                quantize_row_iq4_xs_weighted(src, b, weights)
            }),
        }
        return Ok(());
    }
    if weights.is_none() {
        return quantize_row(dtype, src, dst);
    }
    match dtype {
        // No weighted variant in ggml: the weights are ignored.
        F32 | F16 | BF16 | Q8_0 | MXFP4 | NVFP4 | TQ1_0 | TQ2_0 | Q1_0 | Q2_0 => {
            quantize_row(dtype, src, dst)
        }
        _ => Err(QuantError::UnsupportedType(dtype)),
    }
}
