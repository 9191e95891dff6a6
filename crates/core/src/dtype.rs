//! Tensor element types, numbered as in ggml (`enum ggml_type`) so GGUF type ids map directly.

use std::fmt;

/// An element or block type of a tensor. The discriminants are ggml's type ids as stored in GGUF.
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// Errors about types and their shapes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DTypeError {
    #[error("unknown tensor type id {0}")]
    UnknownId(u32),
    #[error("row of {len} elements is not a multiple of {dtype}'s block size {block}")]
    RowNotBlockMultiple { dtype: DType, len: u64, block: u64 },
    #[error("size of {dtype} tensor overflows u64")]
    Overflow { dtype: DType },
}

impl DType {
    /// Every type, in id order.
    pub const ALL: [DType; 35] = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q8_1,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_K,
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ3_XXS,
        DType::IQ1_S,
        DType::IQ4_NL,
        DType::IQ3_S,
        DType::IQ2_S,
        DType::IQ4_XS,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::F64,
        DType::IQ1_M,
        DType::BF16,
        DType::TQ1_0,
        DType::TQ2_0,
        DType::MXFP4,
        DType::NVFP4,
        DType::Q1_0,
        DType::Q2_0,
    ];

    /// The type with ggml id `id`.
    pub fn from_id(id: u32) -> Result<DType, DTypeError> {
        DType::ALL
            .iter()
            .copied()
            .find(|t| *t as u32 == id)
            .ok_or(DTypeError::UnknownId(id))
    }

    /// The ggml type id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name for the type (`q4_K`, `f16`, …).
    pub fn name(self) -> &'static str {
        use DType::*;
        match self {
            F32 => "f32",
            F16 => "f16",
            Q4_0 => "q4_0",
            Q4_1 => "q4_1",
            Q5_0 => "q5_0",
            Q5_1 => "q5_1",
            Q8_0 => "q8_0",
            Q8_1 => "q8_1",
            Q2_K => "q2_K",
            Q3_K => "q3_K",
            Q4_K => "q4_K",
            Q5_K => "q5_K",
            Q6_K => "q6_K",
            Q8_K => "q8_K",
            IQ2_XXS => "iq2_xxs",
            IQ2_XS => "iq2_xs",
            IQ3_XXS => "iq3_xxs",
            IQ1_S => "iq1_s",
            IQ4_NL => "iq4_nl",
            IQ3_S => "iq3_s",
            IQ2_S => "iq2_s",
            IQ4_XS => "iq4_xs",
            I8 => "i8",
            I16 => "i16",
            I32 => "i32",
            I64 => "i64",
            F64 => "f64",
            IQ1_M => "iq1_m",
            BF16 => "bf16",
            TQ1_0 => "tq1_0",
            TQ2_0 => "tq2_0",
            MXFP4 => "mxfp4",
            NVFP4 => "nvfp4",
            Q1_0 => "q1_0",
            Q2_0 => "q2_0",
        }
    }

    /// The type whose [`DType::name`] is `name` (case-insensitive).
    pub fn from_name(name: &str) -> Option<DType> {
        DType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// Elements per block (1 for plain types).
    #[inline]
    pub const fn block_size(self) -> u64 {
        use DType::*;
        match self {
            F32 | F16 | BF16 | I8 | I16 | I32 | I64 | F64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            NVFP4 | Q2_0 => 64,
            Q1_0 => 128,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S
            | IQ3_S | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => 256,
        }
    }

    /// Bytes per block.
    #[inline]
    pub const fn type_size(self) -> u64 {
        use DType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            I64 | F64 => 8,
            Q4_0 => 18,
            Q4_1 => 20,
            Q5_0 => 22,
            Q5_1 => 24,
            Q8_0 => 34,
            Q8_1 => 36,
            Q2_K => 84,
            Q3_K => 110,
            Q4_K => 144,
            Q5_K => 176,
            Q6_K => 210,
            Q8_K => 292,
            IQ2_XXS => 66,
            IQ2_XS => 74,
            IQ3_XXS => 98,
            IQ1_S => 50,
            IQ4_NL => 18,
            IQ3_S => 110,
            IQ2_S => 82,
            IQ4_XS => 136,
            IQ1_M => 56,
            TQ1_0 => 54,
            TQ2_0 => 66,
            MXFP4 => 17,
            NVFP4 => 36,
            Q1_0 => 18,
            Q2_0 => 18,
        }
    }

    /// Whether values are stored in blocks with shared scales.
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes taken by a row of `n` elements; errors if `n` is not a whole number of blocks.
    pub fn row_size(self, n: u64) -> Result<u64, DTypeError> {
        let block = self.block_size();
        if !n.is_multiple_of(block) {
            return Err(DTypeError::RowNotBlockMultiple {
                dtype: self,
                len: n,
                block,
            });
        }
        (n / block)
            .checked_mul(self.type_size())
            .ok_or(DTypeError::Overflow { dtype: self })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in DType::ALL {
            assert_eq!(DType::from_id(t.id()).unwrap(), t);
            assert_eq!(DType::from_name(t.name()), Some(t));
        }
        assert_eq!(DType::from_id(4), Err(DTypeError::UnknownId(4)));
        assert_eq!(DType::from_id(1000), Err(DTypeError::UnknownId(1000)));
        assert_eq!(DType::from_id(43), Err(DTypeError::UnknownId(43)));
    }

    #[test]
    fn row_sizes() {
        assert_eq!(DType::Q4_K.row_size(512).unwrap(), 288);
        assert_eq!(DType::F16.row_size(7).unwrap(), 14);
        assert!(DType::Q8_0.row_size(33).is_err());
        assert!(DType::F64.row_size(u64::MAX).is_err());
        // ggml's sizes (gguf-py GGML_QUANT_SIZES) for the newest types.
        assert_eq!(DType::NVFP4.row_size(128).unwrap(), 72);
        assert_eq!(DType::Q1_0.row_size(256).unwrap(), 36);
        assert_eq!(DType::Q2_0.row_size(128).unwrap(), 36);
        assert_eq!(DType::TQ1_0.row_size(256).unwrap(), 54);
    }
}
