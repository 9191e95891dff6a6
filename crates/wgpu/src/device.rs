//! A virtual GPU device (`WGPU0` …) and its stream: one in-order queue thread per device,
//! submitting to the adapter's wgpu queue, with events signalled when submissions complete.

use std::any::Any;
use std::ops::Range;
use std::sync::Arc;

use lamina_backend::{
    BackendError, Buffer, BufferSlice, BufferType, CommandQueue, Device, DeviceCaps, DeviceKey,
    DeviceType, Event, HostMemory, MemoryInfo, PendingRead, QueuedCommand, Stream, StreamImpl,
};
use lamina_core::graph::{Graph, TensorId};

use crate::exec;
use crate::gpu::Gpu;
use crate::memory::{WgpuBuffer, WgpuBufferType};

/// One (virtual) device of an adapter: its own buffer type, queue thread and events.
#[derive(Debug)]
pub struct WgpuDevice {
    key: DeviceKey,
    name: String,
    description: String,
    device_id: String,
    device_type: DeviceType,
    gpu: Arc<Gpu>,
    /// Number of virtual devices sharing the adapter's memory.
    memory_share: u64,
    buffer_type: BufferType,
    stream: Stream,
}

impl WgpuDevice {
    pub(crate) fn new(
        gpu: Arc<Gpu>,
        adapter: usize,
        index: usize,
        count: usize,
    ) -> Result<WgpuDevice, BackendError> {
        let key = DeviceKey::fresh();
        let name = format!("WGPU{index}");
        let mut description = gpu.info.name.clone();
        if count > 1 {
            description.push_str(&format!(" (dev p{adapter}/v{index})"));
        }
        let device_type = match gpu.info.device_type {
            wgpu::DeviceType::DiscreteGpu => DeviceType::Gpu,
            wgpu::DeviceType::IntegratedGpu => DeviceType::IGpu,
            // A software rasterizer (lavapipe) or virtual GPU: listed, never preferred over
            // the CPU backend.
            _ => DeviceType::Accel,
        };
        let stream = WgpuStream::new(gpu.clone(), key, &name)?;
        Ok(WgpuDevice {
            key,
            device_id: format!("wgpu:{adapter}/v{index}"),
            description,
            device_type,
            memory_share: count as u64,
            buffer_type: BufferType::new(Arc::new(WgpuBufferType {
                gpu: gpu.clone(),
                device: key,
                name: name.clone(),
            })),
            stream: Stream::new(Arc::new(stream)),
            gpu,
            name,
        })
    }

    /// The adapter's driver and backend, for `lamina devices`.
    pub fn driver(&self) -> String {
        let i = &self.gpu.info;
        let info = if i.driver_info.is_empty() {
            String::new()
        } else {
            format!(" ({})", i.driver_info)
        };
        format!("{:?}, {}{info}", i.backend, i.driver)
    }
}

impl Device for WgpuDevice {
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
        self.device_type
    }
    fn device_id(&self) -> &str {
        &self.device_id
    }
    fn memory(&self) -> MemoryInfo {
        // wgpu does not report free memory; the largest buffer is the honest lower bound, and
        // a software adapter uses system memory.
        let total = self.gpu.limits.max_buffer_size / self.memory_share.max(1);
        MemoryInfo { free: total, total }
    }
    fn caps(&self) -> DeviceCaps {
        DeviceCaps {
            async_ops: true,
            events: true,
            host_buffer: false,
            buffer_from_host_ptr: false,
        }
    }
    fn buffer_type(&self) -> BufferType {
        self.buffer_type.clone()
    }
    fn supports_buffer_type(&self, buffer_type: &BufferType) -> bool {
        *buffer_type == self.buffer_type
    }
    fn supports_op(&self, graph: &Graph, id: TensorId) -> bool {
        exec::supports_op(graph, id)
    }
    fn stream(&self) -> Stream {
        self.stream.clone()
    }
    fn new_event(&self) -> Result<Event, BackendError> {
        Ok(Event::new(self.key, &self.name))
    }
    fn buffer_from_host_memory(&self, memory: Arc<dyn HostMemory>) -> Result<Buffer, BackendError> {
        drop(memory);
        Err(BackendError::Unsupported {
            device: self.name.clone(),
            what: "host memory (weights are uploaded)".into(),
        })
    }
}

/// What a device's queue thread runs.
pub(crate) enum GpuCommand {
    Compute(Arc<Graph>, Range<usize>),
    Write {
        dst: BufferSlice,
        data: Vec<u8>,
    },
    Read {
        src: BufferSlice,
        into: PendingRead,
    },
    /// Waits for `fence` (if any), copies, then signals `done` (if any), as one command.
    Copy {
        src: BufferSlice,
        dst: BufferSlice,
        fence: Option<(Event, u64)>,
        done: Option<(Event, u64)>,
    },
    Signal(Event, u64),
    Wait(Event, u64),
}

/// The queue thread's state.
pub(crate) struct GpuState {
    gpu: Arc<Gpu>,
    name: String,
}

impl QueuedCommand<GpuState> for GpuCommand {
    fn run(self, state: &mut GpuState) -> Result<(), BackendError> {
        match self {
            GpuCommand::Compute(graph, nodes) => {
                exec::execute(&state.gpu, &state.name, &graph, nodes)
            }
            GpuCommand::Write { dst, data } => dst.write(&data),
            GpuCommand::Read { src, into } => into.complete_from(&src),
            GpuCommand::Copy {
                src,
                dst,
                fence,
                done,
            } => {
                let fenced = fence.map_or(Ok(()), |(ev, v)| ev.wait_for(v));
                let r = fenced.and_then(|()| dst.copy_from(&src));
                if let Some((ev, v)) = done {
                    ev.signal(v);
                }
                r
            }
            GpuCommand::Signal(ev, v) => {
                ev.signal(v);
                Ok(())
            }
            GpuCommand::Wait(ev, v) => ev.wait_for(v),
        }
    }
}

/// The in-order queue of one virtual GPU device. Every command waits for its own submission
/// before the next starts, so an event signalled after a command means its GPU work is done.
pub struct WgpuStream {
    key: DeviceKey,
    name: String,
    queue: CommandQueue<GpuState, GpuCommand>,
    ev_sync: Event,
    ev_cpy: Event,
}

impl WgpuStream {
    fn new(gpu: Arc<Gpu>, key: DeviceKey, name: &str) -> Result<WgpuStream, BackendError> {
        let state_name = name.to_owned();
        let queue = CommandQueue::threaded(name, move || GpuState {
            gpu,
            name: state_name,
        })?;
        Ok(WgpuStream {
            key,
            name: name.to_owned(),
            queue,
            ev_sync: Event::new(key, name),
            ev_cpy: Event::new(key, name),
        })
    }

    /// A copy from another virtual device of an adapter, by the seed's protocol (as between
    /// CPU devices): a fence behind the destination's work, one command on the source queue
    /// that waits for it, copies on the GPU and signals, and a wait on the destination.
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
            .downcast_ref::<WgpuStream>()
        else {
            return Ok(false);
        };
        let same_gpu = match (
            src.buffer
                .implementation()
                .as_any()
                .downcast_ref::<WgpuBuffer>(),
            dst.buffer
                .implementation()
                .as_any()
                .downcast_ref::<WgpuBuffer>(),
        ) {
            (Some(s), Some(d)) => Arc::ptr_eq(&s.gpu, &d.gpu),
            _ => false,
        };
        if !same_gpu {
            return Ok(false);
        }
        let (src, dst) = (src.clone(), dst.clone());
        if std::ptr::eq(src_impl, self) {
            self.queue.submit(GpuCommand::Copy {
                src,
                dst,
                fence: None,
                done: None,
            })?;
            return Ok(true);
        }
        let fence = if fenced {
            let fence_ev = &self.ev_sync;
            let v = fence_ev
                .record_with(|v| self.queue.submit(GpuCommand::Signal(fence_ev.clone(), v)))?;
            Some((fence_ev.clone(), v))
        } else {
            None
        };
        let done_ev = &src_impl.ev_cpy;
        let mut parts = Some((src, dst, fence));
        let done = done_ev.record_with(|v| {
            // Called exactly once; the `None` arm only satisfies the type.
            let Some((src, dst, fence)) = parts.take() else {
                return Ok(());
            };
            src_impl.queue.submit(GpuCommand::Copy {
                src,
                dst,
                fence,
                done: Some((done_ev.clone(), v)),
            })
        })?;
        self.queue.submit(GpuCommand::Wait(done_ev.clone(), done))?;
        Ok(true)
    }
}

impl StreamImpl for WgpuStream {
    fn device(&self) -> DeviceKey {
        self.key
    }
    fn device_name(&self) -> &str {
        &self.name
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
        exec::check(&graph, nodes.clone(), self.key, &self.name)?;
        self.queue.submit(GpuCommand::Compute(graph, nodes))
    }
    fn set_async(&self, dst: BufferSlice, data: Vec<u8>) -> Result<(), BackendError> {
        self.queue.submit(GpuCommand::Write { dst, data })
    }
    fn get_async(&self, src: BufferSlice, into: PendingRead) -> Result<(), BackendError> {
        self.queue.submit(GpuCommand::Read { src, into })
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
        event
            .record_with(|v| {
                let r = self.queue.submit(GpuCommand::Signal(event.clone(), v));
                if r.is_err() {
                    // Never leave a reserved value unsignalled: waiters would hang.
                    event.signal(v);
                }
                r
            })
            .map(drop)
    }
    fn wait(&self, event: &Event) -> Result<(), BackendError> {
        self.queue
            .submit(GpuCommand::Wait(event.clone(), event.target()))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
