//! `lamina-core` owns the vocabulary every other layer speaks: the element and block types of
//! tensors ([`DType`]), the byte layout of each quantized block together with scalar reference
//! quantize/dequantize routines, tensor shapes and views, and the graph IR that models build and
//! backends execute. It has no knowledge of files, devices or models; everything above it depends
//! on it and it depends on nothing of ours.

pub mod dtype;
pub mod graph;
pub mod quant;
pub mod tensor;

pub use dtype::{DType, DTypeError};
