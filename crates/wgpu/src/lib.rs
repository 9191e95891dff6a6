//! `lamina-wgpu` owns the GPU backend on `wgpu` (Vulkan here; Metal and DX12 where wgpu runs on
//! them): adapter discovery, virtual devices (`LAMINA_WGPU_DEVICES=N` exposes one adapter as
//! `WGPU0…WGPU{N-1}`, each with its own buffer type, queue thread and events, sharing the
//! adapter's memory so copies between them stay on the GPU), device memory behind
//! `lamina-backend`'s buffer interfaces, and the WGSL kernels (`kernels`) of the ops the llama
//! and gemma3 graphs need, quantized matrix products included. What the kernels lack,
//! `supports_op` declines and the scheduler runs on the CPU.

mod device;
mod exec;
mod gpu;
pub mod kernels;
mod memory;

use std::sync::Arc;

use lamina_backend::{BackendError, BackendReg, Device};

pub use device::{WgpuDevice, WgpuStream};
pub use exec::supports_op;
pub use memory::TENSOR_ALIGNMENT;

/// Environment variable that sets the number of virtual devices per adapter.
pub const DEVICES_ENV: &str = "LAMINA_WGPU_DEVICES";

/// Most virtual devices per adapter.
pub const MAX_DEVICES: usize = 16;

/// What `lamina devices` shows of an adapter that could not be opened.
#[derive(Clone, Debug)]
pub struct AdapterProblem {
    pub name: String,
    pub message: String,
}

/// The GPU backend: every adapter wgpu finds, each as `devices_per_adapter` devices. Devices
/// are numbered across adapters (`WGPU0`, `WGPU1`, …).
pub struct WgpuBackendReg {
    devices: Vec<Arc<WgpuDevice>>,
    problems: Vec<AdapterProblem>,
}

impl WgpuBackendReg {
    /// Opens every adapter, with `devices_per_adapter` virtual devices each (1 to
    /// [`MAX_DEVICES`]). No adapter is not an error: the backend then has no devices.
    pub fn new(devices_per_adapter: usize) -> Result<WgpuBackendReg, BackendError> {
        if !(1..=MAX_DEVICES).contains(&devices_per_adapter) {
            return Err(BackendError::Unsupported {
                device: "WGPU".into(),
                what: format!(
                    "{devices_per_adapter} devices per adapter ({DEVICES_ENV}: 1 to {MAX_DEVICES})"
                ),
            });
        }
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends: wgpu::Backends::PRIMARY,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::PRIMARY));
        let mut devices = Vec::new();
        let mut problems = Vec::new();
        for (a, adapter) in adapters.into_iter().enumerate() {
            let name = adapter.get_info().name;
            match gpu::Gpu::open(adapter) {
                Ok(g) => {
                    let g = Arc::new(g);
                    for _ in 0..devices_per_adapter {
                        let index = devices.len();
                        let d = WgpuDevice::new(g.clone(), a, index, devices_per_adapter)?;
                        devices.push(Arc::new(d));
                    }
                }
                Err(message) => problems.push(AdapterProblem { name, message }),
            }
        }
        Ok(WgpuBackendReg { devices, problems })
    }

    /// [`WgpuBackendReg::new`] with the device count from `LAMINA_WGPU_DEVICES` (default 1).
    pub fn from_env() -> Result<WgpuBackendReg, BackendError> {
        let n = match std::env::var(DEVICES_ENV) {
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .map_err(|_| BackendError::Unsupported {
                    device: "WGPU".into(),
                    what: format!("{DEVICES_ENV}={v:?} (expected 1 to {MAX_DEVICES})"),
                })?,
            Err(_) => 1,
        };
        WgpuBackendReg::new(n)
    }

    pub fn wgpu_devices(&self) -> &[Arc<WgpuDevice>] {
        &self.devices
    }

    /// Adapters found but not opened, with the reason.
    pub fn problems(&self) -> &[AdapterProblem] {
        &self.problems
    }
}

impl BackendReg for WgpuBackendReg {
    fn name(&self) -> &str {
        "WGPU"
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.devices
            .iter()
            .map(|d| d.clone() as Arc<dyn Device>)
            .collect()
    }
}
