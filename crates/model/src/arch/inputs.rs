//! Graph inputs as objects: each declares its tensor when a graph block first asks for it
//! (see the `inp_*` methods of [`super::Builder`]) and fills itself from the micro-batch and the
//! cache before each compute. An architecture that needs another input implements
//! [`InputFill`] and adds it with [`super::Builder::add_input`].

use lamina_core::graph::TensorId;

use crate::ModelError;
use crate::context::BatchToken;
use crate::kv_cache::KvCache;

/// What inputs are filled from: the micro-batch, the cells its tokens were given, the cache.
pub struct InputSource<'a> {
    pub ubatch: &'a [BatchToken],
    /// `(pos, seq)` of each token.
    pub placement: &'a [(i32, usize)],
    /// The cache cell of each token.
    pub cells: &'a [usize],
    pub kv: &'a KvCache,
    /// Cells attention looks at: `n_kv` from `kv_start`.
    pub kv_start: usize,
    pub n_kv: usize,
}

/// Receives an input's bytes, a part at a time: `(byte offset, bytes)`.
pub type InputWriter<'w> = dyn FnMut(usize, &[u8]) -> Result<(), ModelError> + 'w;

/// An input that fills itself.
pub trait InputFill: Send + Sync {
    /// Writes the whole input through `write`, building it in `scratch` (kept from call to
    /// call, so filling allocates nothing once warm).
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError>;
}

/// A graph input: its tensor and how it is filled.
pub struct GraphInput {
    pub id: TensorId,
    pub fill: Box<dyn InputFill>,
}

/// `vals` as little-endian i32 bytes into `out` (replacing what it held).
fn put_i32s(out: &mut Vec<u8>, vals: impl Iterator<Item = i32>) -> &[u8] {
    out.clear();
    for v in vals {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// `[n_tokens]` i32 token ids.
pub struct Tokens;

impl InputFill for Tokens {
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError> {
        write(
            0,
            put_i32s(scratch, src.ubatch.iter().map(|t| t.token as i32)),
        )
    }
}

/// `[n_tokens]` i32 positions.
pub struct Positions;

impl InputFill for Positions {
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError> {
        write(0, put_i32s(scratch, src.ubatch.iter().map(|t| t.pos)))
    }
}

/// Bytes of attention mask built and written at a time, so a prompt's mask (n_kv × n_tokens
/// f32: 8 MB for a 512-token micro-batch over 4096 cells) is never held twice.
const MASK_PART_BYTES: usize = 64 << 10;

/// `[n_kv, n_tokens]` f32 causal mask, over a sliding window of `window` tokens if set.
pub struct KqMask {
    pub window: Option<u32>,
}

impl InputFill for KqMask {
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError> {
        let n_kv = src.n_kv;
        let span = src.kv_start..src.kv_start + n_kv;
        let rows = (MASK_PART_BYTES / (4 * n_kv)).max(1);
        for (i, part) in src.placement.chunks(rows).enumerate() {
            src.kv.mask_into(part, span.clone(), self.window, scratch);
            write(i * rows * 4 * n_kv, scratch)?;
        }
        Ok(())
    }
}

/// `[n_tokens]` i32 cells the tokens' K rows go to.
pub struct KIdxs;

impl InputFill for KIdxs {
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError> {
        write(0, put_i32s(scratch, src.cells.iter().map(|&c| c as i32)))
    }
}

/// `[n_embd_v * n_tokens]` i32 element indices of the transposed V writes of a layer whose V
/// rows are `n_embd_v` wide: element (d, token t) goes to row `d * size + cell(t)`.
pub struct VIdxs {
    pub n_embd_v: usize,
}

impl InputFill for VIdxs {
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError> {
        let (n_embd_v, size) = (self.n_embd_v, src.kv.size());
        let idxs = src
            .cells
            .iter()
            .flat_map(|&c| (0..n_embd_v).map(move |d| (d * size + c) as i32));
        write(0, put_i32s(scratch, idxs))
    }
}

/// `[n_outputs]` i32 rows whose logits are wanted; a micro-batch that wants none computes its
/// last row (it still fills the cache).
pub struct OutIds;

impl InputFill for OutIds {
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError> {
        let n = src.ubatch.len();
        let wanted = (0..n).filter(|&i| src.ubatch[i].logits);
        let any = src.ubatch.iter().any(|t| t.logits);
        let last = (!any).then_some(n - 1);
        write(0, put_i32s(scratch, wanted.chain(last).map(|i| i as i32)))
    }
}

/// `[1, 1, n_tokens]` f32 attention temperature per token (llama 4 / mistral3's
/// `inp_attn_scale`): `log(floor((pos + offset) / floor_scale) + 1) * scale + 1`.
pub struct AttnTemperature {
    pub scale: f32,
    pub floor_scale: u32,
    pub offset: f32,
}

impl InputFill for AttnTemperature {
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError> {
        scratch.clear();
        for t in src.ubatch {
            // As llama.cpp computes it: the floor in f32, the rest in double.
            let steps = ((t.pos as f32 + self.offset) / self.floor_scale as f32).floor();
            let v = ((f64::from(steps) + 1.0).ln() * f64::from(self.scale) + 1.0) as f32;
            scratch.extend_from_slice(&v.to_le_bytes());
        }
        write(0, scratch)
    }
}

/// `[size]` i32: how far each cell's position moved since its K was rotated (the K-shift's
/// positions).
pub struct KShift;

impl InputFill for KShift {
    fn fill(
        &self,
        src: &InputSource<'_>,
        scratch: &mut Vec<u8>,
        write: &mut InputWriter<'_>,
    ) -> Result<(), ModelError> {
        write(0, put_i32s(scratch, src.kv.shifts().iter().copied()))
    }
}
