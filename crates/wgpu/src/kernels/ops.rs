pub use crate::kernels::shaders::MatVecConfig;
use crate::kernels::shaders::{self, PARAMS_WORDS};
use crate::kernels::{DType, Error, Result, TensorRef};
use std::collections::HashMap;

/// Element-wise activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Silu,
    /// ggml's tanh approximation.
    Gelu,
}

impl UnaryOp {
    fn expr(self, v: &str) -> String {
        match self {
            // ggml_vec_silu_f32 per row: `ggml_v_silu` on groups of 8, libm's expf (here the
            // shader's exp) on the last ne0 % 8.
            UnaryOp::Silu => format!("select(silu({v}), v_silu({v}), i0 < ne0 / 8u * 8u)"),
            UnaryOp::Gelu => format!("gelu({v})"),
        }
    }
}

/// ggml rope modes (0 and 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeMode {
    /// Rotates adjacent pairs (2i, 2i+1).
    Norm,
    /// Rotates pairs (i, i + n_dims/2).
    Neox,
}

/// How the exact path runs one quantized product ([`Kernels::exact_plan`]). The CPU backend
/// computes each output with llama.cpp's AVX2 arithmetic (integer block sums, then f32 FMAs in
/// a fixed order); a GPU kernel that sums in another order parts from it by an ulp here and
/// there, and an ulp can flip a later f16 or Q8 rounding, which Gemma 3 amplifies ~10× a layer
/// (logits 1e-3 apart). The exact path repeats the CPU's activation quantizer and per-output
/// arithmetic instead, one invocation per output: slower on a real GPU than the mat-vec and
/// tiled kernels, which `LAMINA_WGPU_FAST_MATMUL=1` selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExactPlan {
    /// [`shaders::quantize_act`]'s mode.
    pub mode: u32,
    /// [`shaders::mul_mat_exact`]'s kernel variant.
    pub variant: u32,
    /// Q4_K repacked: activation rows taken by the gemm kernel (the rest by gemv).
    pub gemm_cols: u32,
    /// Words of one quantized activation row.
    pub row_words: u64,
    /// Bytes of the quantized activations.
    pub bytes: u64,
}

/// Which mul_mat kernel to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatMulPath {
    /// f32/f16 weights: `shaders::fmatmul` (the CPU's order); others: mat-vec for
    /// `N <= Kernels::MATVEC_MAX_N`, tiled otherwise.
    Auto,
    MatVec,
    Tiled,
}

const PARAM_SLOT: u64 = (PARAMS_WORDS * 4) as u64;
const PARAM_CHUNK: u64 = 64 * 1024;

/// Per-op uniform parameters: each op gets its own slot, written to the GPU
/// once per submission by `flush`, so ops in one encoder never share one.
struct ParamArena {
    chunks: Vec<(wgpu::Buffer, Vec<u8>)>,
    cur: usize,
    used: u64,
    align: u64,
}

impl ParamArena {
    fn alloc(&mut self, device: &wgpu::Device, words: &[u32]) -> (wgpu::Buffer, u64) {
        if self.cur < self.chunks.len() && self.used + PARAM_SLOT > PARAM_CHUNK {
            self.cur += 1;
            self.used = 0;
        }
        if self.cur == self.chunks.len() {
            let buf = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("lamina params"),
                size: PARAM_CHUNK,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            self.chunks.push((buf, vec![0u8; PARAM_CHUNK as usize]));
        }
        let off = self.used;
        let (buf, data) = &mut self.chunks[self.cur];
        let slot = &mut data[off as usize..(off + PARAM_SLOT) as usize];
        slot.fill(0);
        for (i, w) in words.iter().enumerate() {
            slot[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        self.used += PARAM_SLOT.div_ceil(self.align) * self.align;
        (buf.clone(), off)
    }

    fn flush(&mut self, queue: &wgpu::Queue) {
        for (i, (buf, data)) in self.chunks.iter().enumerate() {
            let n = match i.cmp(&self.cur) {
                std::cmp::Ordering::Less => PARAM_CHUNK,
                std::cmp::Ordering::Equal => self.used,
                std::cmp::Ordering::Greater => 0,
            };
            if n > 0 {
                queue.write_buffer(buf, 0, &data[..n as usize]);
            }
        }
        self.cur = 0;
        self.used = 0;
    }
}

/// A bound window of a buffer: `[base, base + size)`.
#[derive(Clone)]
struct Bind {
    buf: wgpu::Buffer,
    base: u64,
    size: u64,
}

/// Pipeline cache + op encoders. Ops are recorded into a caller's encoder;
/// call [`Kernels::submit`] (or [`Kernels::flush`] right before your own
/// `queue.submit`) so their parameters are uploaded. Parameters live in
/// slots reused after each flush, so flush+submit each encoder before
/// encoding the next one.
pub struct Kernels {
    device: wgpu::Device,
    queue: wgpu::Queue,
    subgroups: bool,
    /// Quantized products by the exact path where it has a kernel ([`ExactPlan`]).
    exact: bool,
    storage_align: u64,
    max_binding: u64,
    pipelines: HashMap<String, wgpu::ComputePipeline>,
    arena: ParamArena,
    matvec_cfg: MatVecConfig,
}

type Groups = [u32; 3];

fn u32_of(v: u64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Unsupported(format!("{what} = {v} does not fit in u32")))
}

/// 1-D grid of 256-thread workgroups split over x/y (x <= 65535).
fn grid(threads: u64, per_group: u64) -> Result<Groups> {
    let wgs = threads.div_ceil(per_group).max(1);
    let x = wgs.min(65535);
    let y = wgs.div_ceil(x);
    if y > 65535 {
        return Err(Error::Unsupported(format!(
            "{threads} threads exceed the dispatch grid"
        )));
    }
    Ok([x as u32, y as u32, 1])
}

fn expect(t: &TensorRef, what: &str, types: &[DType]) -> Result<()> {
    t.check(what)?;
    if !types.contains(&t.dtype) {
        return Err(Error::Invalid(format!(
            "{what}: type {:?} not in {types:?}",
            t.dtype
        )));
    }
    Ok(())
}

fn same_shape(a: &TensorRef, b: &TensorRef, what: &str) -> Result<()> {
    if a.ne != b.ne {
        return Err(Error::Invalid(format!(
            "{what}: shapes {:?} and {:?} differ",
            a.ne, b.ne
        )));
    }
    Ok(())
}

fn contiguous(t: &TensorRef, what: &str) -> Result<()> {
    if !t.is_contiguous() {
        return Err(Error::Invalid(format!(
            "{what} must be contiguous (nb {:?})",
            t.nb
        )));
    }
    Ok(())
}

/// Strides in elements (plain types) as u32.
/// A matrix product's shapes: `dst = [M, N, ne12, ne13]` for `src0 = [K, M, ne02, ne03]` and
/// `src1 = [K, N, ne12, ne13]`, src0 broadcast over dims 2 and 3.
fn mm_shapes(src0: &TensorRef, src1: &TensorRef, dst: &TensorRef, what: &str) -> Result<()> {
    let (k, m, n) = (src0.ne[0], src0.ne[1], src1.ne[1]);
    if src1.ne[0] != k
        || dst.ne != [m, n, src1.ne[2], src1.ne[3]]
        || src0.ne[2] == 0
        || src0.ne[3] == 0
        || !src1.ne[2].is_multiple_of(src0.ne[2])
        || !src1.ne[3].is_multiple_of(src0.ne[3])
    {
        return Err(Error::Invalid(format!(
            "{what}: src0 {:?} src1 {:?} dst {:?} mismatch",
            src0.ne, src1.ne, dst.ne
        )));
    }
    Ok(())
}

fn strides(t: &TensorRef) -> Result<[u32; 4]> {
    let es = t.dtype.block_bytes();
    let mut s = [0u32; 4];
    for (d, &nb) in s.iter_mut().zip(&t.nb) {
        *d = u32_of(nb / es, "stride")?;
    }
    Ok(s)
}

fn ne32(t: &TensorRef) -> [u32; 4] {
    // `check` already bounded ne by u32::MAX.
    t.ne.map(|n| n as u32)
}

impl Kernels {
    /// Largest N for which `MatMulPath::Auto` picks the mat-vec kernel.
    pub const MATVEC_MAX_N: u64 = 8;

    /// Uses `device.features()` to decide on subgroup reductions.
    pub fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Self {
        let limits = device.limits();
        Kernels {
            device: device.clone(),
            queue: queue.clone(),
            subgroups: device.features().contains(wgpu::Features::SUBGROUP),
            exact: std::env::var_os("LAMINA_WGPU_FAST_MATMUL").is_none_or(|v| v != "1"),
            storage_align: limits.min_storage_buffer_offset_alignment.max(4) as u64,
            max_binding: limits.max_storage_buffer_binding_size,
            pipelines: HashMap::new(),
            // Measured on lavapipe: per-workgroup overhead dominates, so small
            // workgroups with several rows win, and sharing weight loads across
            // columns does not pay (weights sit in CPU cache). GPUs get a
            // conventional, untuned shape.
            matvec_cfg: if device.adapter_info().device_type == wgpu::DeviceType::Cpu {
                MatVecConfig {
                    wg: 16,
                    rows: 4,
                    cols: 1,
                }
            } else {
                MatVecConfig {
                    wg: 64,
                    rows: 2,
                    cols: 4,
                }
            },
            arena: ParamArena {
                chunks: Vec::new(),
                cur: 0,
                used: 0,
                align: limits.min_uniform_buffer_offset_alignment.max(4) as u64,
            },
        }
    }

    /// Disables subgroup reductions (to test the shared-memory path).
    pub fn set_subgroups(&mut self, on: bool) {
        self.subgroups = on && self.device.features().contains(wgpu::Features::SUBGROUP);
    }

    /// Tunes the mat-vec launch shape (wg a power of two in 8..=256, rows in 1..=4).
    pub fn set_matvec_config(&mut self, cfg: MatVecConfig) -> Result<()> {
        if !cfg.wg.is_power_of_two() || !(8..=256).contains(&cfg.wg) || !(1..=4).contains(&cfg.rows)
        {
            return Err(Error::Invalid(format!("bad mat-vec config {cfg:?}")));
        }
        self.matvec_cfg = cfg;
        Ok(())
    }

    /// Caps the bytes bound per tensor (default and maximum: the device's
    /// `max_storage_buffer_binding_size`); larger 2-D weights are split by rows.
    pub fn set_binding_limit(&mut self, bytes: u64) {
        self.max_binding = bytes.clamp(1024, self.device.limits().max_storage_buffer_binding_size);
    }

    pub fn uses_subgroups(&self) -> bool {
        self.subgroups
    }

    /// Uploads the parameters of every op encoded since the last flush.
    pub fn flush(&mut self) {
        self.arena.flush(&self.queue);
    }

    /// Flushes parameters and submits `enc`.
    pub fn submit(&mut self, enc: wgpu::CommandEncoder) -> wgpu::SubmissionIndex {
        self.flush();
        self.queue.submit([enc.finish()])
    }

    /// Number of compiled pipelines (for tests of the cache).
    pub fn pipeline_count(&self) -> usize {
        self.pipelines.len()
    }

    fn pipeline(
        &mut self,
        key: &str,
        src: impl FnOnce() -> String,
    ) -> Result<wgpu::ComputePipeline> {
        if let Some(p) = self.pipelines.get(key) {
            return Ok(p.clone());
        }
        // Capture shader/pipeline errors as Err instead of the device's error handler.
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(key),
                source: wgpu::ShaderSource::Wgsl(src().into()),
            });
        let p = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("pipeline {key}: {e}")));
        }
        self.pipelines.insert(key.to_string(), p.clone());
        Ok(p)
    }

    /// Binds the smallest aligned window holding `t`; returns it and the
    /// byte offset of `t` inside the window.
    fn bind(&self, t: &TensorRef) -> Result<(Bind, u64)> {
        let base = t.offset / self.storage_align * self.storage_align;
        let end = (t.offset + t.extent()).div_ceil(4) * 4;
        let size = (end - base).max(4).min(t.buffer.size() - base);
        if size > self.max_binding {
            return Err(Error::Unsupported(format!(
                "tensor window of {size} bytes exceeds max_storage_buffer_binding_size {}",
                self.max_binding
            )));
        }
        Ok((
            Bind {
                buf: t.buffer.clone(),
                base,
                size,
            },
            t.offset - base,
        ))
    }

    /// Like `bind`, with the offset in elements of the tensor's type.
    fn bind_el(&self, t: &TensorRef) -> Result<(Bind, u32)> {
        let (b, off) = self.bind(t)?;
        Ok((b, u32_of(off / t.dtype.block_bytes(), "offset")?))
    }

    fn dispatch(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        key: &str,
        src: impl FnOnce() -> String,
        binds: &[Bind],
        params: &[u32],
        groups: Groups,
    ) -> Result<()> {
        if params.len() > shaders::OPAQUE_WORD {
            return Err(Error::Invalid("too many params".into()));
        }
        let pipeline = self.pipeline(key, src)?;
        let (pbuf, poff) = self.arena.alloc(&self.device, params);
        let mut entries: Vec<wgpu::BindGroupEntry> = binds
            .iter()
            .enumerate()
            .map(|(i, b)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &b.buf,
                    offset: b.base,
                    size: wgpu::BufferSize::new(b.size),
                }),
            })
            .collect();
        entries.push(wgpu::BindGroupEntry {
            binding: binds.len() as u32,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &pbuf,
                offset: poff,
                size: wgpu::BufferSize::new(PARAM_SLOT),
            }),
        });
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::Gpu(format!("{key}: bind group: {e}")));
        }
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some(key),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn binary_impl(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        key: &str,
        expr: &str,
        a: &TensorRef,
        b: &TensorRef,
        dst: &TensorRef,
        broadcast: bool,
    ) -> Result<()> {
        expect(a, "src0", &[DType::F32])?;
        expect(b, "src1", &[DType::F32])?;
        expect(dst, "dst", &[DType::F32])?;
        same_shape(a, dst, key)?;
        contiguous(dst, "dst")?;
        for i in 0..4 {
            let ok = if broadcast {
                b.ne[i] > 0 && a.ne[i].is_multiple_of(b.ne[i])
            } else {
                b.ne[i] == a.ne[i]
            };
            if !ok {
                return Err(Error::Invalid(format!(
                    "{key}: src1 {:?} does not broadcast to {:?}",
                    b.ne, a.ne
                )));
            }
        }
        if a.nelements() == 0 {
            return Ok(());
        }
        let (ba, oa) = self.bind_el(a)?;
        let (bb, ob) = self.bind_el(b)?;
        let (bd, od) = self.bind_el(dst)?;
        let mut p = vec![u32_of(a.nelements(), "n")?];
        p.extend(ne32(a));
        p.push(oa);
        p.extend(strides(a)?);
        p.push(ob);
        p.extend(ne32(b));
        p.extend(strides(b)?);
        p.push(od);
        let g = grid(a.nelements(), 256)?;
        let e = expr.to_string();
        self.dispatch(enc, key, || shaders::binary(&e), &[ba, bb, bd], &p, g)
    }

    /// `dst = a + b`, `b` broadcast over `a` (b.ne[i] divides a.ne[i]); dst contiguous.
    pub fn add(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        a: TensorRef,
        b: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        self.binary_impl(enc, "add", "a + b", &a, &b, &dst, true)
    }

    /// `dst = a * b` with broadcasting like [`Kernels::add`].
    pub fn mul(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        a: TensorRef,
        b: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        self.binary_impl(enc, "mul", "a * b", &a, &b, &dst, true)
    }

    /// Split GLU: `dst = op(a) * b` (SwiGLU with Silu, GEGLU with Gelu); same shapes.
    pub fn glu(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        op: UnaryOp,
        a: TensorRef,
        b: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        let key = format!("glu_{op:?}");
        self.binary_impl(
            enc,
            &key,
            &format!("{} * b", op.expr("a")),
            &a,
            &b,
            &dst,
            false,
        )
    }

    fn map_impl(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        name: &str,
        expr: &str,
        src: &TensorRef,
        dst: &TensorRef,
        f: [f32; 2],
    ) -> Result<()> {
        expect(src, "src", &[DType::F32, DType::F16])?;
        expect(dst, "dst", &[DType::F32, DType::F16])?;
        same_shape(src, dst, name)?;
        if src.nelements() == 0 {
            return Ok(());
        }
        let (bs, os) = self.bind_el(src)?;
        let (bd, od) = self.bind_el(dst)?;
        let mut p = vec![u32_of(src.nelements(), "n")?];
        p.extend(ne32(src));
        p.push(os);
        p.extend(strides(src)?);
        p.push(od);
        p.extend(strides(dst)?);
        p.push(f[0].to_bits());
        p.push(f[1].to_bits());
        let key = format!("map_{name}_{}_{}", src.dtype.tag(), dst.dtype.tag());
        let (e, st, dt) = (expr.to_string(), src.dtype, dst.dtype);
        let g = grid(src.nelements(), 256)?;
        self.dispatch(enc, &key, || shaders::map(&e, st, dt), &[bs, bd], &p, g)
    }

    /// `dst = op(src)`; src f32/f16 with any strides, dst f32/f16 with any strides.
    pub fn unary(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        op: UnaryOp,
        src: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        self.map_impl(enc, &format!("{op:?}"), &op.expr("x"), &src, &dst, [0.0; 2])
    }

    /// Activations rounded as the CPU rounds them for its dot products (see
    /// [`shaders::round_act`]): `mode` 0 to f16, 1 through Q8_0/Q8_1, 2 through Q8_K. `src`
    /// f32 with any strides, rows of whole blocks; `dst` f32 of the same shape.
    pub fn round_activations(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        dst: TensorRef,
        mode: u32,
    ) -> Result<()> {
        expect(&src, "src", &[DType::F32])?;
        expect(&dst, "dst", &[DType::F32])?;
        same_shape(&src, &dst, "round_activations")?;
        let block = match mode {
            0 => 1,
            1 => 32,
            2 => 256,
            _ => return Err(Error::Invalid(format!("rounding mode {mode}"))),
        };
        if !src.ne[0].is_multiple_of(block) {
            return Err(Error::Invalid(format!(
                "round_activations: rows of {} values are not whole blocks of {block}",
                src.ne[0]
            )));
        }
        if src.nelements() == 0 {
            return Ok(());
        }
        let (bs, os) = self.bind_el(&src)?;
        let (bd, od) = self.bind_el(&dst)?;
        let blocks = src.nelements() / block;
        let mut p = vec![u32_of(blocks, "blocks")?];
        p.extend(ne32(&src));
        p.push(os);
        p.extend(strides(&src)?);
        p.push(od);
        p.extend(strides(&dst)?);
        p.push(mode);
        let g = grid(blocks, 256)?;
        self.dispatch(enc, "round_act", shaders::round_act, &[bs, bd], &p, g)
    }

    /// `dst = src * s + bias`.
    pub fn scale(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        dst: TensorRef,
        s: f32,
        bias: f32,
    ) -> Result<()> {
        self.map_impl(enc, "scale", "x * pf(15u) + pf(16u)", &src, &dst, [s, bias])
    }

    /// Copy with conversion (f32/f16 -> f32/f16), any strides on both sides; same shape.
    pub fn cpy(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        self.map_impl(enc, "cpy", "x", &src, &dst, [0.0; 2])
    }

    /// Strided -> contiguous copy (dst must be contiguous).
    pub fn cont(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        contiguous(&dst, "cont dst")?;
        self.cpy(enc, src, dst)
    }

    /// ggml set_rows: `dst[:, ids[i1, i2 % ids.ne1, i3 % ids.ne2], i2, i3] = src[:, i1, i2, i3]`.
    /// src f32 [ne0, n, ne2, ne3], ids i32 [n, ., .], dst f32/f16. Out-of-range ids are skipped.
    pub fn set_rows(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        ids: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        expect(&src, "src", &[DType::F32])?;
        expect(&ids, "ids", &[DType::I32])?;
        expect(&dst, "dst", &[DType::F32, DType::F16])?;
        if ids.ne[0] != src.ne[1]
            || ids.ne[3] != 1
            || ids.ne[1] == 0
            || ids.ne[2] == 0
            || !src.ne[2].is_multiple_of(ids.ne[1])
            || !src.ne[3].is_multiple_of(ids.ne[2])
            || dst.ne[0] != src.ne[0]
            || dst.ne[2] != src.ne[2]
            || dst.ne[3] != src.ne[3]
        {
            return Err(Error::Invalid(format!(
                "set_rows: src {:?} ids {:?} dst {:?} mismatch",
                src.ne, ids.ne, dst.ne
            )));
        }
        if src.nelements() == 0 {
            return Ok(());
        }
        let (bs, os) = self.bind_el(&src)?;
        let (bi, oi) = self.bind_el(&ids)?;
        let (bd, od) = self.bind_el(&dst)?;
        let (ss, is, ds) = (strides(&src)?, strides(&ids)?, strides(&dst)?);
        let mut p = vec![u32_of(src.nelements(), "n")?];
        p.extend(ne32(&src));
        p.push(os);
        p.extend(ss);
        p.extend([oi, ids.ne[1] as u32, ids.ne[2] as u32, is[0], is[1], is[2]]);
        p.extend([od, ds[0], ds[1], ds[2], dst.ne[1] as u32, ds[3]]);
        let dt = dst.dtype;
        let key = format!("set_rows_{}", dt.tag());
        let g = grid(src.nelements(), 256)?;
        self.dispatch(enc, &key, || shaders::set_rows(dt), &[bs, bi, bd], &p, g)
    }

    /// ggml get_rows: src0 [ne0, rows, ne2, ne3] (F32/F16/quantized), ids i32 [n, ne2, ne3],
    /// dst f32 [ne0, n, ne2, ne3] (row-contiguous). Out-of-range ids leave their dst row untouched.
    /// Tables larger than one storage binding are split over several dispatches.
    pub fn get_rows(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src0: TensorRef,
        ids: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        src0.check("src0")?;
        if src0.dtype == DType::I32 {
            return Err(Error::Invalid("get_rows: i32 src0".into()));
        }
        expect(&ids, "ids", &[DType::I32])?;
        expect(&dst, "dst", &[DType::F32])?;
        if !src0.dtype.is_quantized() && src0.nb[0] != src0.dtype.block_bytes() {
            return Err(Error::Invalid(
                "get_rows: src0 rows must be contiguous".into(),
            ));
        }
        if dst.ne != [src0.ne[0], ids.ne[0], ids.ne[1], ids.ne[2]]
            || ids.ne[3] != 1
            || ids.ne[1] != src0.ne[2]
            || ids.ne[2] != src0.ne[3]
            || dst.nb[0] != 4
        {
            return Err(Error::Invalid(format!(
                "get_rows: src0 {:?} ids {:?} dst {:?} mismatch",
                src0.ne, ids.ne, dst.ne
            )));
        }
        if dst.nelements() == 0 {
            return Ok(());
        }
        if src0.ne[1] > i32::MAX as u64 {
            return Err(Error::Unsupported(
                "get_rows: more than i32::MAX rows".into(),
            ));
        }
        for (r0, rows) in self.row_chunks(&src0)? {
            let view = src0.view(
                r0 * src0.nb[1],
                [src0.ne[0], rows, src0.ne[2], src0.ne[3]],
                src0.nb,
            );
            self.get_rows_chunk(enc, &view, r0, &ids, &dst)?;
        }
        Ok(())
    }

    /// Splits src0 into row ranges whose windows fit one storage binding
    /// (only 2-D tensors can be split).
    fn row_chunks(&self, src0: &TensorRef) -> Result<Vec<(u64, u64)>> {
        let budget = self.max_binding.saturating_sub(self.storage_align + 4);
        if src0.extent() <= budget {
            return Ok(vec![(0, src0.ne[1])]);
        }
        // Multiples of 4 rows keep every chunk's offset 4-byte aligned (210-byte Q6_K rows).
        let per = budget / src0.nb[1].max(1) / 4 * 4;
        if src0.ne[2] * src0.ne[3] != 1 || per == 0 || src0.nb[1] < src0.dtype.row_bytes(src0.ne[0])
        {
            return Err(Error::Unsupported(format!(
                "src0 of {} bytes exceeds max_storage_buffer_binding_size {} and cannot be split by rows",
                src0.extent(),
                self.max_binding
            )));
        }
        Ok((0..src0.ne[1].div_ceil(per))
            .map(|c| (c * per, per.min(src0.ne[1] - c * per)))
            .collect())
    }

    fn get_rows_chunk(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src0: &TensorRef,
        r0: u64,
        ids: &TensorRef,
        dst: &TensorRef,
    ) -> Result<()> {
        let (src0, ids, dst) = (*src0, *ids, *dst);
        let (bw, ow) = self.bind(&src0)?;
        let (bi, oi) = self.bind_el(&ids)?;
        let (bd, od) = self.bind_el(&dst)?;
        let (is, ds) = (strides(&ids)?, strides(&dst)?);
        let mut p = vec![u32_of(dst.nelements(), "n")?];
        p.extend(ne32(&dst));
        p.push(u32_of(ow, "offset")?);
        for i in 1..4 {
            p.push(u32_of(src0.nb[i], "src0 stride")?);
        }
        p.extend([oi, is[0], is[1], is[2]]);
        p.extend([od, ds[1], ds[2], ds[3]]);
        p.push(r0 as u32);
        p.push((r0 + src0.ne[1]) as u32);
        let dt = src0.dtype;
        let key = format!("get_rows_{}", dt.tag());
        let g = grid(dst.nelements(), 256)?;
        self.dispatch(enc, &key, || shaders::get_rows(dt), &[bw, bi, bd], &p, g)
    }

    /// Row kernels' shared params: ne0..2, nrows, src off+strides, dst off+row strides.
    fn row_params(&self, src: &TensorRef, dst: &TensorRef, os: u32, od: u32) -> Result<Vec<u32>> {
        let (ss, ds) = (strides(src)?, strides(dst)?);
        let mut p = vec![
            src.ne[0] as u32,
            src.ne[1] as u32,
            src.ne[2] as u32,
            u32_of(src.nrows(), "rows")?,
        ];
        p.push(os);
        p.extend(ss);
        p.extend([od, ds[1], ds[2], ds[3]]);
        Ok(p)
    }

    fn norm_impl(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        rms: bool,
        src: &TensorRef,
        dst: &TensorRef,
        eps: f32,
    ) -> Result<()> {
        expect(src, "src", &[DType::F32])?;
        expect(dst, "dst", &[DType::F32])?;
        same_shape(src, dst, "norm")?;
        if dst.nb[0] != 4 {
            return Err(Error::Invalid("norm: dst rows must be contiguous".into()));
        }
        if src.nelements() == 0 {
            return Ok(());
        }
        let (bs, os) = self.bind_el(src)?;
        let (bd, od) = self.bind_el(dst)?;
        let mut p = self.row_params(src, dst, os, od)?;
        p.push(eps.to_bits());
        let sg = self.subgroups;
        let key = format!("norm_{rms}_{sg}");
        let g = grid(src.nrows(), 1)?;
        self.dispatch(enc, &key, || shaders::norm(rms, sg), &[bs, bd], &p, g)
    }

    /// Per row: `y = x / sqrt(mean(x^2) + eps)`. dst rows contiguous.
    pub fn rms_norm(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        dst: TensorRef,
        eps: f32,
    ) -> Result<()> {
        self.norm_impl(enc, true, &src, &dst, eps)
    }

    /// Per row: `y = (x - mean) / sqrt(var + eps)` (no weights).
    pub fn norm(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        dst: TensorRef,
        eps: f32,
    ) -> Result<()> {
        self.norm_impl(enc, false, &src, &dst, eps)
    }

    /// Per row: `softmax(x * scale + mask)`; mask f16/f32 [ne0, m1, m2, m3] with
    /// row `(i1 % m1, i2 % m2, i3 % m3)`. A row that is all -inf gives zeros (ggml: NaN).
    pub fn soft_max(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        mask: Option<TensorRef>,
        dst: TensorRef,
        scale: f32,
    ) -> Result<()> {
        expect(&src, "src", &[DType::F32])?;
        expect(&dst, "dst", &[DType::F32])?;
        same_shape(&src, &dst, "soft_max")?;
        if dst.nb[0] != 4 {
            return Err(Error::Invalid(
                "soft_max: dst rows must be contiguous".into(),
            ));
        }
        if src.nelements() == 0 {
            return Ok(());
        }
        let (bs, os) = self.bind_el(&src)?;
        let (bd, od) = self.bind_el(&dst)?;
        let mut p = self.row_params(&src, &dst, os, od)?;
        p.push(scale.to_bits());
        let (bm, mdt) = match &mask {
            Some(m) => {
                expect(m, "mask", &[DType::F32, DType::F16])?;
                // Rows: a padded mask (ne[1] >= rows, ggml's KQ mask) or a divisor.
                let rows_ok =
                    m.ne[1] >= src.ne[1] || (m.ne[1] > 0 && src.ne[1].is_multiple_of(m.ne[1]));
                if m.ne[0] < src.ne[0]
                    || !rows_ok
                    || (2..4).any(|i| m.ne[i] == 0 || !src.ne[i].is_multiple_of(m.ne[i]))
                {
                    return Err(Error::Invalid(format!(
                        "soft_max: mask {:?} vs src {:?}",
                        m.ne, src.ne
                    )));
                }
                let (bm, om) = self.bind_el(m)?;
                p.push(om);
                p.extend([m.ne[1] as u32, m.ne[2] as u32, m.ne[3] as u32]);
                p.extend(strides(m)?);
                (bm, Some(m.dtype))
            }
            None => {
                // Bind src again as a dummy mask; it is never read.
                let (bm, _) = self.bind_el(&src)?;
                p.extend([0, 1, 1, 1, 0, 0, 0, 0]);
                (bm, None)
            }
        };
        let sg = self.subgroups;
        let key = format!("soft_max_{}_{sg}", mdt.map(|d| d.tag()).unwrap_or("none"));
        let g = grid(src.nrows(), 1)?;
        self.dispatch(
            enc,
            &key,
            || shaders::soft_max(mdt, sg),
            &[bs, bm, bd],
            &p,
            g,
        )
    }

    /// ggml rope (no YaRN): x [head_dim, n_head, n_tokens, ne3], pos i32 [n_tokens];
    /// `theta = pos * freq_scale * freq_base^(-2i/n_dims)`; dims >= n_dims pass through.
    #[allow(clippy::too_many_arguments)]
    pub fn rope(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src: TensorRef,
        pos: TensorRef,
        dst: TensorRef,
        mode: RopeMode,
        n_dims: u32,
        freq_base: f32,
        freq_scale: f32,
    ) -> Result<()> {
        expect(&src, "src", &[DType::F32])?;
        expect(&pos, "pos", &[DType::I32])?;
        expect(&dst, "dst", &[DType::F32])?;
        same_shape(&src, &dst, "rope")?;
        if !src.ne[0].is_multiple_of(2)
            || !n_dims.is_multiple_of(2)
            || n_dims as u64 > src.ne[0]
            || n_dims == 0
        {
            return Err(Error::Invalid(format!(
                "rope: ne0 {} / n_dims {n_dims} must be even, n_dims <= ne0",
                src.ne[0]
            )));
        }
        if pos.nelements() < src.ne[2] || pos.nb[0] != 4 {
            return Err(Error::Invalid(
                "rope: need one contiguous i32 position per token (ne[2])".into(),
            ));
        }
        if src.nelements() == 0 {
            return Ok(());
        }
        let (bs, os) = self.bind_el(&src)?;
        let (bp, op) = self.bind_el(&pos)?;
        let (bd, od) = self.bind_el(&dst)?;
        let (ss, ds) = (strides(&src)?, strides(&dst)?);
        let pairs = src.nelements() / 2;
        let mut p = vec![
            u32_of(pairs, "n")?,
            src.ne[0] as u32,
            src.ne[1] as u32,
            src.ne[2] as u32,
        ];
        p.push(os);
        p.extend(ss);
        p.push(od);
        p.extend(ds);
        p.push(op);
        p.push(n_dims);
        let theta_scale = freq_base.powf(-2.0 / n_dims as f32);
        p.push(theta_scale.to_bits());
        p.push(freq_scale.to_bits());
        let neox = mode == RopeMode::Neox;
        let key = format!("rope_{neox}");
        let g = grid(pairs, 256)?;
        self.dispatch(enc, &key, || shaders::rope(neox), &[bs, bp, bd], &p, g)
    }

    /// `dst[M, N, b2, b3] = src0[K, M, .]^T * src1[K, N, b2, b3]` (ggml mul_mat).
    /// src0: F32/F16 (row-contiguous, any row/batch strides) or quantized (contiguous rows);
    /// broadcast over batch dims like ggml (`i02 = i12 / (ne12 / ne02)`).
    pub fn mul_mat(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src0: TensorRef,
        src1: TensorRef,
        dst: TensorRef,
    ) -> Result<()> {
        self.mul_mat_with(enc, src0, src1, dst, MatMulPath::Auto)
    }

    /// [`Kernels::mul_mat`] with an explicit kernel choice.
    pub fn mul_mat_with(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src0: TensorRef,
        src1: TensorRef,
        dst: TensorRef,
        path: MatMulPath,
    ) -> Result<()> {
        src0.check("src0")?;
        expect(&src1, "src1", &[DType::F32])?;
        expect(&dst, "dst", &[DType::F32])?;
        if src0.dtype == DType::I32 {
            return Err(Error::Invalid("mul_mat: i32 src0".into()));
        }
        if !src0.dtype.is_quantized() && src0.nb[0] != src0.dtype.block_bytes() {
            return Err(Error::Invalid(
                "mul_mat: src0 rows must be contiguous (nb[0] = type size)".into(),
            ));
        }
        if src1.nb[0] != 4 || dst.nb[0] != 4 {
            return Err(Error::Invalid(
                "mul_mat: src1/dst rows must be contiguous".into(),
            ));
        }
        let (k, m, n) = (src0.ne[0], src0.ne[1], src1.ne[1]);
        mm_shapes(&src0, &src1, &dst, "mul_mat")?;
        if dst.nelements() == 0 {
            return Ok(());
        }
        if k == 0 {
            return Err(Error::Unsupported("mul_mat with K = 0".into()));
        }
        let chunks = self.row_chunks(&src0)?;
        if chunks.len() > 1 {
            // Weights too big for one binding: one dispatch per row range.
            for (r0, rows) in chunks {
                let w = src0.view(r0 * src0.nb[1], [k, rows, 1, 1], src0.nb);
                let d = dst.view(r0 * 4, [rows, n, dst.ne[2], dst.ne[3]], dst.nb);
                self.mul_mat_with(enc, w, src1, d, path)?;
            }
            return Ok(());
        }
        let (bw, bx, bd, mut p) = self.mm_params(&src0, &src1, &dst)?;
        let batches = src1.ne[2] * src1.ne[3];
        let dt = src0.dtype;
        let (qk, _, subs) = shaders::matvec_geometry(dt);
        p.push(u32_of(k / qk as u64 * subs as u64, "K")?);
        let float_weights = matches!(dt, DType::F32 | DType::F16);
        let use_vec = match path {
            MatMulPath::Auto if float_weights => {
                return self.fmatmul(enc, dt, [bw, bx, bd], p, &src1, [m, n, k, batches]);
            }
            MatMulPath::Auto => n <= Self::MATVEC_MAX_N,
            MatMulPath::MatVec => true,
            MatMulPath::Tiled => false,
        };
        if use_vec {
            let cfg = self.matvec_cfg;
            let nc = n.min(cfg.cols as u64);
            let groups = n.div_ceil(nc);
            p.push(u32_of(groups, "column groups")?);
            let z = groups * batches;
            let mut g = grid(m.div_ceil(cfg.rows as u64), 1)?;
            if z > 65535 {
                return Err(Error::Unsupported(
                    "mul_mat: N * batches > 65535 on the mat-vec path".into(),
                ));
            }
            g[2] = z as u32;
            let sg = self.subgroups;
            let key = format!("matvec_{}_{sg}_{}x{}_c{nc}", dt.tag(), cfg.wg, cfg.rows);
            let nc = nc as u32;
            self.dispatch(
                enc,
                &key,
                || shaders::matvec(dt, sg, cfg, nc),
                &[bw, bx, bd],
                &p,
                g,
            )
        } else {
            let g = [
                u32_of(m.div_ceil(shaders::MM_TILE), "M")?,
                u32_of(n.div_ceil(shaders::MM_TILE), "N")?,
                u32_of(batches, "batches")?,
            ];
            if g.iter().any(|&v| v > 65535) {
                return Err(Error::Unsupported("mul_mat: grid too large".into()));
            }
            let key = format!("matmat_{}", dt.tag());
            self.dispatch(enc, &key, || shaders::matmat(dt), &[bw, bx, bd], &p, g)
        }
    }

    /// The bindings (weights, activations, destination) and parameters P[0..19] shared by the
    /// matmul kernels (the layout of `shaders::MM_INDEX`); shapes already checked.
    fn mm_params(
        &self,
        src0: &TensorRef,
        src1: &TensorRef,
        dst: &TensorRef,
    ) -> Result<(Bind, Bind, Bind, Vec<u32>)> {
        let (bw, ow) = self.bind(src0)?;
        let (bx, ox) = self.bind_el(src1)?;
        let (bd, od) = self.bind_el(dst)?;
        let (xs, ds) = (strides(src1)?, strides(dst)?);
        let (k, m, n) = (src0.ne[0], src0.ne[1], src1.ne[1]);
        let mut p = vec![k as u32, m as u32, n as u32, src1.ne[2] as u32, 0];
        p.push((src1.ne[2] / src0.ne[2]) as u32);
        p.push((src1.ne[3] / src0.ne[3]) as u32);
        p.push(u32_of(ow, "offset")?);
        for i in 1..4 {
            p.push(u32_of(src0.nb[i], "src0 stride")?);
        }
        p.push(ox);
        p.extend(&xs[1..]);
        p.push(od);
        p.extend(&ds[1..]);
        Ok((bw, bx, bd, p))
    }

    /// Whether quantized products take the exact path (the default; see [`ExactPlan`]).
    pub fn set_exact(&mut self, on: bool) {
        self.exact = on;
    }

    /// The exact path's plan for `src0 · src1`, or `None` where it has no kernel (f32/f16
    /// weights, which `fmatmul` sums in the CPU's order, and rows not of whole blocks).
    pub fn exact_plan(&self, src0: &TensorRef, src1: &TensorRef) -> Option<ExactPlan> {
        if !self.exact {
            return None;
        }
        let (k, m, n) = (src0.ne[0], src0.ne[1], src1.ne[1]);
        let weight_2d = src0.ne[2] == 1 && src0.ne[3] == 1;
        // ggml-cpu's kernel choice (`lamina-cpu`'s `MatMul::plan`): Q4_K and Q4_0 repacked when
        // their rows come in eights, the tiled K-quant kernels from 8 activation rows, vec_dot
        // (Q4_0/Q5_0/Q8_0: tinyBLAS, the same sums) else.
        let (mode, variant, gemm_cols) = match src0.dtype {
            DType::Q4_0 if weight_2d && m.is_multiple_of(8) => (1, 1, 0),
            DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => (1, 0, 0),
            DType::Q4_1 => (2, 0, 0),
            DType::Q6_K => (3, u32::from(n >= 8), 0),
            DType::Q4_K if weight_2d && m.is_multiple_of(8) => {
                (4, 2, if n > 3 { n - n % 4 } else { 0 })
            }
            DType::Q4_K | DType::Q5_K => (3, u32::from(n >= 8), 0),
            _ => return None,
        };
        let block = src0.dtype.block_elems();
        if !k.is_multiple_of(block) {
            return None;
        }
        let row_words = k / block * shaders::act_words(mode) as u64;
        Some(ExactPlan {
            mode,
            variant,
            gemm_cols: u32::try_from(gemm_cols).ok()?,
            row_words,
            bytes: row_words
                .checked_mul(src1.nelements() / k)?
                .checked_mul(4)?,
        })
    }

    /// `dst = src0 · src1` by the exact path: `src1` quantized into `scratch` (at least
    /// `plan.bytes`), then one invocation per output.
    pub fn mul_mat_exact(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src0: TensorRef,
        src1: TensorRef,
        scratch: &wgpu::Buffer,
        dst: TensorRef,
        plan: ExactPlan,
    ) -> Result<()> {
        src0.check("src0")?;
        expect(&src1, "src1", &[DType::F32])?;
        expect(&dst, "dst", &[DType::F32])?;
        let (k, n) = (src0.ne[0], src1.ne[1]);
        mm_shapes(&src0, &src1, &dst, "mul_mat_exact")?;
        if src1.nb[0] != 4 || dst.nb[0] != 4 || scratch.size() < plan.bytes {
            return Err(Error::Invalid(
                "mul_mat_exact: rows not contiguous or scratch too small".into(),
            ));
        }
        if dst.nelements() == 0 {
            return Ok(());
        }
        let q = TensorRef::contiguous(scratch, 0, DType::I32, [plan.bytes / 4, 1, 1, 1]);
        let (bs, os) = self.bind_el(&src1)?;
        let (bq, _) = self.bind(&q)?;
        let blocks = src1.nelements() / src0.dtype.block_elems();
        let mut pq = vec![u32_of(blocks, "blocks")?];
        pq.extend(ne32(&src1));
        pq.push(os);
        pq.extend(strides(&src1)?);
        pq.push(plan.mode);
        pq.push(plan.gemm_cols);
        self.dispatch(
            enc,
            "quantize_act",
            shaders::quantize_act,
            &[bs, bq.clone()],
            &pq,
            grid(blocks, 256)?,
        )?;
        // Weights too big for one binding: one dispatch per row range.
        for (r0, rows) in self.row_chunks(&src0)? {
            let w = src0.view(r0 * src0.nb[1], [k, rows, src0.ne[2], src0.ne[3]], src0.nb);
            let d = dst.view(r0 * 4, [rows, n, dst.ne[2], dst.ne[3]], dst.nb);
            self.mul_mat_exact_rows(enc, w, &src1, bq.clone(), d, plan)?;
        }
        Ok(())
    }

    /// [`Kernels::mul_mat_exact`]'s product over activations already quantized into `bq`.
    fn mul_mat_exact_rows(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        src0: TensorRef,
        src1: &TensorRef,
        bq: Bind,
        dst: TensorRef,
        plan: ExactPlan,
    ) -> Result<()> {
        let (m, n) = (src0.ne[1], src1.ne[1]);
        let (bw, _, bd, mut p) = self.mm_params(&src0, src1, &dst)?;
        p.push(u32_of(plan.row_words, "activation row")?);
        p.push(plan.gemm_cols);
        p.push(0);
        let g = [
            u32_of(m.div_ceil(64), "M")?,
            u32_of(n.div_ceil(4), "N")?,
            u32_of(src1.ne[2] * src1.ne[3], "batches")?,
        ];
        if g.iter().any(|&v| v > 65535) {
            return Err(Error::Unsupported("mul_mat: grid too large".into()));
        }
        let dt = src0.dtype;
        let key = format!("mul_mat_exact_{}_{}", dt.tag(), plan.variant);
        let variant = plan.variant;
        self.dispatch(
            enc,
            &key,
            || shaders::mul_mat_exact(dt, variant),
            &[bw, bq, bd],
            &p,
            g,
        )
    }

    /// The dispatch of [`shaders::fmatmul`]: `p` holds the shared matmul parameters (P[0..20]);
    /// `mkn` is (M, N, K, batches). The CPU's choice of kernel decides the order: tinyBLAS when
    /// N >= 2, K % 8 == 0, M % 4 == 0 (and, for f32 weights, contiguous activations).
    fn fmatmul(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        dt: DType,
        binds: [Bind; 3],
        mut p: Vec<u32>,
        src1: &TensorRef,
        [m, n, k, batches]: [u64; 4],
    ) -> Result<()> {
        let contiguous = {
            let mut next = 4;
            (0..4).all(|i| {
                let ok = src1.ne[i] == 1 || src1.nb[i] == next;
                next *= src1.ne[i];
                ok
            })
        };
        let tiny = n >= 2
            && k.is_multiple_of(8)
            && m.is_multiple_of(4)
            && (dt == DType::F16 || contiguous);
        p.truncate(20);
        p.push(0);
        let cols = if tiny { 4 } else { 1 };
        let g = [
            u32_of(m.div_ceil(8), "M")?,
            u32_of(n.div_ceil(cols), "N")?,
            u32_of(batches, "batches")?,
        ];
        if g.iter().any(|&v| v > 65535) {
            return Err(Error::Unsupported("mul_mat: grid too large".into()));
        }
        let key = format!("fmatmul_{}_{tiny}", dt.tag());
        self.dispatch(enc, &key, || shaders::fmatmul(dt, tiny), &binds, &p, g)
    }

    /// Fused attention (ggml flash_attn_ext without ALiBi): q f32 [D, n_q, H],
    /// k/v f16 or f32 [D, n_kv, H_kv] (row-contiguous views), mask f16/f32
    /// [n_kv, >= n_q, 1 or H] or None, dst f32 [D, H, n_q] (ggml's permuted output).
    /// `s = softcap * tanh(q.k * scale / softcap)` when softcap > 0, else `q.k * scale`;
    /// GQA: head h reads kv head `h / (H / H_kv)`. Fully masked rows give zeros. `kv_chunks`:
    /// the CPU's thread count, which cuts a one-query step over 512 or more cells into chunks
    /// (ggml's split-KV path; see `shaders::flash_attn`).
    #[allow(clippy::too_many_arguments)]
    pub fn flash_attn(
        &mut self,
        enc: &mut wgpu::CommandEncoder,
        q: TensorRef,
        k: TensorRef,
        v: TensorRef,
        mask: Option<TensorRef>,
        dst: TensorRef,
        scale: f32,
        softcap: f32,
        kv_chunks: u32,
    ) -> Result<()> {
        expect(&q, "q", &[DType::F32])?;
        expect(&k, "k", &[DType::F16, DType::F32])?;
        expect(&v, "v", &[k.dtype])?;
        expect(&dst, "dst", &[DType::F32])?;
        let (d, n_q, h, n_kv, h_kv) = (q.ne[0], q.ne[1], q.ne[2], k.ne[1], k.ne[2]);
        let es = k.dtype.block_bytes();
        if k.ne[0] != d
            || v.ne != k.ne
            || q.ne[3] != 1
            || k.ne[3] != 1
            || h_kv == 0
            || !h.is_multiple_of(h_kv)
            || dst.ne != [d, h, n_q, 1]
            || d > shaders::FA_MAX_D as u64
            || q.nb[0] != 4
            || k.nb[0] != es
            || v.nb[0] != es
            || dst.nb[0] != 4
        {
            return Err(Error::Invalid(format!(
                "flash_attn: q {:?} k {:?} v {:?} dst {:?} (D <= {}, rows contiguous)",
                q.ne,
                k.ne,
                v.ne,
                dst.ne,
                shaders::FA_MAX_D
            )));
        }
        if dst.nelements() == 0 {
            return Ok(());
        }
        if n_kv == 0 {
            return Err(Error::Unsupported("flash_attn with n_kv = 0".into()));
        }
        let (bq, oq) = self.bind_el(&q)?;
        let (bk, ok) = self.bind_el(&k)?;
        let (bv, ov) = self.bind_el(&v)?;
        let (bd, od) = self.bind_el(&dst)?;
        let (qs, ks, vs, ds) = (strides(&q)?, strides(&k)?, strides(&v)?, strides(&dst)?);
        let mut p = vec![
            d as u32,
            n_q as u32,
            h as u32,
            n_kv as u32,
            (h / h_kv) as u32,
        ];
        p.extend([oq, qs[1], qs[2], ok, ks[1], ks[2], ov, vs[1], vs[2]]);
        let (bm, mdt) = match &mask {
            Some(m) => {
                expect(m, "mask", &[DType::F16, DType::F32])?;
                if m.ne[0] < n_kv
                    || m.ne[1] < n_q
                    || m.ne[3] != 1
                    || m.ne[2] == 0
                    || !h.is_multiple_of(m.ne[2])
                {
                    return Err(Error::Invalid(format!("flash_attn: mask {:?}", m.ne)));
                }
                let (bm, om) = self.bind_el(m)?;
                let ms = strides(m)?;
                p.extend([om, ms[1], m.ne[2] as u32, ms[2]]);
                (bm, Some(m.dtype))
            }
            None => {
                let (bm, _) = self.bind_el(&q)?;
                p.extend([0, 0, 1, 0]);
                (bm, None)
            }
        };
        p.extend([od, ds[1], ds[2]]);
        let scale_eff = if softcap > 0.0 {
            scale / softcap
        } else {
            scale
        };
        p.push(scale_eff.to_bits());
        p.push(softcap.max(0.0).to_bits());
        // ggml-cpu's split-KV path: a one-token step over 512 or more cells, in `kv_chunks`
        // chunks (its thread count).
        p.push(if n_q == 1 && n_kv >= 512 {
            kv_chunks.max(1)
        } else {
            1
        });
        let kdt = k.dtype;
        // ggml-cpu's tiled path from 64 query rows.
        let tiled = n_q >= 64;
        let key = format!(
            "flash_attn_{}_{}_{tiled}",
            kdt.tag(),
            mdt.map(|t| t.tag()).unwrap_or("none")
        );
        let rows = if tiled { n_q.div_ceil(64) } else { n_q };
        let g = [u32_of(rows, "n_q")?, u32_of(h, "heads")?, 1];
        if g[0] > 65535 || g[1] > 65535 {
            return Err(Error::Unsupported("flash_attn: grid too large".into()));
        }
        self.dispatch(
            enc,
            &key,
            || {
                if tiled {
                    shaders::flash_attn_tiled(kdt, mdt)
                } else {
                    shaders::flash_attn(kdt, mdt)
                }
            },
            &[bq, bk, bv, bm, bd],
            &p,
            g,
        )
    }
}
