//! The GGUF parser: header, metadata, tensor table, and validation of the data section layout.

use std::collections::HashSet;

use lamina_core::{DType, DTypeError};

use crate::GgufError;
use crate::metadata::{Array, Metadata, StrArray, Value, ValueType};

/// "GGUF" as it appears at the start of the file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// Deepest array-of-array nesting accepted (the outermost array is level 1).
pub const MAX_ARRAY_NESTING: usize = 8;
/// Most dimensions a tensor may have.
pub const MAX_DIMS: usize = 4;

/// The fewest bytes one metadata entry takes: key length (8), value type (4), a 1-byte value.
const MIN_KV_SIZE: u64 = 13;
/// The fewest bytes one tensor-table entry takes: name length (8), n_dims (4), one dimension
/// (8), type (4), offset (8).
const MIN_TENSOR_INFO_SIZE: u64 = 32;
/// Most elements reserved up front for an array of arrays; past this the vector grows
/// as elements are actually read, so memory stays proportional to the bytes consumed.
const MAX_ARRAY_RESERVE: usize = 4096;

/// One entry of the tensor table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: DType,
    /// Dimensions, innermost first (ggml's `ne`); unused trailing dimensions are 1.
    pub shape: [u64; MAX_DIMS],
    /// How many dimensions the file declared (1 to 4).
    pub n_dims: usize,
    /// Offset of the data from the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub size: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.shape.iter().product()
    }

    /// The declared dimensions only.
    pub fn dims(&self) -> &[u64] {
        &self.shape[..self.n_dims]
    }
}

/// A parsed GGUF header: everything but the tensor bytes.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub version: u32,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment`, or [`DEFAULT_ALIGNMENT`].
    pub alignment: u64,
    /// Byte offset of the data section from the start of the file.
    pub data_offset: u64,
}

impl Gguf {
    /// Parses and validates a whole GGUF file held in memory. Tensor data ranges are checked
    /// against `bytes.len()`.
    pub fn parse(bytes: &[u8]) -> Result<Gguf, GgufError> {
        let mut r = Reader { bytes, pos: 0 };

        let magic: [u8; 4] = r.take(4, "header")?.try_into().expect("4 bytes");
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = r.u32("header")?;
        if version & 0xFFFF == 0 && version != 0 {
            // A big-endian writer stores 2 or 3 as 0x02000000 / 0x03000000.
            return Err(GgufError::BigEndian(version));
        }
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        let n_tensors = r.u64("header")?;
        let n_kv = r.u64("header")?;
        // Each KV takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at least
        // 8 (name length) + 4 (n_dims) + 8 (one dim) + 4 (type) + 8 (offset).
        r.check_count("metadata key/value", n_kv, MIN_KV_SIZE)?;
        r.check_count("tensor", n_tensors, MIN_TENSOR_INFO_SIZE)?;

        let mut metadata = Metadata::default();
        for _ in 0..n_kv {
            let key = r.string("metadata key", "metadata key")?;
            let type_id = r.u32("metadata")?;
            let vtype = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
                key: key.clone(),
                type_id,
            })?;
            let value = r.value(&key, vtype, 0)?;
            if !metadata.insert(key.clone(), value) {
                return Err(GgufError::DuplicateKey(key));
            }
        }

        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) => u64::from(*a),
            Some(v) => {
                return Err(GgufError::BadMetadata {
                    key: "general.alignment".into(),
                    message: format!("should be u32, found {}", v.type_description()),
                });
            }
        };
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(GgufError::BadAlignment(alignment));
        }

        // Checked again now that the metadata has used its share of the bytes, so the table
        // below is never reserved larger than what is left could describe.
        r.check_count("tensor", n_tensors, MIN_TENSOR_INFO_SIZE)?;
        let mut tensors = Vec::with_capacity(n_tensors as usize);
        let mut names = HashSet::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let info = r.tensor_info(alignment)?;
            if !names.insert(info.name.clone()) {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
        }

        let data_offset = align_up(r.pos as u64, alignment).ok_or(GgufError::Truncated {
            section: "padding before tensor data",
            offset: r.pos as u64,
            needed: alignment,
            available: 0,
        })?;
        let file_len = bytes.len() as u64;
        if !tensors.is_empty() && data_offset > file_len {
            return Err(GgufError::Truncated {
                section: "padding before tensor data",
                offset: r.pos as u64,
                needed: data_offset - r.pos as u64,
                available: file_len - r.pos as u64,
            });
        }
        let data_len = file_len.saturating_sub(data_offset);
        check_layout(&tensors, data_len)?;

        Ok(Gguf {
            version,
            metadata,
            tensors,
            alignment,
            data_offset,
        })
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// `general.architecture`, if present and a string.
    pub fn architecture(&self) -> Option<&str> {
        self.metadata.get_str("general.architecture").ok().flatten()
    }
}

/// Every tensor must lie inside the data section, and no two may share bytes.
fn check_layout(tensors: &[TensorInfo], data_len: u64) -> Result<(), GgufError> {
    for t in tensors {
        let end = t.offset.checked_add(t.size).filter(|&e| e <= data_len);
        if end.is_none() {
            return Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                start: t.offset,
                end: t.offset.saturating_add(t.size),
                data_len,
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().filter(|t| t.size > 0).collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        if pair[0].offset + pair[0].size > pair[1].offset {
            return Err(GgufError::TensorOverlap {
                first: pair[0].name.clone(),
                second: pair[1].name.clone(),
            });
        }
    }
    Ok(())
}

/// Bytes taken by a contiguous tensor of `dtype` with dimensions `shape` (innermost first, unused
/// ones 1), refusing a row that is not whole blocks and any element count or size past u64.
pub(crate) fn tensor_nbytes(
    name: &str,
    dtype: DType,
    shape: &[u64; MAX_DIMS],
    n_dims: usize,
) -> Result<u64, GgufError> {
    let overflow = || GgufError::ShapeOverflow {
        tensor: name.to_string(),
        shape: shape[..n_dims].to_vec(),
    };
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)?;
    let row = dtype.row_size(shape[0]).map_err(|e| match e {
        DTypeError::RowNotBlockMultiple { dtype, len, block } => GgufError::RowNotBlockMultiple {
            tensor: name.to_string(),
            dtype,
            row: len,
            block,
        },
        _ => overflow(),
    })?;
    shape[1..]
        .iter()
        .try_fold(row, |acc, &d| acc.checked_mul(d))
        .ok_or_else(overflow)
}

pub(crate) fn align_up(x: u64, alignment: u64) -> Option<u64> {
    Some(x.checked_add(alignment - 1)? / alignment * alignment)
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, section: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                section,
                offset: self.pos as u64,
                needed: n,
                available: self.remaining(),
            });
        }
        let n = n as usize;
        let s = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, section: &'static str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N as u64, section)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, section: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(section)?))
    }

    fn u64(&mut self, section: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(section)?))
    }

    /// Refuses a count of items that cannot fit in the bytes left, before anything is allocated.
    fn check_count(
        &self,
        what: &'static str,
        count: u64,
        min_item_size: u64,
    ) -> Result<(), GgufError> {
        match count.checked_mul(min_item_size) {
            Some(need) if need <= self.remaining() => Ok(()),
            _ => Err(GgufError::CountTooLarge {
                what,
                count,
                offset: self.pos as u64,
                remaining: self.remaining(),
            }),
        }
    }

    fn string(&mut self, what: &'static str, section: &'static str) -> Result<String, GgufError> {
        self.str_slice(what, section).map(str::to_owned)
    }

    /// A length-prefixed UTF-8 string, borrowed from the input.
    fn str_slice(
        &mut self,
        what: &'static str,
        section: &'static str,
    ) -> Result<&'a str, GgufError> {
        let len = self.u64(section)?;
        self.check_count("string length", len, 1)?;
        let start = self.pos as u64;
        let raw = self.take(len, section)?;
        std::str::from_utf8(raw).map_err(|_| GgufError::InvalidUtf8 {
            what,
            offset: start,
        })
    }

    /// `n` strings into one buffer. A first pass checks every string as reading it would and
    /// adds up the bytes, so both buffers are allocated once, at a size bounded by the input.
    fn string_array(&mut self, n: usize) -> Result<StrArray, GgufError> {
        const S: &str = "metadata array";
        const WHAT: &str = "metadata string value";
        let first = self.pos;
        let mut total = 0usize;
        for _ in 0..n {
            total += self.str_slice(WHAT, S)?.len();
        }
        self.pos = first;
        let mut strings = StrArray::with_capacity(n, total);
        for _ in 0..n {
            strings.push(self.str_slice(WHAT, S)?);
        }
        Ok(strings)
    }

    fn value(&mut self, key: &str, vtype: ValueType, depth: usize) -> Result<Value, GgufError> {
        const S: &str = "metadata value";
        Ok(match vtype {
            ValueType::U8 => Value::U8(self.array::<1>(S)?[0]),
            ValueType::I8 => Value::I8(self.array::<1>(S)?[0] as i8),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(S)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(S)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(S)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(S)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(S)?)),
            ValueType::Bool => Value::Bool(self.array::<1>(S)?[0] != 0),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(S)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(S)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(S)?)),
            ValueType::String => Value::String(self.string("metadata string value", S)?),
            ValueType::Array => Value::Array(self.array_value(key, depth + 1)?),
        })
    }

    fn array_value(&mut self, key: &str, depth: usize) -> Result<Array, GgufError> {
        const S: &str = "metadata array";
        if depth > MAX_ARRAY_NESTING {
            return Err(GgufError::NestingTooDeep {
                key: key.to_string(),
                max: MAX_ARRAY_NESTING,
            });
        }
        let type_id = self.u32(S)?;
        let etype = ValueType::from_id(type_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.to_string(),
            type_id,
        })?;
        let n = self.u64(S)?;
        self.check_count("array length", n, etype.min_encoded_size())?;
        let n = n as usize;

        fn scalars<T, const W: usize>(
            r: &mut Reader<'_>,
            n: usize,
            conv: impl Fn([u8; W]) -> T,
        ) -> Result<Vec<T>, GgufError> {
            let raw = r.take((n * W) as u64, S)?;
            Ok(raw
                .chunks_exact(W)
                .map(|c| conv(c.try_into().expect("W bytes")))
                .collect())
        }

        Ok(match etype {
            ValueType::U8 => Array::U8(scalars(self, n, |b: [u8; 1]| b[0])?),
            ValueType::I8 => Array::I8(scalars(self, n, |b: [u8; 1]| b[0] as i8)?),
            ValueType::Bool => Array::Bool(scalars(self, n, |b: [u8; 1]| b[0] != 0)?),
            ValueType::U16 => Array::U16(scalars(self, n, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(scalars(self, n, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(scalars(self, n, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(scalars(self, n, i32::from_le_bytes)?),
            ValueType::F32 => Array::F32(scalars(self, n, f32::from_le_bytes)?),
            ValueType::U64 => Array::U64(scalars(self, n, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(scalars(self, n, i64::from_le_bytes)?),
            ValueType::F64 => Array::F64(scalars(self, n, f64::from_le_bytes)?),
            ValueType::String => Array::String(self.string_array(n)?),
            ValueType::Array => {
                let mut v = Vec::with_capacity(n.min(MAX_ARRAY_RESERVE));
                for _ in 0..n {
                    v.push(self.array_value(key, depth + 1)?);
                }
                Array::Array(v)
            }
        })
    }

    fn tensor_info(&mut self, alignment: u64) -> Result<TensorInfo, GgufError> {
        const S: &str = "tensor info";
        let name = self.string("tensor name", S)?;
        let n_dims = self.u32(S)?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadDimCount {
                tensor: name,
                n_dims,
            });
        }
        let mut shape = [1u64; MAX_DIMS];
        for (dim, slot) in shape.iter_mut().enumerate().take(n_dims as usize) {
            let value = self.u64(S)?;
            if value > i64::MAX as u64 {
                return Err(GgufError::DimTooLarge {
                    tensor: name,
                    dim,
                    value,
                });
            }
            *slot = value;
        }
        let type_id = self.u32(S)?;
        let dtype = DType::from_id(type_id).map_err(|_| GgufError::UnknownTensorType {
            tensor: name.clone(),
            type_id,
        })?;
        let offset = self.u64(S)?;

        let size = tensor_nbytes(&name, dtype, &shape, n_dims as usize)?;
        if offset % alignment != 0 {
            return Err(GgufError::MisalignedOffset {
                tensor: name,
                offset,
                alignment,
            });
        }
        Ok(TensorInfo {
            name,
            dtype,
            shape,
            n_dims: n_dims as usize,
            offset,
            size,
        })
    }
}
