use crate::kernels::{Error, Result};

/// Element / block types (ggml names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    I32,
    Q4_0,
    Q4_1,
    Q5_0,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
}

impl DType {
    /// Elements per block (1 for plain types).
    pub fn block_elems(self) -> u64 {
        match self {
            DType::F32 | DType::F16 | DType::I32 => 1,
            DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q8_0 => 32,
            DType::Q4_K | DType::Q5_K | DType::Q6_K => 256,
        }
    }

    /// Bytes per block (element size for plain types).
    pub fn block_bytes(self) -> u64 {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F16 => 2,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q8_0 => 34,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
        }
    }

    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes of one contiguous row of `n` elements.
    pub fn row_bytes(self, n: u64) -> u64 {
        n / self.block_elems() * self.block_bytes()
    }

    pub(crate) fn tag(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::I32 => "i32",
            DType::Q4_0 => "q4_0",
            DType::Q4_1 => "q4_1",
            DType::Q5_0 => "q5_0",
            DType::Q8_0 => "q8_0",
            DType::Q4_K => "q4_k",
            DType::Q5_K => "q5_k",
            DType::Q6_K => "q6_k",
        }
    }
}

/// A ggml-style view of a tensor stored in a `wgpu::Buffer`.
///
/// `ne[0]` is the innermost dimension; `nb` are byte strides. For quantized
/// types `nb[0]` is ignored and `nb[1]` is the row size in bytes.
#[derive(Debug, Clone, Copy)]
pub struct TensorRef<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub dtype: DType,
    pub ne: [u64; 4],
    pub nb: [u64; 4],
}

impl<'a> TensorRef<'a> {
    /// A contiguous tensor at `offset` with the given shape.
    pub fn contiguous(buffer: &'a wgpu::Buffer, offset: u64, dtype: DType, ne: [u64; 4]) -> Self {
        let mut nb = [0u64; 4];
        nb[0] = dtype.block_bytes();
        nb[1] = dtype.row_bytes(ne[0]);
        nb[2] = nb[1] * ne[1];
        nb[3] = nb[2] * ne[2];
        TensorRef {
            buffer,
            offset,
            dtype,
            ne,
            nb,
        }
    }

    /// Same view with other shape/strides (like `ggml_view_4d`), offset added in bytes.
    pub fn view(&self, extra_offset: u64, ne: [u64; 4], nb: [u64; 4]) -> Self {
        TensorRef {
            offset: self.offset + extra_offset,
            ne,
            nb,
            ..*self
        }
    }

    /// Swap two dims (like `ggml_permute` for a pair).
    pub fn transpose_dims(&self, a: usize, b: usize) -> Self {
        let mut t = *self;
        t.ne.swap(a, b);
        t.nb.swap(a, b);
        t
    }

    pub fn nelements(&self) -> u64 {
        self.ne.iter().product()
    }

    pub fn nrows(&self) -> u64 {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes from `offset` to one past the last byte touched.
    pub fn extent(&self) -> u64 {
        if self.nelements() == 0 {
            return 0;
        }
        let row = if self.dtype.is_quantized() {
            self.dtype.row_bytes(self.ne[0])
        } else {
            (self.ne[0] - 1) * self.nb[0] + self.dtype.block_bytes()
        };
        row + (1..4).map(|i| (self.ne[i] - 1) * self.nb[i]).sum::<u64>()
    }

    pub fn is_contiguous(&self) -> bool {
        // Strides of size-1 dims never matter.
        let c = TensorRef::contiguous(self.buffer, 0, self.dtype, self.ne).nb;
        (0..4).all(|i| self.ne[i] <= 1 || self.nb[i] == c[i])
    }

    /// Checks the basic invariants every op relies on.
    pub(crate) fn check(&self, what: &str) -> Result<()> {
        let bs = self.dtype.block_bytes();
        if !self.offset.is_multiple_of(4) {
            return Err(Error::Invalid(format!(
                "{what}: offset {} not 4-byte aligned",
                self.offset
            )));
        }
        if self.dtype.is_quantized() {
            if !self.ne[0].is_multiple_of(self.dtype.block_elems()) {
                return Err(Error::Invalid(format!(
                    "{what}: ne[0]={} not a multiple of the {:?} block size",
                    self.ne[0], self.dtype
                )));
            }
        } else if self.nb.iter().any(|&s| s % bs != 0) {
            return Err(Error::Invalid(format!(
                "{what}: strides {:?} not multiples of the element size",
                self.nb
            )));
        }
        if self.ne.iter().any(|&n| n > u32::MAX as u64) || self.nelements() > u32::MAX as u64 {
            return Err(Error::Invalid(format!(
                "{what}: too many elements {:?}",
                self.ne
            )));
        }
        if self.offset + self.extent() > self.buffer.size() {
            return Err(Error::Invalid(format!(
                "{what}: view [{}, +{}) exceeds buffer size {}",
                self.offset,
                self.extent(),
                self.buffer.size()
            )));
        }
        Ok(())
    }
}
