//! Helpers of the kernel tests: opening an adapter directly, and the scalar reference.
#![allow(dead_code)] // each test binary uses its own part

pub mod context;
pub mod reference;
