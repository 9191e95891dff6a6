use lamina_core::DType;

/// Why a model cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("unknown model architecture {name:?} (supported: {supported})")]
    UnknownArchitecture { name: String, supported: String },
    #[error("the file has no general.architecture key: is it a model file?")]
    NoArchitecture,
    #[error("hyperparameter {key}: {message}")]
    BadHParam { key: String, message: String },
    #[error("tensor {0:?} is missing")]
    MissingTensor(String),
    #[error(
        "this is split {no} of a model in {count} files, which Lamina cannot run in pieces yet: \
         merge them into one file with `lamina quantize NAME-00001-of-{count:05}.gguf MERGED.gguf COPY`"
    )]
    SplitModel { no: u64, count: u64 },
    #[error("tensor {name:?} has shape {actual:?}, expected {expected:?}")]
    BadShape {
        name: String,
        expected: Vec<u64>,
        actual: Vec<u64>,
    },
    #[error("tensor {name:?} has type {dtype}, which Lamina cannot compute with")]
    UnsupportedType { name: String, dtype: DType },
    #[error("device placement: {0}")]
    Placement(String),
    #[error("invalid batch: {0}")]
    BadBatch(String),
    #[error("invalid context settings: {0}")]
    BadParams(String),
    #[error(
        "the context is full: {needed} more tokens do not fit in the {free} free of {size} KV cells \
         (raise -c, or start a new conversation)"
    )]
    ContextFull {
        needed: usize,
        free: usize,
        size: usize,
    },
    #[error(transparent)]
    Gguf(#[from] lamina_gguf::GgufError),
    #[error(transparent)]
    Metadata(#[from] lamina_gguf::MetadataError),
    /// Checked before allocating, so a context that cannot fit is one clear line, not an
    /// allocation failure.
    #[error(
        "the {what} needs {} on {device}, which has {} free{hint}",
        human_bytes(*need),
        human_bytes(*free)
    )]
    OutOfMemory {
        what: String,
        device: String,
        need: u64,
        free: u64,
        hint: &'static str,
    },
    // Transparent: the source's own message, once (a prefix with `{0}` would repeat it in
    // an error chain).
    #[error(transparent)]
    Graph(#[from] lamina_core::graph::GraphError),
    #[error(transparent)]
    Backend(#[from] lamina_backend::BackendError),
}

/// `n` bytes as llama.cpp prints sizes: MiB below a GiB, GiB below a TiB, else TiB.
pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    if n >= (1u64 << 40) as f64 {
        format!("{:.1} TiB", n / (1u64 << 40) as f64)
    } else if n >= (1u64 << 30) as f64 {
        format!("{:.1} GiB", n / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", n / (1u64 << 20) as f64)
    }
}
