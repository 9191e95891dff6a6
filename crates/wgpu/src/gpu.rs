//! One opened adapter, shared by its virtual devices: the wgpu device and queue, the kernels'
//! pipeline cache, and the blocking transfers every buffer and stream builds on.

use std::sync::{Arc, Mutex, MutexGuard};

use lamina_backend::BackendError;

use crate::kernels::Kernels;

/// wgpu's copy granularity (`COPY_BUFFER_ALIGNMENT`): offsets and sizes of buffer copies and
/// `write_buffer` are multiples of it.
pub(crate) const COPY_ALIGN: u64 = 4;

/// An opened adapter.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: wgpu::AdapterInfo,
    pub(crate) limits: wgpu::Limits,
    /// Pipelines and per-op parameters; one graph is encoded at a time.
    kernels: Mutex<Kernels>,
    /// wgpu reports validation and device errors through a callback, not return values.
    errors: Arc<Mutex<Vec<String>>>,
    /// Name for messages (`WGPU` and the adapter's name).
    pub(crate) name: String,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Gpu({})", self.info.name)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Gpu {
    /// Opens `adapter` with the optional features the kernels use.
    pub(crate) fn open(adapter: wgpu::Adapter) -> Result<Gpu, String> {
        let info = adapter.get_info();
        let features = adapter.features() & (wgpu::Features::SUBGROUP | wgpu::Features::SHADER_F16);
        // Everything the adapter offers: big storage bindings matter for weights.
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("lamina-wgpu"),
            required_features: features,
            required_limits: limits.clone(),
            ..Default::default()
        }))
        .map_err(|e| e.to_string())?;
        let errors = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        // The default handler panics; keep the error for the next check instead.
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).push(e.to_string());
        }));
        let kernels = Mutex::new(Kernels::new(&device, &queue));
        Ok(Gpu {
            name: info.name.clone(),
            device,
            queue,
            info,
            limits,
            kernels,
            errors,
        })
    }

    pub(crate) fn kernels(&self) -> MutexGuard<'_, Kernels> {
        lock(&self.kernels)
    }

    fn error(&self, message: impl Into<String>) -> BackendError {
        BackendError::Device {
            device: self.name.clone(),
            message: message.into(),
        }
    }

    /// The errors wgpu reported since the last check, as one.
    pub(crate) fn check_errors(&self) -> Result<(), BackendError> {
        let mut e = lock(&self.errors);
        if e.is_empty() {
            return Ok(());
        }
        let message = std::mem::take(&mut *e).join("; ");
        Err(self.error(message))
    }

    /// Blocks until `index` (or everything submitted) has run, within the device layer's wait
    /// bound; a lost device or a hung queue is an error, not a hang.
    pub(crate) fn wait(&self, index: Option<wgpu::SubmissionIndex>) -> Result<(), BackendError> {
        let bound = lamina_backend::wait_bound();
        match self.device.poll(wgpu::PollType::Wait {
            submission_index: index,
            timeout: bound,
        }) {
            Ok(_) => self.check_errors(),
            Err(wgpu::PollError::Timeout) => Err(BackendError::Timeout {
                what: format!("{} to finish its work", self.name),
                waited: bound.unwrap_or_default(),
            }),
            Err(e) => Err(self.error(e.to_string())),
        }
    }

    /// Submits `encoder` and waits for it.
    pub(crate) fn submit_wait(&self, encoder: wgpu::CommandEncoder) -> Result<(), BackendError> {
        let index = self.queue.submit([encoder.finish()]);
        self.wait(Some(index))
    }

    pub(crate) fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    /// A storage buffer of at least `size` bytes (rounded up to the copy granularity).
    pub(crate) fn create_buffer(&self, size: u64) -> Result<wgpu::Buffer, BackendError> {
        let size = size.div_ceil(COPY_ALIGN).max(1) * COPY_ALIGN;
        if size > self.limits.max_buffer_size {
            return Err(BackendError::AllocFailed {
                buffer_type: self.name.clone(),
                size: size as usize,
            });
        }
        // An allocation failure is reported through the error scope, not a panic.
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST
                | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        if pollster::block_on(scope.pop()).is_some() {
            return Err(BackendError::AllocFailed {
                buffer_type: self.name.clone(),
                size: size as usize,
            });
        }
        Ok(buffer)
    }

    /// Blocking read of `out.len()` bytes at `offset` of `buffer`.
    pub(crate) fn read(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), BackendError> {
        if out.is_empty() {
            return Ok(());
        }
        let start = offset / COPY_ALIGN * COPY_ALIGN;
        let end = (offset + out.len() as u64).div_ceil(COPY_ALIGN) * COPY_ALIGN;
        if end > buffer.size() {
            return Err(self.error("read past the end of a buffer"));
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: end - start,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut encoder = self.encoder();
        encoder.copy_buffer_to_buffer(buffer, start, &staging, 0, end - start);
        let index = self.queue.submit([encoder.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |r| {
            let _ = tx.send(r);
        });
        self.wait(Some(index))?;
        // The map completes in the poll after the copy; poll once more if it has not.
        let mapped = match rx.try_recv() {
            Ok(r) => r,
            Err(_) => {
                self.wait(None)?;
                rx.try_recv()
                    .map_err(|_| self.error("a buffer map never completed"))?
            }
        };
        mapped.map_err(|e| self.error(e.to_string()))?;
        {
            let view = staging
                .get_mapped_range(..)
                .map_err(|e| self.error(format!("{e:?}")))?;
            let s = (offset - start) as usize;
            out.copy_from_slice(&view[s..s + out.len()]);
        }
        staging.unmap();
        Ok(())
    }

    /// Blocking write of `data` at `offset` of `buffer`; edges that are not on the copy
    /// granularity are merged with the bytes already there.
    pub(crate) fn write(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        data: &[u8],
    ) -> Result<(), BackendError> {
        if data.is_empty() {
            return Ok(());
        }
        let end = offset + data.len() as u64;
        let start_a = offset / COPY_ALIGN * COPY_ALIGN;
        let end_a = end.div_ceil(COPY_ALIGN) * COPY_ALIGN;
        if end_a > buffer.size() {
            return Err(self.error("write past the end of a buffer"));
        }
        if start_a == offset && end_a == end {
            self.queue.write_buffer(buffer, offset, data);
        } else {
            let mut words = vec![0u8; (end_a - start_a) as usize];
            self.read(buffer, start_a, &mut words)?;
            let s = (offset - start_a) as usize;
            words[s..s + data.len()].copy_from_slice(data);
            self.queue.write_buffer(buffer, start_a, &words);
        }
        self.submit_wait(self.encoder())
    }

    /// Blocking fill of `len` bytes at `offset` with `value`.
    pub(crate) fn fill(
        &self,
        buffer: &wgpu::Buffer,
        offset: u64,
        len: u64,
        value: u8,
    ) -> Result<(), BackendError> {
        if value == 0 && offset.is_multiple_of(COPY_ALIGN) && len.is_multiple_of(COPY_ALIGN) {
            let mut encoder = self.encoder();
            encoder.clear_buffer(buffer, offset, Some(len));
            return self.submit_wait(encoder);
        }
        // In pieces, so a fill of a big buffer does not allocate its size on the host.
        const PIECE: u64 = 1 << 20;
        let piece = vec![value; PIECE.min(len) as usize];
        let mut at = 0;
        while at < len {
            let n = PIECE.min(len - at);
            self.write(buffer, offset + at, &piece[..n as usize])?;
            at += n;
        }
        Ok(())
    }

    /// Blocking copy between two buffers of this adapter.
    pub(crate) fn copy(
        &self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        len: u64,
    ) -> Result<(), BackendError> {
        if len == 0 {
            return Ok(());
        }
        if src_offset.is_multiple_of(COPY_ALIGN)
            && dst_offset.is_multiple_of(COPY_ALIGN)
            && len.is_multiple_of(COPY_ALIGN)
        {
            let mut encoder = self.encoder();
            encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, len);
            return self.submit_wait(encoder);
        }
        let mut staged = vec![0u8; len as usize];
        self.read(src, src_offset, &mut staged)?;
        self.write(dst, dst_offset, &staged)
    }
}
