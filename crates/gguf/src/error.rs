use lamina_core::DType;

/// Everything that can be wrong with a GGUF file. Each variant names what is wrong and where.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("not a GGUF file: magic is {found:02x?}, expected \"GGUF\"")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported GGUF version {0} (supported: 2 and 3)")]
    UnsupportedVersion(u32),
    #[error(
        "big-endian GGUF file (version field {0:#010x}); only little-endian files are supported"
    )]
    BigEndian(u32),
    #[error(
        "file truncated in {section} at byte {offset}: need {needed} more bytes, {available} left"
    )]
    Truncated {
        section: &'static str,
        offset: u64,
        needed: u64,
        available: u64,
    },
    #[error(
        "{what} count {count} at byte {offset} is larger than the {remaining} bytes left could hold"
    )]
    CountTooLarge {
        what: &'static str,
        count: u64,
        offset: u64,
        remaining: u64,
    },
    #[error("{what} at byte {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: u64 },
    #[error("duplicate metadata key {0:?}")]
    DuplicateKey(String),
    #[error("duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    #[error("metadata key {key:?} has unknown value type {type_id}")]
    UnknownValueType { key: String, type_id: u32 },
    #[error("metadata key {key:?}: arrays nested deeper than {max} levels")]
    NestingTooDeep { key: String, max: usize },
    #[error("metadata key {key:?}: {message}")]
    BadMetadata { key: String, message: String },
    #[error("tensor {tensor:?} has {n_dims} dimensions (must be 1 to 4)")]
    BadDimCount { tensor: String, n_dims: u32 },
    #[error("tensor {tensor:?}: dimension {dim} is {value}, larger than i64::MAX")]
    DimTooLarge {
        tensor: String,
        dim: usize,
        value: u64,
    },
    #[error("tensor {tensor:?}: element count or byte size of shape {shape:?} overflows u64")]
    ShapeOverflow { tensor: String, shape: Vec<u64> },
    #[error("tensor {tensor:?} has unknown type id {type_id}")]
    UnknownTensorType { tensor: String, type_id: u32 },
    #[error(
        "tensor {tensor:?}: row length {row} is not a multiple of {dtype}'s block size {block}"
    )]
    RowNotBlockMultiple {
        tensor: String,
        dtype: DType,
        row: u64,
        block: u64,
    },
    #[error("general.alignment is {0}: must be a non-zero power of two")]
    BadAlignment(u64),
    #[error(
        "tensor {tensor:?}: data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedOffset {
        tensor: String,
        offset: u64,
        alignment: u64,
    },
    #[error(
        "tensor {tensor:?}: data [{start}, {end}) lies outside the file's data section of {data_len} bytes (is the file truncated?)"
    )]
    TensorOutOfBounds {
        tensor: String,
        start: u64,
        end: u64,
        data_len: u64,
    },
    #[error("tensors {first:?} and {second:?} overlap in the data section")]
    TensorOverlap { first: String, second: String },
    #[error("tensor {tensor:?}: {actual} bytes of data given, its type and shape take {expected}")]
    TensorDataSize {
        tensor: String,
        expected: u64,
        actual: u64,
    },
    #[error("writing GGUF data failed: {0}")]
    Write(#[source] std::io::Error),
    #[error("the file has {expected} tensors, {written} were written")]
    TensorCount { expected: usize, written: usize },
    #[error("no tensor named {0:?}")]
    NoSuchTensor(String),
    #[error(transparent)]
    Metadata(#[from] crate::metadata::MetadataError),
}
