//! Streams: one in-order queue per device, with ggml-backend's ordering rules.
//!
//! Devices implement [`StreamImpl`]; callers use the [`Stream`] handle, which adds the generic
//! parts: ownership and size checks, and the fallbacks for devices without an async path
//! (synchronize the stream first, then do the blocking transfer, so the transfer can never
//! overtake queued work).

use std::any::Any;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use lamina_core::graph::Graph;

use crate::buffer::{BufferSlice, bytes_to_f32};
use crate::device::DeviceKey;
use crate::error::BackendError;
use crate::event::Event;

/// The device side of a stream. `set_async`, `get_async`, `record` and `wait` are called only
/// when [`StreamImpl::is_async`] / [`StreamImpl::supports_events`] say so, with slices already
/// checked to belong to this device.
pub trait StreamImpl: Send + Sync + Any {
    fn device(&self) -> DeviceKey;
    fn device_name(&self) -> &str;
    /// Whether queued operations return before the work is done.
    fn is_async(&self) -> bool;
    fn supports_events(&self) -> bool;
    /// Queues a graph; every tensor must be bound to memory this device accepts.
    fn compute_async(&self, graph: Arc<Graph>) -> Result<(), BackendError> {
        let n = graph.len();
        self.compute_nodes_async(graph, 0..n)
    }
    /// Queues the compute nodes of `graph` whose index is in `nodes` (one split of a scheduled
    /// graph); every tensor those nodes touch must be bound to memory this device accepts.
    fn compute_nodes_async(
        &self,
        graph: Arc<Graph>,
        nodes: Range<usize>,
    ) -> Result<(), BackendError>;
    fn set_async(&self, dst: BufferSlice, data: Vec<u8>) -> Result<(), BackendError>;
    /// [`StreamImpl::set_async`] from borrowed data; a stream that recycles its staging
    /// buffers overrides it to copy without allocating.
    fn set_async_from(&self, dst: BufferSlice, data: &[u8]) -> Result<(), BackendError> {
        self.set_async(dst, data.to_vec())
    }
    /// Reads `src` into `into` (see [`PendingRead::complete_from`]) after the queued work.
    fn get_async(&self, src: BufferSlice, into: PendingRead) -> Result<(), BackendError>;
    /// Called on the *destination* stream. Queues `src → dst` after everything queued on
    /// `src_stream` (and on this stream), such that later work here waits for it, without
    /// blocking the host. Returns `Ok(false)` to decline (foreign stream types).
    fn copy_async(
        &self,
        src_stream: &Stream,
        src: &BufferSlice,
        dst: &BufferSlice,
    ) -> Result<bool, BackendError>;
    /// As [`StreamImpl::copy_async`], but the caller has already ordered the copy after every
    /// reader of `dst` on this stream (the scheduler's per-copy-slot events), so the copy need
    /// only follow `src_stream`'s work and need not wait for this stream's queue to drain.
    /// Defaults to the fenced copy, which is always correct.
    fn copy_async_unfenced(
        &self,
        src_stream: &Stream,
        src: &BufferSlice,
        dst: &BufferSlice,
    ) -> Result<bool, BackendError> {
        self.copy_async(src_stream, src, dst)
    }
    /// Called on the *source* stream when the destination stream declined
    /// [`StreamImpl::copy_async`] (a device that knows how to reach other streams, such as one
    /// in another process, offers the copy from its side). Same contract; `fenced` as in
    /// [`copy_async`] / [`copy_async_unfenced`]. Defaults to declining.
    fn copy_async_to(
        &self,
        dst_stream: &Stream,
        src: &BufferSlice,
        dst: &BufferSlice,
        fenced: bool,
    ) -> Result<bool, BackendError> {
        let _ = (dst_stream, src, dst, fenced);
        Ok(false)
    }
    fn synchronize(&self) -> Result<(), BackendError>;
    fn record(&self, event: &Event) -> Result<(), BackendError>;
    fn wait(&self, event: &Event) -> Result<(), BackendError>;
    fn as_any(&self) -> &dyn Any;
}

/// Result of an asynchronous read; ready once the stream has run the read. A caller that reads
/// again and again (one read per generated token) keeps one and passes it to
/// [`Stream::get_async_into`]: its byte buffer is then reused, and reads allocate nothing.
#[derive(Clone, Default)]
pub struct PendingRead(Arc<(Mutex<ReadSlot>, Condvar)>);

#[derive(Default)]
struct ReadSlot {
    /// `None` while the read is queued; the read's outcome once it ran.
    status: Option<Result<(), BackendError>>,
    data: Vec<u8>,
}

impl fmt::Debug for PendingRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PendingRead(ready: {})", self.is_ready())
    }
}

impl PendingRead {
    pub fn new() -> PendingRead {
        PendingRead::default()
    }

    fn slot(&self) -> MutexGuard<'_, ReadSlot> {
        self.0.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks the read queued again (for a reused `PendingRead`).
    fn reset(&self) {
        self.slot().status = None;
    }

    /// Device side: delivers the data.
    pub fn complete(&self, result: Result<Vec<u8>, BackendError>) {
        let mut slot = self.slot();
        slot.status = Some(result.map(|data| slot.data = data));
        drop(slot);
        self.0.1.notify_all();
    }

    /// Device side: reads `src` into the kept buffer (no allocation once it is big enough);
    /// returns the read's status.
    pub fn complete_from(&self, src: &BufferSlice) -> Result<(), BackendError> {
        let mut slot = self.slot();
        let slot = &mut *slot;
        slot.data.clear();
        slot.data.resize(src.len, 0);
        let r = src.buffer.read(src.offset, &mut slot.data);
        slot.status = Some(r.clone());
        self.0.1.notify_all();
        r
    }

    pub fn is_ready(&self) -> bool {
        self.slot().status.is_some()
    }

    fn wait_slot(&self) -> Result<MutexGuard<'_, ReadSlot>, BackendError> {
        crate::wait::wait_until(
            &self.0.1,
            self.slot(),
            |s| s.status.is_some(),
            |_| 0,
            || "a device read to arrive".to_string(),
        )
    }

    /// Blocks until the read has run (the data stays, for a `wait` later).
    pub fn wait_ready(&self) -> Result<(), BackendError> {
        self.wait_slot().map(drop)
    }

    /// Blocks until the data arrived and takes it.
    pub fn wait(&self) -> Result<Vec<u8>, BackendError> {
        let mut slot = self.wait_slot()?;
        slot.status.take().expect("waited for")?;
        Ok(std::mem::take(&mut slot.data))
    }

    /// [`PendingRead::wait`], as little-endian f32 values.
    pub fn wait_f32(&self) -> Result<Vec<f32>, BackendError> {
        self.wait().map(|b| bytes_to_f32(&b))
    }

    /// [`PendingRead::wait_f32`], appending at most `max` values to `out`; the read's buffer
    /// is kept for the next read into this `PendingRead` unless it is large (a prompt's worth
    /// of logits), which would otherwise stay allocated between batches.
    pub fn wait_f32_into(&self, out: &mut Vec<f32>, max: usize) -> Result<(), BackendError> {
        const KEEP_MAX_BYTES: usize = 8 << 20;
        let mut slot = self.wait_slot()?;
        slot.status.take().expect("waited for")?;
        out.extend(
            slot.data
                .chunks_exact(4)
                .take(max)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
        );
        if slot.data.capacity() > KEEP_MAX_BYTES {
            slot.data = Vec::new();
        }
        Ok(())
    }
}

/// A device's execution stream. Cheap to clone (clones are the same queue).
#[derive(Clone)]
pub struct Stream(Arc<dyn StreamImpl>);

impl fmt::Debug for Stream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Stream({})", self.0.device_name())
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Stream) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Stream {
    pub fn new(implementation: Arc<dyn StreamImpl>) -> Stream {
        Stream(implementation)
    }

    /// The device implementation (for downcasting by backends).
    pub fn implementation(&self) -> &dyn StreamImpl {
        &*self.0
    }

    pub fn device(&self) -> DeviceKey {
        self.0.device()
    }

    pub fn device_name(&self) -> &str {
        self.0.device_name()
    }

    pub fn is_async(&self) -> bool {
        self.0.is_async()
    }

    fn check_owned(&self, slice: &BufferSlice) -> Result<(), BackendError> {
        if slice.buffer.device() != self.device() {
            return Err(BackendError::ForeignBuffer {
                buffer: slice.buffer.name(),
                buffer_type: slice.buffer.buffer_type().name().to_owned(),
                device: self.device_name().to_owned(),
            });
        }
        Ok(())
    }

    /// Queues `graph`; may return before it is computed.
    pub fn compute_async(&self, graph: Arc<Graph>) -> Result<(), BackendError> {
        self.0.compute_async(graph)
    }

    /// Queues the compute nodes of `graph` with an index in `nodes`.
    pub fn compute_nodes_async(
        &self,
        graph: Arc<Graph>,
        nodes: Range<usize>,
    ) -> Result<(), BackendError> {
        self.0.compute_nodes_async(graph, nodes)
    }

    /// Computes `graph` and waits for it.
    pub fn compute(&self, graph: Arc<Graph>) -> Result<(), BackendError> {
        self.0.compute_async(graph)?;
        self.0.synchronize()
    }

    /// Writes `data` into `dst` after all queued work. Without an async path: synchronize, then
    /// write.
    pub fn set_async(&self, dst: &BufferSlice, data: Vec<u8>) -> Result<(), BackendError> {
        self.check_set(dst, data.len())?;
        if self.0.is_async() {
            self.0.set_async(dst.clone(), data)
        } else {
            self.0.synchronize()?;
            dst.write(&data)
        }
    }

    /// [`Stream::set_async`] from borrowed data (copied into a staging buffer the stream may
    /// recycle, so that per-token inputs are written without allocating).
    pub fn set_async_from(&self, dst: &BufferSlice, data: &[u8]) -> Result<(), BackendError> {
        self.check_set(dst, data.len())?;
        if self.0.is_async() {
            self.0.set_async_from(dst.clone(), data)
        } else {
            self.0.synchronize()?;
            dst.write(data)
        }
    }

    fn check_set(&self, dst: &BufferSlice, len: usize) -> Result<(), BackendError> {
        self.check_owned(dst)?;
        if len != dst.len {
            return Err(BackendError::SizeMismatch {
                what: "set_async",
                expected: dst.len,
                actual: len,
            });
        }
        Ok(())
    }

    /// Reads `src` after all queued work. Without an async path: synchronize, then read.
    pub fn get_async(&self, src: &BufferSlice) -> Result<PendingRead, BackendError> {
        let pending = PendingRead::new();
        self.get_async_into(src, &pending)?;
        Ok(pending)
    }

    /// [`Stream::get_async`] into a `PendingRead` the caller keeps (and reuses: its buffer is
    /// recycled). A read still queued into `into` must have been waited for first.
    pub fn get_async_into(
        &self,
        src: &BufferSlice,
        into: &PendingRead,
    ) -> Result<(), BackendError> {
        self.check_owned(src)?;
        into.reset();
        if self.0.is_async() {
            self.0.get_async(src.clone(), into.clone())
        } else {
            self.0.synchronize()?;
            // The outcome is delivered through `into`.
            let _ = into.complete_from(src);
            Ok(())
        }
    }

    /// Blocks until all queued work is done; reports the first error since the last call.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        self.0.synchronize()
    }

    /// Queues a signal of `event` (which must belong to this stream's device).
    pub fn record(&self, event: &Event) -> Result<(), BackendError> {
        if event.device() != self.device() {
            return Err(BackendError::ForeignEvent {
                event_device: event.device_name().to_owned(),
                stream_device: self.device_name().to_owned(),
            });
        }
        self.require_events()?;
        self.0.record(event)
    }

    /// Makes later work on this stream wait for the latest record of `event` (of any device);
    /// the host does not block.
    pub fn wait(&self, event: &Event) -> Result<(), BackendError> {
        self.require_events()?;
        self.0.wait(event)
    }

    fn require_events(&self) -> Result<(), BackendError> {
        if !self.0.supports_events() {
            return Err(BackendError::Unsupported {
                device: self.device_name().to_owned(),
                what: "events".into(),
            });
        }
        Ok(())
    }
}

/// Copies `src` (memory of `src_stream`'s device) to `dst` (memory of `dst_stream`'s device),
/// after all work queued on `src_stream`; later work on `dst_stream` sees the data. Dispatched
/// through the destination stream; if it declines, both streams are synchronized and the copy
/// is done blocking.
pub fn copy_async(
    src_stream: &Stream,
    dst_stream: &Stream,
    src: &BufferSlice,
    dst: &BufferSlice,
) -> Result<(), BackendError> {
    copy_async_impl(src_stream, dst_stream, src, dst, true)
}

/// [`copy_async`] for a caller that has itself ordered the copy after every earlier reader of
/// `dst` on `dst_stream` (by making `src_stream` wait for an event recorded after them): the copy
/// then waits only for `src_stream`'s work. Falls back like [`copy_async`].
pub fn copy_async_unfenced(
    src_stream: &Stream,
    dst_stream: &Stream,
    src: &BufferSlice,
    dst: &BufferSlice,
) -> Result<(), BackendError> {
    copy_async_impl(src_stream, dst_stream, src, dst, false)
}

fn copy_async_impl(
    src_stream: &Stream,
    dst_stream: &Stream,
    src: &BufferSlice,
    dst: &BufferSlice,
    fenced: bool,
) -> Result<(), BackendError> {
    src_stream.check_owned(src)?;
    dst_stream.check_owned(dst)?;
    if src.len != dst.len {
        return Err(BackendError::SizeMismatch {
            what: "copy_async",
            expected: dst.len,
            actual: src.len,
        });
    }
    let queued = if fenced {
        dst_stream.0.copy_async(src_stream, src, dst)?
    } else {
        dst_stream.0.copy_async_unfenced(src_stream, src, dst)?
    };
    if queued || src_stream.0.copy_async_to(dst_stream, src, dst, fenced)? {
        return Ok(());
    }
    src_stream.synchronize()?;
    dst_stream.synchronize()?;
    dst.copy_from(src)
}
