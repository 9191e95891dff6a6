//! `lamina-model` owns what a model is: its architecture (one file each under `arch/`), its
//! hyperparameters read from GGUF metadata, its weights placed on devices, the KV cache, batches,
//! and the context that turns a batch of tokens into logits by building a graph for the backends.

pub mod arch;
pub mod context;
pub mod error;
pub mod hparams;
pub mod kv_cache;
pub mod model;
pub mod observe;
pub mod perplexity;
pub mod placement;
pub mod weights;

pub use context::{Batch, BatchToken, Context, ContextParams, FlashAttn};
pub use error::ModelError;
pub use hparams::{HParams, RopeScaling, RopeType};
pub use kv_cache::KvFormat;
pub use model::{LoadOptions, Model, WeightStore};
pub use placement::{LayerPlan, Placement, SplitMode};
