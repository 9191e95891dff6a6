//! A loaded model: its file (mapped), hyperparameters, weights, and the device they live on.

use std::path::Path;
use std::sync::Arc;

use lamina_backend::{Buffer, BufferUsage, Device, HostMemory};
use lamina_core::graph::BufferMemory;
use lamina_gguf::GgufFile;

use crate::weights::Weights;
use crate::{HParams, ModelError};

/// The model file's mapping, handed to a device as host memory (no copy).
#[derive(Debug)]
struct MappedFile(Arc<memmap2::Mmap>);

impl HostMemory for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A model ready to run.
pub struct Model {
    pub file: GgufFile,
    pub hparams: HParams,
    pub weights: Weights,
    device: Arc<dyn Device>,
    weight_buffer: Buffer,
    weight_memory: Arc<dyn BufferMemory>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.file.path())
            .field("arch", &self.hparams.arch)
            .field("device", &self.device.name())
            .finish()
    }
}

impl Model {
    /// Opens `path`, checks every hyperparameter and weight, and maps the weights onto `device`.
    pub fn load(path: impl AsRef<Path>, device: Arc<dyn Device>) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        let hparams = HParams::from_gguf(&file)?;
        let weights = Weights::find(&file, &hparams)?;
        let weight_buffer = device.buffer_from_host_memory(Arc::new(MappedFile(file.mapping())))?;
        weight_buffer.set_usage(BufferUsage::Weights);
        let weight_memory = weight_buffer.memory();
        Ok(Model {
            file,
            hparams,
            weights,
            device,
            weight_buffer,
            weight_memory,
        })
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub fn weight_buffer(&self) -> &Buffer {
        &self.weight_buffer
    }

    /// The weight buffer as graph tensors bind to it.
    pub fn weight_memory(&self) -> &Arc<dyn BufferMemory> {
        &self.weight_memory
    }

    /// `general.name`, else the file name.
    pub fn name(&self) -> String {
        match self.file.metadata.get_str("general.name") {
            Ok(Some(name)) => name.to_string(),
            _ => self
                .file
                .path()
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        }
    }

    /// Size of the tensor data in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.file.tensors.iter().map(|t| t.size).sum()
    }

    /// Number of weight parameters.
    pub fn n_params(&self) -> u64 {
        self.file.tensors.iter().map(|t| t.n_elements()).sum()
    }
}
