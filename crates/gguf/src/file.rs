//! A GGUF file on disk, mapped in place.

use std::fs::File;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;

use crate::{Gguf, GgufError, TensorInfo};

/// A validated GGUF file whose tensor data is read in place through a memory map.
pub struct GgufFile {
    path: PathBuf,
    map: Arc<Mmap>,
    gguf: Gguf,
}

impl GgufFile {
    /// Maps and parses `path`. The whole header is validated before this returns.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref().to_path_buf();
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = File::open(&path).map_err(io)?;
        // SAFETY: the map is read-only and private to this process. Another process truncating
        // or rewriting the model file while it is mapped is outside what we can guard against
        // (as for every mmap-based loader, llama.cpp's included); we never write through it.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let gguf = Gguf::parse(&map)?;
        Ok(GgufFile {
            path,
            map: Arc::new(map),
            gguf,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parsed header.
    pub fn gguf(&self) -> &Gguf {
        &self.gguf
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }

    /// The shared mapping, for backends that wrap host memory without copying.
    pub fn mapping(&self) -> Arc<Mmap> {
        Arc::clone(&self.map)
    }

    /// The bytes of one tensor (bounds were validated at parse time).
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = (self.gguf.data_offset + info.offset) as usize;
        &self.map[start..start + info.size as usize]
    }

    /// The info and bytes of the tensor named `name`.
    pub fn tensor_by_name(&self, name: &str) -> Result<(&TensorInfo, &[u8]), GgufError> {
        let info = self
            .gguf
            .tensor(name)
            .ok_or_else(|| GgufError::NoSuchTensor(name.to_string()))?;
        Ok((info, self.tensor_data(info)))
    }
}

impl Deref for GgufFile {
    type Target = Gguf;
    fn deref(&self) -> &Gguf {
        &self.gguf
    }
}
