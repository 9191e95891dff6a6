//! `lamina serve`: the OpenAI-compatible HTTP server (crate `lamina-server`).
//!
//! `main.rs` resolves `-m`, builds the engine with `--ctx-size` cells for `--parallel`
//! sequences, and calls [`run`]. llama-server spells `--parallel` as `-np`, which clap
//! cannot express as a short flag: pass the raw arguments through
//! [`normalize_llama_flags`] before parsing.

use std::ffi::OsString;
use std::time::Duration;

use lamina_server::{Engine, ServerConfig};

/// Flags as llama-server has them (`-m` is the caller's).
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// KV cache cells in all, shared evenly by the slots.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 4096)]
    pub ctx_size: u32,
    /// Parallel slots (`-np`): requests decoded together in each batch.
    #[arg(long = "parallel", default_value_t = 1)]
    pub parallel: u32,
    /// Require `Authorization: Bearer KEY` (all endpoints but `/` and `/health`); several
    /// keys may be given, comma-separated.
    #[arg(long = "api-key", env = "LAMINA_API_KEY")]
    pub api_key: Option<String>,
    /// A file of API keys, one per line (`#` starts a comment line).
    #[arg(long = "api-key-file", value_name = "FNAME")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Names the model answers to, comma-separated (`/v1/models` reports them).
    #[arg(short = 'a', long = "alias")]
    pub alias: Option<String>,
    /// Tags reported by `/v1/models`, comma-separated.
    #[arg(long = "tags")]
    pub tags: Option<String>,
    /// Default temperature of requests that give none.
    #[arg(long = "temp", visible_alias = "temperature")]
    pub temp: Option<f32>,
    /// Default seed of requests that give none (-1: random).
    #[arg(short = 's', long = "seed", allow_negative_numbers = true)]
    pub seed: Option<i64>,
    /// Default top-k of requests that give none.
    #[arg(long = "top-k")]
    pub top_k: Option<i32>,
    /// Default top-p of requests that give none.
    #[arg(long = "top-p")]
    pub top_p: Option<f32>,
    /// Default min-p of requests that give none.
    #[arg(long = "min-p")]
    pub min_p: Option<f32>,
    /// Default repeat penalty of requests that give none.
    #[arg(long = "repeat-penalty")]
    pub repeat_penalty: Option<f32>,
    /// Default penalty window of requests that give none (-1: the context).
    #[arg(long = "repeat-last-n", allow_negative_numbers = true)]
    pub repeat_last_n: Option<i32>,
    /// Default presence penalty of requests that give none.
    #[arg(long = "presence-penalty")]
    pub presence_penalty: Option<f32>,
    /// Default frequency penalty of requests that give none.
    #[arg(long = "frequency-penalty")]
    pub frequency_penalty: Option<f32>,
    /// Tokens to generate when a request says nothing (-1: no limit).
    #[arg(
        short = 'n',
        long = "n-predict",
        visible_alias = "predict",
        allow_negative_numbers = true,
        value_parser = n_predict
    )]
    pub n_predict: Option<i64>,
    /// Serve `/slots` (the default).
    #[arg(long = "slots", overrides_with = "no_slots")]
    pub slots: bool,
    /// Answer `/slots` with 501.
    #[arg(long = "no-slots")]
    pub no_slots: bool,
    /// Serve Prometheus metrics at `/metrics` (off by default, as in llama-server).
    #[arg(long = "metrics")]
    pub metrics: bool,
    /// Do not serve the chat page at `/`.
    #[arg(long = "no-ui", visible_alias = "no-webui")]
    pub no_ui: bool,
    /// Serve the chat page at `/` (the default).
    #[arg(long = "ui", visible_alias = "webui", overrides_with = "no_ui")]
    pub ui: bool,
    /// Allowed CORS origins: `*` (any; the default), `localhost`, or the header's literal
    /// value. With server tools or MCP servers on, the default is `localhost`.
    #[arg(long = "cors-origins")]
    pub cors_origins: Option<String>,
    /// Built-in server tools to offer at `/tools`: `all`, or a comma list of read_file,
    /// write_file, edit_file, grep_search, file_glob_search, exec_shell_command, ...
    /// They act on this machine: never expose such a server to untrusted clients.
    #[arg(long = "tools")]
    pub tools: Option<String>,
    /// Where server tools run: the host (default), `ssh:HOST`, `docker:IMAGE`, ...
    #[arg(long = "tools-runtime")]
    pub tools_runtime: Option<String>,
    /// Lamina's addition: the tools may only touch files under this folder.
    #[arg(long = "tools-sandbox", value_name = "DIR")]
    pub tools_sandbox: Option<std::path::PathBuf>,
    /// MCP servers whose tools `/tools` offers, from a config file (`mcpServers`).
    #[arg(long = "mcp-servers-config", value_name = "FILE")]
    pub mcp_servers_config: Option<std::path::PathBuf>,
    /// MCP servers as inline JSON.
    #[arg(long = "mcp-servers-json", value_name = "JSON")]
    pub mcp_servers_json: Option<String>,
    /// Methods a CORS preflight allows.
    #[arg(long = "cors-methods", default_value = "GET, POST, DELETE, OPTIONS")]
    pub cors_methods: String,
    /// Headers a CORS preflight allows.
    #[arg(long = "cors-headers", default_value = "*")]
    pub cors_headers: String,
    /// Do not allow credentials in cross-origin requests.
    #[arg(long = "no-cors-credentials")]
    pub no_cors_credentials: bool,
    /// Allow credentials in cross-origin requests (the default).
    #[arg(long = "cors-credentials", overrides_with = "no_cors_credentials")]
    pub cors_credentials: bool,
    /// Run chat templates as Jinja (the default).
    #[arg(long = "jinja", overrides_with = "no_jinja")]
    pub jinja: bool,
    /// Use llama.cpp's built-in chat formats instead of Jinja (tools are then refused).
    #[arg(long = "no-jinja")]
    pub no_jinja: bool,
    /// Chat template: Jinja source or one of llama.cpp's built-in names (`chatml`,
    /// `llama3`, `gemma`, ...; with `--no-jinja`, any built-in name).
    #[arg(long = "chat-template", value_name = "JINJA_TEMPLATE")]
    pub chat_template: Option<String>,
    /// Chat template read from a file.
    #[arg(long = "chat-template-file", value_name = "FILE")]
    pub chat_template_file: Option<std::path::PathBuf>,
    /// Thinking in chat answers: `on`, `off` or `auto` (as the template decides).
    #[arg(long = "reasoning", default_value = "auto")]
    pub reasoning: String,
    /// Print more, and add llama-server's `__verbose` object to OpenAI-shaped answers.
    #[arg(short = 'v', long = "verbose", visible_alias = "log-verbose")]
    pub verbose: bool,
    /// Never reach the network: models must be in the cache already.
    #[arg(long = "offline")]
    pub offline: bool,
    /// Continuous batching is how the server always runs; accepted for llama-server's
    /// command lines.
    #[arg(long = "cont-batching")]
    pub cont_batching: bool,
    /// Lamina loads no multimodal projector; accepted for llama-server's command lines.
    #[arg(long = "no-mmproj")]
    pub no_mmproj: bool,
    /// Embeddings are always served at `/v1/embeddings`; accepted for llama-server's
    /// command lines.
    #[arg(long = "embedding", visible_alias = "embeddings")]
    pub embedding: bool,
    /// llama.cpp samples on the GPU with this; Lamina samples where it always does,
    /// with the same results. Accepted for llama-server's command lines.
    #[arg(long = "backend-sampling", visible_alias = "backend_sampling")]
    pub backend_sampling: bool,
    /// Unload the model after this many idle seconds; the next request loads it
    /// again (-1: never).
    #[arg(long = "sleep-idle-seconds", allow_negative_numbers = true)]
    pub sleep_idle_seconds: Option<i64>,
    /// Router mode (no `-m`): also serve the GGUF files of this folder.
    #[arg(long = "models-dir", value_name = "DIR")]
    pub models_dir: Option<std::path::PathBuf>,
    /// MiB of host memory that keeps the KV state of prompts leaving their slot, for
    /// later prompts that start the same way (`-cram`; 0: none, the default here).
    #[arg(long = "cache-ram", allow_negative_numbers = true)]
    pub cache_ram: Option<i64>,
    /// Do not move idle slots to the prompt cache when a request starts.
    #[arg(long = "no-cache-idle-slots")]
    pub no_cache_idle_slots: bool,
    /// Move idle slots to the prompt cache when a request starts (the default).
    #[arg(long = "cache-idle-slots", overrides_with = "no_cache_idle_slots")]
    pub cache_idle_slots: bool,
    /// Serve `/cors-proxy?url=` for the chat page's MCP clients (plain HTTP targets).
    #[arg(long = "ui-mcp-proxy", visible_alias = "webui-mcp-proxy")]
    pub ui_mcp_proxy: bool,
    /// Where `POST /slots/{id}?action=save|restore` keep slot files.
    #[arg(long = "slot-save-path", value_name = "DIR")]
    pub slot_save_path: Option<std::path::PathBuf>,
    /// Router mode: models named in an INI file (`[name]` sections with `model = PATH`);
    /// `GET /models?reload=1` reads it again.
    #[arg(long = "models-preset", value_name = "FILE")]
    pub models_preset: Option<std::path::PathBuf>,
    /// Router mode: most models loaded at once (0: no limit).
    #[arg(long = "models-max", default_value_t = 4)]
    pub models_max: usize,
    /// Router mode: load a model only on `POST /models/load`, not on a request naming it.
    #[arg(long = "no-models-autoload")]
    pub no_models_autoload: bool,
    /// Router mode: load a model when a request names it (the default).
    #[arg(long = "models-autoload", overrides_with = "no_models_autoload")]
    pub models_autoload: bool,
    /// Sliding-window layers keep a full-size cache: Lamina's always do (the window is
    /// applied by the attention mask), so this changes nothing.
    #[arg(long = "swa-full")]
    pub swa_full: bool,
    /// Tokens a reasoning block (`<think>`…) may take before its end tag is forced (-1: no
    /// limit, 0: end it at once); a request's `reasoning_budget_tokens` wins.
    #[arg(long = "reasoning-budget", allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-1..))]
    pub reasoning_budget: Option<i32>,
    /// Text forced before the end tag when the reasoning budget runs out.
    #[arg(long = "reasoning-budget-message", value_name = "MESSAGE")]
    pub reasoning_budget_message: Option<String>,
    /// `/infill` prompts in suffix/prefix/middle order instead of prefix/suffix/middle
    /// (for models trained that way).
    #[arg(long = "spm-infill")]
    pub spm_infill: bool,
    /// Largest request head (start line and headers) in bytes; larger ones get 431.
    #[arg(long = "max-header-bytes", default_value_t = 64 << 10, value_parser = clap::value_parser!(u32).range(8192..))]
    pub max_header_bytes: u32,
    /// Most connections open at once; more are answered 503.
    #[arg(long = "max-connections", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
    /// Seconds a client may take to send a request's head; also how long an idle keep-alive
    /// connection stays open.
    #[arg(long = "header-timeout", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub header_timeout: u64,
    /// Seconds a request body may stall between two reads before the server answers 408.
    #[arg(long = "body-timeout", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub body_timeout: u64,
    /// Lamina runs no warm-up pass before serving, so this is what it always does; accepted
    /// for llama-server's command lines.
    #[arg(long = "no-warmup")]
    pub no_warmup: bool,
    /// When a generation fills its slot's context, drop the older half of what follows
    /// the kept tokens and go on (llama-server's context shift; off by default).
    #[arg(long = "context-shift", overrides_with = "no_context_shift")]
    pub context_shift: bool,
    /// End a generation that fills its slot's context (the default).
    #[arg(long = "no-context-shift")]
    pub no_context_shift: bool,
    /// Prompt tokens a context shift keeps (-1: the whole prompt); a request's `n_keep`
    /// wins.
    #[arg(long = "keep", allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-1..))]
    pub keep: Option<i32>,
    /// Smallest chunk of a slot's cached prompt that is moved into place when a new prompt
    /// has it further on (0: off); a request's `n_cache_reuse` wins.
    #[arg(long = "cache-reuse", value_parser = clap::value_parser!(u32))]
    pub cache_reuse: Option<u32>,
    /// All slots share the whole KV cache (`-kvu`) instead of a stream of `-c / -np` cells
    /// each (where a slot computes the same whatever the others hold).
    #[arg(long = "kv-unified")]
    pub kv_unified: bool,
    /// How embeddings pool the hidden states: `mean` (the default), `cls`, `last`,
    /// `none` (every token's state, on `/embeddings` only) or `rank` (as `--reranking`).
    #[arg(long = "pooling", value_parser = ["mean", "cls", "last", "none", "rank"])]
    pub pooling: Option<String>,
    /// Serve `/rerank` (rank pooling; embeddings are then off).
    #[arg(long = "reranking", visible_alias = "rerank")]
    pub reranking: bool,
    /// Seconds one request may take, queueing included (0: no limit).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Largest request body accepted, in bytes.
    #[arg(long = "max-body-bytes", default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Most tokens per decode step (llama-server's default).
    #[arg(short = 'b', long = "batch-size", default_value_t = 2048)]
    pub batch_size: u32,
    /// Most tokens per forward pass (`-ub`; at most `--batch-size`).
    #[arg(long = "ubatch-size", default_value_t = 512)]
    pub ubatch_size: u32,
    /// Requests that may wait for a free slot before the server answers 503.
    #[arg(long = "queue-size", default_value_t = 64)]
    pub queue_size: usize,
    /// Where `<think>` reasoning goes in chat answers: `none` (left in the content),
    /// `deepseek` or `auto` (moved to `reasoning_content`).
    #[arg(long = "reasoning-format", default_value = "auto", value_parser = ["none", "deepseek", "auto"])]
    pub reasoning_format: String,
    /// Deepest nesting of a request's JSON schema (`json_schema`, `response_format`,
    /// tool parameters) before it is refused.
    #[arg(long = "json-schema-max-depth", default_value_t = 64)]
    pub json_schema_max_depth: usize,
    /// Most grammar rules a JSON schema may turn into.
    #[arg(long = "json-schema-max-rules", default_value_t = 10_000)]
    pub json_schema_max_rules: usize,
    /// Largest count a JSON schema may repeat (`minItems`, `maxLength`, `{m,n}`).
    #[arg(long = "json-schema-max-repetition", default_value_t = 10_000)]
    pub json_schema_max_repetition: usize,
}

impl ServeArgs {
    pub fn config(&self) -> anyhow::Result<ServerConfig> {
        use anyhow::Context as _;
        anyhow::ensure!(self.batch_size > 0, "-b must be at least 1");
        anyhow::ensure!(self.ubatch_size > 0, "-ub must be at least 1");
        let csv = |s: &Option<String>| -> Vec<String> {
            s.iter()
                .flat_map(|s| s.split(','))
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty())
                .collect()
        };
        let mut api_keys = csv(&self.api_key);
        if let Some(f) = &self.api_key_file {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read --api-key-file {}", f.display()))?;
            api_keys.extend(
                text.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                    .map(String::from),
            );
        }
        let reasoning = lamina_chat::Reasoning::parse(&self.reasoning).with_context(|| {
            format!(
                "unknown value for --reasoning: {:?} (on, off or auto)",
                self.reasoning
            )
        })?;
        let mut defaults = serde_json::Map::new();
        let mut put = |k: &str, v: Option<serde_json::Value>| {
            if let Some(v) = v {
                defaults.insert(k.to_string(), v);
            }
        };
        put("temperature", self.temp.map(Into::into));
        put("seed", self.seed.map(Into::into));
        put("top_k", self.top_k.map(Into::into));
        put("top_p", self.top_p.map(Into::into));
        put("min_p", self.min_p.map(Into::into));
        put("repeat_penalty", self.repeat_penalty.map(Into::into));
        put("repeat_last_n", self.repeat_last_n.map(Into::into));
        put("presence_penalty", self.presence_penalty.map(Into::into));
        put("frequency_penalty", self.frequency_penalty.map(Into::into));
        put("n_keep", self.keep.map(Into::into));
        put("n_cache_reuse", self.cache_reuse.map(Into::into));
        put(
            "reasoning_budget_tokens",
            self.reasoning_budget.map(Into::into),
        );
        put(
            "reasoning_budget_message",
            self.reasoning_budget_message.clone().map(Into::into),
        );
        let n_predict = match self.n_predict {
            None => None,
            Some(n) if n < 0 => None,
            Some(n) => Some(u32::try_from(n).context("--n-predict is too large")?),
        };
        let tools = lamina_server::server_tools::ToolsConfig {
            builtin: self
                .tools
                .as_deref()
                .map(lamina_server::server_tools::ToolsConfig::parse_tools_list)
                .unwrap_or_default(),
            runtime: self.tools_runtime.clone(),
            mcp_config: self.mcp_servers_config.clone(),
            mcp_json: self.mcp_servers_json.clone(),
            cwd: None,
            sandbox: self.tools_sandbox.clone(),
        };
        let restricts_cors = tools.restricts_cors();
        let vertex = lamina_server::Vertex::from_env();
        let port = match (&vertex, std::env::var("AIP_HTTP_PORT")) {
            (Some(_), Ok(p)) => p
                .parse()
                .with_context(|| format!("AIP_HTTP_PORT is not a port: {p:?}"))?,
            _ => self.port,
        };
        Ok(ServerConfig {
            host: self.host.clone(),
            port,
            vertex,
            tools,
            slot_save_path: self.slot_save_path.clone(),
            cors_proxy: self.ui_mcp_proxy,
            // -1 is llama.cpp's "no limit".
            cache_ram_mib: match self.cache_ram {
                Some(n) if n < 0 => usize::MAX >> 20,
                Some(n) => n as usize,
                None => 0,
            },
            cache_idle_slots: !self.no_cache_idle_slots,
            ctx_shift: self.context_shift && !self.no_context_shift,
            http: lamina_server::HttpLimits {
                max_header_bytes: self.max_header_bytes as usize,
                max_headers: lamina_server::HttpLimits::default().max_headers,
                header_timeout: Duration::from_secs(self.header_timeout),
                body_timeout: Duration::from_secs(self.body_timeout),
                max_connections: self.max_connections as usize,
                drain_timeout: lamina_server::HttpLimits::default().drain_timeout,
            },
            swa_full: self.swa_full,
            spm_infill: self.spm_infill,
            sleep_idle: self
                .sleep_idle_seconds
                .filter(|&s| s > 0)
                .map(|s| Duration::from_secs(s as u64)),
            api_keys,
            aliases: csv(&self.alias),
            tags: csv(&self.tags),
            model_path: String::new(),
            default_params: defaults,
            n_predict,
            slots_endpoint: !self.no_slots,
            metrics_endpoint: self.metrics,
            web_ui: !self.no_ui,
            cors: lamina_server::Cors {
                origins: match &self.cors_origins {
                    Some(o) => o.clone(),
                    None if restricts_cors => {
                        eprintln!(
                            "lamina serve: server tools or MCP servers are enabled, using localhost as default CORS origin (change via --cors-origins)"
                        );
                        "localhost".into()
                    }
                    None => "*".into(),
                },
                methods: self.cors_methods.clone(),
                headers: self.cors_headers.clone(),
                credentials: !self.no_cors_credentials,
            },
            verbose: self.verbose,
            jinja: !self.no_jinja,
            reasoning,
            pooling: if self.reranking {
                lamina_server::Pooling::Rank
            } else {
                self.pooling
                    .as_deref()
                    .and_then(lamina_server::Pooling::parse)
                    .unwrap_or_default()
            },
            timeout: (self.timeout > 0).then(|| Duration::from_secs(self.timeout)),
            max_body_bytes: self.max_body_bytes,
            schema_limits: lamina_grammar::json_schema::SchemaOptions {
                max_depth: self.json_schema_max_depth,
                max_rules: self.json_schema_max_rules,
                max_repetition: self.json_schema_max_repetition,
                ..Default::default()
            },
            reasoning_format: lamina_chat::ReasoningFormat::parse(&self.reasoning_format)
                .unwrap_or_default(),
            n_batch: self.batch_size.max(1),
            queue_size: self.queue_size,
        })
    }
}

/// llama.cpp's multi-letter short flags, which clap cannot declare, and their long forms.
const LLAMA_SHORT_FLAGS: [(&str, &str); 18] = [
    ("-cram", "--cache-ram"),
    ("-kvu", "--kv-unified"),
    ("-cb", "--cont-batching"),
    ("-rea", "--reasoning"),
    ("-to", "--timeout"),
    ("-jf", "--json-schema-file"),
    ("-np", "--parallel"),
    ("-pg", "--n-gen-prompt"),
    ("-ub", "--ubatch-size"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-fa", "--flash-attn"),
    ("-sys", "--system-prompt"),
    ("-ngl", "--n-gpu-layers"),
    ("-sm", "--split-mode"),
    ("-ts", "--tensor-split"),
    ("-mg", "--main-gpu"),
    ("-ofreq", "--output-frequency"),
];

/// Rewrites llama.cpp's multi-letter short flags (`-np N`, `-np=N`, `-ub`, `-ctk`, `-ctv`,
/// `-fa`, `-sys`, `-ngl`, `-sm`, `-ts`, `-mg`, `-jf`, imatrix's `-ofreq`) into their long forms.
pub fn normalize_llama_flags(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    args.into_iter()
        .map(|a| {
            let Some(s) = a.to_str() else { return a };
            for (short, long) in LLAMA_SHORT_FLAGS {
                if s == short {
                    return OsString::from(long);
                }
                if let Some(value) = s
                    .strip_prefix(short)
                    .and_then(|rest| rest.strip_prefix('='))
                {
                    return OsString::from(format!("{long}={value}"));
                }
            }
            a
        })
        .collect()
}

/// llama-server flags Lamina does not implement: refused by name at start-up rather than
/// accepted and ignored.
const UNSUPPORTED_LLAMA_FLAGS: &[&str] = &[
    "--lora",
    "--lora-scaled",
    "--lora-init-without-apply",
    "--control-vector",
    "--control-vector-scaled",
    "--control-vector-layer-range",
    "-md",
    "--model-draft",
    "--spec-type",
    "--spec-draft-n-max",
    "--spec-draft-n-min",
    "--draft",
    "--draft-max",
    "--draft-min",
    "--spec-synth-len",
    "--spec-synth-rates",
    "-hf",
    "-hfr",
    "--hf-repo",
    "-hff",
    "--hf-file",
    "-hft",
    "--hf-token",
    "-mu",
    "--model-url",
    "-dr",
    "--docker-repo",
    "-mm",
    "--mmproj",
    "-mmu",
    "--mmproj-url",
    "--media-path",
    "-gan",
    "--grp-attn-n",
    "-gaw",
    "--grp-attn-w",
    "--ssl-key-file",
    "--ssl-cert-file",
    "--api-prefix",
    "--path",
    "--props",
    "--chat-template-kwargs",
    "--rope-scaling",
    "--rope-scale",
    "--rope-freq-base",
    "--rope-freq-scale",
    "--override-kv",
    "-ot",
    "--override-tensor",
    "--numa",
    "--mlock",
    "-tb",
    "--threads-batch",
    "--threads-http",
    "--rpc",
    "--samplers",
    "--sampling-seq",
    "--dry-multiplier",
    "--mirostat",
    "--xtc-probability",
    "--dynatemp-range",
    "--grammar",
    "--grammar-file",
    "--json-schema",
    "--ignore-eos",
    "--no-cont-batching",
    "-nocb",
    "--log-file",
    "--log-disable",
    "--embd-normalize",
    "--reuse-port",
    "--sse-ping-interval",
    "--prefill-assistant",
    "--no-prefill-assistant",
    "--skip-chat-parsing",
    "--reasoning-effort",
];

/// The first of `args` that is a llama-server flag Lamina does not implement.
pub fn unsupported_llama_flag(args: &[OsString]) -> Option<String> {
    args.iter().filter_map(|a| a.to_str()).find_map(|a| {
        let name = a.split_once('=').map_or(a, |(n, _)| n);
        UNSUPPORTED_LLAMA_FLAGS
            .contains(&name)
            .then(|| name.to_string())
    })
}

/// Serves `engine` until Ctrl-C, or until `fatal` (a blocking wait, if any) returns why the
/// server cannot go on. The engine decides the slot count and context; the flags only say
/// what was asked for, so a mismatch is reported, not fatal.
pub fn run(
    args: &ServeArgs,
    config: ServerConfig,
    engine: Box<dyn Engine>,
    fatal: Option<Box<dyn FnOnce() -> String + Send>>,
) -> anyhow::Result<()> {
    if engine.n_seq_max() != args.parallel {
        eprintln!(
            "lamina serve: the engine has {} sequences, --parallel asked for {}",
            engine.n_seq_max(),
            args.parallel
        );
    }
    eprintln!(
        "lamina serve: model {}, {} slots of {} tokens",
        engine.model_name(),
        engine.n_seq_max(),
        engine.n_ctx_seq()
    );
    lamina_server::serve_blocking_until(engine, config, fatal)?;
    Ok(())
}

/// `-n`: a token count, -1 (no limit) or -2 (until the context is full), as llama.cpp takes it.
pub fn n_predict(s: &str) -> Result<i64, String> {
    match s.parse::<i64>() {
        Ok(n) if n >= -2 => Ok(n),
        Ok(n) => Err(format!(
            "{n}: it must be a token count, -1 (no limit) or -2 (until the context is full)"
        )),
        Err(_) => Err(format!("{s:?} is not a whole number")),
    }
}
