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
    return quantizeToF16(gelu_exact(quantizeToF16(x)));
}
fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }
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
                "fn ld_{name}(e: u32) -> f32 {{ return unpack2x16float({name}[e >> 1u])[e & 1u]; }}\n"
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
               let h = pack2x16float(vec2<f32>(v, 0.0)) & 0xffffu;\n\
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

/// Binary op with broadcast of `b` (ggml add/mul rule) or a GLU `expr`.
pub fn binary(expr: &str) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &input(0, "a", DType::F32);
    s += &input(1, "b", DType::F32);
    s += &output(2, "d", DType::F32);
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
fn w_f16(a: u32) -> f32 { return unpack2x16float(w[a >> 2u])[(a >> 1u) & 1u]; }
fn w_f32(a: u32) -> f32 { return bitcast<f32>(w[a >> 2u]); }
fn byte_of(v: u32, i: u32) -> u32 { return (v >> (8u * i)) & 0xffu; }
// ggml get_scale_min_k4; scales start at b + 4.
fn scale_min_k4(b: u32, j: u32) -> vec2<f32> {
    let q = b + 4u;
    if (j < 4u) {
        return vec2<f32>(f32(w_u8(q + j) & 63u), f32(w_u8(q + j + 4u) & 63u));
    }
    let sc = (w_u8(q + j + 4u) & 0xfu) | ((w_u8(q + j - 4u) >> 6u) << 4u);
    let m = (w_u8(q + j + 4u) >> 4u) | ((w_u8(q + j) >> 6u) << 4u);
    return vec2<f32>(f32(sc), f32(m));
}
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
        mean_s = q + (fma(-q, n, h) + l) / n;
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
/// runs it, and an exact two-float sum.
const V_EXPF: &str = r#"
// A value the compiler cannot reason about: `x ^ 0`, the 0 from word 22 of the parameters, so
// `(a + b) - a` is not folded to `b` (which would drop the error term).
fn opaque(x: f32) -> f32 { return bitcast<f32>(bitcast<u32>(x) ^ pu(22u)); }
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = opaque(a + b);
    let bb = opaque(s - a);
    return vec2<f32>(s, (a - (s - bb)) + (b - bb));
}
fn v_expf(x: f32) -> f32 {
    // The CPU's `z = fma(x, 1/ln2, 0x1.8p23); n = z - 0x1.8p23` rounds x/ln2 to an integer;
    // written so, a shader compiler may fold `(a + r) - r` to `a`, so round directly (the same
    // but for products within an ulp of a half) and build the exponent bits from n.
    let n = round(x * bitcast<f32>(0x3fb8aa3bu));
    let b = fma(-n, bitcast<f32>(0x35bfbe8eu), fma(-n, bitcast<f32>(0x3f317200u), x));
    let e = bitcast<u32>(i32(clamp(n, -1.0e6, 1.0e6))) << 23u;
    let k = bitcast<f32>(e + 0x3f800000u);
    let u = b * b;
    let j = fma(
        fma(fma(bitcast<f32>(0x3c072010u), b, bitcast<f32>(0x3d2b9f17u)), u,
            fma(bitcast<f32>(0x3e2aaf33u), b, bitcast<f32>(0x3efffedbu))),
        u, bitcast<f32>(0x3f7ffff6u) * b);
    if (!(abs(n) > 126.0)) { return fma(j, k, k); }
    var g = 0u;
    if (n <= 0.0) { g = 0x82000000u; }
    let s1 = bitcast<f32>(g + 0x7f000000u);
    let s2 = bitcast<f32>(e - g);
    if (abs(n) > 192.0) { return s1 * s1; }
    return fma(s2, j, s2) * s1;
}
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
        let r = fma(-q, h, 1.0) - q * l;
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

/// rope NORM (`neox = false`) or NEOX; one thread per pair of dims.
pub fn rope(neox: bool) -> String {
    let mut s = params_decl(3) + COMMON;
    s += &input(0, "s", DType::F32);
    s += &input(1, "pos", DType::I32);
    s += &output(2, "d", DType::F32);
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
    // sin/cos are only accurate near zero on some drivers: reduce to [-pi, pi] first
    // (2 pi in two parts, so k * hi is exact).
    let k = round(th * 0.15915494309189535);
    let r = (th - k * 6.28125) - k * 0.0019353071795864769;
    let c = cos(r); let sn = sin(r);
    let ia = IA; let ib = IB;
    let x0 = ld_s(sb + ia * snb0); let x1 = ld_s(sb + ib * snb0);
    // The CPU's contractions (rope_rotate).
    st_d(db + ia * dnb0, fma(x0, c, -(x1 * sn)));
    st_d(db + ib * dnb0, fma(x0, sn, x1 * c));
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

/// Flash attention, one workgroup per (query, head), online softmax over
/// tiles of FA_WG keys. k/v share `kv` type; mask optional.
pub fn flash_attn(kv: DType, mask: Option<DType>, subgroups: bool) -> String {
    let mut s = params_decl(5) + COMMON;
    s += &input(0, "q", DType::F32);
    s += &input(1, "k", kv);
    s += &input(2, "v", kv);
    s += &input(3, "m", mask.unwrap_or(DType::F32));
    s += &output(4, "d", DType::F32);
    s += &format!(
        "var<workgroup> qs: array<f32, {FA_MAX_D}>;\nvar<workgroup> ps: array<f32, {FA_WG}>;\n"
    );
    s += &reductions(FA_WG, subgroups);
    s += &entry(FA_WG, subgroups);
    let mask_term = if mask.is_some() {
        "sc += ld_m(mb + j);"
    } else {
        ""
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
    for (var d = lid; d < D; d += WGu) { qs[d] = ld_q(qb + d); }
    workgroupBarrier();
    var o = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    var mrun = neg_inf();
    var lrun = 0.0;
    for (var j0 = 0u; j0 < n_kv; j0 += WGu) {
        let j = j0 + lid;
        var sc = neg_inf();
        if (j < n_kv) {
            var acc = 0.0;
            let kr = kb + j * knb1;
            for (var d = 0u; d < D; d++) { acc += qs[d] * ld_k(kr + d); }
            sc = acc * scale;
            if (softcap > 0.0) { sc = softcap * tanh(clamp(sc, -15.0, 15.0)); }
            MASK
        }
        let mnew = max(mrun, wg_max(sc, lid, SGS));
        // Everything masked so far: keep zeros instead of exp(-inf - -inf) = NaN.
        let dead = mnew <= -3.0e38;
        let alpha = select(exp(mrun - mnew), 1.0, dead);
        let p = select(exp(sc - mnew), 0.0, dead);
        ps[lid] = p;
        lrun = lrun * alpha + wg_sum(p, lid, SGS); // its barrier also publishes ps
        mrun = mnew;
        let jn = min(WGu, n_kv - j0);
        for (var i = 0u; i < 4u; i++) {
            let d = lid + WGu * i;
            if (d < D) {
                var acc = o[i] * alpha;
                for (var jj = 0u; jj < jn; jj++) { acc += ps[jj] * ld_v(vb + (j0 + jj) * vnb1 + d); }
                o[i] = acc;
            }
        }
        workgroupBarrier();
    }
    let inv = select(1.0 / lrun, 0.0, lrun == 0.0);
    for (var i = 0u; i < 4u; i++) {
        let d = lid + WGu * i;
        if (d < D) { st_d(pu(18u) + d + h * pu(19u) + iq * pu(20u), o[i] * inv); }
    }
}
"#
    .replace("MASK", mask_term)
    .replace("WGu", &format!("{FA_WG}u"))
    .replace("SGS", sgs_arg(subgroups));
    s
}

/// Rounds activations as ggml-cpu's `vec_dot_type` conversion does before a matrix product
/// (mode 0: to f16; 1: Q8_0/Q8_1 blocks of 32, ggml's AVX2 quantizer; 2: Q8_K blocks of 256),
/// writing the values the CPU's integer dot products see, `d * q`, as f32. One invocation per
/// block; rows are whole blocks.
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
            st_d(db + i0 * d0, quantizeToF16(ld_s(sb + i0 * s0)));
        }
        return;
    }
    if (mode == 1u) {
        var amax = 0.0;
        for (var j = 0u; j < bs; j++) {
            let a = abs(ld_s(sb + (first + j) * s0));
            amax = select(a, amax, amax > a);
        }
        let dq = quantizeToF16(amax / 127.0);
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
