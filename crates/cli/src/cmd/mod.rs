//! One module per subcommand, plus what they share.

pub mod bench;
pub mod chat;
pub mod cluster;
pub mod devices;
pub mod imatrix;
pub mod inspect;
pub mod logits;
pub mod model_engine;
pub mod perplexity;
pub mod pull;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod tokenize;

use std::path::PathBuf;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use lamina_gguf::pull::{self as hub, PullProgress};
use lamina_tokenizer::Tokenizer;

/// Draws a pull's progress on stderr.
pub struct BarProgress {
    bar: ProgressBar,
}

impl BarProgress {
    pub fn new() -> BarProgress {
        let bar = ProgressBar::new(0);
        bar.set_style(
            ProgressStyle::with_template(
                "{msg:40} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec})",
            )
            .expect("static template")
            .progress_chars("=> "),
        );
        BarProgress { bar }
    }

    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl PullProgress for BarProgress {
    fn stage(&mut self, message: &str) {
        self.bar.set_message(message.to_string());
        self.bar.tick();
    }

    fn bytes(&mut self, done: u64, total: u64) {
        self.bar.set_length(total);
        self.bar.set_position(done);
    }
}

/// `-m` takes a path or a known model name; a known model is pulled on first use.
pub fn resolve_model(name_or_path: &str) -> anyhow::Result<PathBuf> {
    let mut progress = BarProgress::new();
    let path = hub::resolve_model(name_or_path, &mut progress);
    progress.finish();
    path.with_context(|| format!("cannot load model {name_or_path:?}"))
}

/// Writes `text` to stdout. A closed pipe (`lamina inspect … | head`) ends output quietly
/// instead of panicking, as `print!` would.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => Ok(other?),
    }
}

/// A count flag's value: a clear message for a negative one, rather than clap's "unexpected
/// argument".
pub fn non_negative(s: &str) -> Result<usize, String> {
    match s.parse::<i64>() {
        Ok(n) if n < 0 => Err(format!("{n} is negative; it must be 0 or more")),
        Ok(n) => usize::try_from(n).map_err(|_| format!("{n} is too large")),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}

pub use serve::n_predict;

/// Model and context flags shared by the commands that run a model (llama.cpp's names).
#[derive(clap::Args, Debug, Clone)]
pub struct LoadArgs {
    /// Model: a GGUF path or a known model name (pulled on first use).
    #[arg(short = 'm', long, default_value = hub::DEFAULT_MODEL)]
    pub model: String,
    /// Context size in tokens (0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096, allow_negative_numbers = true, value_parser = non_negative)]
    pub ctx_size: usize,
    /// Threads to compute with (default: all cores).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// Most tokens handed to the model in one call (the prompt is fed in such batches).
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

/// KV cache and attention flags (llama.cpp's `-ctk`, `-ctv`, `-fa`).
#[derive(clap::Args, Debug, Clone)]
pub struct CacheArgs {
    /// K cache type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl (`-ctk`).
    #[arg(
        long = "cache-type-k",
        visible_alias = "cache-type",
        default_value = "f16"
    )]
    pub cache_type_k: String,
    /// V cache type, as -ctk; a quantized V needs flash attention (`-ctv`).
    #[arg(long = "cache-type-v", default_value = "f16")]
    pub cache_type_v: String,
    /// Flash attention: on, off or auto (`-fa`; auto is on, as llama.cpp's default on a CPU).
    #[arg(long = "flash-attn", default_value = "auto")]
    pub flash_attn: String,
}

impl Default for CacheArgs {
    fn default() -> CacheArgs {
        CacheArgs {
            cache_type_k: "f16".into(),
            cache_type_v: "f16".into(),
            flash_attn: "auto".into(),
        }
    }
}

impl CacheArgs {
    /// Sets the cache types and flash attention of `params`.
    pub fn apply(&self, params: &mut lamina_model::ContextParams) -> anyhow::Result<()> {
        params.type_k = kv_type("--cache-type-k", &self.cache_type_k)?;
        params.type_v = kv_type("--cache-type-v", &self.cache_type_v)?;
        params.flash_attn = flash_attn(&self.flash_attn)?;
        Ok(())
    }
}

/// The `-fa` value `name` names.
pub fn flash_attn(name: &str) -> anyhow::Result<lamina_model::FlashAttn> {
    name.parse::<lamina_model::FlashAttn>()
        .map_err(|_| anyhow::anyhow!("--flash-attn {name:?}: use on, off or auto"))
}

/// Where the model runs (llama.cpp's names). `LAMINA_CPU_DEVICES=N` exposes the CPU as N
/// devices `CPU0…`; the first is the host (input layer, layers not offloaded).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct DeviceArgs {
    /// Devices to offload layers to, comma-separated (`lamina devices` lists them; `none`: host
    /// only). Default: all.
    #[arg(long = "device", value_name = "DEV1,DEV2")]
    pub device: Option<String>,
    /// How to spread the model over several devices: none (all on --main-gpu) or layer (`-sm`).
    #[arg(
        long = "split-mode",
        value_name = "none|layer|row",
        default_value = "layer"
    )]
    pub split_mode: String,
    /// Share of the layers per device, e.g. 3,1 (`-ts`; default: by free memory).
    #[arg(long = "tensor-split", value_name = "N0,N1,...", value_delimiter = ',')]
    pub tensor_split: Vec<f32>,
    /// Layers to offload, the output layer counting as one: a number or `all` (`-ngl`).
    #[arg(
        long = "n-gpu-layers",
        visible_alias = "gpu-layers",
        value_name = "N|all"
    )]
    pub n_gpu_layers: Option<String>,
    /// The device used with --split-mode none (`-mg`).
    #[arg(long = "main-gpu", default_value_t = 0)]
    pub main_gpu: usize,
    /// With several devices, run one micro-batch at a time instead of pipelining them.
    #[arg(long = "no-pipeline")]
    pub no_pipeline: bool,
    /// Copy the weights into memory instead of using the file's mapping in place (slower to
    /// load; as llama.cpp's --no-mmap).
    #[arg(long = "no-mmap")]
    pub no_mmap: bool,
    /// Do not pack weights for the CPU kernels (as llama.cpp's --no-repack): less memory (the
    /// packed copy is as large as the packed tensors), slower batches and decode steps.
    #[arg(long = "no-repack")]
    pub no_repack: bool,
}

impl DeviceArgs {
    /// Whether to open the GPU backend: `--device` names a WGPU device, or
    /// `LAMINA_WGPU_DEVICES` is set. (Not by default yet: opening Vulkan costs start-up time
    /// and, with Mesa, prints driver notes on stderr.)
    pub fn wants_gpu(&self) -> bool {
        self.device
            .as_deref()
            .is_some_and(|d| d.to_ascii_lowercase().contains("wgpu"))
            || std::env::var_os(lamina_wgpu::DEVICES_ENV).is_some()
    }

    /// The placement these flags ask for over `available` devices (the first is the host).
    pub fn placement(
        &self,
        available: &[std::sync::Arc<dyn lamina_backend::Device>],
    ) -> anyhow::Result<lamina_model::Placement> {
        let host = available
            .first()
            .cloned()
            .context("no compute device is available")?;
        let devices = match &self.device {
            Some(list) => lamina_model::placement::devices_by_name(list, available)?,
            // As llama.cpp: offload to the GPUs when there are any (a software adapter only
            // when named), else spread over the CPU devices.
            None => {
                let gpus: Vec<_> = available
                    .iter()
                    .filter(|d| {
                        matches!(
                            d.device_type(),
                            lamina_backend::DeviceType::Gpu | lamina_backend::DeviceType::IGpu
                        )
                    })
                    .cloned()
                    .collect();
                if gpus.is_empty() {
                    available
                        .iter()
                        .filter(|d| d.device_type() == lamina_backend::DeviceType::Cpu)
                        .cloned()
                        .collect()
                } else {
                    gpus
                }
            }
        };
        let split_mode: lamina_model::SplitMode = self.split_mode.parse()?;
        let n_gpu_layers = match self.n_gpu_layers.as_deref() {
            None | Some("all") | Some("auto") | Some("-1") => None,
            Some(n) => Some(n.parse::<usize>().map_err(|_| {
                anyhow::anyhow!("--n-gpu-layers {n:?}: use a number of layers or `all`")
            })?),
        };
        Ok(lamina_model::Placement {
            host,
            devices,
            split_mode,
            tensor_split: self.tensor_split.clone(),
            n_gpu_layers,
            main_gpu: self.main_gpu,
        })
    }
}

/// Sampling flags (llama.cpp's names and defaults).
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature (0 or less: greedy).
    #[arg(long, default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    #[arg(long = "top-k", default_value_t = 40, allow_negative_numbers = true)]
    pub top_k: i32,
    #[arg(long = "top-p", default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long = "min-p", default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long = "typical", default_value_t = 1.0)]
    pub typical: f32,
    #[arg(long = "repeat-penalty", default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens the penalties look back over (-1: the context size).
    #[arg(
        long = "repeat-last-n",
        default_value_t = 64,
        allow_negative_numbers = true
    )]
    pub repeat_last_n: i32,
    #[arg(long = "presence-penalty", default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long = "frequency-penalty", default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Random seed (-1: random).
    #[arg(short = 's', long, default_value_t = -1, allow_negative_numbers = true)]
    pub seed: i64,
}

/// Constrained output (llama.cpp's `--grammar`, `--grammar-file`, `-j`, `-jf`).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct GrammarArgs {
    /// A GBNF grammar the generated text must follow (llama.cpp's syntax).
    #[arg(long, group = "constraint")]
    pub grammar: Option<String>,
    /// Read the GBNF grammar from a file.
    #[arg(long = "grammar-file", group = "constraint")]
    pub grammar_file: Option<PathBuf>,
    /// A JSON Schema the generated text must satisfy (`{}` for any JSON object).
    #[arg(short = 'j', long = "json-schema", group = "constraint")]
    pub json_schema: Option<String>,
    /// Read the JSON Schema from a file (`-jf`).
    #[arg(long = "json-schema-file", group = "constraint")]
    pub json_schema_file: Option<PathBuf>,
}

impl GrammarArgs {
    /// The constraint as GBNF text, if one was given.
    pub fn gbnf(&self) -> anyhow::Result<Option<String>> {
        let read = |f: &PathBuf| {
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))
        };
        let schema = |text: &str| -> anyhow::Result<String> {
            let value: serde_json::Value =
                serde_json::from_str(text).context("the JSON schema is not valid JSON")?;
            lamina_grammar::json_schema::json_schema_to_grammar(
                &value,
                &lamina_grammar::json_schema::SchemaOptions::default(),
            )
            .context("cannot convert the JSON schema to a grammar")
        };
        Ok(match self {
            GrammarArgs {
                grammar: Some(g), ..
            } => Some(g.clone()),
            GrammarArgs {
                grammar_file: Some(f),
                ..
            } => Some(read(f)?),
            GrammarArgs {
                json_schema: Some(s),
                ..
            } => Some(schema(s)?),
            GrammarArgs {
                json_schema_file: Some(f),
                ..
            } => Some(schema(&read(f)?)?),
            _ => None,
        })
    }

    /// A matcher for the constraint over `tok`'s vocabulary, if one was given.
    /// [`GrammarArgs::gbnf`] with its syntax checked (token names unresolved), so that a
    /// bad grammar or schema is refused before the model loads.
    pub fn checked_gbnf(&self) -> anyhow::Result<Option<String>> {
        let src = self.gbnf()?;
        if let Some(src) = &src {
            lamina_grammar::Grammar::parse(src, "root", Some(&|_: &str| Some(0)))?;
        }
        Ok(src)
    }
}

/// A matcher for GBNF `src` over `tok`'s vocabulary, `<name>` tokens resolved by it.
pub fn grammar_matcher(
    src: Option<&str>,
    tok: &Tokenizer,
) -> anyhow::Result<Option<lamina_grammar::Matcher>> {
    let Some(src) = src else {
        return Ok(None);
    };
    let resolve = |text: &str| {
        let t = tok.tokenize(text, false, true);
        (t.len() == 1).then(|| t[0])
    };
    let grammar = lamina_grammar::Grammar::parse(src, "root", Some(&resolve))?;
    Ok(Some(lamina_grammar::Matcher::new(
        &grammar,
        std::sync::Arc::new(grammar_vocab(tok)),
    )))
}

/// The vocabulary as grammars see it: pieces with special tokens rendered.
pub fn grammar_vocab(tok: &Tokenizer) -> lamina_grammar::TokenIndex {
    let pieces = (0..tok.n_vocab() as u32)
        .map(|t| tok.token_to_piece(t, true))
        .collect();
    lamina_grammar::TokenIndex::new(pieces, |t| tok.is_eog(t))
}

impl SamplingArgs {
    pub fn params(&self, n_ctx: usize) -> lamina_sample::SamplingParams {
        let mut p = lamina_sample::SamplingParams {
            temp: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typ_p: self.typical,
            penalty_repeat: self.repeat_penalty,
            penalty_last_n: self.repeat_last_n,
            penalty_present: self.presence_penalty,
            penalty_freq: self.frequency_penalty,
            ..Default::default()
        };
        if let Ok(seed) = u32::try_from(self.seed) {
            p.seed = seed;
        }
        p.with_n_ctx(n_ctx as u32)
    }
}

/// A model with its tokenizer and a context, ready to generate.
pub struct Loaded {
    pub context: lamina_model::Context,
    pub tokenizer: lamina_tokenizer::Tokenizer,
}

/// Resolves `-m`, loads the model onto the CPU and creates a context.
pub fn load(args: &LoadArgs) -> anyhow::Result<Loaded> {
    anyhow::ensure!(args.batch_size > 0, "-b must be at least 1");
    anyhow::ensure!(args.ubatch_size > 0, "-ub must be at least 1");
    let mut params = lamina_model::ContextParams {
        n_ctx: args.ctx_size,
        n_ubatch: args.ubatch_size,
        n_seq_max: 1,
        ..Default::default()
    };
    args.cache.apply(&mut params)?;
    load_with(&args.model, args.threads, params, &args.devices)
}

/// Loads model `name_or_path` onto the CPU devices (`LAMINA_CPU_DEVICES`, `threads` threads in
/// all) as `devices` places it, and creates a context.
pub fn load_with(
    name_or_path: &str,
    threads: Option<usize>,
    mut params: lamina_model::ContextParams,
    devices: &DeviceArgs,
) -> anyhow::Result<Loaded> {
    let (model, path) = load_model(name_or_path, threads, devices)?;
    let tokenizer = lamina_tokenizer::Tokenizer::from_gguf(&model.file)
        .with_context(|| format!("cannot load the vocabulary of {}", path.display()))?;
    params.pipeline_parallel = !devices.no_pipeline;
    if params.n_threads == 0 {
        params.n_threads = threads.unwrap_or(lamina_cpu::CpuConfig::from_env()?.threads);
    }
    let context = lamina_model::Context::new(std::sync::Arc::new(model), params)?;
    // As llama.cpp: a context longer than the model was trained on is allowed, with a warning.
    let n_ctx_seq = context.n_ctx() / context.params().n_seq_max.max(1);
    let n_ctx_train = context.model().hparams.n_ctx_train as usize;
    if n_ctx_train > 0 && n_ctx_seq > n_ctx_train {
        eprintln!(
            "warning: n_ctx_seq ({n_ctx_seq}) > n_ctx_train ({n_ctx_train}) -- possible training \
             context overflow"
        );
    }
    Ok(Loaded { context, tokenizer })
}

/// Resolves `name_or_path` and loads the model (without its tokenizer) onto the CPU devices
/// (`LAMINA_CPU_DEVICES`, `threads` threads in all) as `devices` places it.
pub fn load_model(
    name_or_path: &str,
    threads: Option<usize>,
    devices: &DeviceArgs,
) -> anyhow::Result<(lamina_model::Model, PathBuf)> {
    use std::sync::Arc;
    let path = resolve_model(name_or_path)?;
    let mut config = lamina_cpu::CpuConfig::from_env()?;
    if let Some(t) = threads {
        anyhow::ensure!(t > 0, "-t must be at least 1");
        config = config.with_threads(t);
    }
    let reg = lamina_cpu::CpuBackendReg::new(config)?;
    let mut available: Vec<Arc<dyn lamina_backend::Device>> = reg
        .cpu_devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn lamina_backend::Device>)
        .collect();
    // Under mpirun: the other ranks' devices.
    available.extend(lamina_mpi::remote_devices());
    if devices.wants_gpu() {
        let gpus = lamina_wgpu::WgpuBackendReg::from_env()?;
        for p in gpus.problems() {
            eprintln!(
                "warning: GPU adapter {} could not be opened: {}",
                p.name, p.message
            );
        }
        available.extend(
            gpus.wgpu_devices()
                .iter()
                .map(|d| d.clone() as Arc<dyn lamina_backend::Device>),
        );
    }
    let placement = devices.placement(&available)?;
    // A bar for weights copied to a device, drawn only on a terminal.
    let bar = ProgressBar::with_draw_target(
        Some(0),
        if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            indicatif::ProgressDrawTarget::stderr()
        } else {
            indicatif::ProgressDrawTarget::hidden()
        },
    );
    bar.set_style(
        ProgressStyle::with_template("loading weights [{bar:30}] {bytes}/{total_bytes}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let progress_bar = bar.clone();
    if devices.no_repack {
        lamina_cpu::set_repack(false);
    }
    let options = lamina_model::LoadOptions {
        no_mmap: devices.no_mmap,
        progress: Some(Arc::new(move |done, total| {
            progress_bar.set_length(total);
            progress_bar.set_position(done);
        })),
    };
    let model = lamina_model::Model::load_with_options(&path, &placement, &options)
        .with_context(|| format!("cannot load {}", path.display()));
    bar.finish_and_clear();
    let model = model?;
    Ok((model, path))
}

/// The KV cache type that `flag`'s value `name` names.
pub fn kv_type(flag: &str, name: &str) -> anyhow::Result<lamina_core::DType> {
    match lamina_core::DType::from_name(name) {
        Some(t) if lamina_model::KvFormat::type_allowed(t) => Ok(t),
        _ => anyhow::bail!(
            "{flag} {name:?}: use f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1 or iq4_nl"
        ),
    }
}

/// Turns token pieces (bytes that may split a UTF-8 character) into printable text. Its
/// buffers are kept, so streaming a token allocates nothing.
#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
    text: String,
}

impl Utf8Stream {
    /// Adds `bytes`; returns the text that is complete so far.
    pub fn push(&mut self, bytes: &[u8]) -> &str {
        self.pending.extend_from_slice(bytes);
        self.text.clear();
        match std::str::from_utf8(&self.pending) {
            Ok(text) => self.text.push_str(text),
            // An incomplete character at the end waits for more bytes.
            Err(e) if e.error_len().is_none() => {
                let valid = e.valid_up_to();
                self.text
                    .push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                self.pending.drain(..valid);
                return &self.text;
            }
            // An invalid one is replaced now.
            Err(_) => self.text.push_str(&String::from_utf8_lossy(&self.pending)),
        }
        self.pending.clear();
        &self.text
    }

    /// Whatever is left (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}
