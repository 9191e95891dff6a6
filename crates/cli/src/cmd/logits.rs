//! `lamina logits -m MODEL (--tokens 1,2,3 | -p TEXT) [--all] [--json]`: evaluates the tokens
//! in one batch (one decode, micro-batches of 512 as llama.cpp's default; positions 0..,
//! sequence 0) and prints the logits of the last position, or of
//! every position with `--all`: as text, one line of `n_vocab` values per position, or with
//! `--json` as `{"n_vocab": V, "logits": [[…], …]}`. Values print in the shortest form that
//! reads back as the same f32. With `--tokens` the model's vocabulary is not needed (files with
//! llama.cpp's placeholder `test` vocabulary, or none, load).

use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::{Context as _, bail, ensure};
use clap::Args;
use lamina_model::{Batch, Context, ContextParams};

#[derive(Args, Debug)]
pub struct LogitsArgs {
    /// Model: a GGUF path or a known model name (pulled on first use).
    #[arg(short = 'm', long, default_value = lamina_gguf::pull::DEFAULT_MODEL)]
    pub model: String,
    /// Token ids to evaluate, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with = "prompt",
        required_unless_present = "prompt"
    )]
    pub tokens: Vec<u32>,
    /// Text to tokenize (with the model's BOS and special-token parsing) and evaluate.
    #[arg(short = 'p', long)]
    pub prompt: Option<String>,
    /// Print the logits of every position, not only the last.
    #[arg(long)]
    pub all: bool,
    /// Print one JSON object {"n_vocab": V, "logits": [[...], ...]}.
    #[arg(long)]
    pub json: bool,
    /// Context size in tokens (0: the model's training context; at least the token count).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 0)]
    pub ctx_size: usize,
    /// Threads to compute with (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    pub cache: super::CacheArgs,
    #[command(flatten)]
    pub devices: super::DeviceArgs,
}

pub fn run(args: &LogitsArgs) -> anyhow::Result<()> {
    let (model, path) = super::load_model(&args.model, args.threads, &args.devices)?;
    let tokens = match &args.prompt {
        Some(text) => {
            let tok = lamina_tokenizer::Tokenizer::from_gguf(&model.file)
                .with_context(|| format!("cannot load the vocabulary of {}", path.display()))?;
            tok.tokenize(text, true, true)
        }
        None => args.tokens.clone(),
    };
    if tokens.is_empty() {
        bail!("nothing to evaluate: give --tokens or a non-empty -p");
    }
    let n_vocab = model.hparams.n_vocab;
    if let Some(&t) = tokens.iter().find(|&&t| t >= n_vocab) {
        bail!("token id {t} is outside the vocabulary of {n_vocab}");
    }
    let n_ctx = match args.ctx_size {
        0 => (model.hparams.n_ctx_train as usize).max(tokens.len()),
        c => c,
    };
    ensure!(
        tokens.len() <= n_ctx,
        "{} tokens do not fit in a context of {n_ctx} (raise -c)",
        tokens.len()
    );
    let mut params = ContextParams {
        n_ctx,
        // One batch (one decode call), in micro-batches of llama.cpp's default size: a long
        // input needs no compute buffer sized for all of it at once.
        n_ubatch: tokens.len().min(512),
        n_seq_max: 1,
        pipeline_parallel: !args.devices.no_pipeline,
        n_threads: args
            .threads
            .unwrap_or(lamina_cpu::CpuConfig::from_env()?.threads),
        ..Default::default()
    };
    args.cache.apply(&mut params)?;
    let mut ctx = Context::new(Arc::new(model), params)?;
    let mut batch = Batch::default();
    for (i, &t) in tokens.iter().enumerate() {
        batch.push(t, i as i32, 0, args.all || i + 1 == tokens.len());
    }
    ctx.decode(&batch)?;
    let rows: Vec<&[f32]> = if args.all {
        (0..tokens.len()).filter_map(|i| ctx.logits(i)).collect()
    } else {
        ctx.last_logits().into_iter().collect()
    };
    super::emit(&format_logits(n_vocab, &rows, args.json))
}

/// The output for `rows` of logits.
pub fn format_logits(n_vocab: u32, rows: &[&[f32]], json: bool) -> String {
    let mut out = String::with_capacity(rows.len() * rows.first().map_or(0, |r| r.len()) * 12);
    if json {
        // Written by hand so each value is f32's shortest round-trip form (serde_json would
        // widen it to f64's); non-finite values become null, as JSON has no NaN.
        let _ = write!(out, "{{\"n_vocab\": {n_vocab}, \"logits\": [");
        for (i, row) in rows.iter().enumerate() {
            out.push_str(if i > 0 { ", [" } else { "[" });
            for (j, v) in row.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                if v.is_finite() {
                    let _ = write!(out, "{v}");
                } else {
                    out.push_str("null");
                }
            }
            out.push(']');
        }
        out.push_str("]}\n");
        return out;
    }
    for row in rows {
        for (j, v) in row.iter().enumerate() {
            if j > 0 {
                out.push(' ');
            }
            let _ = write!(out, "{v}");
        }
        out.push('\n');
    }
    out
}
