//! WGSL source generation. Every storage binding is `array<u32>` declared
//! `read_write`: wgpu rejects a buffer bound both read-only and writable in
//! one dispatch, and Lamina keeps many tensors in one buffer. f16 is always
//! unpacked from u32 words so the shaders work without `SHADER_F16`.

use crate::kernels::DType;

/// Parameters: up to 64 u32 words in one uniform slot.
pub const PARAMS_WORDS: usize = 64;

fn params_decl(binding: u32) -> String {
    format!(
        "@group(0) @binding({binding}) var<uniform> P: array<vec4<u32>, 16>;\n\
         fn pu(i: u32) -> u32 {{ return P[i >> 2u][i & 3u]; }}\n\
         fn pf(i: u32) -> f32 {{ return bitcast<f32>(pu(i)); }}\n"
    )
}

const COMMON: &str = r#"
fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }
// ggml's tanh approximation; the clamp keeps tanh away from inf/inf = NaN.
fn gelu_exact(x: f32) -> f32 {
    let u = 0.7978845608028654 * x * (1.0 + 0.044715 * x * x);
    return 0.5 * x * (1.0 + tanh(clamp(u, -15.0, 15.0)));
}
// As ggml-cpu (GGML_GELU_FP16): the f16 table's entry for x rounded to f16, itself rounded to
// f16; 0 below -10 and x above 10.
fn gelu(x: f32) -> f32 {
    if (x <= -10.0) { return 0.0; }
    if (x >= 10.0) { return x; }
    return f16r(gelu_exact(f16r(x)));
}
fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }
// f16 conversions that keep subnormals (quantizeToF16, pack2x16float and unpack2x16float may
// flush them, and lavapipe does; the CPU's F16C instructions do not): the f16 value of the
// low 16 bits of `h`, the f16 bits of `x` rounded to nearest even, and `x` rounded to f16.
fn f16_of(h: u32) -> f32 {
    if ((h & 0x7c00u) == 0u) {
        let m = f32(h & 0x3ffu) * 5.9604644775390625e-8;
        return select(m, -m, (h & 0x8000u) != 0u);
    }
    return unpack2x16float(h & 0xffffu)[0];
}
fn f16_bits(x: f32) -> u32 {
    if (abs(x) < 6.103515625e-05) {
        return u32(round(abs(x) * 16777216.0)) | ((bitcast<u32>(x) >> 16u) & 0x8000u);
    }
    return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
}
fn f16r(x: f32) -> f32 { return f16_of(f16_bits(x)); }
"#;

fn storage(binding: u32, name: &str) -> String {
    format!("@group(0) @binding({binding}) var<storage, read_write> {name}: array<u32>;\n")
}

/// Declares `name` plus `ld_name(e) -> f32` (e in elements of `dt`).
fn input(binding: u32, name: &str, dt: DType) -> String {
    let mut s = storage(binding, name);
    match dt {
        DType::F16 => {
            s += &format!(
                "fn ld_{name}(e: u32) -> f32 {{ return f16_of({name}[e >> 1u] >> ((e & 1u) * 16u)); }}\n"
            )
        }
        DType::I32 => {
            s += &format!("fn ldi_{name}(e: u32) -> i32 {{ return bitcast<i32>({name}[e]); }}\n")
        }
        _ => s += &format!("fn ld_{name}(e: u32) -> f32 {{ return bitcast<f32>({name}[e]); }}\n"),
    }
    s
}

/// Declares `name` plus `st_name(e, v)`. f16 stores touch half a word, so
/// they use atomics to leave the neighbouring half alone.
fn output(binding: u32, name: &str, dt: DType) -> String {
    if dt == DType::F16 {
        format!(
            "@group(0) @binding({binding}) var<storage, read_write> {name}: array<atomic<u32>>;\n\
             fn st_{name}(e: u32, v: f32) {{\n\
               let sh = (e & 1u) * 16u;\n\
               let h = f16_bits(v);\n\
               atomicAnd(&{name}[e >> 1u], ~(0xffffu << sh));\n\
               atomicOr(&{name}[e >> 1u], h << sh);\n\
             }}\n"
        )
    } else {
        storage(binding, name)
            + &format!("fn st_{name}(e: u32, v: f32) {{ {name}[e] = bitcast<u32>(v); }}\n")
    }
}

const ENTRY: &str = "@compute @workgroup_size({WG})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32{SG}) {\n";

fn entry(wg: u32, subgroups: bool) -> String {
    ENTRY.replace("{WG}", &wg.to_string()).replace(
        "{SG}",
        if subgroups {
            ", @builtin(subgroup_size) sgs: u32"
        } else {
            ""
        },
    )
}

/// Workgroup reductions `wg_sum`/`wg_max` (call in uniform control flow).
fn reductions(wg: u32, subgroups: bool) -> String {
    let mut s = format!("var<workgroup> red: array<f32, {wg}>;\n");
    for (name, op, sg) in [
        ("wg_sum", "a + b", "subgroupAdd"),
        ("wg_max", "max(a, b)", "subgroupMax"),
    ] {
        if subgroups {
            // One partial per subgroup; assumes subgroups tile local_invocation_index linearly.
            s += &format!(
                "fn {name}(v: f32, lid: u32, sgs: u32) -> f32 {{\n\
                   let r = {sg}(v);\n\
                   if (lid % sgs == 0u) {{ red[lid / sgs] = r; }}\n\
                   workgroupBarrier();\n\
                   var acc = red[0];\n\
                   for (var i = 1u; i < {wg}u / sgs; i++) {{ let a = acc; let b = red[i]; acc = {op}; }}\n\
                   workgroupBarrier();\n\
                   return acc;\n\
                 }}\n"
            );
        } else {
            s += &format!(
                "fn {name}(v: f32, lid: u32, sgs: u32) -> f32 {{\n\
                   red[lid] = v;\n\
                   workgroupBarrier();\n\
                   for (var st = {half}u; st > 0u; st >>= 1u) {{\n\
                     if (lid < st) {{ let a = red[lid]; let b = red[lid + st]; red[lid] = {op}; }}\n\
                     workgroupBarrier();\n\
                   }}\n\
                   let r = red[0];\n\
                   workgroupBarrier();\n\
                   return r;\n\
                 }}\n",
                half = wg / 2
            );
        }
    }
    s
}

/// `wg_sum4`: like `wg_sum` for four values at once (mat-vec rows).
fn reduction_sum4(wg: u32, subgroups: bool) -> String {
    let mut s = format!("var<workgroup> red4: array<vec4<f32>, {wg}>;\n");
    if subgroups {
        s += &format!(
            "fn wg_sum4(v: vec4<f32>, lid: u32, sgs: u32) -> vec4<f32> {{\n\
               let r = subgroupAdd(v);\n\
               if (lid % sgs == 0u) {{ red4[lid / sgs] = r; }}\n\
               workgroupBarrier();\n\
               var acc = red4[0];\n\
               for (var i = 1u; i < {wg}u / sgs; i++) {{ acc += red4[i]; }}\n\
               workgroupBarrier();\n\
               return acc;\n\
             }}\n"
        );
    } else {
        s += &format!(
            "fn wg_sum4(v: vec4<f32>, lid: u32, sgs: u32) -> vec4<f32> {{\n\
               red4[lid] = v;\n\
               workgroupBarrier();\n\
               for (var st = {half}u; st > 0u; st >>= 1u) {{\n\
                 if (lid < st) {{ red4[lid] += red4[lid + st]; }}\n\
                 workgroupBarrier();\n\
               }}\n\
               let r = red4[0];\n\
               workgroupBarrier();\n\
               return r;\n\
             }}\n",
            half = wg / 2
        );
    }
    s
}

fn sgs_arg(subgroups: bool) -> &'static str {
    if subgroups { "sgs" } else { "1u" }
}

/// Index prologue for one-thread-per-element kernels: `g`, `i0..i3` from ne at P[1..5].
const ELEM_INDEX: &str = r#"
    let g = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (g >= pu(0u)) { return; }
    let ne0 = pu(1u); let ne1 = pu(2u); let ne2 = pu(3u);
    let i0 = g % ne0; let t1 = g / ne0; let i1 = t1 % ne1; let t2 = t1 / ne1; let i2 = t2 % ne2; let i3 = t2 / ne2;
"#;

/// `v_silu` and what it needs, for an expression that uses it.
fn silu_helpers(expr: &str) -> String {
    if expr.contains("v_silu") {
        format!("{EXACT}{V_EXPF}")
    } else {
        String::new()
    }
}

/// Binary op with broadcast of `b` (ggml add/mul rule) or a GLU `expr`.
pub fn binary(expr: &str) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &input(0, "a", DType::F32);
    s += &input(1, "b", DType::F32);
    s += &output(2, "d", DType::F32);
    s += &silu_helpers(expr);
    s += &entry(256, false);
    s += ELEM_INDEX;
    s += r#"
    let a = ld_a(pu(5u) + i0 * pu(6u) + i1 * pu(7u) + i2 * pu(8u) + i3 * pu(9u));
    let b = ld_b(pu(10u) + (i0 % pu(11u)) * pu(15u) + (i1 % pu(12u)) * pu(16u) + (i2 % pu(13u)) * pu(17u) + (i3 % pu(14u)) * pu(18u));
    st_d(pu(19u) + g, EXPR);
}
"#;
    s.replace("EXPR", expr)
}

/// Strided map `d = expr(x)` with type conversion (unary ops, scale, cpy, cont).
pub fn map(expr: &str, src: DType, dst: DType) -> String {
    let mut s = params_decl(2) + COMMON;
    s += &input(0, "s", src);
    s += &output(1, "d", dst);
    s += &silu_helpers(expr);
    s += &entry(256, false);
    s += ELEM_INDEX;
    s += r#"
    let x = ld_s(pu(5u) + i0 * pu(6u) + i1 * pu(7u) + i2 * pu(8u) + i3 * pu(9u));
    st_d(pu(10u) + i0 * pu(11u) + i1 * pu(12u) + i2 * pu(13u) + i3 * pu(14u), EXPR);
}
"#;
    s.replace("EXPR", expr)
}

/// `d[.., ids[i1, i2 % ., i3 % .], i2, i3] = s[.., i1, i2, i3]`.
pub fn set_rows(dst: DType) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &input(0, "s", DType::F32);
    s += &input(1, "ids", DType::I32);
    s += &output(2, "d", dst);
    s += &entry(256, false);
    s += ELEM_INDEX;
    s += r#"
    let x = ld_s(pu(5u) + i0 * pu(6u) + i1 * pu(7u) + i2 * pu(8u) + i3 * pu(9u));
    let r = ldi_ids(pu(10u) + i1 * pu(13u) + (i2 % pu(11u)) * pu(14u) + (i3 % pu(12u)) * pu(15u));
    // Out-of-range row ids are skipped (a shader cannot report errors).
    if (r < 0 || u32(r) >= pu(20u)) { return; }
    st_d(pu(16u) + i0 * pu(17u) + u32(r) * pu(18u) + i2 * pu(19u) + i3 * pu(21u), x);
}
"#;
    s
}

/// Byte-addressed helpers and `dq_w(row_byte, k)` for src0 `w` of type `dt`.
fn weights(binding: u32, dt: DType) -> String {
    let mut s = storage(binding, "w");
    s += r#"
fn w_u8(a: u32) -> u32 { return (w[a >> 2u] >> ((a & 3u) * 8u)) & 0xffu; }
fn w_i8(a: u32) -> i32 { return extractBits(bitcast<i32>(w[a >> 2u]), (a & 3u) * 8u, 8u); }
// Blocks are not word aligned (18, 22, 34, 210 bytes): funnel two words.
fn w_u32(a: u32) -> u32 {
    let i = a >> 2u;
    let sh = (a & 3u) * 8u;
    let lo = w[i];
    if (sh == 0u) { return lo; }
    return (lo >> sh) | (w[i + 1u] << (32u - sh));
}
fn w_f16(a: u32) -> f32 { return f16_of(w[a >> 2u] >> (((a >> 1u) & 1u) * 16u)); }
fn w_f32(a: u32) -> f32 { return bitcast<f32>(w[a >> 2u]); }
fn byte_of(v: u32, i: u32) -> u32 { return (v >> (8u * i)) & 0xffu; }
// ggml get_scale_min_k4: the 6-bit scale and min of sub-block j; scales start at b + 4.
fn smk4(b: u32, j: u32) -> vec2<i32> {
    let q = b + 4u;
    if (j < 4u) {
        return vec2<i32>(i32(w_u8(q + j) & 63u), i32(w_u8(q + j + 4u) & 63u));
    }
    let sc = (w_u8(q + j + 4u) & 0xfu) | ((w_u8(q + j - 4u) >> 6u) << 4u);
    let m = (w_u8(q + j + 4u) >> 4u) | ((w_u8(q + j) >> 6u) << 4u);
    return vec2<i32>(i32(sc), i32(m));
}
fn scale_min_k4(b: u32, j: u32) -> vec2<f32> { return vec2<f32>(smk4(b, j)); }
"#;
    s += match dt {
        DType::F32 => "fn dq_w(row: u32, k: u32) -> f32 { return w_f32(row + 4u * k); }\n",
        DType::F16 => "fn dq_w(row: u32, k: u32) -> f32 { return w_f16(row + 2u * k); }\n",
        DType::Q4_0 => {
            r#"
fn dq_w(row: u32, k: u32) -> f32 {
    let b = row + (k / 32u) * 18u; let j = k % 32u;
    let byte = w_u8(b + 2u + (j % 16u));
    let q = select(byte & 0xfu, byte >> 4u, j >= 16u);
    return (f32(q) - 8.0) * w_f16(b);
}
"#
        }
        DType::Q4_1 => {
            r#"
fn dq_w(row: u32, k: u32) -> f32 {
    let b = row + (k / 32u) * 20u; let j = k % 32u;
    let byte = w_u8(b + 4u + (j % 16u));
    let q = select(byte & 0xfu, byte >> 4u, j >= 16u);
    return w_f16(b) * f32(q) + w_f16(b + 2u);
}
"#
        }
        DType::Q5_0 => {
            r#"
fn dq_w(row: u32, k: u32) -> f32 {
    let b = row + (k / 32u) * 22u; let j = k % 32u; let jj = j % 16u;
    let qh = w_u32(b + 2u);
    let byte = w_u8(b + 6u + jj);
    var q: u32;
    if (j < 16u) { q = (byte & 0xfu) | (((qh >> jj) << 4u) & 0x10u); }
    else { q = (byte >> 4u) | ((qh >> (jj + 12u)) & 0x10u); }
    return (f32(q) - 16.0) * w_f16(b);
}
"#
        }
        DType::Q8_0 => {
            r#"
fn dq_w(row: u32, k: u32) -> f32 {
    let b = row + (k / 32u) * 34u;
    return f32(w_i8(b + 2u + k % 32u)) * w_f16(b);
}
"#
        }
        DType::Q4_K => {
            r#"
fn dq_w(row: u32, k: u32) -> f32 {
    let b = row + (k / 256u) * 144u; let j = k % 256u;
    let p = j / 64u; let hi = (j % 64u) >= 32u; let l = j % 32u;
    let byte = w_u8(b + 16u + 32u * p + l);
    let q = select(byte & 0xfu, byte >> 4u, hi);
    let sm = scale_min_k4(b, 2u * p + select(0u, 1u, hi));
    return (w_f16(b) * sm.x) * f32(q) - w_f16(b + 2u) * sm.y;
}
"#
        }
        DType::Q5_K => {
            r#"
fn dq_w(row: u32, k: u32) -> f32 {
    let b = row + (k / 256u) * 176u; let j = k % 256u;
    let p = j / 64u; let hi = (j % 64u) >= 32u; let l = j % 32u;
    let byte = w_u8(b + 48u + 32u * p + l);
    let g = 2u * p + select(0u, 1u, hi);
    let q = select(byte & 0xfu, byte >> 4u, hi) + ((w_u8(b + 16u + l) >> g) & 1u) * 16u;
    let sm = scale_min_k4(b, g);
    return (w_f16(b) * sm.x) * f32(q) - w_f16(b + 2u) * sm.y;
}
"#
        }
        DType::Q6_K => {
            r#"
fn dq_w(row: u32, k: u32) -> f32 {
    let b = row + (k / 256u) * 210u; let j = k % 256u;
    let n = j / 128u; let r = j % 128u; let g = r / 32u; let l = r % 32u;
    let ql = w_u8(b + 64u * n + l + (g & 1u) * 32u);
    let qh = w_u8(b + 128u + 32u * n + l);
    let q = i32(select(ql & 0xfu, ql >> 4u, g >= 2u) | (((qh >> (2u * g)) & 3u) << 4u)) - 32;
    let sc = w_i8(b + 192u + 8u * n + l / 16u + 2u * g);
    return (w_f16(b + 208u) * f32(sc)) * f32(q);
}
"#
        }
        DType::I32 => {
            "fn dq_w(row: u32, k: u32) -> f32 { return f32(bitcast<i32>(w[(row >> 2u) + k])); }\n"
        }
    };
    s
}

/// (elements per block, bytes per block, sub-chunks per block) for mat-vec.
pub fn matvec_geometry(dt: DType) -> (u32, u32, u32) {
    match dt {
        DType::F32 | DType::I32 => (1, 4, 1),
        DType::F16 => (1, 2, 1),
        DType::Q4_0 => (32, 18, 4),
        DType::Q4_1 => (32, 20, 4),
        DType::Q5_0 => (32, 22, 4),
        DType::Q8_0 => (32, 34, 4),
        DType::Q4_K => (256, 144, 8),
        DType::Q5_K => (256, 176, 8),
        DType::Q6_K => (256, 210, 8),
    }
}

/// `sub_dot(block_byte, sub, x_elem) -> f32`: dot of one chunk of a block with x.
fn sub_dot(dt: DType) -> &'static str {
    match dt {
        DType::F32 | DType::I32 => {
            "fn sub_dot(b: u32, s: u32, xb: u32) -> f32 { return w_f32(b) * xf(xb); }\n"
        }
        DType::F16 => "fn sub_dot(b: u32, s: u32, xb: u32) -> f32 { return w_f16(b) * xf(xb); }\n",
        DType::Q4_0 => {
            r#"
fn sub_dot(b: u32, s: u32, xb: u32) -> f32 {
    let q = w_u32(b + 2u + 4u * s);
    let x0 = xb + 4u * s;
    var acc = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let v = byte_of(q, i);
        acc += (f32(v & 0xfu) - 8.0) * xf(x0 + i) + (f32(v >> 4u) - 8.0) * xf(x0 + 16u + i);
    }
    return acc * w_f16(b);
}
"#
        }
        DType::Q4_1 => {
            r#"
fn sub_dot(b: u32, s: u32, xb: u32) -> f32 {
    let q = w_u32(b + 4u + 4u * s);
    let x0 = xb + 4u * s;
    var acc = 0.0; var sx = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let v = byte_of(q, i);
        let xa = xf(x0 + i); let xc = xf(x0 + 16u + i);
        acc += f32(v & 0xfu) * xa + f32(v >> 4u) * xc;
        sx += xa + xc;
    }
    return acc * w_f16(b) + sx * w_f16(b + 2u);
}
"#
        }
        DType::Q5_0 => {
            r#"
fn sub_dot(b: u32, s: u32, xb: u32) -> f32 {
    let qh = w_u32(b + 2u);
    let q = w_u32(b + 6u + 4u * s);
    let x0 = xb + 4u * s;
    var acc = 0.0;
    for (var i = 0u; i < 4u; i++) {
        let j = 4u * s + i;
        let v = byte_of(q, i);
        let lo = (v & 0xfu) | (((qh >> j) << 4u) & 0x10u);
        let hi = (v >> 4u) | ((qh >> (j + 12u)) & 0x10u);
        acc += (f32(lo) - 16.0) * xf(x0 + i) + (f32(hi) - 16.0) * xf(x0 + 16u + i);
    }
    return acc * w_f16(b);
}
"#
        }
        DType::Q8_0 => {
            r#"
fn sub_dot(b: u32, s: u32, xb: u32) -> f32 {
    let q0 = w_u32(b + 2u + 8u * s);
    let q1 = w_u32(b + 6u + 8u * s);
    let x0 = xb + 8u * s;
    var acc = 0.0;
    for (var i = 0u; i < 4u; i++) {
        acc += f32(extractBits(bitcast<i32>(q0), 8u * i, 8u)) * xf(x0 + i);
        acc += f32(extractBits(bitcast<i32>(q1), 8u * i, 8u)) * xf(x0 + 4u + i);
    }
    return acc * w_f16(b);
}
"#
        }
        DType::Q4_K => {
            r#"
// 32 elements per chunk (16 of group 2p, 16 of 2p+1) so the scales are decoded once.
// K-blocks are 144 bytes and rows 4-aligned, so words load directly.
fn sub_dot(b: u32, s: u32, xb: u32) -> f32 {
    let p = s / 2u; let l = (s % 2u) * 16u;
    let x0 = xb + 64u * p + l;
    let qb = (b + 16u + 32u * p + l) >> 2u;
    var a0 = 0.0; var a1 = 0.0; var s0 = 0.0; var s1 = 0.0;
    for (var wi = 0u; wi < 4u; wi++) {
        let q = w[qb + wi];
        for (var i = 0u; i < 4u; i++) {
            let v = byte_of(q, i);
            let xa = xf(x0 + 4u * wi + i); let xc = xf(x0 + 32u + 4u * wi + i);
            a0 += f32(v & 0xfu) * xa; s0 += xa;
            a1 += f32(v >> 4u) * xc; s1 += xc;
        }
    }
    let d = w_f16(b); let dm = w_f16(b + 2u);
    let m0 = scale_min_k4(b, 2u * p); let m1 = scale_min_k4(b, 2u * p + 1u);
    return d * (m0.x * a0 + m1.x * a1) - dm * (m0.y * s0 + m1.y * s1);
}
"#
        }
        DType::Q5_K => {
            r#"
fn sub_dot(b: u32, s: u32, xb: u32) -> f32 {
    let p = s / 2u; let l = (s % 2u) * 16u;
    let x0 = xb + 64u * p + l;
    let qb = (b + 48u + 32u * p + l) >> 2u;
    let hb0 = (b + 16u + l) >> 2u;
    var a0 = 0.0; var a1 = 0.0; var s0 = 0.0; var s1 = 0.0;
    for (var wi = 0u; wi < 4u; wi++) {
        let q = w[qb + wi];
        let h = w[hb0 + wi];
        for (var i = 0u; i < 4u; i++) {
            let v = byte_of(q, i);
            let hb = byte_of(h, i);
            let xa = xf(x0 + 4u * wi + i); let xc = xf(x0 + 32u + 4u * wi + i);
            a0 += f32((v & 0xfu) + ((hb >> (2u * p)) & 1u) * 16u) * xa; s0 += xa;
            a1 += f32((v >> 4u) + ((hb >> (2u * p + 1u)) & 1u) * 16u) * xc; s1 += xc;
        }
    }
    let d = w_f16(b); let dm = w_f16(b + 2u);
    let m0 = scale_min_k4(b, 2u * p); let m1 = scale_min_k4(b, 2u * p + 1u);
    return d * (m0.x * a0 + m1.x * a1) - dm * (m0.y * s0 + m1.y * s1);
}
"#
        }
        DType::Q6_K => {
            r#"
// 32 elements per chunk: l..l+7 of each of the four 32-element groups of one half.
fn sub_dot(b: u32, s: u32, xb: u32) -> f32 {
    let n = s / 4u; let l = (s % 4u) * 8u;
    let x0 = xb + 128u * n + l;
    var a = vec4<f32>(0.0);
    for (var wi = 0u; wi < 2u; wi++) {
        let o = l + 4u * wi;
        let qa = w_u32(b + 64u * n + o);
        let qb = w_u32(b + 64u * n + 32u + o);
        let qh = w_u32(b + 128u + 32u * n + o);
        for (var i = 0u; i < 4u; i++) {
            let va = byte_of(qa, i); let vb = byte_of(qb, i); let h = byte_of(qh, i);
            let q1 = f32(i32((va & 0xfu) | ((h & 3u) << 4u)) - 32);
            let q2 = f32(i32((vb & 0xfu) | (((h >> 2u) & 3u) << 4u)) - 32);
            let q3 = f32(i32((va >> 4u) | (((h >> 4u) & 3u) << 4u)) - 32);
            let q4 = f32(i32((vb >> 4u) | (((h >> 6u) & 3u) << 4u)) - 32);
            let xi = x0 + 4u * wi + i;
            a += vec4<f32>(q1 * xf(xi), q2 * xf(xi + 32u), q3 * xf(xi + 64u), q4 * xf(xi + 96u));
        }
    }
    let sb = b + 192u + 8u * n + l / 16u;
    let sc = vec4<f32>(f32(w_i8(sb)), f32(w_i8(sb + 2u)), f32(w_i8(sb + 4u)), f32(w_i8(sb + 6u)));
    return w_f16(b + 208u) * dot(a, sc);
}
"#
        }
    }
}

/// Matmul parameter layout (shared by both paths).
const MM_INDEX: &str = r#"
    let K = pu(0u); let M = pu(1u); let N = pu(2u); let ne12 = pu(3u);
    let bz = BZ;
    let i12 = bz % ne12; let i13 = bz / ne12;
    let wbat = pu(7u) + (i12 / pu(5u)) * pu(9u) + (i13 / pu(6u)) * pu(10u);
    let xbat = pu(11u) + i12 * pu(13u) + i13 * pu(14u);
    let dbat = pu(15u) + i12 * pu(17u) + i13 * pu(18u);
"#;

/// Mat-vec launch shape: threads per workgroup (power of two), rows per
/// workgroup (1..=4) and src1 columns per workgroup (1..=4, sharing weight loads).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MatVecConfig {
    pub wg: u32,
    pub rows: u32,
    pub cols: u32,
}

/// Mat-vec: one workgroup per (`rows` rows, column, batch); each thread
/// strides over block chunks of all its rows, then a workgroup reduction.
pub fn matvec(dt: DType, subgroups: bool, cfg: MatVecConfig, nc: u32) -> String {
    let (qk, bb, subs) = matvec_geometry(dt);
    let mut s = params_decl(3) + COMMON;
    s += &weights(0, dt);
    s += &input(1, "x", DType::F32);
    s += "fn xf(e: u32) -> f32 { return bitcast<f32>(x[e]); }\n";
    s += &output(2, "d", DType::F32);
    s += sub_dot(dt);
    s += &reduction_sum4(cfg.wg, subgroups);
    s += &entry(cfg.wg, subgroups);
    // z = column group (`nc` columns) + batch; P[20] = number of column groups.
    // nc is a compile-time constant so N = 1 pays for one reduction only.
    let nc = nc.clamp(1, 4);
    let mut decl = String::new();
    let mut body = String::new();
    let mut red = String::new();
    let mut store = String::new();
    for c in 0..nc {
        decl += &format!("var a{c} = vec4<f32>(0.0); ");
        let guard = if c == 0 {
            String::new()
        } else {
            format!("if (ncol > {c}u) ")
        };
        body +=
            &format!("                {guard}{{ a{c}[r] += sub_dot(wb, sb, xo + {c}u * xs); }}\n");
        red += &format!(
            "    let t{c} = wg_sum4(a{c}, lid, {});\n",
            sgs_arg(subgroups)
        );
        store += &format!("        {guard}{{ st_d(o + (col0 + {c}u) * ds, t{c}[lid]); }}\n");
    }
    s += &MM_INDEX.replace("BZ", "wid.z / pu(20u)");
    s += &format!(
        r#"
    let row0 = (wid.x + wid.y * nwg.x) * {rows}u;
    if (row0 >= M) {{ return; }}
    let col0 = (wid.z % pu(20u)) * {nc}u;
    let ncol = min({nc}u, N - col0);
    let xs = pu(12u);
    let xb = xbat + col0 * xs;
    let nsub = pu(19u);
    // One vec4 per column, lanes = rows: the weight chunk is fetched once for all columns.
    {decl}
    for (var gi = lid; gi < nsub; gi += {wg}u) {{
        let blk = gi / {subs}u;
        let sb = gi % {subs}u;
        let xo = xb + blk * {qk}u;
        for (var r = 0u; r < {rows}u; r++) {{
            if (row0 + r < M) {{
                let wb = wbat + (row0 + r) * pu(8u) + blk * {bb}u;
{body}            }}
        }}
    }}
{red}    if (lid < {rows}u && row0 + lid < M) {{
        let o = dbat + row0 + lid;
        let ds = pu(16u);
{store}    }}
}}
"#,
        wg = cfg.wg,
        rows = cfg.rows,
    );
    s
}

/// Word of every parameter slot that is always 0 (the arena zeroes unused words; no op has 64
/// parameters): `opaque` xors with it.
pub const OPAQUE_WORD: usize = PARAMS_WORDS - 1;

/// Exact f32 arithmetic for shaders that must reproduce the CPU's bits:
/// * `opaque(x)`: `x ^ 0` with the 0 from parameter word 63, a value the compiler cannot reason
///   about, so `(a + b) - a` is not folded to `b` (which would drop an error term);
/// * `two_sum(a, b)`: `a + b` and its rounding error;
/// * `fma_x(a, b, c)`: `a·b + c` rounded once, whatever the device's `fma()` does (WGSL lets it
///   round the product first, and lavapipe does). Dekker's product `a·b = p + e` (12-bit halves,
///   every partial product exact), then Boldo and Melquiond's sum with an inner rounding to
///   odd: `(t, u) = TwoSum(c, p)`, `z = t + RO(u + e)` is `a·b + c` rounded to nearest
///   (binary32, no underflow). Non-finite or huge operands take `a·b + c`.
const EXACT: &str = r#"
fn opaque(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ pu(63u)); }
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = opaque(a + b);
    let bb = opaque(s - a);
    return vec2<f32>(s, (a - opaque(s - bb)) + (b - bb));
}
fn split12(a: f32) -> vec2<f32> {
    let t = opaque(4097.0 * a);
    let hi = opaque(t - opaque(t - a));
    return vec2<f32>(hi, a - hi);
}
fn fma_x(a: f32, b: f32, c: f32) -> f32 {
    let p = opaque(a * b);
    if (!(abs(p) < 1.0e30) || !(abs(c) < 1.0e30) || !(abs(a) < 1.0e30) || !(abs(b) < 1.0e30)) {
        return p + c;
    }
    let sa = split12(a);
    let sb = split12(b);
    let e = ((opaque(sa.x * sb.x) - p) + opaque(sa.x * sb.y) + opaque(sa.y * sb.x)) + opaque(sa.y * sb.y);
    let t = two_sum(c, p);
    // Round to odd: the sum truncated toward zero, its last bit set when inexact.
    let v = two_sum(t.y, e);
    var odd = v.x;
    if (v.y != 0.0) {
        var bits = bitcast<u32>(v.x);
        if ((v.x > 0.0) != (v.y > 0.0)) { bits = bits - 1u; }
        odd = bitcast<f32>(bits | 1u);
    }
    return t.x + odd;
}
"#;

/// Float mat-mat in the CPU backend's order (f32/f16 weights; f16 activations already rounded
/// to f16 values). The CPU's sums are not associative-safe to regroup: a one-ulp difference in
/// an attention score or a KQ·V sum can flip a later f16 or Q8 rounding, and Gemma 3's logits
/// then part from the CPU's by 1e-3. So each output is formed as llama.cpp's AVX2 kernels form
/// it (see `lamina-cpu`'s `kernels::fdot`):
/// * `tiny` (tinyBLAS: N ≥ 2, K % 8 == 0, M % 4 == 0): 8 lanes, lane i an FMA chain over
///   k ≡ i (mod 8), then `hsum` as ((l0+l4)+(l2+l6))+((l1+l5)+(l3+l7)). A workgroup is
///   8 lanes × 8 rows × 4 columns.
/// * otherwise (`ggml_vec_dot_f32/f16`): 32 lanes (four 8-lane accumulators over steps of 32),
///   `GGML_F32x8_REDUCE`, then the K % 32 leftovers: an FMA chain for f32, a double sum of
///   f32 products for f16 (here a two-float sum). A workgroup is 32 lanes × 8 rows.
///
/// Grid: x = row groups of 8, y = column groups, z = batches.
pub fn fmatmul(dt: DType, tiny: bool) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &weights(0, dt);
    s += &input(1, "x", DType::F32);
    s += "fn xf(e: u32) -> f32 { return bitcast<f32>(x[e]); }\n";
    s += &output(2, "d", DType::F32);
    s += EXACT;
    s += "var<workgroup> lanes: array<f32, 256>;\n";
    s += &entry(256, false);
    s += &MM_INDEX.replace("BZ", "wid.z");
    let (lanes, cols) = if tiny { (8u32, 4u32) } else { (32, 1) };
    s += &format!(
        r#"
    let lane = lid % {lanes}u;
    let o = lid / {lanes}u;
    let row = wid.x * 8u + o % 8u;
    let col = wid.y * {cols}u + o / 8u;
    let live = row < M && col < N;
    let wrow = wbat + row * pu(8u);
    let xcol = xbat + col * pu(12u);
    let np = K & ~{lanes_mask}u;
    var acc = 0.0;
    if (live) {{
        for (var l = lane; l < np; l += {lanes}u) {{ acc = fma_x(dq_w(wrow, l), xf(xcol + l), acc); }}
    }}
    lanes[lid] = acc;
    workgroupBarrier();
    if (!live || lane != 0u) {{ return; }}
    let b = lid;
"#,
        lanes_mask = if tiny { 7 } else { 31 },
    );
    s += if tiny {
        r#"
    let r = ((lanes[b] + lanes[b + 4u]) + (lanes[b + 2u] + lanes[b + 6u]))
        + ((lanes[b + 1u] + lanes[b + 5u]) + (lanes[b + 3u] + lanes[b + 7u]));
"#
    } else {
        r#"
    var s0: array<f32, 8>;
    for (var l = 0u; l < 8u; l++) {
        let a = lanes[b + l] + lanes[b + 16u + l];
        let c = lanes[b + 8u + l] + lanes[b + 24u + l];
        s0[l] = a + c;
    }
    var r = ((s0[0] + s0[4]) + (s0[1] + s0[5])) + ((s0[2] + s0[6]) + (s0[3] + s0[7]));
"#
    };
    if !tiny {
        s += if dt == DType::F16 {
            r#"
    var hi = r;
    var lo = 0.0;
    for (var l = np; l < K; l++) {
        let t = two_sum(hi, dq_w(wrow, l) * xf(xcol + l));
        hi = t.x;
        lo = lo + t.y;
    }
    r = hi + lo;
"#
        } else {
            "    for (var l = np; l < K; l++) { r = fma_x(dq_w(wrow, l), xf(xcol + l), r); }\n"
        };
    }
    s += "    st_d(dbat + col * pu(16u) + row, r);\n}\n";
    s
}

/// Words per activation block in the exact path's quantized layout ([`quantize_act`]):
/// Q8_0/Q8_1 `[d, s, 8 words of 4 i8]` (d and s the f16 values as f32), Q8_K
/// `[d, 64 words of 4 i8, 16 bsums as i32]`.
pub fn act_words(mode: u32) -> u32 {
    if mode >= 3 { 81 } else { 10 }
}

/// Quantizes activations as ggml-cpu does before an integer dot product, into the exact path's
/// word layout: mode 1 Q8_0, 2 Q8_1 (ggml's AVX2 quantizer; `s = f16(d·Σq)`), 3 Q8_K
/// (`quantize_row_q8_K_ref`), 4 Q8_K with rows `i1 < P11` quantized as
/// `ggml_quantize_mat_q8_K_4x8` does (the scale's sign from whether `+max|x|` occurs) and the
/// rest as mode 3. One invocation per block; rows are whole blocks, stored densely
/// (row `i1 + ne1·(i2 + ne2·i3)`).
pub fn quantize_act() -> String {
    let mut s = params_decl(2) + COMMON;
    s += &input(0, "s", DType::F32);
    s += &storage(1, "q");
    s += &entry(256, false);
    s += r#"
    let g = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (g >= pu(0u)) { return; }
    let mode = pu(10u);
    var bs = 32u;
    if (mode >= 3u) { bs = 256u; }
    let nb0 = pu(1u) / bs; let ne1 = pu(2u); let ne2 = pu(3u);
    let ib = g % nb0; let t1 = g / nb0; let i1 = t1 % ne1; let t2 = t1 / ne1; let i2 = t2 % ne2; let i3 = t2 / ne2;
    let sb = pu(5u) + i1 * pu(7u) + i2 * pu(8u) + i3 * pu(9u);
    let s0 = pu(6u);
    let first = ib * bs;
    let wpb = select(10u, 81u, mode >= 3u);
    let qb = (t1 * nb0 + ib) * wpb;
    if (mode <= 2u) {
        var amax = 0.0;
        for (var j = 0u; j < 32u; j++) {
            let a = abs(ld_s(sb + (first + j) * s0));
            amax = select(a, amax, amax > a);
        }
        let d = amax / 127.0;
        var id = 0.0;
        if (amax != 0.0) { id = 127.0 / amax; }
        var sum = 0i;
        for (var w = 0u; w < 8u; w++) {
            var word = 0u;
            for (var i = 0u; i < 4u; i++) {
                let r = round(ld_s(sb + (first + 4u * w + i) * s0) * id);
                // x86's conversion: NaN and out-of-range values become i32::MIN.
                var v = -2147483647i - 1i;
                if (r >= -2147483648.0 && r < 2147483648.0) { v = i32(r); }
                sum += v;
                word |= (u32(clamp(v, -128i, 127i)) & 0xffu) << (8u * i);
            }
            q[qb + 2u + w] = word;
        }
        q[qb] = bitcast<u32>(f16r(d));
        q[qb + 1u] = bitcast<u32>(f16r(d * f32(sum)));
        return;
    }
    var amax = 0.0;
    var mx = 0.0;
    var amax4 = 0.0;
    for (var j = 0u; j < 256u; j++) {
        let v = ld_s(sb + (first + j) * s0);
        let a = abs(v);
        if (a > amax) { amax = a; mx = v; }
        amax4 = select(a, amax4, amax4 > a);
    }
    var iscale = 0.0;
    var d = 0.0;
    let four = mode == 4u && i1 < pu(11u);
    if (four) {
        var positive = false;
        for (var j = 0u; j < 256u; j++) {
            if (ld_s(sb + (first + j) * s0) == amax4) { positive = true; }
        }
        if (amax4 != 0.0) {
            iscale = select(127.0 / amax4, -127.0 / amax4, positive);
            d = 1.0 / iscale;
        }
    } else if (amax != 0.0) {
        iscale = -127.0 / mx;
        d = 1.0 / iscale;
    }
    var bsum = 0i;
    for (var w = 0u; w < 64u; w++) {
        var word = 0u;
        for (var i = 0u; i < 4u; i++) {
            let r = round(iscale * ld_s(sb + (first + 4u * w + i) * s0));
            var v: i32;
            if (four) {
                v = -2147483647i - 1i;
                if (r >= -2147483648.0 && r < 2147483648.0) { v = i32(r); }
                v = clamp(v, -128i, 127i);
            } else {
                // |r| <= 127 for every finite block (|v| <= amax); the reference keeps min(n, 127).
                v = extractBits(min(i32(clamp(r, -2147483648.0, 2147483520.0)), 127i), 0u, 8u);
            }
            bsum += v;
            word |= (u32(v) & 0xffu) << (8u * i);
        }
        q[qb + 1u + w] = word;
        if (w % 4u == 3u) {
            q[qb + 65u + w / 4u] = bitcast<u32>(bsum);
            bsum = 0i;
        }
    }
    q[qb] = bitcast<u32>(d);
}
"#;
    s
}

/// Integer and lane helpers of the exact path.
const EXACT_COMMON: &str = r#"
// Elements 4l..4l+3 of a 32-value nibble block (bytes at q): low nibbles of bytes 4l.. for
// l < 4, high nibbles of bytes 4(l-4).. after, one per byte.
fn nibbles(q: u32, l: u32) -> u32 {
    return (w_u32(q + 4u * (l % 4u)) >> (4u * (l / 4u))) & 0x0f0f0f0fu;
}
fn hsum8(v: array<f32, 8>) -> f32 {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}
// Q6_K's values (0..63, one per byte) of chunk k (0..3) of half j (0..1), bytes b..b+3.
fn q6w(wb: u32, j: u32, k: u32, b: u32) -> u32 {
    let l1 = w_u32(wb + 64u * j + b);
    let l2 = w_u32(wb + 64u * j + 32u + b);
    let h = w_u32(wb + 128u + 32u * j + b);
    switch k {
        case 0u: { return (l1 & 0x0f0f0f0fu) | ((h & 0x03030303u) << 4u); }
        case 1u: { return (l2 & 0x0f0f0f0fu) | ((h & 0x0c0c0c0cu) << 2u); }
        case 2u: { return ((l1 >> 4u) & 0x0f0f0f0fu) | (h & 0x30303030u); }
        default: { return ((l2 >> 4u) & 0x0f0f0f0fu) | ((h & 0xc0c0c0c0u) >> 2u); }
    }
}
"#;

/// One output's dot product in the exact path: `dot(wrow, arow, col)` for weight type `dt`
/// and kernel `variant` (Q4_K: 0 vec_dot, 1 tiled, 2 repacked; Q6_K: 0 vec_dot, 1 tiled).
fn exact_dot(dt: DType, variant: u32) -> String {
    // `lane(wb, l, aw)`: lane l's exact integer sum (weights of block `wb` against the activation
    // word `aw` of 4 i8), by packed 4 x i8 dot products.
    let q0 = |bb: u32, lane: &str| {
        format!(
            r#"
fn lane(wb: u32, l: u32, aw: u32) -> i32 {{ {lane} }}
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {{
    var acc: array<f32, 8>;
    for (var b = 0u; b < nblk; b++) {{
        let wb = wrow + b * {bb}u; let ab = arow + b * 10u;
        let d = w_f16(wb) * bitcast<f32>(a[ab]);
        for (var l = 0u; l < 8u; l++) {{
            acc[l] = fma_x(d, f32(lane(wb, l, a[ab + 2u + l])), acc[l]);
        }}
    }}
    return hsum8(acc);
}}
"#
        )
    };
    match (dt, variant) {
        (DType::Q4_0, 0) => q0(
            18,
            "return dot4I8Packed(nibbles(wb + 2u, l), aw) - 8i * dot4I8Packed(0x01010101u, aw);",
        ),
        (DType::Q5_0, _) => q0(
            22,
            "let h = (w_u32(wb + 2u) >> (4u * l)) & 0xfu; \
             let hb = ((h & 1u) << 4u) | ((h & 2u) << 11u) | ((h & 4u) << 18u) | ((h & 8u) << 25u); \
             return dot4I8Packed(nibbles(wb + 6u, l) | hb, aw) - 16i * dot4I8Packed(0x01010101u, aw);",
        ),
        (DType::Q8_0, _) => q0(34, "return dot4I8Packed(w_u32(wb + 2u + 4u * l), aw);"),
        (DType::Q4_1, _) => r#"
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {
    var acc: array<f32, 8>;
    var summs = 0.0;
    for (var b = 0u; b < nblk; b++) {
        let wb = wrow + b * 20u; let ab = arow + b * 10u;
        summs = fma_x(w_f16(wb + 2u), bitcast<f32>(a[ab + 1u]), summs);
        let d = w_f16(wb) * bitcast<f32>(a[ab]);
        for (var l = 0u; l < 8u; l++) {
            acc[l] = fma_x(d, f32(dot4I8Packed(nibbles(wb + 4u, l), a[ab + 2u + l])), acc[l]);
        }
    }
    return hsum8(acc) + summs;
}
"#
        .into(),
        (DType::Q6_K, 0) => r#"
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {
    var acc: array<f32, 8>;
    for (var b = 0u; b < nblk; b++) {
        let wb = wrow + b * 210u; let ab = arow + b * 81u;
        let d = bitcast<f32>(a[ab]) * w_f16(wb + 208u);
        var sumi: array<i32, 8>;
        for (var j = 0u; j < 2u; j++) {
            for (var k = 0u; k < 4u; k++) {
                let is = 4u * j + k;
                for (var l = 0u; l < 8u; l++) {
                    let sc = w_i8(wb + 192u + 2u * is + select(0u, 1u, l >= 4u));
                    let v = dot4I8Packed(q6w(wb, j, k, 4u * l), a[ab + 1u + 32u * j + 8u * k + l]);
                    sumi[l] += sc * v;
                }
            }
        }
        for (var l = 0u; l < 8u; l++) {
            let bs = bitcast<i32>(a[ab + 65u + 2u * l]) * w_i8(wb + 192u + 2u * l)
                + bitcast<i32>(a[ab + 66u + 2u * l]) * w_i8(wb + 193u + 2u * l);
            acc[l] = fma_x(d, f32(sumi[l] - (bs << 5u)), acc[l]);
        }
    }
    return hsum8(acc);
}
"#
        .into(),
        (DType::Q6_K, _) => r#"
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {
    var acc = 0.0;
    for (var b = 0u; b < nblk; b++) {
        let wb = wrow + b * 210u; let ab = arow + b * 81u;
        var s1 = 0i;
        for (var j = 0u; j < 2u; j++) {
            for (var k = 0u; k < 4u; k++) {
                for (var i = 0u; i < 32u; i += 4u) {
                    let idx = 128u * j + 32u * k + i;
                    let aw = a[ab + 1u + idx / 4u];
                    let dq = dot4I8Packed(q6w(wb, j, k, i), aw) - 32i * dot4I8Packed(0x01010101u, aw);
                    s1 += w_i8(wb + 192u + idx / 16u) * dq;
                }
            }
        }
        let res = w_f16(wb + 208u) * f32(s1);
        acc = fma_x(res, bitcast<f32>(a[ab]), acc);
    }
    return acc;
}
"#
        .into(),
        (DType::Q4_K, 0) => r#"
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {
    var acc: array<f32, 8>;
    var acc_m: array<f32, 4>;
    for (var b = 0u; b < nblk; b++) {
        let wb = wrow + b * 144u; let ab = arow + b * 81u;
        let yd = bitcast<f32>(a[ab]);
        let d = yd * w_f16(wb);
        let dmin = -yd * w_f16(wb + 2u);
        for (var l = 0u; l < 4u; l++) {
            let m0 = smk4(wb, 2u * l).y; let m1 = smk4(wb, 2u * l + 1u).y;
            let q0 = bitcast<i32>(a[ab + 65u + 4u * l]) + bitcast<i32>(a[ab + 66u + 4u * l]);
            let q1 = bitcast<i32>(a[ab + 67u + 4u * l]) + bitcast<i32>(a[ab + 68u + 4u * l]);
            acc_m[l] = fma_x(dmin, f32(m0 * q0 + m1 * q1), acc_m[l]);
        }
        var sumi: array<i32, 8>;
        for (var j = 0u; j < 4u; j++) {
            let sl = smk4(wb, 2u * j).x; let sh = smk4(wb, 2u * j + 1u).x;
            for (var l = 0u; l < 8u; l++) {
                let v = w_u32(wb + 16u + 32u * j + 4u * l);
                let pl = dot4I8Packed(v & 0x0f0f0f0fu, a[ab + 1u + 16u * j + l]);
                let ph = dot4I8Packed((v >> 4u) & 0x0f0f0f0fu, a[ab + 9u + 16u * j + l]);
                sumi[l] += sl * pl + sh * ph;
            }
        }
        for (var l = 0u; l < 8u; l++) { acc[l] = fma_x(d, f32(sumi[l]), acc[l]); }
    }
    let m = (acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]);
    return hsum8(acc) + m;
}
"#
        .into(),
        (DType::Q4_0, 1) => r#"
// gemv/gemm_q4_b32_8x8_q8_0 (llama.cpp's repacked Q4_0): one scalar chain over blocks.
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {
    var acc = 0.0;
    for (var b = 0u; b < nblk; b++) {
        let wb = wrow + b * 18u; let ab = arow + b * 10u;
        var s = 0i;
        var ys = 0i;
        for (var w = 0u; w < 4u; w++) {
            let v = w_u32(wb + 2u + 4u * w);
            let lo = a[ab + 2u + w]; let hi = a[ab + 6u + w];
            s += dot4I8Packed(v & 0x0f0f0f0fu, lo) + dot4I8Packed((v >> 4u) & 0x0f0f0f0fu, hi);
            ys += dot4I8Packed(0x01010101u, lo) + dot4I8Packed(0x01010101u, hi);
        }
        s -= 8i * ys;
        acc = fma_x(f32(s), w_f16(wb) * bitcast<f32>(a[ab]), acc);
    }
    return acc;
}
"#
        .into(),
        (DType::Q5_K, 0) => r#"
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {
    var acc: array<f32, 8>;
    var summs = 0.0;
    for (var b = 0u; b < nblk; b++) {
        let wb = wrow + b * 176u; let ab = arow + b * 81u;
        let yd = bitcast<f32>(a[ab]);
        let d = yd * w_f16(wb);
        let dmin = -yd * w_f16(wb + 2u);
        var prod = 0i;
        for (var k = 0u; k < 8u; k++) {
            prod += smk4(wb, k).y * (bitcast<i32>(a[ab + 65u + 2u * k]) + bitcast<i32>(a[ab + 66u + 2u * k]));
        }
        summs = fma_x(dmin, f32(prod), summs);
        var sumi: array<i32, 8>;
        for (var j = 0u; j < 4u; j++) {
            let sl = smk4(wb, 2u * j).x; let sh = smk4(wb, 2u * j + 1u).x;
            for (var l = 0u; l < 8u; l++) {
                let v = w_u32(wb + 48u + 32u * j + 4u * l);
                let h = w_u32(wb + 16u + 4u * l);
                let lo = (v & 0x0f0f0f0fu) | (((h >> (2u * j)) & 0x01010101u) << 4u);
                let hi = ((v >> 4u) & 0x0f0f0f0fu) | (((h >> (2u * j + 1u)) & 0x01010101u) << 4u);
                let pl = dot4I8Packed(lo, a[ab + 1u + 16u * j + l]);
                let ph = dot4I8Packed(hi, a[ab + 9u + 16u * j + l]);
                sumi[l] += sl * pl + sh * ph;
            }
        }
        for (var l = 0u; l < 8u; l++) { acc[l] = fma_x(d, f32(sumi[l]), acc[l]); }
    }
    return hsum8(acc) + summs;
}
"#
        .into(),
        (DType::Q4_K | DType::Q5_K, 1) => r#"
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {
    var acc = 0.0;
    for (var b = 0u; b < nblk; b++) {
        let wb = wrow + b * BLOCKu; let ab = arow + b * 81u;
        var s1 = 0i; var s2 = 0i;
        for (var sub = 0u; sub < 8u; sub++) {
            let j = sub / 2u; let hi = sub % 2u == 1u;
            var dt = 0i;
            for (var i = 0u; i < 32u; i += 4u) {
                let v = w_u32(wb + QSu + 32u * j + i);
                var q = select(v & 0x0f0f0f0fu, (v >> 4u) & 0x0f0f0f0fu, hi);
                if (QSu == 48u) { q = q | (((w_u32(wb + 16u + i) >> sub) & 0x01010101u) << 4u); }
                dt += dot4I8Packed(q, a[ab + 1u + 8u * sub + i / 4u]);
            }
            let sm = smk4(wb, sub);
            s1 += sm.x * dt;
            s2 += sm.y * (bitcast<i32>(a[ab + 65u + 2u * sub]) + bitcast<i32>(a[ab + 66u + 2u * sub]));
        }
        let r0 = w_f16(wb) * f32(s1);
        let res = fma_x(-w_f16(wb + 2u), f32(s2), r0);
        acc = fma_x(res, bitcast<f32>(a[ab]), acc);
    }
    return acc;
}
"#
        .replace("BLOCK", if dt == DType::Q5_K { "176" } else { "144" })
        .replace("QS", if dt == DType::Q5_K { "48" } else { "16" }),
        _ => r#"
// ggml_gemv_q4_K_8x8_q8_K (columns >= P20) and ggml_gemm_q4_K_8x8_q8_K (columns < P20).
fn dot(wrow: u32, arow: u32, col: u32, nblk: u32) -> f32 {
    let gemm = col < pu(20u);
    var acc = 0.0; var acc_min = 0.0;
    for (var b = 0u; b < nblk; b++) {
        let wb = wrow + b * 144u; let ab = arow + b * 81u;
        let yd = bitcast<f32>(a[ab]);
        var iacc: array<i32, 4>; var imin: array<i32, 4>;
        for (var sb = 0u; sb < 4u; sb++) {
            var lo = 0i; var hi = 0i;
            for (var i = 0u; i < 32u; i += 4u) {
                let v = w_u32(wb + 16u + 32u * sb + i);
                lo += dot4I8Packed(v & 0x0f0f0f0fu, a[ab + 1u + 16u * sb + i / 4u]);
                hi += dot4I8Packed((v >> 4u) & 0x0f0f0f0fu, a[ab + 9u + 16u * sb + i / 4u]);
            }
            let s0 = smk4(wb, 2u * sb); let s1 = smk4(wb, 2u * sb + 1u);
            iacc[sb] = s0.x * lo + s1.x * hi;
            let p0 = bitcast<i32>(a[ab + 65u + 4u * sb]) + bitcast<i32>(a[ab + 66u + 4u * sb]);
            let p1 = bitcast<i32>(a[ab + 67u + 4u * sb]) + bitcast<i32>(a[ab + 68u + 4u * sb]);
            imin[sb] = s0.y * p0 + s1.y * p1;
        }
        if (gemm) {
            let d = w_f16(wb) * yd; let dmin = w_f16(wb + 2u) * yd;
            for (var sb = 0u; sb < 4u; sb++) {
                acc = fma_x(f32(iacc[sb]), d, acc);
                acc_min = fma_x(f32(imin[sb]), dmin, acc_min);
            }
        } else {
            let sum = iacc[0] + iacc[1] + iacc[2] + iacc[3];
            let smin = imin[0] + imin[1] + imin[2] + imin[3];
            acc = fma_x(f32(sum), w_f16(wb) * yd, acc);
            acc_min = fma_x(f32(smin), w_f16(wb + 2u) * yd, acc_min);
        }
    }
    return acc - acc_min;
}
"#
        .into(),
    }
}

/// The exact path's matrix product: one invocation per output (64 weight rows × 4 activation
/// rows per workgroup), each computing its dot product with llama.cpp's AVX2 arithmetic for
/// the CPU backend's choice of kernel (see [`exact_dot`]), over activations quantized by
/// [`quantize_act`]. Grid: x = row groups of 64, y = column groups of 4, z = batches.
/// P[19] = words per activation row, P[20] = Q4_K's gemm columns.
pub fn mul_mat_exact(dt: DType, variant: u32) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &weights(0, dt);
    s += &storage(1, "a");
    s += &output(2, "d", DType::F32);
    s += EXACT_COMMON;
    s += EXACT;
    s += &exact_dot(dt, variant);
    s += &entry(256, false);
    s += &MM_INDEX.replace("BZ", "wid.z");
    s += &format!(
        r#"
    let row = wid.x * 64u + lid % 64u;
    let col = wid.y * 4u + lid / 64u;
    if (row >= M || col >= N) {{ return; }}
    let arow = ((i12 + ne12 * i13) * N + col) * pu(19u);
    st_d(dbat + col * pu(16u) + row, dot(wbat + row * pu(8u), arow, col, K / {qk}u));
}}
"#,
        qk = dt.block_elems()
    );
    s
}

/// Output tile edge of the tiled mat-mat kernel.
pub const MM_TILE: u64 = 128;

/// Tiled mat-mat: 128x128 output tile per 256-thread workgroup, 8x8 per
/// thread, K step 16; src0 is dequantized to f32 while filling the tile.
pub fn matmat(dt: DType) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &weights(0, dt);
    s += &input(1, "x", DType::F32);
    s += &output(2, "d", DType::F32);
    // Tiles as vec4 of 4 consecutive rows/columns at one k: one shared load feeds 4 FMAs.
    s += "var<workgroup> As: array<vec4<f32>, 512>;\nvar<workgroup> Bs: array<vec4<f32>, 512>;\n";
    s += &entry(256, false);
    s += &MM_INDEX.replace("BZ", "wid.z");
    s += r#"
    let m0 = wid.x * 128u; let n0 = wid.y * 128u;
    let tx = lid % 16u; let ty = lid / 16u;
    // Thread (tx, ty) owns rows m0 + 4tx + i (+64) x columns n0 + 4ty + j (+64).
    var c0 = vec4<f32>(0.0); var c1 = vec4<f32>(0.0); var c2 = vec4<f32>(0.0); var c3 = vec4<f32>(0.0);
    var c4 = vec4<f32>(0.0); var c5 = vec4<f32>(0.0); var c6 = vec4<f32>(0.0); var c7 = vec4<f32>(0.0);
    var e0 = vec4<f32>(0.0); var e1 = vec4<f32>(0.0); var e2 = vec4<f32>(0.0); var e3 = vec4<f32>(0.0);
    var e4 = vec4<f32>(0.0); var e5 = vec4<f32>(0.0); var e6 = vec4<f32>(0.0); var e7 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < K; k0 += 16u) {
        for (var t = 0u; t < 2u; t++) {
            let e = lid + 256u * t;
            let g = e / 16u; let kl = e % 16u; let k = k0 + kl;
            var av = vec4<f32>(0.0);
            var bv = vec4<f32>(0.0);
            if (k < K) {
                for (var c = 0u; c < 4u; c++) {
                    let m = m0 + 4u * g + c;
                    if (m < M) { av[c] = dq_w(wbat + m * pu(8u), k); }
                    let n = n0 + 4u * g + c;
                    if (n < N) { bv[c] = bitcast<f32>(x[xbat + n * pu(12u) + k]); }
                }
            }
            As[kl * 32u + g] = av;
            Bs[kl * 32u + g] = bv;
        }
        workgroupBarrier();
        for (var kl = 0u; kl < 16u; kl++) {
            let a = As[kl * 32u + tx]; let a2 = As[kl * 32u + tx + 16u];
            let b = Bs[kl * 32u + ty]; let b2 = Bs[kl * 32u + ty + 16u];
            c0 += a.x * b; c1 += a.y * b; c2 += a.z * b; c3 += a.w * b;
            c4 += a2.x * b; c5 += a2.y * b; c6 += a2.z * b; c7 += a2.w * b;
            e0 += a.x * b2; e1 += a.y * b2; e2 += a.z * b2; e3 += a.w * b2;
            e4 += a2.x * b2; e5 += a2.y * b2; e6 += a2.z * b2; e7 += a2.w * b2;
        }
        workgroupBarrier();
    }
    store4(dbat, m0 + 4u * tx, n0 + 4u * ty, M, N, c0, c1, c2, c3);
    store4(dbat, m0 + 4u * tx + 64u, n0 + 4u * ty, M, N, c4, c5, c6, c7);
    store4(dbat, m0 + 4u * tx, n0 + 4u * ty + 64u, M, N, e0, e1, e2, e3);
    store4(dbat, m0 + 4u * tx + 64u, n0 + 4u * ty + 64u, M, N, e4, e5, e6, e7);
}

// Rows m..m+3 (accumulators r0..r3) x columns n0..n0+3 (vector lanes).
fn store4(dbat: u32, m: u32, n0: u32, M: u32, N: u32, r0: vec4<f32>, r1: vec4<f32>, r2: vec4<f32>, r3: vec4<f32>) {
    for (var j = 0u; j < 4u; j++) {
        let n = n0 + j;
        if (n < N) {
            let base = dbat + n * pu(16u) + m;
            if (m < M) { st_d(base, r0[j]); }
            if (m + 1u < M) { st_d(base + 1u, r1[j]); }
            if (m + 2u < M) { st_d(base + 2u, r2[j]); }
            if (m + 3u < M) { st_d(base + 3u, r3[j]); }
        }
    }
}
"#;
    s
}

/// get_rows: `d[i0, i1, i2, i3] = dq(w row ids[i1, i2, i3] of plane (i2, i3), i0)`.
pub fn get_rows(dt: DType) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &weights(0, dt);
    s += &input(1, "ids", DType::I32);
    s += &output(2, "d", DType::F32);
    s += &entry(256, false);
    s += ELEM_INDEX;
    s += r#"
    let r = ldi_ids(pu(9u) + i1 * pu(10u) + i2 * pu(11u) + i3 * pu(12u));
    // Only rows [P17, P18) are bound (big tables are split over dispatches);
    // ids outside every chunk leave dst untouched (a shader cannot report errors).
    if (r < i32(pu(17u)) || r >= i32(pu(18u))) { return; }
    let v = dq_w(pu(5u) + (u32(r) - pu(17u)) * pu(6u) + i2 * pu(7u) + i3 * pu(8u), i0);
    st_d(pu(13u) + i0 + i1 * pu(14u) + i2 * pu(15u) + i3 * pu(16u), v);
}
"#;
    s
}

pub const ROW_WG: u32 = 256;

/// Row index prologue for one-workgroup-per-row kernels (ne at P[0..3], nrows at P[3]).
const ROW_INDEX: &str = r#"
    let row = wid.x + wid.y * nwg.x;
    if (row >= pu(3u)) { return; }
    let ne0 = pu(0u); let ne1 = pu(1u); let ne2 = pu(2u);
    let i1 = row % ne1; let i2 = (row / ne1) % ne2; let i3 = row / (ne1 * ne2);
    let sb = pu(4u) + i1 * pu(6u) + i2 * pu(7u) + i3 * pu(8u);
    let snb0 = pu(5u);
    let db = pu(9u) + i1 * pu(10u) + i2 * pu(11u) + i3 * pu(12u);
"#;

/// rms_norm (`rms = true`) or norm, per row of ne[0].
pub fn norm(rms: bool, subgroups: bool) -> String {
    let mut s = params_decl(2) + COMMON;
    s += &input(0, "s", DType::F32);
    s += &output(1, "d", DType::F32);
    s += &reductions(ROW_WG, subgroups);
    s += &format!(
        "var<workgroup> dh: array<f32, {ROW_WG}>;\nvar<workgroup> dl: array<f32, {ROW_WG}>;\nvar<workgroup> mean_s: f32;\n"
    );
    s += EXACT;
    s += V_EXPF;
    s += &entry(ROW_WG, subgroups);
    s += ROW_INDEX;
    let body = if rms {
        // As the CPU: the f32 squares summed in double (here an exact two-float sum), the mean
        // rounded once to f32, then `1/sqrt(mean + eps)` in f32.
        r#"
    var hi = 0.0;
    var lo = 0.0;
    for (var i = lid; i < ne0; i += WGu) {
        let v = ld_s(sb + i * snb0);
        let t = two_sum(hi, v * v);
        hi = t.x;
        lo = lo + t.y;
    }
    dh[lid] = hi;
    dl[lid] = lo;
    workgroupBarrier();
    for (var off = WGu / 2u; off > 0u; off = off / 2u) {
        if (lid < off) {
            let t = two_sum(dh[lid], dh[lid + off]);
            dh[lid] = t.x;
            dl[lid] = dl[lid] + dl[lid + off] + t.y;
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let h = opaque(dh[0] + dl[0]);
        let l = dl[0] - (h - dh[0]);
        let n = f32(ne0);
        let q = h / n;
        mean_s = q + (fma_x(-q, n, h) + l) / n;
    }
    workgroupBarrier();
    let sc = 1.0 / sqrt(mean_s + pf(13u));
    for (var i = lid; i < ne0; i += WGu) { st_d(db + i, ld_s(sb + i * snb0) * sc); }
}
"#
    } else {
        r#"
    var acc = 0.0;
    for (var i = lid; i < ne0; i += WGu) { acc += ld_s(sb + i * snb0); }
    let mean = wg_sum(acc, lid, SGS) / f32(ne0);
    var acc2 = 0.0;
    for (var i = lid; i < ne0; i += WGu) { let v = ld_s(sb + i * snb0) - mean; acc2 += v * v; }
    let var_ = wg_sum(acc2, lid, SGS) / f32(ne0);
    let sc = 1.0 / sqrt(var_ + pf(13u));
    for (var i = lid; i < ne0; i += WGu) { st_d(db + i, (ld_s(sb + i * snb0) - mean) * sc); }
}
"#
    };
    s += &body
        .replace("WGu", &format!("{ROW_WG}u"))
        .replace("SGS", sgs_arg(subgroups));
    s
}

/// soft_max(x * scale + mask) per row; mask row = (i1 % m1, i2 % m2, i3 % m3).
/// ggml's AVX2 `ggml_v_expf` (the ARM optimized-routines polynomial), lane for lane as the CPU
/// runs it (its FMAs by [`EXACT`]'s `fma_x`, which must come first), and `ggml_v_silu`.
const V_EXPF: &str = r#"
fn v_expf(x: f32) -> f32 {
    let r = bitcast<f32>(0x4b400000u);
    let z = fma_x(x, bitcast<f32>(0x3fb8aa3bu), r);
    let n = opaque(z) - r;
    let b = fma_x(-n, bitcast<f32>(0x35bfbe8eu), fma_x(-n, bitcast<f32>(0x3f317200u), x));
    let e = bitcast<u32>(z) << 23u;
    let k = bitcast<f32>(e + 0x3f800000u);
    let u = b * b;
    let j = fma_x(
        fma_x(fma_x(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u)), u,
            fma_x(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu))),
        u, bitcast<f32>(0x3f7ffff6u) * b);
    if (!(abs(n) > 126.0)) { return fma_x(j, k, k); }
    var g = 0u;
    if (n <= 0.0) { g = 0x82000000u; }
    let s1 = bitcast<f32>(g + 0x7f000000u);
    let s2 = bitcast<f32>(e - g);
    if (abs(n) > 192.0) { return s1 * s1; }
    return fma_x(s2, j, s2) * s1;
}
// One lane of ggml_v_silu.
fn v_silu(x: f32) -> f32 { return x / (1.0 + v_expf(0.0 - x)); }
"#;

pub fn soft_max(mask: Option<DType>, subgroups: bool) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &input(0, "s", DType::F32);
    s += &input(1, "m", mask.unwrap_or(DType::F32));
    s += &output(2, "d", DType::F32);
    s += &reductions(ROW_WG, subgroups);
    s += &format!(
        "var<workgroup> dh: array<f32, {ROW_WG}>;\nvar<workgroup> dl: array<f32, {ROW_WG}>;\nvar<workgroup> inv_s: f32;\n"
    );
    s += EXACT;
    s += V_EXPF;
    s += &entry(ROW_WG, subgroups);
    s += ROW_INDEX;
    let mask_term = if mask.is_some() {
        "ld_m(mb + i * pu(18u))"
    } else {
        "0.0"
    };
    s += &r#"
    _ = &m; // keep the mask binding in the layout when unused
    // ggml_compute_forward_soft_max_f32 as the CPU runs it: w = x*scale (+ mask), the max, then
    // ggml_v_expf on groups of 8 (each group summed as _mm256's horizontal sum), the group
    // sums added in double (here a two-float sum), y = e * (float)(1/sum); a tail of fewer
    // than 8 values uses exp.
    let scale = pf(13u);
    let mb = pu(14u) + (i1 % pu(15u)) * pu(19u) + (i2 % pu(16u)) * pu(20u) + (i3 % pu(17u)) * pu(21u);
    var mx = neg_inf();
    for (var i = lid; i < ne0; i += WGu) {
        let p = ld_s(sb + i * snb0) * scale;
        mx = max(mx, p + MASK);
    }
    let rmax = wg_max(mx, lid, SGS);
    // A fully masked row gives zeros instead of 0/0 = NaN.
    if (rmax <= -3.0e38) {
        for (var i = lid; i < ne0; i += WGu) { st_d(db + i, 0.0); }
        return;
    }
    let ng = ne0 / 8u;
    var hi = 0.0;
    var lo = 0.0;
    for (var g = lid; g < ng; g += WGu) {
        var e: array<f32, 8>;
        for (var j = 0u; j < 8u; j++) {
            let i = g * 8u + j;
            let p = ld_s(sb + i * snb0) * scale;
            e[j] = v_expf((p + MASK) - rmax);
            st_d(db + i, e[j]);
        }
        let hs = ((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7]));
        let t = two_sum(hi, hs);
        hi = t.x;
        lo = lo + t.y;
    }
    for (var i = ng * 8u + lid; i < ne0; i += WGu) {
        let p = ld_s(sb + i * snb0) * scale;
        let e = exp((p + MASK) - rmax);
        st_d(db + i, e);
        let t = two_sum(hi, e);
        hi = t.x;
        lo = lo + t.y;
    }
    dh[lid] = hi;
    dl[lid] = lo;
    workgroupBarrier();
    for (var off = WGu / 2u; off > 0u; off = off / 2u) {
        if (lid < off) {
            let t = two_sum(dh[lid], dh[lid + off]);
            dh[lid] = t.x;
            dl[lid] = dl[lid] + dl[lid + off] + t.y;
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        // (float)(1.0 / sum) from the two-float sum S = h + l: q = 1/h refined once.
        let h = opaque(dh[0] + dl[0]);
        let l = dl[0] - (h - dh[0]);
        let q = 1.0 / h;
        let r = fma_x(-q, h, 1.0) - q * l;
        inv_s = q + q * r;
    }
    workgroupBarrier();
    let inv = inv_s;
    for (var i = lid; i < ne0; i += WGu) { st_d(db + i, bitcast<f32>(d[db + i]) * inv); }
}
"#
    .replace("MASK", mask_term)
    .replace("WGu", &format!("{ROW_WG}u"))
    .replace("SGS", sgs_arg(subgroups));
    s
}

/// `x` as a WGSL literal (Rust's shortest round-trip digits; `bitcast` is not a constant
/// expression).
fn f32_lit(x: f32) -> String {
    format!("{x:?}")
}

/// `d` as a double-float `vec2<f32>(hi, lo)` literal (hi + lo = d to 48 bits).
fn df_lit(d: f64) -> String {
    let hi = d as f32;
    let lo = (d - hi as f64) as f32;
    format!("vec2<f32>({}, {})", f32_lit(hi), f32_lit(lo))
}

/// Double-float arithmetic (`vec2<f32>(hi, lo)`, 48 bits) for shaders that repeat a libm
/// function's double arithmetic; needs [`EXACT`].
const DF: &str = r#"
fn df_norm(h: f32, l: f32) -> vec2<f32> { let s = opaque(h + l); return vec2<f32>(s, l - opaque(s - h)); }
fn two_prod(a: f32, b: f32) -> vec2<f32> {
    let p = opaque(a * b);
    let sa = split12(a); let sb = split12(b);
    return vec2<f32>(p, ((opaque(sa.x * sb.x) - p) + opaque(sa.x * sb.y) + opaque(sa.y * sb.x)) + opaque(sa.y * sb.y));
}
fn df_add(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let s = two_sum(a.x, b.x);
    let t = two_sum(a.y, b.y);
    let u = df_norm(s.x, s.y + t.x);
    return df_norm(u.x, u.y + t.y);
}
fn df_mul(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let p = two_prod(a.x, b.x);
    return df_norm(p.x, p.y + (a.x * b.y + a.y * b.x));
}
"#;

/// glibc's `expf` (the 2017 Arm algorithm of x86-64 glibc 2.27+: `k = round(x·32/ln2)`,
/// `2^(k/32)` from a table, a cubic in double), its double arithmetic in double-float: glibc's
/// bits but where its double result lies within ~2^-47 of a rounding boundary. The CPU's flash
/// attention takes libm `expf`. Needs [`EXACT`] and [`DF`].
fn libm_expf() -> String {
    const TAB: [u64; 32] = [
        0x3ff0000000000000,
        0x3fefd9b0d3158574,
        0x3fefb5586cf9890f,
        0x3fef9301d0125b51,
        0x3fef72b83c7d517b,
        0x3fef54873168b9aa,
        0x3fef387a6e756238,
        0x3fef1e9df51fdee1,
        0x3fef06fe0a31b715,
        0x3feef1a7373aa9cb,
        0x3feedea64c123422,
        0x3feece086061892d,
        0x3feebfdad5362a27,
        0x3feeb42b569d4f82,
        0x3feeab07dd485429,
        0x3feea47eb03a5585,
        0x3feea09e667f3bcd,
        0x3fee9f75e8ec5f74,
        0x3feea11473eb0187,
        0x3feea589994cce13,
        0x3feeace5422aa0db,
        0x3feeb737b0cdc5e5,
        0x3feec49182a3f090,
        0x3feed503b23e255d,
        0x3feee89f995ad3ad,
        0x3feeff76f2fb5e47,
        0x3fef199bdd85529c,
        0x3fef3720dcef9069,
        0x3fef5818dcfba487,
        0x3fef7c97337b9b5f,
        0x3fefa4afa2a490da,
        0x3fefd0765b6e4540,
    ];
    // tab[i] + (i << 47) is 2^(i/32) as a double.
    let t: Vec<String> = (0..32u64)
        .map(|i| df_lit(f64::from_bits(TAB[i as usize] + (i << 47))))
        .collect();
    let n = 32f64;
    format!(
        r#"
const EXP_T = array<vec2<f32>, 32>({t});
const EXP_C0 = {c0};
const EXP_C1 = {c1};
const EXP_C2 = {c2};
const EXP_INVLN2N = {inv};
fn libm_expf(x: f32) -> f32 {{
    let abstop = (bitcast<u32>(x) >> 20u) & 0x7ffu;
    if (abstop >= 0x42bu) {{
        if (bitcast<u32>(x) == 0xff800000u) {{ return 0.0; }}
        if (abstop >= 0x7f8u) {{ return x + x; }}
        if (x > 88.72283172607421875) {{ return bitcast<f32>(0x7f800000u); }}
        if (x < -103.972076416015625) {{ return 0.0; }}
    }}
    // z = x·32/ln2 = k + r, k the nearest integer.
    let z = df_mul(vec2<f32>(x, 0.0), EXP_INVLN2N);
    var k = round(z.x);
    var r = df_add(vec2<f32>(z.x - k, 0.0), vec2<f32>(z.y, 0.0));
    if (r.x > 0.5) {{ k = k + 1.0; r = df_add(r, vec2<f32>(-1.0, 0.0)); }}
    if (r.x < -0.5) {{ k = k - 1.0; r = df_add(r, vec2<f32>(1.0, 0.0)); }}
    let ki = i32(k);
    let zz = df_add(df_mul(EXP_C0, r), EXP_C1);
    let y1 = df_add(df_mul(EXP_C2, r), vec2<f32>(1.0, 0.0));
    let y = df_mul(df_add(df_mul(zz, df_mul(r, r)), y1), EXP_T[u32(ki & 31i)]);
    let e = ki >> 5u;
    return ldexp(ldexp(y.x + y.y, e - e / 2i), e / 2i);
}}
"#,
        t = t.join(", "),
        c0 = df_lit(f64::from_bits(0x3fac6af84b912394) / n / n / n),
        c1 = df_lit(f64::from_bits(0x3fcebfce50fac4f3) / n / n),
        c2 = df_lit(f64::from_bits(0x3fe62e42ff0c52d6) / n),
        inv = df_lit(f64::from_bits(0x3ff71547652b82fe) * n),
    )
}

/// glibc's `sinf`/`cosf` (the 2018 Arm algorithm that x86-64 glibc 2.28+ runs: a one-step
/// reduction below 120, a 4/π table above, polynomials in double), with its double arithmetic
/// in double-float (48 bits): the float results are glibc's but where its double result lies
/// within ~2^-47 of a rounding boundary. The CPU backend's RoPE calls libm `cosf`/`sinf` as
/// llama.cpp does; a shader's `cos`/`sin` give other bits (lavapipe: half of them). Needs
/// [`EXACT`].
fn libm_sincos() -> String {
    // glibc's `__sincosf_table[0]`: c0..c4, s1..s3 (entry 1 negates c0..c4).
    let table: [f64; 8] = [
        f64::from_bits(0x3ff0000000000000),
        f64::from_bits(0xbfdffffffd0c621c),
        f64::from_bits(0x3fa55553e1068f19),
        f64::from_bits(0xbf56c087e89a359d),
        f64::from_bits(0x3ef99343027bf8c3),
        f64::from_bits(0xbfc555545995a603),
        f64::from_bits(0x3f81107605230bc4),
        f64::from_bits(0xbf2994eb3774cf24),
    ];
    let hpi = f64::from_bits(0x3ff921fb54442d18);
    let h1 = hpi as f32;
    let h2 = (hpi - h1 as f64) as f32;
    let h3 = (hpi - h1 as f64 - h2 as f64) as f32;
    let mut s = String::from(
        r#"
fn top12(x: f32) -> u32 { return (bitcast<u32>(x) >> 20u) & 0x7ffu; }
// 32 x 32 -> 64-bit product (lo, hi).
fn mul_wide(a: u32, b: u32) -> vec2<u32> {
    let a0 = a & 0xffffu; let a1 = a >> 16u; let b0 = b & 0xffffu; let b1 = b >> 16u;
    let p00 = a0 * b0; let p01 = a0 * b1; let p10 = a1 * b0; let p11 = a1 * b1;
    let mid = (p00 >> 16u) + (p01 & 0xffffu) + (p10 & 0xffffu);
    let lo = (p00 & 0xffffu) | (mid << 16u);
    let hi = p11 + (p01 >> 16u) + (p10 >> 16u) + (mid >> 16u);
    return vec2<u32>(lo, hi);
}
const INV_PIO4 = array<u32, 24>(0xa2u, 0xa2f9u, 0xa2f983u, 0xa2f9836eu, 0xf9836e4eu, 0x836e4e44u,
    0x6e4e4415u, 0x4e441529u, 0x441529fcu, 0x1529fc27u, 0x29fc2757u, 0xfc2757d1u, 0x2757d1f5u,
    0x57d1f534u, 0xd1f534ddu, 0xf534ddc0u, 0x34ddc0dbu, 0xddc0db62u, 0xc0db6295u, 0xdb629599u,
    0x6295993cu, 0x95993c43u, 0x993c4390u, 0x3c439041u);
// reduce_large: the reduced argument (double-float) and the quadrant.
fn reduce_large(xi0: u32) -> vec3<f32> {
    let k = (xi0 >> 26u) & 15u;
    let shift = (xi0 >> 23u) & 7u;
    let xi = ((xi0 & 0xffffffu) | 0x800000u) << shift;
    let r0 = xi * INV_PIO4[k];
    let r1 = mul_wide(xi, INV_PIO4[k + 4u]);
    let r2 = mul_wide(xi, INV_PIO4[k + 8u]);
    // res0 = (r2 >> 32) | (r0 << 32), then += r1.
    var lo = r2.y + r1.x;
    var hi = r0 + r1.y + select(0u, 1u, lo < r1.x);
    // n = (res0 + 2^61) >> 62; res0 -= n << 62.
    let n = (hi + 0x20000000u) >> 30u;
    hi = hi - (n << 30u);
    // (int64)res0 as a double-float, from four exact 16-bit parts.
    let hs = bitcast<i32>(hi);
    var v = vec2<f32>(f32(hs >> 16u) * 281474976710656.0, 0.0);
    v = df_add(v, vec2<f32>(f32(hi & 0xffffu) * 4294967296.0, 0.0));
    v = df_add(v, vec2<f32>(f32(lo >> 16u) * 65536.0, 0.0));
    v = df_add(v, vec2<f32>(f32(lo & 0xffffu), 0.0));
    let r = df_mul(v, PI63);
    return vec3<f32>(r.x, r.y, f32(n));
}
fn sincos_poly(x: vec2<f32>, x2: vec2<f32>, neg: bool, odd: bool) -> f32 {
    var c0 = C0; var c1 = C1; var c2 = C2; var c3 = C3; var c4 = C4;
    if (neg) { c0 = -c0; c1 = -c1; c2 = -c2; c3 = -c3; c4 = -c4; }
    if (!odd) {
        let x3 = df_mul(x, x2);
        let s1 = df_add(S2, df_mul(x2, S3));
        let x7 = df_mul(x3, x2);
        let s = df_add(x, df_mul(x3, S1));
        let r = df_add(s, df_mul(x7, s1));
        return r.x + r.y;
    }
    let x4 = df_mul(x2, x2);
    let c2v = df_add(c3, df_mul(x2, c4));
    let c1v = df_add(c0, df_mul(x2, c1));
    let x6 = df_mul(x4, x2);
    let c = df_add(c1v, df_mul(x4, c2));
    let r = df_add(c, df_mul(x6, c2v));
    return r.x + r.y;
}
// glibc's sinf and cosf of y, as (sin, cos): the two share the reduction.
fn libm_sincosf(y: f32) -> vec2<f32> {
    let x = vec2<f32>(y, 0.0);
    if (top12(y) < top12(0.785398185253143310546875)) {
        if (top12(y) < top12(0.000244140625)) { return vec2<f32>(y, 1.0); }
        let x2 = df_mul(x, x);
        return vec2<f32>(sincos_poly(x, x2, false, false), sincos_poly(x, x2, false, true));
    }
    var r: vec2<f32>;
    var n: i32;
    var sgn: i32;
    if (top12(y) < top12(120.0)) {
        // n from r = x·(2/π)·2^24 as ((int)r + 2^23) >> 24, i.e. floor(q + 1/2), q = x·2/π.
        let q = df_mul(x, HPI_INV);
        var t = floor(q.x + 0.5);
        if (t == q.x + 0.5 && q.y < 0.0) { t = t - 1.0; }
        n = i32(t);
        let a = two_prod(t, H1);
        let b = two_prod(t, H2);
        r = df_add(x, vec2<f32>(-a.x, -a.y));
        r = df_add(r, vec2<f32>(-b.x, -b.y));
        r = df_add(r, vec2<f32>(-(t * H3), 0.0));
        sgn = n;
    } else if (top12(y) < top12(bitcast<f32>(0x7f800000u))) {
        let v = reduce_large(bitcast<u32>(y));
        r = v.xy;
        n = i32(v.z);
        sgn = n + i32(bitcast<u32>(y) >> 31u);
    } else {
        return vec2<f32>(y - y);
    }
    // The sign of sine in quadrant sgn & 3 (1, -1, -1, 1).
    var xs = r;
    if ((sgn & 3) == 1 || (sgn & 3) == 2) { xs = -r; }
    let x2 = df_mul(r, r);
    let neg = (sgn & 2) != 0;
    let odd = (n & 1) != 0;
    return vec2<f32>(sincos_poly(xs, x2, neg, odd), sincos_poly(xs, x2, neg, !odd));
}
"#,
    );
    let names = ["C0", "C1", "C2", "C3", "C4", "S1", "S2", "S3"];
    for (name, v) in names.iter().zip(table) {
        s += &format!("const {name} = {};\n", df_lit(v));
    }
    s += &format!(
        "const HPI_INV = {};\nconst PI63 = {};\nconst H1 = {};\nconst H2 = {};\nconst H3 = {};\n",
        df_lit(f64::from_bits(0x3fe45f306dc9c883)),
        df_lit(f64::from_bits(0x3c1921fb54442d18)),
        f32_lit(h1),
        f32_lit(h2),
        f32_lit(h3)
    );
    s
}

/// rope NORM (`neox = false`) or NEOX; one thread per pair of dims.
pub fn rope(neox: bool) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &input(0, "s", DType::F32);
    s += &input(1, "pos", DType::I32);
    s += &output(2, "d", DType::F32);
    s += EXACT;
    s += DF;
    s += &libm_sincos();
    s += &entry(256, false);
    s += r#"
    let g = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (g >= pu(0u)) { return; }
    let half = pu(1u) / 2u; let ne1 = pu(2u); let ne2 = pu(3u);
    let ic = g % half; let t1 = g / half; let i1 = t1 % ne1; let t2 = t1 / ne1; let i2 = t2 % ne2; let i3 = t2 / ne2;
    let sb = pu(4u) + i1 * pu(6u) + i2 * pu(7u) + i3 * pu(8u);
    let db = pu(9u) + i1 * pu(11u) + i2 * pu(12u) + i3 * pu(13u);
    let snb0 = pu(5u); let dnb0 = pu(10u);
    let n_dims = pu(15u);
    let i0 = 2u * ic;
    if (i0 >= n_dims) {
        st_d(db + i0 * dnb0, ld_s(sb + i0 * snb0));
        st_d(db + (i0 + 1u) * dnb0, ld_s(sb + (i0 + 1u) * snb0));
        return;
    }
    let p = f32(ldi_pos(pu(14u) + i2));
    // As ggml's rope cache: theta by repeated products (the same roundings), then scaled.
    var theta = p;
    for (var k = 0u; k < ic; k++) { theta = theta * pf(16u); }
    let th = pf(17u) * theta;
    let sc = libm_sincosf(th);
    let c = sc.y; let sn = sc.x;
    let ia = IA; let ib = IB;
    let x0 = ld_s(sb + ia * snb0); let x1 = ld_s(sb + ib * snb0);
    // The CPU's contractions (rope_rotate).
    st_d(db + ia * dnb0, fma_x(x0, c, -(x1 * sn)));
    st_d(db + ib * dnb0, fma_x(x0, sn, x1 * c));
}
"#;
    if neox {
        s.replace("IA", "ic").replace("IB", "ic + n_dims / 2u")
    } else {
        s.replace("IA", "i0").replace("IB", "i0 + 1u")
    }
}

pub const FA_WG: u32 = 64;
/// Largest head size the flash-attention kernel supports (4 outputs per thread).
pub const FA_MAX_D: u32 = 4 * FA_WG;

/// The bindings of both flash-attention kernels (q, k, v, mask, dst; parameters in slot 5)
/// and the exact arithmetic and libm `expf` they share.
fn flash_attn_header(kv: DType, mask: Option<DType>) -> String {
    let mut s = params_decl(5) + COMMON;
    s += &input(0, "q", DType::F32);
    s += &input(1, "k", kv);
    s += &input(2, "v", kv);
    s += &input(3, "m", mask.unwrap_or(DType::F32));
    s += &output(4, "d", DType::F32);
    s += EXACT;
    s += DF;
    s += &libm_expf();
    s
}

/// Flash attention as ggml-cpu's `_one_chunk` computes it (the CPU backend's rows and split-KV
/// paths), one workgroup per (query, head): Q rounded to K's type, then the cells in order; per
/// unmasked cell the score `vec_dot(K, Q)` in `ggml_vec_dot_f16/f32`'s order (32 lanes on
/// threads 0..31, `GGML_F32x8_REDUCE`), `· scale` (`softcap·tanh` when capped: the shader's
/// tanh, not libm's), `+ mask` (read as f16), an online softmax with libm `expf`, and V
/// accumulated per thread-owned dimension: f16 V in f16 (`ggml_vec_scale_f16`,
/// `ggml_vec_mad_f16`: rounded at every cell), f32 V in f32. The cells are cut into P[23]
/// chunks merged in order as the split-KV path does (1 chunk: the rows path). From 64 query
/// rows the CPU takes its tiled path: [`flash_attn_tiled`].
pub fn flash_attn(kv: DType, mask: Option<DType>) -> String {
    let mut s = flash_attn_header(kv, mask);
    s += &format!(
        "var<workgroup> qs: array<f32, {FA_MAX_D}>;\nvar<workgroup> lanes: array<f32, 32>;\nvar<workgroup> upd: vec4<f32>;\n"
    );
    s += &entry(FA_WG, false);
    let mask_term = if mask.is_some() {
        "f16r(ld_m(mb + ic))"
    } else {
        "0.0"
    };
    // f16 values: Q and the V accumulator rounded as the CPU stores them.
    let (round, f16v) = if kv == DType::F16 {
        ("f16r", true)
    } else {
        ("", false)
    };
    let acc_update = if f16v {
        "if (grow) { a[i] = f16r(a[i] * ms); }\n                a[i] = f16r(fma_x(ld_v(vr + d), vs, a[i]));"
    } else {
        "if (grow) { a[i] = a[i] * ms; }\n                a[i] = fma_x(ld_v(vr + d), vs, a[i]);"
    };
    let leftover = if f16v {
        // ggml_vec_dot_f16: the leftovers' f32 products summed in double.
        "var hi = r; var lo = 0.0;\n            for (var e = np; e < D; e++) { let t = two_sum(hi, ld_k(kr + e) * qs[e]); hi = t.x; lo = lo + t.y; }\n            r = hi + lo;"
    } else {
        "for (var e = np; e < D; e++) { r = fma_x(ld_k(kr + e), qs[e], r); }"
    };
    s += &r#"
    _ = &m; // keep the mask binding in the layout when unused
    let iq = wid.x; let h = wid.y;
    let D = pu(0u); let n_kv = pu(3u);
    let hk = h / pu(4u);
    let qb = pu(5u) + iq * pu(6u) + h * pu(7u);
    let kb = pu(8u) + hk * pu(10u); let knb1 = pu(9u);
    let vb = pu(11u) + hk * pu(13u); let vnb1 = pu(12u);
    let mb = pu(14u) + iq * pu(15u) + (h % pu(16u)) * pu(17u);
    let scale = pf(21u); let softcap = pf(22u);
    let chunks = max(pu(23u), 1u);
    let cs = (n_kv + chunks - 1u) / chunks;
    for (var d = lid; d < D; d += WGu) { qs[d] = ROUND(ld_q(qb + d)); }
    let np = D & ~31u;
    // The merged result (f32) and the chunk's accumulator, for dimensions lid + 64 i.
    var o = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    var mm = neg_inf();
    var ss = 0.0;
    for (var c = 0u; c < chunks; c++) {
        let c0 = c * cs;
        let c1 = min(c0 + cs, n_kv);
        var a = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
        var m = neg_inf();
        var sum = 0.0;
        for (var ic = c0; ic < c1; ic++) {
            let kr = kb + ic * knb1;
            workgroupBarrier();
            if (lid < 32u) {
                var acc = 0.0;
                for (var e = lid; e < np; e += 32u) { acc = fma_x(ld_k(kr + e), qs[e], acc); }
                lanes[lid] = acc;
            }
            workgroupBarrier();
            if (lid == 0u) {
                let mv = MASK;
                var ms = 1.0; var vs = 1.0; var grow = 0.0; var skip = 0.0;
                if (mv == neg_inf()) {
                    skip = 1.0;
                } else {
                    var s0: array<f32, 8>;
                    for (var l = 0u; l < 8u; l++) {
                        s0[l] = (lanes[l] + lanes[16u + l]) + (lanes[8u + l] + lanes[24u + l]);
                    }
                    var r = ((s0[0] + s0[4]) + (s0[1] + s0[5])) + ((s0[2] + s0[6]) + (s0[3] + s0[7]));
                    LEFTOVER
                    var sc = r * scale;
                    if (softcap > 0.0) { sc = softcap * tanh(clamp(sc, -15.0, 15.0)); }
                    sc = sc + mv;
                    if (sc > m) {
                        ms = libm_expf(m - sc);
                        m = sc;
                        grow = 1.0;
                    } else {
                        vs = libm_expf(sc - m);
                    }
                    sum = fma_x(sum, ms, vs);
                }
                upd = vec4<f32>(ms, vs, grow, skip);
            }
            workgroupBarrier();
            let u = upd;
            if (u.w == 0.0) {
                let ms = u.x; let vs = u.y; let grow = u.z != 0.0;
                let vr = vb + ic * vnb1;
                for (var i = 0u; i < 4u; i++) {
                    let d = lid + WGu * i;
                    if (d < D) {
                        UPDATE
                    }
                }
            }
        }
        // Merge the chunk (thread 0 holds its m and sum; share them).
        workgroupBarrier();
        if (lid == 0u) { upd = vec4<f32>(m, sum, 0.0, 0.0); }
        workgroupBarrier();
        let mc = upd.x; let sc = upd.y;
        if (c0 < n_kv && sc != 0.0) {
            let m_new = max(mm, mc);
            let s_old = libm_expf(mm - m_new);
            let s_new = libm_expf(mc - m_new);
            for (var i = 0u; i < 4u; i++) { o[i] = fma_x(o[i], s_old, a[i] * s_new); }
            ss = fma_x(ss, s_old, sc * s_new);
            mm = m_new;
        }
    }
    let inv = select(1.0 / ss, 0.0, ss == 0.0);
    for (var i = 0u; i < 4u; i++) {
        let d = lid + WGu * i;
        if (d < D) { st_d(pu(18u) + d + h * pu(19u) + iq * pu(20u), o[i] * inv); }
    }
}
"#
    .replace("WGu", &format!("{FA_WG}u"))
    .replace("ROUND", round)
    .replace("MASK", mask_term)
    .replace("LEFTOVER", leftover)
    .replace("UPDATE", acc_update);
    s
}

/// ggml-cpu's tiled flash attention (`_tiled`: f16/f32 K and V of one type, 64 or more query
/// rows), one workgroup per (64 query rows, head), a thread per query row: per tile of 64 cells
/// the scores as `simd_gemm`'s FMA chains over f32 Q and K, `· scale`, the mask (as f16),
/// the row maximum, libm `expf` for the rescale, `ggml_vec_soft_max_f32` (`ggml_v_expf` in
/// groups of 8, a double sum) and V accumulated in f32 by FMA chains over the tile's cells. A
/// tile every row of which is masked is skipped, as the CPU skips it. The accumulator lives in
/// the output row. Parameters as [`flash_attn`].
pub fn flash_attn_tiled(kv: DType, mask: Option<DType>) -> String {
    let mut s = flash_attn_header(kv, mask);
    s += V_EXPF;
    s += "fn ld_d(e: u32) -> f32 { return bitcast<f32>(d[e]); }\nvar<workgroup> tile_live: atomic<u32>;\n";
    s += &entry(64, false);
    let mask_term = if mask.is_some() {
        "f16r(ld_m(mb + ic + tk))"
    } else {
        "0.0"
    };
    s += &r#"
    _ = &m; // keep the mask binding in the layout when unused
    let i = wid.x * 64u + lid; let h = wid.y;
    let D = pu(0u); let n_q = pu(1u); let n_kv = pu(3u);
    let live = i < n_q;
    let hk = h / pu(4u);
    let qb = pu(5u) + i * pu(6u) + h * pu(7u);
    let kb = pu(8u) + hk * pu(10u); let knb1 = pu(9u);
    let vb = pu(11u) + hk * pu(13u); let vnb1 = pu(12u);
    let mb = pu(14u) + i * pu(15u) + (h % pu(16u)) * pu(17u);
    let db = pu(18u) + h * pu(19u) + i * pu(20u);
    let scale = pf(21u); let softcap = pf(22u);
    if (live) { for (var d = 0u; d < D; d++) { st_d(db + d, 0.0); } }
    var m = neg_inf();
    var sum = 0.0;
    var kq: array<f32, 64>;
    for (var ic = 0u; ic < n_kv; ic += 64u) {
        let kv_tile = min(64u, n_kv - ic);
        var any = false;
        for (var tk = 0u; tk < 64u; tk++) {
            var mv = neg_inf();
            if (live && tk < kv_tile) { mv = MASK; }
            kq[tk] = mv;
            if (mv != neg_inf()) { any = true; }
        }
        workgroupBarrier();
        if (lid == 0u) { atomicStore(&tile_live, 0u); }
        workgroupBarrier();
        if (any) { atomicOr(&tile_live, 1u); }
        workgroupBarrier();
        let tile = atomicLoad(&tile_live) != 0u;
        if (tile && live) {
            for (var tk = 0u; tk < 64u; tk++) {
                var c = 0.0;
                if (tk < kv_tile) {
                    let kr = kb + (ic + tk) * knb1;
                    for (var e = 0u; e < D; e++) { c = fma_x(ld_q(qb + e), ld_k(kr + e), c); }
                }
                c = c * scale;
                if (softcap > 0.0) { c = softcap * tanh(clamp(c, -15.0, 15.0)); }
                if (tk >= kv_tile) { c = neg_inf(); }
                kq[tk] = c + kq[tk];
            }
            var tmax = neg_inf();
            for (var tk = 0u; tk < 64u; tk++) { tmax = select(kq[tk], tmax, tmax > kq[tk]); }
            if (tmax == neg_inf()) {
                for (var tk = 0u; tk < 64u; tk++) { kq[tk] = 0.0; }
            } else {
                let m_new = max(m, tmax);
                if (m_new > m) {
                    let ms = libm_expf(m - m_new);
                    for (var d = 0u; d < D; d++) { st_d(db + d, ld_d(db + d) * ms); }
                    sum = sum * ms;
                }
                m = m_new;
                // ggml_vec_soft_max_f32: whole groups of 8 -inf at the end give +0.
                var nv = 64u;
                for (var g = 8u; g > 0u; g--) {
                    var all = true;
                    for (var j = 0u; j < 8u; j++) { if (kq[8u * (g - 1u) + j] != neg_inf()) { all = false; } }
                    if (!all || nv != 8u * g) { break; }
                    nv = 8u * (g - 1u);
                }
                var acc = vec2<f32>(0.0, 0.0);
                for (var t = 0u; t < 64u; t++) {
                    if (t >= nv) { kq[t] = 0.0; }
                }
                for (var g = 0u; g < nv / 8u; g++) {
                    var e: array<f32, 8>;
                    for (var j = 0u; j < 8u; j++) {
                        e[j] = v_expf(kq[8u * g + j] - m_new);
                        kq[8u * g + j] = e[j];
                    }
                    let hs = ((e[0] + e[4]) + (e[2] + e[6])) + ((e[1] + e[5]) + (e[3] + e[7]));
                    acc = df_add(acc, vec2<f32>(hs, 0.0));
                }
                let t = df_add(vec2<f32>(sum, 0.0), acc);
                sum = t.x + t.y;
            }
            for (var d = 0u; d < D; d++) {
                var a = ld_d(db + d);
                for (var tk = 0u; tk < 64u; tk++) {
                    var vv = 0.0;
                    if (tk < kv_tile) { vv = ld_v(vb + (ic + tk) * vnb1 + d); }
                    a = fma_x(kq[tk], vv, a);
                }
                st_d(db + d, a);
            }
        }
    }
    if (live) {
        let inv = select(1.0 / sum, 0.0, sum == 0.0);
        for (var d = 0u; d < D; d++) { st_d(db + d, ld_d(db + d) * inv); }
    }
}
"#
    .replace("MASK", mask_term);
    s
}

/// Rounds activations as ggml-cpu's `vec_dot_type` conversion does before a matrix product
/// (mode 0: to f16; 1: Q8_0/Q8_1 blocks of 32, ggml's AVX2 quantizer; 2: Q8_K blocks of 256),
/// writing the values the CPU's integer dot products see, `d * q`, as f32. One invocation per
/// block (one value for mode 0); rows are whole blocks.
pub fn round_act() -> String {
    let mut s = params_decl(2) + COMMON;
    s += &input(0, "s", DType::F32);
    s += &output(1, "d", DType::F32);
    s += &entry(256, false);
    s += r#"
    let g = (wid.y * nwg.x + wid.x) * 256u + lid;
    if (g >= pu(0u)) { return; }
    let mode = pu(15u);
    var bs = 32u;
    if (mode == 0u) { bs = 1u; }
    if (mode == 2u) { bs = 256u; }
    let nb0 = pu(1u) / bs; let ne1 = pu(2u); let ne2 = pu(3u);
    let ib = g % nb0; let t1 = g / nb0; let i1 = t1 % ne1; let t2 = t1 / ne1; let i2 = t2 % ne2; let i3 = t2 / ne2;
    let sb = pu(5u) + i1 * pu(7u) + i2 * pu(8u) + i3 * pu(9u);
    let db = pu(10u) + i1 * pu(12u) + i2 * pu(13u) + i3 * pu(14u);
    let s0 = pu(6u); let d0 = pu(11u);
    let first = ib * bs;
    if (mode == 0u) {
        for (var j = 0u; j < bs; j++) {
            let i0 = first + j;
            st_d(db + i0 * d0, f16r(ld_s(sb + i0 * s0)));
        }
        return;
    }
    if (mode == 1u) {
        var amax = 0.0;
        for (var j = 0u; j < bs; j++) {
            let a = abs(ld_s(sb + (first + j) * s0));
            amax = select(a, amax, amax > a);
        }
        let dq = f16r(amax / 127.0);
        var id = 0.0;
        if (amax != 0.0) { id = 127.0 / amax; }
        for (var j = 0u; j < bs; j++) {
            let i0 = first + j;
            let q = clamp(round(ld_s(sb + i0 * s0) * id), -128.0, 127.0);
            st_d(db + i0 * d0, dq * q);
        }
        return;
    }
    var amax = 0.0;
    var mx = 0.0;
    for (var j = 0u; j < bs; j++) {
        let v = ld_s(sb + (first + j) * s0);
        if (abs(v) > amax) { amax = abs(v); mx = v; }
    }
    if (amax == 0.0) {
        for (var j = 0u; j < bs; j++) { st_d(db + (first + j) * d0, 0.0); }
        return;
    }
    let iscale = -127.0 / mx;
    let dk = 1.0 / iscale;
    for (var j = 0u; j < bs; j++) {
        let i0 = first + j;
        let q = min(round(iscale * ld_s(sb + i0 * s0)), 127.0);
        st_d(db + i0 * d0, dk * q);
    }
}
"#;
    s
}
