//! Packed copies of weights for the kernel tier's packed tiles ([`crate::kernels::pack16`]),
//! made by a device's worker pool (all its threads, each a share of the groups) the first time
//! a product reads a weight matrix, and kept while the weight's buffer lives.
//!
//! Only read-only buffers (the mapped model file) are packed from: their bytes never change,
//! so a copy made once stays right. A copy is keyed by the buffer's process-unique id and the
//! weight's offset and shape, and dropped with the buffer (checked when a copy is added).
//! As a weight is packed, its pages of the file are dropped from the process's memory
//! (`Buffer::evict`), so the copy does not double it; `GET_ROWS` on a packed weight (a tied
//! embedding) reads the copy ([`PackCache::find`]), so nothing faults the pages back.
//! llama.cpp packs its `CPU_REPACK` types at load instead; here the copy is made on first use.

use std::collections::HashMap;
use std::sync::Arc;

use lamina_backend::{Buffer, WeakBuffer};
use lamina_core::tensor::Layout;

use crate::kernels::pack16::{GROUP, PackLayout, Packed16};
use crate::pool::WorkerPool;

/// Environment variable that, set to `1`, turns packing off (llama.cpp's `--no-repack`).
pub const NO_REPACK_ENV: &str = "LAMINA_NO_REPACK";

/// A weight as the cache knows it: offset, type and shape in its buffer.
type WeightKey = (usize, lamina_core::DType, usize, usize, usize);

/// One device's packed weights, per buffer.
#[derive(Default)]
pub(crate) struct PackCache {
    buffers: HashMap<u64, (WeakBuffer, HashMap<WeightKey, Arc<Packed16>>)>,
}

impl PackCache {
    /// The packed copy of the weight `layout` at `ptr` (offset `offset` in `buffer`), made now
    /// (by every thread of `pool`) if missing, when the pool's kernel table has a packed tile
    /// and the weight and a product of `n` activation rows suit it; else `None`.
    ///
    /// # Safety
    /// `ptr` addresses the weight's bytes as `layout` describes them, readable for this call.
    pub(crate) unsafe fn get(
        &mut self,
        pool: &mut WorkerPool,
        buffer: &Buffer,
        offset: usize,
        ptr: *const u8,
        layout: &Layout,
        n: usize,
    ) -> Option<Arc<Packed16>> {
        let tile = pool.kernels().packed16()?;
        let pl = PackLayout::of(layout.dtype)?;
        let [k, m, ne2, ne3] = layout.ne;
        let qk = layout.dtype.block_size() as usize;
        let nb = k / qk;
        // (One activation row included: the packed tiles decode in registers and stream
        // faster than the per-row dots, Q8_0 too.)
        if n == 0
            || !buffer.is_read_only()
            || ne2 != 1
            || ne3 != 1
            || !m.is_multiple_of(GROUP)
            || nb == 0
            || nb > tile.max_blocks
            || !k.is_multiple_of(qk)
            || layout.nb[0] != pl.block
            || disabled()
        {
            return None;
        }
        let key = key(offset, layout);
        if let Some((_, weights)) = self.buffers.get(&buffer.id())
            && let Some(p) = weights.get(&key)
        {
            return Some(p.clone());
        }
        let (stride, addr) = (layout.nb[1], ptr as usize);
        let row = |i: usize| {
            // SAFETY: row `i < m` of the weight, `nb` blocks of `pl.block` bytes, by the
            // caller's contract (`nb[0]` is the block size, checked above).
            unsafe { std::slice::from_raw_parts((addr + i * stride) as *const u8, nb * pl.block) }
        };
        // The file's pages of this weight are read again only by ops the copy does not serve
        // (products the packed tiles do not take), which fault back what they need. Dropped
        // as the packing goes (else the peak holds both copies of the
        // largest weight: Gemma 3's output head, 178 MB), then once more whole, for the pages
        // two runs of rows share.
        let len = (m - 1) * stride + nb * pl.block;
        let packed = Packed16::pack_on(
            layout.dtype,
            m,
            nb,
            row,
            |part| pool.run(&|ctx| part(ctx.ith, ctx.nth)),
            |rows| buffer.evict(offset + rows.start * stride, rows.len() * stride),
        )?;
        buffer.evict(offset, len);
        let packed = Arc::new(packed);
        self.buffers.retain(|_, (b, _)| b.is_alive());
        self.buffers
            .entry(buffer.id())
            .or_insert_with(|| (buffer.downgrade(), HashMap::new()))
            .1
            .insert(key, packed.clone());
        Some(packed)
    }

    /// The packed copy of the weight `layout` at offset `offset` in `buffer`, if one was made.
    pub(crate) fn find(
        &self,
        buffer: &Buffer,
        offset: usize,
        layout: &Layout,
    ) -> Option<Arc<Packed16>> {
        self.buffers
            .get(&buffer.id())?
            .1
            .get(&key(offset, layout))
            .cloned()
    }
}

/// The cache's key of the weight `layout` at `offset` in its buffer.
fn key(offset: usize, layout: &Layout) -> WeightKey {
    (
        offset,
        layout.dtype,
        layout.ne[0],
        layout.ne[1],
        layout.nb[1],
    )
}

/// Whether packing is on: [`set_repack`]'s choice, else the environment's.
static REPACK: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(UNSET);
const UNSET: u8 = 0;
const ON: u8 = 1;
const OFF: u8 = 2;

/// Turns packing on or off for the whole process (llama.cpp's `--no-repack`), over
/// [`NO_REPACK_ENV`]. Copies already made stay in use.
pub fn set_repack(on: bool) {
    REPACK.store(
        if on { ON } else { OFF },
        std::sync::atomic::Ordering::Relaxed,
    );
}

fn disabled() -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    match REPACK.load(Relaxed) {
        ON => false,
        OFF => true,
        _ => {
            let off = std::env::var(NO_REPACK_ENV).is_ok_and(|v| v == "1");
            // A concurrent `set_repack` wins.
            let _ = REPACK.compare_exchange(UNSET, if off { OFF } else { ON }, Relaxed, Relaxed);
            REPACK.load(Relaxed) == OFF
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_backend::Device;
    use lamina_core::DType;

    /// A copy is made once per weight, found again while its buffer lives, and dropped with
    /// the buffer, one-row products included; writable buffers and short groups get none.
    #[test]
    fn copies_follow_their_buffer() {
        let mut pool = WorkerPool::new("pack-test", 2).unwrap();
        if pool.kernels().packed16().is_none() {
            return; // this tier has no packed tiles
        }
        let device = crate::CpuDevice::new(0, 1, 1, false).unwrap();
        let (k, m) = (64usize, 32usize);
        let row = DType::Q8_0.row_size(k as u64).unwrap() as usize;
        let layout = Layout::contiguous(DType::Q8_0, &[k, m]).unwrap();
        let mut cache = PackCache::default();
        let mapped = |bytes: Vec<u8>| {
            device
                .buffer_from_host_memory(Arc::new(bytes))
                .expect("a mapped buffer")
        };
        let bytes: Vec<u8> = (0..row * m).map(|i| (i * 7 + i / 13) as u8).collect();
        let a = mapped(bytes.clone());
        let ptr = a.lock().as_ptr().unwrap();
        // SAFETY (every `get` below): `ptr` addresses `row * m` bytes of `a`, which lives.
        let first = unsafe { cache.get(&mut pool, &a, 0, ptr, &layout, 4) }.expect("packed");
        // Packed by the pool's two threads: the bytes one thread packs.
        let serial = Packed16::pack(DType::Q8_0, m, k / 32, |i| &bytes[i * row..][..row]).unwrap();
        assert_eq!(first.groups(0, m), serial.groups(0, m));
        let again = unsafe { cache.get(&mut pool, &a, 0, ptr, &layout, 4) }.expect("packed");
        assert!(Arc::ptr_eq(&first, &again));
        let one = unsafe { cache.get(&mut pool, &a, 0, ptr, &layout, 1) }.expect("packed");
        assert!(Arc::ptr_eq(&first, &one));
        // Found again without making one (`GET_ROWS`), only for the same weight.
        assert!(Arc::ptr_eq(&first, &cache.find(&a, 0, &layout).unwrap()));
        assert!(cache.find(&a, row * 16, &layout).is_none());
        let short = Layout::contiguous(DType::Q8_0, &[k, 24]).unwrap();
        assert!(unsafe { cache.get(&mut pool, &a, 0, ptr, &short, 4) }.is_none());
        let host = device.buffer_type().alloc_buffer(row * m).unwrap();
        let hptr = host.lock().as_ptr().unwrap();
        assert!(unsafe { cache.get(&mut pool, &host, 0, hptr, &layout, 4) }.is_none());
        let id = a.id();
        drop(a);
        let b = mapped(vec![0x22; row * m]);
        let bptr = b.lock().as_ptr().unwrap();
        assert!(unsafe { cache.get(&mut pool, &b, 0, bptr, &layout, 4) }.is_some());
        assert!(
            !cache.buffers.contains_key(&id),
            "the dropped buffer's copies stay"
        );
        assert_eq!(cache.buffers.len(), 1);
    }
}
