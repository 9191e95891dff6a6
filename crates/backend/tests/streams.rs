//! Stream, event, buffer and registry behaviour of the device layer, exercised through the CPU
//! backend's (virtual) devices. No sleeps: where a test needs a queue to be held back, it makes
//! the queue wait on a host-controlled event ("gate") and checks what must not have happened
//! yet, which is deterministic.

use std::sync::Arc;

use lamina_backend::{
    BackendError, Buffer, BufferSlice, Device, DeviceType, Event, GraphAllocator, HostMemory,
    bytes_to_f32, copy_async, f32_to_bytes, plan_graph,
};
use lamina_core::DType;
use lamina_core::graph::{Graph, TensorId};
use lamina_core::tensor::TensorFlags;
use lamina_cpu::{CpuBackendReg, CpuConfig, parse_device_count};

/// Iteration counts, cut down under Miri (which interprets every instruction).
fn rounds(n: usize) -> usize {
    if cfg!(miri) { 3 } else { n }
}

fn devices(n: usize) -> Vec<Arc<dyn Device>> {
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(n).with_threads(2 * n)).unwrap();
    reg.cpu_devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn Device>)
        .collect()
}

/// A host-controlled gate: an event with a reserved value the host signals by hand.
fn gate(dev: &dyn Device) -> (Event, u64) {
    let e = Event::new(dev.key(), "gate");
    let v = e.record_with(|_| Ok(())).unwrap();
    (e, v)
}

/// `out = f(x)` over `n` f32 values in `buffer`: x at offset 0, out at `n*4`.
fn unary_graph(buffer: &Buffer, n: usize, op: &str) -> (Arc<Graph>, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[n]).unwrap();
    let y = match op {
        "x2" => g.scale(x, 2.0),
        "p1" => g.scale_bias(x, 1.0, 1.0),
        "p3" => g.scale_bias(x, 1.0, 3.0),
        _ => unreachable!(),
    }
    .unwrap();
    g.bind(x, buffer.memory(), 0).unwrap();
    g.bind(y, buffer.memory(), n * 4).unwrap();
    (Arc::new(g), x, y)
}

#[test]
fn registry_lists_virtual_devices() {
    let devs = devices(3);
    let names: Vec<&str> = devs.iter().map(|d| d.name()).collect();
    assert_eq!(names, ["CPU0", "CPU1", "CPU2"]);
    let one = devices(1);
    assert_eq!(one[0].name(), "CPU");
    for (i, d) in devs.iter().enumerate() {
        assert_eq!(d.device_type(), DeviceType::Cpu);
        assert!(d.caps().async_ops && d.caps().events && d.caps().buffer_from_host_ptr);
        assert_eq!(
            d.buffer_type().name(),
            d.name(),
            "buffer types are named after their device"
        );
        let m = d.memory();
        assert!(m.free <= m.total);
        assert!(
            m.total <= one[0].memory().total / 3 + 1,
            "each reports its share"
        );
        for (j, e) in devs.iter().enumerate() {
            assert_eq!(
                i == j,
                d.buffer_type() == e.buffer_type(),
                "buffer types compare by identity"
            );
            assert_eq!(
                i == j,
                d.supports_buffer_type(&e.buffer_type()),
                "strict buffer ownership"
            );
            assert_eq!(i == j, d.device_id() == e.device_id());
        }
    }
    let mut reg = lamina_backend::Registry::new();
    reg.register(Arc::new(
        CpuBackendReg::new(CpuConfig::default().with_devices(2)).unwrap(),
    ));
    assert_eq!(reg.devices().len(), 2);
    assert_eq!(reg.device_by_name("cpu1").unwrap().name(), "CPU1");
    assert_eq!(reg.best_device().unwrap().name(), "CPU0");
    assert!(parse_device_count("0").is_err());
    assert!(parse_device_count("x").is_err());
    assert!(parse_device_count("65").is_err());
    assert_eq!(parse_device_count(" 4 ").unwrap(), 4);
}

#[test]
fn buffers_bounds_and_copies() {
    let d = &devices(1)[0];
    let b = d.buffer_type().alloc_buffer(100).unwrap();
    assert_eq!(b.size(), 100);
    b.write(10, &[1, 2, 3]).unwrap();
    let mut out = [0u8; 5];
    b.read(9, &mut out).unwrap();
    assert_eq!(out, [0, 1, 2, 3, 0]);
    b.fill(0, 4, 7).unwrap();
    let mut out = [0u8; 4];
    b.read(0, &mut out).unwrap();
    assert_eq!(out, [7; 4]);
    assert!(matches!(
        b.write(98, &[0; 3]),
        Err(BackendError::OutOfBounds { .. })
    ));
    assert!(matches!(
        b.read(usize::MAX, &mut [0; 2]),
        Err(BackendError::OutOfBounds { .. })
    ));
    assert!(matches!(
        b.fill(50, 51, 0),
        Err(BackendError::OutOfBounds { .. })
    ));
    assert!(BufferSlice::new(&b, 90, 11).is_err());
    // Overlapping copy within a buffer, and across buffers.
    b.copy_from(11, &b.clone(), 10, 3).unwrap();
    let mut out = [0u8; 4];
    b.read(10, &mut out).unwrap();
    assert_eq!(out, [1, 1, 2, 3]);
    let c = d.buffer_type().alloc_buffer(8).unwrap();
    c.copy_from(0, &b, 10, 4).unwrap();
    assert!(c.copy_from(5, &b, 0, 4).is_err());
    let s = BufferSlice::new(&c, 0, 4).unwrap();
    assert_eq!(s.read().unwrap(), [1, 1, 2, 3]);
    assert!(matches!(
        s.write(&[1, 2]),
        Err(BackendError::SizeMismatch { .. })
    ));
    b.clear(9).unwrap();
    assert_eq!(BufferSlice::whole(&b).read().unwrap(), vec![9; 100]);
    let empty = d.buffer_type().alloc_buffer(0).unwrap();
    assert_eq!(empty.size(), 0);
    assert!(empty.write(0, &[1]).is_err());
    assert!(d.buffer_type().alloc_buffer(usize::MAX).is_err());
}

#[test]
fn mapped_weights_are_wrapped_not_copied_and_read_only() {
    let d = &devices(1)[0];
    // Host memory of any address can be wrapped; compute checks element alignment.
    let data = AlignedBytes::new(&f32_to_bytes(&[1.0, 2.0, 3.0, 4.0]), 64, 0);
    let ptr = data.bytes().as_ptr();
    let w = d.buffer_from_host_memory(Arc::new(data)).unwrap();
    assert_eq!(w.lock().as_ptr().unwrap(), ptr, "no copy");
    assert!(w.is_read_only());
    assert!(matches!(w.write(0, &[0]), Err(BackendError::ReadOnly(_))));
    assert!(d.supports_buffer_type(w.buffer_type()));
    // Weights feed compute; writing into them is refused.
    let act = d.buffer_type().alloc_buffer(64).unwrap();
    let mut g = Graph::new();
    let wt = g.new_tensor(DType::F32, &[4]).unwrap();
    g.bind(wt, w.memory(), 0).unwrap();
    let y = g.scale(wt, 3.0).unwrap();
    g.bind(y, act.memory(), 0).unwrap();
    d.stream().compute(Arc::new(g)).unwrap();
    assert_eq!(
        bytes_to_f32(&BufferSlice::new(&act, 0, 16).unwrap().read().unwrap()),
        [3.0, 6.0, 9.0, 12.0]
    );
    let mut g = Graph::new();
    let x = g.new_tensor(DType::F32, &[4]).unwrap();
    g.bind(x, act.memory(), 0).unwrap();
    let y = g.scale(x, 3.0).unwrap();
    g.bind(y, w.memory(), 0).unwrap();
    assert!(matches!(
        d.stream().compute_async(Arc::new(g)),
        Err(BackendError::ReadOnly(_))
    ));
}

/// Bytes at a chosen misalignment from a 64-byte boundary (no unsafe needed).
#[derive(Debug)]
struct AlignedBytes {
    buf: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBytes {
    fn new(data: &[u8], align: usize, misalign: usize) -> AlignedBytes {
        let mut buf = vec![0u8; data.len() + align + misalign];
        let start = buf.as_ptr().align_offset(align) + misalign;
        buf[start..start + data.len()].copy_from_slice(data);
        AlignedBytes {
            buf,
            start,
            len: data.len(),
        }
    }
}

impl HostMemory for AlignedBytes {
    fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.start + self.len]
    }
}

#[test]
fn misaligned_host_memory_is_refused_not_misread() {
    let d = &devices(1)[0];
    let w = d
        .buffer_from_host_memory(Arc::new(AlignedBytes::new(&[0u8; 20], 64, 2)))
        .unwrap();
    let act = d.buffer_type().alloc_buffer(64).unwrap();
    let mut g = Graph::new();
    let wt = g.new_tensor(DType::F32, &[4]).unwrap();
    g.bind(wt, w.memory(), 0).unwrap();
    let y = g.scale(wt, 3.0).unwrap();
    g.bind(y, act.memory(), 0).unwrap();
    assert!(matches!(
        d.stream().compute_async(Arc::new(g)),
        Err(BackendError::Device { .. })
    ));
}

#[test]
fn set_compute_get_async_in_order() {
    for dev in devices(1).iter().chain(devices(3).iter()) {
        let n = 37;
        let buf = dev.buffer_type().alloc_buffer(2 * n * 4).unwrap();
        let (g, x, y) = unary_graph(&buf, n, "x2");
        let s = dev.stream();
        let xs = BufferSlice::of_tensor(&g, x).unwrap();
        let ys = BufferSlice::of_tensor(&g, y).unwrap();
        // Queue many rounds without any host wait; each round overwrites the input, so any
        // reordering would show up as a wrong value.
        let mut pending = Vec::new();
        for i in 0..rounds(200) {
            let v: Vec<f32> = (0..n).map(|j| (i * 1000 + j) as f32).collect();
            s.set_async(&xs, f32_to_bytes(&v)).unwrap();
            s.compute_async(g.clone()).unwrap();
            pending.push((i, s.get_async(&ys).unwrap()));
        }
        s.synchronize().unwrap();
        for (i, p) in pending {
            let got = p.wait_f32().unwrap();
            let want: Vec<f32> = (0..n).map(|j| 2.0 * (i * 1000 + j) as f32).collect();
            assert_eq!(got, want, "{} round {i}", dev.name());
        }
    }
}

#[test]
fn synchronous_devices_fall_back_to_sync_then_block() {
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(2).synchronous()).unwrap();
    let d0 = reg.cpu_devices()[0].clone();
    let d1 = reg.cpu_devices()[1].clone();
    assert!(!d0.caps().async_ops && !d0.caps().events);
    assert!(d0.new_event().is_err());
    let b0 = d0.buffer_type().alloc_buffer(8).unwrap();
    let b1 = d1.buffer_type().alloc_buffer(8).unwrap();
    let s0 = d0.stream();
    s0.set_async(&BufferSlice::whole(&b0), vec![5; 8]).unwrap();
    copy_async(
        &s0,
        &d1.stream(),
        &BufferSlice::whole(&b0),
        &BufferSlice::whole(&b1),
    )
    .unwrap();
    assert_eq!(
        d1.stream()
            .get_async(&BufferSlice::whole(&b1))
            .unwrap()
            .wait()
            .unwrap(),
        vec![5; 8]
    );
    let e = Event::new(d0.key(), "x");
    assert!(matches!(
        s0.record(&e),
        Err(BackendError::Unsupported { .. })
    ));
}

/// A chain CPU0 → CPU1 → CPU2 with async copies and no host wait, many rounds; the copy into
/// CPU1 reuses the same destination every round, so it must also wait for CPU1's previous
/// compute (write-after-read), which the fence of the copy protocol guarantees.
#[test]
fn cross_device_copy_chain_without_host_wait() {
    let devs = devices(3);
    let n = 29;
    let bufs: Vec<Buffer> = devs
        .iter()
        .map(|d| d.buffer_type().alloc_buffer(2 * n * 4).unwrap())
        .collect();
    let ops = ["p1", "x2", "p3"];
    let graphs: Vec<_> = (0..3).map(|i| unary_graph(&bufs[i], n, ops[i])).collect();
    let streams: Vec<_> = devs.iter().map(|d| d.stream()).collect();
    let x_of = |i: usize| BufferSlice::of_tensor(&graphs[i].0, graphs[i].1).unwrap();
    let y_of = |i: usize| BufferSlice::of_tensor(&graphs[i].0, graphs[i].2).unwrap();
    let mut pending = Vec::new();
    for round in 0..rounds(300) {
        let v: Vec<f32> = (0..n).map(|j| (round * 7 + j) as f32).collect();
        streams[0].set_async(&x_of(0), f32_to_bytes(&v)).unwrap();
        streams[0].compute_async(graphs[0].0.clone()).unwrap();
        copy_async(&streams[0], &streams[1], &y_of(0), &x_of(1)).unwrap();
        streams[1].compute_async(graphs[1].0.clone()).unwrap();
        let mid = streams[1].get_async(&y_of(1)).unwrap();
        copy_async(&streams[1], &streams[2], &y_of(1), &x_of(2)).unwrap();
        streams[2].compute_async(graphs[2].0.clone()).unwrap();
        pending.push((v, mid, streams[2].get_async(&y_of(2)).unwrap()));
    }
    for s in &streams {
        s.synchronize().unwrap();
    }
    for (round, (v, mid, out)) in pending.into_iter().enumerate() {
        let mid = mid.wait_f32().unwrap();
        let out = out.wait_f32().unwrap();
        for j in 0..n {
            assert_eq!(mid[j], (v[j] + 1.0) * 2.0, "round {round} mid");
            assert_eq!(out[j], (v[j] + 1.0) * 2.0 + 3.0, "round {round} out");
        }
    }
}

#[test]
fn async_copy_does_not_block_the_host() {
    let devs = devices(2);
    let b0 = devs[0].buffer_type().alloc_buffer(16).unwrap();
    let b1 = devs[1].buffer_type().alloc_buffer(16).unwrap();
    let (s0, s1) = (devs[0].stream(), devs[1].stream());
    let (g, v) = gate(&*devs[0]);
    s0.wait(&g).unwrap();
    s0.set_async(&BufferSlice::whole(&b0), vec![42; 16])
        .unwrap();
    copy_async(&s0, &s1, &BufferSlice::whole(&b0), &BufferSlice::whole(&b1)).unwrap();
    let read = s1.get_async(&BufferSlice::whole(&b1)).unwrap();
    let done = devs[1].new_event().unwrap();
    s1.record(&done).unwrap();
    // Everything above returned although CPU0 is held at the gate; CPU1's read is queued
    // behind the copy, which is queued behind CPU0's write.
    assert!(!read.is_ready());
    assert!(!done.is_complete());
    g.signal(v);
    done.synchronize().unwrap();
    assert_eq!(read.wait().unwrap(), vec![42; 16]);
}

#[test]
fn events_record_wait_reuse() {
    let devs = devices(3);
    let (s0, s1, s2) = (devs[0].stream(), devs[1].stream(), devs[2].stream());
    let ev = devs[0].new_event().unwrap();
    assert!(ev.is_complete(), "a never-recorded event is complete");
    ev.synchronize().unwrap();
    let ev1 = devs[1].new_event().unwrap();
    assert!(matches!(
        s0.record(&ev1),
        Err(BackendError::ForeignEvent { .. })
    ));
    let b1 = devs[1].buffer_type().alloc_buffer(4).unwrap();
    let b2 = devs[2].buffer_type().alloc_buffer(4).unwrap();
    for round in 0..rounds(100) as u8 {
        let (g, v) = gate(&*devs[0]);
        s0.wait(&g).unwrap();
        s0.record(&ev).unwrap();
        // Both streams wait for this round's record of `ev` without blocking the host.
        s1.wait(&ev).unwrap();
        s2.wait(&ev).unwrap();
        s1.set_async(&BufferSlice::whole(&b1), vec![round; 4])
            .unwrap();
        s2.set_async(&BufferSlice::whole(&b2), vec![round; 4])
            .unwrap();
        let r1 = s1.get_async(&BufferSlice::whole(&b1)).unwrap();
        let r2 = s2.get_async(&BufferSlice::whole(&b2)).unwrap();
        assert!(!ev.is_complete() && !r1.is_ready() && !r2.is_ready());
        g.signal(v);
        ev.synchronize().unwrap();
        assert_eq!(r1.wait().unwrap(), vec![round; 4]);
        assert_eq!(r2.wait().unwrap(), vec![round; 4]);
    }
    // A wait captures the record current at enqueue time: a later record does not hold it.
    let (g, v) = gate(&*devs[0]);
    s0.record(&ev).unwrap();
    ev.synchronize().unwrap();
    s1.wait(&ev).unwrap();
    s0.wait(&g).unwrap();
    s0.record(&ev).unwrap();
    s1.synchronize().unwrap();
    assert!(!ev.is_complete());
    g.signal(v);
    s0.synchronize().unwrap();
    assert!(ev.is_complete());
}

#[test]
fn errors_mismatched_sizes_and_foreign_buffers() {
    let devs = devices(2);
    let b0 = devs[0].buffer_type().alloc_buffer(16).unwrap();
    let b1 = devs[1].buffer_type().alloc_buffer(8).unwrap();
    let (s0, s1) = (devs[0].stream(), devs[1].stream());
    let whole0 = BufferSlice::whole(&b0);
    let whole1 = BufferSlice::whole(&b1);
    assert!(matches!(
        s0.set_async(&whole0, vec![0; 3]),
        Err(BackendError::SizeMismatch { .. })
    ));
    assert!(matches!(
        s0.set_async(&whole1, vec![0; 8]),
        Err(BackendError::ForeignBuffer { .. })
    ));
    assert!(matches!(
        s1.get_async(&whole0),
        Err(BackendError::ForeignBuffer { .. })
    ));
    assert!(matches!(
        copy_async(&s0, &s1, &whole0, &whole1),
        Err(BackendError::SizeMismatch { .. })
    ));
    assert!(matches!(
        copy_async(&s1, &s0, &whole0, &whole1),
        Err(BackendError::ForeignBuffer { .. })
    ));
    // A graph bound to another device's buffer is refused at enqueue.
    let mut g = Graph::new();
    let x = g.new_tensor(DType::F32, &[2]).unwrap();
    let y = g.scale(x, 2.0).unwrap();
    g.bind(x, b1.memory(), 0).unwrap();
    g.bind(y, b0.memory(), 0).unwrap();
    assert!(matches!(
        s0.compute_async(Arc::new(g)),
        Err(BackendError::ForeignBuffer { .. })
    ));
    // Unbound tensors and bindings past the end.
    let mut g = Graph::new();
    let x = g.new_tensor(DType::F32, &[2]).unwrap();
    let _ = g.scale(x, 2.0).unwrap();
    g.bind(x, b0.memory(), 0).unwrap();
    assert!(matches!(
        s0.compute_async(Arc::new(g.clone())),
        Err(BackendError::Unbound(_))
    ));
    assert!(g.bind(x, b0.memory(), 12).is_err());
    // A kernel error (row index out of range) is sticky until the next synchronize.
    let mut g = Graph::new();
    let t = g.new_tensor(DType::F32, &[2, 2]).unwrap();
    let i = g.new_tensor(DType::I32, &[1]).unwrap();
    let r = g.get_rows(t, i).unwrap();
    let b = devs[0].buffer_type().alloc_buffer(64).unwrap();
    g.bind(t, b.memory(), 0).unwrap();
    g.bind(i, b.memory(), 16).unwrap();
    g.bind(r, b.memory(), 32).unwrap();
    b.write(16, &7i32.to_le_bytes()).unwrap();
    let g = Arc::new(g);
    s0.compute_async(g.clone()).unwrap();
    assert!(matches!(s0.synchronize(), Err(BackendError::Device { .. })));
    s0.synchronize().unwrap();
}

#[test]
fn allocator_reuses_memory_without_overlapping_live_tensors() {
    let dev = &devices(1)[0];
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[64, 4]).unwrap();
    let mut cur = x;
    for i in 0..10 {
        cur = if i % 2 == 0 {
            g.silu(cur).unwrap()
        } else {
            g.scale(cur, 0.5).unwrap()
        };
    }
    let side = g.rms_norm(x, 1e-6).unwrap();
    let out = g.add(cur, side).unwrap();
    g.set_output(out).unwrap();
    let plan = plan_graph(&g, &dev.buffer_type()).unwrap();
    let tensor = 64 * 4 * 4;
    assert!(
        plan.size <= 4 * tensor,
        "a chain needs a few live tensors, not {}",
        plan.size / tensor
    );
    // Live ranges: from creation to last reader; inputs and outputs live throughout.
    let mut last = vec![0; g.len()];
    for id in g.ids() {
        for s in g.tensor(id).sources() {
            last[g.root(s).index()] = id.index();
        }
    }
    let live = |id: TensorId| {
        let t = g.tensor(id);
        if t.flags.contains(TensorFlags::INPUT) || t.flags.contains(TensorFlags::OUTPUT) {
            (0, g.len())
        } else {
            (id.index(), last[id.index()].max(id.index()))
        }
    };
    for &(a, oa) in &plan.offsets {
        for &(b, ob) in &plan.offsets {
            if a >= b {
                continue;
            }
            let ((sa, ea), (sb, eb)) = (live(a), live(b));
            let overlap_time = sa <= eb && sb <= ea;
            let (la, lb) = (g.layout(a).span_bytes(), g.layout(b).span_bytes());
            let overlap_mem = oa < ob + lb && ob < oa + la;
            assert!(
                !(overlap_time && overlap_mem),
                "{a} and {b} share memory while both live"
            );
        }
    }
    let mut alloc = GraphAllocator::new(dev.buffer_type());
    let reserved = alloc.reserve(&g).unwrap();
    let buf = alloc.buffer().unwrap().clone();
    alloc.allocate(&mut g).unwrap();
    assert_eq!(
        alloc.buffer().unwrap(),
        &buf,
        "a graph that fits reuses the reserved buffer"
    );
    assert_eq!(reserved, plan.size);
}

/// Several host threads drive their own pipelines through the same three devices at once.
#[test]
fn stress_concurrent_hosts_and_events() {
    let devs = devices(3);
    std::thread::scope(|scope| {
        for t in 0..3usize {
            let devs = devs.clone();
            scope.spawn(move || {
                let n = 8;
                let a = (t, (t + 1) % 3);
                let src = devs[a.0].buffer_type().alloc_buffer(2 * n * 4).unwrap();
                let dst = devs[a.1].buffer_type().alloc_buffer(2 * n * 4).unwrap();
                let (g0, x0, y0) = unary_graph(&src, n, "x2");
                let (g1, x1, y1) = unary_graph(&dst, n, "p1");
                let (s0, s1) = (devs[a.0].stream(), devs[a.1].stream());
                let ev = devs[a.1].new_event().unwrap();
                for round in 0..rounds(100) {
                    let v: Vec<f32> = (0..n).map(|j| (round * 10 + j + t * 1000) as f32).collect();
                    s0.set_async(&BufferSlice::of_tensor(&g0, x0).unwrap(), f32_to_bytes(&v))
                        .unwrap();
                    s0.compute_async(g0.clone()).unwrap();
                    let (ys, xd) = (
                        BufferSlice::of_tensor(&g0, y0).unwrap(),
                        BufferSlice::of_tensor(&g1, x1).unwrap(),
                    );
                    copy_async(&s0, &s1, &ys, &xd).unwrap();
                    s1.compute_async(g1.clone()).unwrap();
                    let r = s1
                        .get_async(&BufferSlice::of_tensor(&g1, y1).unwrap())
                        .unwrap();
                    s1.record(&ev).unwrap();
                    ev.synchronize().unwrap();
                    let got = r.wait_f32().unwrap();
                    for j in 0..n {
                        assert_eq!(got[j], v[j] * 2.0 + 1.0);
                    }
                }
            });
        }
    });
}

/// Write-after-read: a copy into a buffer that the destination's queued work still reads must
/// wait for that work (the destination fence of the copy protocol), even when the source
/// device is idle and could copy at once.
#[test]
fn async_copy_waits_for_queued_destination_work() {
    let devs = devices(2);
    let n = 16;
    let b0 = devs[0].buffer_type().alloc_buffer(n * 4).unwrap();
    let b1 = devs[1].buffer_type().alloc_buffer(2 * n * 4).unwrap();
    let (g1, x1, y1) = unary_graph(&b1, n, "x2");
    let (s0, s1) = (devs[0].stream(), devs[1].stream());
    let x1s = BufferSlice::of_tensor(&g1, x1).unwrap();
    let y1s = BufferSlice::of_tensor(&g1, y1).unwrap();
    for round in 0..rounds(50) {
        let old: Vec<f32> = (0..n).map(|j| (round * 100 + j) as f32).collect();
        let new: Vec<f32> = old.iter().map(|v| -v).collect();
        s1.set_async(&x1s, f32_to_bytes(&old)).unwrap();
        s0.set_async(&BufferSlice::whole(&b0), f32_to_bytes(&new))
            .unwrap();
        s0.synchronize().unwrap();
        let (g, v) = gate(&*devs[1]);
        s1.wait(&g).unwrap();
        s1.compute_async(g1.clone()).unwrap();
        let first = s1.get_async(&y1s).unwrap();
        copy_async(&s0, &s1, &BufferSlice::whole(&b0), &x1s).unwrap();
        s1.compute_async(g1.clone()).unwrap();
        let second = s1.get_async(&y1s).unwrap();
        g.signal(v);
        s1.synchronize().unwrap();
        let want = |x: &[f32]| x.iter().map(|v| 2.0 * v).collect::<Vec<_>>();
        assert_eq!(
            first.wait_f32().unwrap(),
            want(&old),
            "round {round}: copy overtook queued work"
        );
        assert_eq!(second.wait_f32().unwrap(), want(&new), "round {round}");
    }
}

/// Softmax takes the memory of scores nothing else reads (ggml-alloc's in-place reuse) and
/// computes the same bits as out of place; scores read again later keep their own memory.
#[test]
fn softmax_runs_in_place_over_scores_nothing_else_reads() {
    let dev = &devices(1)[0];
    // `pin`: the scores are also an output, so they may not be overwritten.
    let build = |pin: bool| {
        let mut g = Graph::new();
        let w = g.new_input(DType::F32, &[16, 24]).unwrap();
        let x = g.new_input(DType::F32, &[16, 8]).unwrap();
        let kq = g.mul_mat(w, x).unwrap();
        let sm = g.soft_max_ext(kq, None, 0.3, 0.0).unwrap();
        let out = g.scale(sm, 2.0).unwrap();
        g.set_output(out).unwrap();
        if pin {
            g.set_output(kq).unwrap();
        }
        (g, [w, x, kq, sm, out])
    };
    let wv: Vec<f32> = (0..16 * 24)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 17.0)
        .collect();
    let xv: Vec<f32> = (0..16 * 8)
        .map(|i| ((i * 13 % 29) as f32 - 14.0) / 5.0)
        .collect();
    let mut results = Vec::new();
    for pin in [false, true] {
        let (mut g, [w, x, kq, sm, out]) = build(pin);
        let plan = plan_graph(&g, &dev.buffer_type()).unwrap();
        let off = |id: TensorId| plan.offsets.iter().find(|p| p.0 == id).unwrap().1;
        assert_eq!(
            off(kq) == off(sm),
            !pin,
            "in place unless the scores are pinned"
        );
        let mut alloc = GraphAllocator::new(dev.buffer_type());
        alloc.allocate(&mut g).unwrap();
        let g = Arc::new(g);
        let s = dev.stream();
        s.set_async(&BufferSlice::of_tensor(&g, w).unwrap(), f32_to_bytes(&wv))
            .unwrap();
        s.set_async(&BufferSlice::of_tensor(&g, x).unwrap(), f32_to_bytes(&xv))
            .unwrap();
        s.compute_async(g.clone()).unwrap();
        let r = s
            .get_async(&BufferSlice::of_tensor(&g, out).unwrap())
            .unwrap();
        s.synchronize().unwrap();
        results.push(r.wait().unwrap());
    }
    assert_eq!(results[0], results[1]);
}
