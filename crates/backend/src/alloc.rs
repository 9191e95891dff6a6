//! The graph allocator: places a graph's inputs and intermediates in one compute buffer,
//! reusing the memory of tensors whose last reader has run (liveness in creation order, which
//! is execution order). The buffer is sized once for the worst case (`reserve`) and reused by
//! every later graph that fits; a graph that does not fit gets a new, larger buffer (graphs
//! still queued keep the old one alive through their bindings).

use lamina_core::graph::{Graph, TensorId};
use lamina_core::tensor::TensorFlags;

use crate::buffer::{Buffer, BufferType, BufferUsage};
use crate::error::BackendError;

/// Byte offsets of the tensors a graph needs allocated, and the buffer size they need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AllocPlan {
    pub offsets: Vec<(TensorId, usize)>,
    pub size: usize,
}

/// Whether the allocator must give `id` memory: an unbound root tensor.
fn needs_memory(graph: &Graph, id: TensorId) -> bool {
    let t = graph.tensor(id);
    t.view_src.is_none() && t.binding.is_none()
}

#[derive(Default)]
struct FreeList {
    /// Free ranges `(offset, size)`, sorted by offset, never adjacent.
    free: Vec<(usize, usize)>,
    end: usize,
}

impl FreeList {
    fn alloc(&mut self, size: usize) -> usize {
        // Best fit among free ranges; else grow at the end (merging a free tail).
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, r)| r.1 >= size)
            .min_by_key(|(_, r)| r.1)
            .map(|(i, _)| i);
        if let Some(i) = best {
            let (off, sz) = self.free[i];
            if sz == size {
                self.free.remove(i);
            } else {
                self.free[i] = (off + size, sz - size);
            }
            return off;
        }
        if let Some(&(off, sz)) = self.free.last()
            && off + sz == self.end
        {
            self.free.pop();
            self.end = off + size;
            return off;
        }
        let off = self.end;
        self.end += size;
        off
    }

    fn release(&mut self, off: usize, size: usize) {
        let i = self.free.partition_point(|r| r.0 < off);
        self.free.insert(i, (off, size));
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

/// Computes where each unbound tensor of `graph` goes, with `alignment`.
pub fn plan_graph(graph: &Graph, buffer_type: &BufferType) -> Result<AllocPlan, BackendError> {
    plan_graph_where(graph, buffer_type, &|_| true, &|_| false)
}

/// As [`plan_graph`], for the unbound tensors `include` accepts (the scheduler's: those of one
/// device); `keep` marks tensors that must stay live for the whole graph (read later by a copy
/// to another device).
pub fn plan_graph_where(
    graph: &Graph,
    buffer_type: &BufferType,
    include: &dyn Fn(TensorId) -> bool,
    keep: &dyn Fn(TensorId) -> bool,
) -> Result<AllocPlan, BackendError> {
    let align = buffer_type.alignment();
    let n = graph.len();
    // Last node index reading each root (through views).
    let mut last_use = vec![0usize; n];
    for id in graph.ids() {
        let t = graph.tensor(id);
        for s in t.sources() {
            let root = graph.root(s);
            last_use[root.index()] = last_use[root.index()].max(id.index());
        }
        if let Some(root) = t.view_src {
            // A node computing into a view (set_rows, cpy) writes its root at this point.
            last_use[root.index()] = last_use[root.index()].max(id.index());
        }
    }
    let size_of = |id: TensorId| -> Result<usize, BackendError> {
        let s = buffer_type.alloc_size(&graph.tensor(id).layout);
        s.checked_next_multiple_of(align)
            .ok_or(BackendError::AllocFailed {
                buffer_type: buffer_type.name().to_owned(),
                size: s,
            })
    };
    let pinned = |id: TensorId| {
        let f = graph.tensor(id).flags;
        f.contains(TensorFlags::INPUT)
            || f.contains(TensorFlags::OUTPUT)
            || graph.tensor(id).op.is_view()
            || keep(id)
    };
    let needs_memory = |graph: &Graph, id: TensorId| needs_memory(graph, id) && include(id);
    let mut fl = FreeList::default();
    let mut offsets = Vec::new();
    let mut placed: Vec<Option<(usize, usize)>> = vec![None; n];
    // Leaves first and for the whole graph: the host writes them before compute.
    for id in graph.ids() {
        let t = graph.tensor(id);
        if needs_memory(graph, id) && !t.op.is_compute() {
            let size = size_of(id)?;
            let off = fl.alloc(size);
            offsets.push((id, off));
        }
    }
    for id in graph.ids() {
        let t = graph.tensor(id);
        if needs_memory(graph, id) && t.op.is_compute() {
            let size = size_of(id)?;
            // In place: the first source's memory, when this node is its last reader and
            // nothing else (a view, a pin, another operand) holds it.
            let inplace = t.src[0]
                .filter(|&s| {
                    t.op.runs_in_place()
                        && graph.tensor(s).view_src.is_none()
                        && graph.tensor(s).layout == t.layout
                        && last_use[s.index()] == id.index()
                        && !pinned(s)
                        && t.src[1..].iter().flatten().all(|&o| graph.root(o) != s)
                })
                .and_then(|s| placed[s.index()].filter(|&(_, sz)| sz == size).map(|_| s));
            let off = match inplace {
                Some(s) => placed[s.index()].take().expect("checked above").0,
                None => fl.alloc(size),
            };
            placed[id.index()] = Some((off, size));
            offsets.push((id, off));
        }
        // Free roots whose last reader is this node (after allocating its output, so an output
        // never overlaps its inputs).
        let mut free_root = |root: TensorId, fl: &mut FreeList| {
            if last_use[root.index()] <= id.index()
                && !pinned(root)
                && let Some((off, size)) = placed[root.index()].take()
            {
                fl.release(off, size);
            }
        };
        for s in t.sources() {
            free_root(graph.root(s), &mut fl);
        }
        if t.op.is_compute() && t.view_src.is_none() {
            free_root(id, &mut fl);
        }
    }
    Ok(AllocPlan {
        offsets,
        size: fl.end,
    })
}

/// Allocates graphs into one reusable compute buffer of a buffer type.
#[derive(Debug)]
pub struct GraphAllocator {
    buffer_type: BufferType,
    buffer: Option<Buffer>,
}

impl GraphAllocator {
    pub fn new(buffer_type: BufferType) -> GraphAllocator {
        GraphAllocator {
            buffer_type,
            buffer: None,
        }
    }

    pub fn buffer_type(&self) -> &BufferType {
        &self.buffer_type
    }

    /// The current compute buffer, if any.
    pub fn buffer(&self) -> Option<&Buffer> {
        self.buffer.as_ref()
    }

    fn ensure(&mut self, size: usize) -> Result<&Buffer, BackendError> {
        let fits = self.buffer.as_ref().is_some_and(|b| b.size() >= size);
        if !fits {
            let b = self.buffer_type.alloc_buffer(size)?;
            b.set_usage(BufferUsage::Compute);
            self.buffer = Some(b);
        }
        Ok(self.buffer.as_ref().expect("buffer set above"))
    }

    /// Sizes the compute buffer for `graph` (the worst case); returns the size in bytes.
    pub fn reserve(&mut self, graph: &Graph) -> Result<usize, BackendError> {
        self.reserve_where(graph, &|_| true, &|_| false)
    }

    /// Binds every unbound tensor of `graph` into the compute buffer.
    pub fn allocate(&mut self, graph: &mut Graph) -> Result<(), BackendError> {
        self.allocate_where(graph, &|_| true, &|_| false)
    }

    /// [`GraphAllocator::reserve`] for the tensors `include` accepts (see [`plan_graph_where`]).
    pub fn reserve_where(
        &mut self,
        graph: &Graph,
        include: &dyn Fn(TensorId) -> bool,
        keep: &dyn Fn(TensorId) -> bool,
    ) -> Result<usize, BackendError> {
        let plan = plan_graph_where(graph, &self.buffer_type, include, keep)?;
        self.ensure(plan.size)?;
        Ok(plan.size)
    }

    /// [`GraphAllocator::allocate`] for the tensors `include` accepts (see [`plan_graph_where`]).
    pub fn allocate_where(
        &mut self,
        graph: &mut Graph,
        include: &dyn Fn(TensorId) -> bool,
        keep: &dyn Fn(TensorId) -> bool,
    ) -> Result<(), BackendError> {
        let plan = plan_graph_where(graph, &self.buffer_type, include, keep)?;
        if plan.offsets.is_empty() {
            return Ok(());
        }
        let memory = self.ensure(plan.size)?.memory();
        for (id, off) in plan.offsets {
            graph.bind(id, memory.clone(), off)?;
        }
        Ok(())
    }
}
