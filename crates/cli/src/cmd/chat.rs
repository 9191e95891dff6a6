//! `lamina chat`: an interactive multi-turn conversation through the model's chat template.
//! Each turn re-renders the whole conversation and decodes only what the KV cache does not hold
//! yet. Ctrl-C stops the reply being written; Ctrl-C at the prompt, Ctrl-D or `/exit` leaves.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use clap::Args;
use lamina_model::{Batch, Context};
use lamina_sample::SamplerChain;
use lamina_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

use super::{GrammarArgs, LoadArgs, SamplingArgs, Utf8Stream, emit, grammar_matcher, load};

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub load: LoadArgs,
    /// A system message that starts the conversation.
    #[arg(long = "system-prompt", visible_alias = "sys")]
    pub system_prompt: Option<String>,
    /// Most tokens per reply (-1: until end of generation, -2: until the context is full; as llama.cpp).
    #[arg(short = 'n', long = "n-predict", default_value_t = -1, allow_negative_numbers = true, value_parser = super::n_predict)]
    pub n_predict: i64,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// Every reply follows this grammar or schema.
    #[command(flatten)]
    pub grammar: GrammarArgs,
}

/// Set while a reply is being generated; Ctrl-C then stops the reply instead of the program.
static GENERATING: AtomicBool = AtomicBool::new(false);
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

pub fn run(args: &ChatArgs) -> anyhow::Result<()> {
    ctrlc::set_handler(|| {
        if GENERATING.load(Ordering::SeqCst) {
            INTERRUPTED.store(true, Ordering::SeqCst);
        } else {
            eprintln!();
            std::process::exit(130);
        }
    })
    .context("cannot install the Ctrl-C handler")?;

    let gbnf = args.grammar.checked_gbnf()?;
    let loaded = load(&args.load)?;
    let (mut ctx, tok) = (loaded.context, loaded.tokenizer);
    let template = ChatTemplate::from_tokenizer(&tok)?;
    let mut sampler = SamplerChain::new(&args.sampling.params(ctx.n_ctx()), tok.n_vocab())?;
    sampler.set_grammar(grammar_matcher(gbnf.as_deref(), &tok)?);
    let mut messages = Vec::new();
    if let Some(system) = &args.system_prompt {
        messages.push(ChatMessage::new("system", system.as_str()));
    }
    let mut cached: Vec<u32> = Vec::new();
    eprintln!(
        "lamina chat: {} — type a message; Ctrl-C stops a reply, Ctrl-D or /exit leaves.",
        ctx.model().name()
    );

    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!("\n> ");
        let _ = std::io::stderr().flush();
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let input = line.trim_end_matches(['\n', '\r']);
        if input.trim() == "/exit" {
            return Ok(());
        }
        if input.trim().is_empty() {
            continue;
        }
        messages.push(ChatMessage::new("user", input));
        let prompt = template.render(&messages, None, true)?;
        let tokens = tok.tokenize(&prompt, true, true);
        if tokens.len() >= ctx.n_ctx() {
            messages.pop();
            eprintln!(
                "lamina: the conversation ({} tokens) no longer fits in the context of {} (raise -c)",
                tokens.len(),
                ctx.n_ctx()
            );
            continue;
        }
        let reply = reply(
            &mut ctx,
            &tok,
            &mut sampler,
            &mut cached,
            &tokens,
            args.n_predict,
        )?;
        messages.push(ChatMessage::new("assistant", reply));
    }
}

/// Decodes what the cache lacks of `tokens`, then generates and prints the reply.
fn reply(
    ctx: &mut Context,
    tok: &Tokenizer,
    sampler: &mut SamplerChain,
    cached: &mut Vec<u32>,
    tokens: &[u32],
    n_predict: i64,
) -> anyhow::Result<String> {
    // Reuse the cached prefix; at least the last token is decoded again to get its logits.
    let keep = cached
        .iter()
        .zip(tokens)
        .take_while(|(a, b)| a == b)
        .count()
        .min(tokens.len() - 1);
    ctx.seq_rm(Some(0), Some(keep as i32), None);
    cached.truncate(keep);
    ctx.decode(&Batch::sequence(&tokens[keep..], keep as i32, 0))?;
    cached.extend_from_slice(&tokens[keep..]);

    sampler.reset_grammar();
    INTERRUPTED.store(false, Ordering::SeqCst);
    GENERATING.store(true, Ordering::SeqCst);
    let mut text = Vec::new();
    let mut out = Utf8Stream::default();
    let mut produced = 0i64;
    let mut batch = Batch::default();
    let result = (|| -> anyhow::Result<()> {
        while !INTERRUPTED.load(Ordering::SeqCst) && (n_predict < 0 || produced < n_predict) {
            let token = match sampler.sample(ctx.last_logits().context("no logits")?) {
                Err(lamina_sample::SampleError::GrammarDeadEnd) => {
                    eprintln!("\n(the grammar allows no token here)");
                    break;
                }
                t => t?,
            };
            sampler.accept(token)?;
            if tok.is_eog(token) {
                break;
            }
            let piece = tok.piece(token, false);
            text.extend_from_slice(piece);
            emit(out.push(piece))?;
            let _ = std::io::stdout().flush();
            produced += 1;
            if cached.len() >= ctx.n_ctx() {
                eprintln!(
                    "\nlamina: the context of {} tokens is full; the reply stops here",
                    ctx.n_ctx()
                );
                break;
            }
            batch.clear();
            batch.push(token, cached.len() as i32, 0, true);
            ctx.decode(&batch)?;
            cached.push(token);
        }
        Ok(())
    })();
    GENERATING.store(false, Ordering::SeqCst);
    emit(&(out.finish() + "\n"))?;
    if INTERRUPTED.swap(false, Ordering::SeqCst) {
        eprintln!("(stopped)");
    }
    result?;
    Ok(String::from_utf8_lossy(&text).into_owned())
}
