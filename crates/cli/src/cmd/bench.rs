//! `lamina bench`: prompt-processing and generation speed, measured as llama-bench measures
//! it, with its flags, its method and its output formats (markdown, JSON, CSV).
//!
//! For each model, thread count and test: one warm-up, then `-r` timed runs from an empty KV
//! cache. A prompt test decodes `n_prompt` tokens in batches of `-b` with logits for the last
//! only; a generation test decodes `n_gen` tokens one at a time; `-pg` does both in one run.
//! Tokens are pseudo-random ids from a fixed seed (BOS first when the model adds one), so the
//! work does not depend on any text.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use lamina_gguf::pull as hub;
use lamina_model::{Batch, Context, ContextParams};
use serde::Serialize;

use super::{emit, load_model};

/// llama-bench's flags. `-pg` and `-ub` are multi-letter short flags that clap cannot declare:
/// `normalize_llama_flags` rewrites them to `--n-gen-prompt` and `--ubatch-size`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Models: GGUF paths or known model names (repeatable, comma-separated).
    #[arg(short = 'm', long = "model", value_delimiter = ',', default_value = hub::DEFAULT_MODEL)]
    pub models: Vec<String>,
    /// Prompt sizes to test (comma-separated; 0 disables).
    #[arg(
        short = 'p',
        long = "n-prompt",
        value_delimiter = ',',
        default_value = "512"
    )]
    pub n_prompt: Vec<usize>,
    /// Generation sizes to test (comma-separated; 0 disables).
    #[arg(
        short = 'n',
        long = "n-gen",
        value_delimiter = ',',
        default_value = "128"
    )]
    pub n_gen: Vec<usize>,
    /// A prompt-then-generate test `PP,TG` (`-pg`; repeatable).
    #[arg(long = "n-gen-prompt", value_name = "PP,TG", value_parser = parse_pg)]
    pub n_gen_prompt: Vec<(usize, usize)>,
    /// Thread counts to test (comma-separated; default: all cores).
    #[arg(short = 't', long = "threads", value_delimiter = ',', value_parser = parse_positive)]
    pub threads: Vec<usize>,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value = "5", value_parser = parse_positive)]
    pub repetitions: usize,
    /// Most tokens handed to the model in one call.
    #[arg(short = 'b', long = "batch-size", default_value = "2048", value_parser = parse_positive)]
    pub batch_size: usize,
    /// Largest micro-batch computed at once (`-ub`).
    #[arg(long = "ubatch-size", default_value = "512", value_parser = parse_positive)]
    pub ubatch_size: usize,
    /// K cache types to test (`-ctk`, comma-separated).
    #[arg(long = "cache-type-k", value_delimiter = ',', default_value = "f16")]
    pub cache_type_k: Vec<String>,
    /// V cache types to test (`-ctv`, comma-separated; quantized ones need flash attention).
    #[arg(long = "cache-type-v", value_delimiter = ',', default_value = "f16")]
    pub cache_type_v: Vec<String>,
    /// Flash attention settings to test (`-fa`: on/off/auto or 1/0/-1, comma-separated).
    #[arg(
        long = "flash-attn",
        value_delimiter = ',',
        default_value = "auto",
        allow_negative_numbers = true
    )]
    pub flash_attn: Vec<String>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Md)]
    pub output: OutputFormat,
    #[command(flatten)]
    pub devices: super::DeviceArgs,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Md,
    Json,
    Csv,
}

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(0) => Err("must be at least 1".to_string()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("{s:?} is not a positive whole number")),
    }
}

fn parse_pg(s: &str) -> Result<(usize, usize), String> {
    let count = |part: &str| {
        part.trim()
            .parse::<usize>()
            .map_err(|_| format!("{s:?}: expected PP,TG, two whole numbers"))
    };
    match s.split_once(',') {
        Some((pp, tg)) => Ok((count(pp)?, count(tg)?)),
        None => Err(format!("{s:?}: expected PP,TG, e.g. 512,128")),
    }
}

/// One test: `n_prompt` prompt tokens, then `n_gen` generated ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TestSpec {
    pub n_prompt: usize,
    pub n_gen: usize,
}

impl TestSpec {
    /// llama-bench's name: `pp512`, `tg128`, `pp512+tg128`.
    pub fn name(&self) -> String {
        match (self.n_prompt, self.n_gen) {
            (p, 0) => format!("pp{p}"),
            (0, g) => format!("tg{g}"),
            (p, g) => format!("pp{p}+tg{g}"),
        }
    }
}

/// The tests `args` asks for, in llama-bench's order: prompt, generation, combined.
pub fn tests(args: &BenchArgs) -> Vec<TestSpec> {
    let pp = args.n_prompt.iter().map(|&n| (n, 0));
    let tg = args.n_gen.iter().map(|&n| (0, n));
    pp.chain(tg)
        .chain(args.n_gen_prompt.iter().copied())
        .filter(|&(p, g)| p + g > 0)
        .map(|(n_prompt, n_gen)| TestSpec { n_prompt, n_gen })
        .collect()
}

/// One measured test, with llama-bench's JSON field names and order.
#[derive(Clone, Debug, Serialize)]
pub struct BenchResult {
    pub build_commit: String,
    pub cpu_info: String,
    pub backends: String,
    pub model_filename: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub n_threads: usize,
    pub type_k: String,
    pub type_v: String,
    pub n_gpu_layers: i64,
    pub split_mode: String,
    pub main_gpu: usize,
    /// llama-bench's `flash_attn`: -1 auto, 0 off, 1 on.
    pub flash_attn: i32,
    pub devices: String,
    pub tensor_split: String,
    pub n_prompt: usize,
    pub n_gen: usize,
    pub test_time: String,
    pub avg_ns: u64,
    pub stddev_ns: u64,
    pub avg_ts: f64,
    pub stddev_ts: f64,
    pub samples_ns: Vec<u64>,
    pub samples_ts: Vec<f64>,
}

/// Mean and sample standard deviation (0 for fewer than two values), as llama-bench.
fn mean_stddev(values: &[f64]) -> (f64, f64) {
    if values.is_empty() {
        return (0.0, 0.0);
    }
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    if values.len() < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

/// What stays fixed across the tests of one model and thread count.
#[derive(Clone, Debug)]
pub struct RunInfo {
    pub model_filename: String,
    pub model_type: String,
    pub model_size: u64,
    pub model_n_params: u64,
    pub n_batch: usize,
    pub n_ubatch: usize,
    pub n_threads: usize,
    pub type_k: String,
    pub type_v: String,
    pub flash_attn: i32,
    pub cpu_info: String,
    /// The devices the model is on, `/`-separated (llama-bench's `devices`).
    pub devices: String,
    /// The backends computing (llama-bench's `backends`: the GPU's when one is used).
    pub backends: String,
    pub n_gpu_layers: i64,
    pub split_mode: String,
    pub main_gpu: usize,
    pub tensor_split: String,
}

impl BenchResult {
    /// A result from the wall time of each timed run, in nanoseconds.
    pub fn new(info: &RunInfo, test: TestSpec, test_time: String, samples_ns: Vec<u64>) -> Self {
        let n_tokens = (test.n_prompt + test.n_gen) as f64;
        let samples_ts: Vec<f64> = samples_ns
            .iter()
            .map(|&ns| n_tokens * 1e9 / (ns.max(1) as f64))
            .collect();
        let ns_f: Vec<f64> = samples_ns.iter().map(|&ns| ns as f64).collect();
        let (avg_ns, stddev_ns) = mean_stddev(&ns_f);
        let (avg_ts, stddev_ts) = mean_stddev(&samples_ts);
        BenchResult {
            build_commit: env!("CARGO_PKG_VERSION").to_string(),
            cpu_info: info.cpu_info.clone(),
            backends: info.backends.clone(),
            model_filename: info.model_filename.clone(),
            model_type: info.model_type.clone(),
            model_size: info.model_size,
            model_n_params: info.model_n_params,
            n_batch: info.n_batch,
            n_ubatch: info.n_ubatch,
            n_threads: info.n_threads,
            type_k: info.type_k.clone(),
            type_v: info.type_v.clone(),
            n_gpu_layers: info.n_gpu_layers,
            split_mode: info.split_mode.clone(),
            main_gpu: info.main_gpu,
            flash_attn: info.flash_attn,
            devices: info.devices.clone(),
            tensor_split: info.tensor_split.clone(),
            n_prompt: test.n_prompt,
            n_gen: test.n_gen,
            test_time,
            avg_ns: avg_ns.round() as u64,
            stddev_ns: stddev_ns.round() as u64,
            avg_ts,
            stddev_ts,
            samples_ns,
            samples_ts,
        }
    }

    fn test(&self) -> TestSpec {
        TestSpec {
            n_prompt: self.n_prompt,
            n_gen: self.n_gen,
        }
    }
}

/// `lamina bench`.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let results = measure(args)?;
    let text = match args.output {
        OutputFormat::Md => to_markdown(&results),
        OutputFormat::Json => to_json(&results)?,
        OutputFormat::Csv => to_csv(&results),
    };
    emit(&text)
}

/// Runs every test of `args` and returns the results in order.
pub fn measure(args: &BenchArgs) -> anyhow::Result<Vec<BenchResult>> {
    let tests = tests(args);
    anyhow::ensure!(
        !tests.is_empty(),
        "nothing to measure: every -p, -n and -pg size is 0"
    );
    let threads = if args.threads.is_empty() {
        vec![std::thread::available_parallelism().map_or(1, |n| n.get())]
    } else {
        args.threads.clone()
    };
    let n_ctx = tests
        .iter()
        .map(|t| t.n_prompt + t.n_gen)
        .max()
        .unwrap_or(1);
    let cpu_info = cpu_info();
    let mut results = Vec::new();
    // llama-bench's instance order: cache types, then flash attention, then threads.
    let mut configs = Vec::new();
    for k in &args.cache_type_k {
        for v in &args.cache_type_v {
            for fa in &args.flash_attn {
                let type_k = super::kv_type("--cache-type-k", k)?;
                let type_v = super::kv_type("--cache-type-v", v)?;
                configs.push((type_k, type_v, super::flash_attn(fa)?));
            }
        }
    }
    for model in &args.models {
        for &(type_k, type_v, flash_attn) in &configs {
            for &n_threads in &threads {
                let params = ContextParams {
                    n_ctx,
                    n_ubatch: args.ubatch_size,
                    pipeline_parallel: !args.devices.no_pipeline,
                    type_k,
                    type_v,
                    flash_attn,
                    n_threads,
                    ..Default::default()
                };
                let (model, _) = load_model(model, Some(n_threads), &args.devices)?;
                // The vocabulary only decides the first token (BOS); files without a usable
                // one (llama.cpp's placeholder `test` vocabulary) are measured too, as
                // llama-bench does.
                let first_token = lamina_tokenizer::Tokenizer::from_gguf(&model.file)
                    .ok()
                    .and_then(|t| t.add_bos().then(|| t.bos()).flatten());
                let mut ctx = lamina_model::Context::new(std::sync::Arc::new(model), params)?;
                let mut info = run_info(&ctx, args, n_threads, &cpu_info);
                info.type_k = type_k.name().to_string();
                info.type_v = type_v.name().to_string();
                info.flash_attn = match flash_attn {
                    lamina_model::FlashAttn::Auto => -1,
                    lamina_model::FlashAttn::Off => 0,
                    lamina_model::FlashAttn::On => 1,
                };
                for &test in &tests {
                    let test_time = rfc3339_now();
                    let samples = time_test(&mut ctx, test, args, first_token)
                        .with_context(|| format!("{} on {}", test.name(), info.model_filename))?;
                    let result = BenchResult::new(&info, test, test_time, samples);
                    eprintln!(
                        "lamina bench: {} {} threads {} fa {} ctk {} ctv {}: {:.2} ± {:.2} t/s",
                        info.model_type,
                        test.name(),
                        n_threads,
                        info.flash_attn,
                        info.type_k,
                        info.type_v,
                        result.avg_ts,
                        result.stddev_ts
                    );
                    results.push(result);
                }
            }
        }
    }
    Ok(results)
}

/// llama-bench's `backends`: the non-CPU backends in use (a device's name without its
/// number: `WGPU`), else `CPU`.
fn backends_of(devices: &[std::sync::Arc<dyn lamina_backend::Device>]) -> String {
    let mut names: Vec<String> = Vec::new();
    for d in devices {
        if d.device_type() == lamina_backend::DeviceType::Cpu {
            continue;
        }
        let name = d
            .name()
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .to_string();
        if !names.contains(&name) {
            names.push(name);
        }
    }
    if names.is_empty() {
        "CPU".to_string()
    } else {
        names.join(",")
    }
}

fn run_info(ctx: &Context, args: &BenchArgs, n_threads: usize, cpu_info: &str) -> RunInfo {
    let model = ctx.model();
    let n_params = model.n_params();
    let file_type = match model.file.metadata.get_u32("general.file_type") {
        Ok(Some(t)) => file_type_name(t),
        _ => "?".to_string(),
    };
    RunInfo {
        model_filename: model.file.path().display().to_string(),
        model_type: format!(
            "{} {} {file_type}",
            model.hparams.arch,
            params_label(n_params)
        ),
        model_size: model.size_bytes(),
        model_n_params: n_params,
        n_batch: args.batch_size,
        n_ubatch: args.ubatch_size,
        n_threads,
        type_k: "f16".to_string(),
        type_v: "f16".to_string(),
        flash_attn: -1,
        cpu_info: cpu_info.to_string(),
        devices: model
            .plan()
            .devices
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>()
            .join("/"),
        backends: backends_of(&model.plan().devices),
        // llama-bench's default and "all layers" value.
        n_gpu_layers: match args.devices.n_gpu_layers.as_deref() {
            Some(n) => n.parse().unwrap_or(99),
            None => 99,
        },
        split_mode: args.devices.split_mode.clone(),
        main_gpu: args.devices.main_gpu,
        tensor_split: if args.devices.tensor_split.is_empty() {
            "0.00".to_string()
        } else {
            args.devices
                .tensor_split
                .iter()
                .map(|x| format!("{x:.2}"))
                .collect::<Vec<_>>()
                .join("/")
        },
    }
}

/// One warm-up (as llama-bench: the whole prompt, one generated token), then the timed runs.
fn time_test(
    ctx: &mut Context,
    test: TestSpec,
    args: &BenchArgs,
    first_token: Option<u32>,
) -> anyhow::Result<Vec<u64>> {
    let mut rng = SplitMix64(0x6c61_6d69_6e61);
    run_once(ctx, test, test.n_gen.min(1), args, first_token, &mut rng)?;
    let mut samples = Vec::with_capacity(args.repetitions);
    for _ in 0..args.repetitions {
        let start = Instant::now();
        run_once(ctx, test, test.n_gen, args, first_token, &mut rng)?;
        samples.push(u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX));
    }
    Ok(samples)
}

/// From an empty cache: the test's prompt, then `n_gen` generated tokens.
fn run_once(
    ctx: &mut Context,
    test: TestSpec,
    n_gen: usize,
    args: &BenchArgs,
    first_token: Option<u32>,
    rng: &mut SplitMix64,
) -> anyhow::Result<()> {
    let n_vocab = ctx.model().hparams.n_vocab;
    ctx.clear();
    if test.n_prompt > 0 {
        decode_prompt(
            ctx,
            test.n_prompt,
            args.batch_size,
            first_token,
            n_vocab,
            rng,
        )?;
    }
    if n_gen > 0 {
        decode_gen(ctx, test.n_prompt, n_gen, first_token, n_vocab, rng)?;
    }
    Ok(())
}

fn decode_prompt(
    ctx: &mut Context,
    n_prompt: usize,
    n_batch: usize,
    first_token: Option<u32>,
    n_vocab: u32,
    rng: &mut SplitMix64,
) -> anyhow::Result<()> {
    let tokens: Vec<u32> = (0..n_prompt)
        .map(|i| match first_token {
            Some(bos) if i == 0 => bos,
            _ => rng.below(n_vocab),
        })
        .collect();
    for (i, part) in tokens.chunks(n_batch.max(1)).enumerate() {
        ctx.decode(&Batch::sequence(part, (i * n_batch) as i32, 0))?;
    }
    Ok(())
}

fn decode_gen(
    ctx: &mut Context,
    pos0: usize,
    n_gen: usize,
    first_token: Option<u32>,
    n_vocab: u32,
    rng: &mut SplitMix64,
) -> anyhow::Result<()> {
    let mut token = first_token.unwrap_or_else(|| rng.below(n_vocab));
    let mut batch = Batch::default();
    for i in 0..n_gen {
        batch.clear();
        batch.push(token, (pos0 + i) as i32, 0, true);
        ctx.decode(&batch)?;
        token = rng.below(n_vocab);
    }
    Ok(())
}

/// A small fixed-seed generator: benchmark tokens need only be reproducible, not good.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u32) -> u32 {
        (self.next() % u64::from(n.max(1))) as u32
    }
}

/// llama.cpp's name of a `general.file_type` value.
fn file_type_name(t: u32) -> String {
    let name = match t {
        0 => "all F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K - Medium",
        11 => "Q3_K - Small",
        12 => "Q3_K - Medium",
        13 => "Q3_K - Large",
        14 => "Q4_K - Small",
        15 => "Q4_K - Medium",
        16 => "Q5_K - Small",
        17 => "Q5_K - Medium",
        18 => "Q6_K",
        32 => "BF16",
        _ => return format!("file type {t}"),
    };
    name.to_string()
}

/// Parameter count as `135M` / `7B`, for the model type.
fn params_label(n: u64) -> String {
    if n >= 1_000_000_000 {
        format!("{:.0}B", n as f64 / 1e9)
    } else {
        format!("{:.0}M", n as f64 / 1e6)
    }
}

/// The CPU's model name from /proc/cpuinfo, else the architecture.
fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rfc3339(secs)
}

/// `secs` since the Unix epoch as an RFC 3339 UTC time (`2026-11-30T10:36:38Z`).
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Size as llama-bench prints it: MiB below 1 GiB, GiB above.
pub fn format_size(bytes: u64) -> String {
    const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
    let b = bytes as f64;
    if b < GIB {
        format!("{:.2} MiB", b / (1024.0 * 1024.0))
    } else {
        format!("{:.2} GiB", b / GIB)
    }
}

/// Parameter count as llama-bench prints it: millions below a billion, billions above.
pub fn format_params(n: u64) -> String {
    if n < 1_000_000_000 {
        format!("{:.2} M", n as f64 / 1e6)
    } else {
        format!("{:.2} B", n as f64 / 1e9)
    }
}

/// llama-bench's markdown table (with its `sm`, `ts` and `dev` columns when a run used more
/// than one device).
pub fn to_markdown(results: &[BenchResult]) -> String {
    let multi = results.iter().any(|r| r.devices.contains('/'));
    // As llama-bench: a column for a setting only when some run leaves its default.
    let types = results
        .iter()
        .any(|r| r.type_k != "f16" || r.type_v != "f16");
    let fa = results.iter().any(|r| r.flash_attn != -1);
    let mut header = vec!["model", "size", "params", "backend", "threads"];
    // Numbers are right-aligned, as in llama-bench.
    let mut right = vec![false, true, true, false, true];
    if types {
        header.extend(["type_k", "type_v"]);
        right.extend([false, false]);
    }
    if fa {
        header.push("fa");
        right.push(true);
    }
    if multi {
        header.extend(["sm", "ts", "dev"]);
        right.extend([false, false, false]);
    }
    header.extend(["test", "t/s"]);
    right.extend([true, true]);
    let rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let mut row = vec![
                r.model_type.clone(),
                format_size(r.model_size),
                format_params(r.model_n_params),
                r.backends.clone(),
                r.n_threads.to_string(),
            ];
            if types {
                row.extend([r.type_k.clone(), r.type_v.clone()]);
            }
            if fa {
                row.push(r.flash_attn.to_string());
            }
            if multi {
                row.extend([
                    r.split_mode.clone(),
                    r.tensor_split.clone(),
                    r.devices.clone(),
                ]);
            }
            row.extend([
                r.test().name(),
                format!("{:.2} ± {:.2}", r.avg_ts, r.stddev_ts),
            ]);
            row
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].chars().count())
                .chain([header[c].len(), 3])
                .max()
                .unwrap_or(3)
        })
        .collect();
    let line = |cells: &mut dyn Iterator<Item = String>| {
        let mut s = String::from("|");
        for (c, cell) in cells.enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            let fill = " ".repeat(pad);
            if right[c] {
                s.push_str(&format!(" {fill}{cell} |"));
            } else {
                s.push_str(&format!(" {cell}{fill} |"));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(&mut header.iter().map(|h| h.to_string()));
    out.push('|');
    for (c, w) in widths.iter().enumerate() {
        if right[c] {
            out.push_str(&format!(" {}: |", "-".repeat(w - 1)));
        } else {
            out.push_str(&format!(" {} |", "-".repeat(*w)));
        }
    }
    out.push('\n');
    for row in &rows {
        out.push_str(&line(&mut row.iter().cloned()));
    }
    out.push_str(&format!("\nbuild: lamina {}\n", env!("CARGO_PKG_VERSION")));
    // What the figures ran on: the CPU, and the kernel tier it was given.
    if let Some(r) = results.first() {
        out.push_str(&format!(
            "cpu: {}, {} kernels\n",
            r.cpu_info,
            lamina_cpu::kernels::isa().name()
        ));
    }
    out
}

/// llama-bench's JSON: an array of objects.
pub fn to_json(results: &[BenchResult]) -> anyhow::Result<String> {
    let mut text = serde_json::to_string_pretty(results)?;
    text.push('\n');
    Ok(text)
}

/// The JSON fields in order, the CSV header.
pub const CSV_FIELDS: [&str; 27] = [
    "build_commit",
    "cpu_info",
    "backends",
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "n_batch",
    "n_ubatch",
    "n_threads",
    "type_k",
    "type_v",
    "n_gpu_layers",
    "split_mode",
    "main_gpu",
    "flash_attn",
    "devices",
    "tensor_split",
    "n_prompt",
    "n_gen",
    "test_time",
    "avg_ns",
    "stddev_ns",
    "avg_ts",
    "stddev_ts",
    "samples_ns",
    "samples_ts",
];

/// Quotes a CSV field when it holds a comma, quote or line break (RFC 4180).
pub fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// llama-bench's CSV: a header row, then one row per test (samples joined by `;`).
pub fn to_csv(results: &[BenchResult]) -> String {
    let mut out = CSV_FIELDS.join(",");
    out.push('\n');
    for r in results {
        let join = |v: Vec<String>| v.join(";");
        let values = [
            r.build_commit.clone(),
            r.cpu_info.clone(),
            r.backends.clone(),
            r.model_filename.clone(),
            r.model_type.clone(),
            r.model_size.to_string(),
            r.model_n_params.to_string(),
            r.n_batch.to_string(),
            r.n_ubatch.to_string(),
            r.n_threads.to_string(),
            r.type_k.clone(),
            r.type_v.clone(),
            r.n_gpu_layers.to_string(),
            r.split_mode.clone(),
            r.main_gpu.to_string(),
            r.flash_attn.to_string(),
            r.devices.clone(),
            r.tensor_split.clone(),
            r.n_prompt.to_string(),
            r.n_gen.to_string(),
            r.test_time.clone(),
            r.avg_ns.to_string(),
            r.stddev_ns.to_string(),
            format!("{:.6}", r.avg_ts),
            format!("{:.6}", r.stddev_ts),
            join(r.samples_ns.iter().map(u64::to_string).collect()),
            join(r.samples_ts.iter().map(|t| format!("{t:.6}")).collect()),
        ];
        let row: Vec<String> = values.iter().map(|v| csv_field(v)).collect();
        out.push_str(&row.join(","));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied())).map(|c| c.bench)
    }

    fn info() -> RunInfo {
        RunInfo {
            model_filename: "/models/a,b.gguf".into(),
            model_type: "llama 135M Q4_1".into(),
            model_size: 98_000_000,
            model_n_params: 134_515_008,
            n_batch: 2048,
            n_ubatch: 512,
            n_threads: 2,
            type_k: "f16".into(),
            type_v: "f16".into(),
            flash_attn: -1,
            cpu_info: "AMD EPYC 7B13".into(),
            devices: "CPU".into(),
            backends: "CPU".into(),
            n_gpu_layers: 99,
            split_mode: "layer".into(),
            main_gpu: 0,
            tensor_split: "0.00".into(),
        }
    }

    fn fixed_results() -> Vec<BenchResult> {
        let pp = TestSpec {
            n_prompt: 512,
            n_gen: 0,
        };
        let tg = TestSpec {
            n_prompt: 0,
            n_gen: 128,
        };
        vec![
            // 512 tokens in 1 s and 0.5 s: 512 and 1024 t/s.
            BenchResult::new(
                &info(),
                pp,
                "2026-11-30T10:00:00Z".into(),
                vec![1_000_000_000, 500_000_000],
            ),
            BenchResult::new(
                &info(),
                tg,
                "2026-11-30T10:00:05Z".into(),
                vec![2_000_000_000],
            ),
        ]
    }

    #[test]
    fn defaults_are_llama_benchs() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.models, [hub::DEFAULT_MODEL]);
        assert_eq!(a.n_prompt, [512]);
        assert_eq!(a.n_gen, [128]);
        assert!(a.n_gen_prompt.is_empty() && a.threads.is_empty());
        assert_eq!((a.repetitions, a.batch_size, a.ubatch_size), (5, 2048, 512));
        assert_eq!(a.output, OutputFormat::Md);
        let names: Vec<String> = tests(&a).iter().map(TestSpec::name).collect();
        assert_eq!(names, ["pp512", "tg128"]);
    }

    #[test]
    fn comma_lists_and_repeats_accumulate() {
        let a = parse(&[
            "-m",
            "a.gguf,b.gguf",
            "-m",
            "c",
            "-p",
            "0,64,128",
            "-n",
            "0",
            "-t",
            "1,2",
            "--n-gen-prompt",
            "16,4",
            "--n-gen-prompt",
            "8,0",
            "-o",
            "csv",
        ])
        .unwrap();
        assert_eq!(a.models, ["a.gguf", "b.gguf", "c"]);
        assert_eq!(a.threads, [1, 2]);
        assert_eq!(a.output, OutputFormat::Csv);
        let names: Vec<String> = tests(&a).iter().map(TestSpec::name).collect();
        assert_eq!(names, ["pp64", "pp128", "pp16+tg4", "pp8"]);
    }

    #[test]
    fn invalid_values_are_clear_errors() {
        let msg = |args: &[&str]| parse(args).expect_err("an error").to_string();
        assert!(
            msg(&["-r", "0"]).contains("at least 1"),
            "{}",
            msg(&["-r", "0"])
        );
        assert!(msg(&["-t", "2,0"]).contains("at least 1"));
        assert!(msg(&["-p", "abc"]).contains("abc"));
        assert!(msg(&["-b", "x"]).contains("not a positive whole number"));
        assert!(msg(&["--n-gen-prompt", "512"]).contains("PP,TG"));
        assert!(msg(&["--n-gen-prompt", "5,x"]).contains("PP,TG"));
        assert!(msg(&["-o", "xml"]).contains("xml"));
    }

    #[test]
    fn nothing_to_measure_is_an_error() {
        let a = parse(&["-p", "0", "-n", "0"]).unwrap();
        let err = measure(&a).unwrap_err().to_string();
        assert!(err.contains("nothing to measure"), "{err}");
    }

    #[test]
    fn statistics_are_per_run_rates() {
        let r = &fixed_results()[0];
        assert_eq!(r.samples_ts, [512.0, 1024.0]);
        assert_eq!(r.avg_ts, 768.0);
        // Sample standard deviation of 512 and 1024.
        assert!((r.stddev_ts - 362.038_672).abs() < 1e-3, "{}", r.stddev_ts);
        assert_eq!((r.avg_ns, r.stddev_ns), (750_000_000, 353_553_391));
        let single = &fixed_results()[1];
        assert_eq!((single.avg_ts, single.stddev_ts), (64.0, 0.0));
    }

    #[test]
    fn markdown_is_llama_benchs_table() {
        let md = to_markdown(&fixed_results());
        let lines: Vec<&str> = md.lines().collect();
        assert_eq!(
            lines[0].split('|').map(str::trim).collect::<Vec<_>>(),
            [
                "", "model", "size", "params", "backend", "threads", "test", "t/s", ""
            ]
        );
        assert!(
            lines[1].starts_with("| ---") && lines[1].ends_with(": |"),
            "{}",
            lines[1]
        );
        let row: Vec<&str> = lines[2].split('|').map(str::trim).collect();
        assert_eq!(
            row,
            [
                "",
                "llama 135M Q4_1",
                "93.46 MiB",
                "134.52 M",
                "CPU",
                "2",
                "pp512",
                "768.00 ± 362.04",
                ""
            ]
        );
        assert!(lines[3].contains("| tg128 |") && lines[3].contains("64.00 ± 0.00"));
        // Every table line has the same width.
        let w = lines[0].chars().count();
        assert!(lines[..4].iter().all(|l| l.chars().count() == w), "{md}");
    }

    #[test]
    fn sizes_and_params_use_llama_benchs_units() {
        assert_eq!(format_size(98_362_432), "93.81 MiB");
        assert_eq!(format_size(4_108_000_000), "3.83 GiB");
        assert_eq!(format_params(134_515_008), "134.52 M");
        assert_eq!(format_params(6_738_415_616), "6.74 B");
        assert_eq!(
            TestSpec {
                n_prompt: 512,
                n_gen: 128
            }
            .name(),
            "pp512+tg128"
        );
    }

    #[test]
    fn json_has_llama_benchs_fields() {
        let text = to_json(&fixed_results()).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr.len(), 2);
        let obj = arr[0].as_object().unwrap();
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        for f in CSV_FIELDS {
            assert!(keys.contains(&f), "missing {f}");
        }
        assert_eq!(obj["backends"], "CPU");
        assert_eq!(obj["n_prompt"], 512);
        assert_eq!(obj["avg_ts"], 768.0);
        assert_eq!(
            obj["samples_ns"],
            serde_json::json!([1_000_000_000u64, 500_000_000u64])
        );
        assert_eq!(obj["test_time"], "2026-11-30T10:00:00Z");
        assert_eq!(obj["build_commit"], env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn csv_has_a_header_and_quotes_commas() {
        let csv = to_csv(&fixed_results());
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0], CSV_FIELDS.join(","));
        assert!(lines[1].contains(",\"/models/a,b.gguf\","), "{}", lines[1]);
        assert!(lines[1].contains(",768.000000,"), "{}", lines[1]);
        assert!(lines[1].contains(",1000000000;500000000,"), "{}", lines[1]);
        assert_eq!(csv_field("plain"), "plain");
        assert_eq!(csv_field("a \"b\", c"), "\"a \"\"b\"\", c\"");
    }

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_796_035_000), "2026-11-30T10:36:40Z");
    }

    #[test]
    fn random_tokens_stay_in_the_vocabulary() {
        let mut rng = SplitMix64(1);
        assert!((0..1000).all(|_| rng.below(49152) < 49152));
        assert_eq!(rng.below(0), 0);
    }
}
