//! Every kernel against the scalar CPU reference (NMSE, ggml test-backend-ops limits).
//! Tests pass with a printed note when no adapter exists.

mod common;

use common::context::GpuContext;
use common::reference::{self as r, Rng};
use lamina_wgpu::kernels::{
    DType, Kernels, MatMulPath, MatVecConfig, RopeMode, TensorRef, UnaryOp,
};
use std::sync::OnceLock;

static CTX: OnceLock<Option<GpuContext>> = OnceLock::new();

fn ctx() -> Option<&'static GpuContext> {
    CTX.get_or_init(|| match GpuContext::new_blocking(None) {
        Ok(c) => Some(c),
        Err(e) => {
            eprintln!("note: no GPU context ({e}); GPU tests are skipped");
            None
        }
    })
    .as_ref()
}

macro_rules! gpu {
    () => {
        match ctx() {
            Some(c) => c,
            None => {
                eprintln!("note: no adapter, skipping");
                return;
            }
        }
    };
}

/// Host-side description of a (possibly strided) tensor layout.
#[derive(Clone, Copy, Debug)]
struct Lay {
    ne: [u64; 4],
    nb: [u64; 4],
    off: u64,
    dt: DType,
}

impl Lay {
    fn contig(dt: DType, ne: [u64; 4]) -> Self {
        let nb = TensorRef::contiguous(&dummy(), 0, dt, ne).nb;
        Lay {
            ne,
            nb,
            off: 256,
            dt,
        }
    }

    /// Memory order `perm` (perm[0] fastest) with `pad` extra elements after each fastest row.
    fn strided(dt: DType, ne: [u64; 4], perm: [usize; 4], pad: u64) -> Self {
        let es = dt.block_bytes();
        let mut nb = [0u64; 4];
        let mut s = es;
        for (j, &d) in perm.iter().enumerate() {
            nb[d] = s;
            s *= ne[d] + if j == 0 { pad } else { 0 };
        }
        Lay {
            ne,
            nb,
            off: 512,
            dt,
        }
    }

    fn n(&self) -> usize {
        self.ne.iter().product::<u64>() as usize
    }

    fn ne_us(&self) -> [usize; 4] {
        self.ne.map(|v| v as usize)
    }

    fn size(&self) -> u64 {
        (self.off
            + TensorRef::contiguous(&dummy(), 0, self.dt, [1, 1, 1, 1]).nb[0]
            + (0..4)
                .map(|i| (self.ne[i].max(1) - 1) * self.nb[i])
                .sum::<u64>()
            + 64)
            .div_ceil(256)
            * 256
    }

    fn addr(&self, i: usize) -> usize {
        let ne = self.ne_us();
        let i0 = i % ne[0];
        let i1 = i / ne[0] % ne[1];
        let i2 = i / (ne[0] * ne[1]) % ne[2];
        let i3 = i / (ne[0] * ne[1] * ne[2]);
        (self.off
            + i0 as u64 * self.nb[0]
            + i1 as u64 * self.nb[1]
            + i2 as u64 * self.nb[2]
            + i3 as u64 * self.nb[3]) as usize
    }

    /// Bytes of a buffer holding `vals` (logical order) at this layout; the rest is NaN.
    fn bytes(&self, vals: &[f32]) -> Vec<u8> {
        let mut b: Vec<u8> = std::iter::repeat([0x00u8, 0x7e])
            .flatten()
            .take(self.size() as usize)
            .collect();
        for (i, &v) in vals.iter().enumerate() {
            let a = self.addr(i);
            match self.dt {
                DType::F32 => b[a..a + 4].copy_from_slice(&v.to_le_bytes()),
                DType::F16 => b[a..a + 2].copy_from_slice(&r::f16_bits(v).to_le_bytes()),
                DType::I32 => b[a..a + 4].copy_from_slice(&(v as i32).to_le_bytes()),
                _ => unreachable!(),
            }
        }
        b
    }

    fn gather(&self, b: &[u8]) -> Vec<f32> {
        (0..self.n())
            .map(|i| {
                let a = self.addr(i);
                match self.dt {
                    DType::F16 => r::f16_val(u16::from_le_bytes([b[a], b[a + 1]])),
                    _ => f32::from_le_bytes([b[a], b[a + 1], b[a + 2], b[a + 3]]),
                }
            })
            .collect()
    }

    fn t<'a>(&self, buf: &'a wgpu::Buffer) -> TensorRef<'a> {
        TensorRef {
            buffer: buf,
            offset: self.off,
            dtype: self.dt,
            ne: self.ne,
            nb: self.nb,
        }
    }
}

fn dummy() -> wgpu::Buffer {
    // Only used to compute strides through TensorRef::contiguous.
    static B: OnceLock<Option<wgpu::Buffer>> = OnceLock::new();
    B.get_or_init(|| ctx().map(|c| c.create_buffer(4)))
        .clone()
        .expect("ctx")
}

fn upload(c: &GpuContext, l: &Lay, vals: &[f32]) -> wgpu::Buffer {
    c.upload(&l.bytes(vals))
}

fn read(c: &GpuContext, l: &Lay, buf: &wgpu::Buffer) -> Vec<f32> {
    let b = c.read(buf, 0, buf.size()).expect("read");
    l.gather(&b)
}

fn enc(c: &GpuContext) -> wgpu::CommandEncoder {
    c.device.create_command_encoder(&Default::default())
}

fn check(name: &str, got: &[f32], want: &[f32], tol: f64) {
    let e = r::nmse(got, want);
    assert!(
        e <= tol,
        "{name}: nmse {e:e} > {tol:e}\n got {:?}\nwant {:?}",
        &got[..got.len().min(8)],
        &want[..want.len().min(8)]
    );
}

#[test]
fn adapters_listed() {
    let list = common::context::adapters();
    if list.is_empty() {
        eprintln!("note: no adapter on this machine; nothing to check");
        return;
    }
    for a in &list {
        eprintln!("adapter {a:?}");
    }
    let c = gpu!();
    let l = &c.limits;
    eprintln!(
        "subgroups={} shader_f16={} max_storage_buffer_binding_size={} max_buffer_size={} \
         max_compute_workgroup_storage_size={} max_compute_invocations_per_workgroup={} \
         min_storage_buffer_offset_alignment={} min_subgroup_size={} max_subgroup_size={}",
        c.subgroups,
        c.shader_f16,
        l.max_storage_buffer_binding_size,
        l.max_buffer_size,
        l.max_compute_workgroup_storage_size,
        l.max_compute_invocations_per_workgroup,
        l.min_storage_buffer_offset_alignment,
        c.device.adapter_info().subgroup_min_size,
        c.device.adapter_info().subgroup_max_size,
    );
}

#[test]
fn bad_adapter_index_is_an_error() {
    assert!(GpuContext::new_blocking(Some(1000)).is_err());
}

#[test]
fn add_mul_broadcast_strided() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(1);
    let ne = [33, 7, 5, 2];
    let la = Lay::strided(DType::F32, ne, [1, 0, 2, 3], 3); // transposed src0
    for bne in [[33, 7, 5, 2], [33, 1, 1, 1], [1, 7, 5, 1], [11, 7, 1, 2]] {
        let lb = Lay::strided(DType::F32, bne, [0, 1, 2, 3], 5);
        let ld = Lay::contig(DType::F32, ne);
        let (a, b) = (rng.vec(la.n()), rng.vec(lb.n()));
        let (ba, bb) = (upload(c, &la, &a), upload(c, &lb, &b));
        let (bd1, bd2) = (upload(c, &ld, &[]), upload(c, &ld, &[]));
        let mut e = enc(c);
        k.add(&mut e, la.t(&ba), lb.t(&bb), ld.t(&bd1)).unwrap();
        k.mul(&mut e, la.t(&ba), lb.t(&bb), ld.t(&bd2)).unwrap();
        k.submit(e);
        let nea = la.ne_us();
        let neb = lb.ne_us();
        check(
            "add",
            &read(c, &ld, &bd1),
            &r::binary(&a, nea, &b, neb, |x, y| x + y),
            0.0,
        );
        check(
            "mul",
            &read(c, &ld, &bd2),
            &r::binary(&a, nea, &b, neb, |x, y| x * y),
            0.0,
        );
    }
    c.take_errors().unwrap();
}

#[test]
fn same_buffer_and_in_place() {
    // Lamina keeps many tensors in one buffer and uses in-place ops.
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(2);
    let n = 1000u64;
    let (a, b) = (rng.vec(n as usize), rng.vec(n as usize));
    let mut bytes = vec![0u8; 4096 * 3];
    for i in 0..n as usize {
        bytes[i * 4..i * 4 + 4].copy_from_slice(&a[i].to_le_bytes());
        bytes[4096 + i * 4..4096 + i * 4 + 4].copy_from_slice(&b[i].to_le_bytes());
    }
    let buf = c.upload(&bytes);
    let ta = TensorRef::contiguous(&buf, 0, DType::F32, [n, 1, 1, 1]);
    let tb = TensorRef::contiguous(&buf, 4096, DType::F32, [n, 1, 1, 1]);
    let td = TensorRef::contiguous(&buf, 8192, DType::F32, [n, 1, 1, 1]);
    let mut e = enc(c);
    k.add(&mut e, ta, tb, td).unwrap(); // d = a + b (three windows of one buffer)
    k.mul(&mut e, ta, tb, ta).unwrap(); // a = a * b in place
    k.rms_norm(&mut e, tb, tb, 1e-6).unwrap(); // in place
    k.submit(e);
    c.take_errors().unwrap();
    let got_d = c.read_f32(&buf, 8192, n as usize).unwrap();
    let got_a = c.read_f32(&buf, 0, n as usize).unwrap();
    let got_b = c.read_f32(&buf, 4096, n as usize).unwrap();
    let ne = [n as usize, 1, 1, 1];
    check("add", &got_d, &r::binary(&a, ne, &b, ne, |x, y| x + y), 0.0);
    check(
        "mul in place",
        &got_a,
        &r::binary(&a, ne, &b, ne, |x, y| x * y),
        0.0,
    );
    check(
        "rms in place",
        &got_b,
        &r::rms_norm(&b, n as usize, 1e-6),
        1e-10,
    );
}

#[test]
fn unary_scale_glu() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(3);
    let ne = [70, 9, 3, 1];
    let ls = Lay::strided(DType::F32, ne, [0, 2, 1, 3], 2);
    let ld = Lay::contig(DType::F32, ne);
    let x: Vec<f32> = rng.vec(ls.n()).iter().map(|v| v * 8.0).collect();
    let y = rng.vec(ls.n());
    let (bx, by) = (upload(c, &ls, &x), upload(c, &ls, &y));
    let outs: Vec<wgpu::Buffer> = (0..5).map(|_| upload(c, &ld, &[])).collect();
    let mut e = enc(c);
    k.unary(&mut e, UnaryOp::Silu, ls.t(&bx), ld.t(&outs[0]))
        .unwrap();
    k.unary(&mut e, UnaryOp::Gelu, ls.t(&bx), ld.t(&outs[1]))
        .unwrap();
    k.scale(&mut e, ls.t(&bx), ld.t(&outs[2]), 0.125, -0.5)
        .unwrap();
    k.glu(&mut e, UnaryOp::Silu, ls.t(&bx), ls.t(&by), ld.t(&outs[3]))
        .unwrap();
    k.glu(&mut e, UnaryOp::Gelu, ls.t(&bx), ls.t(&by), ld.t(&outs[4]))
        .unwrap();
    k.submit(e);
    let f = |g: &dyn Fn(f32) -> f32| x.iter().map(|&v| g(v)).collect::<Vec<_>>();
    check("silu", &read(c, &ld, &outs[0]), &f(&r::silu), 1e-12);
    check("gelu", &read(c, &ld, &outs[1]), &f(&r::gelu), 1e-6);
    check(
        "scale",
        &read(c, &ld, &outs[2]),
        &f(&|v| v * 0.125 - 0.5),
        1e-14,
    );
    let sw: Vec<f32> = x.iter().zip(&y).map(|(&a, &b)| r::silu(a) * b).collect();
    let ge: Vec<f32> = x.iter().zip(&y).map(|(&a, &b)| r::gelu(a) * b).collect();
    check("swiglu", &read(c, &ld, &outs[3]), &sw, 1e-12);
    check("geglu", &read(c, &ld, &outs[4]), &ge, 1e-6);
    c.take_errors().unwrap();
}

#[test]
fn norms() {
    let c = gpu!();
    for subgroups in [true, false] {
        let mut k = Kernels::new(&c.device, &c.queue);
        k.set_subgroups(subgroups);
        let mut rng = Rng(4);
        for ne in [[1000, 3, 2, 1], [37, 5, 1, 2], [4096, 2, 1, 1]] {
            let ls = Lay::strided(DType::F32, ne, [0, 2, 1, 3], 4);
            let ld = Lay::contig(DType::F32, ne);
            let x: Vec<f32> = rng.vec(ls.n()).iter().map(|v| v * 3.0 + 0.5).collect();
            let bx = upload(c, &ls, &x);
            let (b1, b2) = (upload(c, &ld, &[]), upload(c, &ld, &[]));
            let mut e = enc(c);
            k.rms_norm(&mut e, ls.t(&bx), ld.t(&b1), 1e-5).unwrap();
            k.norm(&mut e, ls.t(&bx), ld.t(&b2), 1e-5).unwrap();
            k.submit(e);
            check(
                "rms_norm",
                &read(c, &ld, &b1),
                &r::rms_norm(&x, ne[0] as usize, 1e-5),
                1e-7,
            );
            check(
                "norm",
                &read(c, &ld, &b2),
                &r::norm(&x, ne[0] as usize, 1e-5),
                1e-7,
            );
        }
    }
    c.take_errors().unwrap();
}

#[test]
fn soft_max_masks() {
    let c = gpu!();
    for subgroups in [true, false] {
        let mut k = Kernels::new(&c.device, &c.queue);
        k.set_subgroups(subgroups);
        let mut rng = Rng(5);
        let ne = [300, 6, 4, 1];
        let ls = Lay::strided(DType::F32, ne, [0, 1, 2, 3], 1);
        let ld = Lay::contig(DType::F32, ne);
        let x: Vec<f32> = rng.vec(ls.n()).iter().map(|v| v * 5.0).collect();
        let bx = upload(c, &ls, &x);
        // Causal-like mask [ne0 + 4 (padded), 3 rows], broadcast over rows/heads; row 1 fully masked.
        // Also a padded mask (8 rows >= 6) like ggml's KQ mask.
        for mrows in [3u64, 8] {
            let mne = [304u64, mrows, 1, 1];
            let mvals: Vec<f32> = (0..mne.iter().product::<u64>() as usize)
                .map(|i| {
                    let (i0, i1) = (i % 304, i / 304);
                    if i1 == 1 || i0 > 100 + 30 * i1 {
                        f32::NEG_INFINITY
                    } else {
                        rng.uniform()
                    }
                })
                .collect();
            let mlogical: Vec<f32> = mvals.clone();
            for mdt in [None, Some(DType::F32), Some(DType::F16)] {
                let bd = upload(c, &ld, &[]);
                let (lm, bm) = match mdt {
                    Some(dt) => {
                        let lm = Lay::contig(dt, mne);
                        let bm = upload(c, &lm, &mvals);
                        (Some(lm), Some(bm))
                    }
                    None => (None, None),
                };
                let mask_t = match (&lm, &bm) {
                    (Some(l), Some(b)) => Some(l.t(b)),
                    _ => None,
                };
                let mut e = enc(c);
                k.soft_max(&mut e, ls.t(&bx), mask_t, ld.t(&bd), 0.7)
                    .unwrap();
                k.submit(e);
                // Reference sees the mask as stored (f16-rounded when f16).
                let mref: Vec<f32> = match mdt {
                    Some(DType::F16) => mlogical
                        .iter()
                        .map(|&v| r::f16_val(r::f16_bits(v)))
                        .collect(),
                    _ => mlogical.clone(),
                };
                let want = r::soft_max(
                    &x,
                    ls.ne_us(),
                    mdt.map(|_| (&mref[..], mne.map(|v| v as usize))),
                    0.7,
                );
                let got = read(c, &ld, &bd);
                assert!(got.iter().all(|v| v.is_finite()), "NaN/inf in soft_max");
                check(
                    &format!("soft_max {mdt:?} mask rows {mrows}"),
                    &got,
                    &want,
                    1e-9,
                );
            }
        }
    }
    c.take_errors().unwrap();
}

#[test]
fn rope_modes() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(6);
    let ne = [64, 4, 5, 1]; // head_dim, n_head, n_tokens
    let ls = Lay::strided(DType::F32, ne, [0, 2, 1, 3], 0); // q stored [D, T, H]
    let ld = Lay::contig(DType::F32, ne);
    let x = rng.vec(ls.n());
    let pos: Vec<f32> = vec![0.0, 1.0, 7.0, 33.0, 120.0];
    let lp = Lay::contig(DType::I32, [5, 1, 1, 1]);
    let (bx, bp) = (upload(c, &ls, &x), upload(c, &lp, &pos));
    let posi: Vec<i32> = pos.iter().map(|&v| v as i32).collect();
    for (mode, neox) in [(RopeMode::Norm, false), (RopeMode::Neox, true)] {
        for n_dims in [64u32, 32] {
            let bd = upload(c, &ld, &[]);
            let mut e = enc(c);
            k.rope(
                &mut e,
                ls.t(&bx),
                lp.t(&bp),
                ld.t(&bd),
                mode,
                n_dims,
                10000.0,
                0.5,
            )
            .unwrap();
            k.submit(e);
            let want = r::rope(&x, ls.ne_us(), &posi, n_dims as usize, neox, 10000.0, 0.5);
            check(
                &format!("rope {mode:?} {n_dims}"),
                &read(c, &ld, &bd),
                &want,
                1e-9,
            );
        }
    }
    c.take_errors().unwrap();
}

const ALL_W: [DType; 9] = [
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

/// Random weights [k, m] of type `dt`: bytes and their reference dequantization.
fn weights(dt: DType, k: usize, m: usize, rng: &mut Rng) -> (Vec<u8>, Vec<f32>) {
    let mut bytes = Vec::new();
    let mut deq = Vec::new();
    for _ in 0..m {
        let row = rng.vec(k);
        let q = r::quantize_row(dt, &row, rng);
        deq.extend(r::dequantize_row(dt, &q, k));
        bytes.extend(q);
    }
    (bytes, deq)
}

fn with_offset(bytes: &[u8], off: usize) -> Vec<u8> {
    let mut v = vec![0u8; off];
    v.extend_from_slice(bytes);
    v
}

#[test]
fn get_rows_all_types() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(7);
    for dt in ALL_W {
        let (kk, m) = (512usize, 10usize);
        let (bytes, deq) = weights(dt, kk, m, &mut rng);
        let bw = c.upload(&with_offset(&bytes, 256));
        let tw = TensorRef::contiguous(&bw, 256, dt, [kk as u64, m as u64, 1, 1]);
        let ids = [3.0f32, 0.0, 9.0, 3.0, 5.0];
        let li = Lay::contig(DType::I32, [5, 1, 1, 1]);
        let bi = upload(c, &li, &ids);
        let ld = Lay::contig(DType::F32, [kk as u64, 5, 1, 1]);
        let bd = upload(c, &ld, &[]);
        let mut e = enc(c);
        k.get_rows(&mut e, tw, li.t(&bi), ld.t(&bd)).unwrap();
        k.submit(e);
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| deq[i as usize * kk..][..kk].to_vec())
            .collect();
        check(
            &format!("get_rows {dt:?}"),
            &read(c, &ld, &bd),
            &want,
            1e-12,
        );
    }
    c.take_errors().unwrap();
}

#[test]
fn cpy_cont_set_rows() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(8);
    // KV-cache style: f32 [D, T, Hkv] -> f16 view [D, T, Hkv] of cache [D, 64 slots, Hkv] at slot 5.
    let (d, t, h, slots) = (40u64, 3u64, 2u64, 64u64);
    let ls = Lay::contig(DType::F32, [d, t, h, 1]);
    let x = rng.vec(ls.n());
    let bx = upload(c, &ls, &x);
    let cache_l = Lay::contig(DType::F16, [d, slots, h, 1]);
    let bc = upload(c, &cache_l, &vec![0.0; cache_l.n()]);
    let mut view = cache_l;
    view.ne = [d, t, h, 1];
    view.off += 5 * cache_l.nb[1];
    // Transposed V-cache write: element (i0, i1) -> cache [slots, D*h] column i0.
    let vt_l = Lay::contig(DType::F32, [slots, d * h, 1, 1]);
    let bvt = upload(c, &vt_l, &vec![0.0; vt_l.n()]);
    let vt_view = Lay {
        ne: [d * h, t, 1, 1],
        nb: [slots * 4, 4, 0, 0],
        off: vt_l.off + 7 * 4,
        dt: DType::F32,
    };
    let x2 = Lay {
        ne: [d * h, t, 1, 1],
        nb: [4, 4 * d * h, 0, 0],
        off: 0,
        dt: DType::F32,
    };
    // cont of a transposed f32 tensor, and f16 -> f32.
    let lt = Lay::strided(DType::F32, [d, t, h, 1], [2, 0, 1, 3], 1);
    let bt = upload(c, &lt, &x);
    let lc = Lay::contig(DType::F32, [d, t, h, 1]);
    let (bcont, bback) = (upload(c, &lc, &[]), upload(c, &lc, &[]));
    let mut e = enc(c);
    k.cpy(&mut e, ls.t(&bx), view.t(&bc)).unwrap();
    let mut src2 = ls.t(&bx);
    src2.offset = ls.off;
    src2.ne = x2.ne;
    src2.nb = x2.nb;
    k.cpy(&mut e, src2, vt_view.t(&bvt)).unwrap();
    k.cont(&mut e, lt.t(&bt), lc.t(&bcont)).unwrap();
    k.cpy(&mut e, view.t(&bc), lc.t(&bback)).unwrap();
    k.submit(e);
    let f16r: Vec<f32> = x.iter().map(|&v| r::f16_val(r::f16_bits(v))).collect();
    let cache = read(c, &cache_l, &bc);
    let mut want_cache = vec![0.0f32; cache_l.n()];
    for hh in 0..h as usize {
        for tt in 0..t as usize {
            for dd in 0..d as usize {
                want_cache[dd + d as usize * (5 + tt + slots as usize * hh)] =
                    f16r[dd + d as usize * (tt + t as usize * hh)];
            }
        }
    }
    check("cpy f32->f16 view", &cache, &want_cache, 0.0);
    let vt = read(c, &vt_l, &bvt);
    let mut want_vt = vec![0.0f32; vt_l.n()];
    for tt in 0..t as usize {
        for j in 0..(d * h) as usize {
            want_vt[7 + tt + slots as usize * j] = x[j + (d * h) as usize * tt];
        }
    }
    check("cpy transposed", &vt, &want_vt, 0.0);
    check("cont", &read(c, &lc, &bcont), &x, 0.0);
    check("cpy f16->f32", &read(c, &lc, &bback), &f16r, 0.0);

    // set_rows into f16 and f32 caches: rows ids of [d, slots, h].
    for dt in [DType::F16, DType::F32] {
        let lcache = Lay::contig(dt, [d, slots, h, 1]);
        let bcache = upload(c, &lcache, &vec![0.0; lcache.n()]);
        let ids = [9.0f32, 2.0, 40.0];
        let li = Lay::contig(DType::I32, [3, 1, 1, 1]);
        let bi = upload(c, &li, &ids);
        let mut e = enc(c);
        k.set_rows(&mut e, ls.t(&bx), li.t(&bi), lcache.t(&bcache))
            .unwrap();
        k.submit(e);
        let got = read(c, &lcache, &bcache);
        let src = if dt == DType::F16 { &f16r } else { &x };
        let mut want = vec![0.0f32; lcache.n()];
        for hh in 0..h as usize {
            for (tt, &row) in ids.iter().enumerate() {
                for dd in 0..d as usize {
                    want[dd + d as usize * (row as usize + slots as usize * hh)] =
                        src[dd + d as usize * (tt + t as usize * hh)];
                }
            }
        }
        check(&format!("set_rows {dt:?}"), &got, &want, 0.0);
    }
    c.take_errors().unwrap();
}

#[allow(clippy::too_many_arguments)]
fn run_mul_mat(
    c: &GpuContext,
    k: &mut Kernels,
    dt: DType,
    (kk, m, n): (usize, usize, usize),
    batch: [usize; 2],
    wbatch: [usize; 2],
    path: MatMulPath,
    rng: &mut Rng,
) {
    let planes = wbatch[0] * wbatch[1];
    let (bytes, deq) = weights(dt, kk, m * planes, rng);
    let bw = c.upload(&with_offset(&bytes, 256));
    let tw = TensorRef::contiguous(
        &bw,
        256,
        dt,
        [kk as u64, m as u64, wbatch[0] as u64, wbatch[1] as u64],
    );
    let xne = [kk as u64, n as u64, batch[0] as u64, batch[1] as u64];
    let lx = Lay::strided(DType::F32, xne, [0, 2, 1, 3], 4);
    let x = rng.vec(lx.n());
    let bx = upload(c, &lx, &x);
    let ld = Lay::contig(
        DType::F32,
        [m as u64, n as u64, batch[0] as u64, batch[1] as u64],
    );
    let bd = upload(c, &ld, &[]);
    let mut e = enc(c);
    k.mul_mat_with(&mut e, tw, lx.t(&bx), ld.t(&bd), path)
        .unwrap();
    k.submit(e);
    let want = r::mul_mat(&deq, [kk, m, wbatch[0], wbatch[1]], &x, lx.ne_us());
    // Stricter than ggml's 5e-4: the reference uses the same dequantized weights.
    let tol = 1e-9;
    check(
        &format!("mul_mat {dt:?} K={kk} M={m} N={n} {path:?}"),
        &read(c, &ld, &bd),
        &want,
        tol,
    );
}

#[test]
fn mul_mat_all_types_both_paths() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(9);
    for dt in ALL_W {
        let kk = if dt.block_elems() == 256 { 512 } else { 320 };
        for n in [1, 3, 17, 64] {
            for path in [MatMulPath::MatVec, MatMulPath::Tiled] {
                run_mul_mat(c, &mut k, dt, (kk, 37, n), [1, 1], [1, 1], path, &mut rng);
            }
        }
    }
    c.take_errors().unwrap();
}

#[test]
fn mul_mat_shared_memory_reduction() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    k.set_subgroups(false);
    let mut rng = Rng(10);
    for dt in [DType::Q4_0, DType::Q6_K, DType::F16] {
        run_mul_mat(
            c,
            &mut k,
            dt,
            (256, 64, 1),
            [1, 1],
            [1, 1],
            MatMulPath::Auto,
            &mut rng,
        );
    }
    c.take_errors().unwrap();
}

#[test]
fn mul_mat_vec_configs() {
    let c = gpu!();
    let mut rng = Rng(15);
    for (wg, rows, cols) in [(8, 4, 1), (32, 3, 4), (256, 1, 3), (64, 2, 2)] {
        for sg in [true, false] {
            let mut k = Kernels::new(&c.device, &c.queue);
            k.set_subgroups(sg);
            k.set_matvec_config(MatVecConfig { wg, rows, cols })
                .unwrap();
            for (dt, n) in [(DType::Q4_0, 7), (DType::Q5_K, 2), (DType::F16, 5)] {
                let shape = (256, 37, n);
                run_mul_mat(
                    c,
                    &mut k,
                    dt,
                    shape,
                    [1, 1],
                    [1, 1],
                    MatMulPath::MatVec,
                    &mut rng,
                );
            }
        }
    }
    let mut k = Kernels::new(&c.device, &c.queue);
    assert!(
        k.set_matvec_config(MatVecConfig {
            wg: 48,
            rows: 1,
            cols: 1
        })
        .is_err()
    );
    assert!(
        k.set_matvec_config(MatVecConfig {
            wg: 64,
            rows: 5,
            cols: 1
        })
        .is_err()
    );
    c.take_errors().unwrap();
}

#[test]
fn big_weights_split_by_rows() {
    // Weights larger than one binding are split; emulate with a small cap.
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    k.set_binding_limit(4096);
    let mut rng = Rng(16);
    for dt in [DType::Q4_0, DType::Q6_K] {
        for path in [MatMulPath::MatVec, MatMulPath::Tiled] {
            run_mul_mat(c, &mut k, dt, (256, 70, 3), [1, 1], [1, 1], path, &mut rng);
        }
        let (kk, m) = (256usize, 70usize);
        let (bytes, deq) = weights(dt, kk, m, &mut rng);
        let bw = c.upload(&bytes);
        let tw = TensorRef::contiguous(&bw, 0, dt, [kk as u64, m as u64, 1, 1]);
        let ids = [69.0f32, 0.0, 33.0, 34.0];
        let li = Lay::contig(DType::I32, [4, 1, 1, 1]);
        let bi = upload(c, &li, &ids);
        let ld = Lay::contig(DType::F32, [kk as u64, 4, 1, 1]);
        let bd = upload(c, &ld, &[]);
        let mut e = enc(c);
        k.get_rows(&mut e, tw, li.t(&bi), ld.t(&bd)).unwrap();
        k.submit(e);
        let want: Vec<f32> = ids
            .iter()
            .flat_map(|&i| deq[i as usize * kk..][..kk].to_vec())
            .collect();
        check(
            &format!("get_rows split {dt:?}"),
            &read(c, &ld, &bd),
            &want,
            1e-12,
        );
    }
    c.take_errors().unwrap();
}

#[test]
fn mul_mat_multi_tile() {
    // M, N beyond one 128 tile; K = 72 leaves a partial 16-wide K step for F16.
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(17);
    run_mul_mat(
        c,
        &mut k,
        DType::F16,
        (72, 150, 140),
        [1, 1],
        [1, 1],
        MatMulPath::Tiled,
        &mut rng,
    );
    run_mul_mat(
        c,
        &mut k,
        DType::Q4_0,
        (64, 131, 129),
        [2, 1],
        [1, 1],
        MatMulPath::Tiled,
        &mut rng,
    );
    c.take_errors().unwrap();
}

#[test]
fn mul_mat_batched_broadcast() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(11);
    for dt in [DType::F32, DType::F16, DType::Q8_0] {
        for path in [MatMulPath::MatVec, MatMulPath::Tiled] {
            run_mul_mat(c, &mut k, dt, (64, 20, 5), [4, 2], [2, 1], path, &mut rng);
        }
    }
    c.take_errors().unwrap();
}

#[test]
fn attention_products_through_mul_mat() {
    // KQ = mul_mat(K view of an f16 cache, permuted q); KQV = mul_mat(V^T view, kq).
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(12);
    let (d, n_kv, slots, hkv, h, t) = (64u64, 40u64, 64u64, 2u64, 4u64, 5u64);
    let lk = Lay::contig(DType::F16, [d, slots, hkv, 1]);
    let kv = rng.vec(lk.n());
    let bk = upload(c, &lk, &kv);
    let mut kview = lk;
    kview.ne = [d, n_kv, hkv, 1];
    let lq = Lay::strided(DType::F32, [d, t, h, 1], [0, 2, 1, 3], 0); // q stored [D, H, T]
    let q = rng.vec(lq.n());
    let bq = upload(c, &lq, &q);
    // Transposed V cache [slots, D, Hkv]; view [n_kv, D, Hkv].
    let lv = Lay::contig(DType::F16, [slots, d, hkv, 1]);
    let vv = rng.vec(lv.n());
    let bv = upload(c, &lv, &vv);
    let mut vview = lv;
    vview.ne = [n_kv, d, hkv, 1];
    let f16r = |v: &[f32]| {
        v.iter()
            .map(|&x| r::f16_val(r::f16_bits(x)))
            .collect::<Vec<f32>>()
    };
    let (kr, vr) = (f16r(&kv), f16r(&vv));
    let kq_dense: Vec<f32> = (0..(d * n_kv * hkv) as usize)
        .map(|i| {
            let (i0, i1, i2) = (
                i % d as usize,
                i / d as usize % n_kv as usize,
                i / (d * n_kv) as usize,
            );
            kr[i0 + d as usize * (i1 + slots as usize * i2)]
        })
        .collect();
    let v_dense: Vec<f32> = (0..(n_kv * d * hkv) as usize)
        .map(|i| {
            let (i0, i1, i2) = (
                i % n_kv as usize,
                i / n_kv as usize % d as usize,
                i / (n_kv * d) as usize,
            );
            vr[i0 + slots as usize * (i1 + d as usize * i2)]
        })
        .collect();
    for path in [MatMulPath::MatVec, MatMulPath::Tiled] {
        let lkq = Lay::contig(DType::F32, [n_kv, t, h, 1]);
        let bkq = upload(c, &lkq, &[]);
        let lo = Lay::contig(DType::F32, [d, t, h, 1]);
        let bo = upload(c, &lo, &[]);
        let mut e = enc(c);
        k.mul_mat_with(&mut e, kview.t(&bk), lq.t(&bq), lkq.t(&bkq), path)
            .unwrap();
        k.mul_mat_with(&mut e, vview.t(&bv), lkq.t(&bkq), lo.t(&bo), path)
            .unwrap();
        k.submit(e);
        let want_kq = r::mul_mat(
            &kq_dense,
            [d as usize, n_kv as usize, hkv as usize, 1],
            &q,
            lq.ne_us(),
        );
        let got_kq = read(c, &lkq, &bkq);
        check(&format!("kq {path:?}"), &got_kq, &want_kq, 1e-6);
        let want_o = r::mul_mat(
            &v_dense,
            [n_kv as usize, d as usize, hkv as usize, 1],
            &got_kq,
            lkq.ne_us(),
        );
        check(&format!("kqv {path:?}"), &read(c, &lo, &bo), &want_o, 1e-6);
    }
    c.take_errors().unwrap();
}

#[test]
fn many_ops_one_encoder() {
    // Each op must see its own parameters even though all share one submission.
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(13);
    let ne = [130u64, 3, 1, 1];
    let l = Lay::contig(DType::F32, ne);
    let x = rng.vec(l.n());
    let bx = upload(c, &l, &x);
    let outs: Vec<wgpu::Buffer> = (0..12).map(|_| upload(c, &l, &[])).collect();
    let mut e = enc(c);
    for (i, o) in outs.iter().enumerate().take(10) {
        k.scale(&mut e, l.t(&bx), l.t(o), i as f32 + 1.0, -(i as f32))
            .unwrap();
    }
    // Chained: out10 = rms_norm(out3, eps), out11 = out10 + out9 (depends on earlier ops).
    k.rms_norm(&mut e, l.t(&outs[3]), l.t(&outs[10]), 1e-3)
        .unwrap();
    k.add(&mut e, l.t(&outs[10]), l.t(&outs[9]), l.t(&outs[11]))
        .unwrap();
    k.submit(e);
    let mut want: Vec<Vec<f32>> = (0..10)
        .map(|i| x.iter().map(|&v| v * (i as f32 + 1.0) - i as f32).collect())
        .collect();
    want.push(r::rms_norm(&want[3], 130, 1e-3));
    let w11: Vec<f32> = want[10].iter().zip(&want[9]).map(|(a, b)| a + b).collect();
    want.push(w11);
    for (i, o) in outs.iter().enumerate() {
        check(&format!("op {i}"), &read(c, &l, o), &want[i], 1e-10);
    }
    c.take_errors().unwrap();
}

#[test]
fn params_arena_spans_chunks() {
    // 600 ops > one 64 KiB parameter chunk; every op has a distinct bias.
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let l = Lay::contig(DType::F32, [8, 1, 1, 1]);
    let b = upload(c, &l, &[0.0; 8]);
    for round in 0..2 {
        let mut e = enc(c);
        for i in 0..600 {
            k.scale(&mut e, l.t(&b), l.t(&b), 1.0, (i % 7) as f32)
                .unwrap();
        }
        k.submit(e);
        let want: f32 = (0..600).map(|i| (i % 7) as f32).sum::<f32>() * (round + 1) as f32;
        check("600 chained ops", &read(c, &l, &b), &[want; 8], 0.0);
    }
    c.take_errors().unwrap();
}

#[test]
fn bad_input_is_an_error() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let b = c.create_buffer(4096);
    let t = |ne: [u64; 4], dt: DType| TensorRef::contiguous(&b, 0, dt, ne);
    let mut e = enc(c);
    assert!(
        k.add(
            &mut e,
            t([8, 2, 1, 1], DType::F32),
            t([3, 1, 1, 1], DType::F32),
            t([8, 2, 1, 1], DType::F32)
        )
        .is_err()
    );
    assert!(
        k.add(
            &mut e,
            t([8000, 1, 1, 1], DType::F32),
            t([1, 1, 1, 1], DType::F32),
            t([8000, 1, 1, 1], DType::F32)
        )
        .is_err()
    );
    assert!(
        k.mul_mat(
            &mut e,
            t([48, 2, 1, 1], DType::Q4_0),
            t([48, 1, 1, 1], DType::F32),
            t([2, 1, 1, 1], DType::F32)
        )
        .is_err()
    );
    assert!(
        k.mul_mat(
            &mut e,
            t([64, 2, 1, 1], DType::F32),
            t([32, 1, 1, 1], DType::F32),
            t([2, 1, 1, 1], DType::F32)
        )
        .is_err()
    );
    let mut odd = t([8, 1, 1, 1], DType::F32);
    odd.offset = 2;
    assert!(
        k.scale(&mut e, odd, t([8, 1, 1, 1], DType::F32), 1.0, 0.0)
            .is_err()
    );
    assert!(
        k.rope(
            &mut e,
            t([7, 1, 1, 1], DType::F32),
            t([1, 1, 1, 1], DType::I32),
            t([7, 1, 1, 1], DType::F32),
            RopeMode::Norm,
            7,
            1e4,
            1.0
        )
        .is_err()
    );
    k.submit(e);
    c.take_errors().unwrap();
}

#[test]
fn pipelines_are_cached() {
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let l = Lay::contig(DType::F32, [16, 1, 1, 1]);
    let b = upload(c, &l, &[1.0; 16]);
    let mut e = enc(c);
    for _ in 0..5 {
        k.scale(&mut e, l.t(&b), l.t(&b), 2.0, 0.0).unwrap();
    }
    k.submit(e);
    assert_eq!(k.pipeline_count(), 1);
    check("scale x5 in place", &read(c, &l, &b), &[32.0; 16], 0.0);
}

#[test]
fn flash_attn_gqa_mask_softcap() {
    let c = gpu!();
    // The kernel uses no subgroup reductions, so one pass covers both settings.
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(14);
    for (d, kvdt, use_mask, softcap) in [
        (64u64, DType::F16, true, 0.0f32),
        (128, DType::F16, false, 0.0),
        (80, DType::F32, true, 30.0),
    ] {
        let (n_q, h, n_kv, h_kv, slots) = (3u64, 4u64, 100u64, 2u64, 128u64);
        let lq = Lay::strided(DType::F32, [d, n_q, h, 1], [0, 2, 1, 3], 0);
        let q: Vec<f32> = rng.vec(lq.n()).iter().map(|v| v * 2.0).collect();
        let bq = upload(c, &lq, &q);
        let lcache = Lay::contig(kvdt, [d, slots, h_kv, 1]);
        let (kc, vc) = (rng.vec(lcache.n()), rng.vec(lcache.n()));
        let (bk, bv) = (upload(c, &lcache, &kc), upload(c, &lcache, &vc));
        let mut view = lcache;
        view.ne = [d, n_kv, h_kv, 1];
        // Mask [n_kv, 4 (padded n_q)]: causal-ish, row 1 fully masked.
        let mne = [n_kv, 4u64, 1, 1];
        let mvals: Vec<f32> = (0..(n_kv * 4) as usize)
            .map(|i| {
                let (j, iq) = (i % n_kv as usize, i / n_kv as usize);
                if iq == 1 || j > 60 + 10 * iq {
                    f32::NEG_INFINITY
                } else {
                    rng.uniform()
                }
            })
            .collect();
        let lm = Lay::contig(DType::F16, mne);
        let bm = upload(c, &lm, &mvals);
        let ld = Lay::contig(DType::F32, [d, h, n_q, 1]);
        let bd = upload(c, &ld, &[]);
        let mut e = enc(c);
        let scale = 1.0 / (d as f32).sqrt();
        let mask = use_mask.then(|| lm.t(&bm));
        k.flash_attn(
            &mut e,
            lq.t(&bq),
            view.t(&bk),
            view.t(&bv),
            mask,
            ld.t(&bd),
            scale,
            softcap,
            1,
        )
        .unwrap();
        k.submit(e);
        // Reference on the viewed (and f16-rounded) cache rows.
        let round = |x: &[f32]| -> Vec<f32> {
            let mut o = Vec::new();
            for hk in 0..h_kv as usize {
                for j in 0..n_kv as usize {
                    for dd in 0..d as usize {
                        let v = x[dd + d as usize * (j + slots as usize * hk)];
                        o.push(if kvdt == DType::F16 {
                            r::f16_val(r::f16_bits(v))
                        } else {
                            v
                        });
                    }
                }
            }
            o
        };
        let mr: Vec<f32> = mvals.iter().map(|&v| r::f16_val(r::f16_bits(v))).collect();
        let dims = (
            d as usize,
            n_q as usize,
            h as usize,
            n_kv as usize,
            h_kv as usize,
        );
        let mref = use_mask.then(|| (&mr[..], [n_kv as usize, 4, 1]));
        let want = r::attention(&q, &round(&kc), &round(&vc), dims, mref, scale, softcap);
        let got = read(c, &ld, &bd);
        assert!(got.iter().all(|v| v.is_finite()), "NaN in flash_attn");
        // The kernel repeats the CPU's rounding (an f16 accumulator for f16 V), not this
        // f32 reference: ggml's flash-attention limit. `backend_ops` checks the bits.
        check(
            &format!("flash_attn d={d} {kvdt:?} mask={use_mask} softcap={softcap}"),
            &got,
            &want,
            5e-4,
        );
    }
    c.take_errors().unwrap();
}

#[test]
fn mat_vec_with_more_rows_than_one_dispatch_dimension() {
    // Gemma 3's output: 262144 rows, more workgroups than one dispatch dimension holds.
    let c = gpu!();
    let mut k = Kernels::new(&c.device, &c.queue);
    let mut rng = Rng(23);
    for path in [MatMulPath::MatVec, MatMulPath::Tiled] {
        run_mul_mat(
            c,
            &mut k,
            DType::Q8_0,
            (64, 262_144, 1),
            [1, 1],
            [1, 1],
            path,
            &mut rng,
        );
    }
    // And split by rows over several bindings.
    k.set_binding_limit(1 << 20);
    for path in [MatMulPath::MatVec, MatMulPath::Tiled] {
        run_mul_mat(
            c,
            &mut k,
            DType::Q8_0,
            (64, 262_144, 1),
            [1, 1],
            [1, 1],
            path,
            &mut rng,
        );
    }
    c.take_errors().unwrap();
}
