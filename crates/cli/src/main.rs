//! `lamina-cli` is the `lamina` program: one subcommand per user task (pull, inspect, …), each
//! in its own module under `cmd/`, with flags that follow llama.cpp's where one exists. It owns
//! argument parsing, model-name resolution and terminal output; the work itself lives in the
//! library crates.

mod cmd;

use std::process::ExitCode;
use std::sync::Arc;

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
    /// Quantize a GGUF model (llama-quantize's arguments, type names and output bytes).
    Quantize(cmd::quantize::QuantizeArgs),
    /// Compute an importance matrix of a text (llama-imatrix's method and file format).
    Imatrix(cmd::imatrix::ImatrixArgs),
    /// Serve the model over an OpenAI-compatible HTTP API.
    Serve {
        /// Model: a GGUF path or a known model name (pulled on first use). Without it, the
        /// server is a router over every model of the cache and `--models-dir`.
        #[arg(short = 'm', long)]
        model: Option<String>,
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
    let threads = cmd::cluster::threads_flag(&args);
    let gpu = cmd::cluster::wants_gpu(&args);
    let cli = Cli::parse_from(args);
    // Under `mpirun`: rank 0 goes on with the command, the other ranks serve their devices.
    match cmd::cluster::start(threads, gpu) {
        Ok(None) => {}
        Ok(Some(code)) => return code,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::FAILURE;
        }
    }
    let code = run_command(cli);
    if let Some(cluster) = lamina_mpi::cluster()
        && let Err(e) = cluster.shutdown()
    {
        // A rank that does not answer would hold up a clean MPI finish forever.
        eprintln!("error: the other ranks did not stop cleanly: {e}; ending the MPI job");
        cluster.abort(1);
    }
    code
}

fn run_command(cli: Cli) -> ExitCode {
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
        Command::Quantize(args) => cmd::quantize::run(&args),
        Command::Imatrix(args) => cmd::imatrix::run(&args),
        Command::Logits(args) => cmd::logits::run(&args),
        Command::Serve {
            model,
            threads,
            devices,
            cache,
            args,
        } => match model {
            Some(model) => serve(&model, threads, &devices, &cache, &args),
            None => serve_router(threads, &devices, &cache, &args),
        },
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

/// The models router mode offers: the cache's GGUF files and `--models-dir`'s, named by
/// file stem, known models also by their short name.
fn scan_models(
    models_dir: Option<&std::path::Path>,
    preset: Option<&std::path::Path>,
) -> Vec<lamina_server::model_router::ModelEntry> {
    use lamina_server::model_router::ModelEntry;
    let mut dirs = vec![lamina_gguf::pull::cache_dir()];
    dirs.extend(models_dir.map(std::path::Path::to_path_buf));
    let mut out: Vec<ModelEntry> = Vec::new();
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<std::path::PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf") && p.is_file())
            .collect();
        files.sort();
        for path in files {
            let file = path
                .file_name()
                .and_then(|f| f.to_str())
                .unwrap_or_default();
            let id = file.trim_end_matches(".gguf").to_string();
            if out.iter().any(|m| m.id == id) {
                continue;
            }
            let aliases = lamina_gguf::pull::KNOWN_MODELS
                .iter()
                .filter(|k| k.file_name == file)
                .map(|k| k.name.to_string())
                .collect();
            out.push(ModelEntry { id, aliases, path });
        }
    }
    if let Some(p) = preset {
        out.extend(preset_models(p));
    }
    out
}

/// llama-server's `--models-preset` INI: one `[name]` section per model; `model = PATH`
/// says where it is (`hf-repo = …` names a download Lamina cannot make: listed, not loadable).
fn preset_models(path: &std::path::Path) -> Vec<lamina_server::model_router::ModelEntry> {
    let Ok(text) = std::fs::read_to_string(path) else {
        eprintln!(
            "lamina serve: cannot read --models-preset {}",
            path.display()
        );
        return Vec::new();
    };
    let mut out: Vec<lamina_server::model_router::ModelEntry> = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            out.push(lamina_server::model_router::ModelEntry {
                id: name.trim().to_string(),
                aliases: Vec::new(),
                path: std::path::PathBuf::new(),
            });
        } else if let (Some(m), Some((k, v))) = (out.last_mut(), line.split_once('='))
            && k.trim() == "model"
        {
            m.path = std::path::PathBuf::from(v.trim());
        }
    }
    out
}

/// The context each served model gets: `-c` cells for `-np` slots, `-ub` per pass, the
/// cache flags.
fn serve_context_params(
    args: &cmd::serve::ServeArgs,
    cache: &cmd::CacheArgs,
) -> anyhow::Result<lamina_model::ContextParams> {
    let mut params = lamina_model::ContextParams {
        n_ctx: args.ctx_size as usize,
        n_ubatch: args.ubatch_size.min(args.batch_size).max(1) as usize,
        n_seq_max: args.parallel.max(1) as usize,
        // As llama-server: without `-kvu`, each slot has a stream of cells of its own.
        kv_unified: args.kv_unified,
        ..Default::default()
    };
    cache.apply(&mut params)?;
    Ok(params)
}

/// `lamina serve` without `-m`: llama-server's router mode over the cached models.
fn serve_router(
    threads: Option<usize>,
    devices: &cmd::DeviceArgs,
    cache: &cmd::CacheArgs,
    args: &cmd::serve::ServeArgs,
) -> anyhow::Result<()> {
    use lamina_server::model_router::{Loader, RouterConfig, Scan};
    let params = serve_context_params(args, cache)?;
    let config = args.config()?;
    let choice = cmd::model_engine::TemplateChoice::from_flags(args)?;
    let models_dir = args.models_dir.clone();
    let preset = args.models_preset.clone();
    let scan: Scan = Arc::new(move || scan_models(models_dir.as_deref(), preset.as_deref()));
    if scan().is_empty() && !args.offline {
        // A fresh machine: the default model, so that `lamina serve` answers at once.
        cmd::resolve_model(lamina_gguf::pull::DEFAULT_MODEL)?;
    }
    let devices = devices.clone();
    let loader: Loader = Arc::new(move |m| {
        let path = m.path.display().to_string();
        let loaded =
            cmd::load_with(&path, threads, params, &devices).map_err(|e| format!("{e:#}"))?;
        let engine = cmd::model_engine::ModelEngine::with_template(
            loaded.context,
            loaded.tokenizer,
            &choice,
        )
        .map_err(|e| format!("{e:#}"))?;
        Ok(Box::new(engine) as Box<dyn lamina_server::Engine>)
    });
    let default_model = scan_models(args.models_dir.as_deref(), None)
        .into_iter()
        .find(|m| {
            m.aliases
                .iter()
                .any(|a| a == lamina_gguf::pull::DEFAULT_MODEL)
        })
        .map(|m| m.id);
    let router = RouterConfig {
        scan,
        models_max: args.models_max,
        autoload: !args.no_models_autoload,
        default_model,
    };

    eprintln!(
        "lamina serve: router mode over the cached models (--models-max {})",
        args.models_max
    );
    lamina_server::serve_router_blocking(router, loader, config)?;
    Ok(())
}

fn serve(
    model: &str,
    threads: Option<usize>,
    devices: &cmd::DeviceArgs,
    cache: &cmd::CacheArgs,
    args: &cmd::serve::ServeArgs,
) -> anyhow::Result<()> {
    let params = serve_context_params(args, cache)?;
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
            .with_reload(reload);
    cmd::serve::run(args, config, Box::new(engine), cmd::cluster::lost_rank())
}
