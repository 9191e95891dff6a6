//! Writing GGUF files, laid out the way llama.cpp's writers lay them out.
//!
//! The layout: header, metadata in insertion order, tensor table in insertion order, zero padding
//! to the alignment, then each tensor's bytes followed by zero padding to the alignment. Each
//! tensor's offset is therefore the padded sum of the sizes before it, as in `gguf.cpp` and
//! gguf-py. A file without tensors ends right after its (empty) tensor table, as the
//! `--vocab-only` converter writes it. Reading a file written that way and writing it again
//! reproduces it byte for byte.

use std::collections::HashSet;
use std::io::{self, BufWriter, Write};

use lamina_core::DType;

use crate::metadata::{Array, Metadata, Value};
use crate::parse::{align_up, tensor_nbytes};
use crate::{
    DEFAULT_ALIGNMENT, GGUF_MAGIC, Gguf, GgufError, GgufFile, MAX_ARRAY_NESTING, MAX_DIMS,
    TensorInfo,
};

/// One tensor to write: its table entry and its bytes.
#[derive(Clone, Debug)]
pub struct TensorToWrite<'a> {
    pub name: String,
    pub dtype: DType,
    /// Dimensions, innermost first (ggml's `ne`), 1 to 4 of them.
    pub dims: Vec<u64>,
    /// The tensor's bytes, exactly `dtype`'s size for `dims`.
    pub data: &'a [u8],
}

/// Builds a GGUF file from metadata and tensors and streams it to any [`Write`].
///
/// ```
/// use lamina_gguf::{Gguf, GgufWriter, Metadata, Value};
/// use lamina_core::DType;
///
/// let mut metadata = Metadata::default();
/// metadata.set("general.architecture", Value::String("llama".into()));
/// let weights = [0u8; 16];
/// let mut writer = GgufWriter::new(metadata);
/// writer.add_tensor("w", DType::F32, &[4], &weights).unwrap();
/// let mut bytes = Vec::new();
/// writer.write_to(&mut bytes).unwrap();
/// let gguf = Gguf::parse(&bytes).unwrap();
/// assert_eq!(gguf.tensors[0].dims(), &[4]);
/// ```
#[derive(Clone, Debug)]
pub struct GgufWriter<'a> {
    version: u32,
    metadata: Metadata,
    tensors: Vec<TensorToWrite<'a>>,
    names: HashSet<String>,
}

impl<'a> GgufWriter<'a> {
    /// A GGUF v3 file with `metadata` and no tensors yet. The alignment is `general.alignment`
    /// (a u32) when the metadata has it, else [`DEFAULT_ALIGNMENT`].
    pub fn new(metadata: Metadata) -> GgufWriter<'a> {
        GgufWriter {
            version: 3,
            metadata,
            tensors: Vec::new(),
            names: HashSet::new(),
        }
    }

    /// Everything in a parsed file, in its order, with tensor bytes borrowed from its map.
    pub fn from_file(file: &'a GgufFile) -> GgufWriter<'a> {
        Self::from_parts(file.gguf(), file.bytes())
            .expect("a GgufFile's tensors were validated against its own bytes")
    }

    /// Everything in `gguf`, with tensor bytes taken from `bytes`, the file it was parsed from.
    pub fn from_parts(gguf: &Gguf, bytes: &'a [u8]) -> Result<GgufWriter<'a>, GgufError> {
        let mut writer = GgufWriter::new(gguf.metadata.clone()).with_version(gguf.version)?;
        for t in &gguf.tensors {
            let out_of_bounds = || GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                start: t.offset,
                end: t.offset.saturating_add(t.size),
                data_len: (bytes.len() as u64).saturating_sub(gguf.data_offset),
            };
            let start = gguf
                .data_offset
                .checked_add(t.offset)
                .ok_or_else(out_of_bounds)?;
            let end = start.checked_add(t.size).ok_or_else(out_of_bounds)?;
            let data = usize::try_from(start)
                .ok()
                .zip(usize::try_from(end).ok())
                .and_then(|(s, e)| bytes.get(s..e))
                .ok_or_else(out_of_bounds)?;
            writer.add_tensor(t.name.clone(), t.dtype, t.dims(), data)?;
        }
        Ok(writer)
    }

    /// Writes format version `version` (2 or 3; they differ only in that v3 allows big-endian
    /// files, which this writer never produces).
    pub fn with_version(mut self, version: u32) -> Result<GgufWriter<'a>, GgufError> {
        if version != 2 && version != 3 {
            return Err(GgufError::UnsupportedVersion(version));
        }
        self.version = version;
        Ok(self)
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// The metadata, to add or change keys before writing.
    pub fn metadata_mut(&mut self) -> &mut Metadata {
        &mut self.metadata
    }

    /// Appends a tensor. Refuses what a reader would refuse: a duplicate name, 0 or more than 4
    /// dimensions, a row that is not whole blocks, a size past u64, or `data` of the wrong size.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dtype: DType,
        dims: &[u64],
        data: &'a [u8],
    ) -> Result<(), GgufError> {
        let name = name.into();
        let size = checked_size(&name, dtype, dims)?;
        if size != data.len() as u64 {
            return Err(GgufError::TensorDataSize {
                tensor: name,
                expected: size,
                actual: data.len() as u64,
            });
        }
        if self.names.contains(&name) {
            return Err(GgufError::DuplicateTensor(name));
        }
        self.names.insert(name.clone());
        self.tensors.push(TensorToWrite {
            name,
            dtype,
            dims: dims.to_vec(),
            data,
        });
        Ok(())
    }

    pub fn tensors(&self) -> &[TensorToWrite<'a>] {
        &self.tensors
    }

    /// The alignment the file will use, checked as a reader checks it.
    pub fn alignment(&self) -> Result<u64, GgufError> {
        match self.metadata.get("general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(Value::U32(a)) if *a != 0 && a.is_power_of_two() => Ok(u64::from(*a)),
            Some(Value::U32(a)) => Err(GgufError::BadAlignment(u64::from(*a))),
            Some(v) => Err(GgufError::BadMetadata {
                key: "general.alignment".into(),
                message: format!("should be u32, found {}", v.type_description()),
            }),
        }
    }

    /// The tensor table as it will be written: each tensor at the padded end of the previous one.
    pub fn tensor_infos(&self) -> Result<Vec<TensorInfo>, GgufError> {
        let alignment = self.alignment()?;
        let mut offset = 0u64;
        let mut infos = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            let mut shape = [1u64; MAX_DIMS];
            shape[..t.dims.len()].copy_from_slice(&t.dims);
            let size = t.data.len() as u64;
            infos.push(TensorInfo {
                name: t.name.clone(),
                dtype: t.dtype,
                shape,
                n_dims: t.dims.len(),
                offset,
                size,
            });
            offset = offset
                .checked_add(size)
                .and_then(|end| align_up(end, alignment))
                .ok_or_else(|| GgufError::ShapeOverflow {
                    tensor: t.name.clone(),
                    shape: t.dims.clone(),
                })?;
        }
        Ok(infos)
    }

    /// Streams the file to `out` (buffered internally); returns the number of bytes written.
    /// Everything is validated before the first byte is written.
    pub fn write_to(&self, out: impl Write) -> Result<u64, GgufError> {
        let alignment = self.alignment()?;
        let infos = self.tensor_infos()?;
        for (key, value) in self.metadata.entries() {
            if let Value::Array(a) = value {
                check_nesting(key, a, 1)?;
            }
        }
        let mut w = CountingWriter {
            inner: BufWriter::with_capacity(1 << 16, out),
            written: 0,
        };
        write_all(&mut w, self, &infos, alignment).map_err(GgufError::Write)?;
        w.inner.flush().map_err(GgufError::Write)?;
        Ok(w.written)
    }
}

/// Writes a GGUF v3 file with `metadata` and `tensors` (name, type, dims, bytes) to `out`;
/// returns the number of bytes written.
pub fn write_gguf<'a>(
    out: impl Write,
    metadata: Metadata,
    tensors: impl IntoIterator<Item = TensorToWrite<'a>>,
) -> Result<u64, GgufError> {
    let mut writer = GgufWriter::new(metadata);
    for t in tensors {
        writer.add_tensor(t.name, t.dtype, &t.dims, t.data)?;
    }
    writer.write_to(out)
}

/// The byte size of a tensor of `dtype` and `dims`, refusing what a reader would refuse: 0 or
/// more than 4 dimensions, a dimension past i64, a row that is not whole blocks, a size past u64.
fn checked_size(name: &str, dtype: DType, dims: &[u64]) -> Result<u64, GgufError> {
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(GgufError::BadDimCount {
            tensor: name.to_string(),
            n_dims: dims.len() as u32,
        });
    }
    let mut shape = [1u64; MAX_DIMS];
    for (dim, (&value, slot)) in dims.iter().zip(shape.iter_mut()).enumerate() {
        if value > i64::MAX as u64 {
            return Err(GgufError::DimTooLarge {
                tensor: name.to_string(),
                dim,
                value,
            });
        }
        *slot = value;
    }
    tensor_nbytes(name, dtype, &shape, dims.len())
}

/// A tensor-table entry whose bytes are supplied later, through [`GgufStreamWriter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorHeader {
    pub name: String,
    pub dtype: DType,
    /// Dimensions, innermost first (ggml's `ne`), 1 to 4 of them.
    pub dims: Vec<u64>,
}

/// Writes a GGUF file whose tensor bytes are produced one tensor at a time, in table order, so
/// a converter never holds more than one tensor. The table is fixed up front (a tensor's size
/// follows from its type and dims), written first, and each [`write_tensor`] call must then
/// supply exactly that tensor's bytes. The result is byte for byte what [`GgufWriter`] writes.
///
/// [`write_tensor`]: GgufStreamWriter::write_tensor
pub struct GgufStreamWriter<W: Write> {
    w: CountingWriter<BufWriter<W>>,
    table: Vec<TensorInfo>,
    alignment: u64,
    next: usize,
}

impl<W: Write> GgufStreamWriter<W> {
    /// Validates the table (as [`GgufWriter::add_tensor`] does) and writes the header, the
    /// metadata, the tensor table and the padding before the data.
    pub fn new(
        out: W,
        metadata: &Metadata,
        tensors: &[TensorHeader],
    ) -> Result<GgufStreamWriter<W>, GgufError> {
        let probe = GgufWriter::new(metadata.clone());
        let alignment = probe.alignment()?;
        for (key, value) in metadata.entries() {
            if let Value::Array(a) = value {
                check_nesting(key, a, 1)?;
            }
        }
        let mut names = HashSet::with_capacity(tensors.len());
        let mut table = Vec::with_capacity(tensors.len());
        let mut offset = 0u64;
        for t in tensors {
            let size = checked_size(&t.name, t.dtype, &t.dims)?;
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::DuplicateTensor(t.name.clone()));
            }
            let mut shape = [1u64; MAX_DIMS];
            shape[..t.dims.len()].copy_from_slice(&t.dims);
            table.push(TensorInfo {
                name: t.name.clone(),
                dtype: t.dtype,
                shape,
                n_dims: t.dims.len(),
                offset,
                size,
            });
            offset = offset
                .checked_add(size)
                .and_then(|end| align_up(end, alignment))
                .ok_or_else(|| GgufError::ShapeOverflow {
                    tensor: t.name.clone(),
                    shape: t.dims.clone(),
                })?;
        }
        let mut w = CountingWriter {
            inner: BufWriter::with_capacity(1 << 16, out),
            written: 0,
        };
        write_header(&mut w, 3, metadata, &table).map_err(GgufError::Write)?;
        if !table.is_empty() {
            w.pad_to(alignment).map_err(GgufError::Write)?;
        }
        Ok(GgufStreamWriter {
            w,
            table,
            alignment,
            next: 0,
        })
    }

    /// The tensor table as written: offsets and sizes.
    pub fn table(&self) -> &[TensorInfo] {
        &self.table
    }

    /// The next tensor's bytes, followed by the padding to the alignment.
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), GgufError> {
        let info = self.table.get(self.next).ok_or(GgufError::TensorCount {
            expected: self.table.len(),
            written: self.next + 1,
        })?;
        if info.size != data.len() as u64 {
            return Err(GgufError::TensorDataSize {
                tensor: info.name.clone(),
                expected: info.size,
                actual: data.len() as u64,
            });
        }
        self.w.write_all(data).map_err(GgufError::Write)?;
        self.w.pad_to(self.alignment).map_err(GgufError::Write)?;
        self.next += 1;
        Ok(())
    }

    /// Flushes the file; refuses if some tensor was not written. Returns the bytes written.
    pub fn finish(mut self) -> Result<u64, GgufError> {
        if self.next != self.table.len() {
            return Err(GgufError::TensorCount {
                expected: self.table.len(),
                written: self.next,
            });
        }
        self.w.flush().map_err(GgufError::Write)?;
        Ok(self.w.written)
    }
}

fn check_nesting(key: &str, array: &Array, depth: usize) -> Result<(), GgufError> {
    if depth > MAX_ARRAY_NESTING {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            max: MAX_ARRAY_NESTING,
        });
    }
    if let Array::Array(inner) = array {
        for a in inner {
            check_nesting(key, a, depth + 1)?;
        }
    }
    Ok(())
}

struct CountingWriter<W: Write> {
    inner: W,
    written: u64,
}

impl<W: Write> Write for CountingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> CountingWriter<W> {
    fn pad_to(&mut self, alignment: u64) -> io::Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        let mut pad = self.written.next_multiple_of(alignment) - self.written;
        while pad > 0 {
            let n = pad.min(ZEROS.len() as u64) as usize;
            self.write_all(&ZEROS[..n])?;
            pad -= n as u64;
        }
        Ok(())
    }
}

fn write_all<W: Write>(
    w: &mut CountingWriter<W>,
    file: &GgufWriter<'_>,
    infos: &[TensorInfo],
    alignment: u64,
) -> io::Result<()> {
    write_header(w, file.version, &file.metadata, infos)?;
    if file.tensors.is_empty() {
        return Ok(());
    }
    w.pad_to(alignment)?;
    for t in &file.tensors {
        w.write_all(t.data)?;
        w.pad_to(alignment)?;
    }
    Ok(())
}

/// Header, metadata and tensor table (no padding after it).
fn write_header<W: Write>(
    w: &mut CountingWriter<W>,
    version: u32,
    metadata: &Metadata,
    infos: &[TensorInfo],
) -> io::Result<()> {
    w.write_all(&GGUF_MAGIC)?;
    w.write_all(&version.to_le_bytes())?;
    w.write_all(&(infos.len() as u64).to_le_bytes())?;
    w.write_all(&(metadata.len() as u64).to_le_bytes())?;
    for (key, value) in metadata.entries() {
        write_str(w, key)?;
        w.write_all(&(value.value_type() as u32).to_le_bytes())?;
        write_value(w, value)?;
    }
    for info in infos {
        write_str(w, &info.name)?;
        w.write_all(&(info.n_dims as u32).to_le_bytes())?;
        for d in info.dims() {
            w.write_all(&d.to_le_bytes())?;
        }
        w.write_all(&info.dtype.id().to_le_bytes())?;
        w.write_all(&info.offset.to_le_bytes())?;
    }
    Ok(())
}

fn write_str(w: &mut impl Write, s: &str) -> io::Result<()> {
    w.write_all(&(s.len() as u64).to_le_bytes())?;
    w.write_all(s.as_bytes())
}

fn write_value(w: &mut impl Write, value: &Value) -> io::Result<()> {
    match value {
        Value::U8(v) => w.write_all(&v.to_le_bytes()),
        Value::I8(v) => w.write_all(&v.to_le_bytes()),
        Value::U16(v) => w.write_all(&v.to_le_bytes()),
        Value::I16(v) => w.write_all(&v.to_le_bytes()),
        Value::U32(v) => w.write_all(&v.to_le_bytes()),
        Value::I32(v) => w.write_all(&v.to_le_bytes()),
        Value::F32(v) => w.write_all(&v.to_le_bytes()),
        Value::Bool(v) => w.write_all(&[u8::from(*v)]),
        Value::String(s) => write_str(w, s),
        Value::Array(a) => write_array(w, a),
        Value::U64(v) => w.write_all(&v.to_le_bytes()),
        Value::I64(v) => w.write_all(&v.to_le_bytes()),
        Value::F64(v) => w.write_all(&v.to_le_bytes()),
    }
}

/// An array value: element type, length, elements (an element that is an array carries its own
/// type and length, recursively).
fn write_array(w: &mut impl Write, array: &Array) -> io::Result<()> {
    w.write_all(&(array.element_type() as u32).to_le_bytes())?;
    w.write_all(&(array.len() as u64).to_le_bytes())?;
    fn each<T: Copy, const N: usize>(
        w: &mut impl Write,
        v: &[T],
        enc: fn(T) -> [u8; N],
    ) -> io::Result<()> {
        v.iter().try_for_each(|&x| w.write_all(&enc(x)))
    }
    match array {
        Array::U8(v) => w.write_all(v),
        Array::I8(v) => each(w, v, i8::to_le_bytes),
        Array::U16(v) => each(w, v, u16::to_le_bytes),
        Array::I16(v) => each(w, v, i16::to_le_bytes),
        Array::U32(v) => each(w, v, u32::to_le_bytes),
        Array::I32(v) => each(w, v, i32::to_le_bytes),
        Array::F32(v) => each(w, v, f32::to_le_bytes),
        Array::Bool(v) => each(w, v, |b| [u8::from(b)]),
        Array::String(v) => v.iter().try_for_each(|s| write_str(w, s)),
        Array::Array(v) => v.iter().try_for_each(|a| write_array(w, a)),
        Array::U64(v) => each(w, v, u64::to_le_bytes),
        Array::I64(v) => each(w, v, i64::to_le_bytes),
        Array::F64(v) => each(w, v, f64::to_le_bytes),
    }
}
