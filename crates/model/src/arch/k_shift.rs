//! The K-shift graph (llama.cpp's `build_graph_shift`): after positions of cached tokens
//! moved (context shift, cache reuse), every layer's cached K is rotated by RoPE again, by
//! the distance each cell moved, so that it reads as if computed at its new position. As
//! llama.cpp, every cell is rotated (by 0 where it did not move), with the layer's own RoPE
//! base, scale and factors, in f32, through the cache's Walsh-Hadamard rotation when K is
//! quantized.

use lamina_core::DType;

use super::{BuildContext, Builder, BuiltGraph, GraphShape, inputs};
use crate::ModelError;
use crate::weights::WeightRef;

/// How one layer's cached K is rotated again: which dims (`n_offs..n_offs + n_rot`; DeepSeek
/// caches its rotary part after the compressed one) and with which frequency factors. The
/// base, scale and YaRN factors are the layer's [`Builder::rope`] ones, as llama.cpp's
/// K-shift takes them (for a YaRN-scaled model this applies YaRN's magnitude factor to the
/// moved keys once more, as llama.cpp does).
#[derive(Clone, Copy, Debug, Default)]
pub struct KShiftRope {
    pub n_offs: usize,
    pub factors: Option<WeightRef>,
}

/// The graph rotating every layer's cached K by the cache's pending shifts. Its inputs are
/// the shifts and the cell indices `0..size` ([`inputs::KIdxs`] over every cell).
pub fn build_shift_graph(ctx: &BuildContext<'_>) -> Result<BuiltGraph, ModelError> {
    let kv = ctx.kv;
    let size = kv.size();
    let shape = GraphShape {
        n_tokens: size,
        kv_start: 0,
        n_kv: size,
        n_outputs: 0,
        embeddings: false,
    };
    let mut b = Builder::new(ctx, shape);
    let shift = b.add_input(DType::I32, &[size], "k_shift", Box::new(inputs::KShift))?;
    // RoPE blocks read their positions from the shifts.
    b.input_ids.pos = Some(shift);
    let idxs = b.inp_k_idxs()?;
    let hp = b.hp();
    let fmt = kv.format();
    let head_k = hp.n_embd_head_k as usize;
    // As the forward graph: the largest power of two (64 or more) dividing the head.
    let rot = (fmt.type_k.is_quantized() && head_k.is_multiple_of(64))
        .then(|| 1usize << head_k.trailing_zeros());
    let mut last = None;
    for il in 0..hp.n_layer as usize {
        let Some(rope) = ctx.arch.k_shift_rope(il, size) else {
            continue;
        };
        b.begin_layer(il);
        let lc = kv.layer(il);
        let n_head_kv = hp.n_head_kv[il] as usize;
        let kv_memory = ctx.kv_memory[lc.device]
            .clone()
            .ok_or_else(|| ModelError::Placement(format!("layer {il} has no cache")))?;
        let k_cache = b.g.new_tensor(fmt.type_k, &[lc.n_embd_k, size])?;
        b.g.bind(k_cache, kv_memory, lc.k_offset)?;
        let k = b.g.get_rows(k_cache, idxs)?; // f32 [n_embd_k, size]
        let mut k = b.g.reshape(k, &[head_k, n_head_kv, size])?;
        if let Some(n) = rot {
            k = b.hadamard(k, n)?;
        }
        k = b.rope(k, il, rope.factors)?;
        if rope.n_offs > 0 {
            b.g.rope_set_offset(k, rope.n_offs)?;
        }
        if let Some(n) = rot {
            k = b.hadamard(k, n)?;
        }
        let k = b.g.reshape(k, &[lc.n_embd_k, size])?;
        let stored = b.g.set_rows(k_cache, k, idxs)?;
        b.g.set_output(stored)?;
        last = Some(stored);
    }
    let last =
        last.ok_or_else(|| ModelError::BadParams("no layer of this model uses RoPE".into()))?;
    Ok(BuiltGraph {
        graph: b.g,
        inputs: b.inputs,
        logits: last,
        hints: b.hints,
    })
}
