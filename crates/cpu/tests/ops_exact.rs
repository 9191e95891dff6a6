//! Bit-exactness of the CPU backend's MoE-era graph ops against llama.cpp itself:
//! `data/ops_vectors.bin` holds the inputs and outputs of ggml graphs computed by ggml-cpu
//! (llama.cpp 0c1e570 as vendored in llama-cpp-python 0.3.36, built for AVX2/FMA/F16C as the
//! reference build was), written by `data/ops_harness.c` via `data/gen_ops_vectors.sh`:
//! mul_mat_id over 14 weight types (MXFP4 included) (with the weights in ggml's `CPU_REPACK` buffer where
//! llama.cpp puts them), argsort / top_k with ties, the unary and GLU ops, softmax with sinks,
//! build_moe_ffn's routing chains (softmax, biased argsort_top_k, 3-D get_rows, sum_rows,
//! clamp, div, broadcast mul, add_id; DeepSeek-V3's grouped selection with fill + set_rows),
//! RoPE of the trailing dims, div / sum_rows / repeat / fill. Each graph runs through
//! the graph allocator on one device and on each of 3 virtual devices, and every output must
//! have llama.cpp's bits (NaNs: any NaN).

mod common;

use std::sync::Arc;

use common::{Record, run_graph};
use lamina_backend::Device;
use lamina_core::DType;
use lamina_core::graph::{GluOp, Graph, RopeMode, RopeParams, SortOrder, TensorId, UnaryOp};
use lamina_cpu::{CpuBackendReg, CpuConfig};

const VECTORS: &[u8] = include_bytes!("data/ops_vectors.bin");

fn records() -> Vec<Record<'static>> {
    common::records(VECTORS)
}

fn devices() -> Vec<Arc<dyn Device>> {
    let one = CpuBackendReg::new(CpuConfig::default().with_devices(1).with_threads(3)).unwrap();
    let three = CpuBackendReg::new(CpuConfig::default().with_devices(3).with_threads(6)).unwrap();
    one.cpu_devices()
        .iter()
        .chain(three.cpu_devices())
        .map(|d| d.clone() as Arc<dyn Device>)
        .collect()
}

/// Output bytes (as f32 bits) must equal llama.cpp's; any NaN matches any NaN.
fn assert_bits(got: &[f32], want: &[u8], what: &str) {
    assert_eq!(got.len() * 4, want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want.chunks_exact(4)).enumerate() {
        let w = f32::from_le_bytes(w.try_into().unwrap());
        assert!(
            g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()),
            "{what}: element {i}: {g:e} ({:#x}) vs llama.cpp {w:e} ({:#x})",
            g.to_bits(),
            w.to_bits()
        );
    }
}

/// A graph with its inputs' bytes and its outputs with llama.cpp's bytes.
struct Case {
    g: Graph,
    inputs: Vec<(TensorId, Vec<u8>)>,
    outputs: Vec<(TensorId, &'static [u8], String)>,
}

impl Case {
    fn new() -> Case {
        Case {
            g: Graph::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    fn input(&mut self, dtype: DType, ne: &[usize], bytes: &[u8]) -> TensorId {
        let id = self.g.new_input(dtype, ne).unwrap();
        self.inputs.push((id, bytes.to_vec()));
        id
    }

    fn output(&mut self, id: TensorId, want: &'static [u8], what: impl Into<String>) {
        self.g.set_output(id).unwrap();
        self.outputs.push((id, want, what.into()));
    }

    fn check(self, devs: &[Arc<dyn Device>]) {
        let ids: Vec<TensorId> = self.outputs.iter().map(|o| o.0).collect();
        for dev in devs {
            let got = run_graph(&**dev, self.g.clone(), self.inputs.clone(), &ids);
            for (g, (_, want, what)) in got.iter().zip(&self.outputs) {
                assert_bits(g, want, &format!("{what} on {}", dev.name()));
            }
        }
    }
}

fn dims(name: &str) -> Vec<usize> {
    name.split(':').filter_map(|p| p.parse().ok()).collect()
}

#[test]
fn unary_ops_match_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records().iter().filter(|r| r.name.starts_with("unary:")) {
        let op = r.name.split(':').nth(1).unwrap();
        let d = dims(r.name);
        let mut c = Case::new();
        let a = c.input(DType::F32, &[d[0], d[1]], r.arrays[0]);
        let out = match op {
            "sigmoid" => c.g.sigmoid(a),
            "softplus" => c.g.softplus(a),
            "tanh" => c.g.tanh(a),
            "relu" => c.g.relu(a),
            "sqr" => c.g.sqr(a),
            "sqrt" => c.g.sqrt(a),
            "exp" => c.g.exp(a),
            "gelu_erf" => c.g.unary(a, UnaryOp::GeluErf),
            "clamp" => c.g.clamp(a, -2.5, 6.103_515_6e-5),
            _ => panic!("unknown op {op}"),
        }
        .unwrap();
        c.output(out, r.arrays[1], r.name);
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 27);
}

#[test]
fn glu_ops_match_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records().iter().filter(|r| r.name.starts_with("glu:")) {
        let op = r.name.split(':').nth(1).unwrap();
        let d = dims(r.name);
        let mut c = Case::new();
        let a = c.input(DType::F32, &[d[0], d[1]], r.arrays[0]);
        let b = c.input(DType::F32, &[d[0], d[1]], r.arrays[1]);
        let out = match op {
            "reglu" => c.g.reglu_split(a, b),
            "geglu_erf" => c.g.glu_split(GluOp::GeGluErf, a, b),
            "swiglu_oai" => c.g.swiglu_oai(a, b, 1.702, 7.0),
            "swiglu_clamp" => c.g.swiglu_clamp(a, b, 7.0),
            _ => panic!("unknown op {op}"),
        }
        .unwrap();
        c.output(out, r.arrays[2], r.name);
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 8);
}

#[test]
fn soft_max_sinks_match_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records()
        .iter()
        .filter(|r| r.name.starts_with("softmax_sinks:"))
    {
        let d = dims(r.name);
        let (nkv, nq, nh, masked) = (d[0], d[1], d[2], d[3] == 1);
        let mut c = Case::new();
        let a = c.input(DType::F32, &[nkv, nq, nh], r.arrays[0]);
        let mask = masked.then(|| c.input(DType::F32, &[nkv, nq], r.arrays[1]));
        let sinks = c.input(DType::F32, &[nh], r.arrays[2]);
        let out = c.g.soft_max_ext(a, mask, 0.125, 0.0).unwrap();
        c.g.soft_max_add_sinks(out, sinks).unwrap();
        c.output(out, r.arrays[3], r.name);
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 4);
}

#[test]
fn argsort_and_top_k_match_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records().iter().filter(|r| r.name.starts_with("argsort:")) {
        let d = dims(r.name);
        let (ne0, ne1, k) = (d[0], d[1], d[3]);
        let mut c = Case::new();
        let a = c.input(DType::F32, &[ne0, ne1], r.arrays[0]);
        let asc = c.g.argsort(a, SortOrder::Asc).unwrap();
        let desc = c.g.argsort(a, SortOrder::Desc).unwrap();
        let tk = c.g.top_k(a, k).unwrap();
        let atk = c.g.argsort_top_k(a, k).unwrap();
        let atk = c.g.cont(atk).unwrap();
        c.output(asc, r.arrays[1], format!("{} asc", r.name));
        c.output(desc, r.arrays[2], format!("{} desc", r.name));
        c.output(tk, r.arrays[3], format!("{} top_k", r.name));
        c.output(atk, r.arrays[4], format!("{} argsort_top_k", r.name));
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 9);
}

/// build_moe_ffn's routing as llama.cpp builds it, op for op.
#[test]
fn moe_routing_matches_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records()
        .iter()
        .filter(|r| r.name.starts_with("moe_route:"))
    {
        let d = dims(r.name);
        let (n_expert, n_used, n_tok, n_embd) = (d[0], d[1], d[2], d[3]);
        let mut c = Case::new();
        let logits = c.input(DType::F32, &[n_expert, n_tok], r.arrays[0]);
        let bias = c.input(DType::F32, &[n_expert], r.arrays[1]);
        let experts = c.input(DType::F32, &[n_embd, n_used, n_tok], r.arrays[2]);
        let ebias = c.input(DType::F32, &[n_embd, n_expert], r.arrays[3]);
        let g = &mut c.g;
        let probs = g.soft_max(logits).unwrap();
        let sel_probs = g.add(probs, bias).unwrap();
        let selected = g.argsort_top_k(sel_probs, n_used).unwrap();
        let p3 = g.reshape(probs, &[1, n_expert, n_tok]).unwrap();
        let weights = g.get_rows(p3, selected).unwrap();
        let w2 = g.reshape(weights, &[n_used, n_tok]).unwrap();
        let wsum = g.sum_rows(w2).unwrap();
        let wsum = g
            .clamp(
                wsum,
                6.103_515_6e-5, /* 2^-14, llama.cpp's 6.103515625e-5 */
                f32::INFINITY,
            )
            .unwrap();
        let wn = g.div(w2, wsum).unwrap();
        let wn3 = g.reshape(wn, &[1, n_used, n_tok]).unwrap();
        let weighted = g.mul(experts, wn3).unwrap();
        let biased = g.add_id(experts, ebias, selected).unwrap();
        let selc = g.cont(selected).unwrap();
        c.output(probs, r.arrays[4], format!("{} probs", r.name));
        c.output(selc, r.arrays[5], format!("{} selected", r.name));
        c.output(weights, r.arrays[6], format!("{} weights", r.name));
        c.output(wn, r.arrays[7], format!("{} normalized", r.name));
        c.output(weighted, r.arrays[8], format!("{} weighted", r.name));
        c.output(biased, r.arrays[9], format!("{} add_id", r.name));
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 3);
}

/// DeepSeek-V3's grouped routing as build_moe_ffn builds it: sigmoid gating, selection bias,
/// the best `n_group_used` groups by the sum of their two best experts, the others masked
/// with fill + set_rows, then the top experts and their weights.
#[test]
fn moe_group_routing_matches_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records()
        .iter()
        .filter(|r| r.name.starts_with("moe_groups:"))
    {
        let d = dims(r.name);
        let (n_expert, n_groups, n_group_used, n_used, n_tok) = (d[0], d[1], d[2], d[3], d[4]);
        let epg = n_expert / n_groups;
        let mut c = Case::new();
        let logits = c.input(DType::F32, &[n_expert, n_tok], r.arrays[0]);
        let bias = c.input(DType::F32, &[n_expert], r.arrays[1]);
        let g = &mut c.g;
        let probs = g.sigmoid(logits).unwrap();
        let sel = g.add(probs, bias).unwrap();
        let groups = g.reshape(sel, &[epg, n_groups, n_tok]).unwrap();
        let gs = g.argsort_top_k(groups, 2).unwrap();
        let g4 = g.reshape(groups, &[1, epg, n_groups, n_tok]).unwrap();
        let gs = g.get_rows(g4, gs).unwrap();
        let gs = g.reshape(gs, &[2, n_groups, n_tok]).unwrap();
        let gs = g.sum_rows(gs).unwrap();
        let gs = g.reshape(gs, &[n_groups, n_tok]).unwrap();
        let eg = g.argsort_top_k(gs, n_group_used).unwrap();
        let sp = g.get_rows(groups, eg).unwrap();
        let masked = g.fill(groups, f32::NEG_INFINITY).unwrap();
        let sp = g.set_rows(masked, sp, eg).unwrap();
        let sp = g.reshape(sp, &[n_expert, n_tok]).unwrap();
        let selected = g.argsort_top_k(sp, n_used).unwrap();
        let p3 = g.reshape(probs, &[1, n_expert, n_tok]).unwrap();
        let weights = g.get_rows(p3, selected).unwrap();
        let spc = g.cont(sp).unwrap();
        let selc = g.cont(selected).unwrap();
        c.output(spc, r.arrays[2], format!("{} masked", r.name));
        c.output(selc, r.arrays[3], format!("{} selected", r.name));
        c.output(weights, r.arrays[4], format!("{} weights", r.name));
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 3);
}

/// RoPE of the trailing dims (ggml_rope_set_offset, DeepSeek-2's MHA path).
#[test]
fn rope_offset_matches_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records()
        .iter()
        .filter(|r| r.name.starts_with("rope_offs:"))
    {
        let d = dims(r.name);
        let (mode, head, n_dims, n_offs, n_head, n_tok) = (d[0], d[1], d[2], d[3], d[4], d[5]);
        let mode = if mode == 2 {
            RopeMode::Neox
        } else {
            RopeMode::Normal
        };
        let mut c = Case::new();
        let a = c.input(DType::F32, &[head, n_head, n_tok], r.arrays[0]);
        let pos = c.input(DType::I32, &[n_tok], r.arrays[1]);
        let mut p = RopeParams::new(n_dims, mode, 10000.0);
        p.n_ctx_orig = 4096;
        let out = c.g.rope_ext(a, pos, None, p).unwrap();
        c.g.rope_set_offset(out, n_offs).unwrap();
        c.output(out, r.arrays[2], r.name);
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 4);
}

#[test]
fn div_sum_rows_repeat_fill_match_llama_cpp() {
    let devs = devices();
    let recs = records();
    let r = recs.iter().find(|r| r.name == "misc").unwrap();
    let mut c = Case::new();
    let a = c.input(DType::F32, &[13, 6, 3], r.arrays[0]);
    let b = c.input(DType::F32, &[13, 1, 3], r.arrays[1]);
    let cc = c.input(DType::F32, &[1, 6, 1], r.arrays[2]);
    let k = c.input(DType::F32, &[7, 1, 4], r.arrays[3]);
    let g = &mut c.g;
    let d1 = g.div(a, b).unwrap();
    let d2 = g.div(a, cc).unwrap();
    let sr = g.sum_rows(a).unwrap();
    let rp = g.repeat_4d(k, [14, 3, 4, 1]).unwrap();
    let fl = g.fill(a, f32::NEG_INFINITY).unwrap();
    c.output(d1, r.arrays[4], "div");
    c.output(d2, r.arrays[5], "div ne0 = 1");
    c.output(sr, r.arrays[6], "sum_rows");
    c.output(rp, r.arrays[7], "repeat_4d");
    c.output(fl, r.arrays[8], "fill");
    c.check(&devs);
}

fn dtype_named(s: &str) -> DType {
    match s {
        "f32" => DType::F32,
        "f16" => DType::F16,
        "q4_0" => DType::Q4_0,
        "q4_1" => DType::Q4_1,
        "q5_0" => DType::Q5_0,
        "q8_0" => DType::Q8_0,
        "iq4_nl" => DType::IQ4_NL,
        "q2_K" => DType::Q2_K,
        "q3_K" => DType::Q3_K,
        "q4_K" => DType::Q4_K,
        "q5_K" => DType::Q5_K,
        "q6_K" => DType::Q6_K,
        "iq4_xs" => DType::IQ4_XS,
        "mxfp4" => DType::MXFP4,
        "tq1_0" => DType::TQ1_0,
        "tq2_0" => DType::TQ2_0,
        "nvfp4" => DType::NVFP4,
        "q1_0" => DType::Q1_0,
        "q2_0" => DType::Q2_0,
        "iq2_xxs" => DType::IQ2_XXS,
        "iq2_xs" => DType::IQ2_XS,
        "iq2_s" => DType::IQ2_S,
        "iq3_xxs" => DType::IQ3_XXS,
        "iq3_s" => DType::IQ3_S,
        "iq1_s" => DType::IQ1_S,
        "iq1_m" => DType::IQ1_M,
        _ => panic!("unknown type {s}"),
    }
}

#[test]
fn mul_mat_id_matches_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records().iter().filter(|r| r.name.starts_with("mmid:")) {
        let dtype = dtype_named(r.name.split(':').nth(1).unwrap());
        let d = dims(r.name);
        let (k, m, n_expert, n_used, n_b1, n_tok) = (d[0], d[1], d[2], d[3], d[4], d[5]);
        let mut c = Case::new();
        let w = c.input(dtype, &[k, m, n_expert], r.arrays[0]);
        let x = c.input(DType::F32, &[k, n_b1, n_tok], r.arrays[1]);
        let ids = c.input(DType::I32, &[n_used, n_tok], r.arrays[2]);
        let out = c.g.mul_mat_id(w, x, ids).unwrap();
        c.output(out, r.arrays[3], r.name);
        c.check(&devs);
        n += 1;
    }
    // 14 types x 4 cases, then 5 newer types x 2, then the 7 grid i-quants x 2.
    assert_eq!(n, 80);
}

/// A whole build_moe_ffn (softmax gating, norm_w, SwiGLU experts, the weighted expert outputs
/// summed through strided views) as llama.cpp computes it, with the expert weights in ggml's
/// `CPU_REPACK` buffer where llama.cpp puts them.
#[test]
fn moe_ffn_matches_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records().iter().filter(|r| r.name.starts_with("moe_ffn:")) {
        let mut parts = r.name.split(':').skip(1);
        let gt = dtype_named(parts.next().unwrap());
        let et = dtype_named(parts.next().unwrap());
        let d = dims(r.name);
        let (n_embd, n_ff, n_expert, n_used, n_tok) = (d[0], d[1], d[2], d[3], d[4]);
        let mut c = Case::new();
        let x = c.input(DType::F32, &[n_embd, n_tok], r.arrays[0]);
        let gate_inp = c.input(gt, &[n_embd, n_expert], r.arrays[1]);
        let up_e = c.input(et, &[n_embd, n_ff, n_expert], r.arrays[2]);
        let gate_e = c.input(et, &[n_embd, n_ff, n_expert], r.arrays[3]);
        let down_e = c.input(et, &[n_ff, n_embd, n_expert], r.arrays[4]);
        let g = &mut c.g;
        let logits = g.mul_mat(gate_inp, x).unwrap();
        let probs = g.soft_max(logits).unwrap();
        let selected = g.argsort_top_k(probs, n_used).unwrap();
        let p3 = g.reshape(probs, &[1, n_expert, n_tok]).unwrap();
        let weights = g.get_rows(p3, selected).unwrap();
        let w2 = g.reshape(weights, &[n_used, n_tok]).unwrap();
        let wsum = g.sum_rows(w2).unwrap();
        let wsum = g.clamp(wsum, 6.103_515_6e-5, f32::INFINITY).unwrap();
        let w2 = g.div(w2, wsum).unwrap();
        let weights = g.reshape(w2, &[1, n_used, n_tok]).unwrap();
        let cur = g.reshape(x, &[n_embd, 1, n_tok]).unwrap();
        let up = g.mul_mat_id(up_e, cur, selected).unwrap();
        let gate = g.mul_mat_id(gate_e, cur, selected).unwrap();
        let act = g.swiglu_split(gate, up).unwrap();
        let experts = g.mul_mat_id(down_e, act, selected).unwrap();
        let experts = g.mul(experts, weights).unwrap();
        let nb = g.layout(experts).nb;
        let mut moe_out = g.view_2d(experts, n_embd, n_tok, nb[2], 0).unwrap();
        for i in 1..n_used {
            let v = g.view_2d(experts, n_embd, n_tok, nb[2], i * nb[1]).unwrap();
            moe_out = g.add(moe_out, v).unwrap();
        }
        if n_used == 1 {
            moe_out = g.cont(moe_out).unwrap();
        }
        let selc = g.cont(selected).unwrap();
        c.output(logits, r.arrays[5], format!("{} logits", r.name));
        c.output(selc, r.arrays[6], format!("{} selected", r.name));
        c.output(experts, r.arrays[7], format!("{} experts", r.name));
        c.output(moe_out, r.arrays[8], format!("{} out", r.name));
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 5);
}

/// MXFP4 (gpt-oss's expert format): `quantize_row_mxfp4_ref` and `dequantize_row_mxfp4`
/// give ggml's bytes and values, and 2-D products (repacked when llama.cpp repacks them:
/// gemv and gemm agree per output; else `ggml_vec_dot_mxfp4_q8_0`) have its bits.
#[test]
fn mxfp4_matches_llama_cpp() {
    let devs = devices();
    let mut n = 0;
    for r in records()
        .iter()
        .filter(|r| r.name.starts_with("quant:mxfp4"))
    {
        let x: Vec<f32> = r.arrays[0]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut q = vec![0u8; r.arrays[1].len()];
        lamina_cpu::quant::quantize_row(DType::MXFP4, &x, &mut q).unwrap();
        assert_eq!(q, r.arrays[1], "{}", r.name);
        let mut back = vec![0f32; x.len()];
        lamina_cpu::quant::dequantize_row(DType::MXFP4, &q, &mut back).unwrap();
        assert_bits(&back, r.arrays[2], r.name);
        n += 1;
    }
    for r in records()
        .iter()
        .filter(|r| r.name.starts_with("mulmat:mxfp4"))
    {
        let d = dims(r.name);
        let (m, nn, k) = (d[0], d[1], d[2]);
        let mut c = Case::new();
        let w = c.input(DType::MXFP4, &[k, m], r.arrays[0]);
        let x = c.input(DType::F32, &[k, nn], r.arrays[1]);
        let out = c.g.mul_mat(w, x).unwrap();
        c.output(out, r.arrays[2], r.name);
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 9);
}

/// The types newer than the other cases (TQ1_0, TQ2_0, NVFP4, Q1_0, Q2_0): ggml's reference
/// quantizer and dequantizer give its bytes and values, and 2-D products (`ggml_vec_dot_*` per
/// output on x86: no tinyBLAS, repack or tiled kernels for them) have its bits.
#[test]
fn newest_types_match_llama_cpp() {
    const TYPES: [DType; 5] = [
        DType::TQ1_0,
        DType::TQ2_0,
        DType::NVFP4,
        DType::Q1_0,
        DType::Q2_0,
    ];
    let devs = devices();
    let mut n = 0;
    for r in records().iter().filter(|r| r.name.starts_with("quant:")) {
        let dtype = dtype_named(r.name.split(':').nth(1).unwrap());
        if !TYPES.contains(&dtype) {
            continue;
        }
        let x: Vec<f32> = r.arrays[0]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        let mut q = vec![0u8; r.arrays[1].len()];
        lamina_cpu::quant::quantize_row(dtype, &x, &mut q).unwrap();
        assert_eq!(q, r.arrays[1], "{}", r.name);
        let mut back = vec![0f32; x.len()];
        lamina_cpu::quant::dequantize_row(dtype, &q, &mut back).unwrap();
        assert_bits(&back, r.arrays[2], r.name);
        n += 1;
    }
    for r in records().iter().filter(|r| r.name.starts_with("mulmat:")) {
        let dtype = dtype_named(r.name.split(':').nth(1).unwrap());
        if !TYPES.contains(&dtype) {
            continue;
        }
        let d = dims(r.name);
        let (m, nn, k) = (d[0], d[1], d[2]);
        let mut c = Case::new();
        let w = c.input(dtype, &[k, m], r.arrays[0]);
        let x = c.input(DType::F32, &[k, nn], r.arrays[1]);
        let out = c.g.mul_mat(w, x).unwrap();
        c.output(out, r.arrays[2], r.name);
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 5 * (2 + 4));
}

/// The grid i-quants (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M) as llama.cpp
/// quantizes them with an importance matrix (`quantw:` records: ggml_quantize_chunk's bytes
/// and to_float's values) and multiplies them (`mulmat:`), bit for bit on every device setup.
#[test]
fn iq_types_match_llama_cpp() {
    const TYPES: [DType; 7] = [
        DType::IQ2_XXS,
        DType::IQ2_XS,
        DType::IQ2_S,
        DType::IQ3_XXS,
        DType::IQ3_S,
        DType::IQ1_S,
        DType::IQ1_M,
    ];
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    };
    let devs = devices();
    let mut n = 0;
    for r in records().iter().filter(|r| r.name.starts_with("quantw:")) {
        let dtype = dtype_named(r.name.split(':').nth(1).unwrap());
        let x = f32s(r.arrays[0]);
        let w = f32s(r.arrays[1]);
        let mut q = vec![0u8; r.arrays[2].len()];
        lamina_core::quant::quantize_row_iq(dtype, &x, &mut q, Some(&w)).unwrap();
        assert_eq!(q, r.arrays[2], "{}", r.name);
        let mut back = vec![0f32; x.len()];
        lamina_cpu::quant::dequantize_row(dtype, &q, &mut back).unwrap();
        assert_bits(&back, r.arrays[3], r.name);
        n += 1;
    }
    for r in records().iter().filter(|r| r.name.starts_with("mulmat:")) {
        let dtype = dtype_named(r.name.split(':').nth(1).unwrap());
        if !TYPES.contains(&dtype) {
            continue;
        }
        let d = dims(r.name);
        let (m, nn, k) = (d[0], d[1], d[2]);
        let mut c = Case::new();
        let w = c.input(dtype, &[k, m], r.arrays[0]);
        let x = c.input(DType::F32, &[k, nn], r.arrays[1]);
        let out = c.g.mul_mat(w, x).unwrap();
        c.output(out, r.arrays[2], r.name);
        c.check(&devs);
        n += 1;
    }
    assert_eq!(n, 7 * (2 + 3));
}
