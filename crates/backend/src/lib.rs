//! `lamina-backend` owns the device layer, in ggml-backend's image: a [`Registry`] of backends
//! and their [`Device`]s; per device, [`BufferType`]s (compared by identity, named after the
//! device), [`Buffer`]s with bounds-checked blocking access, one in-order [`Stream`] (graph
//! compute, async set/get/copy, synchronize) and [`Event`]s (record, device-side wait, host
//! synchronize). Memory and events are interfaces a backend implements ([`BufferTypeImpl`],
//! [`BufferImpl`], [`EventImpl`]; host memory and [`TimelineEvent`] are the ones host devices
//! share), so device memory the host cannot address fits as well as host memory. Also here: the
//! generic async fallbacks; the [`CommandQueue`] that host-memory devices
//! build their streams on; the [`GraphAllocator`] that places a graph's intermediates; and the
//! [`Scheduler`] that runs one graph over several devices (placement, splits, copies with
//! events, pipeline parallelism). Concrete devices (the CPU in `lamina-cpu`) implement the traits.

pub mod alloc;
pub mod buffer;
pub mod device;
pub mod error;
pub mod event;
pub mod protocol;
pub mod queue;
pub mod sched;
pub mod stream;
pub mod wait;

pub use alloc::{AllocPlan, GraphAllocator, plan_graph, plan_graph_where};
pub use buffer::{
    Buffer, BufferGuard, BufferImpl, BufferSlice, BufferType, BufferTypeImpl, BufferUsage,
    HOST_ALIGNMENT, HostMemory, WeakBuffer, bytes_to_f32, f32_to_bytes, tensor_get, tensor_get_f32,
    tensor_set, tensor_set_f32, tensor_set_i32,
};
pub use device::{BackendReg, Device, DeviceCaps, DeviceKey, DeviceType, MemoryInfo, Registry};
pub use error::BackendError;
pub use event::{Event, EventImpl, TimelineEvent};
pub use protocol::{
    ProtocolCommand, ProtocolQueue, queue_copy, queue_record, queue_wait, run_copy,
};
pub use queue::{Command, CommandQueue, QueuedCommand};
pub use sched::{
    Assignment, DeviceHint, PIPELINE_COPIES, ScheduledGraph, Scheduler, Split, SplitCopy,
    assign_devices, split_graph,
};
pub use stream::{PendingRead, Stream, StreamImpl, copy_async, copy_async_unfenced};
pub use wait::{set_wait_bound, wait_bound};
