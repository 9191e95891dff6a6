//! Graph execution on the GPU: which nodes the kernels can run (`supports_op`; the scheduler
//! sends the rest to the CPU), the host-side checks before a range of nodes is queued, and the
//! encoding of a range into one submission.

use std::collections::HashMap;
use std::ops::Range;

use lamina_backend::{BackendError, Buffer, BufferSlice, DeviceKey};
use lamina_core::DType;
use lamina_core::graph::{GluOp, Graph, Op, RopeMode, TensorId, UnaryOp};

use crate::gpu::Gpu;
use crate::kernels::{self, Kernels, TensorRef};
use crate::memory::WgpuBuffer;

/// The kernels' name for a tensor type they handle.
fn kernel_type(d: DType) -> Option<kernels::DType> {
    Some(match d {
        DType::F32 => kernels::DType::F32,
        DType::F16 => kernels::DType::F16,
        DType::I32 => kernels::DType::I32,
        DType::Q4_0 => kernels::DType::Q4_0,
        DType::Q4_1 => kernels::DType::Q4_1,
        DType::Q5_0 => kernels::DType::Q5_0,
        DType::Q8_0 => kernels::DType::Q8_0,
        DType::Q4_K => kernels::DType::Q4_K,
        DType::Q5_K => kernels::DType::Q5_K,
        DType::Q6_K => kernels::DType::Q6_K,
        _ => return None,
    })
}

/// Weight types of the matrix kernels.
const MATMUL_TYPES: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

/// Row types `get_rows` reads.
const GET_ROWS_TYPES: &[DType] = &[
    DType::F32,
    DType::F16,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q6_K,
];

/// `dst = w · x` as the CPU computes it: the exact path where it has a kernel, else the
/// activations rounded as the CPU rounds them for its dot products (f16, Q8_0/Q8_1, Q8_K) and
/// the fast kernels.
fn mul_mat(
    gpu: &Gpu,
    k: &mut Kernels,
    enc: &mut wgpu::CommandEncoder,
    w: TensorRef,
    x: TensorRef,
    dst: TensorRef,
) -> Result<(), Encode> {
    use kernels::DType as T;
    if let Some(plan) = k.exact_plan(&w, &x) {
        let scratch = gpu.create_buffer(plan.bytes)?;
        k.mul_mat_exact(enc, w, x, &scratch, dst, plan)?;
        return Ok(());
    }
    let mode = match w.dtype {
        T::F16 => Some(0),
        T::Q4_0 | T::Q4_1 | T::Q5_0 | T::Q8_0 => Some(1),
        T::Q4_K | T::Q5_K | T::Q6_K => Some(2),
        T::F32 | T::I32 => None,
    };
    match mode {
        Some(mode) => {
            let scratch = gpu.create_buffer(x.nelements() * 4)?;
            let rounded = TensorRef::contiguous(&scratch, 0, T::F32, x.ne);
            k.round_activations(enc, x, rounded, mode)?;
            k.mul_mat(enc, w, rounded, dst)?;
            // The encoder keeps the scratch buffer alive until the work is done.
        }
        None => k.mul_mat(enc, w, x, dst)?,
    }
    Ok(())
}

/// Whether the GPU kernels compute node `id` as the CPU does (same op, same parameters).
pub fn supports_op(graph: &Graph, id: TensorId) -> bool {
    let Ok(t) = graph.get(id) else { return false };
    let ty = |i: usize| t.src[i].map(|s| graph.tensor(s).layout.dtype);
    let out = t.layout.dtype;
    let f32_in = |i: usize| ty(i) == Some(DType::F32);
    match t.op {
        Op::Add | Op::Mul => f32_in(0) && f32_in(1) && out == DType::F32,
        Op::Scale { .. } | Op::RmsNorm { .. } | Op::Norm { .. } => f32_in(0) && out == DType::F32,
        Op::SoftMax { max_bias, .. } => {
            f32_in(0)
                && max_bias == 0.0
                && t.src[2].is_none()
                && ty(1).is_none_or(|m| matches!(m, DType::F16 | DType::F32))
                && out == DType::F32
        }
        Op::Rope(p) => {
            f32_in(0)
                && ty(1) == Some(DType::I32)
                && t.src[2].is_none()
                && p.ext_factor == 0.0
                && p.attn_factor == 1.0
                && p.n_offs == 0
                && out == DType::F32
        }
        Op::Unary(u) => matches!(u, UnaryOp::Silu | UnaryOp::Gelu) && f32_in(0),
        Op::Glu { op, swapped, .. } => {
            matches!(op, GluOp::SwiGlu | GluOp::GeGlu)
                && !swapped
                && f32_in(0)
                && f32_in(1)
                && out == DType::F32
        }
        Op::GetRows => {
            ty(0).is_some_and(|d| GET_ROWS_TYPES.contains(&d))
                && ty(1) == Some(DType::I32)
                && out == DType::F32
        }
        Op::SetRows => {
            f32_in(0) && matches!(ty(1), Some(DType::I32)) && matches!(out, DType::F32 | DType::F16)
        }
        Op::Cpy => f32_in(0) && matches!(out, DType::F32 | DType::F16),
        Op::Cont => f32_in(0) && out == DType::F32,
        Op::MulMat => {
            ty(0).is_some_and(|d| MATMUL_TYPES.contains(&d)) && f32_in(1) && out == DType::F32
        }
        Op::Attention { .. } => {
            f32_in(0)
                && matches!(
                    (ty(1), ty(2)),
                    (Some(DType::F16), Some(DType::F16)) | (Some(DType::F32), Some(DType::F32))
                )
                && f32_in(3)
                && t.src[4].is_none()
                && out == DType::F32
        }
        Op::FlashAttnExt { max_bias, .. } => {
            let shape = |i: usize| t.src[i].map(|s| graph.tensor(s).layout.ne);
            let (Some(q), Some(k), Some(v)) = (shape(0), shape(1), shape(2)) else {
                return false;
            };
            f32_in(0)
                && matches!(
                    (ty(1), ty(2)),
                    (Some(DType::F16), Some(DType::F16)) | (Some(DType::F32), Some(DType::F32))
                )
                && ty(3).is_none_or(|m| matches!(m, DType::F16 | DType::F32))
                && t.src[4].is_none()
                && max_bias == 0.0
                && q[0] == k[0]
                && k[0] == v[0]
                && q[0] as u32 <= kernels::FA_MAX_D
                && q[3] == 1
                && out == DType::F32
        }
        _ => false,
    }
}

/// Host-side checks before nodes `nodes` of `graph` are queued: every tensor they touch is in
/// a buffer of this device, and in bounds.
pub(crate) fn check(
    graph: &Graph,
    nodes: Range<usize>,
    device: DeviceKey,
    device_name: &str,
) -> Result<(), BackendError> {
    let nodes = nodes.start.min(graph.len())..nodes.end.min(graph.len());
    for id in graph.ids().skip(nodes.start).take(nodes.len()) {
        let t = graph.tensor(id);
        if !t.op.is_compute() {
            continue;
        }
        if !supports_op(graph, id) {
            return Err(BackendError::Unsupported {
                device: device_name.to_owned(),
                what: format!("{} of node {id} '{}'", t.op.name(), t.name),
            });
        }
        for s in std::iter::once(id).chain(t.sources()) {
            if t.op == Op::Cpy && Some(s) == t.src[1] {
                continue; // the destination operand: written through the node itself
            }
            BufferSlice::of_tensor_on(graph, s, device, device_name)?;
        }
    }
    Ok(())
}

/// The wgpu buffers of the tensors nodes `nodes` touch, by memory id.
fn gpu_buffers(
    graph: &Graph,
    nodes: Range<usize>,
) -> Result<HashMap<u64, wgpu::Buffer>, BackendError> {
    let mut out = HashMap::new();
    for id in graph.ids().skip(nodes.start).take(nodes.len()) {
        let t = graph.tensor(id);
        if !t.op.is_compute() {
            continue;
        }
        for s in std::iter::once(id).chain(t.sources()) {
            let Some((memory, _)) = graph.resolve(s) else {
                continue;
            };
            let mid = memory.memory_id();
            if out.contains_key(&mid) {
                continue;
            }
            let foreign = || BackendError::Unbound(format!("{s} is not in GPU memory"));
            let buffer = Buffer::from_memory(memory).ok_or_else(foreign)?;
            let gpu_buffer = buffer
                .implementation()
                .as_any()
                .downcast_ref::<WgpuBuffer>()
                .ok_or_else(foreign)?
                .buffer
                .clone();
            out.insert(mid, gpu_buffer);
        }
    }
    Ok(out)
}

fn tensor_ref<'a>(
    graph: &Graph,
    id: TensorId,
    buffers: &'a HashMap<u64, wgpu::Buffer>,
) -> Result<TensorRef<'a>, BackendError> {
    let t = graph.tensor(id);
    let unbound = || BackendError::Unbound(format!("{id} '{}'", t.name));
    let (memory, offset) = graph.resolve(id).ok_or_else(unbound)?;
    let buffer = buffers.get(&memory.memory_id()).ok_or_else(unbound)?;
    let dtype = kernel_type(t.layout.dtype).ok_or_else(|| BackendError::Unsupported {
        device: "WGPU".into(),
        what: format!("tensor type {}", t.layout.dtype),
    })?;
    Ok(TensorRef {
        buffer,
        offset: offset as u64,
        dtype,
        ne: t.layout.ne.map(|n| n as u64),
        nb: t.layout.nb.map(|n| n as u64),
    })
}

/// Encodes nodes `nodes` of `graph` into one submission and waits for it.
pub(crate) fn execute(
    gpu: &Gpu,
    device_name: &str,
    graph: &Graph,
    nodes: Range<usize>,
) -> Result<(), BackendError> {
    let nodes = nodes.start.min(graph.len())..nodes.end.min(graph.len());
    let buffers = gpu_buffers(graph, nodes.clone())?;
    let kernel_error = |id: TensorId, e: kernels::Error| BackendError::Device {
        device: device_name.to_owned(),
        message: format!(
            "{} of node {id} '{}': {e}",
            graph.tensor(id).op.name(),
            graph.tensor(id).name
        ),
    };
    let mut k = gpu.kernels();
    let mut encoder = gpu.encoder();
    for id in graph.ids().skip(nodes.start).take(nodes.len()) {
        let t = graph.tensor(id);
        if !t.op.is_compute() {
            continue;
        }
        encode(gpu, &mut k, &mut encoder, graph, id, &buffers).map_err(|e| match e {
            Encode::Kernel(e) => kernel_error(id, e),
            Encode::Backend(e) => e,
        })?;
    }
    let index = k.submit(encoder);
    drop(k);
    gpu.wait(Some(index))
}

enum Encode {
    Kernel(kernels::Error),
    Backend(BackendError),
}

impl From<kernels::Error> for Encode {
    fn from(e: kernels::Error) -> Encode {
        Encode::Kernel(e)
    }
}

impl From<BackendError> for Encode {
    fn from(e: BackendError) -> Encode {
        Encode::Backend(e)
    }
}

fn encode(
    gpu: &Gpu,
    k: &mut Kernels,
    enc: &mut wgpu::CommandEncoder,
    graph: &Graph,
    id: TensorId,
    buffers: &HashMap<u64, wgpu::Buffer>,
) -> Result<(), Encode> {
    let t = graph.tensor(id);
    let src = |i: usize| -> Result<TensorRef<'_>, BackendError> {
        let s = t.src[i].ok_or_else(|| {
            BackendError::Unbound(format!("source {i} of {id} ({})", t.op.name()))
        })?;
        tensor_ref(graph, s, buffers)
    };
    let dst = tensor_ref(graph, id, buffers)?;
    match t.op {
        Op::Add => k.add(enc, src(0)?, src(1)?, dst)?,
        Op::Mul => k.mul(enc, src(0)?, src(1)?, dst)?,
        Op::Scale { scale, bias } => k.scale(enc, src(0)?, dst, scale, bias)?,
        Op::RmsNorm { eps } => k.rms_norm(enc, src(0)?, dst, eps)?,
        Op::Norm { eps } => k.norm(enc, src(0)?, dst, eps)?,
        Op::SoftMax { scale, .. } => {
            let mask = match t.src[1] {
                Some(m) => Some(tensor_ref(graph, m, buffers)?),
                None => None,
            };
            k.soft_max(enc, src(0)?, mask, dst, scale)?
        }
        Op::Rope(p) => {
            let mode = match p.mode {
                RopeMode::Normal => kernels::RopeMode::Norm,
                RopeMode::Neox => kernels::RopeMode::Neox,
            };
            let n_dims = u32::try_from(p.n_dims)
                .map_err(|_| kernels::Error::Invalid("rope n_dims".into()))?;
            k.rope(
                enc,
                src(0)?,
                src(1)?,
                dst,
                mode,
                n_dims,
                p.freq_base,
                p.freq_scale,
            )?
        }
        Op::Unary(u) => {
            let op = match u {
                UnaryOp::Silu => kernels::UnaryOp::Silu,
                _ => kernels::UnaryOp::Gelu,
            };
            k.unary(enc, op, src(0)?, dst)?
        }
        Op::Glu { op, .. } => {
            let op = match op {
                GluOp::SwiGlu => kernels::UnaryOp::Silu,
                _ => kernels::UnaryOp::Gelu,
            };
            k.glu(enc, op, src(0)?, src(1)?, dst)?
        }
        Op::FlashAttnExt {
            scale,
            softcap,
            kv_chunks,
            ..
        } => {
            let mask = match t.src[3] {
                Some(m) => Some(tensor_ref(graph, m, buffers)?),
                None => None,
            };
            k.flash_attn(
                enc,
                src(0)?,
                src(1)?,
                src(2)?,
                mask,
                dst,
                scale,
                softcap,
                kv_chunks,
            )?
        }
        Op::GetRows => k.get_rows(enc, src(0)?, src(1)?, dst)?,
        Op::SetRows => k.set_rows(enc, src(0)?, src(1)?, dst)?,
        Op::Cpy => k.cpy(enc, src(0)?, dst)?,
        Op::Cont => k.cont(enc, src(0)?, dst)?,
        Op::MulMat => mul_mat(gpu, k, enc, src(0)?, src(1)?, dst)?,
        Op::Attention { scale } => {
            // mul_mat(k, q), soft_max_ext(·, mask, scale), mul_mat(v, ·) with their kernels:
            // the CPU's fused node gives those ops' bits. The scores live in scratch buffers;
            // the last product writes dst ([head_v, n_head, n_tokens]) through permuted strides.
            let (q, kc, v, mask) = (src(0)?, src(1)?, src(2)?, src(3)?);
            let (n_kv, n_tokens, n_head, head_v) = (kc.ne[1], q.ne[1], q.ne[2], v.ne[1]);
            let shape = [n_kv, n_tokens, n_head, 1];
            let bytes = n_kv * n_tokens * n_head * 4;
            let (kq_buf, p_buf) = (gpu.create_buffer(bytes)?, gpu.create_buffer(bytes)?);
            let kq = TensorRef::contiguous(&kq_buf, 0, kernels::DType::F32, shape);
            let probs = TensorRef::contiguous(&p_buf, 0, kernels::DType::F32, shape);
            mul_mat(gpu, k, enc, kc, q, kq)?;
            k.soft_max(enc, kq, Some(mask), probs, scale)?;
            let row = 4 * head_v;
            let out = dst.view(
                0,
                [head_v, n_tokens, n_head, 1],
                [4, row * n_head, row, row * n_head * n_tokens],
            );
            mul_mat(gpu, k, enc, v, probs, out)?;
        }
        _ => {
            return Err(Encode::Backend(BackendError::Unsupported {
                device: "WGPU".into(),
                what: t.op.name().into(),
            }));
        }
    }
    Ok(())
}
