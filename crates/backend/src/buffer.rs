//! Buffer types and buffers: device memory with bounds-checked access.
//!
//! As ggml's `buffer_type_i` / `buffer_i`, the memory itself is an interface a backend
//! implements: [`BufferTypeImpl`] (alignment, max size, `is_host`, allocation) and
//! [`BufferImpl`] (set/get/clear/copy, and a host address when the memory is host-visible).
//! [`BufferType`] and [`Buffer`] are the handles everyone else holds. A buffer type is owned by
//! one device, named after it, and compared by identity (two devices never share one, so the
//! allocator and scheduler never merge their memory). A buffer is shared by reference counting:
//! graphs that bind tensors to it keep it alive while queued work may still touch it. Every byte
//! access takes the buffer's lock, so blocking host access and queued device work on the same
//! buffer serialize instead of racing. Host memory (allocated, or wrapping an mmapped file) is
//! the implementation in this module that host-memory devices share.

use std::alloc;
use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use lamina_core::DType;
use lamina_core::graph::{BufferMemory, Graph, TensorId};
use lamina_core::tensor::Layout;

use crate::device::DeviceKey;
use crate::error::BackendError;

/// Host memory that a buffer can wrap without copying (an mmapped file, a `Vec`). Its bytes
/// do not change while wrapped: devices may keep copies derived from them (the CPU's packed
/// weights) for as long as the buffer lives.
pub trait HostMemory: Send + Sync + fmt::Debug {
    fn bytes(&self) -> &[u8];
    /// The file these bytes map, whole, if they do: a device in another process maps its own
    /// copy of it instead of receiving the bytes.
    fn file(&self) -> Option<&std::path::Path> {
        None
    }
    /// A hint that bytes `range` will not be read for a while: a mapped file may drop those
    /// pages from the process's memory (they come back from the file, unchanged, when read).
    fn evict(&self, range: std::ops::Range<usize>) {
        let _ = range;
    }
}

impl HostMemory for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// What a buffer holds, for the scheduler's placement rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferUsage {
    Any = 0,
    Weights = 1,
    Compute = 2,
}

/// The device side of a buffer type (ggml's `buffer_type_i`).
pub trait BufferTypeImpl: Send + Sync + fmt::Debug + Any {
    fn name(&self) -> &str;
    fn device(&self) -> DeviceKey;
    fn device_name(&self) -> &str;
    /// Alignment of tensors in buffers of this type (a power of two).
    fn alignment(&self) -> usize;
    fn max_size(&self) -> usize;
    /// Whether the host can address this memory directly (then [`BufferImpl::host_ptr`] is
    /// `Some` for its buffers).
    fn is_host(&self) -> bool;
    /// Bytes a tensor of `layout` needs in this buffer type.
    fn alloc_size(&self, layout: &Layout) -> usize {
        layout.span_bytes()
    }
    /// `size` zero-filled bytes (`size` ≤ [`BufferTypeImpl::max_size`], checked by the caller).
    fn alloc(&self, size: usize) -> Result<Box<dyn BufferImpl>, BackendError>;
    /// A read-only buffer over `memory`, without copying; only for types that can.
    fn wrap_host_memory(
        &self,
        memory: Arc<dyn HostMemory>,
    ) -> Result<Box<dyn BufferImpl>, BackendError> {
        drop(memory);
        Err(BackendError::Unsupported {
            device: self.device_name().to_owned(),
            what: format!("wrapping host memory in buffer type {}", self.name()),
        })
    }
    fn as_any(&self) -> &dyn Any;
}

/// The device side of a buffer (ggml's `buffer_i`). The [`Buffer`] handle checks every range
/// and holds the buffer's lock while it calls these. Host-visible memory returns its address
/// from [`BufferImpl::host_ptr`], and the handle then reads and writes it directly; device
/// memory implements the transfers.
pub trait BufferImpl: Send + Sync + Any {
    fn size(&self) -> usize;
    fn is_read_only(&self) -> bool {
        false
    }
    /// [`HostMemory::evict`] for wrapped host memory (the range was checked); nothing
    /// elsewhere.
    fn evict(&self, offset: usize, len: usize) {
        let _ = (offset, len);
    }
    /// The memory's base address when the host can address it; valid as long as the buffer.
    fn host_ptr(&self) -> Option<NonNull<u8>>;
    /// Blocking write (device memory only: called when `host_ptr` is `None`).
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), BackendError>;
    /// Blocking write of `memory`'s bytes `src..src + len` (device memory only; the range was
    /// checked). The default writes those bytes; a device of another process that can read
    /// the same file itself ([`HostMemory::file`]) does that instead, so weights stay local.
    fn write_from_host_memory(
        &self,
        offset: usize,
        memory: &Arc<dyn HostMemory>,
        src: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        self.write(offset, &memory.bytes()[src..src + len])
    }
    /// Blocking read (device memory only).
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), BackendError>;
    /// Blocking fill with `value` (device memory only).
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<(), BackendError>;
    /// A copy from `src` done by the device (e.g. two buffers of one GPU). `Ok(false)` declines,
    /// and the handle goes through host memory.
    fn copy_from(
        &self,
        dst_offset: usize,
        src: &dyn BufferImpl,
        src_offset: usize,
        len: usize,
    ) -> Result<bool, BackendError> {
        let _ = (dst_offset, src, src_offset, len);
        Ok(false)
    }
    fn as_any(&self) -> &dyn Any;
}

/// A kind of memory of one device. Equality is identity.
#[derive(Clone, Debug)]
pub struct BufferType(Arc<dyn BufferTypeImpl>);

impl PartialEq for BufferType {
    fn eq(&self, other: &BufferType) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}
impl Eq for BufferType {}
impl Hash for BufferType {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.0) as *const u8 as usize).hash(state);
    }
}

/// Alignment of host buffers and of tensors inside them (cache line, AVX-512 friendly).
pub const HOST_ALIGNMENT: usize = 64;

impl BufferType {
    /// The handle of a backend's buffer type.
    pub fn new(implementation: Arc<dyn BufferTypeImpl>) -> BufferType {
        BufferType(implementation)
    }

    /// Host memory of `device`, with `alignment` (a power of two).
    pub fn new_host(
        device: DeviceKey,
        device_name: &str,
        name: &str,
        alignment: usize,
    ) -> BufferType {
        BufferType::new(Arc::new(HostBufferType {
            name: name.to_owned(),
            device,
            device_name: device_name.to_owned(),
            alignment: alignment.max(1).next_power_of_two(),
            kind: HostKind::Allocated,
        }))
    }

    /// The type of buffers that wrap read-only host memory for `device`.
    pub fn new_mapped(device: DeviceKey, device_name: &str, name: &str) -> BufferType {
        BufferType::new(Arc::new(HostBufferType {
            name: name.to_owned(),
            device,
            device_name: device_name.to_owned(),
            alignment: 1,
            kind: HostKind::Mapped,
        }))
    }

    /// The backend's implementation (to downcast to its own type).
    pub fn implementation(&self) -> &dyn BufferTypeImpl {
        &*self.0
    }
    pub fn name(&self) -> &str {
        self.0.name()
    }
    pub fn device(&self) -> DeviceKey {
        self.0.device()
    }
    pub fn device_name(&self) -> &str {
        self.0.device_name()
    }
    pub fn alignment(&self) -> usize {
        self.0.alignment()
    }
    pub fn max_size(&self) -> usize {
        self.0.max_size()
    }
    /// Whether the host can address this memory directly.
    pub fn is_host(&self) -> bool {
        self.0.is_host()
    }

    /// Bytes a tensor of `layout` needs in this buffer type.
    pub fn alloc_size(&self, layout: &Layout) -> usize {
        self.0.alloc_size(layout)
    }

    /// Allocates a zero-filled buffer of `size` bytes (size 0 gives an empty buffer).
    pub fn alloc_buffer(&self, size: usize) -> Result<Buffer, BackendError> {
        if size > self.max_size() {
            return Err(BackendError::AllocFailed {
                buffer_type: self.name().to_owned(),
                size,
            });
        }
        let imp = self.0.alloc(size)?;
        Ok(Buffer::new(self.clone(), imp))
    }

    /// Wraps `memory` as a read-only buffer of this type, if the type can.
    pub fn wrap_host_memory(&self, memory: Arc<dyn HostMemory>) -> Result<Buffer, BackendError> {
        let imp = self.0.wrap_host_memory(memory)?;
        Ok(Buffer::new(self.clone(), imp))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostKind {
    /// Allocates host memory.
    Allocated,
    /// Wraps read-only host memory; cannot allocate.
    Mapped,
}

/// Host memory of a host-memory device: allocated, or wrapping read-only memory.
#[derive(Debug)]
struct HostBufferType {
    name: String,
    device: DeviceKey,
    device_name: String,
    alignment: usize,
    kind: HostKind,
}

impl BufferTypeImpl for HostBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn device(&self) -> DeviceKey {
        self.device
    }
    fn device_name(&self) -> &str {
        &self.device_name
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        isize::MAX as usize
    }
    fn is_host(&self) -> bool {
        true
    }

    fn alloc(&self, size: usize) -> Result<Box<dyn BufferImpl>, BackendError> {
        let fail = || BackendError::AllocFailed {
            buffer_type: self.name.clone(),
            size,
        };
        if self.kind != HostKind::Allocated {
            return Err(fail());
        }
        if size == 0 {
            return Ok(Box::new(HostBuffer::Empty));
        }
        // Zeroed memory from the allocator's calloc path (16-byte alignment), over-allocated by
        // the alignment and aligned by hand: large blocks then come straight from the OS as
        // untouched zero pages, so a worst-case compute buffer costs resident memory only for
        // the parts graphs actually use. (An aligned `alloc_zeroed` would memset it all.)
        let align = self.alignment;
        let layout = alloc::Layout::from_size_align(size.checked_add(align).ok_or_else(fail)?, 16)
            .map_err(|_| fail())?;
        // SAFETY: `layout` has non-zero size.
        let base = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).ok_or_else(fail)?;
        let offset = (base.as_ptr() as usize).next_multiple_of(align) - base.as_ptr() as usize;
        // SAFETY: offset < align, so `ptr .. ptr + size` lies inside the allocation.
        let ptr = unsafe { base.add(offset) };
        Ok(Box::new(HostBuffer::Allocated {
            ptr,
            base,
            layout,
            size,
        }))
    }

    fn wrap_host_memory(
        &self,
        memory: Arc<dyn HostMemory>,
    ) -> Result<Box<dyn BufferImpl>, BackendError> {
        if self.kind != HostKind::Mapped {
            return Err(BackendError::Unsupported {
                device: self.device_name.clone(),
                what: format!("wrapping host memory in buffer type {}", self.name),
            });
        }
        Ok(Box::new(HostBuffer::Mapped { memory }))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The memory of a host buffer.
enum HostBuffer {
    Empty,
    Allocated {
        /// The aligned start of the buffer.
        ptr: NonNull<u8>,
        /// The allocation, as allocated.
        base: NonNull<u8>,
        layout: alloc::Layout,
        size: usize,
    },
    Mapped {
        memory: Arc<dyn HostMemory>,
    },
}

// SAFETY: the raw allocation is owned exclusively by this value and only reached through the
// owning `Buffer`'s lock, which serializes readers and writers across threads; mapped memory is
// `Send + Sync` and never written.
unsafe impl Send for HostBuffer {}
// SAFETY: see above.
unsafe impl Sync for HostBuffer {}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if let HostBuffer::Allocated { base, layout, .. } = self {
            // SAFETY: allocated in `HostBufferType::alloc` with exactly this layout, freed once.
            unsafe { alloc::dealloc(base.as_ptr(), *layout) };
        }
    }
}

impl BufferImpl for HostBuffer {
    fn size(&self) -> usize {
        match self {
            HostBuffer::Empty => 0,
            HostBuffer::Allocated { size, .. } => *size,
            HostBuffer::Mapped { memory } => memory.bytes().len(),
        }
    }
    fn is_read_only(&self) -> bool {
        matches!(self, HostBuffer::Mapped { .. })
    }
    fn evict(&self, offset: usize, len: usize) {
        if let HostBuffer::Mapped { memory } = self {
            memory.evict(offset..offset + len);
        }
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        Some(match self {
            HostBuffer::Empty => NonNull::dangling(),
            HostBuffer::Allocated { ptr, .. } => *ptr,
            HostBuffer::Mapped { memory } => NonNull::from(memory.bytes()).cast(),
        })
    }
    // Host memory is always reached through `host_ptr`; these are never called.
    fn write(&self, _: usize, _: &[u8]) -> Result<(), BackendError> {
        Err(host_only())
    }
    fn read(&self, _: usize, _: &mut [u8]) -> Result<(), BackendError> {
        Err(host_only())
    }
    fn fill(&self, _: usize, _: usize, _: u8) -> Result<(), BackendError> {
        Err(host_only())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn host_only() -> BackendError {
    BackendError::Unsupported {
        device: "host".into(),
        what: "device transfers on host memory".into(),
    }
}

/// The shared state behind a [`Buffer`].
pub struct BufferShared {
    id: u64,
    buffer_type: BufferType,
    imp: Box<dyn BufferImpl>,
    size: usize,
    usage: AtomicU8,
    /// Held by every access to the bytes (host copies, queued device work).
    lock: Mutex<()>,
}

impl fmt::Debug for BufferShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Buffer#{}({}, {} bytes)",
            self.id,
            self.buffer_type.name(),
            self.size
        )
    }
}

impl BufferMemory for BufferShared {
    fn memory_id(&self) -> u64 {
        self.id
    }
    fn size(&self) -> usize {
        self.size
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Device memory. Cheap to clone (clones are the same buffer).
#[derive(Clone, Debug)]
pub struct Buffer(Arc<BufferShared>);

/// A [`Buffer`] handle that does not keep it alive.
#[derive(Clone, Debug)]
pub struct WeakBuffer(std::sync::Weak<BufferShared>);

impl WeakBuffer {
    /// Whether the buffer still exists.
    pub fn is_alive(&self) -> bool {
        self.0.strong_count() > 0
    }
}

impl PartialEq for Buffer {
    fn eq(&self, other: &Buffer) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}
impl Eq for Buffer {}

impl Buffer {
    fn new(buffer_type: BufferType, imp: Box<dyn BufferImpl>) -> Buffer {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Buffer(Arc::new(BufferShared {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            buffer_type,
            size: imp.size(),
            imp,
            usage: AtomicU8::new(BufferUsage::Any as u8),
            lock: Mutex::new(()),
        }))
    }

    /// Process-unique id.
    pub fn id(&self) -> u64 {
        self.0.id
    }
    /// A handle that does not keep the buffer alive (for caches of what it holds).
    pub fn downgrade(&self) -> WeakBuffer {
        WeakBuffer(Arc::downgrade(&self.0))
    }
    pub fn size(&self) -> usize {
        self.0.size
    }
    pub fn buffer_type(&self) -> &BufferType {
        &self.0.buffer_type
    }
    pub fn device(&self) -> DeviceKey {
        self.0.buffer_type.device()
    }
    /// The backend's implementation (to downcast to its own type).
    pub fn implementation(&self) -> &dyn BufferImpl {
        &*self.0.imp
    }
    /// `<buffer type>#<id>`, for messages.
    pub fn name(&self) -> String {
        format!("{}#{}", self.0.buffer_type.name(), self.0.id)
    }
    pub fn is_read_only(&self) -> bool {
        self.0.imp.is_read_only()
    }
    /// A hint that bytes `offset..offset + len` of a buffer wrapping host memory will not be
    /// read for a while ([`HostMemory::evict`]); ignored out of range or for other buffers.
    pub fn evict(&self, offset: usize, len: usize) {
        if offset
            .checked_add(len)
            .is_some_and(|end| end <= self.0.size)
        {
            self.0.imp.evict(offset, len);
        }
    }
    /// Whether the host can address the memory (see [`BufferGuard::as_ptr`]).
    pub fn is_host(&self) -> bool {
        self.0.imp.host_ptr().is_some()
    }
    pub fn usage(&self) -> BufferUsage {
        match self.0.usage.load(Ordering::Relaxed) {
            1 => BufferUsage::Weights,
            2 => BufferUsage::Compute,
            _ => BufferUsage::Any,
        }
    }
    pub fn set_usage(&self, usage: BufferUsage) {
        self.0.usage.store(usage as u8, Ordering::Relaxed);
    }

    /// The largest power of two (up to 4096) that divides the memory's base address: tensors
    /// at offset `o` are aligned to `a` when this and `o` are multiples of `a`. Wrapped host
    /// memory can have any address, so devices must check this, not just offsets. Device
    /// memory is taken as aligned (its offsets are what the device sees).
    pub fn base_alignment(&self) -> usize {
        match self.0.imp.host_ptr() {
            Some(p) if self.0.size > 0 => {
                (1usize << (p.as_ptr() as usize).trailing_zeros().min(12)).min(4096)
            }
            _ => 4096,
        }
    }

    /// This buffer as graph-binding memory.
    pub fn memory(&self) -> Arc<dyn BufferMemory> {
        self.0.clone()
    }

    /// The buffer behind graph-binding memory, if it is one of ours.
    pub fn from_memory(memory: &Arc<dyn BufferMemory>) -> Option<Buffer> {
        let any: Arc<dyn Any + Send + Sync> = memory.clone();
        any.downcast::<BufferShared>().ok().map(Buffer)
    }

    fn check(&self, offset: usize, len: usize) -> Result<(), BackendError> {
        if offset.checked_add(len).is_none_or(|end| end > self.0.size) {
            return Err(BackendError::OutOfBounds {
                buffer: self.name(),
                offset,
                len,
                size: self.0.size,
            });
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), BackendError> {
        if self.is_read_only() {
            return Err(BackendError::ReadOnly(self.name()));
        }
        Ok(())
    }

    /// Locks the buffer for direct access by a device implementation.
    pub fn lock(&self) -> BufferGuard<'_> {
        BufferGuard {
            shared: &self.0,
            _guard: self.0.lock.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// Blocking write of `data` at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.check(offset, data.len())?;
        self.check_writable()?;
        let g = self.lock();
        if g.is_host() {
            g.bytes_mut(offset, data.len())?.copy_from_slice(data);
            return Ok(());
        }
        self.0.imp.write(offset, data)
    }

    /// Blocking write of `memory`'s bytes `src..src + len` at `offset` (a weight from the
    /// model's mapping: a device of another process reads its own copy of the file).
    pub fn write_from_host_memory(
        &self,
        offset: usize,
        memory: &Arc<dyn HostMemory>,
        src: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        self.check(offset, len)?;
        self.check_writable()?;
        if src
            .checked_add(len)
            .is_none_or(|end| end > memory.bytes().len())
        {
            return Err(BackendError::OutOfBounds {
                buffer: "host memory".into(),
                offset: src,
                len,
                size: memory.bytes().len(),
            });
        }
        let g = self.lock();
        if g.is_host() {
            g.bytes_mut(offset, len)?
                .copy_from_slice(&memory.bytes()[src..src + len]);
            return Ok(());
        }
        self.0.imp.write_from_host_memory(offset, memory, src, len)
    }

    /// Blocking read into `out` from `offset`.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        self.check(offset, out.len())?;
        let g = self.lock();
        if g.is_host() {
            out.copy_from_slice(g.bytes(offset, out.len())?);
            return Ok(());
        }
        self.0.imp.read(offset, out)
    }

    /// Blocking fill of `len` bytes at `offset` with `value` (memset).
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> Result<(), BackendError> {
        self.check(offset, len)?;
        self.check_writable()?;
        let g = self.lock();
        if g.is_host() {
            g.bytes_mut(offset, len)?.fill(value);
            return Ok(());
        }
        self.0.imp.fill(offset, len, value)
    }

    /// Fills the whole buffer with `value`.
    pub fn clear(&self, value: u8) -> Result<(), BackendError> {
        self.fill(0, self.size(), value)
    }

    /// Blocking copy of `len` bytes from `src` at `src_offset` to this buffer at `dst_offset`:
    /// by the device where it offers a copy, else through host memory.
    pub fn copy_from(
        &self,
        dst_offset: usize,
        src: &Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        self.check(dst_offset, len)?;
        src.check(src_offset, len)?;
        self.check_writable()?;
        if self == src {
            let g = self.lock();
            if !g.is_host() {
                if self
                    .0
                    .imp
                    .copy_from(dst_offset, &*src.0.imp, src_offset, len)?
                {
                    return Ok(());
                }
                let mut staged = vec![0u8; len];
                self.0.imp.read(src_offset, &mut staged)?;
                return self.0.imp.write(dst_offset, &staged);
            }
            let p = g.as_mut_ptr()?;
            // SAFETY: both ranges are inside the buffer (checked), the lock is held, and
            // `ptr::copy` allows overlap.
            unsafe { std::ptr::copy(p.add(src_offset), p.add(dst_offset), len) };
            return Ok(());
        }
        // Lock in id order, the global lock order (so two threads locking overlapping sets
        // cannot deadlock).
        let (gd, gs) = if self.id() < src.id() {
            let gd = self.lock();
            (gd, src.lock())
        } else {
            let gs = src.lock();
            (self.lock(), gs)
        };
        match (gd.is_host(), gs.is_host()) {
            (true, true) => gd
                .bytes_mut(dst_offset, len)?
                .copy_from_slice(gs.bytes(src_offset, len)?),
            (false, true) => self.0.imp.write(dst_offset, gs.bytes(src_offset, len)?)?,
            (true, false) => src.0.imp.read(src_offset, gd.bytes_mut(dst_offset, len)?)?,
            (false, false) => {
                if !self
                    .0
                    .imp
                    .copy_from(dst_offset, &*src.0.imp, src_offset, len)?
                {
                    let mut staged = vec![0u8; len];
                    src.0.imp.read(src_offset, &mut staged)?;
                    self.0.imp.write(dst_offset, &staged)?;
                }
            }
        }
        Ok(())
    }
}

/// Exclusive access to a buffer's bytes while held.
pub struct BufferGuard<'a> {
    shared: &'a BufferShared,
    _guard: MutexGuard<'a, ()>,
}

impl BufferGuard<'_> {
    pub fn id(&self) -> u64 {
        self.shared.id
    }
    pub fn len(&self) -> usize {
        self.shared.size
    }
    pub fn is_empty(&self) -> bool {
        self.shared.size == 0
    }
    pub fn is_read_only(&self) -> bool {
        self.shared.imp.is_read_only()
    }
    /// Whether the memory has a host address.
    pub fn is_host(&self) -> bool {
        self.shared.imp.host_ptr().is_some()
    }
    /// The backend's implementation, for device work under the lock.
    pub fn implementation(&self) -> &dyn BufferImpl {
        &*self.shared.imp
    }

    fn not_host(&self) -> BackendError {
        BackendError::Unsupported {
            device: self.shared.buffer_type.device_name().to_owned(),
            what: format!(
                "host access to device memory {}#{}",
                self.shared.buffer_type.name(),
                self.shared.id
            ),
        }
    }

    /// Base address of host-visible memory. Valid while the guard is held; reads only.
    pub fn as_ptr(&self) -> Result<*const u8, BackendError> {
        match self.shared.imp.host_ptr() {
            Some(p) => Ok(p.as_ptr()),
            None => Err(self.not_host()),
        }
    }

    /// Base address for writing; an error for read-only or device memory.
    pub fn as_mut_ptr(&self) -> Result<*mut u8, BackendError> {
        if self.is_read_only() {
            return Err(BackendError::ReadOnly(format!(
                "{}#{}",
                self.shared.buffer_type.name(),
                self.shared.id
            )));
        }
        match self.shared.imp.host_ptr() {
            Some(p) => Ok(p.as_ptr()),
            None => Err(self.not_host()),
        }
    }

    fn bytes(&self, offset: usize, len: usize) -> Result<&[u8], BackendError> {
        if offset.checked_add(len).is_none_or(|e| e > self.len()) {
            return Err(BackendError::OutOfBounds {
                buffer: self.shared.buffer_type.name().to_owned(),
                offset,
                len,
                size: self.len(),
            });
        }
        let p = self.as_ptr()?;
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: in bounds (checked) of host memory; the buffer lock is held for the slice's
        // lifetime, so no other thread writes these bytes meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(p.add(offset), len) })
    }

    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self, offset: usize, len: usize) -> Result<&mut [u8], BackendError> {
        let p = self.as_mut_ptr()?;
        self.bytes(offset, len)?;
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: in bounds and writable (checked); the lock is held, and this private helper
        // never hands out two overlapping slices at once.
        Ok(unsafe { std::slice::from_raw_parts_mut(p.add(offset), len) })
    }
}

/// A byte range of a buffer (usually a tensor's memory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BufferSlice {
    pub buffer: Buffer,
    pub offset: usize,
    pub len: usize,
}

impl BufferSlice {
    /// The range `[offset, offset + len)` of `buffer`; an error if it does not fit.
    pub fn new(buffer: &Buffer, offset: usize, len: usize) -> Result<BufferSlice, BackendError> {
        buffer.check(offset, len)?;
        Ok(BufferSlice {
            buffer: buffer.clone(),
            offset,
            len,
        })
    }

    /// The whole buffer.
    pub fn whole(buffer: &Buffer) -> BufferSlice {
        BufferSlice {
            buffer: buffer.clone(),
            offset: 0,
            len: buffer.size(),
        }
    }

    /// The bytes of tensor `id` of `graph` (through its view source).
    pub fn of_tensor(graph: &Graph, id: TensorId) -> Result<BufferSlice, BackendError> {
        let t = graph.get(id)?;
        let unbound = || BackendError::Unbound(format!("{id} '{}'", t.name));
        let (memory, offset) = graph.resolve(id).ok_or_else(unbound)?;
        let buffer = Buffer::from_memory(memory).ok_or_else(unbound)?;
        BufferSlice::new(&buffer, offset, t.layout.span_bytes())
    }

    /// [`BufferSlice::of_tensor`] for device `device` (named `device_name`) about to run a node:
    /// the tensor must be bound to a buffer of that device, and lie inside it.
    pub fn of_tensor_on(
        graph: &Graph,
        id: TensorId,
        device: DeviceKey,
        device_name: &str,
    ) -> Result<BufferSlice, BackendError> {
        let t = graph.get(id)?;
        let unbound = || BackendError::Unbound(format!("{id} '{}' ({})", t.name, t.op.name()));
        let (memory, offset) = graph.resolve(id).ok_or_else(unbound)?;
        let buffer = Buffer::from_memory(memory).ok_or_else(unbound)?;
        if buffer.device() != device {
            return Err(BackendError::ForeignBuffer {
                buffer: buffer.name(),
                buffer_type: buffer.buffer_type().name().to_owned(),
                device: device_name.to_owned(),
            });
        }
        let span = t.layout.span_bytes();
        if offset.checked_add(span).is_none_or(|e| e > buffer.size()) {
            return Err(BackendError::OutOfBounds {
                buffer: buffer.name(),
                offset,
                len: span,
                size: buffer.size(),
            });
        }
        Ok(BufferSlice {
            buffer,
            offset,
            len: span,
        })
    }

    /// A sub-range of this slice.
    pub fn sub(&self, offset: usize, len: usize) -> Result<BufferSlice, BackendError> {
        if offset.checked_add(len).is_none_or(|e| e > self.len) {
            return Err(BackendError::OutOfBounds {
                buffer: self.buffer.name(),
                offset: self.offset.saturating_add(offset),
                len,
                size: self.offset + self.len,
            });
        }
        Ok(BufferSlice {
            buffer: self.buffer.clone(),
            offset: self.offset + offset,
            len,
        })
    }

    /// Blocking write of exactly `len` bytes.
    pub fn write(&self, data: &[u8]) -> Result<(), BackendError> {
        if data.len() != self.len {
            return Err(BackendError::SizeMismatch {
                what: "write",
                expected: self.len,
                actual: data.len(),
            });
        }
        self.buffer.write(self.offset, data)
    }

    /// Blocking read of the whole slice.
    pub fn read(&self) -> Result<Vec<u8>, BackendError> {
        let mut out = vec![0u8; self.len];
        self.buffer.read(self.offset, &mut out)?;
        Ok(out)
    }

    /// Blocking copy from `src` (same length).
    pub fn copy_from(&self, src: &BufferSlice) -> Result<(), BackendError> {
        if src.len != self.len {
            return Err(BackendError::SizeMismatch {
                what: "copy",
                expected: self.len,
                actual: src.len,
            });
        }
        self.buffer
            .copy_from(self.offset, &src.buffer, src.offset, self.len)
    }
}

/// Blocking write of `data` into tensor `id` at byte `offset` within the tensor.
pub fn tensor_set(
    graph: &Graph,
    id: TensorId,
    offset: usize,
    data: &[u8],
) -> Result<(), BackendError> {
    BufferSlice::of_tensor(graph, id)?
        .sub(offset, data.len())?
        .write(data)
}

/// Blocking read of `out.len()` bytes of tensor `id` from byte `offset` within the tensor.
pub fn tensor_get(
    graph: &Graph,
    id: TensorId,
    offset: usize,
    out: &mut [u8],
) -> Result<(), BackendError> {
    let s = BufferSlice::of_tensor(graph, id)?.sub(offset, out.len())?;
    s.buffer.read(s.offset, out)
}

fn contiguous_of(graph: &Graph, id: TensorId, dtype: DType) -> Result<(), BackendError> {
    let l = graph.get(id)?.layout;
    if l.dtype != dtype || !l.is_contiguous() {
        return Err(BackendError::Unsupported {
            device: "host".into(),
            what: format!(
                "typed access to tensor {id} ({}, non-contiguous or not {dtype})",
                l.dtype
            ),
        });
    }
    Ok(())
}

/// Blocking write of a whole contiguous f32 tensor.
pub fn tensor_set_f32(graph: &Graph, id: TensorId, data: &[f32]) -> Result<(), BackendError> {
    contiguous_of(graph, id, DType::F32)?;
    check_len(graph, id, data.len() * 4)?;
    tensor_set(graph, id, 0, &f32_to_bytes(data))
}

/// Blocking read of a whole contiguous f32 tensor.
pub fn tensor_get_f32(graph: &Graph, id: TensorId) -> Result<Vec<f32>, BackendError> {
    contiguous_of(graph, id, DType::F32)?;
    Ok(bytes_to_f32(&BufferSlice::of_tensor(graph, id)?.read()?))
}

/// Blocking write of a whole contiguous i32 tensor.
pub fn tensor_set_i32(graph: &Graph, id: TensorId, data: &[i32]) -> Result<(), BackendError> {
    contiguous_of(graph, id, DType::I32)?;
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    check_len(graph, id, bytes.len())?;
    tensor_set(graph, id, 0, &bytes)
}

fn check_len(graph: &Graph, id: TensorId, len: usize) -> Result<(), BackendError> {
    let need = graph.get(id)?.layout.span_bytes();
    if need != len {
        return Err(BackendError::SizeMismatch {
            what: "tensor data",
            expected: need,
            actual: len,
        });
    }
    Ok(())
}

/// Little-endian bytes of `v`.
pub fn f32_to_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// f32 values of little-endian bytes (trailing partial value ignored).
pub fn bytes_to_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}
