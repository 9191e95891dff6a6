//! `lamina quantize [FLAGS] IN.gguf [OUT.gguf] TYPE [NTHREADS]`: llama-quantize, with its
//! arguments and type names, writing the same bytes it writes (the work is
//! `lamina_tools::quantize`). Per-tensor lines as llama-quantize prints them, a progress bar on a
//! terminal, and the size summary at the end.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use lamina_core::DType;
use lamina_gguf::Value;
use lamina_tools::imatrix::Imatrix;
use lamina_tools::quantize::{
    self, QUANT_OPTIONS, QuantizeParams, TensorDone, parse_file_type, parse_tensor_type,
};
use regex::Regex;

#[derive(Args, Debug, Clone)]
#[command(after_help = type_list())]
pub struct QuantizeArgs {
    /// Allow requantizing tensors that are already quantized (quality suffers compared to
    /// quantizing from 16 or 32 bits).
    #[arg(long)]
    pub allow_requantize: bool,
    /// Leave output.weight un(re)quantized.
    #[arg(long)]
    pub leave_output_tensor: bool,
    /// Disable the k-quant mixtures: every tensor gets the same type.
    #[arg(long)]
    pub pure: bool,
    /// Use this importance matrix (llama-imatrix's GGUF or legacy .dat format).
    #[arg(long, value_name = "FILE")]
    pub imatrix: Option<PathBuf>,
    /// Use the importance matrix only for tensors whose name contains this (repeatable).
    #[arg(long, value_name = "NAME", conflicts_with = "exclude_weights")]
    pub include_weights: Vec<String>,
    /// Do not use the importance matrix for tensors whose name contains this (repeatable).
    #[arg(long, value_name = "NAME")]
    pub exclude_weights: Vec<String>,
    /// Type of output.weight (a ggml type name: q8_0, q6_K, f16, ...).
    #[arg(long, value_name = "TYPE", value_parser = tensor_type)]
    pub output_tensor_type: Option<DType>,
    /// Type of token_embd.weight.
    #[arg(long, value_name = "TYPE", value_parser = tensor_type)]
    pub token_embedding_type: Option<DType>,
    /// Give tensors matching a regular expression a type: NAME=TYPE (repeatable).
    #[arg(long, value_name = "NAME=TYPE")]
    pub tensor_type: Vec<String>,
    /// Read --tensor-type entries from a file (separated by whitespace).
    #[arg(long, value_name = "FILE")]
    pub tensor_type_file: Option<PathBuf>,
    /// Remove these layers: comma-separated block indices.
    #[arg(long, value_name = "L0,L1,...")]
    pub prune_layers: Option<String>,
    /// Write one output file per input split, OUT-00001-of-0000N.gguf and so on (a split input
    /// is read from its first file either way; without this flag the output is one file).
    #[arg(long)]
    pub keep_split: bool,
    /// Override a metadata key: KEY=TYPE:VALUE with TYPE int, float, bool or str (repeatable).
    #[arg(long, value_name = "KEY=TYPE:VALUE")]
    pub override_kv: Vec<String>,
    /// Print the sizes the quantization would give, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Accepted for llama-quantize compatibility (Lamina quantizes one tensor at a time).
    #[arg(long, value_name = "MiB")]
    pub max_buffer_size: Option<u64>,
    /// IN.gguf [OUT.gguf] TYPE [NTHREADS]
    #[arg(value_name = "ARGS", num_args = 2..=4, required = true)]
    pub args: Vec<String>,
}

fn tensor_type(s: &str) -> Result<DType, String> {
    parse_tensor_type(s).ok_or_else(|| format!("invalid ggml type '{s}'"))
}

/// The `--help` list of types, as llama-quantize prints it.
fn type_list() -> String {
    let mut s = String::from("Allowed quantization types:\n");
    for o in QUANT_OPTIONS {
        s.push_str(&format!("  {:<9} : {}\n", o.name, o.desc));
    }
    s
}

/// llama-quantize's `KEY=TYPE:VALUE`; ints are written as u32 (of their absolute value) as
/// llama-quantize writes them.
fn parse_override(s: &str) -> anyhow::Result<(String, Value)> {
    let (key, rest) = s
        .split_once('=')
        .with_context(|| format!("malformed KV override '{s}': expected KEY=TYPE:VALUE"))?;
    if key.is_empty() || key.len() > 127 {
        bail!("malformed KV override '{s}': bad key");
    }
    let (ty, val) = rest
        .split_once(':')
        .with_context(|| format!("malformed KV override '{s}': expected TYPE:VALUE"))?;
    let value = match ty {
        "int" => Value::U32(
            val.parse::<i64>()
                .with_context(|| format!("invalid int in KV override '{s}'"))?
                .unsigned_abs()
                .try_into()
                .with_context(|| format!("int out of range in KV override '{s}'"))?,
        ),
        "float" => Value::F32(
            val.parse::<f64>()
                .with_context(|| format!("invalid float in KV override '{s}'"))? as f32,
        ),
        "bool" => match val {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => bail!("invalid boolean value for KV override '{s}'"),
        },
        "str" => {
            if val.len() > 127 {
                bail!("string value of KV override '{s}' is longer than 127 bytes");
            }
            Value::String(val.to_string())
        }
        _ => bail!("invalid type for KV override '{s}': int, float, bool or str"),
    };
    Ok((key.to_string(), value))
}

fn parse_tensor_type_option(s: &str) -> anyhow::Result<(Regex, DType)> {
    let (name, ty) = s
        .split_once('=')
        .with_context(|| format!("malformed tensor type '{s}': expected NAME=TYPE"))?;
    if name.is_empty() {
        bail!("missing tensor name in '{s}'");
    }
    if ty.is_empty() {
        bail!("missing quantization type in '{s}'");
    }
    let dtype =
        parse_tensor_type(ty).with_context(|| format!("invalid quantization type '{ty}'"))?;
    let re = Regex::new(&name.to_lowercase())
        .with_context(|| format!("invalid tensor name pattern '{name}'"))?;
    Ok((re, dtype))
}

fn shape_string(ne: &[u64; 4]) -> String {
    let mut s = format!("{:6}", ne[0]);
    for d in &ne[1..] {
        s.push_str(&format!(", {d:6}"));
    }
    s
}

const MIB: f64 = 1024.0 * 1024.0;

pub fn run(args: &QuantizeArgs) -> anyhow::Result<()> {
    let input = PathBuf::from(&args.args[0]);
    let mut rest = &args.args[1..];
    let (ftype, type_name, output) = match parse_file_type(&rest[0]) {
        Some((ftype, name)) => {
            rest = &rest[1..];
            (ftype, name, quantize::default_output_path(&input, name))
        }
        None => {
            let out = PathBuf::from(&rest[0]);
            let Some(t) = rest.get(1) else {
                bail!("missing quantization type after the output file");
            };
            let (ftype, name) = parse_file_type(t).with_context(|| {
                format!("invalid quantization type '{t}' (see `lamina quantize --help`)")
            })?;
            rest = &rest[2..];
            (ftype, name, out)
        }
    };
    let nthread = match rest {
        [] => 0,
        [n] => n
            .parse::<usize>()
            .with_context(|| format!("invalid thread count '{n}'"))?,
        _ => bail!("too many arguments: IN.gguf [OUT.gguf] TYPE [NTHREADS]"),
    };
    // --keep-split: the output names a prefix for PREFIX-0000i-of-0000N.gguf.
    let output = if args.keep_split {
        split_prefix(&output)
    } else {
        output
    };

    let mut params = QuantizeParams::new(ftype);
    params.nthread = nthread;
    params.allow_requantize = args.allow_requantize;
    params.quantize_output_tensor = !args.leave_output_tensor;
    params.only_copy = type_name == "COPY";
    params.pure = args.pure;
    params.output_tensor_type = args.output_tensor_type;
    params.token_embedding_type = args.token_embedding_type;
    params.dry_run = args.dry_run;
    params.keep_split = args.keep_split;
    for t in &args.tensor_type {
        params.tensor_types.push(parse_tensor_type_option(t)?);
    }
    if let Some(f) = &args.tensor_type_file {
        let text = std::fs::read_to_string(f)
            .with_context(|| format!("failed to open file '{}'", f.display()))?;
        for t in text.split_whitespace() {
            params.tensor_types.push(parse_tensor_type_option(t)?);
        }
    }
    if let Some(list) = &args.prune_layers {
        let mut ids = Vec::new();
        for id in list.split(',') {
            ids.push(
                id.trim()
                    .parse::<u32>()
                    .with_context(|| format!("invalid layer id '{id}'"))?,
            );
        }
        ids.sort_unstable();
        ids.dedup();
        params.prune_layers = ids;
    }
    for kv in &args.override_kv {
        params.kv_overrides.push(parse_override(kv)?);
    }
    if let Some(path) = &args.imatrix {
        let imatrix = Imatrix::load(path)
            .with_context(|| format!("failed to load imatrix from '{}'", path.display()))?;
        let mut weights = imatrix.quant_weights();
        eprintln!(
            "quantize: loaded {} importance matrix entries from {} computed on {} chunks",
            weights.len(),
            path.display(),
            imatrix.chunk_count
        );
        // llama-quantize's --exclude-weights / --include-weights: substrings of tensor names.
        if !args.exclude_weights.is_empty() {
            weights.retain(|name, _| !args.exclude_weights.iter().any(|x| name.contains(x)));
        }
        if !args.include_weights.is_empty() {
            weights.retain(|name, _| args.include_weights.iter().any(|x| name.contains(x)));
        }
        if !weights.is_empty() {
            // The keys llama-quantize records, after the user's overrides, values cut to 127
            // bytes as its fixed-size override strings cut them.
            let cut = |s: &str| {
                let mut end = s.len().min(127);
                while !s.is_char_boundary(end) {
                    end -= 1;
                }
                s[..end].to_string()
            };
            let kv = &mut params.kv_overrides;
            kv.push((
                "quantize.imatrix.file".into(),
                Value::String(cut(&path.to_string_lossy())),
            ));
            if let Some(d) = imatrix.datasets.first() {
                kv.push(("quantize.imatrix.dataset".into(), Value::String(cut(d))));
            }
            kv.push((
                "quantize.imatrix.entries_count".into(),
                Value::U32(weights.len() as u32),
            ));
            if imatrix.chunk_count > 0 {
                kv.push((
                    "quantize.imatrix.chunks_count".into(),
                    Value::U32(imatrix.chunk_count),
                ));
            }
            params.imatrix = Some(weights);
        }
    }

    if args.dry_run {
        eprintln!(
            "quantize: calculating quantization size for '{}' as {type_name}",
            input.display()
        );
    } else {
        eprintln!(
            "quantize: quantizing '{}' to '{}' as {type_name}{}",
            input.display(),
            output.display(),
            if nthread > 0 {
                format!(" using {nthread} threads")
            } else {
                String::new()
            }
        );
    }
    let bar = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("[{bar:30}] {pos}/{len} tensors {msg}")
            .expect("static template")
            .progress_chars("=> "),
    );
    let start = Instant::now();
    let mut on_tensor = |t: &TensorDone<'_>| {
        bar.set_length(t.total as u64);
        bar.set_position(t.index as u64);
        let head = format!(
            "[{:4}/{:4}] {:<36} - [{}], type = {:>6}, ",
            t.index,
            t.total,
            t.name,
            shape_string(&t.ne),
            t.from.name()
        );
        let line = match t.to {
            None => format!("{head}size = {:8.3} MiB", t.size_in as f64 / MIB),
            Some(to) => format!(
                "{head}converting to {} .. size = {:8.2} MiB -> {:8.2} MiB",
                to.name(),
                t.size_in as f64 / MIB,
                t.size_out as f64 / MIB
            ),
        };
        bar.suspend(|| eprintln!("{line}"));
    };
    let report = quantize::quantize_file(&input, &output, &params, &mut on_tensor);
    bar.finish_and_clear();
    let report = report.with_context(|| format!("failed to quantize {}", input.display()))?;
    if report.outputs.len() > 1 || args.keep_split {
        for out in &report.outputs {
            eprintln!("quantize: wrote {}", out.display());
        }
    }
    for w in &report.warnings {
        eprintln!("warning: {w}");
    }
    for name in &report.missing_imatrix {
        eprintln!("warning: the importance matrix has no data for {name}");
    }
    eprintln!(
        "model size  = {:8.2} MiB ({:.2} BPW)",
        report.size_in as f64 / MIB,
        report.bpw_in()
    );
    eprintln!(
        "quant size  = {:8.2} MiB ({:.2} BPW)",
        report.size_out as f64 / MIB,
        report.bpw_out()
    );
    if report.will_require_imatrix {
        eprintln!(
            "WARNING: dry run completed successfully, but actually completing this quantization will require an imatrix!"
        );
    }
    if report.n_fallback > 0 {
        eprintln!(
            "WARNING: {} of {} tensor(s) required fallback quantization",
            report.n_fallback, report.n_tensors
        );
    }
    eprintln!(
        "quantize time = {:8.2} ms",
        start.elapsed().as_secs_f64() * 1000.0
    );
    Ok(())
}

/// llama-quantize's prefix for `--keep-split`: the output path less its last five bytes when it
/// holds ".gguf" anywhere (its `find` + `substr`), else the path as given.
fn split_prefix(out: &Path) -> PathBuf {
    match out.to_str() {
        // Holding ".gguf" means at least five bytes.
        Some(t) if t.contains(".gguf") && t.is_char_boundary(t.len() - 5) => {
            PathBuf::from(&t[..t.len() - 5])
        }
        _ => out.to_path_buf(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overrides_parse_like_llama() {
        assert_eq!(
            parse_override("a.b=int:-7").unwrap(),
            ("a.b".into(), Value::U32(7))
        );
        assert_eq!(
            parse_override("x=bool:true").unwrap(),
            ("x".into(), Value::Bool(true))
        );
        assert!(parse_override("x=bool:yes").is_err());
        assert!(parse_override("x").is_err());
        assert!(parse_override("x=blob:1").is_err());
        assert_eq!(split_prefix(Path::new("a/m.gguf")), PathBuf::from("a/m"));
        assert_eq!(split_prefix(Path::new("a/m")), PathBuf::from("a/m"));
        assert_eq!(
            quantize::split_path(&split_prefix(Path::new("a/m.gguf")), 0, 1),
            PathBuf::from("a/m-00001-of-00001.gguf")
        );
        let (re, t) = parse_tensor_type_option("ATTN_V=q8_0").unwrap();
        assert!(re.is_match("blk.0.attn_v.weight"));
        assert_eq!(t, DType::Q8_0);
    }
}
