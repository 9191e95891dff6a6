//! `lamina run`: generate text from a prompt, streaming tokens as they come, then print
//! llama.cpp-style timings.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, bail};
use clap::Args;
use lamina_model::{Batch, Context};
use lamina_sample::{SampleError, SamplerChain};
use lamina_tokenizer::Tokenizer;

use super::{GrammarArgs, LoadArgs, SamplingArgs, Utf8Stream, emit, grammar_matcher, load};

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// The prompt.
    #[arg(short = 'p', long, conflicts_with = "file")]
    pub prompt: Option<String>,
    /// Read the prompt from a file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Tokens to generate (-1: until end of generation, -2: until the context is full; as llama.cpp).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true, value_parser = super::n_predict)]
    pub n_predict: i64,
    /// Don't print the prompt before the generated text.
    #[arg(long)]
    pub no_display_prompt: bool,
    /// Keep generating past end-of-generation tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub grammar: GrammarArgs,
}

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    let prompt = match (&args.prompt, &args.file) {
        (Some(p), _) => p.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?
        }
        (None, None) => bail!("give a prompt with -p TEXT or -f FILE"),
    };
    let t_start = Instant::now();
    let gbnf = args.grammar.checked_gbnf()?;
    let loaded = load(&args.load)?;
    let t_loaded = Instant::now();
    let (mut ctx, tok) = (loaded.context, loaded.tokenizer);

    let tokens = tok.tokenize(&prompt, true, true);
    if tokens.is_empty() {
        bail!("the prompt is empty");
    }
    let n_ctx = ctx.n_ctx();
    if tokens.len() >= n_ctx {
        bail!(
            "the prompt is {} tokens, which does not fit in the context of {n_ctx} (raise -c)",
            tokens.len()
        );
    }
    let mut sampler = SamplerChain::new(&args.sampling.params(n_ctx), tok.n_vocab())?;
    for &t in &tokens {
        sampler.accept_prompt(t);
    }
    sampler.set_grammar(grammar_matcher(gbnf.as_deref(), &tok)?);

    let mut out = Utf8Stream::default();
    if !args.no_display_prompt {
        emit(&prompt)?;
    }
    let stats = generate(&mut ctx, &tok, &mut sampler, &tokens, args, &mut out)?;
    emit(&out.finish())?;
    emit("\n")?;

    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let rate = |n: usize, t: f64| if t > 0.0 { n as f64 * 1e3 / t } else { 0.0 };
    let (pp, tg) = (ms(stats.prompt_time), ms(stats.eval_time));
    eprintln!();
    eprintln!(
        "lamina_perf:        load time = {:10.2} ms",
        ms(t_loaded - t_start)
    );
    eprintln!(
        "lamina_perf: prompt eval time = {pp:10.2} ms / {:5} tokens ({:8.2} ms per token, {:8.2} tokens per second)",
        tokens.len(),
        pp / tokens.len() as f64,
        rate(tokens.len(), pp)
    );
    if stats.n_eval > 0 {
        eprintln!(
            "lamina_perf:        eval time = {tg:10.2} ms / {:5} runs   ({:8.2} ms per token, {:8.2} tokens per second)",
            stats.n_eval,
            tg / stats.n_eval as f64,
            rate(stats.n_eval, tg)
        );
    }
    eprintln!(
        "lamina_perf:       total time = {:10.2} ms / {:5} tokens",
        ms(t_start.elapsed()),
        tokens.len() + stats.n_eval
    );
    if let Some(reason) = stats.stopped_by_context {
        eprintln!("lamina: stopped: {reason}");
    }
    Ok(())
}

struct GenStats {
    prompt_time: std::time::Duration,
    eval_time: std::time::Duration,
    n_eval: usize,
    stopped_by_context: Option<String>,
}

fn generate(
    ctx: &mut Context,
    tok: &Tokenizer,
    sampler: &mut SamplerChain,
    prompt: &[u32],
    args: &RunArgs,
    out: &mut Utf8Stream,
) -> anyhow::Result<GenStats> {
    let t0 = Instant::now();
    for (i, part) in prompt.chunks(args.load.batch_size.max(1)).enumerate() {
        let pos0 = (i * args.load.batch_size.max(1)) as i32;
        ctx.decode(&Batch::sequence(part, pos0, 0))?;
    }
    let prompt_time = t0.elapsed();

    let mut stats = GenStats {
        prompt_time,
        eval_time: Default::default(),
        n_eval: 0,
        stopped_by_context: None,
    };
    let mut pos = prompt.len();
    let mut produced: i64 = 0;
    // One batch for the whole loop: a generated token allocates nothing.
    let mut batch = Batch::default();
    let t1 = Instant::now();
    loop {
        if args.n_predict >= 0 && produced >= args.n_predict {
            break;
        }
        let logits = ctx.last_logits().context("the model returned no logits")?;
        let token = match sampler.sample(logits) {
            Err(SampleError::GrammarDeadEnd) => {
                stats.stopped_by_context = Some("the grammar allows no token here".into());
                break;
            }
            t => t?,
        };
        sampler.accept(token)?;
        if tok.is_eog(token) && !args.ignore_eos {
            break;
        }
        emit(out.push(tok.piece(token, false)))?;
        let _ = std::io::stdout().flush();
        produced += 1;
        if pos >= ctx.n_ctx() {
            stats.stopped_by_context = Some(format!(
                "the context of {} tokens is full (raise -c)",
                ctx.n_ctx()
            ));
            break;
        }
        batch.clear();
        batch.push(token, pos as i32, 0, true);
        ctx.decode(&batch)?;
        stats.n_eval += 1;
        pos += 1;
    }
    stats.eval_time = t1.elapsed();
    Ok(stats)
}
