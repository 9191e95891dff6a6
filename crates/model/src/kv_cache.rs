//! The KV cache: per layer, K as `[n_embd_k_gqa, size]` rows (one row per cell) and V either
//! transposed as `[size, n_embd_v_gqa]` (one row per dimension), as llama.cpp's standard
//! attention path keeps it so that `V·softmax` is a plain matrix product, or, for flash
//! attention, as rows like K. K and V each have their own type (llama.cpp's `-ctk` / `-ctv`:
//! f32, f16, bf16 or a quantized type; quantized V only as rows). Cells remember the position
//! and the sequences of the token they hold; the attention mask is built from them. A layer
//! whose V is the start of its K rows (absorbed MLA) stores no V.

use std::ops::Range;
use std::sync::Arc;

use lamina_backend::{Buffer, Device};
use lamina_core::DType;

use crate::{HParams, ModelError};

/// The first bytes of a saved sequence state.
const KV_STATE_MAGIC: &[u8; 8] = b"LAMINAKV";

/// Reads a byte string front to back.
struct Reader<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let s = self.data.get(self.at..self.at.checked_add(n)?)?;
        self.at += n;
        Some(s)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Most sequences one cache can hold at once (cells keep their sequence set as a bit mask).
pub const MAX_SEQUENCES: usize = 64;

/// What a cell holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cell {
    /// Position of the token, or -1 when the cell is free.
    pub pos: i32,
    /// The sequences this cell belongs to (bit `s` for sequence `s`).
    pub seqs: u64,
}

impl Cell {
    const FREE: Cell = Cell { pos: -1, seqs: 0 };

    pub fn is_free(&self) -> bool {
        self.seqs == 0
    }
}

/// Where layer `il`'s K and V live: a device (index into the devices the cache was made for)
/// and offsets inside that device's cache buffer.
#[derive(Clone, Copy, Debug)]
pub struct LayerCache {
    pub device: usize,
    pub k_offset: usize,
    pub v_offset: usize,
    pub n_embd_k: usize,
    pub n_embd_v: usize,
    /// V is not stored: it is the first `n_embd_v` values of each K row.
    pub v_in_k: bool,
}

/// The types and V layout of a cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvFormat {
    pub type_k: DType,
    pub type_v: DType,
    /// V stored transposed (the standard attention path) rather than as rows (flash
    /// attention).
    pub v_trans: bool,
}

impl KvFormat {
    /// Whether `t` can be a cache type: f32, f16, bf16 and the quantized types ggml's CPU
    /// flash attention reads (llama.cpp's `-ctk` / `-ctv` list).
    pub fn type_allowed(t: DType) -> bool {
        use DType::*;
        matches!(
            t,
            F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | IQ4_NL
        )
    }
}

#[derive(Debug)]
pub struct KvCache {
    /// Per device: the buffer holding the layers on that device (`None` if none are).
    buffers: Vec<Option<Buffer>>,
    format: KvFormat,
    size: usize,
    layers: Vec<LayerCache>,
    cells: Vec<Cell>,
    /// Per cell, how far its position has moved since its K was last rotated (llama.cpp's
    /// `shift`): [`KvCache::seq_add`] moves positions at once, the K rows follow in one pass
    /// over the cache before the next compute.
    shifts: Vec<i32>,
    has_shift: bool,
    /// Cells per stream: the whole cache when unified, else `size / n_seq` (llama.cpp's
    /// `n_ctx_seq`), and sequence `s` keeps its tokens in stream `s`'s cells. See
    /// [`KvCache::with_streams`].
    stream_size: usize,
    n_stream: usize,
    /// Per stream, and last for the whole cache, where the next free-cell search of one
    /// [`KvCache::place_into`] goes on (kept so that placing allocates nothing).
    cursors: Vec<usize>,
}

impl KvCache {
    /// A zeroed cache of `size` cells in `format` whose layer `il` lives on
    /// `devices[layer_device[il]]`.
    pub fn new(
        devices: &[Arc<dyn Device>],
        layer_device: &[usize],
        hp: &HParams,
        size: usize,
        format: KvFormat,
    ) -> Result<KvCache, ModelError> {
        if layer_device.len() != hp.n_layer as usize
            || layer_device.iter().any(|&d| d >= devices.len())
        {
            return Err(ModelError::Placement(
                "the KV cache needs a device for every layer".into(),
            ));
        }
        for (what, t) in [("K", format.type_k), ("V", format.type_v)] {
            if !KvFormat::type_allowed(t) {
                return Err(ModelError::BadParams(format!(
                    "{what} cache type {t} is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, \
                     q5_0, q5_1, iq4_nl)"
                )));
            }
        }
        if format.v_trans && format.type_v.is_quantized() {
            return Err(ModelError::BadParams(format!(
                "a quantized V cache ({}) needs flash attention",
                format.type_v
            )));
        }
        if size == 0 {
            return Err(ModelError::BadBatch(
                "the context size must be positive".into(),
            ));
        }
        let align = |x: usize| x.next_multiple_of(64);
        let mut layers = Vec::with_capacity(hp.n_layer as usize);
        let mut ends = vec![0usize; devices.len()];
        for (il, &device) in layer_device.iter().enumerate() {
            let n_embd_k = hp.n_embd_k_gqa(il) as usize;
            let n_embd_v = hp.n_embd_v_gqa(il) as usize;
            if hp.v_in_k && n_embd_v > n_embd_k {
                return Err(ModelError::BadBatch(format!(
                    "layer {il}: V ({n_embd_v}) cannot be a view of a narrower K ({n_embd_k})"
                )));
            }
            let stored_v = if hp.v_in_k { 0 } else { n_embd_v };
            // Rows of a quantized type must be whole blocks (per head, for the views).
            for (what, t, head) in [
                ("K", format.type_k, hp.n_embd_head_k),
                ("V", format.type_v, hp.n_embd_head_v),
            ] {
                if !(head as u64).is_multiple_of(t.block_size()) {
                    return Err(ModelError::BadParams(format!(
                        "{what} cache type {t} with block size {} does not divide the head \
                         size {head}",
                        t.block_size()
                    )));
                }
            }
            let bytes = |t: DType, n: usize| {
                t.row_size(n as u64)
                    .ok()
                    .and_then(|r| (r as usize).checked_mul(size))
                    .ok_or_else(|| ModelError::BadBatch("the KV cache is too large".into()))
            };
            let k_offset = ends[device];
            let v_offset = align(k_offset + bytes(format.type_k, n_embd_k)?);
            ends[device] = align(v_offset + bytes(format.type_v, stored_v)?);
            layers.push(LayerCache {
                device,
                k_offset,
                v_offset,
                n_embd_k,
                n_embd_v,
                v_in_k: hp.v_in_k,
            });
        }
        for (device, &end) in devices.iter().zip(&ends) {
            let free = device.memory().free;
            if free > 0 && end as u64 > free {
                return Err(ModelError::OutOfMemory {
                    what: format!("KV cache of {size} cells"),
                    device: device.name().to_string(),
                    need: end as u64,
                    free,
                    hint: " (lower -c, or quantize the cache: -ctk q8_0 -ctv q8_0)",
                });
            }
        }
        let mut buffers = Vec::with_capacity(devices.len());
        for (device, &end) in devices.iter().zip(&ends) {
            buffers.push(if end > 0 {
                Some(device.buffer_type().alloc_buffer(end)?)
            } else {
                None
            });
        }
        Ok(KvCache {
            buffers,
            format,
            size,
            layers,
            cells: vec![Cell::FREE; size],
            shifts: vec![0; size],
            has_shift: false,
            stream_size: size,
            n_stream: 1,
            cursors: vec![0; 2],
        })
    }

    /// The cache buffer of device `device` (if any layer is there).
    pub fn buffer(&self, device: usize) -> Option<&Buffer> {
        self.buffers.get(device)?.as_ref()
    }

    pub fn format(&self) -> KvFormat {
        self.format
    }

    /// Number of cells.
    pub fn size(&self) -> usize {
        self.size
    }

    pub fn layer(&self, il: usize) -> LayerCache {
        self.layers[il]
    }

    pub fn cells(&self) -> &[Cell] {
        &self.cells
    }

    /// The cache cut into `n_stream` equal streams, llama.cpp's non-unified cache (its
    /// default with several sequences): sequence `s` keeps its tokens in stream `s`, and
    /// attention over a micro-batch of one sequence looks at that stream's cells alone, from
    /// its first cell, so a sequence computes the same in every stream (on one shared run of
    /// cells, where its tokens land would decide how the kernels group their sums). A
    /// stream's size must be a multiple of 256 (llama.cpp's padding).
    pub fn with_streams(mut self, n_stream: usize) -> Result<KvCache, ModelError> {
        if n_stream == 1 {
            self.stream_size = self.size;
            self.n_stream = 1;
            self.cursors = vec![0; 2];
            return Ok(self);
        }
        if n_stream == 0
            || !self.size.is_multiple_of(n_stream)
            || !(self.size / n_stream).is_multiple_of(256)
        {
            return Err(ModelError::BadParams(format!(
                "{} cells cannot be cut into {n_stream} streams of a multiple of 256 cells",
                self.size
            )));
        }
        self.stream_size = self.size / n_stream;
        self.n_stream = n_stream;
        self.cursors = vec![0; n_stream + 1];
        Ok(self)
    }

    /// Number of streams (1: unified).
    pub fn n_stream(&self) -> usize {
        self.n_stream
    }

    /// The stream sequence `seq` lives in; `None` for the whole cache: a unified cache, or a
    /// sequence beyond the streams (the context's scratch sequence for embeddings, which
    /// takes free cells anywhere for the time of one call).
    fn stream_of(&self, seq: usize) -> Option<usize> {
        (self.n_stream > 1 && seq < self.n_stream).then_some(seq)
    }

    /// The cells sequence `seq` may take.
    pub fn stream_cells(&self, seq: usize) -> Range<usize> {
        match self.stream_of(seq) {
            Some(s) => s * self.stream_size..(s + 1) * self.stream_size,
            None => 0..self.size,
        }
    }

    /// The cells attention over tokens of `seqs` looks at: from the first cell of their first
    /// stream up to the last used cell of their last, each stream's part padded to 256 cells
    /// as llama.cpp's `get_n_kv` pads it (the padding is masked out, but it decides which
    /// kernels run and how their sums are grouped). Returns `(first cell, cell count)`.
    pub fn attention_span(&self, seqs: impl Iterator<Item = usize>) -> (usize, usize) {
        let (mut lo, mut hi) = (usize::MAX, 0);
        // Streams seen, and last the whole cache (bit 63: MAX_SEQUENCES is 64).
        let mut seen = 0u64;
        for seq in seqs {
            let key = self.stream_of(seq).unwrap_or(63);
            if seen & (1 << key) != 0 {
                continue;
            }
            seen |= 1 << key;
            let r = self.stream_cells(seq);
            let used = self.cells[r.clone()]
                .iter()
                .rposition(|c| !c.is_free())
                .map_or(0, |i| i + 1);
            let n = r.len().min(used.next_multiple_of(256).max(256));
            lo = lo.min(r.start);
            hi = hi.max(r.start + n);
        }
        if lo == usize::MAX {
            return (0, self.stream_size.min(256));
        }
        (lo, hi - lo)
    }

    /// Cells in use.
    pub fn used(&self) -> usize {
        self.cells.iter().filter(|c| !c.is_free()).count()
    }

    /// Claims a free cell for each `(pos, seq)` token, lowest cells of its sequence's stream
    /// first; nothing is claimed if they do not all fit.
    pub fn place(&mut self, tokens: &[(i32, usize)]) -> Result<Vec<usize>, ModelError> {
        let mut cells = Vec::with_capacity(tokens.len());
        self.place_into(tokens, &mut cells)?;
        Ok(cells)
    }

    /// [`KvCache::place`], appending the cells to `out` (left as it was on error).
    pub fn place_into(
        &mut self,
        tokens: &[(i32, usize)],
        out: &mut Vec<usize>,
    ) -> Result<(), ModelError> {
        let start = out.len();
        for s in 0..self.n_stream {
            self.cursors[s] = s * self.stream_size;
        }
        self.cursors[self.n_stream] = 0;
        // Each search moves forward from where its last one stopped; a cell is claimed as it
        // is found, and all are given back if one token finds none.
        for &(pos, seq) in tokens {
            let r = self.stream_cells(seq);
            let key = self.stream_of(seq).unwrap_or(self.n_stream);
            let found = (self.cursors[key].max(r.start)..r.end).find(|&i| self.cells[i].is_free());
            let Some(c) = found else {
                for &c in &out[start..] {
                    self.cells[c] = Cell::FREE;
                }
                out.truncate(start);
                let in_stream = |seq: usize| self.stream_cells(seq) == r;
                return Err(ModelError::ContextFull {
                    needed: tokens.iter().filter(|t| in_stream(t.1)).count(),
                    free: self.cells[r.clone()].iter().filter(|c| c.is_free()).count(),
                    size: r.len(),
                });
            };
            self.cursors[key] = c + 1;
            self.cells[c] = Cell {
                pos,
                seqs: 1 << seq,
            };
            out.push(c);
        }
        Ok(())
    }

    /// Frees the given cells (undoing a failed [`KvCache::place`]).
    pub fn release(&mut self, cells: &[usize]) {
        for &c in cells {
            self.cells[c] = Cell::FREE;
            self.shifts[c] = 0;
        }
    }

    /// Removes sequence `seq`'s tokens at positions `p0..p1` (`None` = unbounded); `seq` `None`
    /// means every sequence.
    pub fn seq_rm(&mut self, seq: Option<usize>, p0: Option<i32>, p1: Option<i32>) {
        let p0 = p0.unwrap_or(i32::MIN);
        let p1 = p1.unwrap_or(i32::MAX);
        for (cell, shift) in self.cells.iter_mut().zip(&mut self.shifts) {
            if cell.is_free() || cell.pos < p0 || cell.pos >= p1 {
                continue;
            }
            match seq {
                Some(s) => cell.seqs &= !(1u64 << s),
                None => cell.seqs = 0,
            }
            if cell.seqs == 0 {
                *cell = Cell::FREE;
                *shift = 0;
            }
        }
    }

    /// Moves sequence `seq`'s tokens at positions `p0..p1` by `delta` positions, as
    /// `llama_memory_seq_add`: the cells holding them move (for every sequence sharing them)
    /// and a cell moved below position 0 is freed. Their K rows are rotated to the new
    /// positions by the next compute (see [`KvCache::shifts`]).
    pub fn seq_add(&mut self, seq: usize, p0: i32, p1: i32, delta: i32) {
        if delta == 0 || p0 >= p1 {
            return;
        }
        for (cell, shift) in self.cells.iter_mut().zip(&mut self.shifts) {
            if cell.seqs & (1 << seq) == 0 || cell.pos < p0 || cell.pos >= p1 {
                continue;
            }
            self.has_shift = true;
            cell.pos = cell.pos.saturating_add(delta);
            *shift = shift.saturating_add(delta);
            if cell.pos < 0 {
                *cell = Cell::FREE;
                *shift = 0;
            }
        }
    }

    /// Whether some cell moved since its K was last rotated.
    pub fn has_shift(&self) -> bool {
        self.has_shift
    }

    /// Per cell, the positions it moved by since its K was last rotated (0 for the others).
    pub fn shifts(&self) -> &[i32] {
        &self.shifts
    }

    /// The K rows have been rotated: every cell is where its K says.
    pub fn reset_shift(&mut self) {
        self.shifts.fill(0);
        self.has_shift = false;
    }

    /// The cells of `seq` with their positions, in position order.
    fn seq_cells(&self, seq: usize) -> Vec<(usize, i32)> {
        let mut cells: Vec<(usize, i32)> = self
            .cells
            .iter()
            .enumerate()
            .filter(|(_, c)| c.seqs & (1 << seq) != 0)
            .map(|(i, c)| (i, c.pos))
            .collect();
        cells.sort_by_key(|&(_, pos)| pos);
        cells
    }

    /// Bytes per K row, per V row, and per V element of layer `l` (V rows are stored whole
    /// unless transposed, where each of a cell's values sits in its own row).
    fn row_bytes(&self, l: &LayerCache) -> Result<(usize, usize, usize), ModelError> {
        let bad = |_| ModelError::BadParams("the KV cache row size overflows".into());
        let k = self
            .format
            .type_k
            .row_size(l.n_embd_k as u64)
            .map_err(bad)? as usize;
        let v = self
            .format
            .type_v
            .row_size(l.n_embd_v as u64)
            .map_err(bad)? as usize;
        Ok((k, v, self.format.type_v.type_size() as usize))
    }

    /// Sequence `seq`'s cells as bytes (llama.cpp's `llama_state_seq_get_data`, in a format
    /// of Lamina's own): the positions, then per layer every cell's K row and V values. Call
    /// it with no computation in flight.
    pub fn seq_state(&self, seq: usize) -> Result<Vec<u8>, ModelError> {
        let cells = self.seq_cells(seq);
        let mut out = Vec::new();
        out.extend_from_slice(KV_STATE_MAGIC);
        out.extend_from_slice(&(self.layers.len() as u32).to_le_bytes());
        out.push(u8::from(self.format.v_trans));
        for l in &self.layers {
            let (k, v, e) = self.row_bytes(l)?;
            for x in [k, v, e, usize::from(l.v_in_k)] {
                out.extend_from_slice(&(x as u32).to_le_bytes());
            }
        }
        out.extend_from_slice(&(cells.len() as u32).to_le_bytes());
        for &(_, pos) in &cells {
            out.extend_from_slice(&pos.to_le_bytes());
        }
        for l in &self.layers {
            let (k, v, e) = self.row_bytes(l)?;
            let buf = self.buffer(l.device).ok_or_else(|| {
                ModelError::BadParams("the KV cache has no buffer for a layer".into())
            })?;
            let mut row = vec![0u8; k.max(v)];
            for &(c, _) in &cells {
                buf.read(l.k_offset + c * k, &mut row[..k])?;
                out.extend_from_slice(&row[..k]);
            }
            if l.v_in_k {
                continue;
            }
            for &(c, _) in &cells {
                if self.format.v_trans {
                    for d in 0..l.n_embd_v {
                        buf.read(l.v_offset + (d * self.size + c) * e, &mut row[..e])?;
                        out.extend_from_slice(&row[..e]);
                    }
                } else {
                    buf.read(l.v_offset + c * v, &mut row[..v])?;
                    out.extend_from_slice(&row[..v]);
                }
            }
        }
        Ok(out)
    }

    /// Puts a [`KvCache::seq_state`] back as sequence `seq` (its former cells are dropped);
    /// returns how many tokens it holds. The state must come from a cache of the same
    /// model and types.
    pub fn set_seq_state(&mut self, seq: usize, data: &[u8]) -> Result<usize, ModelError> {
        let bad = |m: &str| ModelError::BadBatch(format!("the saved KV state {m}"));
        let mut r = Reader { data, at: 0 };
        if r.take(KV_STATE_MAGIC.len())
            .ok_or_else(|| bad("is not one"))?
            != KV_STATE_MAGIC
        {
            return Err(bad("is not one"));
        }
        let n_layer = r.u32().ok_or_else(|| bad("is cut short"))? as usize;
        let v_trans = r.take(1).ok_or_else(|| bad("is cut short"))?[0] != 0;
        if n_layer != self.layers.len() || v_trans != self.format.v_trans {
            return Err(bad("is of another model or cache layout"));
        }
        for il in 0..n_layer {
            let l = self.layers[il];
            let (k, v, e) = self.row_bytes(&l)?;
            for want in [k, v, e, usize::from(l.v_in_k)] {
                if r.u32().ok_or_else(|| bad("is cut short"))? as usize != want {
                    return Err(bad("is of another model or cache type"));
                }
            }
        }
        let n = r.u32().ok_or_else(|| bad("is cut short"))? as usize;
        if n > self.size {
            return Err(bad("holds more tokens than the cache has cells"));
        }
        let mut positions = Vec::with_capacity(n);
        for _ in 0..n {
            let p = r.take(4).ok_or_else(|| bad("is cut short"))?;
            positions.push(i32::from_le_bytes([p[0], p[1], p[2], p[3]]));
        }
        // Everything is checked against the data before the cache changes.
        let mut need = 0usize;
        for l in &self.layers {
            let (k, v, e) = self.row_bytes(l)?;
            let per = k + if l.v_in_k {
                0
            } else if v_trans {
                e * l.n_embd_v
            } else {
                v
            };
            need = need.saturating_add(per.saturating_mul(n));
        }
        if data.len() - r.at != need {
            return Err(bad("has the wrong size"));
        }
        self.seq_rm(Some(seq), None, None);
        let tokens: Vec<(i32, usize)> = positions.iter().map(|&p| (p, seq)).collect();
        let cells = self.place(&tokens)?;
        for il in 0..self.layers.len() {
            let l = self.layers[il];
            let (k, v, e) = self.row_bytes(&l)?;
            let Some(buf) = self.buffer(l.device) else {
                self.release(&cells);
                return Err(bad("names a layer the cache does not have"));
            };
            let buf = buf.clone();
            for &c in &cells {
                buf.write(l.k_offset + c * k, r.take(k).unwrap_or_default())?;
            }
            if l.v_in_k {
                continue;
            }
            for &c in &cells {
                if v_trans {
                    for d in 0..l.n_embd_v {
                        buf.write(
                            l.v_offset + (d * self.size + c) * e,
                            r.take(e).unwrap_or_default(),
                        )?;
                    }
                } else {
                    buf.write(l.v_offset + c * v, r.take(v).unwrap_or_default())?;
                }
            }
        }
        Ok(n)
    }

    /// Empties the cache.
    pub fn clear(&mut self) {
        self.cells.fill(Cell::FREE);
        self.reset_shift();
    }

    /// Highest position held for `seq`, if any.
    pub fn seq_pos_max(&self, seq: usize) -> Option<i32> {
        self.cells
            .iter()
            .filter(|c| c.seqs & (1 << seq) != 0)
            .map(|c| c.pos)
            .max()
    }

    /// The attention mask for tokens `(pos, seq)` over the cells `span`, as llama.cpp
    /// builds it: 0 where the token may attend to the cell (same sequence, not in the future,
    /// and within the sliding window when `window` is set), -inf elsewhere. Written into `out`
    /// (its allocation reused) as the little-endian f32 bytes the graph input takes, so a
    /// prompt's mask is not held twice.
    pub fn mask_into(
        &self,
        tokens: &[(i32, usize)],
        span: Range<usize>,
        window: Option<u32>,
        out: &mut Vec<u8>,
    ) {
        out.clear();
        out.reserve(4 * span.len() * tokens.len());
        for &(pos, seq) in tokens {
            for cell in &self.cells[span.clone()] {
                let visible = cell.seqs & (1 << seq) != 0
                    && cell.pos <= pos
                    && window.is_none_or(|w| i64::from(pos) - i64::from(cell.pos) < i64::from(w));
                let m = if visible { 0.0f32 } else { f32::NEG_INFINITY };
                out.extend_from_slice(&m.to_le_bytes());
            }
        }
    }
}
