//! Importance matrices: llama.cpp's `llama-imatrix` files, read and written.
//!
//! An importance matrix holds, for every weight matrix the model multiplies activations by, the
//! sum over all evaluated tokens of each input column's squared activation (`in_sum2`) and how
//! many activation rows went into that sum (`counts`; one per expert for a 3-d expert tensor).
//! `llama-quantize --imatrix` divides the two to weigh each column's quantization error.
//!
//! Two file formats exist, both read here exactly as `common/imatrix-loader.cpp` reads them:
//! - **GGUF** (llama-imatrix's default since 2025): `general.type = "imatrix"`,
//!   `imatrix.datasets` (string array), `imatrix.chunk_count` and `imatrix.chunk_size` (u32),
//!   and for every weight two F32 tensors `<name>.in_sum2` (`[ne0, n_mat]`: raw sums) and
//!   `<name>.counts` (`[1, n_mat]`: raw row counts), sorted by weight name.
//! - **legacy `.dat`**: `i32 n_entries`, then per entry `i32 len, name, i32 ncall, i32 nval,
//!   nval × f32` where the values are already `sum / count * ncall`, then optionally
//!   `i32 chunk_count, i32 len, dataset`. All little-endian.
//!
//! [`Imatrix::save`] writes the GGUF format byte for byte as `llama-imatrix` writes it.

mod collect;

pub use collect::{
    Collector, CollectorParams, ComputeError, ComputeReport, MicroBatch, NoProgress, Progress,
    RunParams, SharedCollector, Stats, compute_imatrix, micro_batches,
};

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

use lamina_core::DType;
use lamina_gguf::{Array, GGUF_MAGIC, Gguf, GgufError, GgufWriter, Metadata, StrArray, Value};

/// `imatrix.datasets`: the text files (and earlier imatrix files' datasets) it was computed on.
pub const KEY_DATASETS: &str = "imatrix.datasets";
/// `imatrix.chunk_count`: how many chunks of `chunk_size` tokens went into it.
pub const KEY_CHUNK_COUNT: &str = "imatrix.chunk_count";
/// `imatrix.chunk_size`: the context size (tokens per chunk) it was computed with.
pub const KEY_CHUNK_SIZE: &str = "imatrix.chunk_size";
/// Suffix of a weight's sums tensor.
pub const SUFFIX_SUMS: &str = ".in_sum2";
/// Suffix of a weight's counts tensor.
pub const SUFFIX_COUNTS: &str = ".counts";
/// ggml's `GGML_MAX_NAME`: tensor names are cut to one byte less when llama-imatrix names them.
const GGML_MAX_NAME: usize = 64;

/// Why an imatrix file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ImatrixError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Gguf { path: String, source: GgufError },
    #[error("{path}: no data in file")]
    NoData { path: String },
    #[error("{path}: truncated legacy imatrix: {what}")]
    Truncated { path: String, what: String },
    #[error("{path}: bad legacy imatrix: {what}")]
    BadLegacy { path: String, what: String },
    #[error("{path}: mismatched sums and counts for {name}")]
    Mismatched { path: String, name: String },
    #[error("{path}: sums and counts for {name} must be F32 (found {found})")]
    NotF32 {
        path: String,
        name: String,
        found: DType,
    },
    #[error("{path}: {key} should be {expected}")]
    BadKey {
        path: String,
        key: &'static str,
        expected: &'static str,
    },
    #[error(
        "entry {name}: {sums} sums cannot be split into {counts} matrices (sums must be a whole number of rows per count)"
    )]
    BadShape {
        name: String,
        sums: usize,
        counts: usize,
    },
    #[error(transparent)]
    WriteGguf(#[from] GgufError),
}

/// One weight's statistics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImatrixEntry {
    /// Sums of squared input activations, `counts.len()` rows of `sums.len() / counts.len()`
    /// columns (one row per expert of a 3-d tensor). In a legacy file: `sum / count * ncall`.
    pub sums: Vec<f32>,
    /// Activation rows summed, one per matrix (as stored in the file: llama.cpp rounds them to
    /// integers when it reads them). In a legacy file: the single `ncall`.
    pub counts: Vec<f32>,
}

/// An importance matrix as llama.cpp's `common_imatrix_load` holds it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Imatrix {
    pub entries: BTreeMap<String, ImatrixEntry>,
    pub datasets: Vec<String>,
    pub chunk_count: u32,
    pub chunk_size: u32,
    /// Read from a legacy `.dat` file (sums are pre-normalized, counts hold `ncall`).
    pub is_legacy: bool,
}

fn display(path: &Path) -> String {
    path.display().to_string()
}

impl Imatrix {
    /// Reads a GGUF imatrix, or a legacy `.dat` one when the file does not start with the GGUF
    /// magic (llama.cpp tries GGUF first and falls back to the legacy reader).
    pub fn load(path: &Path) -> Result<Imatrix, ImatrixError> {
        let bytes = std::fs::read(path).map_err(|source| ImatrixError::Read {
            path: display(path),
            source,
        })?;
        Self::from_bytes(&bytes, path)
    }

    /// [`Imatrix::load`] on bytes already in memory; `path` is only used in messages.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Imatrix, ImatrixError> {
        if bytes.starts_with(&GGUF_MAGIC) {
            Self::from_gguf(bytes, path)
        } else {
            Self::from_legacy(bytes, path)
        }
    }

    fn from_gguf(bytes: &[u8], path: &Path) -> Result<Imatrix, ImatrixError> {
        let p = || display(path);
        let gguf = Gguf::parse(bytes).map_err(|source| ImatrixError::Gguf { path: p(), source })?;
        if gguf.tensors.is_empty() {
            return Err(ImatrixError::NoData { path: p() });
        }
        let mut out = Imatrix::default();
        if let Some(Value::Array(Array::String(a))) = gguf.metadata.get(KEY_DATASETS) {
            out.datasets.extend(a.iter().map(str::to_string));
        }
        let get_u32 = |key: &'static str| -> Result<u32, ImatrixError> {
            match gguf.metadata.get(key) {
                None => Ok(0),
                Some(Value::U32(v)) => Ok(*v),
                Some(_) => Err(ImatrixError::BadKey {
                    path: p(),
                    key,
                    expected: "u32",
                }),
            }
        };
        out.chunk_count = get_u32(KEY_CHUNK_COUNT)?;
        out.chunk_size = get_u32(KEY_CHUNK_SIZE)?;

        // name -> (sums tensor, counts tensor), as llama.cpp pairs them.
        let mut pairs: BTreeMap<&str, (Option<usize>, Option<usize>)> = BTreeMap::new();
        for (i, t) in gguf.tensors.iter().enumerate() {
            if let Some(name) = t.name.strip_suffix(SUFFIX_SUMS) {
                pairs.entry(name).or_default().0 = Some(i);
            } else if let Some(name) = t.name.strip_suffix(SUFFIX_COUNTS) {
                pairs.entry(name).or_default().1 = Some(i);
            }
        }
        let data = |i: usize| -> Result<Vec<f32>, ImatrixError> {
            let t = &gguf.tensors[i];
            if t.dtype != DType::F32 {
                return Err(ImatrixError::NotF32 {
                    path: p(),
                    name: t.name.clone(),
                    found: t.dtype,
                });
            }
            // Gguf::parse has checked every tensor's range against the file.
            let start = (gguf.data_offset + t.offset) as usize;
            let raw = &bytes[start..start + t.size as usize];
            Ok(raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect())
        };
        for (name, pair) in pairs {
            if name.is_empty() {
                continue;
            }
            let (Some(s), Some(c)) = pair else {
                return Err(ImatrixError::Mismatched {
                    path: p(),
                    name: name.to_string(),
                });
            };
            let entry = ImatrixEntry {
                sums: data(s)?,
                counts: data(c)?,
            };
            if entry.counts.is_empty() || !entry.sums.len().is_multiple_of(entry.counts.len()) {
                return Err(ImatrixError::Mismatched {
                    path: p(),
                    name: name.to_string(),
                });
            }
            out.entries.insert(name.to_string(), entry);
        }
        Ok(out)
    }

    fn from_legacy(bytes: &[u8], path: &Path) -> Result<Imatrix, ImatrixError> {
        let p = || display(path);
        let mut r = Reader { bytes, pos: 0 };
        let n_entries = match r.i32() {
            Some(n) if n >= 1 => n,
            _ => return Err(ImatrixError::NoData { path: p() }),
        };
        let truncated = |what: String| ImatrixError::Truncated { path: p(), what };
        let mut out = Imatrix {
            is_legacy: true,
            ..Imatrix::default()
        };
        for i in 0..n_entries {
            let len = r
                .i32()
                .ok_or_else(|| truncated(format!("name length of entry {}", i + 1)))?;
            let len = usize::try_from(len).map_err(|_| ImatrixError::BadLegacy {
                path: p(),
                what: format!("negative name length {len} for entry {}", i + 1),
            })?;
            let name = r
                .take(len)
                .ok_or_else(|| truncated(format!("name of entry {}", i + 1)))?;
            let name = c_string(name);
            let ncall = r
                .i32()
                .ok_or_else(|| truncated(format!("ncall of entry {}", i + 1)))?;
            let nval = r
                .i32()
                .ok_or_else(|| truncated(format!("value count of entry {}", i + 1)))?;
            if nval < 1 {
                return Err(ImatrixError::BadLegacy {
                    path: p(),
                    what: format!("{nval} values for entry {}", i + 1),
                });
            }
            let raw = (nval as usize)
                .checked_mul(4)
                .and_then(|n| r.take(n))
                .ok_or_else(|| truncated(format!("{nval} values of entry {}", i + 1)))?;
            let sums = raw
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            // A repeated name replaces the earlier entry, as in llama.cpp.
            out.entries.insert(
                name,
                ImatrixEntry {
                    sums,
                    counts: vec![ncall as f32],
                },
            );
        }
        // The trailing chunk count and dataset name are optional.
        if r.pos < bytes.len()
            && let Some(n) = r.i32()
        {
            out.chunk_count = n as u32;
            if let Some(len) = r.i32()
                && len > 0
                && let Some(d) = r.take(len as usize)
            {
                out.datasets.push(c_string(d));
            }
        }
        Ok(out)
    }

    /// The per-column weights `llama-quantize` hands the quantizers, computed exactly as its
    /// `load_imatrix` does: GGUF sums divided by their matrix's (rounded) count, 1.0 for a matrix
    /// that saw no rows; legacy sums divided by `ncall` (left as they are when `ncall <= 0`).
    pub fn quant_weights(&self) -> HashMap<String, Vec<f32>> {
        let mut out = HashMap::with_capacity(self.entries.len());
        for (name, entry) in &self.entries {
            let mut e = vec![0f32; entry.sums.len()];
            if !self.is_legacy {
                if let Some(ne0) = entry.sums.len().checked_div(entry.counts.len()) {
                    for (j, &c) in entry.counts.iter().enumerate() {
                        let count = lround(c) as f32;
                        let (src, dst) = (
                            &entry.sums[j * ne0..(j + 1) * ne0],
                            &mut e[j * ne0..(j + 1) * ne0],
                        );
                        if count > 0.0 {
                            for (d, &s) in dst.iter_mut().zip(src) {
                                *d = s / count;
                            }
                        } else {
                            dst.fill(1.0);
                        }
                    }
                }
            } else {
                let ncall = entry.counts.first().map_or(0, |&c| lround(c));
                if ncall > 0 {
                    let n = ncall as f32;
                    for (d, &s) in e.iter_mut().zip(&entry.sums) {
                        *d = s / n;
                    }
                } else {
                    e.copy_from_slice(&entry.sums);
                }
            }
            out.insert(name.clone(), e);
        }
        out
    }

    /// The GGUF file `llama-imatrix` writes for this data, byte for byte.
    pub fn to_gguf_bytes(&self) -> Result<Vec<u8>, ImatrixError> {
        let mut metadata = Metadata::default();
        metadata.set("general.type", Value::String("imatrix".into()));
        let mut datasets = StrArray::with_capacity(
            self.datasets.len(),
            self.datasets.iter().map(String::len).sum(),
        );
        for d in &self.datasets {
            datasets.push(d);
        }
        metadata.set(KEY_DATASETS, Value::Array(Array::String(datasets)));
        metadata.set(KEY_CHUNK_COUNT, Value::U32(self.chunk_count));
        metadata.set(KEY_CHUNK_SIZE, Value::U32(self.chunk_size));

        let mut blobs: Vec<(String, u64, u64, Vec<u8>)> = Vec::new();
        for (name, e) in &self.entries {
            let (nval, nmat) = (e.sums.len(), e.counts.len());
            if nval == 0 || nmat == 0 {
                continue;
            }
            if !nval.is_multiple_of(nmat) {
                return Err(ImatrixError::BadShape {
                    name: name.clone(),
                    sums: nval,
                    counts: nmat,
                });
            }
            blobs.push((
                ggml_name(&format!("{name}{SUFFIX_SUMS}")),
                (nval / nmat) as u64,
                nmat as u64,
                f32_bytes(&e.sums),
            ));
            blobs.push((
                ggml_name(&format!("{name}{SUFFIX_COUNTS}")),
                1,
                nmat as u64,
                f32_bytes(&e.counts),
            ));
        }
        let mut writer = GgufWriter::new(metadata);
        for (name, ne0, ne1, data) in &blobs {
            // gguf writes ggml_n_dims: trailing dimensions of 1 are dropped.
            let dims: &[u64] = if *ne1 == 1 { &[*ne0] } else { &[*ne0, *ne1] };
            writer.add_tensor(name.clone(), DType::F32, dims, data)?;
        }
        let mut out = Vec::new();
        writer.write_to(&mut out)?;
        Ok(out)
    }

    /// Writes [`Imatrix::to_gguf_bytes`] to `path` atomically (a temporary file beside it,
    /// renamed into place).
    pub fn save(&self, path: &Path) -> Result<(), ImatrixError> {
        write_atomically(path, &self.to_gguf_bytes()?)
    }
}

/// Writes `bytes` to `path` through a temporary file beside it, renamed into place.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ImatrixError> {
    let werr = |source| ImatrixError::Write {
        path: display(path),
        source,
    };
    let mut tmp = crate::temp_output_for(path).map_err(werr)?;
    tmp.write_all(bytes).map_err(werr)?;
    tmp.flush().map_err(werr)?;
    tmp.persist(path).map_err(|e| werr(e.error))?;
    Ok(())
}

/// C's `lround` for a count stored as f32 (NaN and out-of-range values saturate, as Rust casts do).
fn lround(x: f32) -> i64 {
    x.round() as i64
}

/// The name ggml_format_name gives: at most `GGML_MAX_NAME - 1` bytes (cut at a char boundary).
fn ggml_name(name: &str) -> String {
    if name.len() < GGML_MAX_NAME {
        return name.to_string();
    }
    let mut end = GGML_MAX_NAME - 1;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_string()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Bytes up to the first NUL, as llama.cpp reads a name into a C string.
fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.pos.checked_add(n)?;
        let s = self.bytes.get(self.pos..end)?;
        self.pos = end;
        Some(s)
    }

    fn i32(&mut self) -> Option<i32> {
        self.take(4)
            .map(|b| i32::from_le_bytes(b.try_into().unwrap()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Imatrix {
        let mut entries = BTreeMap::new();
        entries.insert(
            "blk.0.ffn_up.weight".to_string(),
            ImatrixEntry {
                sums: vec![1.0, 2.0, 3.0, 4.0],
                counts: vec![2.0],
            },
        );
        entries.insert(
            "blk.0.ffn_up_exps.weight".to_string(),
            ImatrixEntry {
                sums: vec![1.0, 2.0, 3.0, 4.0],
                counts: vec![4.0, 0.0],
            },
        );
        Imatrix {
            entries,
            datasets: vec!["a.txt".into(), "b.txt".into()],
            chunk_count: 3,
            chunk_size: 512,
            is_legacy: false,
        }
    }

    #[test]
    fn round_trips_through_gguf() {
        let m = sample();
        let bytes = m.to_gguf_bytes().unwrap();
        let back = Imatrix::from_bytes(&bytes, Path::new("mem")).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.to_gguf_bytes().unwrap(), bytes);
    }

    #[test]
    fn quant_weights_normalize_like_quantize() {
        let w = sample().quant_weights();
        assert_eq!(w["blk.0.ffn_up.weight"], vec![0.5, 1.0, 1.5, 2.0]);
        assert_eq!(w["blk.0.ffn_up_exps.weight"], vec![0.25, 0.5, 1.0, 1.0]);
        let mut legacy = sample();
        legacy.is_legacy = true;
        let w = legacy.quant_weights();
        assert_eq!(w["blk.0.ffn_up.weight"], vec![0.5, 1.0, 1.5, 2.0]);
        assert_eq!(w["blk.0.ffn_up_exps.weight"], vec![0.25, 0.5, 0.75, 1.0]);
    }

    fn legacy_bytes() -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(2i32.to_le_bytes());
        for (name, ncall, vals) in [("x.weight", 3i32, &[3.0f32, 6.0][..]), ("y", 1, &[1.0])] {
            b.extend((name.len() as i32).to_le_bytes());
            b.extend(name.as_bytes());
            b.extend(ncall.to_le_bytes());
            b.extend((vals.len() as i32).to_le_bytes());
            for v in vals {
                b.extend(v.to_le_bytes());
            }
        }
        b.extend(7i32.to_le_bytes());
        b.extend(5i32.to_le_bytes());
        b.extend(b"t.txt");
        b
    }

    #[test]
    fn reads_legacy() {
        let m = Imatrix::from_bytes(&legacy_bytes(), Path::new("mem")).unwrap();
        assert!(m.is_legacy);
        assert_eq!(m.chunk_count, 7);
        assert_eq!(m.datasets, vec!["t.txt".to_string()]);
        assert_eq!(m.entries["x.weight"].sums, vec![3.0, 6.0]);
        assert_eq!(m.entries["x.weight"].counts, vec![3.0]);
        assert_eq!(m.quant_weights()["x.weight"], vec![1.0, 2.0]);
    }

    #[test]
    fn truncated_files_are_errors_never_panics() {
        let legacy = legacy_bytes();
        // Everything up to the end of the last entry's values must fail; beyond that the
        // trailer is optional.
        let entries_end = legacy.len() - 13;
        for n in 0..entries_end {
            assert!(
                Imatrix::from_bytes(&legacy[..n], Path::new("mem")).is_err(),
                "{n} bytes"
            );
        }
        for n in entries_end..=legacy.len() {
            Imatrix::from_bytes(&legacy[..n], Path::new("mem")).unwrap();
        }
        let gguf = sample().to_gguf_bytes().unwrap();
        for n in 0..gguf.len() {
            let _ = Imatrix::from_bytes(&gguf[..n], Path::new("mem"));
        }
        assert!(Imatrix::from_bytes(&gguf[..gguf.len() - 40], Path::new("mem")).is_err());
    }

    #[test]
    fn hostile_sizes_do_not_allocate() {
        let mut b = Vec::new();
        b.extend(1i32.to_le_bytes());
        b.extend(1i32.to_le_bytes());
        b.extend(b"x");
        b.extend(1i32.to_le_bytes());
        b.extend(i32::MAX.to_le_bytes());
        assert!(matches!(
            Imatrix::from_bytes(&b, Path::new("mem")),
            Err(ImatrixError::Truncated { .. })
        ));
        let mut b = Vec::new();
        b.extend(1i32.to_le_bytes());
        b.extend((-5i32).to_le_bytes());
        assert!(matches!(
            Imatrix::from_bytes(&b, Path::new("mem")),
            Err(ImatrixError::BadLegacy { .. })
        ));
    }

    #[test]
    fn mismatched_sums_and_counts_are_errors() {
        let mut m = sample();
        m.entries.get_mut("blk.0.ffn_up.weight").unwrap().counts = vec![1.0, 1.0, 1.0];
        assert!(matches!(
            m.to_gguf_bytes(),
            Err(ImatrixError::BadShape { .. })
        ));

        // A sums tensor without its counts.
        let sums = f32_bytes(&[1.0, 2.0]);
        let mut w = GgufWriter::new(Metadata::default());
        w.add_tensor("a.weight.in_sum2", DType::F32, &[2, 1], &sums)
            .unwrap();
        let mut bytes = Vec::new();
        w.write_to(&mut bytes).unwrap();
        assert!(matches!(
            Imatrix::from_bytes(&bytes, Path::new("mem")),
            Err(ImatrixError::Mismatched { .. })
        ));

        // Counts that do not divide the sums.
        let counts = f32_bytes(&[1.0, 1.0, 1.0]);
        let sums = f32_bytes(&[1.0, 2.0, 3.0, 4.0]);
        let mut w = GgufWriter::new(Metadata::default());
        w.add_tensor("a.weight.in_sum2", DType::F32, &[4, 1], &sums)
            .unwrap();
        w.add_tensor("a.weight.counts", DType::F32, &[1, 3], &counts)
            .unwrap();
        let mut bytes = Vec::new();
        w.write_to(&mut bytes).unwrap();
        assert!(matches!(
            Imatrix::from_bytes(&bytes, Path::new("mem")),
            Err(ImatrixError::Mismatched { .. })
        ));

        // A file with no tensors at all.
        let mut bytes = Vec::new();
        GgufWriter::new(Metadata::default())
            .write_to(&mut bytes)
            .unwrap();
        assert!(matches!(
            Imatrix::from_bytes(&bytes, Path::new("mem")),
            Err(ImatrixError::NoData { .. })
        ));
    }
}
