//! Devices and the registry that lists them.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use lamina_core::graph::{Graph, TensorId};

use crate::buffer::{Buffer, BufferType, HostMemory};
use crate::error::BackendError;
use crate::event::Event;
use crate::stream::Stream;

/// Process-unique identity of a device (never reused). Buffer types, buffers and events carry
/// their device's key, so "does this belong to me" is a key comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey(u64);

impl DeviceKey {
    /// A fresh key. Device implementations mint one per device instance.
    pub fn fresh() -> DeviceKey {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        DeviceKey(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// Kinds of device, as in ggml.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceType {
    /// System RAM, computed on by the CPU.
    Cpu,
    /// Dedicated memory.
    Gpu,
    /// Integrated GPU using host memory.
    IGpu,
    /// Helps the CPU backend and uses host buffers.
    Accel,
}

impl fmt::Display for DeviceType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DeviceType::Cpu => "CPU",
            DeviceType::Gpu => "GPU",
            DeviceType::IGpu => "IGPU",
            DeviceType::Accel => "ACCEL",
        })
    }
}

/// What a device can do beyond the minimum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Stream operations return before the work is done.
    pub async_ops: bool,
    /// Events can be recorded and waited on.
    pub events: bool,
    /// Offers a pinned host buffer type.
    pub host_buffer: bool,
    /// Can wrap host memory (mmapped weights) without copying.
    pub buffer_from_host_ptr: bool,
}

/// Free and total memory in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryInfo {
    pub free: u64,
    pub total: u64,
}

/// A compute device. Devices live as long as the registry that lists them (normally the
/// process); everything they hand out (streams, buffers, events) is reference counted.
pub trait Device: Send + Sync + fmt::Debug {
    fn key(&self) -> DeviceKey;
    /// Short unique id: `CPU`, `CPU0`, `CUDA1`, …
    fn name(&self) -> &str;
    fn description(&self) -> &str;
    fn device_type(&self) -> DeviceType;
    /// Unique physical/virtual id (e.g. `cpu:0/v1`); two devices never share one.
    fn device_id(&self) -> &str;
    fn memory(&self) -> MemoryInfo;
    fn caps(&self) -> DeviceCaps;
    /// The default buffer type; owned by this device, named after it.
    fn buffer_type(&self) -> BufferType;
    /// A pinned host buffer type, if the device has one.
    fn host_buffer_type(&self) -> Option<BufferType> {
        None
    }
    /// Whether this device's kernels can use memory of `buffer_type`. Strict: a device only
    /// accepts its own buffer types, so the scheduler must copy between devices.
    fn supports_buffer_type(&self, buffer_type: &BufferType) -> bool {
        buffer_type.device() == self.key()
    }
    /// Whether the device can compute node `id` of `graph`.
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool;
    /// The device's stream: one in-order queue per device.
    fn stream(&self) -> Stream;
    fn new_event(&self) -> Result<Event, BackendError>;
    /// Wraps host memory (e.g. an mmapped weight file) as a read-only buffer, without copying.
    fn buffer_from_host_memory(&self, memory: Arc<dyn HostMemory>) -> Result<Buffer, BackendError>;
}

/// A backend: a family of devices (CPU, CUDA, …).
pub trait BackendReg: Send + Sync {
    fn name(&self) -> &str;
    fn devices(&self) -> Vec<Arc<dyn Device>>;
}

/// The list of backends and their devices, in registration order.
#[derive(Default)]
pub struct Registry {
    regs: Vec<Arc<dyn BackendReg>>,
    devices: Vec<Arc<dyn Device>>,
}

impl fmt::Debug for Registry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registry")
            .field("devices", &self.devices)
            .finish()
    }
}

impl Registry {
    pub fn new() -> Registry {
        Registry::default()
    }

    /// Adds a backend and its devices (a device already listed is not added twice).
    pub fn register(&mut self, reg: Arc<dyn BackendReg>) {
        for d in reg.devices() {
            self.add_device(d);
        }
        self.regs.push(reg);
    }

    /// Adds a single device (how remote devices join).
    pub fn add_device(&mut self, device: Arc<dyn Device>) {
        if !self.devices.iter().any(|d| d.key() == device.key()) {
            self.devices.push(device);
        }
    }

    pub fn backends(&self) -> impl Iterator<Item = &str> {
        self.regs.iter().map(|r| r.name())
    }

    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    /// The device named `name`, ignoring case.
    pub fn device_by_name(&self, name: &str) -> Option<Arc<dyn Device>> {
        self.devices
            .iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .cloned()
    }

    /// The first device of type `t`.
    pub fn device_by_type(&self, t: DeviceType) -> Option<Arc<dyn Device>> {
        self.devices.iter().find(|d| d.device_type() == t).cloned()
    }

    /// A GPU, else an integrated GPU, else the CPU (ggml's `init_best`).
    pub fn best_device(&self) -> Option<Arc<dyn Device>> {
        [DeviceType::Gpu, DeviceType::IGpu, DeviceType::Cpu]
            .into_iter()
            .find_map(|t| self.device_by_type(t))
    }
}
