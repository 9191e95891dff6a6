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
    #[error("graph: {0}")]
    Graph(#[from] lamina_core::graph::GraphError),
    #[error("backend: {0}")]
    Backend(#[from] lamina_backend::BackendError),
}
