//! A sequence's KV cells saved and put back (slot save/restore): the restored sequence
//! continues exactly as the original would, on both test models (Gemma 3's layers mix
//! sliding-window and global attention), with the V cache transposed and as rows; bad
//! states are refused without touching the cache.

mod common;

use common::load;
use lamina_gguf::pull::model_for_test;
use lamina_model::{Batch, Context, ContextParams, FlashAttn};

fn check(name: &str, flash_attn: FlashAttn) {
    let Some(path) = model_for_test(name) else {
        return;
    };
    let model = load(&path, 1);
    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 256,
            n_seq_max: 2,
            flash_attn,
            ..Default::default()
        },
    )
    .unwrap();
    let prompt = [2u32, 504, 3458, 282, 4649, 314, 1200, 77];
    ctx.decode(&Batch::sequence(&prompt, 0, 0)).unwrap();
    let state = ctx.seq_state(0).unwrap();
    assert_eq!(ctx.set_seq_state(1, &state).unwrap(), prompt.len());
    let mut next = Batch::default();
    next.push(900, prompt.len() as i32, 0, true);
    next.push(900, prompt.len() as i32, 1, true);
    ctx.decode(&next).unwrap();
    let a = ctx.output_logits(0).unwrap().to_vec();
    let b = ctx.output_logits(1).unwrap().to_vec();
    assert_eq!(a, b, "{name}: the restored sequence answers differently");

    // Corrupt or foreign states are refused and leave sequence 1 as it was.
    let used = ctx.kv_cache().used();
    assert!(ctx.set_seq_state(1, &state[..state.len() - 1]).is_err());
    assert!(ctx.set_seq_state(1, b"LAMINAKV").is_err());
    assert!(ctx.set_seq_state(1, &[]).is_err());
    let mut wrong = state.clone();
    wrong[8] ^= 1; // the layer count
    assert!(ctx.set_seq_state(1, &wrong).is_err());
    assert_eq!(ctx.kv_cache().used(), used);
}

#[test]
fn smollm2_state_round_trips() {
    check("smollm2-135m", FlashAttn::Off);
    check("smollm2-135m", FlashAttn::On);
}

#[test]
fn gemma3_state_round_trips() {
    check("gemma3-270m", FlashAttn::Auto);
}
