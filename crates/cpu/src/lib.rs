//! `lamina-cpu` owns the CPU backend: CPU devices (one, or N virtual devices `CPU0…` with
//! `LAMINA_CPU_DEVICES=N`), each with its own buffer types, worker pool, asynchronous queue and
//! events, implementing `lamina-backend`'s traits; graph execution; and the kernels of every op
//! of the graph IR. The numeric kernels (`kernels`) replicate llama.cpp's x86 AVX2 CPU arithmetic
//! bit for bit — activation quantizers, dot products and their accumulation order, the choice
//! between ggml's vec_dot, repacked gemv/gemm and tinyBLAS paths, softmax/SiLU exp, the GELU
//! table, RoPE — with a kernel table per instruction set (scalar, AVX2, AVX-512, NEON), the
//! best the CPU has chosen once, every tier giving the scalar emulation's bits
//! (`LAMINA_FORCE_SCALAR=1` forces it, `LAMINA_CPU_ISA` caps the tier). Where the tier has
//! a tile on packed weights, each device keeps packed copies of the mapped weights it
//! multiplies (`packed`; `LAMINA_NO_REPACK=1` turns that off).

mod device;
mod exec;
mod flash_attn;
pub mod kernels;
mod ops;
mod packed;
pub use packed::{NO_REPACK_ENV, set_repack};
mod pool;
pub mod quant;

use std::sync::{Arc, OnceLock};

use lamina_backend::{BackendError, BackendReg, Device, MemoryInfo, Registry};
use lamina_core::DType;
use lamina_core::graph::{Graph, Op, TensorId};

pub use device::{CpuDevice, CpuStream};
pub use pool::{Barrier, WorkerCtx, WorkerPool};

/// Environment variable that sets the number of virtual CPU devices.
pub const DEVICES_ENV: &str = "LAMINA_CPU_DEVICES";

/// Most virtual CPU devices accepted.
pub const MAX_DEVICES: usize = 64;

/// Configuration errors.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "invalid CPU device count {0:?} (--cpu-devices / {DEVICES_ENV}): expected 1 to {MAX_DEVICES}"
    )]
    BadDeviceCount(String),
    #[error(transparent)]
    Backend(#[from] BackendError),
}

/// How to expose the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuConfig {
    /// Number of (virtual) devices.
    pub devices: usize,
    /// Thread budget shared by all devices (each gets its share, at least one).
    pub threads: usize,
    /// Whether each device has its own queue thread (else operations run on the caller).
    pub asynchronous: bool,
}

impl Default for CpuConfig {
    fn default() -> CpuConfig {
        CpuConfig {
            devices: 1,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            asynchronous: true,
        }
    }
}

impl CpuConfig {
    /// The default configuration with `devices` from `LAMINA_CPU_DEVICES` when set.
    pub fn from_env() -> Result<CpuConfig, ConfigError> {
        let mut c = CpuConfig::default();
        if let Ok(v) = std::env::var(DEVICES_ENV) {
            c.devices = parse_device_count(&v)?;
        }
        Ok(c)
    }

    pub fn with_devices(mut self, devices: usize) -> CpuConfig {
        self.devices = devices;
        self
    }

    pub fn with_threads(mut self, threads: usize) -> CpuConfig {
        self.threads = threads;
        self
    }

    pub fn synchronous(mut self) -> CpuConfig {
        self.asynchronous = false;
        self
    }
}

/// Parses a device count (1 to [`MAX_DEVICES`]).
pub fn parse_device_count(v: &str) -> Result<usize, ConfigError> {
    match v.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_DEVICES).contains(&n) => Ok(n),
        _ => Err(ConfigError::BadDeviceCount(v.to_owned())),
    }
}

/// The CPU backend: its devices.
pub struct CpuBackendReg {
    devices: Vec<Arc<CpuDevice>>,
}

impl CpuBackendReg {
    /// Creates the devices of `config`; the thread budget is divided among them.
    pub fn new(config: CpuConfig) -> Result<CpuBackendReg, ConfigError> {
        if !(1..=MAX_DEVICES).contains(&config.devices) {
            return Err(ConfigError::BadDeviceCount(config.devices.to_string()));
        }
        let n = config.devices;
        let budget = config.threads.max(1);
        let mut devices = Vec::with_capacity(n);
        for i in 0..n {
            let threads = (budget / n + usize::from(i < budget % n)).max(1);
            devices.push(Arc::new(CpuDevice::new(
                i,
                n,
                threads,
                config.asynchronous,
            )?));
        }
        Ok(CpuBackendReg { devices })
    }

    /// The devices, as their concrete type.
    pub fn cpu_devices(&self) -> &[Arc<CpuDevice>] {
        &self.devices
    }
}

impl BackendReg for CpuBackendReg {
    fn name(&self) -> &str {
        "CPU"
    }
    fn devices(&self) -> Vec<Arc<dyn Device>> {
        self.devices
            .iter()
            .map(|d| d.clone() as Arc<dyn Device>)
            .collect()
    }
}

/// A registry holding the CPU backend of `config`.
pub fn registry_with(config: CpuConfig) -> Result<Registry, ConfigError> {
    let mut r = Registry::new();
    r.register(Arc::new(CpuBackendReg::new(config)?));
    Ok(r)
}

/// The process-wide registry, built on first use from the environment.
pub fn registry() -> Result<&'static Registry, ConfigError> {
    static REGISTRY: OnceLock<Result<Registry, ConfigError>> = OnceLock::new();
    REGISTRY
        .get_or_init(|| registry_with(CpuConfig::from_env()?))
        .as_ref()
        .map_err(Clone::clone)
}

/// The weight types `mul_mat` multiplies with llama.cpp's exact arithmetic (float types, then
/// the legacy, K/IQ, ternary, newest low-bit and grid i-quant quantizations), in the order the
/// tests go through them.
pub const MATMUL_WEIGHT_TYPES: [DType; 28] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::IQ4_NL,
    DType::MXFP4,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::IQ4_XS,
    DType::TQ1_0,
    DType::TQ2_0,
    DType::NVFP4,
    DType::Q1_0,
    DType::Q2_0,
    DType::IQ2_XXS,
    DType::IQ2_XS,
    DType::IQ2_S,
    DType::IQ3_XXS,
    DType::IQ3_S,
    DType::IQ1_S,
    DType::IQ1_M,
];

fn type_supported(dtype: DType) -> bool {
    let blck = dtype.block_size() as usize;
    let zeros = vec![0u8; dtype.type_size() as usize];
    let mut out = vec![0f32; blck];
    quant::dequantize_row(dtype, &zeros, &mut out).is_ok()
}

/// Whether the CPU kernels can compute node `id` (shapes were checked when it was built).
pub fn supports_op(graph: &Graph, id: TensorId) -> bool {
    let Ok(t) = graph.get(id) else { return false };
    let src_type = |i: usize| t.src[i].map(|s| graph.tensor(s).layout.dtype);
    match t.op {
        Op::MulMat | Op::MulMatId => src_type(0).is_some_and(|d| {
            type_supported(d) && quant::vec_dot_type(d).is_some_and(type_supported)
        }),
        Op::GetRows => src_type(0).is_some_and(type_supported),
        Op::SetRows => type_supported(t.layout.dtype),
        _ => true,
    }
}

/// The CPU's model name (from /proc/cpuinfo on Linux).
pub fn cpu_model_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_owned())
}

/// System memory (from /proc/meminfo on Linux; zeros when unknown).
pub fn system_memory() -> MemoryInfo {
    let Ok(s) = std::fs::read_to_string("/proc/meminfo") else {
        return MemoryInfo::default();
    };
    let field = |name: &str| {
        s.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    MemoryInfo {
        free: field("MemAvailable:"),
        total: field("MemTotal:"),
    }
}
