//! The device server of a rank other than the front: it owns the rank's devices, buffers and
//! events, and carries out the front's requests on them in the order they arrive. Requests that
//! wait (synchronize, a read, an event) are answered from other threads, so one device's wait
//! never holds up another's work.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::Receiver;

use lamina_backend::{
    BackendError, Buffer, BufferSlice, Device, Event, HostMemory, Stream, copy_async,
    copy_async_unfenced,
};
use lamina_core::graph::{Binding, Graph};
use sha2::{Digest, Sha256};

use crate::node::{Incoming, Node};
use crate::wire::{DeviceInfo, Reply, Request, SliceRef, WireTensor};

/// A model file this rank mapped itself.
struct MappedModel(lamina_gguf::GgufFile);

impl std::fmt::Debug for MappedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedModel({})", self.0.path().display())
    }
}

impl HostMemory for MappedModel {
    fn bytes(&self) -> &[u8] {
        self.0.bytes()
    }
    fn file(&self) -> Option<&std::path::Path> {
        Some(self.0.path())
    }
}

/// The SHA-256 of a GGUF file's header and tensor table (everything before the data), which
/// ranks compare before using their own copies.
pub fn header_sha256(bytes: &[u8]) -> Result<[u8; 32], String> {
    let gguf = lamina_gguf::Gguf::parse(bytes).map_err(|e| e.to_string())?;
    let end = usize::try_from(gguf.data_offset)
        .ok()
        .filter(|&e| e <= bytes.len())
        .ok_or("bad data offset")?;
    Ok(Sha256::digest(&bytes[..end]).into())
}

/// This rank's copy of the model file at `path`, checked against the front's size and header
/// hash.
fn open_model(rank: usize, path: &str, size: u64, want: [u8; 32]) -> Result<MappedModel, String> {
    let file = lamina_gguf::GgufFile::open(path)
        .map_err(|err| format!("rank {rank} cannot open its copy of {path}: {err}"))?;
    let got = header_sha256(file.bytes())?;
    if file.bytes().len() as u64 != size || got != want {
        return Err(format!(
            "rank {rank}'s copy of {path} differs from rank 0's ({} bytes against {size}, or \
             another header): every rank needs the same model file",
            file.bytes().len()
        ));
    }
    Ok(MappedModel(file))
}

pub struct Server {
    node: Arc<Node>,
    devices: Vec<Arc<dyn Device>>,
    streams: Vec<Stream>,
    buffers: HashMap<u64, Buffer>,
    /// Per buffer made by `Alloc`: its device and size. A peer's allocations on a device
    /// together stay within that device's memory, so a hostile or confused front cannot make
    /// this rank reserve more than the machine has.
    allocated: HashMap<u64, (u32, usize)>,
    events: HashMap<u64, Event>,
    /// Model files opened for `WriteFromFile`, and the (path, size, hash) each was opened as.
    files: HashMap<u64, Arc<MappedModel>>,
    file_ids: HashMap<(String, u64, [u8; 32]), u64>,
    next_id: u64,
    /// Per device, the first failure of a request nobody waits on; the next synchronize of
    /// that device reports it.
    failures: Vec<Option<String>>,
}

type Answer = Result<Option<Reply>, String>;

impl Server {
    pub fn new(node: Arc<Node>, devices: Vec<Arc<dyn Device>>) -> Server {
        let streams = devices.iter().map(|d| d.stream()).collect();
        let failures = vec![None; devices.len()];
        Server {
            node,
            devices,
            streams,
            buffers: HashMap::new(),
            allocated: HashMap::new(),
            events: HashMap::new(),
            files: HashMap::new(),
            file_ids: HashMap::new(),
            next_id: 1,
            failures,
        }
    }

    /// Serves until the front says `Shutdown` or goes away.
    pub fn run(mut self, requests: Receiver<Incoming>) {
        for (from, seq, request) in requests {
            let shutdown = matches!(request, Request::Shutdown);
            let device = request_device(&request);
            match self.handle(from, seq, request) {
                Ok(Some(reply)) => self.node.reply(from, seq, Ok(reply)),
                // Answered later, from another thread.
                Ok(None) => {}
                Err(e) if seq == 0 => {
                    let slot = device.and_then(|d| self.failures.get_mut(d as usize));
                    match slot {
                        Some(slot) => {
                            slot.get_or_insert(e);
                        }
                        None => self.node.fail(e),
                    }
                }
                Err(e) => self.node.reply(from, seq, Err(e)),
            }
            if shutdown {
                break;
            }
        }
        for s in &self.streams {
            let _ = s.synchronize();
        }
    }

    fn device(&self, d: u32) -> Result<(&Arc<dyn Device>, &Stream), String> {
        let i = d as usize;
        match (self.devices.get(i), self.streams.get(i)) {
            (Some(dev), Some(s)) => Ok((dev, s)),
            _ => Err(format!("no device {d}")),
        }
    }

    fn slice(&self, s: SliceRef) -> Result<BufferSlice, String> {
        let b = self
            .buffers
            .get(&s.buffer)
            .ok_or_else(|| format!("no buffer {}", s.buffer))?;
        BufferSlice::new(b, s.offset, s.len).map_err(|e| e.to_string())
    }

    fn keep_buffer(&mut self, b: Buffer) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.buffers.insert(id, b);
        id
    }

    fn event(&self, id: u64) -> Result<Event, String> {
        self.events
            .get(&id)
            .cloned()
            .ok_or_else(|| format!("no event {id}"))
    }

    /// Answers `reply` from a thread of its own once `wait` returns.
    fn answer_later(
        &self,
        from: usize,
        seq: u64,
        wait: impl FnOnce() -> Result<Reply, String> + Send + 'static,
    ) -> Answer {
        let node = Arc::downgrade(&self.node);
        self.node
            .spawn("lamina-rank-wait", move || {
                let reply = wait();
                if let Some(node) = node.upgrade() {
                    node.reply(from, seq, reply);
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(None)
    }

    fn handle(&mut self, from: usize, seq: u64, request: Request) -> Answer {
        let e = |e: BackendError| e.to_string();
        Ok(Some(match request {
            Request::Hello => Reply::Devices(self.devices.iter().map(|d| info(&**d)).collect()),
            Request::Shutdown => Reply::Unit,
            Request::Alloc { device, size } => {
                let (dev, _) = self.device(device)?;
                let total = dev.memory().total;
                let live: u64 = (self.allocated.values())
                    .filter(|(d, _)| *d == device)
                    .map(|&(_, n)| n as u64)
                    .sum();
                if total > 0 && live.saturating_add(size as u64) > total {
                    return Err(format!(
                        "allocating {size} bytes on {} would exceed its memory: \
                         {live} bytes allocated of {total}",
                        dev.name()
                    ));
                }
                let b = dev.buffer_type().alloc_buffer(size).map_err(e)?;
                let id = self.keep_buffer(b);
                self.allocated.insert(id, (device, size));
                Reply::Buffer(id)
            }
            Request::MapFile {
                device,
                path,
                size,
                header_sha256: want,
            } => {
                let file = open_model(self.node.rank(), &path, size, want)?;
                let (dev, _) = self.device(device)?;
                let b = dev.buffer_from_host_memory(Arc::new(file)).map_err(e)?;
                Reply::Buffer(self.keep_buffer(b))
            }
            Request::OpenFile {
                path,
                size,
                header_sha256: want,
            } => {
                let key = (path, size, want);
                if let Some(&id) = self.file_ids.get(&key) {
                    return Ok(Some(Reply::File(id)));
                }
                let file = open_model(self.node.rank(), &key.0, size, want)?;
                let id = self.next_id;
                self.next_id += 1;
                self.files.insert(id, Arc::new(file));
                self.file_ids.insert(key, id);
                Reply::File(id)
            }
            Request::WriteFromFile {
                slice,
                file,
                offset,
            } => {
                let s = self.slice(slice)?;
                let f = self.files.get(&file).ok_or(format!("no file {file}"))?;
                let memory: Arc<dyn HostMemory> = f.clone();
                s.buffer
                    .write_from_host_memory(s.offset, &memory, offset, s.len)
                    .map_err(e)?;
                Reply::Unit
            }
            Request::Free { buffer } => {
                self.buffers.remove(&buffer);
                self.allocated.remove(&buffer);
                Reply::Unit
            }
            Request::Write { slice, data } => {
                let s = self.slice(slice)?;
                s.write(&data).map_err(e)?;
                Reply::Unit
            }
            Request::Read { slice } => Reply::Data(self.slice(slice)?.read().map_err(e)?),
            Request::Fill { slice, value } => {
                let s = self.slice(slice)?;
                s.buffer.fill(s.offset, s.len, value).map_err(e)?;
                Reply::Unit
            }
            Request::Copy { src, dst } => {
                let (src, dst) = (self.slice(src)?, self.slice(dst)?);
                dst.copy_from(&src).map_err(e)?;
                Reply::Unit
            }
            Request::Compute {
                device,
                tensors,
                nodes,
            } => {
                let graph = self.graph(tensors)?;
                let (_, stream) = self.device(device)?;
                stream
                    .compute_nodes_async(Arc::new(graph), nodes.0..nodes.1)
                    .map_err(e)?;
                Reply::Unit
            }
            Request::SetAsync {
                device,
                slice,
                data,
            } => {
                let s = self.slice(slice)?;
                self.device(device)?.1.set_async(&s, data).map_err(e)?;
                Reply::Unit
            }
            Request::GetAsync { device, slice } => {
                let s = self.slice(slice)?;
                let node = self.node.clone();
                let stream = self.device(device)?.1.clone();
                self.node
                    .after_read(
                        &stream,
                        &s,
                        Box::new(move |data| {
                            node.reply(from, seq, data.map(Reply::Data).map_err(|e| e.to_string()))
                        }),
                    )
                    .map_err(e)?;
                return Ok(None);
            }
            Request::Synchronize { device } => {
                let stream = self.device(device)?.1.clone();
                let failed = self.failures[device as usize].take();
                let node = self.node.clone();
                return self.answer_later(from, seq, move || {
                    stream.synchronize().map_err(|e| e.to_string())?;
                    match failed.or_else(|| node.take_failure()) {
                        Some(f) => Err(f),
                        None => Ok(Reply::Unit),
                    }
                });
            }
            Request::NewEvent { device } => {
                let ev = self.device(device)?.0.new_event().map_err(e)?;
                let id = self.next_id;
                self.next_id += 1;
                self.events.insert(id, ev);
                Reply::Event(id)
            }
            Request::FreeEvent { event } => {
                self.events.remove(&event);
                Reply::Unit
            }
            Request::Record { device, event } => {
                let ev = self.event(event)?;
                self.device(device)?.1.record(&ev).map_err(e)?;
                Reply::Unit
            }
            Request::Wait { device, event } => {
                let ev = self.event(event)?;
                self.device(device)?.1.wait(&ev).map_err(e)?;
                Reply::Unit
            }
            Request::EventWait { event, value } => {
                let ev = self.event(event)?;
                return self.answer_later(from, seq, move || {
                    ev.wait_for(value)
                        .map(|()| Reply::Unit)
                        .map_err(|e| e.to_string())
                });
            }
            Request::EventQuery { event } => Reply::Bool(self.event(event)?.is_complete()),
            Request::SendTo {
                device,
                slice,
                to,
                tag,
            } => {
                let s = self.slice(slice)?;
                let stream = self.device(device)?.1.clone();
                self.node
                    .send_after(&stream, &s, to as usize, tag)
                    .map_err(e)?;
                Reply::Unit
            }
            Request::Expect { device, slice, tag } => {
                let s = self.slice(slice)?;
                let stream = self.device(device)?.1.clone();
                self.node.expect_into(&stream, &s, tag).map_err(e)?;
                Reply::Unit
            }
            Request::WaitSignal { device, tag } => {
                let stream = self.device(device)?.1.clone();
                self.node.expect_signal(&stream, tag).map_err(e)?;
                Reply::Unit
            }
            Request::SignalWhen {
                event,
                value,
                to,
                tag,
            } => {
                let ev = self.event(event)?;
                self.node
                    .signal_when(ev, value, to as usize, tag)
                    .map_err(e)?;
                Reply::Unit
            }
            Request::CopyAsync {
                src_device,
                dst_device,
                src,
                dst,
                fenced,
            } => {
                let (src, dst) = (self.slice(src)?, self.slice(dst)?);
                let from_stream = self.device(src_device)?.1;
                let to_stream = self.device(dst_device)?.1;
                if fenced {
                    copy_async(from_stream, to_stream, &src, &dst).map_err(e)?;
                } else {
                    copy_async_unfenced(from_stream, to_stream, &src, &dst).map_err(e)?;
                }
                Reply::Unit
            }
        }))
    }

    /// The graph the front sent, bound to this rank's buffers.
    fn graph(&self, tensors: Vec<WireTensor>) -> Result<Graph, String> {
        let mut out = Vec::with_capacity(tensors.len());
        for t in tensors {
            let binding = match t.binding {
                Some((id, offset)) => Some(Binding {
                    memory: self
                        .buffers
                        .get(&id)
                        .ok_or_else(|| format!("tensor '{}': no buffer {id}", t.name))?
                        .memory(),
                    offset,
                }),
                None => None,
            };
            out.push(t.into_tensor(binding));
        }
        Graph::from_tensors(out).map_err(|e| e.to_string())
    }
}

fn request_device(r: &Request) -> Option<u32> {
    match r {
        Request::Compute { device, .. }
        | Request::SetAsync { device, .. }
        | Request::Record { device, .. }
        | Request::Wait { device, .. }
        | Request::SendTo { device, .. }
        | Request::Expect { device, .. }
        | Request::WaitSignal { device, .. } => Some(*device),
        Request::CopyAsync { dst_device, .. } => Some(*dst_device),
        _ => None,
    }
}

fn info(d: &dyn Device) -> DeviceInfo {
    let m = d.memory();
    let bt = d.buffer_type();
    DeviceInfo {
        name: d.name().to_owned(),
        description: d.description().to_owned(),
        device_type: d.device_type().to_string(),
        device_id: d.device_id().to_owned(),
        free: m.free,
        total: m.total,
        alignment: bt.alignment(),
        max_size: bt.max_size(),
        maps_host_memory: d.caps().buffer_from_host_ptr,
    }
}
