//! Which device each layer runs on, decided as llama.cpp's model loader does from `--device`,
//! `--split-mode`, `--tensor-split`, `-ngl` and `--main-gpu`: the input layer (token embeddings)
//! stays on the host device; of the `n_layer + 1` layers (the output layer counts as one) the
//! last `-ngl` are offloaded, spread over the devices in proportion to the tensor split (or to
//! the devices' free memory); the rest stay on the host. Each layer's weights and KV cache live on
//! its device, and the graph nodes of that layer run there.

use std::str::FromStr;
use std::sync::Arc;

use lamina_backend::Device;

use crate::ModelError;

/// How layers are divided among devices (`--split-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SplitMode {
    /// Everything on the main device (`--main-gpu`).
    None,
    /// Layers spread over the devices (the default, as in llama.cpp).
    #[default]
    Layer,
    /// Rows of each weight spread over the devices (tensor parallelism; not supported).
    Row,
}

impl FromStr for SplitMode {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<SplitMode, ModelError> {
        match s {
            "none" => Ok(SplitMode::None),
            "layer" => Ok(SplitMode::Layer),
            "row" => Ok(SplitMode::Row),
            _ => Err(ModelError::Placement(format!(
                "unknown split mode {s:?} (use none, layer or row)"
            ))),
        }
    }
}

/// The placement settings.
#[derive(Clone, Debug)]
pub struct Placement {
    /// Where the input layer and the layers not offloaded go (llama.cpp's CPU device).
    pub host: Arc<dyn Device>,
    /// Devices layers are offloaded to, in order (`--device`); may include the host.
    pub devices: Vec<Arc<dyn Device>>,
    pub split_mode: SplitMode,
    /// Share of the layers per device (`--tensor-split`); empty: by free memory.
    pub tensor_split: Vec<f32>,
    /// Layers offloaded, counting the output layer (`-ngl`); `None`: all.
    pub n_gpu_layers: Option<usize>,
    /// The device used with `--split-mode none` (index into `devices`).
    pub main_gpu: usize,
}

/// The outcome: the devices in use and each layer's device (indices into `devices`).
#[derive(Clone, Debug)]
pub struct LayerPlan {
    pub devices: Vec<Arc<dyn Device>>,
    pub input: usize,
    pub layers: Vec<usize>,
    pub output: usize,
}

impl Placement {
    /// Everything on `device`.
    pub fn single(device: Arc<dyn Device>) -> Placement {
        Placement {
            host: device.clone(),
            devices: vec![device],
            split_mode: SplitMode::None,
            tensor_split: Vec::new(),
            n_gpu_layers: None,
            main_gpu: 0,
        }
    }

    /// Layers spread over `devices` (the first being the host), llama.cpp's defaults.
    pub fn layer_split(devices: Vec<Arc<dyn Device>>) -> Result<Placement, ModelError> {
        let host = devices
            .first()
            .cloned()
            .ok_or_else(|| ModelError::Placement("no devices".into()))?;
        Ok(Placement {
            host,
            devices,
            split_mode: SplitMode::Layer,
            tensor_split: Vec::new(),
            n_gpu_layers: None,
            main_gpu: 0,
        })
    }

    /// Assigns the input layer, the `n_layer` repeating layers and the output layer.
    pub fn plan(&self, n_layer: usize) -> Result<LayerPlan, ModelError> {
        let offload: Vec<Arc<dyn Device>> = match self.split_mode {
            SplitMode::Row => {
                return Err(ModelError::Placement(
                    "--split-mode row is not supported; use layer or none".into(),
                ));
            }
            SplitMode::None if self.devices.is_empty() => Vec::new(),
            SplitMode::None => vec![self.devices.get(self.main_gpu).cloned().ok_or_else(|| {
                ModelError::Placement(format!(
                    "--main-gpu {} is out of range: {} device(s)",
                    self.main_gpu,
                    self.devices.len()
                ))
            })?],
            SplitMode::Layer => self.devices.clone(),
        };
        if self.main_gpu >= self.devices.len().max(1) {
            return Err(ModelError::Placement(format!(
                "--main-gpu {} is out of range: {} device(s)",
                self.main_gpu,
                self.devices.len()
            )));
        }
        let weights = self.split_weights(&offload)?;
        let n_gpu = self.n_gpu_layers.unwrap_or(n_layer + 1).min(n_layer + 1);
        let gpu_start = n_layer.saturating_sub(n_gpu);
        let act_gpu = if offload.is_empty() { 0 } else { n_gpu };
        // Cumulative, normalised split points; layer il goes to the first device whose point
        // exceeds its fraction (std::upper_bound in llama.cpp).
        let total: f32 = weights.iter().sum();
        let mut points = Vec::with_capacity(weights.len());
        let mut acc = 0f32;
        for w in &weights {
            acc += w;
            points.push(acc / total);
        }
        let mut list: Vec<Arc<dyn Device>> = Vec::new();
        let mut index_of = |d: &Arc<dyn Device>| match list.iter().position(|x| x.key() == d.key())
        {
            Some(i) => i,
            None => {
                list.push(d.clone());
                list.len() - 1
            }
        };
        let input = index_of(&self.host);
        let mut layer_device = |il: usize| -> usize {
            if il < gpu_start || il - gpu_start >= act_gpu {
                return input;
            }
            let f = (il - gpu_start) as f32 / act_gpu as f32;
            let k = points.partition_point(|&p| p <= f).min(offload.len() - 1);
            index_of(&offload[k])
        };
        let layers: Vec<usize> = (0..n_layer).map(&mut layer_device).collect();
        let output = layer_device(n_layer);
        Ok(LayerPlan {
            devices: list,
            input,
            layers,
            output,
        })
    }

    fn split_weights(&self, offload: &[Arc<dyn Device>]) -> Result<Vec<f32>, ModelError> {
        if offload.is_empty() {
            return Ok(Vec::new());
        }
        let given = &self.tensor_split;
        if given.iter().any(|x| !x.is_finite() || *x < 0.0) {
            return Err(ModelError::Placement(format!(
                "--tensor-split {given:?}: shares must be non-negative numbers"
            )));
        }
        if self.split_mode == SplitMode::Layer && given.len() > offload.len() {
            return Err(ModelError::Placement(format!(
                "--tensor-split has {} values for {} device(s)",
                given.len(),
                offload.len()
            )));
        }
        let weights: Vec<f32> = if self.split_mode == SplitMode::None {
            vec![1.0]
        } else if given.iter().all(|&x| x == 0.0) {
            offload
                .iter()
                .map(|d| (d.memory().free as f64 / (1u64 << 20) as f64) as f32)
                .collect()
        } else {
            (0..offload.len())
                .map(|i| given.get(i).copied().unwrap_or(0.0))
                .collect()
        };
        if weights.iter().sum::<f32>() <= 0.0 {
            return Err(ModelError::Placement(
                "the tensor split gives no layers to any device".into(),
            ));
        }
        Ok(weights)
    }
}

/// Picks devices by name from `available` (`--device A,B`; `none` means no offload).
pub fn devices_by_name(
    list: &str,
    available: &[Arc<dyn Device>],
) -> Result<Vec<Arc<dyn Device>>, ModelError> {
    if list == "none" {
        return Ok(Vec::new());
    }
    let mut out: Vec<Arc<dyn Device>> = Vec::new();
    for name in list.split(',').map(str::trim) {
        let d = available
            .iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                ModelError::Placement(format!(
                    "unknown device {name:?}; available: {}",
                    available
                        .iter()
                        .map(|d| d.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                ))
            })?;
        if out.iter().any(|x| x.key() == d.key()) {
            return Err(ModelError::Placement(format!(
                "device {name:?} is listed twice"
            )));
        }
        out.push(d.clone());
    }
    Ok(out)
}
