use lamina_cpu::{CpuBackendReg, CpuConfig};
use lamina_model::{Batch, Context, ContextParams, Model};
use std::sync::Arc;
fn main() {
    let name = std::env::args().nth(1).unwrap();
    let r: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string("/work/shared/reference/outputs.json").unwrap(),
    )
    .unwrap();
    let reg = CpuBackendReg::new(CpuConfig::default().with_devices(1)).unwrap();
    let path = lamina_gguf::pull::cached_model_path(&name).unwrap();
    let model = Arc::new(Model::load(path, reg.cpu_devices()[0].clone()).unwrap());
    let mut ctx = Context::new(
        model,
        ContextParams {
            n_ctx: 512,
            ..Default::default()
        },
    )
    .unwrap();
    for p in r["models"][&name]["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .take(2)
    {
        let tokens: Vec<u32> = p["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap() as u32)
            .collect();
        ctx.clear();
        let mut batch = Batch::default();
        for (i, &t) in tokens.iter().enumerate() {
            batch.push(t, i as i32, 0, true);
        }
        ctx.decode(&batch).unwrap();
        for (i, pos) in p["positions"].as_array().unwrap().iter().enumerate() {
            let l = ctx.logits(i).unwrap();
            let max = l.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let lse = max + l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            let diffs: Vec<String> = pos["top"]
                .as_array()
                .unwrap()
                .iter()
                .take(4)
                .map(|e| {
                    format!(
                        "{}:{:.3}/{:.3}",
                        e[0],
                        l[e[0].as_u64().unwrap() as usize],
                        e[1].as_f64().unwrap()
                    )
                })
                .collect();
            println!(
                "pos {i}: lse {lse:.3} ref {:.3}  {}",
                pos["logsumexp"].as_f64().unwrap(),
                diffs.join(" ")
            );
        }
    }
}
