//! The CPU device (one of N virtual devices) and its stream.

use std::any::Any;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use lamina_backend::{
    BackendError, Buffer, BufferSlice, BufferType, CommandQueue, Device, DeviceCaps, DeviceKey,
    DeviceType, Event, HOST_ALIGNMENT, HostMemory, MemoryInfo, PendingRead, QueuedCommand, Stream,
    StreamImpl,
};
use lamina_core::graph::{Graph, TensorId};

use crate::exec::{self, ExecState};
use crate::pool::WorkerPool;
use crate::supports_op;

/// One CPU device: its own buffer types, worker threads, queue and events.
#[derive(Debug)]
pub struct CpuDevice {
    key: DeviceKey,
    name: String,
    description: String,
    device_id: String,
    threads: usize,
    /// Number of devices sharing the machine's memory.
    memory_share: u64,
    buffer_type: BufferType,
    mapped_type: BufferType,
    stream: Stream,
}

impl CpuDevice {
    /// Device `index` of `count` (named `CPU` when alone, `CPU<index>` otherwise), computing on
    /// `threads` threads, asynchronous (own queue thread) or synchronous.
    pub fn new(
        index: usize,
        count: usize,
        threads: usize,
        asynchronous: bool,
    ) -> Result<CpuDevice, BackendError> {
        let key = DeviceKey::fresh();
        let name = if count == 1 {
            "CPU".to_owned()
        } else {
            format!("CPU{index}")
        };
        let mut description = crate::cpu_model_name();
        if count > 1 {
            description.push_str(&format!(" (dev p0/v{index})"));
        }
        let threads = threads.max(1);
        let stream_impl = CpuStream::new(key, &name, threads, asynchronous)?;
        Ok(CpuDevice {
            key,
            device_id: format!("cpu:0/v{index}"),
            description,
            threads,
            memory_share: count as u64,
            buffer_type: BufferType::new_host(key, &name, &name, HOST_ALIGNMENT),
            mapped_type: BufferType::new_mapped(key, &name, &format!("{name}_Mapped")),
            stream: Stream::new(Arc::new(stream_impl)),
            name,
        })
    }

    /// Worker threads of this device.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The buffer type of wrapped host memory (read-only weights).
    pub fn mapped_buffer_type(&self) -> &BufferType {
        &self.mapped_type
    }
}

impl Device for CpuDevice {
    fn key(&self) -> DeviceKey {
        self.key
    }
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        &self.description
    }
    fn device_type(&self) -> DeviceType {
        DeviceType::Cpu
    }
    fn device_id(&self) -> &str {
        &self.device_id
    }
    fn memory(&self) -> MemoryInfo {
        let m = crate::system_memory();
        let n = self.memory_share.max(1);
        MemoryInfo {
            free: m.free / n,
            total: m.total / n,
        }
    }
    fn caps(&self) -> DeviceCaps {
        let asynchronous = self.stream.is_async();
        DeviceCaps {
            async_ops: asynchronous,
            events: asynchronous,
            host_buffer: false,
            buffer_from_host_ptr: true,
        }
    }
    fn buffer_type(&self) -> BufferType {
        self.buffer_type.clone()
    }
    fn supports_buffer_type(&self, buffer_type: &BufferType) -> bool {
        *buffer_type == self.buffer_type || *buffer_type == self.mapped_type
    }
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        supports_op(graph, id)
    }
    fn stream(&self) -> Stream {
        self.stream.clone()
    }
    fn new_event(&self) -> Result<Event, BackendError> {
        if !self.stream.is_async() {
            return Err(BackendError::Unsupported {
                device: self.name.clone(),
                what: "events".into(),
            });
        }
        Ok(Event::new(self.key, &self.name))
    }
    fn buffer_from_host_memory(&self, memory: Arc<dyn HostMemory>) -> Result<Buffer, BackendError> {
        self.mapped_type.wrap_host_memory(memory)
    }
}

/// The in-order queue of one CPU device.
pub struct CpuStream {
    key: DeviceKey,
    name: String,
    queue: CommandQueue<ExecState, CpuCommand>,
    /// Fence recorded on this stream when it is the destination of a cross-device copy.
    ev_sync: Event,
    /// Signalled on this stream after the copies it performs as a copy source.
    ev_cpy: Event,
    /// The last graph ranges prepared, most recent last: a graph run again (the model reuses
    /// a micro-batch's graph while its shape holds) is not checked and located again.
    prepared: Mutex<Vec<Arc<exec::Prepared>>>,
}

/// Prepared graph ranges a stream keeps (a few graph shapes × copy slots).
const PREPARED_CACHE: usize = 8;

/// What a CPU queue runs. A plain enum, held by value in the queue's ring, so that steady-state
/// work (a token's inputs, graph, events and logits read) is queued without allocating.
pub(crate) enum CpuCommand {
    Compute(Arc<exec::Prepared>),
    Write {
        dst: BufferSlice,
        data: Vec<u8>,
    },
    Read {
        src: BufferSlice,
        into: PendingRead,
    },
    /// Waits for `fence` (if any), copies, then signals `done` (if any): one command, so the
    /// signal can never overtake the copy.
    Copy {
        src: BufferSlice,
        dst: BufferSlice,
        fence: Option<(Event, u64)>,
        done: Option<(Event, u64)>,
    },
    Signal(Event, u64),
    Wait(Event, u64),
}

impl QueuedCommand<ExecState> for CpuCommand {
    fn run(self, state: &mut ExecState) -> Result<(), BackendError> {
        match self {
            CpuCommand::Compute(prepared) => exec::execute(state, &prepared),
            CpuCommand::Write { dst, data } => dst.write(&data),
            CpuCommand::Read { src, into } => into.complete_from(&src),
            CpuCommand::Copy {
                src,
                dst,
                fence,
                done,
            } => lamina_backend::run_copy(&src, &dst, fence, done),
            CpuCommand::Signal(ev, v) => {
                ev.signal(v);
                Ok(())
            }
            CpuCommand::Wait(ev, v) => ev.wait_for(v),
        }
    }
}

impl lamina_backend::ProtocolCommand<ExecState> for CpuCommand {
    fn signal(event: Event, value: u64) -> CpuCommand {
        CpuCommand::Signal(event, value)
    }
    fn wait(event: Event, value: u64) -> CpuCommand {
        CpuCommand::Wait(event, value)
    }
    fn copy(
        src: BufferSlice,
        dst: BufferSlice,
        fence: Option<(Event, u64)>,
        done: Option<(Event, u64)>,
    ) -> CpuCommand {
        CpuCommand::Copy {
            src,
            dst,
            fence,
            done,
        }
    }
}

impl CpuStream {
    fn new(
        key: DeviceKey,
        name: &str,
        threads: usize,
        asynchronous: bool,
    ) -> Result<CpuStream, BackendError> {
        let pool_name = name.to_lowercase();
        let device_name = name.to_owned();
        let queue = if asynchronous {
            // The pool is created on the queue thread; a failure to spawn workers degrades to a
            // single-threaded pool rather than a dead queue.
            CommandQueue::threaded(name, move || {
                let pool = WorkerPool::new(&pool_name, threads).unwrap_or_else(|_| {
                    WorkerPool::new(&pool_name, 1).expect("one thread spawns nothing")
                });
                ExecState::new(pool, device_name)
            })?
        } else {
            let pool = WorkerPool::new(&pool_name, threads).map_err(|e| BackendError::Device {
                device: name.to_owned(),
                message: e.to_string(),
            })?;
            CommandQueue::inline(name, ExecState::new(pool, device_name))
        };
        Ok(CpuStream {
            key,
            name: name.to_owned(),
            queue,
            ev_sync: Event::new(key, name),
            ev_cpy: Event::new(key, name),
            prepared: Mutex::new(Vec::new()),
        })
    }
}

impl CpuStream {
    fn protocol(&self) -> lamina_backend::ProtocolQueue<'_, ExecState, CpuCommand> {
        lamina_backend::ProtocolQueue {
            queue: &self.queue,
            sync: &self.ev_sync,
            copied: &self.ev_cpy,
        }
    }

    /// A copy between CPU queues, by the seed's protocol ([`lamina_backend::protocol`]).
    fn copy(
        &self,
        src_stream: &Stream,
        src: &BufferSlice,
        dst: &BufferSlice,
        fenced: bool,
    ) -> Result<bool, BackendError> {
        let Some(src_impl) = src_stream
            .implementation()
            .as_any()
            .downcast_ref::<CpuStream>()
        else {
            return Ok(false);
        };
        if !self.queue.is_async() || !src_impl.queue.is_async() {
            return Ok(false);
        }
        lamina_backend::queue_copy(&src_impl.protocol(), &self.protocol(), src, dst, fenced)?;
        Ok(true)
    }
}

impl StreamImpl for CpuStream {
    fn device(&self) -> DeviceKey {
        self.key
    }
    fn device_name(&self) -> &str {
        &self.name
    }
    fn is_async(&self) -> bool {
        self.queue.is_async()
    }
    fn supports_events(&self) -> bool {
        self.queue.is_async()
    }

    fn compute_nodes_async(
        &self,
        graph: Arc<Graph>,
        nodes: Range<usize>,
    ) -> Result<(), BackendError> {
        let prepared = {
            let mut cache = self.prepared.lock().unwrap_or_else(|e| e.into_inner());
            match cache
                .iter()
                .position(|p| Arc::ptr_eq(&p.graph, &graph) && p.nodes == nodes)
            {
                // A graph is immutable once shared, so its checks and locations still hold.
                Some(i) => {
                    let p = cache.remove(i);
                    cache.push(p.clone());
                    p
                }
                None => {
                    let p = Arc::new(exec::prepare(graph, nodes, self.key, &self.name)?);
                    if cache.len() == PREPARED_CACHE {
                        cache.remove(0);
                    }
                    cache.push(p.clone());
                    p
                }
            }
        };
        self.queue.submit(CpuCommand::Compute(prepared))
    }

    fn set_async(&self, dst: BufferSlice, data: Vec<u8>) -> Result<(), BackendError> {
        self.queue.submit(CpuCommand::Write { dst, data })
    }

    /// A write into an idle queue is done at once, from the caller's memory: nothing queued
    /// could be ordered before it, and no staging copy is made. A token's inputs are written
    /// this way (the previous token's work is done), so they allocate nothing.
    fn set_async_from(&self, dst: BufferSlice, data: &[u8]) -> Result<(), BackendError> {
        match self.queue.run_if_idle(|| dst.write(data)) {
            Some(r) => r,
            None => self.set_async(dst, data.to_vec()),
        }
    }

    fn get_async(&self, src: BufferSlice, into: PendingRead) -> Result<(), BackendError> {
        self.queue.submit(CpuCommand::Read { src, into })
    }

    fn copy_async(
        &self,
        src_stream: &Stream,
        src: &BufferSlice,
        dst: &BufferSlice,
    ) -> Result<bool, BackendError> {
        self.copy(src_stream, src, dst, true)
    }

    fn copy_async_unfenced(
        &self,
        src_stream: &Stream,
        src: &BufferSlice,
        dst: &BufferSlice,
    ) -> Result<bool, BackendError> {
        self.copy(src_stream, src, dst, false)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.queue.synchronize()
    }

    fn record(&self, event: &Event) -> Result<(), BackendError> {
        lamina_backend::queue_record(&self.queue, event)
    }

    fn wait(&self, event: &Event) -> Result<(), BackendError> {
        lamina_backend::queue_wait(&self.queue, event)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
