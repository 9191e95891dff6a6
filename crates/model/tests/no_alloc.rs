//! The per-token path allocates nothing: once a context has generated a few tokens (sizing its
//! kept buffers), each further step (write the token's inputs, run the graph on the devices'
//! queues and worker pools, read the logits back, sample the next token with llama.cpp's
//! default sampler chain) makes no heap allocation on any thread. Checked with a counting
//! global allocator, on one CPU device and on two virtual devices with pipeline parallelism
//! (cross-device copies and events on the path).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

mod common;

use common::load;
use lamina_gguf::pull::model_for_test;
use lamina_model::{Batch, Context, ContextParams, Model};
use lamina_sample::{SamplerChain, SamplingParams};

/// Counts every allocation and reallocation, on every thread.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Generates `warmup` then `measured` tokens after a prompt; returns the allocations made
/// during the measured steps, and the tokens.
fn generate(model: Arc<Model>, warmup: usize, measured: usize) -> (usize, Vec<u32>) {
    let n_vocab = model.hparams.n_vocab as usize;
    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 128,
            ..Default::default()
        },
    )
    .unwrap();
    let params = SamplingParams {
        seed: 42,
        ..Default::default()
    };
    let mut chain = SamplerChain::new(&params, n_vocab).unwrap();
    // Token ids valid in both vocabularies; the text does not matter here.
    let prompt = [2u32, 504, 3458, 282, 4649, 314];
    let mut batch = Batch::sequence(&prompt, 0, 0);
    ctx.decode(&batch).unwrap();
    let mut tokens = Vec::with_capacity(warmup + measured);
    let mut before = 0;
    for step in 0..warmup + measured {
        if step == warmup {
            before = ALLOCATIONS.load(Ordering::SeqCst);
        }
        let next = chain.sample(ctx.last_logits().unwrap()).unwrap();
        chain.accept(next).unwrap();
        tokens.push(next);
        batch.clear();
        batch.push(next, (prompt.len() + step) as i32, 0, true);
        ctx.decode(&batch).unwrap();
    }
    let allocations = ALLOCATIONS.load(Ordering::SeqCst) - before;
    (allocations, tokens)
}

/// The counter sees every thread of the process: tests take turns.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn check(name: &str) {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some(path) = model_for_test(name) else {
        return;
    };
    let (one, tokens_one) = generate(load(&path, 1), 4, 16);
    let (two, tokens_two) = generate(load(&path, 2), 4, 16);
    assert_eq!(
        tokens_one, tokens_two,
        "{name}: one and two devices generate alike"
    );
    assert_eq!(
        one, 0,
        "{name}: allocations in 16 generated tokens on one device"
    );
    assert_eq!(
        two, 0,
        "{name}: allocations in 16 generated tokens on two devices"
    );
}

#[test]
fn smollm2_token_generation_allocates_nothing() {
    check("smollm2-135m");
}

#[test]
fn gemma3_token_generation_allocates_nothing() {
    check("gemma3-270m");
}
