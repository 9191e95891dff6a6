//! Fuzzes the importance-matrix reader (`lamina_tools::imatrix::Imatrix::from_bytes`, what
//! `lamina quantize --imatrix` and `lamina imatrix --in-file` open) on arbitrary bytes: a
//! GGUF imatrix when the bytes start with the GGUF magic, llama.cpp's legacy `.dat` format
//! otherwise. Never panics; what it reads is well-formed (every entry's sums split into its
//! counts), `quant_weights` covers it, and it writes back as a GGUF imatrix that reads back
//! to the same values. Never allocates more than a small multiple of the input: every size
//! comes from the file (a legacy `nval` or entry count, a GGUF tensor's shape), so one that
//! claims more than the file holds must be refused before anything is allocated for it.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use lamina_tools::imatrix::Imatrix;
use libfuzzer_sys::fuzz_target;

/// Counts live heap bytes and their peak, so the target can check the peak per input.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to the system allocator with the caller's arguments
// unchanged, so `System`'s guarantees are this allocator's; the counters are only
// bookkeeping and never affect what is returned.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc_zeroed` is passed on unchanged.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, i.e. from `System`, with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from `System` with `layout`; the caller's contract holds.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            if new_size >= layout.size() {
                let grow = new_size - layout.size();
                let now = LIVE.fetch_add(grow, Ordering::Relaxed) + grow;
                PEAK.fetch_max(now, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Whether two entries hold the same bits (NaN sums are data too).
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

fn exercise(data: &[u8]) {
    let Ok(m) = Imatrix::from_bytes(data, Path::new("fuzz.imatrix")) else {
        return;
    };
    // Every value held was read from the file: no more than the file's bytes.
    let held: usize = m
        .entries
        .values()
        .map(|e| 4 * (e.sums.len() + e.counts.len()))
        .sum();
    assert!(
        held <= data.len(),
        "{held} bytes of values from {}",
        data.len()
    );
    for (name, e) in &m.entries {
        assert!(!e.counts.is_empty(), "{name}: no counts");
        assert!(
            e.sums.len().is_multiple_of(e.counts.len()),
            "{name}: {} sums, {} counts",
            e.sums.len(),
            e.counts.len()
        );
        if m.is_legacy {
            assert_eq!(e.counts.len(), 1, "{name}: a legacy entry has one ncall");
        }
    }
    let w = m.quant_weights();
    assert_eq!(w.len(), m.entries.len());
    for (name, e) in &m.entries {
        assert_eq!(w[name].len(), e.sums.len(), "{name}");
    }
    // Written back as llama-imatrix writes it, it reads back to the same values, as long as
    // no name is cut to ggml's 63 bytes or is empty (a GGUF imatrix skips those). An entry
    // without sums (a zero-sized GGUF tensor) is not written.
    let plain = m
        .entries
        .keys()
        .all(|n| !n.is_empty() && n.len() + ".in_sum2".len() < 64);
    let written = m.to_gguf_bytes();
    if !plain {
        return;
    }
    let bytes = written.expect("an imatrix that was read can be written");
    let kept: Vec<&String> = m
        .entries
        .iter()
        .filter(|(_, e)| !e.sums.is_empty())
        .map(|(n, _)| n)
        .collect();
    if kept.is_empty() {
        return;
    }
    let back = Imatrix::from_bytes(&bytes, Path::new("written.gguf"))
        .expect("what the writer writes reads back");
    assert!(!back.is_legacy);
    assert_eq!(back.datasets, m.datasets);
    assert_eq!(back.chunk_count, m.chunk_count);
    assert_eq!(back.chunk_size, m.chunk_size);
    assert_eq!(back.entries.keys().collect::<Vec<_>>(), kept);
    for name in kept {
        let (e, b) = (&m.entries[name], &back.entries[name]);
        assert!(same_bits(&b.sums, &e.sums), "{name}: sums differ");
        assert!(same_bits(&b.counts, &e.counts), "{name}: counts differ");
    }
}

fuzz_target!(|data: &[u8]| {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    let before = LIVE.load(Ordering::Relaxed);
    exercise(data);
    let peak = PEAK.load(Ordering::Relaxed) - before;
    // The values (at most the file), their quant weights, a written copy and its re-read
    // stay within a few times the file; the rest is fixed overhead.
    let bound = 16 * data.len() + (1 << 20);
    assert!(
        peak <= bound,
        "{peak} bytes allocated for a {}-byte file",
        data.len()
    );
});
