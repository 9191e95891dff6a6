//! The GPU backend's memory and fallbacks: blocking transfers with unaligned edges, an
//! allocation beyond the device's largest buffer as a typed error naming the device, and a
//! graph whose middle op the GPU lacks (the scheduler runs it on the CPU with the copies it
//! needs). Skips without an adapter (CI sets LAMINA_REQUIRE_WGPU).

use std::sync::Arc;

use lamina_backend::{BackendError, Device, Scheduler, f32_to_bytes};
use lamina_core::DType;
use lamina_core::graph::Graph;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_wgpu::WgpuBackendReg;

fn gpu() -> Option<Arc<dyn Device>> {
    let reg = WgpuBackendReg::new(1).unwrap();
    match reg.wgpu_devices().first() {
        Some(d) => Some(d.clone()),
        None => {
            assert!(
                std::env::var_os("LAMINA_REQUIRE_WGPU").is_none(),
                "no wgpu adapter, and LAMINA_REQUIRE_WGPU is set"
            );
            eprintln!("skipping: no wgpu adapter");
            None
        }
    }
}

fn cpu() -> Arc<dyn Device> {
    let reg = CpuBackendReg::new(CpuConfig::default().with_threads(2)).unwrap();
    reg.cpu_devices()[0].clone()
}

#[test]
fn transfers_with_unaligned_edges_round_trip() {
    let Some(g) = gpu() else { return };
    let b = g.buffer_type().alloc_buffer(1000).unwrap();
    assert!(!b.is_host() && !b.buffer_type().is_host());
    let data: Vec<u8> = (0..997u32).map(|i| (i * 7 + 3) as u8).collect();
    b.write(3, &data[..501]).unwrap();
    b.write(504, &data[501..]).unwrap();
    let mut back = vec![0u8; 997];
    b.read(3, &mut back).unwrap();
    assert_eq!(back, data);
    // Between device buffers, and from device to host memory.
    let c = g.buffer_type().alloc_buffer(1000).unwrap();
    c.copy_from(10, &b, 3, 997 - 10).unwrap();
    let h = cpu().buffer_type().alloc_buffer(1000).unwrap();
    h.copy_from(0, &c, 10, 987).unwrap();
    let mut hb = vec![0u8; 987];
    h.read(0, &mut hb).unwrap();
    assert_eq!(hb, data[..987]);
    b.fill(1, 5, 0xAB).unwrap();
    let mut head = [0u8; 8];
    b.read(0, &mut head).unwrap();
    assert_eq!(head, [0, 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, data[3], data[4]]);
    assert!(matches!(
        b.write(999, &[1, 2]),
        Err(BackendError::OutOfBounds { .. })
    ));
}

#[test]
fn an_allocation_beyond_the_largest_buffer_names_the_device() {
    let Some(g) = gpu() else { return };
    let too_big = g.buffer_type().max_size() + 1;
    match g.buffer_type().alloc_buffer(too_big) {
        Err(BackendError::AllocFailed { buffer_type, size }) => {
            assert_eq!((buffer_type.as_str(), size), ("WGPU0", too_big));
        }
        other => panic!("expected AllocFailed, got {other:?}"),
    }
}

/// `w · tanh(w · x)`: the GPU has no TANH, so that node runs on the CPU.
fn graph(
    w: &lamina_backend::Buffer,
) -> (
    Graph,
    lamina_core::graph::TensorId,
    lamina_core::graph::TensorId,
) {
    let mut g = Graph::new();
    let x = g.new_input(DType::F32, &[32, 3]).unwrap();
    let wt = g.new_tensor(DType::F32, &[32, 32]).unwrap();
    g.bind(wt, w.memory(), 0).unwrap();
    let a = g.mul_mat(wt, x).unwrap();
    let b = g.tanh(a).unwrap();
    let c = g.mul_mat(wt, b).unwrap();
    g.set_output(c).unwrap();
    (g, x, c)
}

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 101) as f32 / 101.0) - 0.5)
        .collect()
}

fn run(devices: Vec<Arc<dyn Device>>) -> Vec<f32> {
    let w = devices[0].buffer_type().alloc_buffer(32 * 32 * 4).unwrap();
    w.write(0, &f32_to_bytes(&values(32 * 32))).unwrap();
    let (g, x, c) = graph(&w);
    let devices_len = devices.len();
    let mut sched = Scheduler::new(devices, false).unwrap();
    let n = devices_len;
    let sg = sched.schedule(g, &[]).unwrap();
    if n == 2 {
        let on: Vec<usize> = sg.splits().iter().map(|s| s.device).collect();
        assert_eq!(on, [0, 1, 0], "TANH on the CPU, the products on the GPU");
    }
    sched.set_input_f32(&sg, x, &values(96)).unwrap();
    sched.compute_async(&sg).unwrap();
    let out = sched.get_async(&sg, c).unwrap();
    sched.synchronize().unwrap();
    lamina_backend::bytes_to_f32(&out.wait().unwrap())
}

#[test]
fn an_op_the_gpu_lacks_runs_on_the_cpu() {
    let Some(g) = gpu() else { return };
    let want = run(vec![cpu()]);
    let got = run(vec![g, cpu()]);
    let err: f64 = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (*a as f64 - *b as f64).powi(2))
        .sum::<f64>()
        / want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>();
    assert!(err < 1e-10, "NMSE {err:e}");
}
