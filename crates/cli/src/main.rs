//! `lamina-cli` is the `lamina` program: one subcommand per user task (pull, inspect, …), each
//! in its own module under `cmd/`, with flags that follow llama.cpp's where one exists. It owns
//! argument parsing, model-name resolution and terminal output; the work itself lives in the
//! library crates.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "lamina",
    version,
    about = "LLM inference on GGUF models",
    propagate_version = true
)]
struct Cli {
    /// List the devices and exit (same as `lamina devices`).
    #[arg(long = "list-devices")]
    list_devices: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// List the compute devices (`LAMINA_CPU_DEVICES=N` splits the CPU into N virtual devices).
    Devices(cmd::devices::DevicesArgs),
    /// Fetch a known model into the model cache.
    Pull(cmd::pull::PullArgs),
    /// Print a GGUF file's metadata, tensor table and totals.
    Inspect(cmd::inspect::InspectArgs),
    /// Generate text from a prompt.
    Run(cmd::run::RunArgs),
    /// Chat with the model through its chat template.
    Chat(cmd::chat::ChatArgs),
    /// Perplexity of a text (llama-perplexity's method), or KL divergence against base logits.
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Print the logits of a batch of tokens (every position with --all), as text or JSON.
    Logits(cmd::logits::LogitsArgs),
    /// Measure prompt and generation speed (llama-bench's flags and output).
    Bench(cmd::bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve {
        /// Model: a GGUF path or a known model name (pulled on first use).
        #[arg(short = 'm', long, default_value = lamina_gguf::pull::DEFAULT_MODEL)]
        model: String,
        /// Threads to compute with (default: all cores).
        #[arg(short = 't', long)]
        threads: Option<usize>,
        #[command(flatten)]
        devices: cmd::DeviceArgs,
        #[command(flatten)]
        cache: cmd::CacheArgs,
        #[command(flatten)]
        args: Box<cmd::serve::ServeArgs>,
    },
    /// Tokenize text with a model's vocabulary (vocab-only files work too).
    Tokenize {
        /// Model: a GGUF path or a known model name.
        #[arg(short = 'm', long, default_value = lamina_gguf::pull::DEFAULT_MODEL)]
        model: String,
        #[command(flatten)]
        args: cmd::tokenize::TokenizeArgs,
    },
}

fn main() -> ExitCode {
    let args = cmd::serve::normalize_llama_flags(std::env::args_os());
    if args.get(1).and_then(|a| a.to_str()) == Some("serve")
        && let Some(flag) = cmd::serve::unsupported_llama_flag(&args[2..])
    {
        eprintln!(
            "error: lamina serve does not support llama-server's flag {flag} (yet); see `lamina serve --help`"
        );
        return ExitCode::from(2);
    }
    let cli = Cli::parse_from(args);
    let command = match (cli.command, cli.list_devices) {
        (Some(c), _) => c,
        (None, true) => Command::Devices(cmd::devices::DevicesArgs::default()),
        (None, false) => {
            use clap::CommandFactory;
            let _ = Cli::command().print_help();
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Devices(args) => cmd::devices::run(args),
        Command::Pull(args) => cmd::pull::run(&args),
        Command::Run(args) => cmd::run::run(&args),
        Command::Chat(args) => cmd::chat::run(&args),
        Command::Perplexity(args) => cmd::perplexity::run(&args),
        Command::Bench(args) => cmd::bench::run(&args),
        Command::Logits(args) => cmd::logits::run(&args),
        Command::Serve {
            model,
            threads,
            devices,
            cache,
            args,
        } => serve(&model, threads, &devices, &cache, &args),
        Command::Tokenize { model, args } => {
            cmd::resolve_model(&model).and_then(|path| cmd::tokenize::run(&args, &path))
        }
        Command::Inspect(args) => {
            cmd::resolve_model(&args.model).and_then(|path| cmd::inspect::run(&args, &path))
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(
    model: &str,
    threads: Option<usize>,
    devices: &cmd::DeviceArgs,
    cache: &cmd::CacheArgs,
    args: &cmd::serve::ServeArgs,
) -> anyhow::Result<()> {
    let mut params = lamina_model::ContextParams {
        n_ctx: args.ctx_size as usize,
        n_ubatch: args.ubatch_size.unwrap_or(args.batch_size).max(1) as usize,
        n_seq_max: args.parallel.max(1) as usize,
        ..Default::default()
    };
    cache.apply(&mut params)?;
    let mut config = args.config()?;
    let choice = cmd::model_engine::TemplateChoice::from_flags(args)?;
    let path = if args.offline && !std::path::Path::new(model).is_file() {
        // --offline: a known model must be in the cache already; nothing is fetched.
        lamina_gguf::pull::cached_model_path(model).ok_or_else(|| {
            anyhow::anyhow!("--offline: model {model:?} is not a file and not in the cache")
        })?
    } else {
        cmd::resolve_model(model)?
    };
    config.model_path = path.display().to_string();
    let path = path.display().to_string();
    let loaded = cmd::load_with(&path, threads, params, devices)?;
    let devices = devices.clone();
    // After --sleep-idle-seconds the context is dropped; this loads it again.
    let reload: cmd::model_engine::Reload =
        Box::new(move || Ok(cmd::load_with(&path, threads, params, &devices)?.context));
    let engine =
        cmd::model_engine::ModelEngine::with_template(loaded.context, loaded.tokenizer, &choice)?
            .kv_unified(args.kv_unified)
            .with_reload(reload);
    cmd::serve::run(args, config, Box::new(engine))
}
