//! Two sequences decoded in the same batches get the same logits whatever their streams
//! held before and however much of each prompt came from the cache (llama.cpp's
//! non-unified cache: each sequence attends over its own stream of cells from the stream's
//! first cell). This is what lets the server answer the prompts of one request
//! (`"prompt": [a, a]`) identically, once they are started in the same step.
//!
//! One thing is left as llama.cpp has it: a weight type with repacked kernels (Q4_K, Q4_0,
//! IQ4_NL with rows in 8s) takes activation rows four at a time and the rest one at a time,
//! with other roundings, so a row's result depends on where it falls in a micro-batch. The
//! prompts here put both sequences' last tokens among the rows taken four at a time.

use std::sync::Arc;

mod common;

use common::{argmax, load};
use lamina_gguf::pull::model_for_test;
use lamina_model::{Batch, Context, ContextParams, FlashAttn, Model};

/// Greedy logits of `prompt` decoded alone as sequence `seq`, then a token at a time.
fn alone(model: &Arc<Model>, params: ContextParams, seq: usize, prompt: &[u32]) -> Vec<Vec<f32>> {
    let mut ctx = Context::new(model.clone(), params).unwrap();
    let mut out = Vec::new();
    let mut batch = Batch::sequence(prompt, 0, seq);
    for step in 0..24 {
        ctx.decode(&batch).unwrap();
        let l = ctx.last_logits().unwrap().to_vec();
        batch = Batch::default();
        batch.push(argmax(&l), (prompt.len() + step) as i32, seq, true);
        out.push(l);
    }
    out
}

fn check(name: &str, flash_attn: FlashAttn) {
    let Some(path) = model_for_test(name) else {
        return;
    };
    let model = load(&path, 1);
    // Alone, a sequence computes the same in any stream as in a one-sequence context (one
    // token at a time is where flash attention cuts the cells into chunks, by their count).
    let prompt = [2u32, 504, 3458, 282, 4649, 314, 1200, 77];
    let one = ContextParams {
        n_ctx: 512,
        flash_attn,
        ..Default::default()
    };
    let streams = ContextParams {
        n_seq_max: 3,
        kv_unified: false,
        ..one
    };
    let want = alone(&model, one, 0, &prompt);
    assert!(
        want == alone(&model, streams, 0, &prompt),
        "{name} {flash_attn:?}: stream 0"
    );
    assert!(
        want == alone(&model, streams, 2, &prompt),
        "{name} {flash_attn:?}: stream 2"
    );

    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 512,
            n_seq_max: 3,
            kv_unified: false,
            flash_attn,
            ..Default::default()
        },
    )
    .unwrap();
    let n = prompt.len();
    // Sequence 0's stream held a longer text, since removed, and sequence 0 has half of the
    // prompt cached already (as a slot that served a prompt with the same start before):
    // on a shared run of cells, sequence 1's tokens would land after sequence 0's.
    ctx.decode(&Batch::sequence(
        &[2, 9, 17, 33, 65, 129, 257, 513, 1025, 7, 8, 9],
        0,
        0,
    ))
    .unwrap();
    ctx.seq_rm(Some(0), Some(0), None);
    ctx.decode(&Batch::sequence(&prompt[..n / 2], 0, 0))
        .unwrap();
    let mut batch = Batch::default();
    for (i, &t) in prompt.iter().enumerate().skip(n / 2) {
        batch.push(t, i as i32, 0, i + 1 == n);
    }
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as i32, 1, i + 1 == n);
    }
    for step in 0..48 {
        ctx.decode(&batch).unwrap();
        let a = ctx.output_logits(0).unwrap().to_vec();
        let b = ctx.output_logits(1).unwrap().to_vec();
        assert!(a.iter().all(|x| x.is_finite()));
        assert_eq!(
            a, b,
            "{name} {flash_attn:?}: the rows differ at step {step}"
        );
        let next = argmax(&a);
        batch.clear();
        let pos = (n + step) as i32;
        batch.push(next, pos, 1, true);
        batch.push(next, pos, 0, true);
    }
}

#[test]
fn smollm2_rows_are_independent() {
    check("smollm2-135m", FlashAttn::Off);
    check("smollm2-135m", FlashAttn::On);
}

#[test]
fn gemma3_rows_are_independent() {
    check("gemma3-270m", FlashAttn::On);
    check("gemma3-270m", FlashAttn::Off);
}
