//! `lamina-tools` owns the tools that turn one model file into another rather than run it:
//! [`quantize`] (llama-quantize: its file types, its per-tensor type rules and its exact output
//! bytes). The row-level quantizers themselves live in `lamina-core`; this crate decides which
//! tensor gets which type, streams the tensors through them, and writes the GGUF file the way
//! llama.cpp writes it, atomically (a temporary file renamed into place).

pub mod imatrix;
pub mod quantize;
