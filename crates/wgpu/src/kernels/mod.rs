//! The WGSL compute kernels, in ggml's tensor model (`tests/kernels.rs` checks each against a
//! scalar reference).
//!
//! * [`TensorRef`] describes a tensor living in a `wgpu::Buffer` (ggml `ne`/`nb`).
//! * [`Kernels`] encodes ops into a `CommandEncoder`; call [`Kernels::submit`]
//!   (or [`Kernels::flush`] before your own `queue.submit`) so the per-op
//!   parameters reach the GPU.

mod ops;
mod shaders;
mod tensor;

pub use ops::{ExactPlan, Kernels, MatMulPath, MatVecConfig, RopeMode, UnaryOp};
pub use shaders::FA_MAX_D;
pub use tensor::{DType, TensorRef};

/// Errors returned by this crate; bad input never panics.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// No adapter (or not the requested index).
    NoAdapter(String),
    /// `request_device` failed.
    Device(String),
    /// Shapes/strides/types of the arguments do not fit the op.
    Invalid(String),
    /// A valid request this prototype does not implement (or the adapter limits forbid).
    Unsupported(String),
    /// A wgpu validation or device error caught by the context's error handler.
    Gpu(String),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::NoAdapter(s) => write!(f, "no GPU adapter: {s}"),
            Error::Device(s) => write!(f, "device request failed: {s}"),
            Error::Invalid(s) => write!(f, "invalid argument: {s}"),
            Error::Unsupported(s) => write!(f, "unsupported: {s}"),
            Error::Gpu(s) => write!(f, "gpu error: {s}"),
        }
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;
