//! A loaded model: its file (mapped), hyperparameters, weights, and the device they live on.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use lamina_backend::{Buffer, BufferUsage, Device, HostMemory};
use lamina_core::graph::BufferMemory;
use lamina_gguf::GgufFile;

use crate::arch::Architecture;
use crate::{HParams, LayerPlan, ModelError, Placement};

/// The model file's mapping, handed to a device as host memory (no copy).
#[derive(Debug)]
struct MappedFile(Arc<memmap2::Mmap>, std::path::PathBuf);

impl HostMemory for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
    fn file(&self) -> Option<&Path> {
        Some(&self.1)
    }
    fn evict(&self, range: std::ops::Range<usize>) {
        // Whole pages inside the range only (its neighbours may be in use).
        const PAGE: usize = 4096;
        let start = range.start.next_multiple_of(PAGE);
        let end = range.end.min(self.0.len()) / PAGE * PAGE;
        if end > start {
            // SAFETY: the mapping is read-only and its file is not written while mapped (the
            // same assumption as mapping it at all): `MADV_DONTNEED` only drops pages, and a
            // read after it faults the same bytes back in from the file, so every borrow of
            // the mapping keeps seeing what it saw.
            let _ = unsafe {
                self.0.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    start,
                    end - start,
                )
            };
        }
    }
}

/// How weights reach the devices.
#[derive(Clone, Default)]
pub struct LoadOptions {
    /// Copy the weights into each device's own memory even where the device could use the
    /// file's mapping in place (llama.cpp's `--no-mmap`).
    pub no_mmap: bool,
    /// Called with (bytes uploaded, bytes to upload) as weights are copied to a device.
    pub progress: Option<Arc<dyn Fn(u64, u64) + Send + Sync>>,
}

impl std::fmt::Debug for LoadOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadOptions")
            .field("no_mmap", &self.no_mmap)
            .finish()
    }
}

/// One device's weights: the file's mapping wrapped as that device's buffer (a weight is at its
/// file offset), or copies of the weights it uses in buffers of its own memory (several when
/// they exceed the buffer type's largest buffer, as ggml splits weight buffers).
#[derive(Debug)]
pub struct WeightStore {
    buffers: Vec<Buffer>,
    memory: Vec<Arc<dyn BufferMemory>>,
    /// For uploaded weights: file offset → (buffer, offset in it). `None`: the mapping itself.
    offsets: Option<HashMap<usize, (usize, usize)>>,
}

impl WeightStore {
    /// The memory and offset of the weight whose data starts at `file_offset`; `None` if this
    /// device holds no copy of it.
    pub fn locate(&self, file_offset: usize) -> Option<(Arc<dyn BufferMemory>, usize)> {
        let (b, offset) = match &self.offsets {
            None => (0, file_offset),
            Some(map) => *map.get(&file_offset)?,
        };
        Some((self.memory.get(b)?.clone(), offset))
    }

    /// The file offset of the weight bound at `offset` of memory `memory_id`, if that memory is
    /// this store's (the inverse of [`WeightStore::locate`]).
    pub fn file_offset(&self, memory_id: u64, offset: usize) -> Option<usize> {
        let b = self
            .memory
            .iter()
            .position(|m| m.memory_id() == memory_id)?;
        match &self.offsets {
            None => Some(offset),
            Some(map) => map
                .iter()
                .find(|(_, at)| **at == (b, offset))
                .map(|(file, _)| *file),
        }
    }

    /// The buffers the weights are in (one for a mapping).
    pub fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// Bytes of device memory the weights take (the file's size for a mapping).
    pub fn size(&self) -> usize {
        self.buffers.iter().map(Buffer::size).sum()
    }

    /// Whether the weights were copied into device memory (rather than mapped).
    pub fn is_uploaded(&self) -> bool {
        self.offsets.is_some()
    }

    fn mapped(buffer: Buffer) -> WeightStore {
        buffer.set_usage(BufferUsage::Weights);
        WeightStore {
            memory: vec![buffer.memory()],
            buffers: vec![buffer],
            offsets: None,
        }
    }

    /// Copies `tensors` (file offset, size) of the file's `mapping` into new buffers of
    /// `device`.
    fn upload(
        device: &Arc<dyn Device>,
        mapping: &Arc<dyn HostMemory>,
        tensors: &[(usize, usize)],
        progress: Option<&(dyn Fn(u64, u64) + Send + Sync)>,
    ) -> Result<WeightStore, ModelError> {
        let bt = device.buffer_type();
        let align = bt.alignment().max(1);
        let max_size = bt.max_size();
        let too_large = |len: usize| ModelError::OutOfMemory {
            what: "a weight".into(),
            device: device.name().to_string(),
            need: len as u64,
            free: max_size as u64,
            hint: " (the device's largest buffer is smaller)",
        };
        // Lay the tensors out in buffers of at most `max_size` bytes.
        let mut offsets = HashMap::with_capacity(tensors.len());
        let mut sizes = vec![0usize];
        let mut unique = Vec::with_capacity(tensors.len());
        for &(at, len) in tensors {
            if offsets.contains_key(&at) {
                continue;
            }
            let padded = len
                .checked_next_multiple_of(align)
                .ok_or_else(|| too_large(len))?;
            if padded > max_size {
                return Err(too_large(len));
            }
            let last = sizes.len() - 1;
            if sizes[last] + padded > max_size {
                sizes.push(0);
            }
            let last = sizes.len() - 1;
            offsets.insert(at, (last, sizes[last]));
            sizes[last] += padded;
            unique.push((at, len));
        }
        let total: u64 = unique.iter().map(|&(_, len)| len as u64).sum();
        let free = device.memory().free;
        if free > 0 && total > free {
            return Err(ModelError::OutOfMemory {
                what: "the weights".into(),
                device: device.name().to_string(),
                need: total,
                free,
                hint: " (offload fewer layers: -ngl)",
            });
        }
        let mut buffers = Vec::with_capacity(sizes.len());
        for &size in &sizes {
            let b = bt.alloc_buffer(size)?;
            b.set_usage(BufferUsage::Weights);
            buffers.push(b);
        }
        let mut done = 0u64;
        for &(at, len) in &unique {
            // Offsets and sizes were checked against the file when it was opened.
            if at
                .checked_add(len)
                .is_none_or(|end| end > mapping.bytes().len())
            {
                return Err(ModelError::Placement(format!(
                    "weight at {at} is outside the file"
                )));
            }
            let (b, offset) = offsets[&at];
            buffers[b].write_from_host_memory(offset, mapping, at, len)?;
            done += len as u64;
            if let Some(p) = progress {
                p(done, total);
            }
        }
        Ok(WeightStore {
            memory: buffers.iter().map(Buffer::memory).collect(),
            buffers,
            offsets: Some(offsets),
        })
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
    /// Per device of the plan: its weights (each layer's weights are bound through its
    /// device's store).
    weights: Vec<WeightStore>,
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
        Model::load_with_options(path, placement, &LoadOptions::default())
    }

    /// [`Model::load_placed`], with `options`. A device that can use host memory gets the
    /// file's mapping (no copy) unless `no_mmap` is set; any other gets copies, in its own
    /// memory, of the weights of its layers and of the model's global weights.
    pub fn load_with_options(
        path: impl AsRef<Path>,
        placement: &Placement,
        options: &LoadOptions,
    ) -> Result<Model, ModelError> {
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
        let mapping: Arc<dyn HostMemory> =
            Arc::new(MappedFile(file.mapping(), file.path().to_path_buf()));
        let mut weights = Vec::with_capacity(plan.devices.len());
        for (d, device) in plan.devices.iter().enumerate() {
            if device.caps().buffer_from_host_ptr && !options.no_mmap {
                weights.push(WeightStore::mapped(
                    device.buffer_from_host_memory(mapping.clone())?,
                ));
                continue;
            }
            let tensors = device_tensors(&file, &plan, d)?;
            weights.push(WeightStore::upload(
                device,
                &mapping,
                &tensors,
                options.progress.as_deref(),
            )?);
        }
        Ok(Model {
            file,
            hparams,
            arch,
            plan,
            weights,
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

    /// Per device of the plan, where its weights are.
    pub fn weights(&self) -> &[WeightStore] {
        &self.weights
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

/// The (file offset, size) of every tensor device `d` of `plan` needs: those of the layers
/// placed on it (`blk.<i>.`) and every tensor outside the layers (embeddings, output, rope
/// factors), which any device may read.
fn device_tensors(
    file: &GgufFile,
    plan: &LayerPlan,
    d: usize,
) -> Result<Vec<(usize, usize)>, ModelError> {
    let mut out = Vec::new();
    for t in &file.tensors {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|i| i.parse::<usize>().ok());
        let wanted = match layer {
            Some(i) => plan.layers.get(i).is_none_or(|&ld| ld == d),
            None => true,
        };
        if wanted {
            let at = file
                .gguf()
                .data_offset
                .checked_add(t.offset)
                .and_then(|a| usize::try_from(a).ok());
            let len = usize::try_from(t.size).ok();
            match (at, len) {
                (Some(at), Some(len)) => out.push((at, len)),
                _ => {
                    return Err(ModelError::Placement(format!(
                        "tensor {} lies outside the address space",
                        t.name
                    )));
                }
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evicted pages of the mapping read back as the file's bytes; ranges past the end or
    /// inside one page are ignored.
    #[test]
    fn evicted_pages_read_back_unchanged() {
        let path = std::env::temp_dir().join(format!("lamina-evict-{}.bin", std::process::id()));
        let data: Vec<u8> = (0..5 * 4096 + 123)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a private temporary file, not written while mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
        let mem = MappedFile(Arc::new(map), path.clone());
        assert_eq!(mem.bytes(), &data[..]);
        mem.evict(100..4 * 4096 + 50);
        mem.evict(10..20);
        mem.evict(0..usize::MAX);
        assert_eq!(mem.bytes(), &data[..]);
        std::fs::remove_file(&path).unwrap();
    }
}
