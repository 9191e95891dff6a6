//! `quantize`: llama-quantize. A GGUF file in, a GGUF file out with each tensor in the type
//! llama.cpp's rules give it for the chosen [`FileType`], byte for byte what llama-quantize
//! writes for the same input and arguments: the same tensor order, metadata, `general.*` and
//! `quantize.*` keys, and quantized bytes (the row quantizers are `lamina-core`'s, bit-exact
//! with ggml's).
//!
//! A split model (`PREFIX-00001-of-0000N.gguf`, as llama-gguf-split writes it) is read whole from
//! its first file; `--keep-split` writes one output per input split, with the same tensors in
//! each, as llama-quantize does.
//!
//! The output is written to temporary files next to the destination and renamed into place
//! only when complete, so a failure never leaves a partial file behind.

mod ftype;
mod rules;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use lamina_core::DType;
use lamina_core::quant::{self, QuantError};
use lamina_gguf::{
    GgufError, GgufFile, GgufStreamWriter, Metadata, TensorHeader, TensorInfo, Value,
};
use regex::Regex;

pub use ftype::{FileType, QUANT_OPTIONS, QuantOption, parse_file_type, parse_tensor_type};
pub use rules::{Category, ModelFacts, TensorShape, TypeChooser, TypeOptions, block_index};

/// `GGML_QNT_VERSION`: the version of the quantized formats, written as
/// `general.quantization_version`.
pub const QUANTIZATION_VERSION: u32 = 2;

/// Everything that stops a quantization. Each names what and where.
#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("cannot write {path}: {source}")]
    Output {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("input and output are the same file: {0}")]
    SameFile(String),
    #[error("the model has no {0} (is this a model file?)")]
    MissingKey(String),
    #[error(
        "invalid split file name: {0} (a split model is opened by its first file, PREFIX-00001-of-0000N.gguf)"
    )]
    SplitName(String),
    #[error("split {path} is split.no {found} of {count}, expected {expected}")]
    SplitIndex {
        path: String,
        found: u64,
        expected: u64,
        count: u64,
    },
    #[error("tensor {0} is in more than one split")]
    DuplicateTensor(String),
    #[error("file type {0:?} cannot be quantized to (llama.cpp has no rules for it)")]
    UnsupportedFileType(FileType),
    #[error("no fallback type is defined for {0}")]
    NoFallback(DType),
    #[error("cannot determine the layer of tensor {0}")]
    NoLayer(String),
    #[error("bad layer {layer} for tensor {tensor}: must be in [0, {n_layer})")]
    BadLayer {
        tensor: String,
        layer: i64,
        n_layer: i64,
    },
    #[error(
        "this quantization requires an importance matrix: tensor {tensor} would be {dtype}, which is garbage without one (make one with `lamina imatrix` or llama-imatrix and pass --imatrix FILE)"
    )]
    RequiresImatrix { tensor: String, dtype: DType },
    #[error("requantizing from type {0} is disabled (pass --allow-requantize)")]
    Requantize(DType),
    #[error("tensor {tensor}: cannot convert from {from}: {source}")]
    Dequantize {
        tensor: String,
        from: DType,
        #[source]
        source: QuantError,
    },
    #[error("tensor {tensor}: quantizing to {to} is not supported yet ({source})")]
    Quantize {
        tensor: String,
        to: DType,
        #[source]
        source: QuantError,
    },
    #[error(
        "tensor {tensor}: quantized data validation failed (the input holds NaN or infinity, or values too large for {to})"
    )]
    Validation { tensor: String, to: DType },
    #[error("imatrix contains a non-finite value for {0}")]
    ImatrixNotFinite(String),
    #[error(
        "imatrix size {found} is different from tensor size {expected} for {tensor} (is it the imatrix of another model?)"
    )]
    ImatrixSize {
        tensor: String,
        found: usize,
        expected: u64,
    },
    #[error("tensor {0}: the input's data is not addressable on this machine")]
    TooLarge(String),
}

/// What to do (llama-quantize's flags; `llama_model_quantize_params`).
#[derive(Clone, Debug)]
pub struct QuantizeParams {
    pub ftype: FileType,
    /// Worker threads (0: one per core).
    pub nthread: usize,
    pub allow_requantize: bool,
    /// `--leave-output-tensor` clears this.
    pub quantize_output_tensor: bool,
    /// `COPY`: every tensor keeps its type.
    pub only_copy: bool,
    pub pure: bool,
    pub output_tensor_type: Option<DType>,
    pub token_embedding_type: Option<DType>,
    /// `--tensor-type NAME=TYPE` patterns, first match wins.
    pub tensor_types: Vec<(Regex, DType)>,
    /// `--prune-layers`: block indices to drop (sorted, unique).
    pub prune_layers: Vec<u32>,
    /// `--override-kv`, applied (appended) after the copied metadata.
    pub kv_overrides: Vec<(String, Value)>,
    /// `--dry-run`: report the sizes, write nothing.
    pub dry_run: bool,
    /// Per-tensor importance (mean squared activations), by tensor name.
    pub imatrix: Option<HashMap<String, Vec<f32>>>,
    /// `--keep-split`: one output per input split, named `OUTPUT-0000i-of-0000N.gguf` (the output
    /// path is then a prefix), tensors in file order.
    pub keep_split: bool,
}

impl QuantizeParams {
    /// llama.cpp's defaults for `ftype`.
    pub fn new(ftype: FileType) -> QuantizeParams {
        QuantizeParams {
            ftype,
            nthread: 0,
            allow_requantize: false,
            quantize_output_tensor: true,
            only_copy: false,
            pure: false,
            output_tensor_type: None,
            token_embedding_type: None,
            tensor_types: Vec::new(),
            prune_layers: Vec::new(),
            kv_overrides: Vec::new(),
            dry_run: false,
            imatrix: None,
            keep_split: false,
        }
    }
}

/// One tensor done, for progress output.
#[derive(Clone, Debug)]
pub struct TensorDone<'a> {
    /// 1-based position and the count.
    pub index: usize,
    pub total: usize,
    pub name: &'a str,
    pub ne: [u64; 4],
    pub from: DType,
    /// `None`: copied as it is.
    pub to: Option<DType>,
    pub size_in: u64,
    pub size_out: u64,
    /// Whether an importance matrix was used for it.
    pub with_imatrix: bool,
}

/// What a quantization did.
#[derive(Clone, Debug, Default)]
pub struct QuantizeReport {
    pub n_tensors: usize,
    pub n_elements: u64,
    pub size_in: u64,
    pub size_out: u64,
    /// Tensors that fell back to another type because of their row length.
    pub n_fallback: usize,
    /// llama.cpp's warnings (fallbacks, overrides, tensors without imatrix data).
    pub warnings: Vec<String>,
    /// Tensors the importance matrix had no data for.
    pub missing_imatrix: Vec<String>,
    /// A dry run found tensors that will need an importance matrix.
    pub will_require_imatrix: bool,
    /// The files written, in split order.
    pub outputs: Vec<PathBuf>,
}

impl QuantizeReport {
    pub fn bpw_in(&self) -> f64 {
        self.size_in as f64 * 8.0 / self.n_elements.max(1) as f64
    }
    pub fn bpw_out(&self) -> f64 {
        self.size_out as f64 * 8.0 / self.n_elements.max(1) as f64
    }
}

/// The model facts the type rules need, from the file's metadata.
pub fn model_facts(metadata: &Metadata) -> Result<ModelFacts, QuantizeError> {
    let arch = metadata
        .get_str("general.architecture")
        .ok()
        .flatten()
        .ok_or_else(|| QuantizeError::MissingKey("general.architecture".into()))?
        .to_string();
    let first_u32 = |key: &str| -> Option<u32> {
        match metadata.get(key)? {
            Value::Array(a) => a.get(0).and_then(|v| v.as_u64()),
            v => v.as_u64(),
        }
        .and_then(|v| u32::try_from(v).ok())
    };
    let block_count = format!("{arch}.block_count");
    let n_layer = first_u32(&block_count).ok_or(QuantizeError::MissingKey(block_count))?;
    let n_head = first_u32(&format!("{arch}.attention.head_count")).unwrap_or(0);
    let n_head_kv = first_u32(&format!("{arch}.attention.head_count_kv")).unwrap_or(n_head);
    let n_expert = first_u32(&format!("{arch}.expert_count")).unwrap_or(0);
    Ok(ModelFacts {
        is_70b: arch == "llama" && n_layer == 80 && n_head != n_head_kv,
        arch,
        n_layer,
        n_head,
        n_head_kv,
        n_expert,
    })
}

/// llama.cpp's `llama_split_path`: `PREFIX-%05d-of-%05d.gguf`, `split_no` from 0.
pub fn split_path(prefix: &Path, split_no: usize, split_count: usize) -> PathBuf {
    let mut s = prefix.as_os_str().to_owned();
    s.push(format!("-{:05}-of-{:05}.gguf", split_no + 1, split_count));
    PathBuf::from(s)
}

/// The files of a model: `first` alone, or, when its `split.count` is above 1, every split of
/// it (llama.cpp's `llama_get_list_splits`), each checked to be the split its name says.
pub fn open_splits(first: &Path) -> Result<Vec<GgufFile>, QuantizeError> {
    let file = GgufFile::open(first)?;
    let meta = &file.gguf().metadata;
    let count = meta.get("split.count").and_then(Value::as_u64).unwrap_or(0);
    if count <= 1 {
        return Ok(vec![file]);
    }
    let no = meta.get("split.no").and_then(Value::as_u64).unwrap_or(0);
    let name = first.display().to_string();
    let index_err = |path: String, found, expected| QuantizeError::SplitIndex {
        path,
        found,
        expected,
        count,
    };
    if no != 0 {
        return Err(index_err(name, no, 0));
    }
    // split.count is a u16 in llama.cpp; a larger one is not a real split model.
    if count > u16::MAX as u64 {
        return Err(QuantizeError::SplitName(name));
    }
    let postfix = format!("-{:05}-of-{:05}.gguf", 1, count);
    let prefix = first
        .to_str()
        .and_then(|s| s.strip_suffix(&postfix))
        .ok_or_else(|| QuantizeError::SplitName(name.clone()))?;
    let mut files = vec![file];
    for i in 1..count as usize {
        let path = split_path(Path::new(prefix), i, count as usize);
        let f = GgufFile::open(&path)?;
        let found = f
            .gguf()
            .metadata
            .get("split.no")
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX);
        if found != i as u64 {
            return Err(index_err(path.display().to_string(), found, i as u64));
        }
        files.push(f);
    }
    Ok(files)
}

/// One input tensor on its way out.
struct Planned<'f> {
    /// The name in the output (renamed when layers are pruned).
    name: String,
    /// The name to look its importance up by (the input's).
    imatrix_name: String,
    shape: TensorShape,
    data: &'f [u8],
    target: DType,
    requires_imatrix: bool,
    /// The input split it comes from (and, with `--keep-split`, the output split it goes to),
    /// and where in it.
    split: usize,
    offset: u64,
}

/// Quantizes `input` into `output` (see the module doc). `progress` is called after each tensor.
pub fn quantize_file(
    input: &Path,
    output: &Path,
    params: &QuantizeParams,
    progress: &mut dyn FnMut(&TensorDone<'_>),
) -> Result<QuantizeReport, QuantizeError> {
    let files = open_splits(input)?;
    let gguf = files[0].gguf();
    // Tensors in llama.cpp's order: its weights map's (by name), or with --keep-split, the
    // files' (by split, then offset), sorted after the renaming of pruned layers (which
    // numbers the kept blocks in name order).
    let mut order: Vec<(usize, &TensorInfo)> = files
        .iter()
        .enumerate()
        .flat_map(|(i, f)| f.gguf().tensors.iter().map(move |t| (i, t)))
        .collect();
    order.sort_by(|a, b| rules::weight_order(&a.1.name, &b.1.name));
    if let Some(w) = order.windows(2).find(|w| w[0].1.name == w[1].1.name) {
        return Err(QuantizeError::DuplicateTensor(w[0].1.name.clone()));
    }
    // llama.cpp guesses a missing file type from its weights map, in name order.
    let common_type = most_common_type(order.iter().map(|(_, t)| *t));
    let n_split = if params.keep_split { files.len() } else { 1 };
    let outputs: Vec<PathBuf> = if params.keep_split {
        (0..n_split)
            .map(|i| split_path(output, i, n_split))
            .collect()
    } else {
        vec![output.to_path_buf()]
    };
    if !params.dry_run {
        for out in &outputs {
            if let Some(f) = files.iter().find(|f| same_file(f.path(), out)) {
                return Err(QuantizeError::SameFile(f.path().display().to_string()));
            }
        }
    }
    let facts = model_facts(&gguf.metadata)?;
    let mut ftype = params.ftype;
    let default_type = ftype
        .default_type()
        .ok_or(QuantizeError::UnsupportedFileType(ftype))?;
    let mut file_type_id = ftype.id();
    if params.only_copy {
        file_type_id = match gguf
            .metadata
            .get("general.file_type")
            .and_then(Value::as_u64)
        {
            Some(id) => id as u32,
            None => FileType::guess_from(common_type),
        };
        if let Some(t) = FileType::from_id(file_type_id) {
            ftype = t;
        }
    }
    if let Some(imatrix) = &params.imatrix {
        for (name, values) in imatrix {
            if values.iter().any(|v| !v.is_finite()) {
                return Err(QuantizeError::ImatrixNotFinite(name.clone()));
            }
        }
    }

    // Metadata: the input's, then the keys gguf.cpp's setters move to the end.
    let mut metadata = gguf.metadata.clone();
    metadata.set_last(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    );
    metadata.set_last("general.file_type", Value::U32(file_type_id));
    for key in ["split.no", "split.count", "split.tensors.count"] {
        metadata.remove(key);
    }
    for (key, value) in &params.kv_overrides {
        metadata.set_last(key, value.clone());
    }

    // Renamed past pruned layers.
    let mut pruner = LayerPruner::new(&params.prune_layers);
    let mut planned = Vec::with_capacity(order.len());
    for &(split, t) in &order {
        let Some(name) = pruner.remap(&t.name) else {
            continue;
        };
        planned.push(Planned {
            name,
            imatrix_name: String::new(),
            shape: TensorShape {
                dtype: t.dtype,
                ne: t.shape,
            },
            data: files[split].tensor_data(t),
            target: t.dtype,
            requires_imatrix: false,
            split,
            offset: t.offset,
        });
    }
    if params.keep_split {
        planned.sort_by_key(|p| (p.split, p.offset));
    }
    if !params.prune_layers.is_empty() {
        metadata.set_last(
            &format!("{}.block_count", facts.arch),
            Value::U32(pruner.next_id as u32),
        );
    }

    // Type choice for every tensor, before anything is written.
    let opts = TypeOptions {
        output_tensor_type: params.output_tensor_type,
        token_embedding_type: params.token_embedding_type,
        quantize_output_tensor: params.quantize_output_tensor,
        only_copy: params.only_copy,
        pure: params.pure,
        tensor_types: params.tensor_types.clone(),
    };
    let mut chooser = TypeChooser::new(
        &facts,
        &opts,
        params.imatrix.is_some(),
        planned.iter().map(|p| p.name.as_str()),
    );
    let mut report = QuantizeReport {
        n_tensors: order.len(),
        n_elements: order.iter().map(|(_, t)| t.n_elements()).sum(),
        ..QuantizeReport::default()
    };
    for p in &mut planned {
        let allows = chooser.allows_quantization(&p.name, &p.shape);
        if allows {
            p.target = chooser.choose(&p.name, &p.shape, ftype, default_type)?;
        }
        p.requires_imatrix = rules::requires_imatrix(&p.name, p.target, ftype);
        if params.imatrix.is_some() {
            p.imatrix_name = pruner.original_name(&p.name);
        } else if allows && p.requires_imatrix {
            if params.dry_run {
                report.will_require_imatrix = true;
            } else {
                return Err(QuantizeError::RequiresImatrix {
                    tensor: p.name.clone(),
                    dtype: p.target,
                });
            }
        }
    }
    report.n_fallback = chooser.n_fallback;
    report.warnings = std::mem::take(&mut chooser.warnings);

    // One table and metadata per output: the first split has the model's metadata, the others
    // only the split keys, as llama-quantize writes them.
    let out_split = |p: &Planned<'_>| if params.keep_split { p.split } else { 0 };
    let tables: Vec<Vec<TensorHeader>> = (0..n_split)
        .map(|i| {
            planned
                .iter()
                .filter(|p| out_split(p) == i)
                .map(|p| TensorHeader {
                    name: p.name.clone(),
                    dtype: p.target,
                    dims: p.shape.ne[..p.shape.n_dims()].to_vec(),
                })
                .collect()
        })
        .collect();
    let metadatas: Vec<Metadata> = (0..n_split)
        .map(|i| {
            let mut m = if i == 0 {
                metadata.clone()
            } else {
                Metadata::default()
            };
            if n_split > 1 {
                m.set_last("split.no", Value::U16(i as u16));
                m.set_last("split.count", Value::U16(n_split as u16));
                m.set_last("split.tensors.count", Value::I32(planned.len() as i32));
            }
            m
        })
        .collect();

    let nthread = match params.nthread {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let total = planned.len();
    if params.dry_run {
        for (i, p) in planned.iter().enumerate() {
            let size_in = p.data.len() as u64;
            let size_out = if p.target == p.shape.dtype {
                size_in
            } else {
                output_size(p)?
            };
            report.size_in += size_in;
            report.size_out += size_out;
            if p.target != p.shape.dtype && p.requires_imatrix {
                report.will_require_imatrix |= params.imatrix.is_none();
            }
            progress(&done(i, total, p, size_out, false));
        }
        return Ok(report);
    }

    let mut tmps = Vec::with_capacity(n_split);
    for out in &outputs {
        let tmp = crate::temp_output_for(out).map_err(|source| QuantizeError::Output {
            path: out.display().to_string(),
            source,
        })?;
        tmps.push(tmp);
    }
    // Planned tensors are in split order with --keep-split, so each output is written whole
    // before the next one starts.
    let mut current = 0;
    let mut stream = GgufStreamWriter::new(tmps[0].as_file(), &metadatas[0], &tables[0])?;
    let mut f32_buf: Vec<f32> = Vec::new();
    let mut out_buf: Vec<u8> = Vec::new();
    for (i, p) in planned.iter().enumerate() {
        while out_split(p) != current {
            stream.finish()?;
            current += 1;
            stream = GgufStreamWriter::new(
                tmps[current].as_file(),
                &metadatas[current],
                &tables[current],
            )?;
        }
        let size_in = p.data.len() as u64;
        if p.target == p.shape.dtype {
            stream.write_tensor(p.data)?;
            report.size_in += size_in;
            report.size_out += size_in;
            progress(&done(i, total, p, size_in, false));
            continue;
        }
        let imatrix = match &params.imatrix {
            None => None,
            Some(m) => match m.get(&p.imatrix_name) {
                None => {
                    report.missing_imatrix.push(p.name.clone());
                    None
                }
                Some(v) if v.len() as u64 == p.shape.ne[0] * p.shape.ne[2] => Some(v.as_slice()),
                Some(v) if rules::is_token_embd(&p.name) => {
                    report.warnings.push(format!(
                        "imatrix size {} is different from tensor size {} for {}",
                        v.len(),
                        p.shape.ne[0] * p.shape.ne[2],
                        p.name
                    ));
                    None
                }
                Some(v) => {
                    return Err(QuantizeError::ImatrixSize {
                        tensor: p.name.clone(),
                        found: v.len(),
                        expected: p.shape.ne[0] * p.shape.ne[2],
                    });
                }
            },
        };
        // ggml_quantize_requires_imatrix: these assert on a missing matrix even where the
        // rules do not ask for one (token_embd, output); refuse instead.
        let ggml_requires = matches!(p.target, DType::IQ2_XXS | DType::IQ2_XS | DType::IQ1_S);
        if imatrix.is_none() && (p.requires_imatrix || ggml_requires) {
            return Err(QuantizeError::RequiresImatrix {
                tensor: p.name.clone(),
                dtype: p.target,
            });
        }
        if p.shape.dtype.is_quantized() && !params.allow_requantize {
            return Err(QuantizeError::Requantize(p.shape.dtype));
        }
        let size_out = output_size(p)?;
        let n_per_row = p.shape.ne[0] as usize;
        let n_elements = usize::try_from(p.shape.ne.iter().product::<u64>())
            .map_err(|_| QuantizeError::TooLarge(p.name.clone()))?;
        f32_buf.resize(n_elements, 0.0);
        out_buf.resize(size_out as usize, 0);
        to_f32(p, &mut f32_buf, n_per_row, nthread)?;
        quantize_rows(p, &f32_buf, &mut out_buf, n_per_row, imatrix, nthread)?;
        stream.write_tensor(&out_buf)?;
        report.size_in += size_in;
        report.size_out += size_out;
        progress(&done(i, total, p, size_out, imatrix.is_some()));
    }
    stream.finish()?;
    while current + 1 < n_split {
        // A split left without tensors (all pruned) is still written, as llama-quantize does.
        current += 1;
        GgufStreamWriter::new(
            tmps[current].as_file(),
            &metadatas[current],
            &tables[current],
        )?
        .finish()?;
    }
    // Renamed only once every output is complete; if one rename fails, the ones already
    // renamed are removed again, so nothing partial is left.
    for (k, (tmp, out)) in tmps.into_iter().zip(&outputs).enumerate() {
        if let Err(e) = tmp.persist(out) {
            for done in &outputs[..k] {
                let _ = std::fs::remove_file(done);
            }
            return Err(QuantizeError::Output {
                path: out.display().to_string(),
                source: e.error,
            });
        }
    }
    report.outputs = outputs;
    Ok(report)
}

fn done<'a>(i: usize, total: usize, p: &'a Planned<'_>, size_out: u64, im: bool) -> TensorDone<'a> {
    TensorDone {
        index: i + 1,
        total,
        name: &p.name,
        ne: p.shape.ne,
        from: p.shape.dtype,
        to: (p.target != p.shape.dtype).then_some(p.target),
        size_in: p.data.len() as u64,
        size_out,
        with_imatrix: im,
    }
}

fn output_size(p: &Planned<'_>) -> Result<u64, QuantizeError> {
    let rows: u64 = p.shape.ne[1..].iter().product();
    p.target
        .row_size(p.shape.ne[0])
        .ok()
        .and_then(|r| r.checked_mul(rows))
        .filter(|&s| usize::try_from(s).is_ok())
        .ok_or_else(|| QuantizeError::TooLarge(p.name.clone()))
}

/// The input tensor as f32, rows split over the threads.
fn to_f32(
    p: &Planned<'_>,
    out: &mut [f32],
    n_per_row: usize,
    nthread: usize,
) -> Result<(), QuantizeError> {
    let from = p.shape.dtype;
    let row_in = from
        .row_size(n_per_row as u64)
        .map_err(|_| QuantizeError::TooLarge(p.name.clone()))? as usize;
    let err = |source| QuantizeError::Dequantize {
        tensor: p.name.clone(),
        from,
        source,
    };
    if !quant::supports_dequantize(from) {
        return Err(err(QuantError::UnsupportedType(from)));
    }
    parallel_rows(p.data, out, row_in, n_per_row, nthread, |_, src, dst| {
        quant::dequantize_row(from, src, dst).map_err(err)
    })
}

/// Quantizes `src` (f32 rows) into `dst` as the tensor's target type; experts (the third
/// dimension) each use their own slice of the importance matrix.
fn quantize_rows(
    p: &Planned<'_>,
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    imatrix: Option<&[f32]>,
    nthread: usize,
) -> Result<(), QuantizeError> {
    let to = p.target;
    let row_out = to
        .row_size(n_per_row as u64)
        .map_err(|_| QuantizeError::TooLarge(p.name.clone()))? as usize;
    let rows_per_expert = p.shape.ne[1] as usize;
    let err = |source| QuantizeError::Quantize {
        tensor: p.name.clone(),
        to,
        source,
    };
    if !quant::supports_dequantize(to) {
        return Err(err(QuantError::UnsupportedType(to)));
    }
    // Validation reads the row back, as ggml_validate_row_data checks what was written.
    let check = |row: &[u8], scratch: &mut Vec<f32>| -> Result<(), QuantizeError> {
        scratch.resize(n_per_row, 0.0);
        let ok = quant::dequantize_row(to, row, scratch).is_ok()
            && scratch.iter().all(|v| v.is_finite());
        if ok {
            Ok(())
        } else {
            Err(QuantizeError::Validation {
                tensor: p.name.clone(),
                to,
            })
        }
    };
    parallel_rows_out(
        src,
        dst,
        n_per_row,
        row_out,
        nthread,
        |row, x, y, scratch| {
            let weights = imatrix.map(|m| {
                let expert = row / rows_per_expert.max(1);
                &m[expert * n_per_row..(expert + 1) * n_per_row]
            });
            quant::quantize_row_weighted(to, x, y, weights).map_err(err)?;
            check(y, scratch)
        },
    )
}

/// Runs `f(row, src_row, dst_row)` over byte rows of `src` and f32 rows of `dst`, in
/// contiguous row ranges, one per thread.
fn parallel_rows<E: Send>(
    src: &[u8],
    dst: &mut [f32],
    row_in: usize,
    n_per_row: usize,
    nthread: usize,
    f: impl Fn(usize, &[u8], &mut [f32]) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let rows = dst.len() / n_per_row.max(1);
    let per = rows.div_ceil(nthread.max(1)).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = dst
            .chunks_mut(per * n_per_row)
            .zip(src.chunks(per * row_in))
            .enumerate()
            .map(|(c, (d, sr))| {
                let f = &f;
                s.spawn(move || {
                    for (r, (dr, srow)) in
                        d.chunks_mut(n_per_row).zip(sr.chunks(row_in)).enumerate()
                    {
                        f(c * per + r, srow, dr)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a quantize worker panicked"))
    })
}

/// As [`parallel_rows`], f32 rows in and byte rows out, with a per-thread scratch buffer.
fn parallel_rows_out<E: Send>(
    src: &[f32],
    dst: &mut [u8],
    n_per_row: usize,
    row_out: usize,
    nthread: usize,
    f: impl Fn(usize, &[f32], &mut [u8], &mut Vec<f32>) -> Result<(), E> + Sync,
) -> Result<(), E> {
    let rows = src.len() / n_per_row.max(1);
    let per = rows.div_ceil(nthread.max(1)).max(1);
    std::thread::scope(|s| {
        let handles: Vec<_> = dst
            .chunks_mut(per * row_out)
            .zip(src.chunks(per * n_per_row))
            .enumerate()
            .map(|(c, (d, sr))| {
                let f = &f;
                s.spawn(move || {
                    let mut scratch = Vec::new();
                    for (r, (drow, srow)) in
                        d.chunks_mut(row_out).zip(sr.chunks(n_per_row)).enumerate()
                    {
                        f(c * per + r, srow, drow, &mut scratch)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().expect("a quantize worker panicked"))
    })
}

/// The type llama.cpp's loader guesses the file type from: the first to reach the highest
/// count, counting in tensor order.
fn most_common_type<'a>(tensors: impl Iterator<Item = &'a TensorInfo>) -> DType {
    let mut counts: HashMap<DType, usize> = HashMap::new();
    let mut best = (DType::F32, 0);
    for t in tensors {
        let t = t.dtype;
        let n = counts.entry(t).or_default();
        *n += 1;
        if *n > best.1 {
            best = (t, *n);
        }
    }
    best.0
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

/// `--prune-layers`: llama.cpp's `remap_layer` (drop the listed blocks, renumber the rest down)
/// and `remap_imatrix` (the original name, for the importance lookup).
struct LayerPruner {
    prune: Vec<u32>,
    mapped: BTreeMap<i64, Option<i64>>,
    next_id: i64,
    pattern: Regex,
}

impl LayerPruner {
    fn new(prune: &[u32]) -> LayerPruner {
        LayerPruner {
            prune: prune.to_vec(),
            mapped: BTreeMap::new(),
            next_id: 0,
            pattern: Regex::new(r"blk\.(\d+)\.").expect("a valid pattern"),
        }
    }

    /// The name in the output, `None` for a pruned tensor.
    fn remap(&mut self, name: &str) -> Option<String> {
        if self.prune.is_empty() {
            return Some(name.to_string());
        }
        let Some(caps) = self.pattern.captures(name) else {
            return Some(name.to_string());
        };
        let m = caps.get(1).expect("group 1");
        let blk: i64 = m.as_str().parse().unwrap_or(i64::MAX);
        if !self.mapped.contains_key(&blk) {
            let first = i64::from(self.prune[0]);
            let id = if self.prune.iter().any(|&p| i64::from(p) == blk) {
                None
            } else if blk < first {
                self.next_id = blk + 1;
                Some(blk)
            } else {
                let id = self.next_id;
                self.next_id += 1;
                Some(id)
            };
            self.mapped.insert(blk, id);
        }
        let id = self.mapped[&blk]?;
        Some(format!("{}{id}{}", &name[..m.start()], &name[m.end()..]))
    }

    /// The input name of output tensor `name`.
    fn original_name(&self, name: &str) -> String {
        if self.mapped.is_empty() {
            return name.to_string();
        }
        let Some(caps) = self.pattern.captures(name) else {
            return name.to_string();
        };
        let m = caps.get(1).expect("group 1");
        let blk: i64 = m.as_str().parse().unwrap_or(-1);
        match self.mapped.iter().find(|(_, v)| **v == Some(blk)) {
            Some((orig, _)) => format!("{}{orig}{}", &name[..m.start()], &name[m.end()..]),
            None => name.to_string(),
        }
    }
}

/// The output path llama-quantize picks when only a type is given: `ggml-model-{TYPE}.gguf`
/// next to the input.
pub fn default_output_path(input: &Path, type_name: &str) -> PathBuf {
    let dir = input.parent().unwrap_or(Path::new(""));
    dir.join(format!("ggml-model-{type_name}.gguf"))
}
