//! The front's view of another rank's device: a [`Device`] whose buffers, stream and events
//! live on that rank and are reached by requests. Compute sends the rank the graph nodes to run
//! (bindings naming the rank's buffers); copies between ranks go from the source rank to the
//! destination rank directly, ordered on both streams, without a host wait on the front.

use std::any::Any;
use std::collections::HashMap;
use std::ops::Range;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lamina_backend::{
    BackendError, Buffer, BufferImpl, BufferSlice, BufferType, BufferTypeImpl, Device, DeviceCaps,
    DeviceKey, DeviceType, Event, EventImpl, HostMemory, MemoryInfo, PendingRead, Stream,
    StreamImpl,
};
use lamina_core::graph::{Graph, TensorId};

use crate::node::Node;
use crate::server::header_sha256;
use crate::wire::{DeviceInfo, Reply, Request, SliceRef, WireTensor};

/// Where a remote device is: its rank and its index there.
#[derive(Clone)]
struct At {
    node: Arc<Node>,
    rank: usize,
    device: u32,
    key: DeviceKey,
    name: String,
    /// Model files the rank has opened for weights (`OpenFile`), by path.
    files: Arc<Mutex<HashMap<PathBuf, u64>>>,
}

/// How the front names a model file to another rank: its path, size and header hash.
fn file_claim(memory: &Arc<dyn HostMemory>) -> Result<Option<(PathBuf, u64, [u8; 32])>, String> {
    let Some(path) = memory.file() else {
        return Ok(None);
    };
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let bytes = memory.bytes();
    Ok(Some((path, bytes.len() as u64, header_sha256(bytes)?)))
}

impl At {
    /// The rank's id of its own copy of `memory`'s file (opened and checked once).
    fn open_file(&self, memory: &Arc<dyn HostMemory>) -> Result<Option<u64>, BackendError> {
        let Some(path) = memory.file() else {
            return Ok(None);
        };
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = files.get(path) {
            return Ok(Some(id));
        }
        let unsupported = |what: String| BackendError::Unsupported {
            device: self.name.clone(),
            what,
        };
        let Some((canonical, size, header)) = file_claim(memory).map_err(unsupported)? else {
            return Ok(None);
        };
        match self.call(Request::OpenFile {
            path: canonical.to_string_lossy().into_owned(),
            size,
            header_sha256: header,
        })? {
            Reply::File(id) => {
                files.insert(path.to_path_buf(), id);
                Ok(Some(id))
            }
            other => Err(self.unexpected(other)),
        }
    }

    fn call(&self, request: Request) -> Result<Reply, BackendError> {
        self.node.call(self.rank, request)
    }
    fn post(&self, request: Request) -> Result<(), BackendError> {
        self.node.post(self.rank, request)
    }
    fn unexpected(&self, reply: Reply) -> BackendError {
        self.node.error(
            self.rank,
            format!("{}: unexpected reply {reply:?}", self.name),
        )
    }
}

pub struct RemoteDevice {
    at: At,
    description: String,
    device_type: DeviceType,
    device_id: String,
    memory: MemoryInfo,
    maps_host_memory: bool,
    buffer_type: BufferType,
    stream: Stream,
    /// Answers `supports_op` without asking the rank (the backend's rule for its devices).
    supports: OpSupport,
}

/// Which graph nodes a remote device can run, answered on the front.
pub type OpSupport = Arc<dyn Fn(&Graph, TensorId) -> bool + Send + Sync>;

/// The [`OpSupport`] of devices like `device` (a local device of the same backend).
pub fn supports_like(device: Arc<dyn Device>) -> OpSupport {
    Arc::new(move |graph, id| device.supports_op(graph, id))
}

impl std::fmt::Debug for RemoteDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteDevice({})", self.at.name)
    }
}

impl RemoteDevice {
    pub fn new(
        node: Arc<Node>,
        rank: usize,
        device: u32,
        info: DeviceInfo,
        supports: OpSupport,
    ) -> RemoteDevice {
        let at = At {
            node,
            rank,
            device,
            key: DeviceKey::fresh(),
            name: format!("{}@{rank}", info.name),
            files: Arc::default(),
        };
        let buffer_type = BufferType::new(Arc::new(RemoteBufferType {
            at: at.clone(),
            name: at.name.clone(),
            alignment: info.alignment,
            max_size: info.max_size,
        }));
        let stream = Stream::new(Arc::new(RemoteStream { at: at.clone() }));
        let device_type = match info.device_type.as_str() {
            "GPU" => DeviceType::Gpu,
            "IGPU" => DeviceType::IGpu,
            "ACCEL" => DeviceType::Accel,
            _ => DeviceType::Cpu,
        };
        RemoteDevice {
            description: format!("{} (rank {rank})", info.description),
            device_id: format!("rank{rank}/{}", info.device_id),
            memory: MemoryInfo {
                free: info.free,
                total: info.total,
            },
            maps_host_memory: info.maps_host_memory,
            device_type,
            buffer_type,
            stream,
            supports,
            at,
        }
    }

    pub fn rank(&self) -> usize {
        self.at.rank
    }
}

impl Device for RemoteDevice {
    fn key(&self) -> DeviceKey {
        self.at.key
    }
    fn name(&self) -> &str {
        &self.at.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn device_type(&self) -> DeviceType {
        self.device_type
    }
    fn device_id(&self) -> &str {
        &self.device_id
    }
    fn memory(&self) -> MemoryInfo {
        self.memory
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_ops: true,
            events: true,
            host_buffer: false,
            buffer_from_host_ptr: self.maps_host_memory,
        }
    }
    fn buffer_type(&self) -> BufferType {
        self.buffer_type.clone()
    }
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        (self.supports)(graph, id)
    }
    fn stream(&self) -> Stream {
        self.stream.clone()
    }
    fn new_event(&self) -> Result<Event, BackendError> {
        match self.at.call(Request::NewEvent {
            device: self.at.device,
        })? {
            Reply::Event(id) => Ok(Event::from_impl(Arc::new(RemoteEvent {
                at: self.at.clone(),
                id,
                recorded: AtomicU64::new(0),
                reached: AtomicU64::new(0),
            }))),
            other => Err(self.at.unexpected(other)),
        }
    }
    /// Only a whole model file: the rank maps its own copy (checked against this one).
    fn buffer_from_host_memory(&self, memory: Arc<dyn HostMemory>) -> Result<Buffer, BackendError> {
        self.buffer_type.wrap_host_memory(memory)
    }
}

#[derive(Debug)]
struct RemoteBufferType {
    at: At,
    name: String,
    alignment: usize,
    max_size: usize,
}

impl std::fmt::Debug for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)
    }
}

impl BufferTypeImpl for RemoteBufferType {
    fn name(&self) -> &str {
        &self.name
    }
    fn device(&self) -> DeviceKey {
        self.at.key
    }
    fn device_name(&self) -> &str {
        &self.at.name
    }
    fn alignment(&self) -> usize {
        self.alignment
    }
    fn max_size(&self) -> usize {
        self.max_size
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn BufferImpl>, BackendError> {
        match self.at.call(Request::Alloc {
            device: self.at.device,
            size,
        })? {
            Reply::Buffer(id) => Ok(Box::new(RemoteBuffer {
                at: self.at.clone(),
                id,
                size,
                read_only: false,
            })),
            other => Err(self.at.unexpected(other)),
        }
    }
    fn wrap_host_memory(
        &self,
        memory: Arc<dyn HostMemory>,
    ) -> Result<Box<dyn BufferImpl>, BackendError> {
        let unsupported = |what: &str| BackendError::Unsupported {
            device: self.at.name.clone(),
            what: what.into(),
        };
        let (path, size, header) = file_claim(&memory)
            .map_err(|e| unsupported(&e))?
            .ok_or_else(|| unsupported("host memory that is not a model file"))?;
        match self.at.call(Request::MapFile {
            device: self.at.device,
            path: path.to_string_lossy().into_owned(),
            size,
            header_sha256: header,
        })? {
            Reply::Buffer(id) => Ok(Box::new(RemoteBuffer {
                at: self.at.clone(),
                id,
                size: memory.bytes().len(),
                read_only: true,
            })),
            other => Err(self.at.unexpected(other)),
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A buffer on another rank, named there by `id`.
struct RemoteBuffer {
    at: At,
    id: u64,
    size: usize,
    read_only: bool,
}

impl Drop for RemoteBuffer {
    fn drop(&mut self) {
        let _ = self.at.post(Request::Free { buffer: self.id });
    }
}

impl RemoteBuffer {
    fn slice(&self, offset: usize, len: usize) -> SliceRef {
        SliceRef {
            buffer: self.id,
            offset,
            len,
        }
    }
}

impl BufferImpl for RemoteBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn is_read_only(&self) -> bool {
        self.read_only
    }
    fn host_ptr(&self) -> Option<NonNull<u8>> {
        None
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<(), BackendError> {
        self.at
            .call(Request::Write {
                slice: self.slice(offset, data.len()),
                data: data.to_vec(),
            })
            .map(drop)
    }
    /// A weight of a model file: the rank reads its own copy, so weights stay local.
    fn write_from_host_memory(
        &self,
        offset: usize,
        memory: &Arc<dyn HostMemory>,
        src: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        match self.at.open_file(memory)? {
            Some(file) => self
                .at
                .call(Request::WriteFromFile {
                    slice: self.slice(offset, len),
                    file,
                    offset: src,
                })
                .map(drop),
            None => self.write(offset, &memory.bytes()[src..src + len]),
        }
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<(), BackendError> {
        match self.at.call(Request::Read {
            slice: self.slice(offset, out.len()),
        })? {
            Reply::Data(d) if d.len() == out.len() => {
                out.copy_from_slice(&d);
                Ok(())
            }
            other => Err(self.at.unexpected(other)),
        }
    }
    fn fill(&self, offset: usize, len: usize, value: u8) -> Result<(), BackendError> {
        self.at
            .call(Request::Fill {
                slice: self.slice(offset, len),
                value,
            })
            .map(drop)
    }
    fn copy_from(
        &self,
        dst_offset: usize,
        src: &dyn BufferImpl,
        src_offset: usize,
        len: usize,
    ) -> Result<bool, BackendError> {
        let Some(src) = src.as_any().downcast_ref::<RemoteBuffer>() else {
            return Ok(false);
        };
        if src.at.rank != self.at.rank {
            return Ok(false);
        }
        self.at
            .call(Request::Copy {
                src: src.slice(src_offset, len),
                dst: self.slice(dst_offset, len),
            })
            .map(|_| true)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The remote buffer behind `slice`, if it is one.
fn remote_slice(slice: &BufferSlice) -> Option<(&RemoteBuffer, SliceRef)> {
    let b = slice
        .buffer
        .implementation()
        .as_any()
        .downcast_ref::<RemoteBuffer>()?;
    Some((b, b.slice(slice.offset, slice.len)))
}

struct RemoteStream {
    at: At,
}

impl RemoteStream {
    fn own_slice(&self, slice: &BufferSlice) -> Result<SliceRef, BackendError> {
        match remote_slice(slice) {
            Some((b, s)) if b.at.key == self.at.key => Ok(s),
            _ => Err(BackendError::ForeignBuffer {
                buffer: slice.buffer.name(),
                buffer_type: slice.buffer.buffer_type().name().to_owned(),
                device: self.at.name.clone(),
            }),
        }
    }

    /// The tensors the rank needs to run `nodes`: those nodes, everything they read, and the
    /// roots those alias; the other tensors go as unbound leaves (they keep their ids).
    fn wire_graph(
        &self,
        graph: &Graph,
        nodes: &Range<usize>,
    ) -> Result<Vec<WireTensor>, BackendError> {
        // Sources can come after their node (the scheduler's copies are appended).
        let end = graph.len();
        let tensors = graph.tensors();
        let mut needed = vec![false; end];
        let mut stack: Vec<usize> = (nodes.start..nodes.end.min(end)).collect();
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut needed[i], true) {
                continue;
            }
            let t = &tensors[i];
            stack.extend(t.sources().map(|s| s.index()).filter(|&s| s < end));
            stack.extend(t.view_src.map(|s| s.index()).filter(|&s| s < end));
        }
        let mut out = Vec::with_capacity(end);
        for (i, t) in tensors.iter().enumerate() {
            let binding = match (&t.binding, needed[i]) {
                (Some(b), true) => {
                    let buffer = Buffer::from_memory(&b.memory)
                        .ok_or_else(|| BackendError::Unbound(t.name.clone()))?;
                    Some((
                        self.own_slice(&BufferSlice::whole(&buffer))?.buffer,
                        b.offset,
                    ))
                }
                _ => None,
            };
            out.push(if needed[i] {
                WireTensor::from_tensor(t, binding)
            } else {
                WireTensor::placeholder(t)
            });
        }
        Ok(out)
    }
}

/// The remote stream behind `stream`, if it is one.
fn remote_stream(stream: &Stream) -> Option<&RemoteStream> {
    stream
        .implementation()
        .as_any()
        .downcast_ref::<RemoteStream>()
}

impl StreamImpl for RemoteStream {
    fn device(&self) -> DeviceKey {
        self.at.key
    }
    fn device_name(&self) -> &str {
        &self.at.name
    }
    fn is_async(&self) -> bool {
        true
    }
    fn supports_events(&self) -> bool {
        true
    }
    fn compute_nodes_async(
        &self,
        graph: Arc<Graph>,
        nodes: Range<usize>,
    ) -> Result<(), BackendError> {
        let tensors = self.wire_graph(&graph, &nodes)?;
        self.at.post(Request::Compute {
            device: self.at.device,
            tensors,
            nodes: (nodes.start, nodes.end),
        })
    }
    fn set_async(&self, dst: BufferSlice, data: Vec<u8>) -> Result<(), BackendError> {
        let slice = self.own_slice(&dst)?;
        self.at.post(Request::SetAsync {
            device: self.at.device,
            slice,
            data,
        })
    }
    fn get_async(&self, src: BufferSlice, into: PendingRead) -> Result<(), BackendError> {
        let slice = self.own_slice(&src)?;
        self.at.node.call_read(
            self.at.rank,
            Request::GetAsync {
                device: self.at.device,
                slice,
            },
            into,
        )
    }
    fn copy_async(
        &self,
        src_stream: &Stream,
        src: &BufferSlice,
        dst: &BufferSlice,
    ) -> Result<bool, BackendError> {
        let dst_ref = self.own_slice(dst)?;
        let from = remote_stream(src_stream);
        // Two devices of one rank: that rank's own copy.
        if let Some(from) = from.filter(|f| f.at.rank == self.at.rank) {
            self.at.post(Request::CopyAsync {
                src_device: from.at.device,
                dst_device: self.at.device,
                src: from.own_slice(src)?,
                dst: dst_ref,
                fenced: true,
            })?;
            return Ok(true);
        }
        let tag = self.at.node.new_tag();
        self.at.post(Request::Expect {
            device: self.at.device,
            slice: dst_ref,
            tag,
        })?;
        match from {
            // Another rank: straight from there to here.
            Some(from) => from.at.post(Request::SendTo {
                device: from.at.device,
                slice: from.own_slice(src)?,
                to: self.at.rank as u32,
                tag,
            })?,
            // A device of this process.
            None => self
                .at
                .node
                .send_after(src_stream, src, self.at.rank, tag)?,
        }
        Ok(true)
    }
    fn copy_async_to(
        &self,
        dst_stream: &Stream,
        src: &BufferSlice,
        dst: &BufferSlice,
        _fenced: bool,
    ) -> Result<bool, BackendError> {
        if remote_stream(dst_stream).is_some() {
            return Ok(false);
        }
        // To a device of this process: it waits for the data in its own queue order.
        let tag = self.at.node.new_tag();
        self.at.node.expect_into(dst_stream, dst, tag)?;
        self.at.post(Request::SendTo {
            device: self.at.device,
            slice: self.own_slice(src)?,
            to: self.at.node.rank() as u32,
            tag,
        })?;
        Ok(true)
    }
    fn synchronize(&self) -> Result<(), BackendError> {
        self.at.call(Request::Synchronize {
            device: self.at.device,
        })?;
        match self.at.node.take_failure() {
            Some(f) => Err(self.at.node.error(self.at.node.rank(), f)),
            None => Ok(()),
        }
    }
    fn record(&self, event: &Event) -> Result<(), BackendError> {
        let ev = remote_event(event).ok_or_else(|| BackendError::ForeignEvent {
            event_device: event.device_name().to_owned(),
            stream_device: self.at.name.clone(),
        })?;
        event
            .record_with(|_| {
                self.at.post(Request::Record {
                    device: self.at.device,
                    event: ev.id,
                })
            })
            .map(drop)
    }
    fn wait(&self, event: &Event) -> Result<(), BackendError> {
        match remote_event(event) {
            Some(ev) if ev.at.rank == self.at.rank => self.at.post(Request::Wait {
                device: self.at.device,
                event: ev.id,
            }),
            // An event of another process: the process that owns it signals this rank when
            // it is reached, and this rank's queue waits for the signal. No host waits.
            other => {
                let value = event.target();
                if value == 0 || other.is_some_and(|ev| ev.reached.load(Ordering::Acquire) >= value)
                {
                    return Ok(());
                }
                let tag = self.at.node.new_tag();
                self.at.post(Request::WaitSignal {
                    device: self.at.device,
                    tag,
                })?;
                let to = self.at.rank;
                match other {
                    Some(ev) => ev.at.post(Request::SignalWhen {
                        event: ev.id,
                        value,
                        to: to as u32,
                        tag,
                    }),
                    None => self.at.node.signal_when(event.clone(), value, to, tag),
                }
            }
        }
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

fn remote_event(event: &Event) -> Option<&RemoteEvent> {
    event
        .implementation()
        .as_any()
        .downcast_ref::<RemoteEvent>()
}

/// An event of another rank. The front numbers its records (a rank's records arrive and run
/// in order, so its own count agrees); waits ask the rank.
#[derive(Debug)]
struct RemoteEvent {
    at: At,
    id: u64,
    recorded: AtomicU64,
    /// The highest value known reached (asked, or signalled here after a failed record).
    reached: AtomicU64,
}

static RECORD_LOCK: Mutex<()> = Mutex::new(());

impl Drop for RemoteEvent {
    fn drop(&mut self) {
        let _ = self.at.post(Request::FreeEvent { event: self.id });
    }
}

impl EventImpl for RemoteEvent {
    fn device(&self) -> DeviceKey {
        self.at.key
    }
    fn device_name(&self) -> &str {
        &self.at.name
    }
    fn record_with(
        &self,
        enqueue: &mut dyn FnMut(u64) -> Result<(), BackendError>,
    ) -> Result<u64, BackendError> {
        let _order = RECORD_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let v = self.recorded.load(Ordering::Acquire) + 1;
        enqueue(v)?;
        self.recorded.store(v, Ordering::Release);
        Ok(v)
    }
    fn target(&self) -> u64 {
        self.recorded.load(Ordering::Acquire)
    }
    fn signal(&self, v: u64) {
        self.reached.fetch_max(v, Ordering::AcqRel);
    }
    fn wait_for(&self, v: u64) -> Result<(), BackendError> {
        if self.reached.load(Ordering::Acquire) >= v {
            return Ok(());
        }
        self.at.call(Request::EventWait {
            event: self.id,
            value: v,
        })?;
        self.reached.fetch_max(v, Ordering::AcqRel);
        Ok(())
    }
    fn is_complete(&self) -> bool {
        let v = self.target();
        self.reached.load(Ordering::Acquire) >= v
            || matches!(
                self.at.call(Request::EventQuery { event: self.id }),
                Ok(Reply::Bool(true))
            )
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
