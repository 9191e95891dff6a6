//! The matmul observer (ggml's eval callback): it sees every product with a weight it asks for,
//! with the input the product used, and watching changes no logit. On the random-weight
//! llama-with-experts model of tests/archs (dense attention products, MUL_MAT_ID experts), on
//! one device and on two with a layer split.

use std::path::Path;
use std::sync::{Arc, Mutex};

use lamina_backend::Device;
use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_model::observe::{MatmulInfo, MatmulKind, MatmulObserver};
use lamina_model::{Batch, Context, ContextParams, FlashAttn, Model, Placement, SplitMode};

fn load(n_devices: usize) -> Arc<Model> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/archs/llama-moe.gguf");
    let reg =
        CpuBackendReg::new(CpuConfig::default().with_devices(n_devices).with_threads(2)).unwrap();
    let devices: Vec<Arc<dyn Device>> = reg
        .cpu_devices()
        .iter()
        .map(|d| d.clone() as Arc<dyn Device>)
        .collect();
    let placement = Placement {
        host: devices[0].clone(),
        devices,
        split_mode: SplitMode::Layer,
        tensor_split: Vec::new(),
        n_gpu_layers: None,
        main_gpu: 0,
    };
    Arc::new(Model::load_placed(path, &placement).unwrap())
}

/// One collect call: weight, kind, input rows, row width, ids.
type Collected = (String, MatmulKind, usize, usize, Option<Vec<i32>>);

#[derive(Default)]
struct Seen {
    asked: Vec<MatmulInfo>,
    collected: Vec<Collected>,
}

#[derive(Clone)]
struct Recorder(Arc<Mutex<Seen>>);

impl MatmulObserver for Recorder {
    fn ask(&mut self, info: &MatmulInfo) -> bool {
        self.0.lock().unwrap().asked.push(info.clone());
        info.weight != "output.weight"
    }

    fn collect(&mut self, info: &MatmulInfo, input: &[f32], ids: Option<&[i32]>) {
        let ne = info.input_ne;
        assert_eq!(input.len(), ne.iter().product::<usize>());
        assert!(input.iter().all(|v| v.is_finite()));
        self.0.lock().unwrap().collected.push((
            info.weight.clone(),
            info.kind,
            input.len() / ne[0],
            ne[0],
            ids.map(<[i32]>::to_vec),
        ));
    }
}

fn run(model: Arc<Model>, observe: bool) -> (Vec<Vec<f32>>, Seen) {
    let params = ContextParams {
        n_ctx: 256,
        n_ubatch: 24,
        flash_attn: FlashAttn::Off,
        n_threads: 2,
        ..Default::default()
    };
    let mut ctx = Context::new(model, params).unwrap();
    let seen = Arc::new(Mutex::new(Seen::default()));
    if observe {
        assert!(
            ctx.set_matmul_observer(Some(Box::new(Recorder(seen.clone()))))
                .is_none()
        );
    }
    let mut batch = Batch::default();
    for i in 0..24u32 {
        batch.push((i * 37 + 5) % 128, i as i32, 0, true);
    }
    ctx.decode(&batch).unwrap();
    let logits = (0..24).map(|i| ctx.logits(i).unwrap().to_vec()).collect();
    assert_eq!(ctx.set_matmul_observer(None).is_some(), observe);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    (logits, seen)
}

#[test]
fn observer_sees_every_weight_product_and_changes_nothing() {
    for n_devices in [1, 2] {
        let model = load(n_devices);
        let (plain, _) = run(model.clone(), false);
        let (watched, seen) = run(model, true);
        assert_eq!(
            plain, watched,
            "{n_devices} devices: watching changed the logits"
        );

        let names: Vec<&str> = seen.asked.iter().map(|i| i.weight.as_str()).collect();
        for l in 0..2 {
            for w in ["attn_q", "attn_k", "attn_v", "attn_output"] {
                let name = format!("blk.{l}.{w}.weight");
                let info = seen.asked.iter().find(|i| i.weight == name).unwrap();
                assert_eq!(info.kind, MatmulKind::MulMat);
                assert_eq!(info.input_ne[1], 24, "{name}");
            }
            for w in ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"] {
                let name = format!("blk.{l}.{w}.weight");
                let info = seen.asked.iter().find(|i| i.weight == name).unwrap();
                assert_eq!(info.kind, MatmulKind::MulMatId, "{name}");
                assert_eq!(info.ids_ne.unwrap()[1], 24);
            }
        }
        // Products with activations (K·Q, V·softmax) are not weight products.
        assert!(names.iter().all(|n| n.ends_with(".weight")), "{names:?}");
        // Everything asked for except the LM head was collected, once, with its rows.
        let wanted = seen
            .asked
            .iter()
            .filter(|i| i.weight != "output.weight")
            .count();
        assert_eq!(seen.collected.len(), wanted);
        for (name, kind, rows, width, ids) in &seen.collected {
            let info = seen.asked.iter().find(|i| &i.weight == name).unwrap();
            assert_eq!(*width, info.input_ne[0]);
            match kind {
                MatmulKind::MulMat => assert_eq!(*rows, 24, "{name}"),
                MatmulKind::MulMatId => {
                    let ids = ids.as_ref().unwrap();
                    let n_expert = info.weight_ne[2] as i32;
                    assert_eq!(ids.len(), info.ids_ne.unwrap()[0] * 24);
                    assert!(ids.iter().all(|&e| (0..n_expert).contains(&e)), "{ids:?}");
                }
            }
        }
    }
}
