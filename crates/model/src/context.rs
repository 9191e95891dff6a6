//! The inference context: a KV cache (each layer's on its device), a scheduler over the model's
//! devices, and `decode`, which turns a batch of tokens into logits (llama.cpp's
//! `llama_context`).

use std::ops::Range;
use std::sync::Arc;

use lamina_backend::{PendingRead, ScheduledGraph, Scheduler};
use lamina_core::DType;
use lamina_core::graph::BufferMemory;
use lamina_core::graph::TensorId;

use crate::arch::inputs::{GraphInput, InputSource};
use crate::arch::{BuildContext, GraphShape, build_graph, build_shift_graph};
use crate::kv_cache::{KvCache, KvFormat, MAX_SEQUENCES};
use crate::observe::{MatmulObserver, Tap, gather_4byte, tap_graph, weight_names};
use crate::{Model, ModelError};

/// One token of a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchToken {
    pub token: u32,
    pub pos: i32,
    pub seq: usize,
    /// Whether logits are wanted for this token.
    pub logits: bool,
}

/// Tokens to decode together, possibly from several sequences (llama.cpp's `llama_batch`).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    pub tokens: Vec<BatchToken>,
}

impl Batch {
    /// `tokens` of sequence `seq` at positions `pos0..`, with logits for the last one only.
    pub fn sequence(tokens: &[u32], pos0: i32, seq: usize) -> Batch {
        let n = tokens.len();
        Batch {
            tokens: tokens
                .iter()
                .enumerate()
                .map(|(i, &token)| BatchToken {
                    token,
                    pos: pos0 + i as i32,
                    seq,
                    logits: i + 1 == n,
                })
                .collect(),
        }
    }

    /// Empties the batch, keeping its allocation (a generation loop reuses one batch).
    pub fn clear(&mut self) {
        self.tokens.clear();
    }

    pub fn push(&mut self, token: u32, pos: i32, seq: usize, logits: bool) {
        self.tokens.push(BatchToken {
            token,
            pos,
            seq,
            logits,
        });
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// Flash attention (llama.cpp's `-fa on|off|auto`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlashAttn {
    /// On where every device can run it (the CPU always can), as llama.cpp's default.
    #[default]
    Auto,
    On,
    Off,
}

impl std::str::FromStr for FlashAttn {
    type Err = ModelError;
    fn from_str(s: &str) -> Result<FlashAttn, ModelError> {
        match s.to_ascii_lowercase().as_str() {
            "auto" | "-1" => Ok(FlashAttn::Auto),
            "on" | "1" | "true" | "enabled" => Ok(FlashAttn::On),
            "off" | "0" | "false" | "disabled" => Ok(FlashAttn::Off),
            _ => Err(ModelError::BadParams(format!(
                "flash attention {s:?}: use on, off or auto"
            ))),
        }
    }
}

/// Context settings, named as in llama.cpp.
#[derive(Clone, Copy, Debug)]
pub struct ContextParams {
    /// KV cache size in tokens (`-c`); 0 means the model's training context.
    pub n_ctx: usize,
    /// Largest micro-batch computed at once (`-ub`).
    pub n_ubatch: usize,
    /// K cache element type (`-ctk`; f16 by default, as in llama.cpp).
    pub type_k: DType,
    /// V cache element type (`-ctv`; a quantized type needs flash attention).
    pub type_v: DType,
    /// Flash attention (`-fa`).
    pub flash_attn: FlashAttn,
    /// llama.cpp's `n_threads` (`-t`), which its flash attention uses to cut a one-token
    /// step's cells into chunks (and so its rounding); 0: this machine's thread count.
    pub n_threads: usize,
    /// Sequences the cache can hold (`-np`).
    pub n_seq_max: usize,
    /// All sequences share all cells (`-kvu`, llama.cpp's unified cache). When off, with
    /// several sequences, each has a stream of its own of `n_ctx / n_seq_max` cells (padded
    /// to 256, as llama.cpp does), and a sequence computes the same whichever stream it is
    /// in and whatever the others hold.
    pub kv_unified: bool,
    /// With several devices, keep several micro-batches in flight (pipeline parallelism);
    /// `false` waits for each micro-batch before the next.
    pub pipeline_parallel: bool,
}

impl Default for ContextParams {
    fn default() -> ContextParams {
        ContextParams {
            n_ctx: 4096,
            n_ubatch: 512,
            type_k: DType::F16,
            type_v: DType::F16,
            flash_attn: FlashAttn::Auto,
            n_threads: 0,
            n_seq_max: 1,
            kv_unified: true,
            pipeline_parallel: true,
        }
    }
}

pub struct Context {
    model: Arc<Model>,
    params: ContextParams,
    kv: KvCache,
    /// Per device of the model's plan, its cache buffer as graphs bind to it.
    kv_memory: Vec<Option<Arc<dyn BufferMemory>>>,
    sched: Scheduler,
    /// Logits of the last decode, one row of n_vocab per output.
    logits: Vec<f32>,
    /// For each token of the last batch, its row in `logits`.
    output_rows: Vec<Option<usize>>,
    /// Per copy slot of the scheduler, the last graph scheduled in it: run again, with new
    /// inputs, while micro-batches keep its shape (token generation: 256 steps, until the
    /// attended cells grow past the next multiple of 256), so that building, placing and
    /// allocating a graph is not repeated for every token.
    graphs: Vec<Option<CachedGraph>>,
    /// Graphs built and scheduled so far (the rest were reused).
    graph_builds: usize,
    /// The micro-batches of the batch being decoded.
    in_flight: Vec<InFlight>,
    /// The cells they claimed (`InFlight::cells` are ranges of it).
    cells: Vec<usize>,
    /// The output read of each micro-batch position, reused from batch to batch.
    reads: Vec<PendingRead>,
    /// Where micro-batch inputs are built.
    scratch: InputScratch,
    /// Shown the inputs of the products with weights it asks for (see [`crate::observe`]).
    observer: Option<Box<dyn MatmulObserver>>,
    /// The model's tensor names by file offset, made when an observer is first set.
    weight_names: Option<std::collections::HashMap<usize, String>>,
}

/// Buffers the inputs of a micro-batch are built in; kept with their allocations, so that
/// decoding a token allocates nothing once the first few tokens have sized them.
#[derive(Default)]
struct InputScratch {
    placement: Vec<(i32, usize)>,
    /// One input at a time, as the bytes the graph takes.
    bytes: Vec<u8>,
}

/// A scheduled graph kept for reuse.
struct CachedGraph {
    shape: GraphShape,
    sg: ScheduledGraph,
    inputs: Vec<GraphInput>,
    logits: TensorId,
    /// Built while an observer was set; the products it asked for.
    observed: bool,
    taps: Vec<Tap>,
}

impl Context {
    pub fn new(model: Arc<Model>, mut params: ContextParams) -> Result<Context, ModelError> {
        if params.n_ctx == 0 {
            params.n_ctx = model.hparams.n_ctx_train as usize;
        }
        if params.n_ubatch == 0 || params.n_seq_max == 0 || params.n_seq_max > MAX_SEQUENCES {
            return Err(ModelError::BadBatch(format!(
                "micro-batch size must be positive and sequences between 1 and {MAX_SEQUENCES}"
            )));
        }
        let n_stream = if params.kv_unified {
            1
        } else {
            params.n_seq_max
        };
        if n_stream > 1 {
            // llama.cpp's sizes: each stream's cells (`n_ctx_seq`) padded to 256.
            let n_ctx_seq = (params.n_ctx.next_multiple_of(256) / n_stream).next_multiple_of(256);
            if n_ctx_seq == 0 {
                return Err(ModelError::BadParams(format!(
                    "a context of {} cells is too small for {n_stream} sequences",
                    params.n_ctx
                )));
            }
            params.n_ctx = n_ctx_seq * n_stream;
        }
        params.n_ubatch = params.n_ubatch.min(params.n_ctx);
        // As llama.cpp: auto is on (every CPU device runs flash attention); a quantized V
        // cache turns auto on and refuses off.
        let flash_attn = match params.flash_attn {
            FlashAttn::Off if params.type_v.is_quantized() => {
                return Err(ModelError::BadParams(format!(
                    "a quantized V cache ({}) requires flash attention (-fa on or auto)",
                    params.type_v
                )));
            }
            FlashAttn::Off => false,
            FlashAttn::On | FlashAttn::Auto => true,
        };
        params.flash_attn = if flash_attn {
            FlashAttn::On
        } else {
            FlashAttn::Off
        };
        if params.n_threads == 0 {
            params.n_threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        }
        let plan = model.plan();
        let format = KvFormat {
            type_k: params.type_k,
            type_v: params.type_v,
            v_trans: !flash_attn,
        };
        let kv = KvCache::new(
            &plan.devices,
            &plan.layers,
            &model.hparams,
            params.n_ctx,
            format,
        )?
        .with_streams(n_stream)?;
        let sched = Scheduler::new(plan.devices.clone(), params.pipeline_parallel)?;
        let mut ctx = Context {
            kv_memory: (0..plan.devices.len())
                .map(|d| kv.buffer(d).map(|b| b.memory()))
                .collect(),
            sched,
            model,
            params,
            kv,
            logits: Vec::new(),
            output_rows: Vec::new(),
            graphs: Vec::new(),
            graph_builds: 0,
            in_flight: Vec::new(),
            cells: Vec::new(),
            reads: Vec::new(),
            scratch: InputScratch::default(),
            observer: None,
            weight_names: None,
        };
        // Size the compute buffer once for the worst case: a full micro-batch over the whole cache.
        let worst = GraphShape {
            n_tokens: params.n_ubatch,
            kv_start: 0,
            n_kv: params.n_ctx,
            n_outputs: params.n_ubatch,
            embeddings: false,
        };
        let built = build_graph(&ctx.build_context(), worst)?;
        ctx.sched.reserve(built.graph, &built.hints)?;
        ctx.graphs = (0..ctx.sched.n_slots()).map(|_| None).collect();
        Ok(ctx)
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn params(&self) -> ContextParams {
        self.params
    }

    pub fn n_ctx(&self) -> usize {
        self.params.n_ctx
    }

    pub fn kv_cache(&self) -> &KvCache {
        &self.kv
    }

    /// The scheduler running this context's graphs.
    /// How many micro-batch graphs this context has built and scheduled; a micro-batch with
    /// the shape of the last one in its copy slot reuses that graph instead.
    pub fn graph_builds(&self) -> usize {
        self.graph_builds
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.sched
    }

    /// Sets (or with `None` removes) the observer of the products with model weights, ggml's
    /// eval callback (see [`crate::observe`]); returns the previous one. Graphs built without
    /// the new setting are rebuilt.
    pub fn set_matmul_observer(
        &mut self,
        observer: Option<Box<dyn MatmulObserver>>,
    ) -> Option<Box<dyn MatmulObserver>> {
        for g in &mut self.graphs {
            *g = None;
        }
        std::mem::replace(&mut self.observer, observer)
    }

    fn build_context(&self) -> BuildContext<'_> {
        BuildContext {
            arch: self.model.arch.as_ref(),
            weights: self.model.weights(),
            plan: self.model.plan(),
            kv: &self.kv,
            kv_memory: &self.kv_memory,
            flash_attn: self.params.flash_attn == FlashAttn::On,
            n_threads: u32::try_from(self.params.n_threads).unwrap_or(u32::MAX),
        }
    }

    /// Removes sequence `seq`'s cached tokens at positions `p0..p1` (`None` = all sequences /
    /// unbounded), as `llama_memory_seq_rm`.
    pub fn seq_rm(&mut self, seq: Option<usize>, p0: Option<i32>, p1: Option<i32>) {
        self.kv.seq_rm(seq, p0, p1);
    }

    /// Moves sequence `seq`'s cached tokens at positions `p0..p1` (`None` = unbounded) by
    /// `delta` positions, as `llama_memory_seq_add`; tokens moved below 0 are dropped. The
    /// keys of the moved tokens are rotated to their new positions before the next compute
    /// (llama.cpp's K-shift), so a shifted sequence goes on as if it had been computed there:
    /// what context shift and cache reuse are made of.
    pub fn seq_add(
        &mut self,
        seq: usize,
        p0: Option<i32>,
        p1: Option<i32>,
        delta: i32,
    ) -> Result<(), ModelError> {
        if seq >= self.params.n_seq_max {
            return Err(ModelError::BadBatch(format!(
                "sequence id {seq} is not below the context's {} sequences",
                self.params.n_seq_max
            )));
        }
        self.kv
            .seq_add(seq, p0.unwrap_or(0).max(0), p1.unwrap_or(i32::MAX), delta);
        Ok(())
    }

    /// Rotates the cached keys of cells whose positions moved (the pending K-shift).
    fn apply_k_shift(&mut self) -> Result<(), ModelError> {
        if !self.kv.has_shift() {
            return Ok(());
        }
        self.sched.synchronize()?;
        let built = build_shift_graph(&self.build_context())?;
        let sg = self.sched.schedule(built.graph, &built.hints)?;
        let all_cells: Vec<usize> = (0..self.kv.size()).collect();
        let src = InputSource {
            ubatch: &[],
            placement: &[],
            cells: &all_cells,
            kv: &self.kv,
            kv_start: 0,
            n_kv: self.kv.size(),
        };
        let mut scratch = Vec::new();
        for input in &built.inputs {
            let id = input.id;
            let sched = &self.sched;
            let sg = &sg;
            let mut write = |offset: usize, bytes: &[u8]| -> Result<(), ModelError> {
                Ok(sched.set_input_at(sg, id, offset, bytes)?)
            };
            input.fill.fill(&src, &mut scratch, &mut write)?;
        }
        self.sched.compute_async(&sg)?;
        self.sched.synchronize()?;
        self.kv.reset_shift();
        Ok(())
    }

    /// Sequence `seq`'s KV cells as bytes (for slot save and prompt caches).
    pub fn seq_state(&mut self, seq: usize) -> Result<Vec<u8>, ModelError> {
        self.sched.synchronize()?;
        self.apply_k_shift()?;
        self.kv.seq_state(seq)
    }

    /// Puts a [`Context::seq_state`] back as sequence `seq`; returns its token count.
    pub fn set_seq_state(&mut self, seq: usize, data: &[u8]) -> Result<usize, ModelError> {
        self.sched.synchronize()?;
        self.kv.set_seq_state(seq, data)
    }

    /// Empties the KV cache.
    pub fn clear(&mut self) {
        self.kv.clear();
    }

    /// Runs the model on `batch`; afterwards [`Context::logits`] holds the logits of every token
    /// that asked for them. Micro-batches of at most `n_ubatch` tokens are computed in order.
    pub fn decode(&mut self, batch: &Batch) -> Result<(), ModelError> {
        let n_vocab = self.model.hparams.n_vocab as usize;
        if batch.is_empty() {
            return Err(ModelError::BadBatch("empty batch".into()));
        }
        for t in &batch.tokens {
            if t.token as usize >= n_vocab {
                return Err(ModelError::BadBatch(format!(
                    "token id {} is outside the vocabulary of {n_vocab}",
                    t.token
                )));
            }
            if t.seq >= self.params.n_seq_max {
                return Err(ModelError::BadBatch(format!(
                    "sequence id {} is not below the context's {} sequences",
                    t.seq, self.params.n_seq_max
                )));
            }
            if t.pos < 0 {
                return Err(ModelError::BadBatch(format!("negative position {}", t.pos)));
            }
        }
        self.apply_k_shift()?;
        if batch.len() > self.params.n_ctx - self.kv.used() {
            return Err(ModelError::ContextFull {
                needed: batch.len(),
                free: self.params.n_ctx - self.kv.used(),
                size: self.params.n_ctx,
            });
        }

        let n_outputs = batch.tokens.iter().filter(|t| t.logits).count();
        self.logits.clear();
        self.logits.reserve(n_outputs * n_vocab);
        self.output_rows.clear();
        let mut next_row = 0;
        for t in &batch.tokens {
            self.output_rows.push(t.logits.then(|| {
                next_row += 1;
                next_row - 1
            }));
        }
        // Micro-batches are queued without waiting for their logits: with several devices the
        // scheduler pipelines them (micro-batch k+1 starts on the first device while k is on the
        // next). Host-side, each one's cells are claimed before the next is built, so its mask
        // sees them.
        let mut in_flight = std::mem::take(&mut self.in_flight);
        in_flight.clear();
        self.cells.clear();
        let mut result = Ok(());
        for (k, ubatch) in batch.tokens.chunks(self.params.n_ubatch).enumerate() {
            match self.submit_ubatch(ubatch, false, k) {
                Ok(f) => in_flight.push(f),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
            // Without pipeline parallelism (asked for, and granted: several devices), one
            // micro-batch at a time: the next one's inputs then go straight into the idle
            // device instead of into staging copies that would pile up behind a long prompt.
            // With it, at most one micro-batch per copy slot is in flight.
            let in_flight_max = self.sched.n_slots();
            let r = if !self.params.pipeline_parallel || !self.sched.pipeline_parallel() {
                self.sched.synchronize().map_err(ModelError::from)
            } else if let Some(f) = in_flight
                .len()
                .checked_sub(in_flight_max)
                .and_then(|i| in_flight.get(i))
            {
                f.pending.wait_ready().map_err(ModelError::from)
            } else {
                Ok(())
            };
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
        let result = result.and_then(|()| self.sched.synchronize().map_err(ModelError::from));
        // Straight into `self.logits`, whose allocation is kept from batch to batch.
        let result = result.and_then(|()| {
            for f in &in_flight {
                f.finish_into(self.model.hparams.n_vocab as usize, &mut self.logits)?;
            }
            Ok(())
        });
        if let Err(e) = result {
            self.logits.clear();
            // What was queued may have half-run: forget all of this batch's cells.
            let _ = self.sched.synchronize();
            for f in &in_flight {
                self.kv.release(&self.cells[f.cells.clone()]);
            }
            self.in_flight = in_flight;
            return Err(e);
        }
        self.in_flight = in_flight;
        Ok(())
    }

    /// Computes one micro-batch and waits for it; returns the wanted output rows (logits, or
    /// final-normed hidden states when `embeddings`), in batch order.
    fn decode_ubatch(
        &mut self,
        ubatch: &[BatchToken],
        embeddings: bool,
    ) -> Result<Vec<f32>, ModelError> {
        let hp = &self.model.hparams;
        let width = if embeddings { hp.n_embd } else { hp.n_vocab } as usize;
        self.cells.clear();
        let f = self.submit_ubatch(ubatch, embeddings, 0)?;
        let r = self
            .sched
            .synchronize()
            .map_err(ModelError::from)
            .and_then(|()| f.finish(width));
        if r.is_err() {
            self.kv.release(&self.cells[f.cells]);
        }
        r
    }

    /// Claims cells for one micro-batch (appended to `self.cells`), builds and schedules its
    /// graph, writes its inputs and queues it, reading its output into the `k`-th kept read;
    /// the result is read when the devices are done.
    fn submit_ubatch(
        &mut self,
        ubatch: &[BatchToken],
        embeddings: bool,
        k: usize,
    ) -> Result<InFlight, ModelError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.placement.clear();
        scratch
            .placement
            .extend(ubatch.iter().map(|t| (t.pos, t.seq)));
        let start = self.cells.len();
        let r = self
            .kv
            .place_into(&scratch.placement, &mut self.cells)
            .and_then(|()| {
                let cells = start..self.cells.len();
                let pending = self.queue_ubatch(ubatch, &mut scratch, cells.clone(), embeddings, k);
                if pending.is_err() {
                    self.kv.release(&self.cells[cells.clone()]);
                    self.cells.truncate(start);
                }
                Ok(InFlight {
                    pending: pending?,
                    wanted: ubatch.iter().filter(|t| t.logits).count(),
                    cells,
                })
            });
        self.scratch = scratch;
        r
    }

    fn queue_ubatch(
        &mut self,
        ubatch: &[BatchToken],
        scratch: &mut InputScratch,
        cells: Range<usize>,
        embeddings: bool,
        k: usize,
    ) -> Result<PendingRead, ModelError> {
        let n_tokens = ubatch.len();
        // Attend over the used cells of the micro-batch's streams, padded to 256 as llama.cpp
        // pads them: matching llama.cpp bit for bit needs the same span.
        let (kv_start, n_kv) = self.kv.attention_span(ubatch.iter().map(|t| t.seq));
        let n_wanted = ubatch.iter().filter(|t| t.logits).count();
        // A micro-batch that wants no logits still runs (to fill the cache); it computes one row.
        let n_outputs = n_wanted.max(1);
        let shape = GraphShape {
            n_tokens,
            kv_start,
            n_kv,
            n_outputs,
            embeddings,
        };
        let slot = self.sched.next_slot();
        let observed = self.observer.is_some();
        match &self.graphs[slot] {
            Some(c) if c.shape == shape && c.observed == observed => {
                self.sched.reuse_slot(&c.sg)?
            }
            _ => {
                let mut built = build_graph(&self.build_context(), shape)?;
                let taps = match self.observer.as_mut() {
                    Some(obs) => {
                        let model = &self.model;
                        let names = self
                            .weight_names
                            .get_or_insert_with(|| weight_names(model.file.gguf()));
                        let weights = model.weights();
                        let file_offset = |memory: u64, offset: usize| {
                            weights.iter().find_map(|w| w.file_offset(memory, offset))
                        };
                        tap_graph(&mut built.graph, names, &file_offset, obs.as_mut())
                    }
                    None => Vec::new(),
                };
                let sg = self.sched.schedule(built.graph, &built.hints)?;
                self.graph_builds += 1;
                self.graphs[slot] = Some(CachedGraph {
                    shape,
                    sg,
                    inputs: built.inputs,
                    logits: built.logits,
                    observed,
                    taps,
                });
            }
        }
        let cached = self.graphs[slot].as_ref().expect("cached above");
        let sg = &cached.sg;
        let sched = &self.sched;
        let src = InputSource {
            ubatch,
            placement: &scratch.placement,
            cells: &self.cells[cells],
            kv: &self.kv,
            kv_start,
            n_kv,
        };
        for input in &cached.inputs {
            let id = input.id;
            let mut write = |offset: usize, bytes: &[u8]| -> Result<(), ModelError> {
                Ok(sched.set_input_at(sg, id, offset, bytes)?)
            };
            input.fill.fill(&src, &mut scratch.bytes, &mut write)?;
        }
        sched.compute_async(sg)?;
        if self.reads.len() <= k {
            self.reads.resize_with(k + 1, PendingRead::new);
        }
        sched.get_async_into(sg, cached.logits, &self.reads[k])?;
        if let (false, Some(obs)) = (cached.taps.is_empty(), self.observer.as_mut()) {
            // ggml's `ask == false` calls: after the micro-batch ran, each wanted input.
            sched.synchronize()?;
            for tap in &cached.taps {
                let read = |id: TensorId| -> Result<Vec<[u8; 4]>, ModelError> {
                    let bytes = sched.get_async(sg, id)?.wait()?;
                    let t = sg.graph().tensor(id);
                    gather_4byte(&bytes, t.ne(), t.nb()).ok_or_else(|| {
                        ModelError::BadParams(format!(
                            "cannot read the input of {} back: it is not 4-byte elements within its span",
                            tap.info.weight
                        ))
                    })
                };
                let input: Vec<f32> = read(tap.input)?
                    .into_iter()
                    .map(f32::from_le_bytes)
                    .collect();
                let ids: Option<Vec<i32>> = tap
                    .ids
                    .map(|i| read(i).map(|v| v.into_iter().map(i32::from_le_bytes).collect()))
                    .transpose()?;
                obs.collect(&tap.info, &input, ids.as_deref());
            }
        }
        Ok(self.reads[k].clone())
    }

    /// The mean over `tokens` of the model's final-normed hidden states, L2-normalised (what
    /// llama-server returns for mean pooling). Runs in a sequence of its own that is removed
    /// afterwards, so no other sequence's cache is touched.
    pub fn embed(&mut self, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let rows = self.embed_rows(tokens)?;
        let n_embd = self.model.hparams.n_embd as usize;
        let mut sum = vec![0f64; n_embd];
        for row in &rows {
            sum.iter_mut()
                .zip(row)
                .for_each(|(s, &v)| *s += f64::from(v));
        }
        let mean: Vec<f64> = sum.iter().map(|s| s / tokens.len() as f64).collect();
        let norm = mean.iter().map(|v| v * v).sum::<f64>().sqrt();
        Ok(mean
            .iter()
            .map(|v| if norm > 0.0 { (v / norm) as f32 } else { 0.0 })
            .collect())
    }

    /// The model's final-normed hidden state of every one of `tokens` (llama.cpp's
    /// embeddings with pooling `none`; the other poolings are taken from these rows), in a
    /// sequence of its own that is removed afterwards.
    pub fn embed_rows(&mut self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        const SCRATCH_SEQ: usize = MAX_SEQUENCES - 1;
        let hp = &self.model.hparams;
        let n_embd = hp.n_embd as usize;
        if tokens.is_empty() {
            return Err(ModelError::BadBatch("nothing to embed".into()));
        }
        if let Some(&t) = tokens.iter().find(|&&t| t >= hp.n_vocab) {
            return Err(ModelError::BadBatch(format!(
                "token id {t} is outside the vocabulary of {}",
                hp.n_vocab
            )));
        }
        if self.params.n_seq_max > SCRATCH_SEQ {
            return Err(ModelError::BadBatch(
                "no sequence is free for embeddings".into(),
            ));
        }
        let batch: Vec<BatchToken> = tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchToken {
                token,
                pos: i as i32,
                seq: SCRATCH_SEQ,
                logits: true,
            })
            .collect();
        self.apply_k_shift()?;
        let mut out = Vec::with_capacity(tokens.len());
        let mut result = Ok(());
        for ubatch in batch.chunks(self.params.n_ubatch) {
            match self.decode_ubatch(ubatch, true) {
                Ok(rows) => out.extend(rows.chunks_exact(n_embd).map(<[f32]>::to_vec)),
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        self.kv.seq_rm(Some(SCRATCH_SEQ), None, None);
        result?;
        Ok(out)
    }

    /// Logits of the `i`-th token of the last batch, if it asked for them.
    pub fn logits(&self, i: usize) -> Option<&[f32]> {
        let n_vocab = self.model.hparams.n_vocab as usize;
        let row = (*self.output_rows.get(i)?)?;
        self.logits.get(row * n_vocab..(row + 1) * n_vocab)
    }

    /// The `row`-th row of logits of the last batch (rows in batch order of the tokens that
    /// asked for logits).
    pub fn output_logits(&self, row: usize) -> Option<&[f32]> {
        let n_vocab = self.model.hparams.n_vocab as usize;
        self.logits.get(row * n_vocab..(row + 1) * n_vocab)
    }

    /// Logits of the last token of the last batch that asked for them.
    pub fn last_logits(&self) -> Option<&[f32]> {
        let i = self.output_rows.iter().rposition(Option::is_some)?;
        self.logits(i)
    }
}

/// A queued micro-batch: the read of its output and the cells it claimed.
struct InFlight {
    pending: PendingRead,
    /// Rows of output wanted (the graph computes at least one).
    wanted: usize,
    /// Its cells, as a range of `Context::cells`.
    cells: Range<usize>,
}

impl InFlight {
    /// The wanted rows of width `width`, once the devices are done.
    fn finish(&self, width: usize) -> Result<Vec<f32>, ModelError> {
        let mut rows = Vec::new();
        self.finish_into(width, &mut rows)?;
        Ok(rows)
    }

    /// [`InFlight::finish`], appended to `out`.
    fn finish_into(&self, width: usize, out: &mut Vec<f32>) -> Result<(), ModelError> {
        Ok(self.pending.wait_f32_into(out, self.wanted * width)?)
    }
}
