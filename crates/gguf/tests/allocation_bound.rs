//! No allocation larger than the file can justify: a counting global allocator records the
//! largest single allocation while hostile files claiming huge counts are parsed. (One test in
//! this binary, so no other test's allocations are counted.)

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use common::{Bytes, sample_file, ty};
use lamina_gguf::Gguf;

struct Counting;
static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: same layout contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: ptr came from System.alloc with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The largest single allocation made while parsing `bytes`.
fn largest_allocation(bytes: &[u8]) -> usize {
    LARGEST.store(0, Ordering::Relaxed);
    let _ = Gguf::parse(bytes);
    LARGEST.load(Ordering::Relaxed)
}

#[test]
fn hostile_counts_allocate_in_proportion_to_the_file() {
    let mut files: Vec<(&str, Vec<u8>)> = Vec::new();
    // Counts just under what the bytes could hold, so they pass the first check and the parser
    // reserves for them: the reservation must stay proportional to the file.
    let pad = vec![0u8; 4096];
    let mut b = Bytes::header(3, 4096 / 32, 0);
    b.raw(&pad);
    files.push(("many tensors", b.bytes()));
    let mut b = Bytes::header(3, 0, 1);
    b.str("s")
        .u32(ty::ARRAY)
        .u32(ty::STRING)
        .u64(4096 / 8)
        .raw(&pad);
    files.push(("many strings", b.bytes()));
    let mut b = Bytes::header(3, 0, 1);
    b.str("a")
        .u32(ty::ARRAY)
        .u32(ty::ARRAY)
        .u64(4096 / 12)
        .raw(&pad);
    files.push(("many arrays", b.bytes()));
    // Nested arrays each claiming everything left.
    let mut b = Bytes::header(3, 0, 1);
    b.str("n").u32(ty::ARRAY);
    for _ in 0..8 {
        b.u32(ty::ARRAY).u64(4096 / 12);
    }
    b.raw(&pad);
    files.push(("nested arrays", b.bytes()));
    // Counts far past the file.
    files.push(("huge kv count", Bytes::header(3, 0, u64::MAX).bytes()));
    files.push(("huge tensor count", Bytes::header(3, u64::MAX, 0).bytes()));
    let mut b = Bytes::header(3, 0, 1);
    b.str("u")
        .u32(ty::ARRAY)
        .u32(ty::U64)
        .u64(1 << 40)
        .raw(&pad);
    files.push(("huge u64 array", b.bytes()));
    files.push(("sample", sample_file()));

    for (what, bytes) in &files {
        let largest = largest_allocation(bytes);
        // A parsed structure may take a few times the bytes it came from (a 32-byte `Array` per
        // 12-byte empty array), never more than that.
        let limit = 8 * bytes.len() + 4096;
        assert!(
            largest <= limit,
            "{what}: largest allocation {largest} bytes for a {}-byte file",
            bytes.len()
        );
    }
}
