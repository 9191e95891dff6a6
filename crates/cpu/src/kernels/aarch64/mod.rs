//! aarch64 kernels: the NEON tier.

pub mod neon;
