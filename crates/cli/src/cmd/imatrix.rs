//! `lamina imatrix`: an importance matrix of a text, as llama.cpp's `llama-imatrix` computes it
//! (the sums of squares of every weight product's input over chunks of `-c` tokens), written in
//! its GGUF format (`imatrix.gguf` by default) or with `--output-format dat` its legacy one;
//! `--in-file` adds earlier files' data, and with no `-f` only combines them.

use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;
use lamina_model::ContextParams;
use lamina_tools::imatrix::{
    Collector, CollectorParams, Progress, RunParams, SharedCollector, compute_imatrix,
};

use super::{CacheArgs, DeviceArgs, emit, load_with, non_negative};

#[derive(Args, Debug)]
pub struct ImatrixArgs {
    /// Model: a GGUF path or a known model name (pulled on first use).
    #[arg(short = 'm', long, default_value = lamina_gguf::pull::DEFAULT_MODEL)]
    pub model: String,
    /// The text to compute the importance matrix on.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Output file (llama.cpp's GGUF imatrix format).
    #[arg(short = 'o', long = "output-file", default_value = "imatrix.gguf")]
    pub output: PathBuf,
    /// Output format: gguf, or dat (llama.cpp's legacy format).
    #[arg(long = "output-format", default_value = "gguf", value_parser = ["gguf", "dat"])]
    pub output_format: String,
    /// Tokens per chunk.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512, value_parser = non_negative)]
    pub ctx_size: usize,
    /// Process at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Skip this many chunks of the text first.
    #[arg(long = "chunk", visible_alias = "from-chunk", default_value_t = 0)]
    pub from_chunk: usize,
    /// Also collect data for the output tensor (`output.weight`).
    #[arg(long = "process-output")]
    pub process_output: bool,
    /// Save the imatrix every N chunks (`-ofreq`).
    #[arg(
        long = "output-frequency",
        visible_alias = "ofreq",
        default_value_t = 10
    )]
    pub output_frequency: usize,
    /// Also save a copy `<output>.at_<chunk>` every N chunks (0: never).
    #[arg(long = "save-frequency", default_value_t = 0)]
    pub save_frequency: usize,
    /// Earlier imatrix files (GGUF or legacy .dat) to add to; comma-separated or repeated.
    #[arg(long = "in-file", value_delimiter = ',')]
    pub in_file: Vec<PathBuf>,
    /// Do not print the perplexity of each chunk.
    #[arg(long = "no-ppl")]
    pub no_ppl: bool,
    /// Parse special tokens in the text.
    #[arg(long = "parse-special")]
    pub parse_special: bool,
    /// Threads to compute with (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Most tokens per llama_decode: max(1, N / ctx-size) chunks are evaluated together.
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: usize,
    /// Largest micro-batch computed at once (`-ub`).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    pub ubatch_size: usize,
    #[command(flatten)]
    pub cache: CacheArgs,
    #[command(flatten)]
    pub devices: DeviceArgs,
}

struct Printer {
    ppl: bool,
}

impl Progress for Printer {
    fn first_pass(&mut self, seconds: f32, n_chunk: usize, n_seq: usize) {
        let mut total = (seconds * n_chunk as f32 / n_seq as f32) as i64;
        let mut eta = String::new();
        if total >= 3600 {
            eta += &format!("{} hours ", total / 3600);
            total %= 3600;
        }
        eprintln!(
            "compute_imatrix: {seconds:.2} seconds per pass - ETA {eta}{:.2} minutes",
            total as f64 / 60.0
        );
    }

    fn chunk_done(&mut self, entry: &str) {
        if self.ppl {
            let _ = emit(entry);
        }
    }
}

pub fn run(args: &ImatrixArgs) -> anyhow::Result<()> {
    let n_ctx = args.ctx_size;
    if n_ctx == 0 {
        bail!("imatrix requires --ctx-size > 0");
    }
    if args.output_frequency == 0 {
        bail!("--output-frequency must be at least 1");
    }
    let run = RunParams {
        n_ctx,
        n_batch: args.batch_size.max(1),
        n_ubatch: args.ubatch_size.max(1),
        n_chunks: args.chunks,
        from_chunk: args.from_chunk,
    };
    let params = CollectorParams {
        chunk_size: n_ctx,
        process_output: args.process_output,
        output_frequency: args.output_frequency,
        save_frequency: args.save_frequency,
        out_file: args.output.clone(),
        prompt_file: args.file.as_ref().map(|p| p.to_string_lossy().into_owned()),
        legacy_format: args.output_format == "dat",
    };
    let mut collector = Collector::new(params);
    for f in &args.in_file {
        eprintln!("imatrix: loading imatrix from '{}'", f.display());
        collector
            .load(f)
            .with_context(|| format!("failed to load {}", f.display()))?;
    }
    let Some(path) = &args.file else {
        if args.in_file.is_empty() {
            bail!("no text (-f) and no earlier imatrix files (--in-file) to combine");
        }
        eprintln!(
            "imatrix: no text given; saving the combined imatrix to '{}'",
            args.output.display()
        );
        collector.save(None)?;
        return Ok(());
    };
    let mut text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    // As llama.cpp's -f: one trailing newline is dropped.
    if text.ends_with('\n') {
        text.pop();
    }

    let mut cparams = ContextParams {
        n_ctx: run.n_kv(),
        n_ubatch: run.ubatch(),
        n_seq_max: run.n_seq(),
        ..Default::default()
    };
    args.cache.apply(&mut cparams)?;
    let loaded = load_with(&args.model, args.threads, cparams, &args.devices)?;
    let (mut ctx, tok) = (loaded.context, loaded.tokenizer);
    let bos = tok.add_bos().then(|| tok.bos()).flatten();
    let shared = SharedCollector::new(collector);
    ctx.set_matmul_observer(Some(Box::new(shared.clone())));

    eprintln!("compute_imatrix: tokenizing the input ..");
    let tokens = tok.tokenize(&text, true, args.parse_special);
    let n_chunk_max = tokens.len().saturating_sub(args.from_chunk * n_ctx) / n_ctx;
    eprintln!(
        "compute_imatrix: computing over {} chunks, n_ctx={n_ctx}, batch_size={}, n_seq={}",
        args.chunks.map_or(n_chunk_max, |c| c.min(n_chunk_max)),
        run.batch(),
        run.n_seq()
    );
    let mut printer = Printer { ppl: !args.no_ppl };
    let report = compute_imatrix(&mut ctx, &tokens, bos, &run, &shared, &mut printer)?;
    ctx.set_matmul_observer(None);
    emit("\n")?;
    if !args.no_ppl {
        emit(&(report.final_line + "\n"))?;
    }
    let mut c = shared.lock();
    let n = c.stats().len();
    let out = c.save(None)?;
    eprintln!(
        "imatrix: saved {n} entries computed on {} chunks to '{}'",
        c.last_chunk(),
        out.display()
    );
    Ok(())
}
