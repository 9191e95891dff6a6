//! Device memory: the buffer type of a virtual device and its buffers, each a `wgpu::Buffer`
//! of the shared adapter.

use std::any::Any;
use std::ptr::NonNull;
use std::sync::Arc;

use lamina_backend::{BackendError, BufferImpl, BufferTypeImpl, DeviceKey};

use crate::gpu::Gpu;

/// Alignment of tensors in device buffers: binding offsets must be multiples of the adapter's
/// `min_storage_buffer_offset_alignment` (at most 256 by the WebGPU spec).
pub const TENSOR_ALIGNMENT: usize = 256;

/// The memory of one virtual device (named after it; each virtual device has its own).
#[derive(Debug)]
pub(crate) struct WgpuBufferType {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) device: DeviceKey,
    pub(crate) name: String,
}

impl BufferTypeImpl for WgpuBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn device(&self) -> DeviceKey {
        self.device
    }
    fn device_name(&self) -> &str {
        &self.name
    }
    fn alignment(&self) -> usize {
        TENSOR_ALIGNMENT
    }
    fn max_size(&self) -> usize {
        // Kernels bind a window per tensor, so a buffer may exceed one binding; a single
        // tensor larger than a binding is split by rows where the kernel can (weights).
        usize::try_from(self.gpu.limits.max_buffer_size).unwrap_or(usize::MAX)
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn BufferImpl>, BackendError> {
        let buffer = self.gpu.create_buffer(size as u64)?;
        Ok(Box::new(WgpuBuffer {
            gpu: self.gpu.clone(),
            buffer,
            size,
        }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A buffer in device memory.
pub(crate) struct WgpuBuffer {
    pub(crate) gpu: Arc<Gpu>,
    pub(crate) buffer: wgpu::Buffer,
    size: usize,
}

impl BufferImpl for WgpuBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        None
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.gpu.write(&self.buffer, offset as u64, data)
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.gpu.read(&self.buffer, offset as u64, out)
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<(), BackendError> {
        self.gpu
            .fill(&self.buffer, offset as u64, len as u64, value)
    }
    fn copy_from(
        &self,
        dst_offset: usize,
        src: &dyn BufferImpl,
        src_offset: usize,
        len: usize,
    ) -> Result<bool, BackendError> {
        // Between buffers of one adapter (two virtual devices included) the GPU copies.
        match src.as_any().downcast_ref::<WgpuBuffer>() {
            Some(s) if Arc::ptr_eq(&s.gpu, &self.gpu) => {
                self.gpu.copy(
                    &s.buffer,
                    src_offset as u64,
                    &self.buffer,
                    dst_offset as u64,
                    len as u64,
                )?;
                Ok(true)
            }
            _ => Ok(false),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
