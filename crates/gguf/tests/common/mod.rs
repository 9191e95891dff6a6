//! Test helpers: a raw GGUF byte builder that can write anything (including what a reader must
//! refuse), a small valid sample file, and where the test data lives.

#![allow(dead_code)]

use std::path::PathBuf;

/// Value type ids as stored in GGUF.
pub mod ty {
    pub const U8: u32 = 0;
    pub const I8: u32 = 1;
    pub const U16: u32 = 2;
    pub const I16: u32 = 3;
    pub const U32: u32 = 4;
    pub const I32: u32 = 5;
    pub const F32: u32 = 6;
    pub const BOOL: u32 = 7;
    pub const STRING: u32 = 8;
    pub const ARRAY: u32 = 9;
    pub const U64: u32 = 10;
    pub const I64: u32 = 11;
    pub const F64: u32 = 12;
}

/// Tensor type ids as stored in GGUF.
pub mod tt {
    pub const F32: u32 = 0;
    pub const F16: u32 = 1;
    pub const Q4_0: u32 = 2;
}

/// Appends GGUF fields little-endian, with no checking at all.
#[derive(Default, Clone)]
pub struct Bytes(pub Vec<u8>);

impl Bytes {
    /// Magic, version and the two counts.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Bytes {
        let mut b = Bytes::default();
        b.raw(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        b
    }
    pub fn raw(&mut self, bytes: &[u8]) -> &mut Self {
        self.0.extend_from_slice(bytes);
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.raw(&[v])
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.raw(&v.to_le_bytes())
    }
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.str_bytes(s.as_bytes())
    }
    pub fn str_bytes(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).raw(s)
    }
    /// A key, a value type id, and the value's raw encoding.
    pub fn kv(&mut self, key: &str, type_id: u32, value: &[u8]) -> &mut Self {
        self.str(key).u32(type_id).raw(value)
    }
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.kv(key, ty::U32, &v.to_le_bytes())
    }
    pub fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
        self.str(key).u32(ty::STRING).str(v)
    }
    /// One tensor-table entry.
    pub fn tensor(&mut self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(type_id).u64(offset)
    }
    /// Zero bytes up to a multiple of `alignment`.
    pub fn pad(&mut self, alignment: usize) -> &mut Self {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    pub fn bytes(&self) -> Vec<u8> {
        self.0.clone()
    }
}

/// The encoding of a string value (length + bytes), for [`Bytes::kv`].
pub fn enc_str(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

/// A small valid v3 file exercising most of the format: scalars, a string, arrays (of u32, of
/// strings, of arrays), a custom alignment, and three tensors (f32, q4_0, an empty one). The
/// last tensor ends exactly at the end of the file, so any shorter prefix is invalid.
pub fn sample_file() -> Vec<u8> {
    let mut b = Bytes::header(3, 3, 7);
    b.kv_str("general.architecture", "llama")
        .kv_u32("general.alignment", 64)
        .kv("test.f32", ty::F32, &1.5f32.to_le_bytes())
        .kv("test.bool", ty::BOOL, &[1])
        .kv("test.i64", ty::I64, &(-7i64).to_le_bytes());
    // array of 3 u32
    b.str("test.u32s")
        .u32(ty::ARRAY)
        .u32(ty::U32)
        .u64(3)
        .u32(1)
        .u32(2)
        .u32(3);
    // array of 2 arrays: [["a", "bc"], [5i8]]
    b.str("test.nested").u32(ty::ARRAY).u32(ty::ARRAY).u64(2);
    b.u32(ty::STRING).u64(2).str("a").str("bc");
    b.u32(ty::I8).u64(1).u8(5);
    // tensors: f32 [4, 2] (32 bytes) at 0; q4_0 [32, 2] (36 bytes) at 64; empty f32 [0, 3] at 128
    b.tensor("a.weight", &[4, 2], tt::F32, 0);
    b.tensor("b.weight", &[32, 2], tt::Q4_0, 64);
    b.tensor("empty", &[0, 3], tt::F32, 128);
    b.pad(64);
    let data_start = b.0.len();
    b.raw(&(0..32).map(|i| i as u8).collect::<Vec<_>>());
    b.pad(64);
    b.raw(&[0xAB; 36]);
    // The empty tensor sits at offset 128: pad the data section to exactly that length.
    b.zeros(128 - (b.0.len() - data_start));
    b.bytes()
}

/// `/work/shared` (the workspace's `../shared`), if present.
pub fn shared_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared"));
    if dir.is_dir() {
        Some(dir)
    } else {
        eprintln!("skipping: shared data folder {} is absent", dir.display());
        None
    }
}

/// Every vocab-only GGUF file in shared/vocab, sorted.
pub fn vocab_files() -> Vec<PathBuf> {
    let Some(dir) = shared_dir() else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.join("vocab"))
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|p| p.extension().is_some_and(|e| e == "gguf"));
    files.sort();
    if files.is_empty() {
        eprintln!("skipping: no vocab GGUF files in shared/vocab");
    }
    files
}

/// A test model's path, pulled into the cache on first use by `lamina_gguf::pull::model_for_test`,
/// which says why and returns `None` when the model cannot be had (and fails instead when
/// `LAMINA_REQUIRE_MODELS` is set, as in CI).
pub fn test_model(name: &str) -> Option<PathBuf> {
    lamina_gguf::pull::model_for_test(name)
}

/// Deterministic xorshift64* generator, so property tests replay exactly.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
