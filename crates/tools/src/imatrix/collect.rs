//! Computing an importance matrix: llama-imatrix's `IMatrixCollector` (what it keeps of every
//! product's input, when it saves) and `compute_imatrix` (which tokens are evaluated, in which
//! batches and micro-batches), over a Lamina [`Context`] with a [`MatmulObserver`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use lamina_model::observe::{MatmulInfo, MatmulKind, MatmulObserver};
use lamina_model::perplexity::{PerplexityStats, token_nll};
use lamina_model::{Batch, Context};

use super::{Imatrix, ImatrixEntry, ImatrixError};

/// One weight's running statistics (llama-imatrix's `Stats`): raw sums of squares, and rows
/// per matrix.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Stats {
    pub values: Vec<f32>,
    pub counts: Vec<i64>,
}

/// What the collector needs of llama-imatrix's parameters.
#[derive(Clone, Debug)]
pub struct CollectorParams {
    /// Tokens per chunk (`-c`; llama.cpp's `n_ctx / n_parallel`).
    pub chunk_size: usize,
    /// Also collect `output.weight` (`--process-output`).
    pub process_output: bool,
    /// Save the imatrix every this many chunks (`--output-frequency`, default 10).
    pub output_frequency: usize,
    /// Save a copy `<out>.at_<chunk>` every this many chunks (`--save-frequency`; 0: never).
    pub save_frequency: usize,
    /// Where saves go (`-o`, default `imatrix.gguf`).
    pub out_file: PathBuf,
    /// The text file, as given (`-f`): the dataset recorded in the file.
    pub prompt_file: Option<String>,
    /// Save in the legacy `.dat` format (`--output-format dat`) instead of GGUF.
    pub legacy_format: bool,
}

/// llama-imatrix's `IMatrixCollector`.
#[derive(Debug)]
pub struct Collector {
    params: CollectorParams,
    stats: BTreeMap<String, Stats>,
    datasets: Vec<String>,
    last_chunk: i32,
    /// The first failure inside a callback (llama.cpp exits there).
    error: Option<String>,
    /// Files saved so far (the periodic saves).
    saved: Vec<PathBuf>,
}

impl Collector {
    pub fn new(params: CollectorParams) -> Collector {
        Collector {
            params,
            stats: BTreeMap::new(),
            datasets: Vec::new(),
            last_chunk: 0,
            error: None,
            saved: Vec::new(),
        }
    }

    pub fn stats(&self) -> &BTreeMap<String, Stats> {
        &self.stats
    }

    /// Chunks counted so far (what `imatrix.chunk_count` records).
    pub fn last_chunk(&self) -> i32 {
        self.last_chunk
    }

    /// The first error a callback hit (inconsistent sizes, non-finite values, bad expert ids).
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// The periodic saves made so far.
    pub fn saved(&self) -> &[PathBuf] {
        &self.saved
    }

    fn chunk_size(&self) -> i64 {
        self.params.chunk_size.max(1) as i64
    }

    /// The ask half of `collect_imatrix`.
    pub fn wants(&self, info: &MatmulInfo) -> bool {
        match info.kind {
            MatmulKind::MulMatId => true,
            MatmulKind::MulMat => {
                info.input_ne[1] >= 16
                    && (info.weight.starts_with("blk.")
                        || (self.params.process_output && info.weight == "output.weight"))
            }
        }
    }

    /// The collect half of `collect_imatrix`: `x` is the input, contiguous.
    pub fn collect(&mut self, info: &MatmulInfo, x: &[f32], ids: Option<&[i32]>) {
        if self.error.is_some() {
            return;
        }
        if let Err(e) = self.collect_inner(info, x, ids) {
            self.error = Some(e);
        }
    }

    fn collect_inner(
        &mut self,
        info: &MatmulInfo,
        x: &[f32],
        ids: Option<&[i32]>,
    ) -> Result<(), String> {
        let chunk_size = self.chunk_size();
        let ne = info.input_ne;
        let ne0 = ne[0];
        if x.len() != ne.iter().product::<usize>() {
            return Err(format!("{}: input of the wrong size", info.weight));
        }
        let wname = info.weight.clone();
        let mut to_check: Vec<i64> = Vec::new();
        match info.kind {
            MatmulKind::MulMatId => {
                let ids = ids.ok_or_else(|| format!("{wname}: MUL_MAT_ID without ids"))?;
                let ids_ne = info.ids_ne.unwrap_or([0; 4]);
                let n_as = info.weight_ne[2];
                let n_ids = ids_ne[0];
                let n_tokens = ne[2];
                if ids_ne[1] != n_tokens || ids.len() != n_ids * n_tokens {
                    return Err(format!("{wname}: expert ids do not match the input"));
                }
                if ne[3] != 1 {
                    return Err(format!("tensor has more than 3 dimensions: {wname}"));
                }
                let e = self.stats.entry(wname.clone()).or_default();
                if e.counts.len() == 1 && n_as > 1 {
                    let c = e.counts[0];
                    e.counts.resize(n_as, c);
                }
                if e.values.is_empty() {
                    e.values.resize(ne0 * n_as, 0.0);
                    e.counts.resize(n_as, 0);
                } else if e.values.len() != ne0 * n_as {
                    return Err(format!(
                        "inconsistent size for {wname} ({} vs {})",
                        e.values.len(),
                        ne0 * n_as
                    ));
                } else if e.counts.len() != n_as {
                    return Err(format!(
                        "inconsistent expert count for {wname} ({} vs {n_as})",
                        e.counts.len()
                    ));
                }
                let mut touched = vec![false; n_as];
                for idx in 0..n_ids {
                    for row in 0..n_tokens {
                        let ex = ids[row * n_ids + idx];
                        if ex < 0 || ex as usize >= n_as {
                            return Err(format!("{wname}: expert id {ex} out of range"));
                        }
                        let ex = ex as usize;
                        let i11 = idx % ne[1];
                        let xr = &x[(row * ne[1] + i11) * ne0..][..ne0];
                        let acc = &mut e.values[ex * ne0..(ex + 1) * ne0];
                        e.counts[ex] += 1;
                        touched[ex] = true;
                        for (a, &v) in acc.iter_mut().zip(xr) {
                            *a += v * v;
                        }
                    }
                }
                for (ex, &t) in touched.iter().enumerate() {
                    if t && !e.values[ex * ne0..(ex + 1) * ne0]
                        .iter()
                        .all(|v| v.is_finite())
                    {
                        return Err(format!("non-finite values detected in {wname}"));
                    }
                }
                to_check.extend_from_slice(&e.counts);
            }
            MatmulKind::MulMat => {
                let (w2, w3) = (info.weight_ne[2].max(1), info.weight_ne[3].max(1));
                let n_mat = w2 * w3;
                let e = self.stats.entry(wname.clone()).or_default();
                if e.counts.len() > 1 && e.counts.iter().all(|&c| c == e.counts[0]) {
                    e.counts.truncate(1);
                }
                if e.values.is_empty() {
                    e.values.resize(ne0 * n_mat, 0.0);
                    e.counts.resize(1, 0);
                } else if e.values.len() != ne0 * n_mat {
                    return Err(format!(
                        "inconsistent size for {wname} ({} vs {})",
                        e.values.len(),
                        ne0 * n_mat
                    ));
                }
                for i3 in 0..ne[3] {
                    for i2 in 0..ne[2] {
                        let mat_id = (i3 % w3) * w2 + (i2 % w2);
                        let acc = &mut e.values[mat_id * ne0..(mat_id + 1) * ne0];
                        for row in 0..ne[1] {
                            let xr = &x[((i3 * ne[2] + i2) * ne[1] + row) * ne0..][..ne0];
                            for (a, &v) in acc.iter_mut().zip(xr) {
                                *a += v * v;
                            }
                        }
                    }
                }
                if !e.values.iter().all(|v| v.is_finite()) {
                    return Err(format!("non-finite values detected in {wname}"));
                }
                let nrows = (ne[1] * ne[2] * ne[3]) as i64;
                for c in &mut e.counts {
                    *c += nrows / n_mat as i64;
                }
                to_check.extend_from_slice(&e.counts);
            }
        }
        // As llama.cpp, after each count: a save whenever the chunk count passes a multiple of
        // the output (and save) frequency.
        for c in to_check {
            let n_chunk = (c / chunk_size) as i32;
            if n_chunk > self.last_chunk {
                let step = n_chunk - self.last_chunk;
                self.last_chunk = n_chunk;
                let out_freq = self.params.output_frequency.max(1) as i32;
                if (self.last_chunk % out_freq) / step == 0 {
                    self.save(None).map_err(|e| e.to_string())?;
                }
                let save_freq = self.params.save_frequency as i32;
                if save_freq > 0 && (self.last_chunk % save_freq) / step == 0 {
                    self.save(Some(self.last_chunk))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// The importance matrix as llama-imatrix's `save_imatrix` writes it.
    pub fn to_imatrix(&self) -> Imatrix {
        let mut datasets = self.datasets.clone();
        if let Some(p) = &self.params.prompt_file {
            datasets.push(p.clone());
        }
        Imatrix {
            entries: self
                .stats
                .iter()
                .map(|(name, s)| {
                    (
                        name.clone(),
                        ImatrixEntry {
                            sums: s.values.clone(),
                            counts: s.counts.iter().map(|&c| c as f32).collect(),
                        },
                    )
                })
                .collect(),
            datasets,
            chunk_count: self.last_chunk as u32,
            chunk_size: self.params.chunk_size as u32,
            is_legacy: false,
        }
    }

    /// The legacy `.dat` file llama-imatrix's `save_imatrix_legacy` writes: entries with some
    /// data, sorted, each `sum / count * ncall` with `ncall` its chunks rounded up (1.0 where an
    /// expert saw nothing), then the chunk count and the dataset.
    pub fn to_legacy_bytes(&self) -> Vec<u8> {
        let chunk_size = self.chunk_size();
        let stored: Vec<(&String, &Stats)> = self
            .stats
            .iter()
            .filter(|(_, s)| !s.counts.is_empty() && s.counts.iter().any(|&c| c != 0))
            .collect();
        let mut out = Vec::new();
        out.extend((stored.len() as i32).to_le_bytes());
        for (name, s) in stored {
            out.extend((name.len() as i32).to_le_bytes());
            out.extend(name.as_bytes());
            let max = s.counts.iter().copied().max().unwrap_or(0);
            let ncall = ((max + chunk_size - 1) / chunk_size) as i32;
            out.extend(ncall.to_le_bytes());
            let (nval, nmat) = (s.values.len(), s.counts.len());
            out.extend((nval as i32).to_le_bytes());
            if nval > 0 && nmat > 0 {
                let per = (nval / nmat).max(1);
                for (i, &v) in s.values.iter().enumerate() {
                    let mut count = s.counts.get(i / per).copied().unwrap_or(0) as f32;
                    let mut value = v;
                    if count == 0.0 {
                        value = 1.0;
                        count = 1.0;
                    }
                    out.extend(((value / count) * ncall as f32).to_le_bytes());
                }
            }
        }
        out.extend(self.last_chunk.to_le_bytes());
        let dataset = match &self.params.prompt_file {
            Some(p) if !p.is_empty() => p.as_str(),
            _ => self.datasets.last().map_or("", String::as_str),
        };
        out.extend((dataset.len() as i32).to_le_bytes());
        out.extend(dataset.as_bytes());
        out
    }

    /// Saves to the output file, or with `Some(n)` to `<out>.at_<n>`; returns the path.
    pub fn save(&mut self, n_chunk: Option<i32>) -> Result<PathBuf, ImatrixError> {
        let mut path = self.params.out_file.clone().into_os_string();
        if let Some(n) = n_chunk.filter(|&n| n > 0) {
            path.push(format!(".at_{n}"));
        }
        let path = PathBuf::from(path);
        if self.params.legacy_format {
            super::write_atomically(&path, &self.to_legacy_bytes())?;
        } else {
            self.to_imatrix().save(&path)?;
        }
        self.saved.push(path.clone());
        Ok(path)
    }

    /// llama-imatrix's `load_imatrix` (`--in-file`): adds a file's sums and counts, as raw
    /// values (a legacy file's pre-normalized ones times the chunk size).
    pub fn load(&mut self, path: &Path) -> Result<(), ImatrixError> {
        let loaded = Imatrix::load(path)?;
        let chunk_size = self.chunk_size();
        for (name, entry) in &loaded.entries {
            let e = self.stats.entry(name.clone()).or_default();
            let counts: Vec<i64> = entry.counts.iter().map(|&c| c.round() as i64).collect();
            if loaded.is_legacy {
                if e.values.is_empty() {
                    e.values.resize(entry.sums.len(), 0.0);
                    e.counts.resize(1, 0);
                }
                if e.values.len() != entry.sums.len() {
                    return Err(mismatch(path, name));
                }
                for (v, &s) in e.values.iter_mut().zip(&entry.sums) {
                    *v += s * chunk_size as f32;
                }
                let add = counts.first().copied().unwrap_or(0) * chunk_size;
                for c in &mut e.counts {
                    *c += add;
                }
            } else {
                if e.values.is_empty() {
                    e.values.resize(entry.sums.len(), 0.0);
                } else if e.values.len() != entry.sums.len() {
                    return Err(mismatch(path, name));
                }
                if e.counts.is_empty() {
                    e.counts.resize(counts.len(), 0);
                } else if e.counts.len() == 1 && counts.len() > 1 {
                    let c = e.counts[0];
                    e.counts.resize(counts.len(), c);
                } else if e.counts.len() != counts.len() {
                    return Err(mismatch(path, name));
                }
                for (v, &s) in e.values.iter_mut().zip(&entry.sums) {
                    *v += s;
                }
                for (c, &n) in e.counts.iter_mut().zip(&counts) {
                    *c += n;
                }
            }
        }
        self.datasets.extend(loaded.datasets.iter().cloned());
        let max_count = self
            .stats
            .values()
            .flat_map(|s| s.counts.iter().copied())
            .max()
            .unwrap_or(0)
            .max(0);
        self.last_chunk = (max_count / chunk_size) as i32;
        Ok(())
    }
}

fn mismatch(path: &Path, name: &str) -> ImatrixError {
    ImatrixError::Mismatched {
        path: path.display().to_string(),
        name: name.to_string(),
    }
}

/// A [`Collector`] shared between the caller and the context it observes.
#[derive(Clone, Debug)]
pub struct SharedCollector(pub Arc<Mutex<Collector>>);

impl SharedCollector {
    pub fn new(c: Collector) -> SharedCollector {
        SharedCollector(Arc::new(Mutex::new(c)))
    }

    pub fn lock(&self) -> MutexGuard<'_, Collector> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl MatmulObserver for SharedCollector {
    fn ask(&mut self, info: &MatmulInfo) -> bool {
        self.lock().wants(info)
    }

    fn collect(&mut self, info: &MatmulInfo, input: &[f32], ids: Option<&[i32]>) {
        self.lock().collect(info, input, ids);
    }
}

/// How llama-imatrix evaluates a text: its `main` and `compute_imatrix` settings.
#[derive(Clone, Copy, Debug)]
pub struct RunParams {
    /// Tokens per chunk (`-c`, default 512).
    pub n_ctx: usize,
    /// `-b` (default 2048): `max(1, n_batch / n_ctx)` chunks are evaluated together.
    pub n_batch: usize,
    /// `-ub` (default 512).
    pub n_ubatch: usize,
    /// `--chunks` (all when `None`).
    pub n_chunks: Option<usize>,
    /// `--chunk`: skip this many chunks of the text first.
    pub from_chunk: usize,
}

impl RunParams {
    /// Chunks evaluated together, as separate sequences (llama.cpp's `n_parallel`).
    pub fn n_seq(&self) -> usize {
        (self.n_batch / self.n_ctx.max(1)).max(1)
    }

    /// The context's cache size: `n_seq * n_ctx`.
    pub fn n_kv(&self) -> usize {
        self.n_seq() * self.n_ctx
    }

    /// `-b` as llama-imatrix caps it: at most the cache.
    pub fn batch(&self) -> usize {
        self.n_batch.min(self.n_kv())
    }

    /// `-ub` as llama.cpp caps it: at most the batch.
    pub fn ubatch(&self) -> usize {
        self.n_ubatch.min(self.batch()).max(1)
    }
}

/// One micro-batch as llama.cpp computes it: for each sequence (chunk of the group) the
/// positions `range` of that chunk, sequences one after the other.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MicroBatch {
    pub n_seqs: usize,
    pub range: std::ops::Range<usize>,
}

/// The micro-batches of one group of `n_seqs` chunks: `llama_decode` calls of `n_batch` tokens
/// per sequence, each cut by `split_simple` (one sequence) or `split_equal` (several: the same
/// count from every sequence, `n_ubatch / n_seqs` at most).
pub fn micro_batches(p: &RunParams, n_seqs: usize) -> Vec<MicroBatch> {
    let (n_ctx, n_batch, n_ubatch) = (p.n_ctx, p.batch(), p.ubatch());
    let num_batches = n_ctx.div_ceil(n_batch);
    let mut out = Vec::new();
    for j in 0..num_batches {
        let start = j * n_batch;
        let end = (start + n_batch).min(n_ctx);
        let per = if p.n_seq() == 1 {
            n_ubatch
        } else {
            (n_ubatch / n_seqs).max(1)
        };
        let mut s = start;
        while s < end {
            let e = (s + per).min(end);
            out.push(MicroBatch {
                n_seqs,
                range: s..e,
            });
            s = e;
        }
    }
    out
}

/// What [`compute_imatrix`] reports as it goes.
pub trait Progress {
    /// After the first group of chunks: seconds it took and the estimate for all.
    fn first_pass(&mut self, seconds: f32, n_chunk: usize, n_seq: usize) {
        let _ = (seconds, n_chunk, n_seq);
    }
    /// After each chunk, the running perplexity line entry (`[1]154.5982,`).
    fn chunk_done(&mut self, entry: &str) {
        let _ = entry;
    }
}

/// Discards the progress.
pub struct NoProgress;
impl Progress for NoProgress {}

/// Errors of [`compute_imatrix`].
#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    #[error("there will be not enough tokens left after removing {0} chunks")]
    FromChunk(usize),
    #[error(
        "you need at least {needed} tokens for a context of {n_ctx} tokens; the data file you provided tokenizes to only {have} tokens"
    )]
    TooFewTokens {
        needed: usize,
        n_ctx: usize,
        have: usize,
    },
    #[error("failed to eval: {0}")]
    Eval(#[from] lamina_model::ModelError),
    #[error("{0}")]
    Collect(String),
}

/// The result of [`compute_imatrix`].
#[derive(Debug)]
pub struct ComputeReport {
    pub n_chunk: usize,
    pub n_tokens: usize,
    /// llama-imatrix's `Final estimate: PPL = ...` line.
    pub final_line: String,
}

/// llama-imatrix's `compute_imatrix`: `tokens` is the text tokenized with BOS (when the model
/// adds one), `bos` the id put at the start of each chunk. The context must hold
/// [`RunParams::n_kv`] cells in [`RunParams::n_seq`] sequences; `collector` must be observing
/// it. Every token's logits are computed (llama.cpp asks for them all, so the last layer sees
/// every row) and score the perplexity of each chunk's second half.
pub fn compute_imatrix(
    ctx: &mut Context,
    tokens: &[u32],
    bos: Option<u32>,
    p: &RunParams,
    collector: &SharedCollector,
    progress: &mut dyn Progress,
) -> Result<ComputeReport, ComputeError> {
    let n_ctx = p.n_ctx;
    let mut tokens = tokens;
    if p.from_chunk > 0 {
        if (p.from_chunk + 2) * n_ctx >= tokens.len() {
            return Err(ComputeError::FromChunk(p.from_chunk));
        }
        tokens = &tokens[p.from_chunk * n_ctx..];
    }
    if tokens.len() < 2 * n_ctx {
        return Err(ComputeError::TooFewTokens {
            needed: 2 * n_ctx,
            n_ctx,
            have: tokens.len(),
        });
    }
    let n_chunk_max = tokens.len() / n_ctx;
    let n_chunk = p.n_chunks.map_or(n_chunk_max, |c| c.min(n_chunk_max));
    let n_seq = p.n_seq();
    let first = n_ctx / 2;
    let mut stats = PerplexityStats::new();
    let mut batch = Batch::default();
    let mut i = 0;
    while i < n_chunk {
        let t0 = std::time::Instant::now();
        let n_seqs = n_seq.min(n_chunk - i);
        ctx.clear();
        let mut nll: Vec<Vec<f64>> = vec![Vec::with_capacity(n_ctx); n_seqs];
        for mb in micro_batches(p, n_seqs) {
            batch.clear();
            for seq in 0..n_seqs {
                let chunk = &tokens[(i + seq) * n_ctx..(i + seq + 1) * n_ctx];
                for pos in mb.range.clone() {
                    let tok = match bos {
                        Some(b) if pos == 0 => b,
                        _ => chunk[pos],
                    };
                    batch.push(tok, pos as i32, seq, true);
                }
            }
            ctx.decode(&batch)?;
            if let Some(e) = collector.lock().error() {
                return Err(ComputeError::Collect(e.to_string()));
            }
            let mut row = 0;
            for (seq, nll_seq) in nll.iter_mut().enumerate() {
                let chunk = &tokens[(i + seq) * n_ctx..(i + seq + 1) * n_ctx];
                for pos in mb.range.clone() {
                    if pos >= first && pos + 1 < n_ctx {
                        let logits = ctx
                            .output_logits(row)
                            .ok_or_else(|| ComputeError::Collect("missing logits".into()))?;
                        let v = token_nll(logits, chunk[pos + 1])
                            .map_err(|e| ComputeError::Collect(e.to_string()))?;
                        nll_seq.push(v);
                    }
                    row += 1;
                }
            }
        }
        if i == 0 {
            progress.first_pass(t0.elapsed().as_secs_f32(), n_chunk, n_seq);
        }
        for (seq, v) in nll.into_iter().enumerate() {
            for x in v {
                stats.add_nll(x);
            }
            progress.chunk_done(&stats.chunk_entry(i + seq));
        }
        i += n_seq;
    }
    Ok(ComputeReport {
        n_chunk,
        n_tokens: tokens.len(),
        final_line: stats.final_line(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_batches_follow_llama_cpp() {
        let p = RunParams {
            n_ctx: 512,
            n_batch: 2048,
            n_ubatch: 512,
            n_chunks: None,
            from_chunk: 0,
        };
        assert_eq!(p.n_seq(), 4);
        // split_equal: 128 tokens of each of the 4 sequences per micro-batch.
        let mb = micro_batches(&p, 4);
        assert_eq!(mb.len(), 4);
        assert_eq!(mb[1].range, 128..256);
        // The last group of 2 chunks: 256 of each.
        assert_eq!(micro_batches(&p, 2).len(), 2);
        let p = RunParams {
            n_ctx: 1024,
            n_batch: 512,
            ..p
        };
        // One sequence, two llama_decode calls of 512.
        let mb = micro_batches(&p, 1);
        assert_eq!(
            mb.iter().map(|m| m.range.clone()).collect::<Vec<_>>(),
            vec![0..512, 512..1024]
        );
    }
}
