//! A loaded model: its file (mapped), hyperparameters, weights, and the device they live on.

use std::path::Path;
use std::sync::Arc;

use lamina_backend::{Buffer, BufferUsage, Device, HostMemory};
use lamina_core::graph::BufferMemory;
use lamina_gguf::GgufFile;

use crate::arch::Architecture;
use crate::{HParams, LayerPlan, ModelError, Placement};

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
    /// The architecture: its weights and graph.
    pub arch: Box<dyn Architecture>,
    /// Which device each layer is on.
    plan: LayerPlan,
    /// Per device of the plan: the file's mapping as that device's read-only buffer (the same
    /// bytes, no copy; each layer's weights are bound through its device's buffer).
    weight_buffers: Vec<Buffer>,
    weight_memory: Vec<Arc<dyn BufferMemory>>,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("path", &self.file.path())
            .field("arch", &self.hparams.arch)
            .field(
                "devices",
                &self
                    .plan
                    .devices
                    .iter()
                    .map(|d| d.name())
                    .collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Model {
    /// Opens `path`, checks every hyperparameter and weight, and maps the weights onto `device`.
    pub fn load(path: impl AsRef<Path>, device: Arc<dyn Device>) -> Result<Model, ModelError> {
        Model::load_placed(path, &Placement::single(device))
    }

    /// Opens `path`, checks every hyperparameter and weight, and maps each layer's weights onto
    /// the device `placement` gives it.
    pub fn load_placed(path: impl AsRef<Path>, placement: &Placement) -> Result<Model, ModelError> {
        let file = GgufFile::open(path)?;
        // A split model's first file holds the metadata but not every tensor.
        if let Some(count) = file.metadata.get("split.count").and_then(|v| v.as_u64())
            && count > 1
        {
            let no = file.metadata.get("split.no").and_then(|v| v.as_u64());
            return Err(ModelError::SplitModel {
                no: no.unwrap_or(0) + 1,
                count,
            });
        }
        let arch = crate::arch::load(&file)?;
        let hparams = arch.hparams().clone();
        let plan = placement.plan(hparams.n_layer as usize)?;
        let mapping = Arc::new(MappedFile(file.mapping()));
        let mut weight_buffers = Vec::with_capacity(plan.devices.len());
        for device in &plan.devices {
            let b = device.buffer_from_host_memory(mapping.clone())?;
            b.set_usage(BufferUsage::Weights);
            weight_buffers.push(b);
        }
        let weight_memory = weight_buffers.iter().map(Buffer::memory).collect();
        Ok(Model {
            file,
            hparams,
            arch,
            plan,
            weight_buffers,
            weight_memory,
        })
    }

    /// The host device (input layer).
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.plan.devices[self.plan.input]
    }

    /// The devices the model is on and each layer's device.
    pub fn plan(&self) -> &LayerPlan {
        &self.plan
    }

    /// The weight buffer of the host device.
    pub fn weight_buffer(&self) -> &Buffer {
        &self.weight_buffers[self.plan.input]
    }

    /// Per device of the plan, the weight buffer as graph tensors bind to it.
    pub fn weight_memory(&self) -> &[Arc<dyn BufferMemory>] {
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
