//! The row-level quantization API the kernels use: a thin wrapper over `lamina_core::quant`
//! (scalar reference routines), kept as the one place the CPU crate names it so SIMD dot
//! kernels can later be slotted in per type without touching the ops.

pub use lamina_core::quant::{QuantError, dequantize_row, quantize_row, vec_dot, vec_dot_type};
