//! The scheduler: runs one graph over several devices, as ggml-backend's `ggml_backend_sched`.
//!
//! Scheduling a graph is four explicit passes, each testable on its own:
//! 1. **Placement** ([`assign_devices`]): every bound root (weights, KV cache) is on the device
//!    owning its buffer; a compute node that writes into a bound tensor (a cache store) runs
//!    there; a node that reads a bound tensor runs on that tensor's device (weights and caches
//!    never move); otherwise the caller's hint for that part of the graph decides (the model
//!    says "these nodes are layer 7's"); otherwise the node follows the previous node. There is
//!    no neighbour-expansion heuristic to second-guess: what is not pinned by memory is placed by
//!    the one who knows the model. Last, a node its device cannot run (`supports_op`) moves to
//!    a device that can, the CPU first, and the copies of pass 3 carry its operands and result.
//! 2. **Splits**: maximal runs of consecutive compute nodes on one device.
//! 3. **Copies**: every tensor a split reads from another device gets a copy leaf in that
//!    device's copy buffer, and the split's nodes are rewritten to read the copy (views are
//!    rebuilt on it). Graph inputs are never copied between devices: the host writes each input
//!    straight into every device that reads it ([`Scheduler::set_input`]).
//! 4. **Allocation**: each device's intermediates go into that device's compute buffer (one
//!    [`GraphAllocator`] per device, sized once by [`Scheduler::reserve`] for the worst case);
//!    tensors another device copies from stay live for the whole graph.
//!
//! **Running** ([`Scheduler::compute_async`]): per split, its copies are queued, then its nodes,
//! then an event is recorded. Activation copies go through [`copy_async_unfenced`]: the source
//! stream first waits (device side) for the destination's event of the copy slot in use, which
//! was recorded after the last split that read that slot, so the copy can neither overwrite data
//! still being read nor make the host wait.
//!
//! **Pipeline parallelism**: with several devices that all have async streams and events, the
//! scheduler cycles through [`PIPELINE_COPIES`] copy slots (per device, a copy buffer and an
//! event each), so micro-batch k+1 can be copied into a device while it still computes
//! micro-batch k, and a caller that submits several micro-batches before synchronizing keeps
//! every device busy. Compute buffers need no slots: each device's queue is in order.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use lamina_core::graph::{Graph, Op, TensorId};
use lamina_core::tensor::TensorFlags;

use crate::alloc::GraphAllocator;
use crate::buffer::{Buffer, BufferSlice, BufferUsage};
use crate::device::{Device, DeviceType};
use crate::error::BackendError;
use crate::event::Event;
use crate::stream::{PendingRead, Stream, copy_async, copy_async_unfenced};

/// Copy slots used for pipeline parallelism (llama.cpp's `GGML_SCHED_MAX_COPIES`).
pub const PIPELINE_COPIES: usize = 4;

/// "Nodes from `start` on belong to device `device`", until the next hint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceHint {
    pub start: TensorId,
    pub device: usize,
}

/// Where each tensor of a graph lives or runs (index into the scheduler's devices). `None` for
/// graph inputs (delivered to every device that reads them) and for tensors nothing uses.
pub type Assignment = Vec<Option<usize>>;

fn bound_device(
    graph: &Graph,
    id: TensorId,
    devices: &[Arc<dyn Device>],
    cache: &mut HashMap<u64, usize>,
) -> Result<Option<usize>, BackendError> {
    let t = graph.tensor(id);
    let Some(binding) = t.binding.as_ref() else {
        return Ok(None);
    };
    let mid = binding.memory.memory_id();
    if let Some(&d) = cache.get(&mid) {
        return Ok(Some(d));
    }
    let foreign = |name: String, buffer_type: String| BackendError::ForeignBuffer {
        buffer: name,
        buffer_type,
        device: devices
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join(","),
    };
    let buffer = Buffer::from_memory(&binding.memory)
        .ok_or_else(|| foreign(format!("of tensor {id} '{}'", t.name), "unknown".into()))?;
    let d = devices
        .iter()
        .position(|d| d.key() == buffer.device())
        .ok_or_else(|| foreign(buffer.name(), buffer.buffer_type().name().to_owned()))?;
    cache.insert(mid, d);
    Ok(Some(d))
}

/// Pass 1, placement: the device of every bound root, compute node and view of `graph` (see the
/// module doc for the rules, in order). `hints` must be sorted by `start`.
pub fn assign_devices(
    graph: &Graph,
    devices: &[Arc<dyn Device>],
    hints: &[DeviceHint],
) -> Result<Assignment, BackendError> {
    if devices.is_empty() {
        return Err(BackendError::Unsupported {
            device: "scheduler".into(),
            what: "a graph without devices".into(),
        });
    }
    if let Some(h) = hints.iter().find(|h| h.device >= devices.len()) {
        return Err(BackendError::Unsupported {
            device: "scheduler".into(),
            what: format!("device hint {} of {} devices", h.device, devices.len()),
        });
    }
    let n = graph.len();
    let mut dev: Assignment = vec![None; n];
    let mut cache = HashMap::new();
    for id in graph.ids() {
        if graph.tensor(id).view_src.is_none() {
            dev[id.index()] = bound_device(graph, id, devices, &mut cache)?;
        }
    }
    let hint_at = |id: TensorId| {
        let i = hints.partition_point(|h| h.start <= id);
        (i > 0).then(|| hints[i - 1].device)
    };
    let mut previous = None;
    let mut first_unplaced = Vec::new();
    for id in graph.ids() {
        let t = graph.tensor(id);
        if !t.op.is_compute() {
            continue;
        }
        let bound_src = || {
            t.sources().find_map(|s| {
                let r = graph.root(s);
                let rt = graph.tensor(r);
                (rt.binding.is_some() && !rt.op.is_compute())
                    .then(|| dev[r.index()])
                    .flatten()
            })
        };
        let d = t
            .view_src
            .and_then(|root| dev[root.index()])
            .or_else(bound_src)
            .or_else(|| hint_at(id))
            .or(previous);
        match d {
            Some(d) => {
                dev[id.index()] = Some(d);
                previous = Some(d);
            }
            None => first_unplaced.push(id),
        }
    }
    // Nodes before anything placed them follow the first placed node (or the first device).
    let first = graph
        .ids()
        .find_map(|id| {
            graph
                .tensor(id)
                .op
                .is_compute()
                .then(|| dev[id.index()])
                .flatten()
        })
        .unwrap_or(0);
    for id in first_unplaced {
        dev[id.index()] = Some(first);
    }
    // A node its device cannot run goes to one that can, as in `ggml_backend_sched`: the splits
    // then copy what it reads there and its result back.
    for id in graph.ids() {
        if let Some(d) = dev[id.index()]
            && graph.tensor(id).op.is_compute()
            && !devices[d].supports_op(graph, id)
        {
            dev[id.index()] = Some(fallback_device(graph, id, devices, d)?);
        }
    }
    // Unbound leaves that are not inputs (constants the caller fills) live with their first reader.
    for id in graph.ids() {
        let t = graph.tensor(id);
        if t.op.is_compute() {
            for s in t.sources() {
                let r = graph.root(s);
                let rt = graph.tensor(r);
                if !rt.op.is_compute()
                    && rt.binding.is_none()
                    && !rt.flags.contains(TensorFlags::INPUT)
                    && dev[r.index()].is_none()
                {
                    dev[r.index()] = dev[id.index()];
                }
            }
        }
    }
    for id in graph.ids() {
        if let Some(root) = graph.tensor(id).view_src
            && !graph.tensor(id).op.is_compute()
        {
            dev[id.index()] = dev[root.index()];
        }
    }
    Ok(dev)
}

/// The device for node `id` that `devices[preferred]` cannot run: one that can run it and, for
/// a node that writes into bound memory (a cache store), can use that memory; the CPU first,
/// the host being the fallback of every backend.
fn fallback_device(
    graph: &Graph,
    id: TensorId,
    devices: &[Arc<dyn Device>],
    preferred: usize,
) -> Result<usize, BackendError> {
    let t = graph.tensor(id);
    let written = t
        .view_src
        .map(|root| graph.tensor(root))
        .and_then(|r| r.binding.as_ref())
        .and_then(|b| Buffer::from_memory(&b.memory));
    let usable = |d: &Arc<dyn Device>| {
        d.supports_op(graph, id)
            && written
                .as_ref()
                .is_none_or(|b| d.supports_buffer_type(b.buffer_type()))
    };
    let cpu_first = devices
        .iter()
        .enumerate()
        .filter(|(_, d)| d.device_type() == DeviceType::Cpu)
        .chain(devices.iter().enumerate());
    for (i, d) in cpu_first {
        if usable(d) {
            return Ok(i);
        }
    }
    Err(BackendError::Unsupported {
        device: devices[preferred].name().to_owned(),
        what: format!(
            "node {id} ({} '{}'), and no other device of {} can run it",
            t.op.name(),
            t.name,
            devices
                .iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(",")
        ),
    })
}

/// A tensor a split reads from elsewhere, and the leaf it reads instead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitCopy {
    /// The original root (on `src_device`, or a graph input written by the host).
    pub from: TensorId,
    /// Its copy on the split's device.
    pub to: TensorId,
    /// `None` for graph inputs.
    pub src_device: Option<usize>,
}

/// Consecutive compute nodes run by one device, and the copies they need first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    pub device: usize,
    /// Indices of the graph's tensors this split covers (its compute nodes run in order).
    pub nodes: Range<usize>,
    pub copies: Vec<SplitCopy>,
}

/// Passes 2 and 3: cuts `graph` into splits and rewrites every cross-device read to read a new
/// copy leaf (and views of it). Returns the splits and the assignment extended to the new leaves.
pub fn split_graph(
    graph: &mut Graph,
    mut dev: Assignment,
) -> Result<(Vec<Split>, Assignment), BackendError> {
    if dev.len() != graph.len() {
        return Err(BackendError::Unsupported {
            device: "scheduler".into(),
            what: "an assignment of another graph".into(),
        });
    }
    let mut splits: Vec<Split> = Vec::new();
    for (i, t) in graph.tensors().iter().enumerate() {
        if !t.op.is_compute() {
            continue;
        }
        let d = dev[i].ok_or_else(|| {
            BackendError::Unbound(format!("node {i} ({}) is on no device", t.op.name()))
        })?;
        match splits.last_mut() {
            Some(s) if s.device == d => s.nodes.end = i + 1,
            _ => splits.push(Split {
                device: d,
                nodes: i..i + 1,
                copies: Vec::new(),
            }),
        }
    }
    // (root, device) → copy leaf; (view, device) → view of the copy.
    let mut root_copies: HashMap<(TensorId, usize), TensorId> = HashMap::new();
    let mut view_copies: HashMap<(TensorId, usize), TensorId> = HashMap::new();
    let ids: Vec<TensorId> = graph.ids().collect();
    for split in &mut splits {
        let d = split.device;
        for i in split.nodes.clone() {
            let t = graph.tensors()[i].clone();
            if !t.op.is_compute() {
                continue;
            }
            let node = ids[i];
            for (k, s) in t.src.iter().enumerate() {
                let Some(s) = *s else { continue };
                if t.op == Op::Cpy && k == 1 {
                    continue; // the destination operand: written, on this device by placement
                }
                let r = graph.root(s);
                let rt = graph.tensor(r);
                let is_input = rt.flags.contains(TensorFlags::INPUT) && rt.binding.is_none();
                let src_device = dev[r.index()];
                if !is_input && src_device == Some(d) {
                    continue;
                }
                if !is_input && src_device.is_none() {
                    return Err(BackendError::Unbound(format!(
                        "{r} '{}' read by {node} ({}) is on no device",
                        rt.name,
                        t.op.name()
                    )));
                }
                let copy = match root_copies.get(&(r, d)) {
                    Some(&c) => c,
                    None => {
                        let c = graph.new_leaf_like(r, &format!("#copy{d}"))?;
                        dev.push(Some(d));
                        root_copies.insert((r, d), c);
                        split.copies.push(SplitCopy {
                            from: r,
                            to: c,
                            src_device: if is_input { None } else { src_device },
                        });
                        c
                    }
                };
                let replacement = if s == r {
                    copy
                } else {
                    match view_copies.get(&(s, d)) {
                        Some(&v) => v,
                        None => {
                            let v = graph.view_onto(s, copy)?;
                            dev.push(Some(d));
                            view_copies.insert((s, d), v);
                            v
                        }
                    }
                };
                graph.replace_source(node, s, replacement)?;
            }
        }
    }
    Ok((splits, dev))
}

/// A graph placed, split, rewritten and allocated, ready for [`Scheduler::compute_async`].
#[derive(Debug)]
pub struct ScheduledGraph {
    graph: Arc<Graph>,
    splits: Vec<Split>,
    assignment: Assignment,
    slot: usize,
}

impl ScheduledGraph {
    pub fn graph(&self) -> &Arc<Graph> {
        &self.graph
    }

    pub fn splits(&self) -> &[Split] {
        &self.splits
    }

    /// The device each tensor is on (see [`Assignment`]).
    pub fn assignment(&self) -> &Assignment {
        &self.assignment
    }

    /// The copy slot this graph uses.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// Copies between devices (graph inputs excluded).
    pub fn n_copies(&self) -> usize {
        self.splits
            .iter()
            .flat_map(|s| &s.copies)
            .filter(|c| c.src_device.is_some())
            .count()
    }

    /// Bytes copied between devices per run.
    pub fn copy_bytes(&self) -> usize {
        self.splits
            .iter()
            .flat_map(|s| &s.copies)
            .filter(|c| c.src_device.is_some())
            .map(|c| self.graph.tensor(c.from).layout.span_bytes())
            .sum()
    }

    /// Checks that every tensor each split's nodes compute or read is in memory of the split's
    /// own device: no device ever reads another's buffer without a copy.
    pub fn check_residency(&self, devices: &[Arc<dyn Device>]) -> Result<(), BackendError> {
        let g = &self.graph;
        let ids: Vec<TensorId> = g.ids().collect();
        for split in &self.splits {
            let device = &devices[split.device];
            for i in split.nodes.clone() {
                let id = ids[i];
                let t = g.tensor(id);
                if !t.op.is_compute() {
                    continue;
                }
                for x in std::iter::once(id).chain(t.sources()) {
                    let (memory, _) = g
                        .resolve(x)
                        .ok_or_else(|| BackendError::Unbound(x.to_string()))?;
                    let buffer = Buffer::from_memory(memory)
                        .ok_or_else(|| BackendError::Unbound(x.to_string()))?;
                    if buffer.device() != device.key() {
                        return Err(BackendError::ForeignBuffer {
                            buffer: buffer.name(),
                            buffer_type: buffer.buffer_type().name().to_owned(),
                            device: device.name().to_owned(),
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// Runs graphs over a fixed list of devices (see the module doc).
pub struct Scheduler {
    devices: Vec<Arc<dyn Device>>,
    streams: Vec<Stream>,
    allocators: Vec<GraphAllocator>,
    /// `[slot][device]`: the buffer holding that device's copies in that slot.
    copy_buffers: Vec<Vec<Option<Buffer>>>,
    /// `[slot][device]`: recorded after each split of that device using that slot.
    events: Vec<Vec<Option<Event>>>,
    next_slot: usize,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field(
                "devices",
                &self.devices.iter().map(|d| d.name()).collect::<Vec<_>>(),
            )
            .field("copy_slots", &self.copy_buffers.len())
            .finish()
    }
}

impl Scheduler {
    /// A scheduler over `devices` (in priority order). `pipeline` asks for pipeline parallelism;
    /// it is granted when there are several devices and all have async streams and events.
    pub fn new(devices: Vec<Arc<dyn Device>>, pipeline: bool) -> Result<Scheduler, BackendError> {
        if devices.is_empty() {
            return Err(BackendError::Unsupported {
                device: "scheduler".into(),
                what: "an empty device list".into(),
            });
        }
        let all_async = devices.iter().all(|d| {
            let c = d.caps();
            c.async_ops && c.events
        });
        let n_slots = if pipeline && devices.len() > 1 && all_async {
            PIPELINE_COPIES
        } else {
            1
        };
        let mut events = Vec::with_capacity(n_slots);
        for _ in 0..n_slots {
            let mut row = Vec::with_capacity(devices.len());
            for d in &devices {
                row.push(if d.caps().events && devices.len() > 1 {
                    Some(d.new_event()?)
                } else {
                    None
                });
            }
            events.push(row);
        }
        Ok(Scheduler {
            streams: devices.iter().map(|d| d.stream()).collect(),
            allocators: devices
                .iter()
                .map(|d| GraphAllocator::new(d.buffer_type()))
                .collect(),
            copy_buffers: vec![vec![None; devices.len()]; n_slots],
            events,
            devices,
            next_slot: 0,
        })
    }

    pub fn devices(&self) -> &[Arc<dyn Device>] {
        &self.devices
    }

    /// Copy slots in rotation: [`PIPELINE_COPIES`] with pipeline parallelism, else 1.
    pub fn n_slots(&self) -> usize {
        self.copy_buffers.len()
    }

    pub fn pipeline_parallel(&self) -> bool {
        self.n_slots() > 1
    }

    /// Bytes of each device's compute buffer and of its copy buffers (all slots).
    pub fn buffer_sizes(&self) -> Vec<(usize, usize)> {
        (0..self.devices.len())
            .map(|d| {
                let compute = self.allocators[d].buffer().map_or(0, |b| b.size());
                let copies = self
                    .copy_buffers
                    .iter()
                    .map(|row| row[d].as_ref().map_or(0, |b| b.size()))
                    .sum();
                (compute, copies)
            })
            .collect()
    }

    /// Passes 1–3 on `graph`, plus the layout of each device's copy leaves:
    /// `(splits, assignment, per device: [(copy leaf, offset)] and total size)`.
    #[allow(clippy::type_complexity)]
    fn plan(
        &self,
        graph: &mut Graph,
        hints: &[DeviceHint],
    ) -> Result<(Vec<Split>, Assignment, Vec<(Vec<(TensorId, usize)>, usize)>), BackendError> {
        let dev = assign_devices(graph, &self.devices, hints)?;
        let (splits, dev) = split_graph(graph, dev)?;
        let mut layout = vec![(Vec::new(), 0usize); self.devices.len()];
        for split in &splits {
            let bt = self.devices[split.device].buffer_type();
            let align = bt.alignment();
            let (leaves, end) = &mut layout[split.device];
            for c in &split.copies {
                let size = bt.alloc_size(&graph.tensor(c.to).layout);
                let off = end.next_multiple_of(align);
                leaves.push((c.to, off));
                *end = off + size.next_multiple_of(align);
            }
        }
        Ok((splits, dev, layout))
    }

    fn keep_alive(splits: &[Split], n: usize) -> Vec<bool> {
        let mut keep = vec![false; n];
        for c in splits.iter().flat_map(|s| &s.copies) {
            if c.src_device.is_some() {
                keep[c.from.index()] = true;
            }
        }
        keep
    }

    fn ensure_copy_buffer(
        &mut self,
        slot: usize,
        d: usize,
        size: usize,
    ) -> Result<Option<&Buffer>, BackendError> {
        if size == 0 {
            return Ok(self.copy_buffers[slot][d].as_ref());
        }
        if self.copy_buffers[slot][d]
            .as_ref()
            .is_none_or(|b| b.size() < size)
        {
            let b = self.devices[d].buffer_type().alloc_buffer(size)?;
            b.set_usage(BufferUsage::Compute);
            self.copy_buffers[slot][d] = Some(b);
        }
        Ok(self.copy_buffers[slot][d].as_ref())
    }

    /// Sizes every device's compute buffer and copy buffers for `graph`, the worst case, once;
    /// later graphs that fit reuse them.
    pub fn reserve(&mut self, mut graph: Graph, hints: &[DeviceHint]) -> Result<(), BackendError> {
        let (splits, dev, layout) = self.plan(&mut graph, hints)?;
        let keep = Self::keep_alive(&splits, graph.len());
        for (d, (_, size)) in layout.iter().enumerate() {
            for slot in 0..self.n_slots() {
                self.ensure_copy_buffer(slot, d, *size)?;
            }
            self.allocators[d].reserve_where(
                &graph,
                &|id| dev.get(id.index()).copied().flatten() == Some(d),
                &|id| keep[id.index()],
            )?;
        }
        Ok(())
    }

    /// The copy slot the next [`Scheduler::schedule`] uses.
    pub fn next_slot(&self) -> usize {
        self.next_slot
    }

    /// Takes the next copy slot for a graph scheduled earlier in that same slot and run again
    /// (same graph, new inputs): the slots keep rotating as if it had been scheduled anew.
    pub fn reuse_slot(&mut self, sg: &ScheduledGraph) -> Result<(), BackendError> {
        if sg.slot != self.next_slot {
            return Err(BackendError::Unbound(format!(
                "graph of copy slot {} reused when slot {} is next",
                sg.slot, self.next_slot
            )));
        }
        self.next_slot = (self.next_slot + 1) % self.n_slots();
        Ok(())
    }

    /// Places, splits and allocates `graph` (passes 1–4) in the next copy slot.
    pub fn schedule(
        &mut self,
        mut graph: Graph,
        hints: &[DeviceHint],
    ) -> Result<ScheduledGraph, BackendError> {
        let slot = self.next_slot;
        let (splits, dev, layout) = self.plan(&mut graph, hints)?;
        for (d, (leaves, size)) in layout.iter().enumerate() {
            if let Some(buffer) = self.ensure_copy_buffer(slot, d, *size)? {
                let memory = buffer.memory();
                for &(id, off) in leaves {
                    graph.bind(id, memory.clone(), off)?;
                }
            }
        }
        let keep = Self::keep_alive(&splits, graph.len());
        for d in 0..self.devices.len() {
            self.allocators[d].allocate_where(
                &mut graph,
                &|id| dev.get(id.index()).copied().flatten() == Some(d),
                &|id| keep[id.index()],
            )?;
        }
        self.next_slot = (slot + 1) % self.n_slots();
        Ok(ScheduledGraph {
            graph: Arc::new(graph),
            splits,
            assignment: dev,
            slot,
        })
    }

    /// Writes graph input `id` (the host's data) into every device that reads it, after that
    /// device's queued work.
    pub fn set_input(
        &self,
        sg: &ScheduledGraph,
        id: TensorId,
        data: &[u8],
    ) -> Result<(), BackendError> {
        let need = sg.graph.get(id)?.layout.span_bytes();
        if data.len() != need {
            return Err(BackendError::SizeMismatch {
                what: "set_input",
                expected: need,
                actual: data.len(),
            });
        }
        self.set_input_at(sg, id, 0, data)
    }

    /// [`Scheduler::set_input`] of the bytes `offset..offset + data.len()` of input `id` only:
    /// a large input (a long prompt's mask) can be built and written a part at a time.
    pub fn set_input_at(
        &self,
        sg: &ScheduledGraph,
        id: TensorId,
        offset: usize,
        data: &[u8],
    ) -> Result<(), BackendError> {
        let g = &sg.graph;
        let need = g.get(id)?.layout.span_bytes();
        if offset.checked_add(data.len()).is_none_or(|end| end > need) {
            return Err(BackendError::OutOfBounds {
                buffer: format!("input {id}"),
                offset,
                len: data.len(),
                size: need,
            });
        }
        for split in &sg.splits {
            for c in &split.copies {
                if c.from == id && c.src_device.is_none() {
                    let dst = BufferSlice::of_tensor(g, c.to)?;
                    let part = BufferSlice::new(&dst.buffer, dst.offset + offset, data.len())?;
                    self.streams[split.device].set_async_from(&part, data)?;
                }
            }
        }
        Ok(())
    }

    /// [`Scheduler::set_input`] for i32 data.
    pub fn set_input_i32(
        &self,
        sg: &ScheduledGraph,
        id: TensorId,
        data: &[i32],
    ) -> Result<(), BackendError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.set_input(sg, id, &bytes)
    }

    /// [`Scheduler::set_input`] for f32 data.
    pub fn set_input_f32(
        &self,
        sg: &ScheduledGraph,
        id: TensorId,
        data: &[f32],
    ) -> Result<(), BackendError> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.set_input(sg, id, &bytes)
    }

    /// Queues every split of `sg` with its copies; returns without waiting.
    pub fn compute_async(&self, sg: &ScheduledGraph) -> Result<(), BackendError> {
        let slot = sg.slot;
        for split in &sg.splits {
            let d = split.device;
            let dst_stream = &self.streams[d];
            for c in &split.copies {
                let Some(e) = c.src_device else { continue };
                let src = BufferSlice::of_tensor(&sg.graph, c.from)?;
                let dst = BufferSlice::of_tensor(&sg.graph, c.to)?;
                let src_stream = &self.streams[e];
                match &self.events[slot][d] {
                    Some(ev) if self.devices[e].caps().events => {
                        // The slot is free once the destination's last reader of it is done.
                        src_stream.wait(ev)?;
                        copy_async_unfenced(src_stream, dst_stream, &src, &dst)?;
                    }
                    _ => copy_async(src_stream, dst_stream, &src, &dst)?,
                }
            }
            dst_stream.compute_nodes_async(sg.graph.clone(), split.nodes.clone())?;
            if let Some(ev) = &self.events[slot][d] {
                dst_stream.record(ev)?;
            }
        }
        Ok(())
    }

    /// Reads tensor `id` of `sg` after the work queued on its device.
    pub fn get_async(
        &self,
        sg: &ScheduledGraph,
        id: TensorId,
    ) -> Result<PendingRead, BackendError> {
        let pending = PendingRead::new();
        self.get_async_into(sg, id, &pending)?;
        Ok(pending)
    }

    /// [`Scheduler::get_async`] into a `PendingRead` the caller keeps and reuses.
    pub fn get_async_into(
        &self,
        sg: &ScheduledGraph,
        id: TensorId,
        into: &PendingRead,
    ) -> Result<(), BackendError> {
        let root = sg.graph.get(id).map(|_| sg.graph.root(id))?;
        let d = sg.assignment[root.index()]
            .ok_or_else(|| BackendError::Unbound(format!("{id} is on no device")))?;
        self.streams[d].get_async_into(&BufferSlice::of_tensor(&sg.graph, id)?, into)
    }

    /// Waits for every device's queue; reports the first error.
    pub fn synchronize(&self) -> Result<(), BackendError> {
        let mut first = Ok(());
        for s in &self.streams {
            let r = s.synchronize();
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}
