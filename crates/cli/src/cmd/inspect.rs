//! `lamina inspect MODEL`: what a GGUF file holds — its metadata (long arrays summarized), its
//! tensor table, and totals by type — as readable text in the manner of llama.cpp's gguf-dump,
//! or as JSON with `--json`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use clap::Args;
use lamina_core::DType;
use lamina_gguf::{Array, GgufFile, TensorInfo, Value};
use serde_json::json;

#[derive(Args, Debug, Clone)]
pub struct InspectArgs {
    /// The model: a GGUF file path or a known model name.
    #[arg(value_name = "MODEL")]
    pub model: String,
    /// Print JSON (for scripts) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Leave out the tensor table (totals and counts by type are still shown).
    #[arg(long)]
    pub no_tensors: bool,
    /// Show arrays (vocabularies, merges, scores) in full instead of their first items.
    #[arg(long)]
    pub full_arrays: bool,
    /// How many items of a long array to show.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub array_items: usize,
}

impl InspectArgs {
    fn array_limit(&self) -> usize {
        if self.full_arrays {
            usize::MAX
        } else {
            self.array_items
        }
    }
}

/// Opens `model_path` (the resolved `args.model`) and prints its summary on stdout.
pub fn run(args: &InspectArgs, model_path: &Path) -> anyhow::Result<()> {
    let file = GgufFile::open(model_path)
        .with_context(|| format!("cannot inspect {}", model_path.display()))?;
    if args.json {
        let value = inspect_json(&file, args);
        super::emit(&(serde_json::to_string_pretty(&value)? + "\n"))?;
    } else {
        super::emit(&inspect_text(&file, args))?;
    }
    Ok(())
}

/// Longest string value shown whole in text output; longer ones (chat templates) are cut.
const TEXT_STRING_LIMIT: usize = 120;

/// The human-readable summary.
pub fn inspect_text(file: &GgufFile, args: &InspectArgs) -> String {
    let g = file.gguf();
    let mut out = String::new();
    let w = &mut out;
    let _ = writeln!(
        w,
        "{}: GGUF v{}, {}",
        file.path().display(),
        g.version,
        human_bytes(file.bytes().len() as u64)
    );
    let _ = writeln!(
        w,
        "architecture {}, alignment {}, tensor data at byte {}",
        g.architecture().unwrap_or("(none)"),
        g.alignment,
        g.data_offset
    );

    let _ = writeln!(w, "\nmetadata: {} key/value pairs", g.metadata.len());
    let key_width = g
        .metadata
        .entries()
        .iter()
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0)
        .min(48);
    for (i, (key, value)) in g.metadata.entries().iter().enumerate() {
        let _ = writeln!(
            w,
            "  {:>4}  {:<10} {:<key_width$} = {}",
            i + 1,
            type_label(value),
            key,
            value_text(value, args.array_limit())
        );
    }

    let totals = Totals::of(&g.tensors);
    if !args.no_tensors && !g.tensors.is_empty() {
        let _ = writeln!(
            w,
            "\ntensors: {} (offsets from the start of tensor data)",
            g.tensors.len()
        );
        let name_width = g
            .tensors
            .iter()
            .map(|t| t.name.len())
            .max()
            .unwrap_or(4)
            .max(4);
        let shape_width = g
            .tensors
            .iter()
            .map(|t| shape_text(t).len())
            .max()
            .unwrap_or(5)
            .max(5);
        let _ = writeln!(
            w,
            "  {:>4}  {:<name_width$}  {:<7}  {:<shape_width$}  {:>12}  {:>12}",
            "#", "name", "type", "shape", "offset", "bytes"
        );
        for (i, t) in g.tensors.iter().enumerate() {
            let _ = writeln!(
                w,
                "  {:>4}  {:<name_width$}  {:<7}  {:<shape_width$}  {:>12}  {:>12}",
                i + 1,
                t.name,
                t.dtype.name(),
                shape_text(t),
                t.offset,
                t.size
            );
        }
    }

    let _ = writeln!(
        w,
        "\ntotals: {} tensors, {} of tensor data, {} parameters",
        totals.tensors,
        human_bytes(totals.bytes),
        human_count(totals.parameters)
    );
    if !totals.by_type.is_empty() {
        let _ = writeln!(w, "by type:");
        for (dtype, t) in &totals.by_type {
            let _ = writeln!(
                w,
                "  {:<7} {:>5} tensors  {:>11}  {:>9} parameters",
                dtype.name(),
                t.tensors,
                human_bytes(t.bytes),
                human_count(t.parameters)
            );
        }
    }
    out
}

/// The machine-readable summary. Metadata is a list (file order is meaningful); arrays longer
/// than the limit carry their length, their first items and `"truncated": true`.
pub fn inspect_json(file: &GgufFile, args: &InspectArgs) -> serde_json::Value {
    let g = file.gguf();
    let limit = args.array_limit();
    let metadata: Vec<serde_json::Value> = g
        .metadata
        .entries()
        .iter()
        .map(|(key, value)| {
            let mut entry = json!({ "key": key, "type": value.value_type().name() });
            match value {
                Value::Array(a) => {
                    entry["element_type"] = json!(a.element_type().name());
                    entry["len"] = json!(a.len());
                    entry["value"] = array_json(a, limit);
                    if a.len() > limit {
                        entry["truncated"] = json!(true);
                    }
                }
                v => entry["value"] = scalar_json(v),
            }
            entry
        })
        .collect();
    let totals = Totals::of(&g.tensors);
    let mut out = json!({
        "path": file.path().display().to_string(),
        "file_size": file.bytes().len(),
        "version": g.version,
        "architecture": g.architecture(),
        "alignment": g.alignment,
        "data_offset": g.data_offset,
        "metadata": metadata,
        "totals": {
            "tensors": totals.tensors,
            "bytes": totals.bytes,
            "parameters": totals.parameters,
        },
        "by_type": totals.by_type.iter().map(|(dtype, t)| json!({
            "type": dtype.name(),
            "tensors": t.tensors,
            "bytes": t.bytes,
            "parameters": t.parameters,
        })).collect::<Vec<_>>(),
    });
    if !args.no_tensors {
        out["tensors"] = g
            .tensors
            .iter()
            .map(|t| {
                json!({
                    "name": t.name,
                    "type": t.dtype.name(),
                    "shape": t.dims(),
                    "offset": t.offset,
                    "size": t.size,
                    "elements": t.n_elements(),
                })
            })
            .collect();
    }
    out
}

#[derive(Default)]
struct TypeTotals {
    tensors: usize,
    bytes: u64,
    parameters: u64,
}

struct Totals {
    tensors: usize,
    bytes: u64,
    parameters: u64,
    /// In ggml type-id order.
    by_type: BTreeMap<DType, TypeTotals>,
}

impl Totals {
    fn of(tensors: &[TensorInfo]) -> Totals {
        let mut by_type: BTreeMap<DType, TypeTotals> = BTreeMap::new();
        for t in tensors {
            let e = by_type.entry(t.dtype).or_default();
            e.tensors += 1;
            e.bytes = e.bytes.saturating_add(t.size);
            e.parameters = e.parameters.saturating_add(t.n_elements());
        }
        Totals {
            tensors: tensors.len(),
            bytes: by_type
                .values()
                .fold(0, |acc, t| acc.saturating_add(t.bytes)),
            parameters: by_type
                .values()
                .fold(0, |acc, t| acc.saturating_add(t.parameters)),
            by_type,
        }
    }
}

/// `576 x 49152`: dimensions innermost first, as ggml and gguf-dump show them.
fn shape_text(t: &TensorInfo) -> String {
    t.dims()
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(" x ")
}

/// `u32`, `string`, or `[string]` for an array of strings.
fn type_label(value: &Value) -> String {
    match value {
        Value::Array(a) => format!("[{}]", a.element_type()),
        v => v.value_type().name().to_string(),
    }
}

fn value_text(value: &Value, limit: usize) -> String {
    match value {
        Value::Array(a) => array_text(a, limit),
        Value::String(s) => string_text(s),
        v => scalar_text(v),
    }
}

fn string_text(s: &str) -> String {
    let chars = s.chars().count();
    if chars <= TEXT_STRING_LIMIT {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(TEXT_STRING_LIMIT).collect();
        format!("{head:?}… ({chars} chars)")
    }
}

fn scalar_text(v: &Value) -> String {
    match v {
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        Value::Bool(x) => x.to_string(),
        Value::String(s) => string_text(s),
        Value::Array(a) => array_text(a, usize::MAX),
    }
}

/// `[a, b, c]`, or `[a, b, …] (49152 items)` when longer than `limit`.
fn array_text(a: &Array, limit: usize) -> String {
    let shown: Vec<String> = (0..a.len().min(limit))
        .filter_map(|i| a.get(i))
        .map(|v| match v {
            Value::Array(inner) => array_text(&inner, limit),
            v => scalar_text(&v),
        })
        .collect();
    if a.len() > limit {
        format!("[{}, …] ({} items)", shown.join(", "), a.len())
    } else {
        format!("[{}]", shown.join(", "))
    }
}

fn scalar_json(v: &Value) -> serde_json::Value {
    let float = |x: f64| {
        if x.is_finite() {
            json!(x)
        } else {
            json!(x.to_string())
        }
    };
    match v {
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        // Through the shortest decimal that reads back as the f32, so 1e-5 stays 1e-5.
        Value::F32(x) => float(x.to_string().parse().unwrap_or(f64::from(*x))),
        Value::F64(x) => float(*x),
        Value::Bool(x) => json!(x),
        Value::String(s) => json!(s),
        Value::Array(a) => array_json(a, usize::MAX),
    }
}

fn array_json(a: &Array, limit: usize) -> serde_json::Value {
    (0..a.len().min(limit))
        .filter_map(|i| a.get(i))
        .map(|v| match v {
            Value::Array(inner) => array_json(&inner, limit),
            v => scalar_json(&v),
        })
        .collect()
}

/// `98.4 MiB`, `512 B`.
fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `134.52M`, `270.4K`, `12`.
fn human_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1}K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2}M", n as f64 / 1e6),
        _ => format!("{:.2}B", n as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lamina_gguf::{GgufWriter, Metadata};
    use std::path::PathBuf;

    impl InspectArgs {
        /// Defaults for `model`, as clap fills them.
        fn new(model: &str) -> InspectArgs {
            InspectArgs {
                model: model.into(),
                json: false,
                no_tensors: false,
                full_arrays: false,
                array_items: 8,
            }
        }
    }

    #[test]
    fn defaults_match_clap() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            args: InspectArgs,
        }
        let parsed = Cli::parse_from(["inspect", "m.gguf"]).args;
        let expected = InspectArgs::new("m.gguf");
        assert_eq!(format!("{parsed:?}"), format!("{expected:?}"));
        let parsed = Cli::parse_from([
            "inspect",
            "--json",
            "--no-tensors",
            "--array-items",
            "3",
            "m",
        ])
        .args;
        assert!(parsed.json && parsed.no_tensors && parsed.array_items == 3);
    }

    fn vocab(name: &str) -> Option<PathBuf> {
        let path = PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../../shared/vocab"
        ))
        .join(name);
        if path.is_file() {
            Some(path)
        } else {
            eprintln!("skipping: {} is absent", path.display());
            None
        }
    }

    /// A small model-like file: a few keys and tensors of three types.
    fn tiny_model(dir: &Path) -> PathBuf {
        let mut m = Metadata::default();
        m.set("general.architecture", Value::String("llama".into()));
        m.set("general.name", Value::String("tiny".into()));
        m.set("llama.block_count", Value::U32(1));
        m.set("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5));
        m.set("tokenizer.chat_template", Value::String("x".repeat(500)));
        m.set(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String((0..100).map(|i| format!("t{i}")).collect())),
        );
        m.set(
            "nested",
            Value::Array(Array::Array(vec![
                Array::I32(vec![1, 2]),
                Array::Bool(vec![true]),
            ])),
        );
        let emb = vec![0u8; 4 * 18]; // q4_0 [64, 2]: 4 blocks of 18 bytes
        let norm = vec![0u8; 64 * 4];
        let out = vec![0u8; 64 * 3 * 2];
        let mut w = GgufWriter::new(m);
        w.add_tensor("token_embd.weight", DType::Q4_0, &[64, 2], &emb)
            .unwrap();
        w.add_tensor("blk.0.attn_norm.weight", DType::F32, &[64], &norm)
            .unwrap();
        w.add_tensor("output.weight", DType::F16, &[64, 3], &out)
            .unwrap();
        let path = dir.join("tiny.gguf");
        w.write_to(std::fs::File::create(&path).unwrap()).unwrap();
        path
    }

    #[test]
    fn text_of_a_model_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = GgufFile::open(tiny_model(dir.path())).unwrap();
        let text = inspect_text(&file, &InspectArgs::new("tiny"));
        println!("{text}");
        assert!(text.contains("GGUF v3"));
        assert!(text.contains("architecture llama, alignment 32"));
        assert!(text.contains("metadata: 7 key/value pairs"));
        let name = text.lines().find(|l| l.contains("general.name")).unwrap();
        assert!(
            name.split_whitespace()
                .eq(["2", "string", "general.name", "=", "\"tiny\""]),
            "{name}"
        );
        assert!(text.contains("[string]"));
        assert!(
            text.contains(r#"["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7", …] (100 items)"#)
        );
        assert!(text.contains("= 0.00001"));
        assert!(text.contains("[[1, 2], [true]]"));
        assert!(text.contains("… (500 chars)"));
        assert!(text.contains("tensors: 3"));
        let row = text
            .lines()
            .find(|l| l.contains("token_embd.weight"))
            .unwrap();
        let cols: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            cols,
            ["1", "token_embd.weight", "q4_0", "64", "x", "2", "0", "72"]
        );
        let row = text.lines().find(|l| l.contains("output.weight")).unwrap();
        assert!(
            row.split_whitespace()
                .eq(["3", "output.weight", "f16", "64", "x", "3", "352", "384"]),
            "{row}"
        );
        // 72 + 256 + 384 bytes; 128 + 64 + 192 parameters.
        assert!(
            text.contains("totals: 3 tensors, 712 B of tensor data, 384 parameters"),
            "{text}"
        );
        let by_type: Vec<&str> = text
            .lines()
            .skip_while(|l| *l != "by type:")
            .skip(1)
            .collect();
        assert_eq!(by_type.len(), 3);
        assert!(by_type[0].split_whitespace().eq([
            "f32",
            "1",
            "tensors",
            "256",
            "B",
            "64",
            "parameters"
        ]));
        assert!(by_type[1].starts_with("  f16 "));
        assert!(by_type[2].starts_with("  q4_0 "));

        let short = inspect_text(
            &file,
            &InspectArgs {
                no_tensors: true,
                ..InspectArgs::new("tiny")
            },
        );
        assert!(!short.contains("token_embd.weight"));
        assert!(short.contains("totals: 3 tensors"));
        let full = inspect_text(
            &file,
            &InspectArgs {
                full_arrays: true,
                ..InspectArgs::new("tiny")
            },
        );
        assert!(full.contains(r#""t98", "t99"]"#));
    }

    #[test]
    fn json_of_a_model_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = GgufFile::open(tiny_model(dir.path())).unwrap();
        let j = inspect_json(
            &file,
            &InspectArgs {
                array_items: 3,
                ..InspectArgs::new("tiny")
            },
        );
        assert_eq!(j["version"], 3);
        assert_eq!(j["architecture"], "llama");
        assert_eq!(j["alignment"], 32);
        assert_eq!(j["file_size"], file.bytes().len());
        let meta = j["metadata"].as_array().unwrap();
        assert_eq!(meta.len(), 7);
        assert_eq!(
            meta[0],
            json!({"key": "general.architecture", "type": "string", "value": "llama"})
        );
        assert_eq!(meta[3]["value"], json!(1e-5));
        assert_eq!(
            meta[4]["value"].as_str().unwrap().len(),
            500,
            "strings are whole in JSON"
        );
        assert_eq!(
            meta[5],
            json!({"key": "tokenizer.ggml.tokens", "type": "array", "element_type": "string", "len": 100,
                   "value": ["t0", "t1", "t2"], "truncated": true})
        );
        assert_eq!(meta[6]["value"], json!([[1, 2], [true]]));
        assert_eq!(
            j["tensors"][0],
            json!({"name": "token_embd.weight", "type": "q4_0", "shape": [64, 2], "offset": 0, "size": 72, "elements": 128})
        );
        assert_eq!(
            j["totals"],
            json!({"tensors": 3, "bytes": 712, "parameters": 384})
        );
        assert_eq!(
            j["by_type"][2],
            json!({"type": "q4_0", "tensors": 1, "bytes": 72, "parameters": 128})
        );
        let j = inspect_json(
            &file,
            &InspectArgs {
                no_tensors: true,
                ..InspectArgs::new("tiny")
            },
        );
        assert!(j.get("tensors").is_none());
    }

    #[test]
    fn vocab_file_summaries() {
        let Some(path) = vocab("ggml-vocab-llama-spm.gguf") else {
            return;
        };
        let file = GgufFile::open(&path).unwrap();
        let text = inspect_text(&file, &InspectArgs::new("spm"));
        assert!(text.contains("metadata: 22 key/value pairs"), "{text}");
        assert!(text.contains(r#"["<unk>", "<s>", "</s>","#), "{text}");
        assert!(text.contains("(32000 items)"));
        assert!(text.contains("totals: 0 tensors, 0 B of tensor data, 0 parameters"));
        assert!(!text.contains("by type:"));
        assert!(text.lines().count() < 40, "a vocab stays a short summary");

        let j = inspect_json(&file, &InspectArgs::new("spm"));
        let tokens = j["metadata"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == "tokenizer.ggml.tokens")
            .unwrap();
        assert_eq!(tokens["len"], 32000);
        assert_eq!(tokens["value"].as_array().unwrap().len(), 8);
        assert_eq!(tokens["value"][1], "<s>");
        let scores = j["metadata"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["key"] == "tokenizer.ggml.scores")
            .unwrap();
        assert_eq!(scores["element_type"], "f32");
        assert_eq!(j["tensors"], json!([]));
        // Valid JSON text, and small.
        let s = serde_json::to_string_pretty(&j).unwrap();
        assert!(s.len() < 16 * 1024);
    }

    #[test]
    fn errors_name_the_file() {
        let e = run(&InspectArgs::new("x"), Path::new("/nonexistent/model.gguf")).unwrap_err();
        assert!(
            format!("{e:#}").contains("/nonexistent/model.gguf"),
            "{e:#}"
        );
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("bad.gguf");
        std::fs::write(&bad, b"GGUF\x03\x00\x00\x00").unwrap();
        let e = run(&InspectArgs::new("x"), &bad).unwrap_err();
        assert!(format!("{e:#}").contains("truncated"), "{e:#}");
    }

    #[test]
    fn human_units() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(98_362_432), "93.8 MiB");
        assert_eq!(human_count(134_515_008), "134.52M");
        assert_eq!(human_count(999), "999");
    }
}
