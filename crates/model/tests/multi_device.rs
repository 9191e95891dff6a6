//! Proof that splitting a model over devices changes nothing: SmolLM2 and Gemma 3 on 1, 2, 3 and
//! 4 virtual CPU devices, with even and uneven layer splits, partial offload, `--split-mode
//! none` and with or without pipeline parallelism, give logits bit-identical to one device,
//! the same greedy tokens and the same perplexity (every scored token's NLL identical).
//!
//! Bit-identity holds because every device runs the same kernels on the same data: the
//! scheduler only moves activations (exact copies) and the kernels' per-element arithmetic does
//! not depend on how many threads a device has. Also checked: every split of every scheduled
//! graph touches only its own device's memory.

use std::sync::Arc;

use lamina_backend::{Device, Scheduler};
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_gguf::pull::model_for_test;
use lamina_model::arch::{BuildContext, GraphShape, build_graph};
use lamina_model::kv_cache::KvCache;
use lamina_model::perplexity::{PerplexityError, PerplexityPlan, eval_chunk_group, token_nll};
use lamina_model::{Batch, Context, ContextParams, Model, Placement, SplitMode};

const SHORT_TEXT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/reference/areopagitica-short.txt"
);

/// One way of placing the model.
#[derive(Clone, Debug)]
struct Config {
    name: &'static str,
    n_devices: usize,
    split_mode: SplitMode,
    tensor_split: Vec<f32>,
    /// `-ngl` as a number of layers below the total (`None`: all).
    layers_not_offloaded: Option<usize>,
    main_gpu: usize,
    pipeline: bool,
    /// Weights copied into each device's memory instead of mapped (`--no-mmap`).
    no_mmap: bool,
}

fn config(name: &'static str, n_devices: usize, tensor_split: &[f32]) -> Config {
    Config {
        name,
        n_devices,
        split_mode: SplitMode::Layer,
        tensor_split: tensor_split.to_vec(),
        layers_not_offloaded: None,
        main_gpu: 0,
        pipeline: true,
        no_mmap: false,
    }
}

fn configs() -> Vec<Config> {
    vec![
        config("2 devices, even", 2, &[]),
        Config {
            pipeline: false,
            ..config("2 devices, 3:1, no pipeline", 2, &[3.0, 1.0])
        },
        config("3 devices, 1:2:1", 3, &[1.0, 2.0, 1.0]),
        config("4 devices, even", 4, &[]),
        Config {
            layers_not_offloaded: Some(10),
            ..config(
                "4 devices, partial offload, 1:1:2:0",
                4,
                &[1.0, 1.0, 2.0, 0.0],
            )
        },
        Config {
            no_mmap: true,
            ..config(
                "3 devices, 1:2:1, weights copied (--no-mmap)",
                3,
                &[1.0, 2.0, 1.0],
            )
        },
        Config {
            split_mode: SplitMode::None,
            main_gpu: 2,
            ..config("3 devices, split none on device 2", 3, &[])
        },
    ]
}

/// Loads `path` placed as `c` says, on `c.n_devices` virtual CPU devices sharing 2 threads.
fn load(path: &std::path::Path, c: &Config) -> Arc<Model> {
    let reg = CpuBackendReg::new(
        CpuConfig::default()
            .with_devices(c.n_devices)
            .with_threads(2),
    )
    .unwrap();
    let devices: Vec<Arc<dyn Device>> = reg
        .cpu_devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn Device>)
        .collect();
    let file = lamina_gguf::GgufFile::open(path).unwrap();
    let n_layer = lamina_model::HParams::from_gguf(&file).unwrap().n_layer as usize;
    let placement = Placement {
        host: devices[0].clone(),
        devices,
        split_mode: c.split_mode,
        tensor_split: c.tensor_split.clone(),
        n_gpu_layers: c.layers_not_offloaded.map(|k| n_layer + 1 - k),
        main_gpu: c.main_gpu,
    };
    let options = lamina_model::LoadOptions {
        no_mmap: c.no_mmap,
        progress: None,
    };
    Arc::new(Model::load_with_options(path, &placement, &options).unwrap())
}

/// What one placement produces: all-position prompt logits (as bits), greedy tokens, and the
/// NLL (as bits) of every token perplexity scores.
#[derive(PartialEq, Debug)]
struct Outcome {
    logits: Vec<u32>,
    greedy: Vec<u32>,
    nll: Vec<u64>,
}

fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in l.iter().enumerate() {
        if x > l[best] {
            best = i;
        }
    }
    best as u32
}

fn run(model: Arc<Model>, pipeline: bool) -> Outcome {
    let tok = lamina_tokenizer::Tokenizer::from_gguf(&model.file).unwrap();
    let text = std::fs::read_to_string(SHORT_TEXT).unwrap();

    // Prompt: 40 tokens, logits everywhere, in micro-batches of 16 (several in flight).
    let prompt: Vec<u32> = tok.tokenize(&text, true, false)[..40].to_vec();
    let mut ctx = Context::new(
        model.clone(),
        ContextParams {
            n_ctx: 256,
            n_ubatch: 16,
            pipeline_parallel: pipeline,
            ..Default::default()
        },
    )
    .unwrap();
    let mut batch = Batch::default();
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as i32, 0, true);
    }
    ctx.decode(&batch).unwrap();
    let mut logits = Vec::new();
    for i in 0..prompt.len() {
        logits.extend(ctx.logits(i).unwrap().iter().map(|x| x.to_bits()));
    }
    // Greedy continuation, one token at a time.
    let mut greedy = Vec::new();
    let mut next = argmax(ctx.logits(prompt.len() - 1).unwrap());
    for i in 0..12 {
        greedy.push(next);
        ctx.decode(&Batch::sequence(&[next], (prompt.len() + i) as i32, 0))
            .unwrap();
        next = argmax(ctx.last_logits().unwrap());
    }

    // Perplexity as llama-perplexity computes it: 4 chunks of 64 as parallel sequences.
    let tokens = tok.tokenize(&text, true, false);
    let bos = tok.add_bos().then(|| tok.bos()).flatten();
    let plan = PerplexityPlan::new(&tokens, 64, 256, bos)
        .unwrap()
        .with_max_chunks(4)
        .unwrap();
    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 64 * plan.n_seq(),
            n_ubatch: 64,
            n_seq_max: plan.n_seq(),
            pipeline_parallel: pipeline,
            ..Default::default()
        },
    )
    .unwrap();
    let mut nll = Vec::new();
    let groups: Vec<_> = plan.chunk_groups().collect();
    for group in groups {
        let start = group.start;
        eval_chunk_group(
            &mut ctx,
            &plan,
            group,
            |seq, pos, logits| -> Result<(), PerplexityError> {
                let chunk = plan.chunk(start + seq).unwrap();
                nll.push(token_nll(logits, chunk.targets[pos - chunk.first])?.to_bits());
                Ok(())
            },
        )
        .unwrap();
    }
    assert!(!nll.is_empty());
    Outcome {
        logits,
        greedy,
        nll,
    }
}

/// Schedules a worst-case graph of `model` and checks that no split touches another device's
/// memory, and that the splits follow the layer plan.
fn check_residency(model: &Model) {
    for flash_attn in [true, false] {
        check_residency_with(model, flash_attn);
    }
}

fn check_residency_with(model: &Model, flash_attn: bool) {
    let plan = model.plan();
    let format = lamina_model::KvFormat {
        type_k: lamina_core::DType::F16,
        type_v: lamina_core::DType::F16,
        v_trans: !flash_attn,
    };
    let kv = KvCache::new(&plan.devices, &plan.layers, &model.hparams, 256, format).unwrap();
    let kv_memory: Vec<_> = (0..plan.devices.len())
        .map(|d| kv.buffer(d).map(|b| b.memory()))
        .collect();
    let bc = BuildContext {
        arch: model.arch.as_ref(),
        weights: model.weights(),
        plan,
        kv: &kv,
        kv_memory: &kv_memory,
        flash_attn,
        n_threads: 2,
    };
    let shape = GraphShape {
        n_tokens: 8,
        kv_start: 0,
        n_kv: 256,
        n_outputs: 8,
        embeddings: false,
    };
    let built = build_graph(&bc, shape).unwrap();
    let mut sched = Scheduler::new(plan.devices.clone(), true).unwrap();
    let sg = sched.schedule(built.graph, &built.hints).unwrap();
    sg.check_residency(&plan.devices).unwrap();
    // One split per change of device along input layer → layers → output layer.
    let mut order = vec![plan.input];
    order.extend(&plan.layers);
    order.push(plan.output);
    order.dedup();
    let devices: Vec<usize> = sg.splits().iter().map(|s| s.device).collect();
    assert_eq!(devices, order, "splits follow the layer plan");
    assert!(sg.n_copies() >= order.len() - 1);
}

fn prove(name: &str) {
    let Some(path) = model_for_test(name) else {
        return;
    };
    if std::fs::metadata(SHORT_TEXT).is_err() {
        eprintln!("skipping: ../shared/reference is absent");
        return;
    }
    let one = config("1 device", 1, &[]);
    let baseline = run(load(&path, &one), true);
    for c in configs() {
        let model = load(&path, &c);
        let plan = model.plan();
        eprintln!(
            "{name}: {}: devices {:?}, input {}, layers {:?}, output {}",
            c.name,
            plan.devices.iter().map(|d| d.name()).collect::<Vec<_>>(),
            plan.input,
            plan.layers,
            plan.output
        );
        check_residency(&model);
        if c.no_mmap {
            // Each device holds copies of its own layers' weights (and the global ones), so
            // none holds the whole file.
            let file_len = model.file.bytes().len();
            for (d, store) in model.weights().iter().enumerate() {
                assert!(store.is_uploaded(), "{name}: device {d} maps the file");
                assert!(store.size() < file_len, "{name}: device {d} has it all");
            }
        }
        let got = run(model, c.pipeline);
        assert!(
            got.logits == baseline.logits,
            "{name}, {}: prompt logits differ from one device",
            c.name
        );
        assert_eq!(got.greedy, baseline.greedy, "{name}, {}: greedy", c.name);
        assert_eq!(got.nll, baseline.nll, "{name}, {}: perplexity", c.name);
    }
}

#[test]
fn smollm2_identical_on_1_to_4_devices() {
    prove("smollm2-135m");
}

#[test]
fn gemma3_identical_on_1_to_4_devices() {
    prove("gemma3-270m");
}

/// The layer plan follows llama.cpp's arithmetic: 30 layers plus the output layer split 1:2:1
/// give 8, 16 and 6 layers, the output layer on the last device; `-ngl 16` offloads layers
/// 14–29 and keeps the first 14 and the output layer on the host.
#[test]
fn layer_plan_like_llama_cpp() {
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(3).with_threads(3)).unwrap();
    let devices: Vec<Arc<dyn Device>> = reg
        .cpu_devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn Device>)
        .collect();
    let mut p = Placement::layer_split(devices.clone()).unwrap();
    p.tensor_split = vec![1.0, 2.0, 1.0];
    let plan = p.plan(30).unwrap();
    let count = |d: usize| plan.layers.iter().filter(|&&x| x == d).count();
    assert_eq!((count(0), count(1), count(2)), (8, 16, 6));
    assert_eq!((plan.input, plan.output), (0, 2));

    p.n_gpu_layers = Some(16);
    p.tensor_split = vec![0.0, 1.0, 1.0];
    let plan = p.plan(30).unwrap();
    let names: Vec<&str> = plan.devices.iter().map(|d| d.name()).collect();
    assert_eq!(names, ["CPU0", "CPU1", "CPU2"]);
    assert!(plan.layers[..14].iter().all(|&d| d == 0));
    assert!(plan.layers[14..].iter().all(|&d| d != 0));
    assert_eq!(
        plan.output, 0,
        "-ngl 16 < 31 leaves the output layer on the host"
    );

    // Bad settings are errors, not panics.
    p.split_mode = SplitMode::Row;
    assert!(p.plan(30).is_err());
    p.split_mode = SplitMode::Layer;
    p.tensor_split = vec![1.0, 1.0, 1.0, 1.0];
    assert!(p.plan(30).is_err());
    p.tensor_split = vec![0.0, 0.0, -1.0];
    assert!(p.plan(30).is_err());
    p.tensor_split = vec![];
    p.split_mode = SplitMode::None;
    p.main_gpu = 3;
    assert!(p.plan(30).is_err());
    assert!(lamina_model::placement::devices_by_name("CPU1,GPU7", &devices).is_err());
    assert!(lamina_model::placement::devices_by_name("CPU1,CPU1", &devices).is_err());
    assert_eq!(
        lamina_model::placement::devices_by_name("cpu2,CPU0", &devices)
            .unwrap()
            .iter()
            .map(|d| d.name())
            .collect::<Vec<_>>(),
        ["CPU2", "CPU0"]
    );
}
