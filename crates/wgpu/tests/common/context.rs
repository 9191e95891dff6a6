use lamina_wgpu::kernels::{Error, Result};
use std::sync::{Arc, Mutex};

/// What `adapters()` reports about one adapter.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub index: usize,
    pub name: String,
    pub driver: String,
    pub driver_info: String,
    pub backend: String,
    pub device_type: String,
}

fn instance() -> wgpu::Instance {
    wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::VULKAN,
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    })
}

fn list() -> Vec<wgpu::Adapter> {
    let inst = instance();
    pollster::block_on(inst.enumerate_adapters(wgpu::Backends::VULKAN))
}

/// All Vulkan adapters visible to wgpu (empty when there are none).
pub fn adapters() -> Vec<AdapterSummary> {
    list()
        .iter()
        .enumerate()
        .map(|(index, a)| {
            let i = a.get_info();
            AdapterSummary {
                index,
                name: i.name,
                driver: i.driver,
                driver_info: i.driver_info,
                backend: format!("{:?}", i.backend),
                device_type: format!("{:?}", i.device_type),
            }
        })
        .collect()
}

/// An opened device with the optional features this crate uses.
pub struct GpuContext {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub info: wgpu::AdapterInfo,
    /// `Features::SUBGROUP` was available and enabled.
    pub subgroups: bool,
    /// `Features::SHADER_F16` was available and enabled (the kernels do not need it).
    pub shader_f16: bool,
    pub limits: wgpu::Limits,
    errors: Arc<Mutex<Vec<String>>>,
}

impl GpuContext {
    /// Opens adapter `index` (see [`adapters`]) or the first one.
    pub fn new_blocking(index: Option<usize>) -> Result<Self> {
        let mut all = list();
        if all.is_empty() {
            return Err(Error::NoAdapter("wgpu found no Vulkan adapter".into()));
        }
        let i = index.unwrap_or(0);
        if i >= all.len() {
            return Err(Error::NoAdapter(format!(
                "adapter {i} requested, {} present",
                all.len()
            )));
        }
        let adapter = all.swap_remove(i);
        let info = adapter.get_info();
        let af = adapter.features();
        let want = wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16;
        let features = af & want;
        // Ask for everything the adapter offers: big storage bindings matter for weights.
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("lamina-wgpu"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| Error::Device(e.to_string()))?;
        // wgpu panics on uncaptured errors by default; record them instead.
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.lock() {
                v.push(e.to_string());
            }
        }));
        Ok(GpuContext {
            device,
            queue,
            info,
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            limits,
            errors,
        })
    }

    /// Returns (and clears) wgpu errors recorded since the last call.
    pub fn take_errors(&self) -> Result<()> {
        let mut v = self
            .errors
            .lock()
            .map_err(|_| Error::Gpu("error log poisoned".into()))?;
        if v.is_empty() {
            Ok(())
        } else {
            Err(Error::Gpu(std::mem::take(&mut *v).join("; ")))
        }
    }

    /// Creates a storage buffer usable by the kernels (size rounded up to 4).
    pub fn create_buffer(&self, size: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: size.div_ceil(4).max(1) * 4,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        })
    }

    /// Creates a storage buffer holding `bytes` (zero-padded to a multiple of 4).
    pub fn upload(&self, bytes: &[u8]) -> wgpu::Buffer {
        let buf = self.create_buffer(bytes.len() as u64);
        let mut padded = bytes.to_vec();
        padded.resize(buf.size() as usize, 0);
        self.queue.write_buffer(&buf, 0, &padded);
        buf
    }

    /// Blocking read of `len` bytes at `offset` (both rounded out to 4) of `buf`.
    pub fn read(&self, buf: &wgpu::Buffer, offset: u64, len: u64) -> Result<Vec<u8>> {
        let start = offset / 4 * 4;
        let end = (offset + len).div_ceil(4) * 4;
        if end > buf.size() {
            return Err(Error::Invalid("read past the end of the buffer".into()));
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: (end - start).max(4),
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buf, start, &staging, 0, end - start);
        self.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(e.to_string()))?;
        rx.recv()
            .map_err(|e| Error::Gpu(e.to_string()))?
            .map_err(|e| Error::Gpu(e.to_string()))?;
        let data = {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| Error::Gpu(format!("{e:?}")))?;
            let s = (offset - start) as usize;
            view[s..s + len as usize].to_vec()
        };
        staging.unmap();
        self.take_errors()?;
        Ok(data)
    }

    /// Reads `n` f32 values at byte `offset`.
    pub fn read_f32(&self, buf: &wgpu::Buffer, offset: u64, n: usize) -> Result<Vec<f32>> {
        let b = self.read(buf, offset, n as u64 * 4)?;
        Ok(b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}
