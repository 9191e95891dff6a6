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
            } => lamina_backend::run_copy(&src, &dst, fence, done),
            GpuCommand::Signal(ev, v) => {
                ev.signal(v);
                Ok(())
            }
            GpuCommand::Wait(ev, v) => ev.wait_for(v),
        }
    }
}

impl lamina_backend::ProtocolCommand<GpuState> for GpuCommand {
    fn signal(event: Event, value: u64) -> GpuCommand {
        GpuCommand::Signal(event, value)
    }
    fn wait(event: Event, value: u64) -> GpuCommand {
        GpuCommand::Wait(event, value)
    }
    fn copy(
        src: BufferSlice,
        dst: BufferSlice,
        fence: Option<(Event, u64)>,
        done: Option<(Event, u64)>,
    ) -> GpuCommand {
        GpuCommand::Copy {
            src,
            dst,
            fence,
            done,
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

    fn protocol(&self) -> lamina_backend::ProtocolQueue<'_, GpuState, GpuCommand> {
        lamina_backend::ProtocolQueue {
            queue: &self.queue,
            sync: &self.ev_sync,
            copied: &self.ev_cpy,
        }
    }

    /// A copy from another virtual device of the same adapter, on the GPU, by the seed's
    /// protocol ([`lamina_backend::protocol`]).
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
        lamina_backend::queue_copy(&src_impl.protocol(), &self.protocol(), src, dst, fenced)?;
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
        lamina_backend::queue_record(&self.queue, event)
    }
    fn wait(&self, event: &Event) -> Result<(), BackendError> {
        lamina_backend::queue_wait(&self.queue, event)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
