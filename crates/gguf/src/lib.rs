//! `lamina-gguf` owns the GGUF file format and where model files come from. It parses a GGUF
//! file (v2 and v3) into typed metadata and a validated tensor table, maps the tensor data in
//! place (mmap, no copy), writes GGUF files back byte for byte, and keeps the model cache that
//! `lamina pull` fills from PyPI packages. Every size read off disk is checked against the bytes
//! that remain before anything is allocated, so a hostile file yields a typed [`GgufError`],
//! never a panic or an oversized allocation.

mod error;
mod file;
mod metadata;
mod parse;
pub mod pull;
mod write;

pub use error::GgufError;
pub use file::GgufFile;
pub use metadata::{Array, Metadata, MetadataError, StrArray, StrArrayIter, Value, ValueType};
pub use parse::{DEFAULT_ALIGNMENT, GGUF_MAGIC, Gguf, MAX_ARRAY_NESTING, MAX_DIMS, TensorInfo};
pub use write::{GgufStreamWriter, GgufWriter, TensorHeader, TensorToWrite, write_gguf};
