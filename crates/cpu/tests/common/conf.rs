//! The conformance harness shared by the op suites (`conformance.rs`, `ops_moe.rs`): host
//! tensors with their values, a sentinel-guarded run on a device, ggml's normalized-MSE check,
//! and the device configurations every case runs on (one device with 3 worker threads, and
//! each of 3 virtual devices).

use std::sync::Arc;

use super::Rng;
use lamina_backend::{BufferSlice, Device, HOST_ALIGNMENT};
use lamina_core::DType;
use lamina_core::graph::{Graph, TensorId};
use lamina_cpu::{CpuBackendReg, CpuConfig, quant};

pub const SENTINEL: u8 = 0xA5;
pub const GAP: usize = 128;
pub const EXACT: f64 = 1e-7;
/// GELU and GeGLU go through ggml's f16 GELU table (`GGML_GELU_FP16`), as llama.cpp's CPU
/// backend computes them: f16 precision, so a looser limit than [`EXACT`].
pub const GELU_F16_TABLE: f64 = 1e-6;
pub const MUL_MAT: f64 = 5e-4;

/// Device configurations the suite runs on.
pub fn device_sets() -> Vec<Vec<Arc<dyn Device>>> {
    let one = CpuBackendReg::new(CpuConfig::default().with_devices(1).with_threads(3)).unwrap();
    let three = CpuBackendReg::new(CpuConfig::default().with_devices(3).with_threads(6)).unwrap();
    let as_dyn = |r: &CpuBackendReg| -> Vec<Arc<dyn Device>> {
        r.cpu_devices()
            .iter()
            .map(|d| d.clone() as Arc<dyn Device>)
            .collect()
    };
    vec![as_dyn(&one), as_dyn(&three)]
}

/// Host data of a tensor: raw bytes for upload and its values (dequantized) for the reference.
pub struct HostTensor {
    pub id: TensorId,
    pub bytes: Vec<u8>,
    pub vals: Vec<f64>,
}

pub fn encode(dtype: DType, ne0: usize, vals: &[f32]) -> (Vec<u8>, Vec<f64>) {
    match dtype {
        DType::I32 => (
            vals.iter()
                .flat_map(|v| (*v as i32).to_le_bytes())
                .collect(),
            vals.iter().map(|v| f64::from(*v as i32)).collect(),
        ),
        DType::I64 => (
            vals.iter()
                .flat_map(|v| (*v as i64).to_le_bytes())
                .collect(),
            vals.iter().map(|v| f64::from(*v as i32)).collect(),
        ),
        _ => {
            let row = dtype.row_size(ne0 as u64).unwrap() as usize;
            let mut bytes = vec![0u8; vals.len() / ne0 * row];
            let mut back = vec![0f32; vals.len()];
            for (r, chunk) in vals.chunks(ne0).enumerate() {
                let dst = &mut bytes[r * row..(r + 1) * row];
                if lamina_core::quant::supports_quantize(dtype) {
                    quant::quantize_row(dtype, chunk, dst).unwrap();
                } else {
                    // The grid i-quants: ggml's importance-weighted quantizers, uniform weights.
                    lamina_core::quant::quantize_row_iq(dtype, chunk, dst, None).unwrap();
                }
                quant::dequantize_row(
                    dtype,
                    &bytes[r * row..(r + 1) * row],
                    &mut back[r * ne0..(r + 1) * ne0],
                )
                .unwrap();
            }
            (bytes, back.into_iter().map(f64::from).collect())
        }
    }
}

/// A leaf of `dtype` and shape `ne`, filled with `vals` (converted to the type).
pub fn leaf(g: &mut Graph, dtype: DType, ne: &[usize], vals: &[f32]) -> HostTensor {
    let id = g.new_input(dtype, ne).unwrap();
    let (bytes, vals) = encode(dtype, ne[0], vals);
    HostTensor { id, bytes, vals }
}

pub fn rand_leaf(g: &mut Graph, rng: &mut Rng, dtype: DType, ne: &[usize]) -> HostTensor {
    let n: usize = ne.iter().product();
    let v = rng.vec(n, 1.0);
    leaf(g, dtype, ne, &v)
}

/// Values of (possibly strided) view `id` in logical ggml order, from its root's values.
pub fn logical(g: &Graph, id: TensorId, root_vals: &[f64]) -> Vec<f64> {
    let t = g.tensor(id);
    let ts = g.tensor(g.root(id)).layout.dtype.type_size() as usize;
    let (ne, nb) = (t.layout.ne, t.layout.nb);
    let mut out = Vec::with_capacity(t.layout.nelements());
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    let byte = t.view_offset + i0 * nb[0] + i1 * nb[1] + i2 * nb[2] + i3 * nb[3];
                    out.push(root_vals[byte / ts]);
                }
            }
        }
    }
    out
}

/// Places every unbound root tensor in one buffer with sentinel gaps, uploads the inputs with
/// `set_async`, computes, reads `out` with `get_async`, checks the sentinels, and returns the
/// output values (decoded from `out`'s type).
pub fn run(dev: &dyn Device, mut g: Graph, inputs: &[&HostTensor], out: TensorId) -> Vec<f64> {
    let mut place = Vec::new();
    let mut end = GAP;
    for id in g.ids() {
        let t = g.tensor(id);
        if t.view_src.is_none() && t.binding.is_none() {
            let off = end.next_multiple_of(HOST_ALIGNMENT);
            place.push((id, off, t.layout.span_bytes()));
            end = off + t.layout.span_bytes() + GAP;
        }
    }
    let buffer = dev.buffer_type().alloc_buffer(end).unwrap();
    buffer.clear(SENTINEL).unwrap();
    for &(id, off, _) in &place {
        g.bind(id, buffer.memory(), off).unwrap();
    }
    g.set_output(out).unwrap();
    let g = Arc::new(g);
    let stream = dev.stream();
    for t in inputs {
        let slice = BufferSlice::of_tensor(&g, t.id).unwrap();
        stream.set_async(&slice, t.bytes.clone()).unwrap();
    }
    stream.compute_async(g.clone()).unwrap();
    let pending = stream
        .get_async(&BufferSlice::of_tensor(&g, out).unwrap())
        .unwrap();
    stream.synchronize().unwrap();
    let bytes = pending.wait().unwrap();
    // Sentinels: every byte outside the placed tensors must be untouched.
    let all = BufferSlice::whole(&buffer).read().unwrap();
    let mut covered = vec![false; all.len()];
    for &(_, off, len) in &place {
        covered[off..off + len].iter_mut().for_each(|c| *c = true);
    }
    for (i, (&b, &c)) in all.iter().zip(&covered).enumerate() {
        assert!(
            c || b == SENTINEL,
            "{}: sentinel byte {i} overwritten",
            dev.name()
        );
    }
    let t = g.tensor(out);
    let l = t.layout;
    match l.dtype {
        DType::I32 => bytes
            .chunks_exact(4)
            .map(|c| f64::from(i32::from_le_bytes(c.try_into().unwrap())))
            .collect(),
        _ => {
            let mut vals = vec![0f32; l.ne[0] * l.nrows()];
            let row = l.row_bytes();
            assert!(l.is_contiguous(), "outputs are read contiguous");
            for r in 0..l.nrows() {
                quant::dequantize_row(
                    l.dtype,
                    &bytes[r * row..(r + 1) * row],
                    &mut vals[r * l.ne[0]..(r + 1) * l.ne[0]],
                )
                .unwrap();
            }
            vals.into_iter().map(f64::from).collect()
        }
    }
}

pub fn nmse(out: &[f64], reference: &[f64]) -> f64 {
    assert_eq!(out.len(), reference.len(), "output length");
    let mut err = 0.0;
    let mut norm = 0.0;
    for (a, b) in out.iter().zip(reference) {
        assert!(!a.is_nan(), "NaN in output");
        if b.is_infinite() || a.is_infinite() {
            assert_eq!(a, b, "infinities must match");
            continue;
        }
        err += (a - b) * (a - b);
        norm += b * b;
    }
    if norm == 0.0 { err } else { err / norm }
}

pub fn check(what: &str, dev: &dyn Device, out: &[f64], reference: &[f64], limit: f64) {
    let e = nmse(out, reference);
    assert!(
        e <= limit,
        "{what} on {}: NMSE {e:e} > {limit:e}",
        dev.name()
    );
}

/// Runs `case` on every device of every configuration.
pub fn for_devices(mut case: impl FnMut(&dyn Device)) {
    for set in device_sets() {
        // Under Miri (slow), one device per configuration.
        let n = if cfg!(miri) { 1 } else { set.len() };
        for dev in &set[..n] {
            case(&**dev);
        }
    }
}

pub fn idx4(ne: [usize; 4], i: [usize; 4]) -> usize {
    i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))
}

pub fn for_each_index(ne: [usize; 4], mut f: impl FnMut([usize; 4])) {
    for i3 in 0..ne[3] {
        for i2 in 0..ne[2] {
            for i1 in 0..ne[1] {
                for i0 in 0..ne[0] {
                    f([i0, i1, i2, i3]);
                }
            }
        }
    }
}

pub fn full(ne: &[usize]) -> [usize; 4] {
    let mut f = [1; 4];
    f[..ne.len()].copy_from_slice(ne);
    f
}

/// `erf(x)` in f64 (Rust has no stable `erf`): the Maclaurin series below 2.5 (terms up to
/// `e^{x^2}`, so about 13 good digits), the continued fraction of `erfc` above.
pub fn erf64(x: f64) -> f64 {
    let ax = x.abs();
    let r = if ax < 2.5 {
        let mut term = ax;
        let mut sum = ax;
        let x2 = ax * ax;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
        }
        sum * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + (1/2)/(x + 1/(x + (3/2)/(x + ...)))), Lentz.
        let tiny = 1e-300;
        let mut f = ax;
        let mut c = ax;
        let mut d = 0.0;
        for k in 1..200 {
            let a = k as f64 / 2.0;
            d = ax + a * d;
            d = if d == 0.0 { tiny } else { 1.0 / d };
            c = ax + a / c;
            if c == 0.0 {
                c = tiny;
            }
            let delta = c * d;
            f *= delta;
            if (delta - 1.0).abs() < 1e-16 {
                break;
            }
        }
        1.0 - (-ax * ax).exp() / std::f64::consts::PI.sqrt() / f
    };
    if x < 0.0 { -r } else { r }
}
