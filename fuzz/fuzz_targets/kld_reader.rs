//! Fuzzes the `--kl-divergence-base` logits-file reader (llama.cpp's format) on arbitrary
//! bytes, through the reader the CLI uses (`LogitsFileReader`, here over an in-memory
//! file) and on through what the CLI does with it: the KL-divergence plan built from the
//! file's tokens, every chunk and row read, each row compared against logits with
//! `KldAccumulator`, and the per-chunk and final reports. Never panics, and never allocates
//! more than a small multiple of the input: every size comes from the file, so a header that
//! claims more than the file holds must be refused before anything is allocated for it.

#![no_main]

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::Cursor;
use std::sync::atomic::{AtomicUsize, Ordering};

use lamina_model::perplexity::{KldAccumulator, LogitsFileReader, PerplexityPlan};
use libfuzzer_sys::fuzz_target;

/// Counts live heap bytes and their peak, so the target can check the peak per input.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
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

/// Everything the CLI's `--kl-divergence` path does with the file, minus the model: the
/// model's logits for row `k` are made up from the base row itself (shifted, so that the
/// divergence is not zero), and once more as all zeros, so that hostile base values (NaN,
/// infinite scales) meet both finite and non-finite logits.
fn exercise(data: &[u8]) {
    let Ok(mut reader) = LogitsFileReader::new(Cursor::new(data)) else {
        return;
    };
    let header = *reader.header();
    assert_eq!(reader.tokens().len(), header.n_tokens());
    assert!(
        reader
            .tokens()
            .iter()
            .all(|&t| (t as usize) < header.n_vocab)
    );
    let Ok(plan) = PerplexityPlan::for_kl_divergence(reader.tokens(), header.n_ctx, 512, None)
    else {
        return;
    };
    assert_eq!(plan.n_chunk(), header.n_chunk);
    assert_eq!(plan.scored_per_chunk(), header.rows_per_chunk());
    let mut kld = KldAccumulator::new();
    let mut logits = vec![0f32; header.n_vocab];
    for i in 0..plan.n_chunk() {
        let base = match reader.next_chunk() {
            Ok(Some(b)) => b,
            Ok(None) => panic!(
                "chunk {i} of {} missing after a valid header",
                header.n_chunk
            ),
            Err(_) => return,
        };
        assert_eq!(base.index, i);
        assert_eq!(base.n_rows(), header.rows_per_chunk());
        let chunk = plan.chunk(i).expect("the plan has the chunk");
        for (k, &target) in chunk.targets.iter().enumerate() {
            let row = base.row(k).expect("every row of a full chunk is readable");
            assert_eq!(row.n_vocab(), header.n_vocab);
            assert!(row.log_prob(row.n_vocab()).is_none());
            assert!(row.nll(target).is_ok());
            assert!(row.nll(u32::MAX).is_err());
            for (j, l) in logits.iter_mut().enumerate() {
                *l = row.log_prob(j).unwrap() + ((j * 31 + k) % 7) as f32 * 0.25;
            }
            kld.add_token(&row, &logits, target)
                .expect("row and logits agree");
            logits.fill(0.0);
            kld.add_token(&row, &logits, target)
                .expect("row and logits agree");
            assert!(kld.add_token(&row, &logits[..0], target).is_err());
        }
        assert!(base.row(base.n_rows()).is_none());
        let _ = kld.chunk_report(i);
    }
    assert!(matches!(reader.next_chunk(), Ok(None)));
    let _ = kld.summary();
    let _ = kld.report();
}

fuzz_target!(|data: &[u8]| {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
    let before = LIVE.load(Ordering::Relaxed);
    exercise(data);
    let peak = PEAK.load(Ordering::Relaxed) - before;
    // The reader, the plan's copy of the tokens, one chunk, one logits row and the
    // per-token values stay within a few times the file; the rest is fixed overhead.
    let bound = 16 * data.len() + (1 << 20);
    assert!(
        peak <= bound,
        "{peak} bytes allocated for a {}-byte file",
        data.len()
    );
});
