//! The model-independent half of `lamina perplexity`, ported from llama.cpp's
//! `tools/perplexity/perplexity.cpp` so that results and printed lines match it:
//!
//! - [`PerplexityPlan`]: how the tokenized text is cut into chunks of `n_ctx` tokens, which
//!   tokens are fed (BOS replacement), in which batches, and which logits rows score which
//!   target tokens (the second half of each chunk).
//! - [`token_nll`] / [`PerplexityStats`]: per-token negative log-likelihood with llama.cpp's
//!   float/double mix, the running `[1]56.1234,` estimates and the `Final estimate` line.
//! - [`LogitsFileWriter`] / [`LogitsFileReader`]: the `--kl-divergence-base` file (`_logits_`
//!   magic, `n_ctx`, `n_vocab`, `n_chunk`, the tokens, then per scored token a row of
//!   log-probabilities compressed to `u16` with a float scale and minimum).
//! - [`KldAccumulator`]: the `--kl-divergence` statistics and report.
//!
//! The forward pass is someone else's: the command evaluates each [`ChunkPlan`]'s batches and
//! hands the scored logits rows to these types.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom, Write};
use std::ops::Range;
use std::path::Path;

/// Errors of the chunking plan and the statistics.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PerplexityError {
    /// llama.cpp's refusal: fewer than two contexts' worth of tokens.
    #[error(
        "you need at least {needed} tokens to evaluate perplexity with a context of {n_ctx}; \
         the data file you provided tokenizes to only {have} tokens"
    )]
    TooFewTokens {
        needed: usize,
        n_ctx: usize,
        have: usize,
    },
    /// With `n_ctx < 3` no token of a chunk gets scored (`n_ctx - 1 - n_ctx/2 == 0`).
    #[error("context size {n_ctx} is too small for perplexity: it needs at least 3 tokens")]
    ContextTooSmall { n_ctx: usize },
    #[error("batch size must be at least 1")]
    ZeroBatch,
    #[error("the number of chunks to evaluate must be at least 1")]
    ZeroChunks,
    #[error("logits row has {got} entries, but the vocabulary has {expected}")]
    RowLength { got: usize, expected: usize },
    #[error("logits row is empty")]
    EmptyRow,
    #[error("target token {token} is outside the vocabulary of {n_vocab} entries")]
    TargetOutOfRange { token: u32, n_vocab: usize },
    /// The model failed to evaluate a chunk (the message of its `ModelError`).
    #[error("{0}")]
    Model(String),
    #[error("the context returned {got} rows of logits, fewer than asked for")]
    MissingLogits { got: usize },
}

/// Errors reading or writing a `--kl-divergence-base` logits file.
#[derive(Debug, thiserror::Error)]
pub enum LogitsFileError {
    #[error("i/o error on logits file: {0}")]
    Io(#[from] io::Error),
    #[error("not a file of log-probabilities: the magic is {found:?}, expected \"_logits_\"")]
    BadMagic { found: Vec<u8> },
    #[error("logits file header: {field} = {value} is invalid ({why})")]
    InvalidHeader {
        field: &'static str,
        value: i64,
        why: &'static str,
    },
    #[error("logits file is truncated: {needed} bytes needed but it holds {actual}")]
    Truncated { needed: u64, actual: u64 },
    #[error(
        "logits file has {extra} bytes after its last chunk (expected {expected} bytes in all)"
    )]
    TrailingData { expected: u64, extra: u64 },
    #[error("logits file token #{index} is {token}, outside the vocabulary of {n_vocab}")]
    TokenOutOfRange {
        index: usize,
        token: i32,
        n_vocab: usize,
    },
    #[error("logits file expects {expected} tokens (n_chunk * n_ctx), got {got}")]
    TokenCount { expected: usize, got: usize },
    #[error("all {n_rows} rows of the logits file have been written already")]
    TooManyRows { n_rows: usize },
    #[error("logits file finished after {written} of {expected} rows")]
    MissingRows { written: usize, expected: usize },
    #[error(transparent)]
    Row(#[from] PerplexityError),
}

// ---------------------------------------------------------------------------------------------
// Chunking
// ---------------------------------------------------------------------------------------------

/// How llama-perplexity cuts a tokenized text into chunks and what it scores.
///
/// Chunk `i` holds tokens `[i*n_ctx, (i+1)*n_ctx)` of the text; the KV cache is cleared before
/// each chunk; the first token fed is replaced by BOS when the model adds one; logits at
/// positions `first = n_ctx/2 ..= n_ctx-2` predict the tokens at `first+1 ..= n_ctx-1`, so
/// `n_ctx - 1 - n_ctx/2` tokens are scored per chunk.
#[derive(Debug, Clone)]
pub struct PerplexityPlan {
    /// The `n_chunk * n_ctx` tokens that take part (also what the logits file stores).
    tokens: Vec<u32>,
    n_ctx: usize,
    n_batch: usize,
    n_seq: usize,
    n_chunk: usize,
    bos: Option<u32>,
}

/// One chunk of a [`PerplexityPlan`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPlan<'a> {
    /// 0-based chunk number (llama.cpp prints it 1-based).
    pub index: usize,
    /// Offset of the chunk's first token in the text's tokens.
    pub start: usize,
    /// The `n_ctx` tokens to evaluate at positions `0..n_ctx`, BOS already substituted.
    pub input: Vec<u32>,
    /// Position ranges of the successive `llama_decode` calls (each at most `n_batch` long).
    pub batches: Vec<Range<usize>>,
    /// First scored position: `n_ctx / 2`.
    pub first: usize,
    /// `targets[k]` is the token that the logits at position `first + k` must predict.
    pub targets: &'a [u32],
}

impl ChunkPlan<'_> {
    /// Positions whose logits are scored: `first .. first + targets.len()`.
    pub fn scored_positions(&self) -> Range<usize> {
        self.first..self.first + self.targets.len()
    }

    /// Whether llama-perplexity asks for logits at `pos` (it requests positions `>= first`;
    /// the last one is computed but not scored).
    pub fn needs_logits(&self, pos: usize) -> bool {
        pos >= self.first
    }
}

impl PerplexityPlan {
    /// The plan of llama.cpp's `perplexity()`: `tokens` is the whole tokenized text (with BOS at
    /// its start if the model adds one), `bos` is `Some(id)` when the model adds BOS.
    ///
    /// `n_batch` is normalised as llama-perplexity's `main` does: `n_seq = max(1, n_batch/n_ctx)`
    /// chunks are evaluated together as separate sequences and `n_batch = min(n_batch,
    /// n_seq*n_ctx)`.
    pub fn new(
        tokens: &[u32],
        n_ctx: usize,
        n_batch: usize,
        bos: Option<u32>,
    ) -> Result<Self, PerplexityError> {
        check_sizes(n_ctx, n_batch)?;
        let needed = 2 * n_ctx;
        if tokens.len() < needed {
            return Err(PerplexityError::TooFewTokens {
                needed,
                n_ctx,
                have: tokens.len(),
            });
        }
        let n_seq = (n_batch / n_ctx).max(1);
        let n_batch = n_batch.min(n_seq * n_ctx);
        let n_chunk = tokens.len() / n_ctx;
        Ok(Self {
            tokens: tokens[..n_chunk * n_ctx].to_vec(),
            n_ctx,
            n_batch,
            n_seq,
            n_chunk,
            bos,
        })
    }

    /// The plan of llama.cpp's `kl_divergence()`: `tokens` are the `n_chunk * n_ctx` tokens of
    /// a logits file (see [`LogitsFileReader::tokens`]). One chunk per sequence, `n_batch`
    /// capped at `n_ctx`; no two-chunk minimum.
    pub fn for_kl_divergence(
        tokens: &[u32],
        n_ctx: usize,
        n_batch: usize,
        bos: Option<u32>,
    ) -> Result<Self, PerplexityError> {
        check_sizes(n_ctx, n_batch)?;
        let n_chunk = tokens.len() / n_ctx;
        if n_chunk == 0 {
            return Err(PerplexityError::TooFewTokens {
                needed: n_ctx,
                n_ctx,
                have: tokens.len(),
            });
        }
        Ok(Self {
            tokens: tokens[..n_chunk * n_ctx].to_vec(),
            n_ctx,
            n_batch: n_batch.min(n_ctx),
            n_seq: 1,
            n_chunk,
            bos,
        })
    }

    /// Limit the number of chunks (llama.cpp's `--chunks N`).
    pub fn with_max_chunks(mut self, max_chunks: usize) -> Result<Self, PerplexityError> {
        if max_chunks == 0 {
            return Err(PerplexityError::ZeroChunks);
        }
        self.n_chunk = self.n_chunk.min(max_chunks);
        self.tokens.truncate(self.n_chunk * self.n_ctx);
        Ok(self)
    }

    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Effective batch size (after llama-perplexity's normalisation).
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Chunks llama.cpp evaluates together as separate sequences; the KV cache must hold
    /// `n_seq * n_ctx` cells. Results per chunk do not depend on it.
    pub fn n_seq(&self) -> usize {
        self.n_seq
    }

    pub fn n_chunk(&self) -> usize {
        self.n_chunk
    }

    /// First scored position of each chunk: `n_ctx / 2`.
    pub fn first(&self) -> usize {
        self.n_ctx / 2
    }

    /// Tokens scored per chunk: `n_ctx - 1 - n_ctx/2`.
    pub fn scored_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.first()
    }

    pub fn scored_total(&self) -> usize {
        self.scored_per_chunk() * self.n_chunk
    }

    /// BOS substituted at the start of each chunk, if the model adds one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// The `n_chunk * n_ctx` tokens taking part, as stored in a logits file (originals, no BOS
    /// substitution).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Chunk `index`, or `None` past the last.
    pub fn chunk(&self, index: usize) -> Option<ChunkPlan<'_>> {
        if index >= self.n_chunk {
            return None;
        }
        let start = index * self.n_ctx;
        let mut input = self.tokens[start..start + self.n_ctx].to_vec();
        if let Some(bos) = self.bos {
            input[0] = bos;
        }
        let batches = (0..self.n_ctx.div_ceil(self.n_batch))
            .map(|j| j * self.n_batch..((j + 1) * self.n_batch).min(self.n_ctx))
            .collect();
        let first = self.first();
        let targets = &self.tokens[start + first + 1..start + self.n_ctx];
        Some(ChunkPlan {
            index,
            start,
            input,
            batches,
            first,
            targets,
        })
    }

    pub fn chunks(&self) -> impl Iterator<Item = ChunkPlan<'_>> + '_ {
        (0..self.n_chunk).filter_map(|i| self.chunk(i))
    }

    /// Chunk index ranges llama.cpp evaluates in one pass (`n_seq` at a time).
    pub fn chunk_groups(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.n_chunk)
            .step_by(self.n_seq)
            .map(|i| i..(i + self.n_seq).min(self.n_chunk))
    }
}

fn check_sizes(n_ctx: usize, n_batch: usize) -> Result<(), PerplexityError> {
    if n_ctx < 3 {
        return Err(PerplexityError::ContextTooSmall { n_ctx });
    }
    if n_batch == 0 {
        return Err(PerplexityError::ZeroBatch);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Per-token statistics
// ---------------------------------------------------------------------------------------------

fn check_row(logits: &[f32], target: u32) -> Result<usize, PerplexityError> {
    if logits.is_empty() {
        return Err(PerplexityError::EmptyRow);
    }
    let t = target as usize;
    if t >= logits.len() {
        return Err(PerplexityError::TargetOutOfRange {
            token: target,
            n_vocab: logits.len(),
        });
    }
    Ok(t)
}

fn max_f32(logits: &[f32]) -> f32 {
    // `std::max(a, b)` keeps `a` unless `a < b`.
    logits[1..]
        .iter()
        .fold(logits[0], |m, &v| if m < v { v } else { m })
}

/// `sum(expf(l - max))` accumulated in double, as llama.cpp does.
fn sum_exp(logits: &[f32], max_logit: f32) -> f64 {
    logits
        .iter()
        .map(|&l| f64::from((l - max_logit).exp()))
        .sum()
}

/// Negative log-likelihood of `target` under the softmax of `logits`, computed as llama.cpp's
/// plain `log_softmax` (perplexity without a logits file): float max subtraction, double sum
/// and log.
pub fn token_nll(logits: &[f32], target: u32) -> Result<f64, PerplexityError> {
    let t = check_row(logits, target)?;
    let max_logit = max_f32(logits);
    let sum = sum_exp(logits, max_logit);
    Ok(-(f64::from(logits[t] - max_logit) - sum.ln()))
}

/// llama.cpp's `nearest_int`: round to nearest, ties to even, through the float mantissa.
fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    (val.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Number of `u16` per compressed row: 4 (two floats) + `n_vocab` rounded up to even.
pub fn compressed_row_len(n_vocab: usize) -> usize {
    2 * n_vocab.div_ceil(2) + 4
}

/// Compress a logits row the way llama.cpp's logits-file `log_softmax` does, into `out`
/// (length [`compressed_row_len`]). Returns the target's negative log-likelihood, computed in
/// float as llama.cpp does in that mode.
pub fn compress_log_probs(
    logits: &[f32],
    target: u32,
    out: &mut [u16],
) -> Result<f64, PerplexityError> {
    let t = check_row(logits, target)?;
    let n_vocab = logits.len();
    if out.len() != compressed_row_len(n_vocab) {
        return Err(PerplexityError::RowLength {
            got: out.len().saturating_sub(4),
            expected: compressed_row_len(n_vocab) - 4,
        });
    }
    let mut max_logit = logits[0];
    let mut min_logit = logits[0];
    for &l in &logits[1..] {
        max_logit = if max_logit < l { l } else { max_logit };
        min_logit = if l < min_logit { l } else { min_logit };
    }
    let floor = max_logit - 16.0;
    min_logit = if min_logit < floor { floor } else { min_logit };
    let log_sum_exp = sum_exp(logits, max_logit).ln() as f32;
    let min_log_prob = min_logit - max_logit - log_sum_exp;
    let scale = (max_logit - min_logit) / 65535.0;
    let (head, q) = out.split_at_mut(4);
    let s = scale.to_bits();
    let m = min_log_prob.to_bits();
    head.copy_from_slice(&[s as u16, (s >> 16) as u16, m as u16, (m >> 16) as u16]);
    if scale != 0.0 {
        let inv_scale = 1.0 / scale;
        for (qi, &l) in q.iter_mut().zip(logits) {
            // Wrapping to u16 mirrors the C assignment of an int to uint16_t.
            *qi = if l > min_logit {
                nearest_int(inv_scale * (l - min_logit)) as u16
            } else {
                0
            };
        }
    } else {
        q[..n_vocab].fill(0);
    }
    q[n_vocab..].fill(0);
    Ok(f64::from(max_logit + log_sum_exp - logits[t]))
}

/// One compressed row of log-probabilities: `log p(i) ≈ scale * q[i] + min_log_prob`.
#[derive(Debug, Clone, Copy)]
pub struct CompressedRow<'a> {
    pub scale: f32,
    pub min_log_prob: f32,
    /// One entry per vocabulary token (padding excluded).
    pub q: &'a [u16],
}

impl<'a> CompressedRow<'a> {
    /// View a raw row of [`compressed_row_len`]`(n_vocab)` `u16`s.
    pub fn from_raw(raw: &'a [u16], n_vocab: usize) -> Result<Self, PerplexityError> {
        if raw.len() != compressed_row_len(n_vocab) {
            return Err(PerplexityError::RowLength {
                got: raw.len().saturating_sub(4),
                expected: compressed_row_len(n_vocab) - 4,
            });
        }
        let f = |lo: u16, hi: u16| f32::from_bits(u32::from(lo) | (u32::from(hi) << 16));
        Ok(Self {
            scale: f(raw[0], raw[1]),
            min_log_prob: f(raw[2], raw[3]),
            q: &raw[4..4 + n_vocab],
        })
    }

    pub fn n_vocab(&self) -> usize {
        self.q.len()
    }

    /// Log-probability of token `i` (`None` outside the vocabulary).
    pub fn log_prob(&self, i: usize) -> Option<f32> {
        self.q
            .get(i)
            .map(|&q| self.scale * f32::from(q) + self.min_log_prob)
    }

    /// The base model's negative log-likelihood of `target`, as llama.cpp's KLD code computes it.
    pub fn nll(&self, target: u32) -> Result<f32, PerplexityError> {
        self.log_prob(target as usize)
            .map(|lp| -lp)
            .ok_or(PerplexityError::TargetOutOfRange {
                token: target,
                n_vocab: self.q.len(),
            })
    }
}

// ---------------------------------------------------------------------------------------------
// Perplexity statistics
// ---------------------------------------------------------------------------------------------

/// Final perplexity and its uncertainty.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PplEstimate {
    pub ppl: f64,
    /// `ppl * sqrt((E[nll²] - E[nll]²) / (count - 1))`.
    pub error: f64,
}

/// Running sums of llama.cpp's `perplexity()`: `nll`, `nll²` and the count.
#[derive(Debug, Clone, Default)]
pub struct PerplexityStats {
    nll: f64,
    nll2: f64,
    count: usize,
}

impl PerplexityStats {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add one token's negative log-likelihood.
    pub fn add_nll(&mut self, nll: f64) {
        self.nll += nll;
        self.nll2 += nll * nll;
        self.count += 1;
    }

    /// Score one logits row against its target ([`token_nll`]) and add it.
    pub fn add_logits(&mut self, logits: &[f32], target: u32) -> Result<f64, PerplexityError> {
        let v = token_nll(logits, target)?;
        self.add_nll(v);
        Ok(v)
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Running perplexity `exp(mean nll)` (NaN before any token).
    pub fn ppl(&self) -> f64 {
        (self.nll / self.count as f64).exp()
    }

    /// The running estimate printed after chunk `chunk_index` (0-based): `[1]56.1234,`.
    pub fn chunk_entry(&self, chunk_index: usize) -> String {
        format!("[{}]{},", chunk_index + 1, c_fixed(self.ppl(), 0, 4))
    }

    /// The line printed per chunk with `--ppl-output-type 1`:
    /// `%8d  %.4lf  %4lf  %4lf` (start token, running PPL, mean nll, its uncertainty).
    pub fn chunk_line_detailed(&self, chunk_start: usize) -> String {
        let count = self.count as f64;
        let av = self.nll / count;
        let mut av2 = self.nll2 / count - av * av;
        if av2 > 0.0 {
            av2 = (av2 / (count - 1.0)).sqrt();
        }
        format!(
            "{chunk_start:8}  {}  {}  {}",
            c_fixed(av.exp(), 0, 4),
            c_fixed(av, 4, 6),
            c_fixed(av2, 4, 6)
        )
    }

    /// The final estimate, or `None` when the variance is not positive (llama.cpp then prints
    /// "Unexpected negative standard deviation of log(prob)").
    pub fn estimate(&self) -> Option<PplEstimate> {
        let count = self.count as f64;
        let nll = self.nll / count;
        let ppl = nll.exp();
        let var = self.nll2 / count - nll * nll;
        (var > 0.0).then(|| PplEstimate {
            ppl,
            error: (var / (count - 1.0)).sqrt() * ppl,
        })
    }

    /// `Final estimate: PPL = 59.9963 +/- 11.04844`, or llama.cpp's error line.
    pub fn final_line(&self) -> String {
        match self.estimate() {
            Some(e) => format!(
                "Final estimate: PPL = {} +/- {}",
                c_fixed(e.ppl, 0, 4),
                c_fixed(e.error, 0, 5)
            ),
            None => "Unexpected negative standard deviation of log(prob)".to_string(),
        }
    }
}

/// printf's `%W.Pf`: right-aligned to `width`, `nan`/`inf` spelled as glibc does.
fn c_fixed(v: f64, width: usize, prec: usize) -> String {
    if v.is_nan() {
        let s = if v.is_sign_negative() { "-nan" } else { "nan" };
        format!("{s:>width$}")
    } else if v.is_infinite() {
        let s = if v < 0.0 { "-inf" } else { "inf" };
        format!("{s:>width$}")
    } else {
        format!("{v:>width$.prec$}")
    }
}

// ---------------------------------------------------------------------------------------------
// Logits file
// ---------------------------------------------------------------------------------------------

/// Magic at the start of a `--kl-divergence-base` file.
pub const LOGITS_MAGIC: &[u8; 8] = b"_logits_";
const HEADER_BYTES: u64 = 8 + 3 * 4;

/// Header of a logits file (all stored as little-endian `i32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogitsFileHeader {
    pub n_ctx: usize,
    pub n_vocab: usize,
    pub n_chunk: usize,
}

impl LogitsFileHeader {
    /// Scored tokens (rows) per chunk: `n_ctx - 1 - n_ctx/2`.
    pub fn rows_per_chunk(&self) -> usize {
        self.n_ctx - 1 - self.n_ctx / 2
    }

    /// `u16`s per row (two floats, then `n_vocab` rounded up to even).
    pub fn row_len(&self) -> usize {
        compressed_row_len(self.n_vocab)
    }

    pub fn n_tokens(&self) -> usize {
        self.n_ctx * self.n_chunk
    }

    fn chunk_bytes(&self) -> Option<u64> {
        (self.rows_per_chunk() as u64)
            .checked_mul(self.row_len() as u64)?
            .checked_mul(2)
    }

    /// Total file size this header implies (`None` on overflow).
    pub fn file_len(&self) -> Option<u64> {
        let tokens = (self.n_ctx as u64)
            .checked_mul(self.n_chunk as u64)?
            .checked_mul(4)?;
        let rows = self.chunk_bytes()?.checked_mul(self.n_chunk as u64)?;
        HEADER_BYTES.checked_add(tokens)?.checked_add(rows)
    }

    fn validate(n_ctx: i32, n_vocab: i32, n_chunk: i32) -> Result<Self, LogitsFileError> {
        let bad = |field, value: i32, why| LogitsFileError::InvalidHeader {
            field,
            value: i64::from(value),
            why,
        };
        if n_ctx < 3 {
            return Err(bad(
                "n_ctx",
                n_ctx,
                "must be at least 3 for any token to be scored",
            ));
        }
        if n_vocab < 1 {
            return Err(bad("n_vocab", n_vocab, "must be positive"));
        }
        if n_chunk < 1 {
            return Err(bad("n_chunk", n_chunk, "must be positive"));
        }
        Ok(Self {
            n_ctx: n_ctx as usize,
            n_vocab: n_vocab as usize,
            n_chunk: n_chunk as usize,
        })
    }
}

/// Writes a `--kl-divergence-base` file as llama-perplexity does with `--kl-divergence-base`:
/// header and tokens first, then [`write_row`](Self::write_row) once per scored token, chunk
/// after chunk.
pub struct LogitsFileWriter<W: Write> {
    out: W,
    header: LogitsFileHeader,
    rows_written: usize,
    row: Vec<u16>,
    bytes: Vec<u8>,
}

impl<W: Write> LogitsFileWriter<W> {
    /// `tokens` are the `n_chunk * n_ctx` tokens of the plan ([`PerplexityPlan::tokens`]).
    pub fn new(
        mut out: W,
        n_ctx: usize,
        n_vocab: usize,
        tokens: &[u32],
    ) -> Result<Self, LogitsFileError> {
        let as_i32 = |field, v: usize| {
            i32::try_from(v).map_err(|_| LogitsFileError::InvalidHeader {
                field,
                value: i64::try_from(v).unwrap_or(i64::MAX),
                why: "does not fit in an i32",
            })
        };
        let n_chunk = tokens.len().checked_div(n_ctx).unwrap_or(0);
        let header = LogitsFileHeader::validate(
            as_i32("n_ctx", n_ctx)?,
            as_i32("n_vocab", n_vocab)?,
            as_i32("n_chunk", n_chunk)?,
        )?;
        if tokens.len() != header.n_tokens() {
            return Err(LogitsFileError::TokenCount {
                expected: header.n_tokens(),
                got: tokens.len(),
            });
        }
        if header.file_len().is_none() {
            return Err(LogitsFileError::InvalidHeader {
                field: "n_vocab",
                value: n_vocab as i64,
                why: "file size overflows",
            });
        }
        let mut head = Vec::with_capacity(HEADER_BYTES as usize + 4 * tokens.len());
        head.extend_from_slice(LOGITS_MAGIC);
        for v in [header.n_ctx, header.n_vocab, header.n_chunk] {
            head.extend_from_slice(&(v as i32).to_le_bytes());
        }
        for (index, &t) in tokens.iter().enumerate() {
            if t as usize >= n_vocab {
                return Err(LogitsFileError::TokenOutOfRange {
                    index,
                    token: t as i32,
                    n_vocab,
                });
            }
            head.extend_from_slice(&(t as i32).to_le_bytes());
        }
        out.write_all(&head)?;
        let row_len = header.row_len();
        Ok(Self {
            out,
            header,
            rows_written: 0,
            row: vec![0; row_len],
            bytes: Vec::with_capacity(2 * row_len),
        })
    }

    pub fn header(&self) -> &LogitsFileHeader {
        &self.header
    }

    fn total_rows(&self) -> usize {
        self.header.rows_per_chunk() * self.header.n_chunk
    }

    /// Compress and write the next scored logits row; returns the target's nll in the float
    /// precision llama.cpp uses when writing this file (feed it to [`PerplexityStats::add_nll`]).
    pub fn write_row(&mut self, logits: &[f32], target: u32) -> Result<f64, LogitsFileError> {
        if self.rows_written >= self.total_rows() {
            return Err(LogitsFileError::TooManyRows {
                n_rows: self.total_rows(),
            });
        }
        if logits.len() != self.header.n_vocab {
            return Err(PerplexityError::RowLength {
                got: logits.len(),
                expected: self.header.n_vocab,
            }
            .into());
        }
        let nll = compress_log_probs(logits, target, &mut self.row)?;
        self.bytes.clear();
        self.bytes
            .extend(self.row.iter().flat_map(|v| v.to_le_bytes()));
        self.out.write_all(&self.bytes)?;
        self.rows_written += 1;
        Ok(nll)
    }

    /// Flush and check that every row was written.
    pub fn finish(mut self) -> Result<W, LogitsFileError> {
        if self.rows_written != self.total_rows() {
            return Err(LogitsFileError::MissingRows {
                written: self.rows_written,
                expected: self.total_rows(),
            });
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// The compressed base log-probabilities of one chunk: [`BaseChunk::n_rows`] rows, row `k`
/// for the token predicted at position `n_ctx/2 + k`.
#[derive(Debug, Clone)]
pub struct BaseChunk {
    pub index: usize,
    n_vocab: usize,
    row_len: usize,
    data: Vec<u16>,
}

impl BaseChunk {
    pub fn n_rows(&self) -> usize {
        self.data.len() / self.row_len
    }

    pub fn row(&self, k: usize) -> Option<CompressedRow<'_>> {
        let raw = self.data.get(k * self.row_len..(k + 1) * self.row_len)?;
        CompressedRow::from_raw(raw, self.n_vocab).ok()
    }

    pub fn rows(&self) -> impl Iterator<Item = CompressedRow<'_>> + '_ {
        (0..self.n_rows()).filter_map(|k| self.row(k))
    }
}

/// Streams a `--kl-divergence-base` file chunk by chunk. The header is checked against the file
/// size before anything is allocated; tokens must lie inside the vocabulary.
pub struct LogitsFileReader<R> {
    input: R,
    header: LogitsFileHeader,
    tokens: Vec<u32>,
    file_len: u64,
    chunks_read: usize,
}

impl LogitsFileReader<BufReader<File>> {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, LogitsFileError> {
        Self::new(BufReader::new(File::open(path)?))
    }
}

impl<R: Read + Seek> LogitsFileReader<R> {
    pub fn new(mut input: R) -> Result<Self, LogitsFileError> {
        let file_len = input.seek(SeekFrom::End(0))?;
        input.seek(SeekFrom::Start(0))?;
        if file_len < HEADER_BYTES {
            // A short file with a wrong magic is "not a logits file" rather than "truncated".
            let mut got = vec![0u8; file_len.min(8) as usize];
            input.read_exact(&mut got)?;
            if !LOGITS_MAGIC.starts_with(&got) {
                return Err(LogitsFileError::BadMagic { found: got });
            }
            return Err(LogitsFileError::Truncated {
                needed: HEADER_BYTES,
                actual: file_len,
            });
        }
        let mut head = [0u8; HEADER_BYTES as usize];
        input.read_exact(&mut head)?;
        if &head[..8] != LOGITS_MAGIC {
            return Err(LogitsFileError::BadMagic {
                found: head[..8].to_vec(),
            });
        }
        let field = |i: usize| i32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
        let header = LogitsFileHeader::validate(field(8), field(12), field(16))?;
        let expected = header.file_len().ok_or(LogitsFileError::InvalidHeader {
            field: "n_vocab",
            value: header.n_vocab as i64,
            why: "implied file size overflows",
        })?;
        if file_len < expected {
            return Err(LogitsFileError::Truncated {
                needed: expected,
                actual: file_len,
            });
        }
        if file_len > expected {
            return Err(LogitsFileError::TrailingData {
                expected,
                extra: file_len - expected,
            });
        }
        // Bounded by the file size checked above.
        let mut raw = vec![0u8; 4 * header.n_tokens()];
        read_exact_or_truncated(&mut input, &mut raw, HEADER_BYTES, file_len)?;
        let tokens = raw
            .chunks_exact(4)
            .enumerate()
            .map(|(index, b)| {
                let t = i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if t < 0 || t as usize >= header.n_vocab {
                    Err(LogitsFileError::TokenOutOfRange {
                        index,
                        token: t,
                        n_vocab: header.n_vocab,
                    })
                } else {
                    Ok(t as u32)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            input,
            header,
            tokens,
            file_len,
            chunks_read: 0,
        })
    }

    pub fn header(&self) -> &LogitsFileHeader {
        &self.header
    }

    /// The `n_chunk * n_ctx` evaluated tokens (feed them to
    /// [`PerplexityPlan::for_kl_divergence`]).
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// The next chunk's rows, or `None` after the last chunk.
    pub fn next_chunk(&mut self) -> Result<Option<BaseChunk>, LogitsFileError> {
        if self.chunks_read >= self.header.n_chunk {
            return Ok(None);
        }
        let row_len = self.header.row_len();
        let n_u16 = self.header.rows_per_chunk() * row_len;
        let mut raw = vec![0u8; 2 * n_u16];
        let offset = HEADER_BYTES
            + 4 * self.header.n_tokens() as u64
            + self.chunks_read as u64 * raw.len() as u64;
        read_exact_or_truncated(&mut self.input, &mut raw, offset, self.file_len)?;
        let data = raw
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect();
        let chunk = BaseChunk {
            index: self.chunks_read,
            n_vocab: self.header.n_vocab,
            row_len,
            data,
        };
        self.chunks_read += 1;
        Ok(Some(chunk))
    }
}

/// `read_exact` that reports a file shrinking under us as [`LogitsFileError::Truncated`].
fn read_exact_or_truncated<R: Read>(
    input: &mut R,
    buf: &mut [u8],
    offset: u64,
    file_len: u64,
) -> Result<(), LogitsFileError> {
    input.read_exact(buf).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            LogitsFileError::Truncated {
                needed: offset + buf.len() as u64,
                actual: file_len,
            }
        } else {
            LogitsFileError::Io(e)
        }
    })
}

// ---------------------------------------------------------------------------------------------
// KL divergence
// ---------------------------------------------------------------------------------------------

/// What one token contributed: its KL divergence and `p - p_base` of the target token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenKld {
    pub kld: f64,
    pub p_diff: f32,
}

/// llama.cpp's `kl_divergence_result` plus the per-token values it sorts for percentiles.
#[derive(Debug, Clone, Default)]
pub struct KldAccumulator {
    sum_nll: f64,
    sum_nll2: f64,
    sum_nll_base: f64,
    sum_nll_base2: f64,
    sum_nll_nll_base: f64,
    sum_kld: f64,
    sum_kld2: f64,
    sum_p_diff: f64,
    sum_p_diff2: f64,
    sum_p_diff4: f64,
    max_p_diff: f32,
    n_same_top: usize,
    count: usize,
    kld_values: Vec<f32>,
    p_diff_values: Vec<f32>,
}

/// Header printed before each chunk's line of the `--kl-divergence` table.
pub const KLD_CHUNK_HEADER: &str = "chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              Δp RMS            Same top p";

fn mean_and_uncertainty(sum: f64, sum2: f64, count: usize) -> (f64, f64) {
    if count < 1 {
        return (0.0, 0.0);
    }
    let n = count as f64;
    let f = sum / n;
    let df = sum2 / n - f * f;
    let df = if df > 0.0 && count > 10 {
        (df / (n - 1.0)).sqrt()
    } else {
        0.0
    };
    (f, df)
}

fn covariance(suma: f64, sumb: f64, sumab: f64, count: usize) -> f64 {
    if count < 10 {
        return 0.0;
    }
    let n = count as f64;
    (sumab / n - (suma / n) * (sumb / n)) / (n - 1.0)
}

/// llama.cpp's percentile: linear interpolation in float over sorted values.
fn percentile(values: &[f32], fraction: f32) -> f32 {
    if fraction <= 0.0 {
        return values[0];
    }
    if fraction >= 1.0 {
        return values[values.len() - 1];
    }
    let mut p = fraction * (values.len() - 1) as f32;
    let ip = p as usize;
    p -= ip as f32;
    (1.0 - p) * values[ip] + p * values[(ip + 1).min(values.len() - 1)]
}

fn median(values: &[f32]) -> f32 {
    let n = values.len();
    if n & 1 == 1 {
        values[n / 2]
    } else {
        0.5 * (values[n / 2] + values[n / 2 - 1])
    }
}

/// Summary numbers of a KLD run (what [`KldAccumulator::report`] prints).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KldSummary {
    pub count: usize,
    pub ppl: (f64, f64),
    pub ppl_base: (f64, f64),
    pub log_ppl_correlation: f64,
    pub log_ppl_ratio: (f64, f64),
    pub ppl_ratio: (f64, f64),
    pub ppl_diff: (f64, f64),
    pub kld: (f64, f64),
    pub p_diff: (f64, f64),
    pub p_diff_rms: (f64, f64),
    pub max_abs_p_diff: f32,
    pub same_top: (f64, f64),
}

impl KldAccumulator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Compare one scored position: `base` is the base model's compressed row, `logits` the
    /// current model's logits at the same position, `target` the next token. Ported from
    /// llama.cpp's KLD `log_softmax`, float/double mix included.
    pub fn add_token(
        &mut self,
        base: &CompressedRow<'_>,
        logits: &[f32],
        target: u32,
    ) -> Result<TokenKld, PerplexityError> {
        let t = check_row(logits, target)?;
        if base.n_vocab() != logits.len() {
            return Err(PerplexityError::RowLength {
                got: logits.len(),
                expected: base.n_vocab(),
            });
        }
        let mut max_logit = logits[0];
        let mut imax = 0;
        for (i, &l) in logits.iter().enumerate().skip(1) {
            if l > max_logit {
                max_logit = l;
                imax = i;
            }
        }
        let log_sum_exp = sum_exp(logits, max_logit).ln() as f32;
        let (scale, min_log_prob) = (base.scale, base.min_log_prob);

        let nll = max_logit + log_sum_exp - logits[t];
        self.sum_nll += f64::from(nll);
        self.sum_nll2 += f64::from(nll * nll);

        let nll_base = -(scale * f32::from(base.q[t]) + min_log_prob);
        self.sum_nll_base += f64::from(nll_base);
        self.sum_nll_base2 += f64::from(nll_base * nll_base);
        self.sum_nll_nll_base += f64::from(nll * nll_base);

        let max_logit = max_logit + log_sum_exp;
        let mut sum = 0.0f64;
        let mut imax_base = 0;
        let mut p_log_base_max = 0.0f32;
        for (i, (&q, &l)) in base.q.iter().zip(logits).enumerate() {
            let p_log_base = scale * f32::from(q) + min_log_prob;
            if i == 0 || p_log_base > p_log_base_max {
                p_log_base_max = p_log_base;
                imax_base = i;
            }
            if p_log_base > -16.0 {
                let p_base = p_log_base.exp();
                sum += f64::from(p_base * (p_log_base - l + max_logit));
            }
        }
        self.sum_kld += sum;
        self.sum_kld2 += sum * sum;
        self.count += 1;
        if imax == imax_base {
            self.n_same_top += 1;
        }

        let p_base = (-nll_base).exp();
        let p = (-nll).exp();
        let p_diff = p - p_base;
        self.sum_p_diff += f64::from(p_diff);
        let p_diff2 = f64::from(p_diff * p_diff);
        self.sum_p_diff2 += p_diff2;
        self.sum_p_diff4 += p_diff2 * p_diff2;
        self.max_p_diff = self.max_p_diff.max(p_diff.abs());

        self.kld_values.push(sum as f32);
        self.p_diff_values.push(p_diff);
        Ok(TokenKld { kld: sum, p_diff })
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn n_same_top(&self) -> usize {
        self.n_same_top
    }

    /// Per-token KL divergences in the order added.
    pub fn kld_values(&self) -> &[f32] {
        &self.kld_values
    }

    /// Per-token `p - p_base` in the order added.
    pub fn p_diff_values(&self) -> &[f32] {
        &self.p_diff_values
    }

    /// The numbers behind the report (running values are valid at any time).
    pub fn summary(&self) -> KldSummary {
        let n = self.count;
        let log_ppl = mean_and_uncertainty(self.sum_nll, self.sum_nll2, n);
        let ppl_val = log_ppl.0.exp();
        let ppl_unc = ppl_val * log_ppl.1;
        let log_ppl_base = mean_and_uncertainty(self.sum_nll_base, self.sum_nll_base2, n);
        let ppl_base_val = log_ppl_base.0.exp();
        let ppl_base_unc = ppl_base_val * log_ppl_base.1;
        let log_ppl_cov = covariance(self.sum_nll, self.sum_nll_base, self.sum_nll_nll_base, n);
        let log_ppl_cor = log_ppl_cov / (log_ppl.1 * log_ppl_base.1);
        let log_ratio_val = log_ppl.0 - log_ppl_base.0;
        let log_ratio_unc =
            (log_ppl.1 * log_ppl.1 + log_ppl_base.1 * log_ppl_base.1 - 2.0 * log_ppl_cov).sqrt();
        let ratio_val = log_ratio_val.exp();
        let ppl_cov = ppl_val * ppl_base_val * log_ppl_cov;
        let diff_unc = (ppl_unc * ppl_unc + ppl_base_unc * ppl_base_unc - 2.0 * ppl_cov).sqrt();
        let p_diff_mse = mean_and_uncertainty(self.sum_p_diff2, self.sum_p_diff4, n);
        let rms = p_diff_mse.0.sqrt();
        let same = self.n_same_top as f64 / n as f64;
        KldSummary {
            count: n,
            ppl: (ppl_val, ppl_unc),
            ppl_base: (ppl_base_val, ppl_base_unc),
            log_ppl_correlation: log_ppl_cor,
            log_ppl_ratio: (log_ratio_val, log_ratio_unc),
            ppl_ratio: (ratio_val, ratio_val * log_ratio_unc),
            ppl_diff: (ppl_val - ppl_base_val, diff_unc),
            kld: mean_and_uncertainty(self.sum_kld, self.sum_kld2, n),
            p_diff: mean_and_uncertainty(self.sum_p_diff, self.sum_p_diff2, n),
            p_diff_rms: (rms, 0.5 / rms * p_diff_mse.1),
            max_abs_p_diff: self.max_p_diff,
            same_top: (same, (same * (1.0 - same) / (n as f64 - 1.0)).sqrt()),
        }
    }

    /// What llama.cpp prints after chunk `chunk_index` (0-based): an empty line, the table
    /// header ([`KLD_CHUNK_HEADER`]) and the running values. Ends with a newline.
    pub fn chunk_report(&self, chunk_index: usize) -> String {
        let s = self.summary();
        format!(
            "\n{KLD_CHUNK_HEADER}\n{:4}    {} ± {}    {} ± {}    {} ± {}    {} ± {} %    {} ± {} %\n",
            chunk_index + 1,
            c_fixed(s.ppl.0, 9, 4),
            c_fixed(s.ppl.1, 9, 4),
            c_fixed(s.log_ppl_ratio.0, 10, 5),
            c_fixed(s.log_ppl_ratio.1, 10, 5),
            c_fixed(s.kld.0, 10, 5),
            c_fixed(s.kld.1, 10, 5),
            c_fixed(100.0 * s.p_diff_rms.0, 6, 3),
            c_fixed(100.0 * s.p_diff_rms.1, 6, 3),
            c_fixed(100.0 * s.same_top.0, 6, 3),
            c_fixed(100.0 * s.same_top.1, 6, 3),
        )
    }

    /// The final statistics as llama.cpp prints them ("====== Perplexity statistics ======"
    /// through "Same top p"), or `None` below 100 tokens, where llama.cpp prints none.
    pub fn report(&self) -> Option<String> {
        use std::fmt::Write as _;
        if self.count < 100 {
            return None;
        }
        let s = self.summary();
        let mut kld = self.kld_values.clone();
        kld.sort_by(f32::total_cmp);
        let mut pd = self.p_diff_values.clone();
        pd.sort_by(f32::total_cmp);
        let f = c_fixed;
        let mut o = String::new();
        // Writing to a String cannot fail.
        let _ = (|| -> std::fmt::Result {
            writeln!(o, "====== Perplexity statistics ======")?;
            writeln!(
                o,
                "Mean PPL(Q)                   : {} ± {}",
                f(s.ppl.0, 10, 6),
                f(s.ppl.1, 10, 6)
            )?;
            writeln!(
                o,
                "Mean PPL(base)                : {} ± {}",
                f(s.ppl_base.0, 10, 6),
                f(s.ppl_base.1, 10, 6)
            )?;
            writeln!(
                o,
                "Cor(ln(PPL(Q)), ln(PPL(base))): {}%",
                f(100.0 * s.log_ppl_correlation, 6, 2)
            )?;
            writeln!(
                o,
                "Mean ln(PPL(Q)/PPL(base))     : {} ± {}",
                f(s.log_ppl_ratio.0, 10, 6),
                f(s.log_ppl_ratio.1, 10, 6)
            )?;
            writeln!(
                o,
                "Mean PPL(Q)/PPL(base)         : {} ± {}",
                f(s.ppl_ratio.0, 10, 6),
                f(s.ppl_ratio.1, 10, 6)
            )?;
            writeln!(
                o,
                "Mean PPL(Q)-PPL(base)         : {} ± {}",
                f(s.ppl_diff.0, 10, 6),
                f(s.ppl_diff.1, 10, 6)
            )?;
            writeln!(o)?;
            writeln!(o, "====== KL divergence statistics ======")?;
            writeln!(
                o,
                "Mean    KLD: {} ± {}",
                f(s.kld.0, 10, 6),
                f(s.kld.1, 10, 6)
            )?;
            let k = |v: f32| f(f64::from(v), 10, 6);
            writeln!(o, "Maximum KLD: {}", k(kld[kld.len() - 1]))?;
            for (label, fr) in [
                ("99.9%", 0.999f32),
                ("99.0%", 0.990),
                ("95.0%", 0.950),
                ("90.0%", 0.900),
            ] {
                writeln!(o, "{label}   KLD: {}", k(percentile(&kld, fr)))?;
            }
            writeln!(o, "Median  KLD: {}", k(median(&kld)))?;
            for (label, fr) in [
                ("10.0%", 0.100f32),
                (" 5.0%", 0.050),
                (" 1.0%", 0.010),
                (" 0.1%", 0.001),
            ] {
                writeln!(o, "{label}   KLD: {}", k(percentile(&kld, fr)))?;
            }
            writeln!(o, "Minimum KLD: {}", k(kld[0]))?;
            writeln!(o)?;
            writeln!(o, "====== Token probability statistics ======")?;
            writeln!(
                o,
                "Mean    Δp: {} ± {} %",
                f(100.0 * s.p_diff.0, 6, 3),
                f(100.0 * s.p_diff.1, 5, 3)
            )?;
            let p = |v: f32| f(100.0 * f64::from(v), 6, 3);
            writeln!(o, "Maximum Δp: {}%", p(pd[pd.len() - 1]))?;
            for (label, fr) in [
                ("99.9%", 0.999f32),
                ("99.0%", 0.990),
                ("95.0%", 0.950),
                ("90.0%", 0.900),
                ("75.0%", 0.750),
            ] {
                writeln!(o, "{label}   Δp: {}%", p(percentile(&pd, fr)))?;
            }
            writeln!(o, "Median  Δp: {}%", p(median(&pd)))?;
            for (label, fr) in [
                ("25.0%", 0.250f32),
                ("10.0%", 0.100),
                (" 5.0%", 0.050),
                (" 1.0%", 0.010),
                (" 0.1%", 0.001),
            ] {
                writeln!(o, "{label}   Δp: {}%", p(percentile(&pd, fr)))?;
            }
            writeln!(o, "Minimum Δp: {}%", p(pd[0]))?;
            writeln!(
                o,
                "RMS Δp    : {} ± {} %",
                f(100.0 * s.p_diff_rms.0, 6, 3),
                f(100.0 * s.p_diff_rms.1, 5, 3)
            )?;
            writeln!(
                o,
                "Same top p: {} ± {} %",
                f(100.0 * s.same_top.0, 6, 3),
                f(100.0 * s.same_top.1, 5, 3)
            )
        })();
        Some(o)
    }
}

impl From<crate::ModelError> for PerplexityError {
    fn from(e: crate::ModelError) -> Self {
        PerplexityError::Model(e.to_string())
    }
}

/// Evaluates the chunks of `group` together, one sequence each (as llama-perplexity does with
/// `n_seq` chunks per batch), and hands each scored position's logits to
/// `score(chunk_in_group, position, logits)`, in chunk then position order.
pub fn eval_chunk_group<E: From<PerplexityError>>(
    ctx: &mut crate::Context,
    plan: &PerplexityPlan,
    group: std::ops::Range<usize>,
    mut score: impl FnMut(usize, usize, &[f32]) -> Result<(), E>,
) -> Result<(), E> {
    ctx.clear();
    let chunks: Vec<_> = group.clone().filter_map(|i| plan.chunk(i)).collect();
    let mut batch = crate::Batch::default();
    let mut wanted = Vec::new();
    for (seq, chunk) in chunks.iter().enumerate() {
        for (pos, &token) in chunk.input.iter().enumerate() {
            let logits = chunk.needs_logits(pos);
            batch.push(token, pos as i32, seq, logits);
            if logits {
                wanted.push((seq, pos));
            }
        }
    }
    ctx.decode(&batch).map_err(PerplexityError::from)?;
    for (row, &(seq, pos)) in wanted.iter().enumerate() {
        if chunks[seq].scored_positions().contains(&pos) {
            let logits = ctx
                .output_logits(row)
                .ok_or(PerplexityError::MissingLogits { got: row })?;
            score(seq, pos, logits)?;
        }
    }
    Ok(())
}
