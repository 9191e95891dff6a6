//! Helpers shared by the model's integration tests.
#![allow(dead_code)] // each test binary uses its own part

use std::path::Path;
use std::sync::Arc;

use lamina_backend::Device;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_model::{Model, Placement, SplitMode};

/// `path` loaded onto `n_devices` virtual CPU devices (2 threads in all), layers split
/// over them as llama.cpp's `--split-mode layer` does.
pub fn load(path: &Path, n_devices: usize) -> Arc<Model> {
    let reg =
        CpuBackendReg::new(CpuConfig::default().with_devices(n_devices).with_threads(2)).unwrap();
    let devices: Vec<Arc<dyn Device>> = reg
        .cpu_devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn Device>)
        .collect();
    let placement = Placement {
        host: devices[0].clone(),
        devices,
        split_mode: SplitMode::Layer,
        tensor_split: Vec::new(),
        n_gpu_layers: None,
        main_gpu: 0,
    };
    Arc::new(Model::load_placed(path, &placement).unwrap())
}

/// Lowest id among the highest logits (llama.cpp's greedy choice).
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best as u32
}
