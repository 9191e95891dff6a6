//! Metadata values and typed accessors.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// GGUF metadata value type ids (`enum gguf_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    U8 = 0,
    I8 = 1,
    U16 = 2,
    I16 = 3,
    U32 = 4,
    I32 = 5,
    F32 = 6,
    Bool = 7,
    String = 8,
    Array = 9,
    U64 = 10,
    I64 = 11,
    F64 = 12,
}

impl ValueType {
    pub fn from_id(id: u32) -> Option<ValueType> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// Encoded size of one scalar value; `None` for strings and arrays (variable).
    pub fn scalar_size(self) -> Option<u64> {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => Some(1),
            U16 | I16 => Some(2),
            U32 | I32 | F32 => Some(4),
            U64 | I64 | F64 => Some(8),
            String | Array => None,
        }
    }

    /// The fewest bytes one encoded value of this type can take (used to bound counts).
    pub fn min_encoded_size(self) -> u64 {
        match self {
            ValueType::String => 8,
            ValueType::Array => 12,
            t => t.scalar_size().unwrap_or(1),
        }
    }

    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Array),
    U64(u64),
    I64(i64),
    F64(f64),
}

/// A homogeneous array, stored typed so that large arrays (vocabularies) stay compact.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(StrArray),
    /// Nested arrays (each element an array, possibly of different element types).
    Array(Vec<Array>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl Value {
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, if it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a float (f32 or f64).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// A short human description: the type plus, for arrays, element type and length.
    pub fn type_description(&self) -> String {
        match self {
            Value::Array(a) => format!("array of {} {}", a.len(), a.element_type()),
            v => v.value_type().to_string(),
        }
    }
}

impl Array {
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Element `i` as a [`Value`] (cloned), for display and generic access.
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.to_owned()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }
}

/// An array of strings stored end to end in one buffer, with one end offset per string: a
/// 262,144-token vocabulary takes its text bytes plus 4 bytes a token, where a `Vec<String>`
/// would take a 24-byte header and a heap block (with the allocator's overhead) per token.
///
/// The buffers are shared: cloning a `StrArray` copies a pointer, not the strings, so a
/// tokenizer can keep the vocabulary's text without a second copy of it. (`push` on a shared
/// array copies it first, so clones never see each other's changes.)
#[derive(Clone, Default)]
pub struct StrArray {
    inner: Arc<StrArrayInner>,
}

#[derive(Clone, Default)]
struct StrArrayInner {
    text: String,
    ends: Ends,
}

/// End offsets in `text`: 32-bit unless the strings total more than 4 GiB.
#[derive(Clone)]
enum Ends {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl Default for Ends {
    fn default() -> Self {
        Ends::Narrow(Vec::new())
    }
}

impl StrArray {
    /// An empty array with room for `n` strings of `bytes` bytes in total.
    pub fn with_capacity(n: usize, bytes: usize) -> StrArray {
        StrArray {
            inner: Arc::new(StrArrayInner {
                text: String::with_capacity(bytes),
                ends: if u32::try_from(bytes).is_ok() {
                    Ends::Narrow(Vec::with_capacity(n))
                } else {
                    Ends::Wide(Vec::with_capacity(n))
                },
            }),
        }
    }

    pub fn push(&mut self, s: &str) {
        let inner = Arc::make_mut(&mut self.inner);
        inner.text.push_str(s);
        let end = inner.text.len();
        match &mut inner.ends {
            Ends::Narrow(v) => match u32::try_from(end) {
                Ok(e) => v.push(e),
                Err(_) => {
                    let mut wide: Vec<u64> = Vec::with_capacity(v.len() + 1);
                    wide.extend(v.iter().map(|&e| u64::from(e)));
                    wide.push(end as u64);
                    inner.ends = Ends::Wide(wide);
                }
            },
            Ends::Wide(v) => v.push(end as u64),
        }
    }

    pub fn len(&self) -> usize {
        match &self.inner.ends {
            Ends::Narrow(v) => v.len(),
            Ends::Wide(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn end(&self, i: usize) -> Option<usize> {
        match &self.inner.ends {
            Ends::Narrow(v) => v.get(i).map(|&e| e as usize),
            Ends::Wide(v) => v.get(i).map(|&e| e as usize),
        }
    }

    /// String `i`.
    pub fn get(&self, i: usize) -> Option<&str> {
        let end = self.end(i)?;
        let start = if i == 0 { 0 } else { self.end(i - 1)? };
        Some(&self.inner.text[start..end])
    }

    pub fn iter(&self) -> StrArrayIter<'_> {
        StrArrayIter {
            array: self,
            next: 0,
            start: 0,
        }
    }

    /// Total bytes of all the strings.
    pub fn text_len(&self) -> usize {
        self.inner.text.len()
    }

    /// All the strings end to end: string `i` is `text()[ends[i - 1]..ends[i]]` (from 0 for
    /// the first), with `ends` from [`ends_u32`](Self::ends_u32).
    pub fn text(&self) -> &str {
        &self.inner.text
    }

    /// Where each string ends in [`text`](Self::text), when the strings total at most 4 GiB
    /// (`None` past that).
    pub fn ends_u32(&self) -> Option<&[u32]> {
        match &self.inner.ends {
            Ends::Narrow(v) => Some(v),
            Ends::Wide(_) => None,
        }
    }

    /// Frees spare capacity (a no-op when the buffers are shared).
    pub fn shrink_to_fit(&mut self) {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.text.shrink_to_fit();
            match &mut inner.ends {
                Ends::Narrow(v) => v.shrink_to_fit(),
                Ends::Wide(v) => v.shrink_to_fit(),
            }
        }
    }
}

/// The strings of a [`StrArray`], in order.
pub struct StrArrayIter<'a> {
    array: &'a StrArray,
    next: usize,
    start: usize,
}

impl<'a> Iterator for StrArrayIter<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let end = self.array.end(self.next)?;
        let s = &self.array.inner.text[self.start..end];
        self.next += 1;
        self.start = end;
        Some(s)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.array.len() - self.next;
        (n, Some(n))
    }
}

impl ExactSizeIterator for StrArrayIter<'_> {}

impl<'a> IntoIterator for &'a StrArray {
    type Item = &'a str;
    type IntoIter = StrArrayIter<'a>;
    fn into_iter(self) -> StrArrayIter<'a> {
        self.iter()
    }
}

impl std::ops::Index<usize> for StrArray {
    type Output = str;
    fn index(&self, i: usize) -> &str {
        match self.get(i) {
            Some(s) => s,
            None => panic!(
                "index {i} out of range for a string array of {}",
                self.len()
            ),
        }
    }
}

impl<S: AsRef<str>> FromIterator<S> for StrArray {
    fn from_iter<I: IntoIterator<Item = S>>(iter: I) -> StrArray {
        let mut a = StrArray::default();
        for s in iter {
            a.push(s.as_ref());
        }
        a
    }
}

impl From<Vec<String>> for StrArray {
    fn from(v: Vec<String>) -> StrArray {
        v.into_iter().collect()
    }
}

impl PartialEq for StrArray {
    fn eq(&self, other: &StrArray) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl fmt::Debug for StrArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A metadata value of the wrong type, or a required key that is absent.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetadataError {
    #[error("metadata key {0:?} is missing")]
    Missing(String),
    #[error("metadata key {key:?} should be {expected}, found {found}")]
    WrongType {
        key: String,
        expected: &'static str,
        found: String,
    },
}

/// The key/value section, in file order, with lookup by key.
#[derive(Clone, Debug, Default)]
pub struct Metadata {
    entries: Vec<(String, Value)>,
    index: HashMap<String, usize>,
}

impl Metadata {
    /// Appends a key; returns false (and changes nothing) if the key exists already.
    pub fn insert(&mut self, key: String, value: Value) -> bool {
        if self.index.contains_key(&key) {
            return false;
        }
        self.index.insert(key.clone(), self.entries.len());
        self.entries.push((key, value));
        true
    }

    /// Sets a key, replacing its value in place or appending it.
    pub fn set(&mut self, key: &str, value: Value) {
        match self.index.get(key) {
            Some(&i) => self.entries[i].1 = value,
            None => {
                self.insert(key.to_string(), value);
            }
        }
    }

    /// Removes a key, keeping the others in order; returns its value.
    pub fn remove(&mut self, key: &str) -> Option<Value> {
        let i = self.index.remove(key)?;
        let (_, value) = self.entries.remove(i);
        for slot in self.index.values_mut() {
            if *slot > i {
                *slot -= 1;
            }
        }
        Some(value)
    }

    /// Sets a key as gguf.cpp's `gguf_set_val_*` do: an existing key is removed first, so the
    /// key always ends up last.
    pub fn set_last(&mut self, key: &str, value: Value) {
        self.remove(key);
        self.insert(key.to_string(), value);
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.index.get(key).map(|&i| &self.entries[i].1)
    }

    pub fn entries(&self) -> &[(String, Value)] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &'static str,
        convert: impl FnOnce(&'a Value) -> Option<T>,
    ) -> Result<Option<T>, MetadataError> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => convert(v)
                .map(Some)
                .ok_or_else(|| MetadataError::WrongType {
                    key: key.to_string(),
                    expected,
                    found: v.type_description(),
                }),
        }
    }

    fn required<T>(
        &self,
        key: &str,
        found: Result<Option<T>, MetadataError>,
    ) -> Result<T, MetadataError> {
        found?.ok_or_else(|| MetadataError::Missing(key.to_string()))
    }

    /// An unsigned integer of any width (negative or non-integer values are errors).
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>, MetadataError> {
        self.typed(key, "a non-negative integer", Value::as_u64)
    }

    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, MetadataError> {
        self.typed(key, "an integer in u32 range", |v| {
            v.as_u64().and_then(|x| u32::try_from(x).ok())
        })
    }

    pub fn get_i64(&self, key: &str) -> Result<Option<i64>, MetadataError> {
        self.typed(key, "an integer", Value::as_i64)
    }

    /// A float; integers are accepted too, as llama.cpp's converters sometimes write them.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, MetadataError> {
        self.typed(key, "a number", |v| {
            v.as_f64()
                .or_else(|| v.as_i64().map(|i| i as f64))
                .map(|f| f as f32)
        })
    }

    pub fn get_bool(&self, key: &str) -> Result<Option<bool>, MetadataError> {
        self.typed(key, "a bool", Value::as_bool)
    }

    pub fn get_str(&self, key: &str) -> Result<Option<&str>, MetadataError> {
        self.typed(key, "a string", Value::as_str)
    }

    pub fn get_array(&self, key: &str) -> Result<Option<&Array>, MetadataError> {
        self.typed(key, "an array", Value::as_array)
    }

    pub fn get_str_array(&self, key: &str) -> Result<Option<&StrArray>, MetadataError> {
        self.typed(key, "an array of strings", |v| match v {
            Value::Array(Array::String(s)) => Some(s),
            _ => None,
        })
    }

    pub fn get_f32_array(&self, key: &str) -> Result<Option<&[f32]>, MetadataError> {
        self.typed(key, "an array of f32", |v| match v {
            Value::Array(Array::F32(s)) => Some(s.as_slice()),
            _ => None,
        })
    }

    pub fn get_i32_array(&self, key: &str) -> Result<Option<&[i32]>, MetadataError> {
        self.typed(key, "an array of i32", |v| match v {
            Value::Array(Array::I32(s)) => Some(s.as_slice()),
            _ => None,
        })
    }

    pub fn require_u64(&self, key: &str) -> Result<u64, MetadataError> {
        self.required(key, self.get_u64(key))
    }

    pub fn require_u32(&self, key: &str) -> Result<u32, MetadataError> {
        self.required(key, self.get_u32(key))
    }

    pub fn require_f32(&self, key: &str) -> Result<f32, MetadataError> {
        self.required(key, self.get_f32(key))
    }

    pub fn require_str(&self, key: &str) -> Result<&str, MetadataError> {
        self.required(key, self.get_str(key))
    }

    pub fn require_str_array(&self, key: &str) -> Result<&StrArray, MetadataError> {
        self.required(key, self.get_str_array(key))
    }
}
