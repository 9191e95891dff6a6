//! Tensor layouts: element type, shape `ne` (ggml order, `ne[0]` innermost) and byte strides `nb`.
//!
//! A layout says nothing about where the bytes live; the graph IR binds tensors to memory.

use crate::dtype::{DType, DTypeError};

/// Number of dimensions every tensor has (unused trailing dimensions are 1), as in ggml.
pub const MAX_DIMS: usize = 4;

/// Errors about tensor shapes and strides.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    #[error("tensor has {0} dimensions; at most 4 are supported")]
    TooManyDims(usize),
    #[error("dimension {dim} is zero-sized or too large ({value})")]
    BadDim { dim: usize, value: usize },
    #[error("tensor size overflows")]
    Overflow,
    #[error(transparent)]
    DType(#[from] DTypeError),
}

/// Flags that tell the allocator and scheduler how a tensor is used.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TensorFlags(u8);

impl TensorFlags {
    pub const NONE: TensorFlags = TensorFlags(0);
    /// Written by the host before compute; the allocator keeps it alive for the whole graph.
    pub const INPUT: TensorFlags = TensorFlags(1);
    /// Read by the host after compute; the allocator never reuses its memory.
    pub const OUTPUT: TensorFlags = TensorFlags(2);
    /// Model weight (bound to weight memory, never written by compute).
    pub const WEIGHT: TensorFlags = TensorFlags(4);

    pub fn contains(self, other: TensorFlags) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn insert(&mut self, other: TensorFlags) {
        self.0 |= other.0;
    }
}

impl std::ops::BitOr for TensorFlags {
    type Output = TensorFlags;
    fn bitor(self, rhs: TensorFlags) -> TensorFlags {
        TensorFlags(self.0 | rhs.0)
    }
}

/// Element type, shape and byte strides of a tensor, with ggml's conventions:
/// `nb[0]` is the size of one block's type (`type_size`), `nb[1]` the row stride, and so on.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    pub dtype: DType,
    pub ne: [usize; MAX_DIMS],
    pub nb: [usize; MAX_DIMS],
}

impl Layout {
    /// A densely packed layout of shape `ne` (1 to 4 dims, innermost first).
    pub fn contiguous(dtype: DType, ne: &[usize]) -> Result<Layout, TensorError> {
        if ne.is_empty() || ne.len() > MAX_DIMS {
            return Err(TensorError::TooManyDims(ne.len()));
        }
        let mut full = [1usize; MAX_DIMS];
        full[..ne.len()].copy_from_slice(ne);
        for (dim, &v) in full.iter().enumerate() {
            if v == 0 || v > (1 << 40) {
                return Err(TensorError::BadDim { dim, value: v });
            }
        }
        let row = dtype.row_size(full[0] as u64)?;
        let mut nb = [0usize; MAX_DIMS];
        nb[0] = dtype.type_size() as usize;
        nb[1] = usize::try_from(row).map_err(|_| TensorError::Overflow)?;
        for i in 2..MAX_DIMS {
            nb[i] = nb[i - 1]
                .checked_mul(full[i - 1])
                .ok_or(TensorError::Overflow)?;
        }
        nb[3].checked_mul(full[3]).ok_or(TensorError::Overflow)?;
        Ok(Layout {
            dtype,
            ne: full,
            nb,
        })
    }

    #[inline]
    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Number of rows (product of `ne[1..]`).
    #[inline]
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes of one packed row of `ne[0]` elements.
    #[inline]
    pub fn row_bytes(&self) -> usize {
        self.ne[0] / self.dtype.block_size() as usize * self.dtype.type_size() as usize
    }

    /// Bytes spanned from the first to one past the last byte (ggml's `ggml_nbytes`).
    #[inline]
    /// [`Layout::span_bytes`] of a layout that did not come from the constructors: `None` if
    /// a dimension is zero, a row is not whole blocks, or the span overflows.
    pub fn checked_span_bytes(&self) -> Option<usize> {
        let blck = self.dtype.block_size() as usize;
        if self.ne.contains(&0) || !self.ne[0].is_multiple_of(blck) {
            return None;
        }
        let (first, start) = if blck == 1 {
            (self.dtype.type_size() as usize, 0)
        } else {
            ((self.ne[0] / blck).checked_mul(self.nb[0])?, 1)
        };
        (start..MAX_DIMS).try_fold(first, |n, i| {
            n.checked_add((self.ne[i] - 1).checked_mul(self.nb[i])?)
        })
    }

    pub fn span_bytes(&self) -> usize {
        let blck = self.dtype.block_size() as usize;
        let mut n = if blck == 1 {
            self.dtype.type_size() as usize
        } else {
            self.ne[0] * self.nb[0] / blck
        };
        let start = if blck == 1 { 0 } else { 1 };
        for i in start..MAX_DIMS {
            n += (self.ne[i] - 1) * self.nb[i];
        }
        n
    }

    /// Whether rows are packed (elements of dim 0 adjacent).
    #[inline]
    pub fn rows_packed(&self) -> bool {
        self.nb[0] == self.dtype.type_size() as usize
    }

    /// Whether the tensor is densely packed in ggml order.
    #[inline]
    pub fn is_contiguous(&self) -> bool {
        match Layout::contiguous(self.dtype, &self.ne) {
            Ok(c) => (0..MAX_DIMS).all(|i| self.ne[i] == 1 || self.nb[i] == c.nb[i]),
            Err(_) => false,
        }
    }

    pub fn same_shape(&self, other: &Layout) -> bool {
        self.ne == other.ne
    }

    /// Whether `self` can be broadcast (repeated) to fill `to` (ggml's `ggml_can_repeat`).
    pub fn can_repeat_to(&self, to: &Layout) -> bool {
        (0..MAX_DIMS).all(|i| to.ne[i].is_multiple_of(self.ne[i]))
    }

    /// Byte offset of element `(i0, i1, i2, i3)`; `i0` must be a block boundary for quantized types.
    #[inline]
    pub fn offset_of(&self, i: [usize; MAX_DIMS]) -> usize {
        let blck = self.dtype.block_size() as usize;
        i[0] / blck * self.nb[0] + i[1] * self.nb[1] + i[2] * self.nb[2] + i[3] * self.nb[3]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_layouts() {
        let l = Layout::contiguous(DType::F32, &[5, 3]).unwrap();
        assert_eq!(l.ne, [5, 3, 1, 1]);
        assert_eq!(l.nb, [4, 20, 60, 60]);
        assert_eq!(l.span_bytes(), 60);
        assert!(l.is_contiguous());
        let q = Layout::contiguous(DType::Q8_0, &[64, 2]).unwrap();
        assert_eq!(q.nb, [34, 68, 136, 136]);
        assert_eq!(q.span_bytes(), 136);
        assert!(Layout::contiguous(DType::Q8_0, &[33]).is_err());
        assert!(Layout::contiguous(DType::F32, &[0]).is_err());
        assert!(Layout::contiguous(DType::F32, &[1, 1, 1, 1, 1]).is_err());
    }

    #[test]
    fn transposed_is_not_contiguous() {
        let mut l = Layout::contiguous(DType::F32, &[4, 3]).unwrap();
        l.ne.swap(0, 1);
        l.nb.swap(0, 1);
        assert!(!l.is_contiguous());
        assert!(!l.rows_packed());
        assert_eq!(l.span_bytes(), 48);
    }
}
