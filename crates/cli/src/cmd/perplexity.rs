//! `lamina perplexity`: perplexity of a text the way llama.cpp's `llama-perplexity` computes it
//! (chunks of `-c` tokens, the second half of each scored), and KL divergence against a base
//! logits file in llama.cpp's format, written by either program.

use std::io::BufWriter;
use std::path::PathBuf;

use anyhow::{Context as _, bail};
use clap::Args;
use lamina_model::ContextParams;
use lamina_model::perplexity::{
    KldAccumulator, LogitsFileReader, LogitsFileWriter, PerplexityPlan, PerplexityStats,
    eval_chunk_group,
};

use super::{LoadArgs, emit, load_with};

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// The text to score.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Score at most this many chunks.
    #[arg(long)]
    pub chunks: Option<usize>,
    /// Logits file (llama.cpp's format): written, or with --kl-divergence read as the base.
    #[arg(long = "kl-divergence-base", value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare against the base logits file instead of writing it.
    #[arg(long = "kl-divergence", requires = "kl_divergence_base")]
    pub kl_divergence: bool,
}

pub fn run(args: &PerplexityArgs) -> anyhow::Result<()> {
    let n_ctx = args.load.ctx_size;
    if n_ctx < 4 {
        bail!("-c must be at least 4 for perplexity");
    }
    let base_reader = match (&args.kl_divergence_base, args.kl_divergence) {
        (Some(path), true) => Some(
            LogitsFileReader::open(path)
                .with_context(|| format!("cannot read {}", path.display()))?,
        ),
        _ => None,
    };
    // Size the context for the sequences evaluated together, as llama-perplexity does.
    let n_seq = if base_reader.is_some() {
        1
    } else {
        (args.load.batch_size / n_ctx).max(1)
    };
    let mut params = ContextParams {
        n_ctx: n_ctx * n_seq,
        n_ubatch: args.load.ubatch_size,
        n_seq_max: n_seq,
        ..Default::default()
    };
    args.load.cache.apply(&mut params)?;
    let loaded = load_with(
        &args.load.model,
        args.load.threads,
        params,
        &args.load.devices,
    )?;
    let (mut ctx, tok) = (loaded.context, loaded.tokenizer);
    let n_vocab = tok.n_vocab();
    let bos = tok.add_bos().then(|| tok.bos()).flatten();

    if let Some(mut reader) = base_reader {
        let header = *reader.header();
        if header.n_vocab != n_vocab {
            bail!(
                "the base logits have {} vocabulary entries, the model {n_vocab}",
                header.n_vocab
            );
        }
        if header.n_ctx != n_ctx {
            bail!(
                "the base logits were made with -c {}; use the same -c",
                header.n_ctx
            );
        }
        let mut plan =
            PerplexityPlan::for_kl_divergence(reader.tokens(), n_ctx, args.load.batch_size, bos)?;
        if let Some(c) = args.chunks {
            plan = plan.with_max_chunks(c)?;
        }
        eprintln!("kl_divergence: {} chunks, n_ctx={n_ctx}", plan.n_chunk());
        let mut kld = KldAccumulator::new();
        for i in 0..plan.n_chunk() {
            let base = reader.next_chunk()?.context("the base file ends early")?;
            let chunk = plan.chunk(i).context("chunk")?;
            eval_chunk_group(
                &mut ctx,
                &plan,
                i..i + 1,
                |_, pos, logits| -> anyhow::Result<()> {
                    let k = pos - chunk.first;
                    let row = base.row(k).context("base row")?;
                    kld.add_token(&row, logits, chunk.targets[k])?;
                    Ok(())
                },
            )?;
            emit(&kld.chunk_report(i))?;
        }
        match kld.report() {
            Some(r) => emit(&r)?,
            None => emit("(fewer than 100 scored tokens: no statistics)\n")?,
        }
        return Ok(());
    }

    let path = args.file.as_ref().context("give the text with -f FILE")?;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let tokens = tok.tokenize(&text, true, false);
    let mut plan = PerplexityPlan::new(&tokens, n_ctx, args.load.batch_size, bos)?;
    if let Some(c) = args.chunks {
        plan = plan.with_max_chunks(c)?;
    }
    eprintln!(
        "perplexity: tokenizing the input: {} tokens; calculating perplexity over {} chunks, n_ctx={n_ctx}, batch_size={}, n_seq={}",
        tokens.len(),
        plan.n_chunk(),
        plan.n_batch(),
        plan.n_seq()
    );
    let mut writer = match &args.kl_divergence_base {
        Some(p) => {
            let file = std::fs::File::create(p)
                .with_context(|| format!("cannot create {}", p.display()))?;
            Some(LogitsFileWriter::new(
                BufWriter::new(file),
                n_ctx,
                n_vocab,
                plan.tokens(),
            )?)
        }
        None => None,
    };
    let mut stats = PerplexityStats::new();
    let groups: Vec<_> = plan.chunk_groups().collect();
    for group in groups {
        let first_chunk = group.start;
        let mut per_chunk: Vec<Vec<(usize, f64)>> = vec![Vec::new(); group.len()];
        eval_chunk_group(
            &mut ctx,
            &plan,
            group.clone(),
            |seq, pos, logits| -> anyhow::Result<()> {
                let chunk = plan.chunk(first_chunk + seq).context("chunk")?;
                let target = chunk.targets[pos - chunk.first];
                let nll = match writer.as_mut() {
                    Some(w) => w.write_row(logits, target)?,
                    None => lamina_model::perplexity::token_nll(logits, target)?,
                };
                per_chunk[seq].push((pos, nll));
                Ok(())
            },
        )?;
        for (seq, mut nlls) in per_chunk.into_iter().enumerate() {
            nlls.sort_by_key(|&(pos, _)| pos);
            for (_, nll) in nlls {
                stats.add_nll(nll);
            }
            emit(&stats.chunk_entry(first_chunk + seq))?;
        }
    }
    if let Some(w) = writer {
        w.finish()?;
    }
    emit("\n")?;
    emit(&(stats.final_line() + "\n"))?;
    Ok(())
}
