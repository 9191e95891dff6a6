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
    /// Require `Authorization: Bearer KEY` (all endpoints but `/` and `/health`).
    #[arg(long = "api-key", env = "LAMINA_API_KEY")]
    pub api_key: Option<String>,
    /// Seconds one request may take, queueing included (0: no limit).
    #[arg(long, default_value_t = 600)]
    pub timeout: u64,
    /// Largest request body accepted, in bytes.
    #[arg(long = "max-body-bytes", default_value_t = 8 << 20)]
    pub max_body_bytes: usize,
    /// Most tokens per decode step.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    pub batch_size: u32,
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
    pub fn config(&self) -> ServerConfig {
        ServerConfig {
            host: self.host.clone(),
            port: self.port,
            api_key: self.api_key.clone().filter(|k| !k.is_empty()),
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
        }
    }
}

/// llama.cpp's multi-letter short flags, which clap cannot declare, and their long forms.
const LLAMA_SHORT_FLAGS: [(&str, &str); 12] = [
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
];

/// Rewrites llama.cpp's multi-letter short flags (`-np N`, `-np=N`, `-ub`, `-ctk`, `-ctv`,
/// `-fa`, `-sys`, `-ngl`, `-sm`, `-ts`, `-mg`, `-jf`) into their long forms.
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

/// Serves `engine` until Ctrl-C. The engine decides the slot count and context; the
/// flags only say what was asked for, so a mismatch is reported, not fatal.
pub fn run(args: &ServeArgs, engine: Box<dyn Engine>) -> anyhow::Result<()> {
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
    lamina_server::serve_blocking(engine, args.config())?;
    Ok(())
}
