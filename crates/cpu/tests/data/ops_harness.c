// Test-vector generator for the graph ops that MoE and other architectures need (built against
// llama.cpp's ggml by gen_ops_vectors.sh; not part of the Rust build). Each record is one ggml
// graph computed on the CPU backend: its name says the op and the parameters, its arrays are
// the inputs followed by the output(s), as raw bytes. Format (after the magic "LXV1"):
//   u32 name_len, name, u32 n_arrays, { u32 len, bytes }*
#include "ggml.h"
#include "ggml-cpu.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static FILE *out;
static uint64_t rng = 0x13198A2E03707344ull;
static float frand(void) { // uniform in [-1, 1)
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (float)((rng * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}
static int irand(int n) { // uniform in [0, n)
    int v = (int)((frand() + 1.0f) * 0.5f * (float)n);
    return v >= n ? n - 1 : v;
}
static void rec_begin(const char *name, uint32_t n) {
    uint32_t l = (uint32_t)strlen(name);
    fwrite(&l, 4, 1, out); fwrite(name, 1, l, out); fwrite(&n, 4, 1, out);
}
static void arr(const void *p, size_t len) {
    uint32_t l = (uint32_t)len; fwrite(&l, 4, 1, out); fwrite(p, 1, len, out);
}
static void tarr(const struct ggml_tensor *t) { arr(t->data, ggml_nbytes(t)); }
static void fill(float *x, int n, float scale) { for (int i = 0; i < n; i++) x[i] = frand() * scale; }

static struct ggml_context *new_ctx(void) {
    struct ggml_init_params p = { 256 * 1024 * 1024, NULL, false };
    return ggml_init(p);
}
static void run(struct ggml_context *ctx, struct ggml_tensor *t) {
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, t);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
}
static struct ggml_tensor *rand_t(struct ggml_context *ctx, int ne0, int ne1, int ne2, float scale) {
    struct ggml_tensor *t = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, ne0, ne1, ne2);
    fill((float *)t->data, ne0 * ne1 * ne2, scale); return t;
}

// Values every unary op sees besides random ones: zeros, the softplus threshold, exp's
// overflow and underflow, infinities and a NaN.
static const float specials[] = { 0.0f, -0.0f, 20.0f, 20.000002f, 19.999998f, 88.8f, -88.8f, 104.0f,
                                  -104.0f, 1e-30f, -1e-30f, 10.0f, -10.0f, 3.5f, INFINITY, -INFINITY, NAN };

// unary:<op>:<ne0>   a, out
static void unary_cases(int ne0, int ne1, float scale) {
    const char *nm[] = { "sigmoid", "softplus", "tanh", "relu", "sqr", "sqrt", "exp", "gelu_erf", "clamp" };
    for (int i = 0; i < 9; i++) {
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *a = rand_t(ctx, ne0, ne1, 1, scale);
        float *ad = (float *)a->data;
        int ns = (int)(sizeof specials / sizeof specials[0]);
        for (int j = 0; j < ns && j < ne0 * ne1; j++) ad[j * 7 % (ne0 * ne1)] = specials[j];
        struct ggml_tensor *r;
        switch (i) {
            case 0: r = ggml_sigmoid(ctx, a); break;
            case 1: r = ggml_softplus(ctx, a); break;
            case 2: r = ggml_tanh(ctx, a); break;
            case 3: r = ggml_relu(ctx, a); break;
            case 4: r = ggml_sqr(ctx, a); break;
            case 5: r = ggml_sqrt(ctx, a); break;
            case 6: r = ggml_exp(ctx, a); break;
            case 7: r = ggml_gelu_erf(ctx, a); break;
            default: r = ggml_clamp(ctx, a, -2.5f, 6.103515625e-5f); break;
        }
        run(ctx, r);
        char name[64]; snprintf(name, sizeof name, "unary:%s:%d:%d", nm[i], ne0, ne1);
        rec_begin(name, 2); tarr(a); tarr(r);
        ggml_free(ctx);
    }
}

// glu:<op>:<ne0>   a, b, out (split forms; swiglu_oai with alpha 1.702, limit 7; swiglu_clamp 7)
static void glu_cases(int ne0, int ne1) {
    const char *nm[] = { "reglu", "geglu_erf", "swiglu_oai", "swiglu_clamp" };
    for (int i = 0; i < 4; i++) {
        struct ggml_context *ctx = new_ctx();
        struct ggml_tensor *a = rand_t(ctx, ne0, ne1, 1, 10.0f), *b = rand_t(ctx, ne0, ne1, 1, 10.0f);
        struct ggml_tensor *r;
        switch (i) {
            case 0: r = ggml_reglu_split(ctx, a, b); break;
            case 1: r = ggml_geglu_erf_split(ctx, a, b); break;
            case 2: r = ggml_swiglu_oai(ctx, a, b, 1.702f, 7.0f); break;
            default: r = ggml_swiglu_clamp(ctx, a, b, 7.0f); break;
        }
        run(ctx, r);
        char name[64]; snprintf(name, sizeof name, "glu:%s:%d:%d", nm[i], ne0, ne1);
        rec_begin(name, 3); tarr(a); tarr(b); tarr(r);
        ggml_free(ctx);
    }
}

// softmax_sinks:<nkv>:<nq>:<nh>:<masked>   a, mask (or empty), sinks, out
static void softmax_sinks_case(int nkv, int nq, int nh, int masked, float sink_scale) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = rand_t(ctx, nkv, nq, nh, 30.0f);
    struct ggml_tensor *m = NULL;
    if (masked) {
        m = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, nkv, nq);
        for (int j = 0; j < nq; j++) for (int i = 0; i < nkv; i++)
            ((float *)m->data)[j * nkv + i] = (i > j + nkv - nq) ? -INFINITY : 0.0f;
    }
    struct ggml_tensor *s = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, nh);
    fill((float *)s->data, nh, sink_scale);
    struct ggml_tensor *r = ggml_soft_max_ext(ctx, a, m, 0.125f, 0.0f);
    ggml_soft_max_add_sinks(r, s);
    run(ctx, r);
    char name[64]; snprintf(name, sizeof name, "softmax_sinks:%d:%d:%d:%d", nkv, nq, nh, masked);
    rec_begin(name, 4); tarr(a);
    if (m) tarr(m); else arr(NULL, 0);
    tarr(s); tarr(r);
    ggml_free(ctx);
}

// argsort:<ne0>:<ne1>:<levels>   a, asc, desc, top_k(k) (raw ggml order), argsort_top_k(k) (cont)
static void argsort_case(int ne0, int ne1, int levels, int k) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = rand_t(ctx, ne0, ne1, 1, 1.0f);
    float *ad = (float *)a->data;
    if (levels > 0) for (int i = 0; i < ne0 * ne1; i++) ad[i] = (float)irand(levels) * 0.25f - 1.0f;
    struct ggml_tensor *asc = ggml_argsort(ctx, a, GGML_SORT_ORDER_ASC);
    struct ggml_tensor *desc = ggml_argsort(ctx, a, GGML_SORT_ORDER_DESC);
    struct ggml_tensor *tk = ggml_top_k(ctx, a, k);
    struct ggml_tensor *atk = ggml_cont(ctx, ggml_argsort_top_k(ctx, a, k));
    run(ctx, asc); run(ctx, desc); run(ctx, tk); run(ctx, atk);
    char name[64]; snprintf(name, sizeof name, "argsort:%d:%d:%d:%d", ne0, ne1, levels, k);
    rec_begin(name, 5); tarr(a); tarr(asc); tarr(desc); tarr(tk); tarr(atk);
    ggml_free(ctx);
}

// moe_route:<n_expert>:<n_used>:<n_tok>   logits, exp_probs_b, then the outputs: probs (softmax),
// selected (argsort_top_k of probs + bias, cont), weights (get_rows of the 3D probs), normalized
// weights (sum_rows, clamp, div), experts*weights (mul with ne0 == 1 broadcast) and add_id
static void moe_route_case(int n_expert, int n_used, int n_tok, int n_embd) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *logits = rand_t(ctx, n_expert, n_tok, 1, 3.0f);
    // a few exact ties between experts
    for (int t = 0; t < n_tok; t += 2) ((float *)logits->data)[t * n_expert + 1] = ((float *)logits->data)[t * n_expert];
    struct ggml_tensor *bias = rand_t(ctx, n_expert, 1, 1, 0.01f);
    struct ggml_tensor *probs = ggml_soft_max(ctx, logits);
    struct ggml_tensor *sel_probs = ggml_add(ctx, probs, bias);
    struct ggml_tensor *selected = ggml_argsort_top_k(ctx, sel_probs, n_used);
    struct ggml_tensor *p3 = ggml_reshape_3d(ctx, probs, 1, n_expert, n_tok);
    struct ggml_tensor *weights = ggml_get_rows(ctx, p3, selected);
    struct ggml_tensor *w2 = ggml_reshape_2d(ctx, weights, n_used, n_tok);
    struct ggml_tensor *wsum = ggml_sum_rows(ctx, w2);
    wsum = ggml_clamp(ctx, wsum, 6.103515625e-5f, INFINITY);
    struct ggml_tensor *wn = ggml_div(ctx, w2, wsum);
    struct ggml_tensor *wn3 = ggml_reshape_3d(ctx, wn, 1, n_used, n_tok);
    struct ggml_tensor *experts = rand_t(ctx, n_embd, n_used, n_tok, 2.0f);
    struct ggml_tensor *weighted = ggml_mul(ctx, experts, wn3);
    struct ggml_tensor *ebias = rand_t(ctx, n_embd, n_expert, 1, 1.0f);
    struct ggml_tensor *biased = ggml_add_id(ctx, experts, ebias, selected);
    struct ggml_tensor *selc = ggml_cont(ctx, selected);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, selc);
    ggml_build_forward_expand(gf, weighted);
    ggml_build_forward_expand(gf, biased);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    char name[64]; snprintf(name, sizeof name, "moe_route:%d:%d:%d:%d", n_expert, n_used, n_tok, n_embd);
    rec_begin(name, 10);
    tarr(logits); tarr(bias); tarr(experts); tarr(ebias);
    tarr(probs); tarr(selc); tarr(weights); tarr(wn); tarr(weighted); tarr(biased);
    ggml_free(ctx);
}

// moe_groups:<n_expert>:<n_groups>:<n_group_used>:<n_used>:<n_tok>   logits, exp_probs_b, then
// masked selection probabilities, selected experts (cont) and weights: DeepSeek-V3 routing
// (sigmoid gating, selection bias, top groups by the sum of their best two, the other groups
// masked with fill + set_rows), as build_moe_ffn builds it
static void moe_groups_case(int n_expert, int n_groups, int n_group_used, int n_used, int n_tok) {
    struct ggml_context *ctx = new_ctx();
    const int epg = n_expert / n_groups;
    struct ggml_tensor *logits = rand_t(ctx, n_expert, n_tok, 1, 3.0f);
    struct ggml_tensor *bias = rand_t(ctx, n_expert, 1, 1, 0.1f);
    struct ggml_tensor *probs = ggml_sigmoid(ctx, logits);
    struct ggml_tensor *sel = ggml_add(ctx, probs, bias);
    struct ggml_tensor *groups = ggml_reshape_3d(ctx, sel, epg, n_groups, n_tok);
    struct ggml_tensor *gs = ggml_argsort_top_k(ctx, groups, 2);
    gs = ggml_get_rows(ctx, ggml_reshape_4d(ctx, groups, 1, groups->ne[0], groups->ne[1], groups->ne[2]), gs);
    gs = ggml_sum_rows(ctx, ggml_reshape_3d(ctx, gs, gs->ne[1], gs->ne[2], gs->ne[3]));
    gs = ggml_reshape_2d(ctx, gs, gs->ne[1], gs->ne[2]);
    struct ggml_tensor *eg = ggml_argsort_top_k(ctx, gs, n_group_used);
    struct ggml_tensor *sp = ggml_get_rows(ctx, groups, eg);
    sp = ggml_set_rows(ctx, ggml_fill(ctx, groups, -INFINITY), sp, eg);
    sp = ggml_reshape_2d(ctx, sp, n_expert, n_tok);
    struct ggml_tensor *selected = ggml_argsort_top_k(ctx, sp, n_used);
    struct ggml_tensor *weights = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, n_expert, n_tok), selected);
    struct ggml_tensor *spc = ggml_cont(ctx, sp);
    struct ggml_tensor *selc = ggml_cont(ctx, selected);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, spc);
    ggml_build_forward_expand(gf, selc);
    ggml_build_forward_expand(gf, weights);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    char name[64]; snprintf(name, sizeof name, "moe_groups:%d:%d:%d:%d:%d", n_expert, n_groups, n_group_used, n_used, n_tok);
    rec_begin(name, 5); tarr(logits); tarr(bias); tarr(spc); tarr(selc); tarr(weights);
    ggml_free(ctx);
}

// rope_offs:<mode>:<head>:<n_dims>:<n_offs>   a, pos, out (ggml_rope_set_offset)
static void rope_offs_case(int mode, int head, int n_dims, int n_offs, int n_head, int n_tok) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = rand_t(ctx, head, n_head, n_tok, 3.0f);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tok);
    for (int i = 0; i < n_tok; i++) ((int32_t *)pos->data)[i] = i * 7 + (i > 2 ? 100 : 0);
    struct ggml_tensor *r = ggml_rope_ext(ctx, a, pos, NULL, n_dims, mode, 4096, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    ggml_rope_set_offset(r, n_offs);
    run(ctx, r);
    char name[64]; snprintf(name, sizeof name, "rope_offs:%d:%d:%d:%d:%d:%d", mode, head, n_dims, n_offs, n_head, n_tok);
    rec_begin(name, 3); tarr(a); tarr(pos); tarr(r);
    ggml_free(ctx);
}

// misc: div with views, sum_rows, repeat_4d, fill
static void misc_cases(void) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = rand_t(ctx, 13, 6, 3, 5.0f);
    struct ggml_tensor *b = rand_t(ctx, 13, 1, 3, 2.0f);
    struct ggml_tensor *c = rand_t(ctx, 1, 6, 1, 2.0f);
    struct ggml_tensor *d1 = ggml_div(ctx, a, b);
    struct ggml_tensor *d2 = ggml_div(ctx, a, c);
    struct ggml_tensor *sr = ggml_sum_rows(ctx, a);
    struct ggml_tensor *k = rand_t(ctx, 7, 1, 4, 1.0f);
    struct ggml_tensor *rp = ggml_repeat_4d(ctx, k, 14, 3, 4, 1);
    struct ggml_tensor *fl = ggml_fill(ctx, a, -INFINITY);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, d1); ggml_build_forward_expand(gf, d2);
    ggml_build_forward_expand(gf, sr); ggml_build_forward_expand(gf, rp);
    ggml_build_forward_expand(gf, fl);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
    rec_begin("misc", 9);
    tarr(a); tarr(b); tarr(c); tarr(k); tarr(d1); tarr(d2); tarr(sr); tarr(rp); tarr(fl);
    ggml_free(ctx);
}

static ggml_backend_buffer_type_t repack_buft(ggml_backend_t be) {
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t *b = get_extra(dev); b && *b; b++)
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) return *b;
    fprintf(stderr, "no CPU_REPACK\n"); exit(1);
}

// mmid:<type>:<k>:<m>:<n_expert>:<n_used>:<n_b1>:<n_tok>:<repack>   weights, x, ids, out
// The weights go to the CPU_REPACK buffer when llama.cpp would put them there (Q4_0, IQ4_NL,
// Q4_K and MXFP4 with a multiple of 8 rows), else to a plain CPU buffer.
// Importance weights for ggml_quantize_chunk (one per column, no RNG draws): NULL unless a
// case turns them on (the grid i-quants, which ggml quantizes only with an imatrix).
static int use_imatrix = 0;
static float imat_buf[4096];
static const float *imat(int k) {
    if (!use_imatrix) return NULL;
    for (int i = 0; i < k; i++) imat_buf[i] = 0.25f + (float)((i * 37) % 101) / 40.0f;
    return imat_buf;
}

static void mmid_case(enum ggml_type t, int k, int m, int n_expert, int n_used, int n_b1, int n_tok, int skew) {
    const int repack = (t == GGML_TYPE_Q4_0 || t == GGML_TYPE_IQ4_NL || t == GGML_TYPE_Q4_K ||
                        t == GGML_TYPE_MXFP4) && m % 8 == 0 && n_expert > 1;
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 2);
    struct ggml_init_params p = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *cw = ggml_init(p), *cx = ggml_init(p);
    struct ggml_tensor *w = ggml_new_tensor_3d(cw, t, k, m, n_expert);
    struct ggml_tensor *x = ggml_new_tensor_3d(cx, GGML_TYPE_F32, k, n_b1, n_tok);
    struct ggml_tensor *ids = ggml_new_tensor_2d(cx, GGML_TYPE_I32, n_used, n_tok);
    struct ggml_tensor *r = ggml_mul_mat_id(cx, w, x, ids);
    ggml_backend_buffer_t bw = repack ? ggml_backend_alloc_ctx_tensors_from_buft(cw, repack_buft(be))
                                      : ggml_backend_alloc_ctx_tensors(cw, be);
    ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, be);
    size_t rows = (size_t)m * n_expert;
    float *wf = malloc((size_t)k * rows * 4); fill(wf, (int)(k * rows), 0.1f);
    size_t wsz = ggml_row_size(t, k) * rows; void *wq = malloc(wsz);
    ggml_quantize_chunk(t, wf, wq, 0, rows, k, imat(k));
    ggml_backend_tensor_set(w, wq, 0, wsz);
    size_t xn = (size_t)k * n_b1 * n_tok;
    float *xf = malloc(xn * 4); fill(xf, (int)xn, 1.0f);
    ggml_backend_tensor_set(x, xf, 0, xn * 4);
    int32_t *id = malloc((size_t)n_used * n_tok * 4);
    // Distinct experts per token, as top-k routing gives (the repacked mul_mat_id sizes its
    // row lists for that); the last expert is never used; `skew` puts expert 0 first in every
    // token, so it gets enough rows for the tiled kernels.
    for (int t = 0; t < n_tok; t++) {
        int perm[64];
        for (int e = 0; e < n_expert - 1; e++) perm[e] = e;
        for (int e = n_expert - 2; e > 0; e--) { int j = irand(e + 1); int tmp = perm[e]; perm[e] = perm[j]; perm[j] = tmp; }
        if (skew) for (int e = 0; e < n_expert - 1; e++) if (perm[e] == 0) { perm[e] = perm[0]; perm[0] = 0; }
        for (int u = 0; u < n_used; u++) id[t * n_used + u] = perm[u];
    }
    ggml_backend_tensor_set(ids, id, 0, (size_t)n_used * n_tok * 4);
    struct ggml_cgraph *gf = ggml_new_graph(cx);
    ggml_build_forward_expand(gf, r);
    ggml_backend_graph_compute(be, gf);
    size_t rn = (size_t)m * n_used * n_tok;
    float *rf = malloc(rn * 4);
    ggml_backend_tensor_get(r, rf, 0, rn * 4);
    char name[96];
    snprintf(name, sizeof name, "mmid:%s:%d:%d:%d:%d:%d:%d:%d", ggml_type_name(t), k, m, n_expert, n_used, n_b1, n_tok, repack);
    rec_begin(name, 4); arr(wq, wsz); arr(xf, xn * 4); arr(id, (size_t)n_used * n_tok * 4); arr(rf, rn * 4);
    free(wf); free(wq); free(xf); free(id); free(rf);
    ggml_backend_buffer_free(bw); ggml_backend_buffer_free(bx); ggml_free(cw); ggml_free(cx); ggml_backend_free(be);
}

// moe_ffn:<gate type>:<expert type>:<n_embd>:<n_ff>:<n_expert>:<n_used>:<n_tok>   x, gate_inp,
// up_exps, gate_exps, down_exps, then logits, selected (cont), experts (down, weighted) and the
// output: build_moe_ffn with softmax gating, norm_w, SwiGLU, the weighted expert outputs summed
// through strided views. Expert weights sit in the CPU_REPACK buffer when llama.cpp puts them
// there.
static void moe_ffn_case(enum ggml_type gt, enum ggml_type et, int n_embd, int n_ff, int n_expert, int n_used, int n_tok) {
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 2);
    struct ggml_init_params p = { 64 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *cg = ggml_init(p), *ce = ggml_init(p), *cx = ggml_init(p);
    struct ggml_tensor *gate_inp = ggml_new_tensor_2d(cg, gt, n_embd, n_expert);
    struct ggml_tensor *up_e = ggml_new_tensor_3d(ce, et, n_embd, n_ff, n_expert);
    struct ggml_tensor *gate_e = ggml_new_tensor_3d(ce, et, n_embd, n_ff, n_expert);
    struct ggml_tensor *down_e = ggml_new_tensor_3d(ce, et, n_ff, n_embd, n_expert);
    struct ggml_tensor *x = ggml_new_tensor_2d(cx, GGML_TYPE_F32, n_embd, n_tok);
    struct ggml_tensor *logits = ggml_mul_mat(cx, gate_inp, x);
    struct ggml_tensor *probs = ggml_soft_max(cx, logits);
    struct ggml_tensor *selected = ggml_argsort_top_k(cx, probs, n_used);
    struct ggml_tensor *weights = ggml_get_rows(cx, ggml_reshape_3d(cx, probs, 1, n_expert, n_tok), selected);
    struct ggml_tensor *w2 = ggml_reshape_2d(cx, weights, n_used, n_tok);
    struct ggml_tensor *wsum = ggml_clamp(cx, ggml_sum_rows(cx, w2), 6.103515625e-5f, INFINITY);
    w2 = ggml_div(cx, w2, wsum);
    weights = ggml_reshape_3d(cx, w2, 1, n_used, n_tok);
    struct ggml_tensor *cur = ggml_reshape_3d(cx, x, n_embd, 1, n_tok);
    struct ggml_tensor *up = ggml_mul_mat_id(cx, up_e, cur, selected);
    struct ggml_tensor *gate = ggml_mul_mat_id(cx, gate_e, cur, selected);
    struct ggml_tensor *act = ggml_swiglu_split(cx, gate, up);
    struct ggml_tensor *experts = ggml_mul_mat_id(cx, down_e, act, selected);
    experts = ggml_mul(cx, experts, weights);
    struct ggml_tensor *moe_out = ggml_view_2d(cx, experts, n_embd, n_tok, experts->nb[2], 0);
    for (int i = 1; i < n_used; i++)
        moe_out = ggml_add(cx, moe_out, ggml_view_2d(cx, experts, n_embd, n_tok, experts->nb[2], i * experts->nb[1]));
    if (n_used == 1) moe_out = ggml_cont(cx, moe_out);
    struct ggml_tensor *selc = ggml_cont(cx, selected);
    const int repack = (et == GGML_TYPE_Q4_0 || et == GGML_TYPE_IQ4_NL || et == GGML_TYPE_Q4_K ||
                        et == GGML_TYPE_MXFP4) &&
                       n_ff % 8 == 0 && n_embd % 8 == 0;
    ggml_backend_buffer_t bg = ggml_backend_alloc_ctx_tensors(cg, be);
    ggml_backend_buffer_t bw = repack ? ggml_backend_alloc_ctx_tensors_from_buft(ce, repack_buft(be))
                                      : ggml_backend_alloc_ctx_tensors(ce, be);
    ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, be);
    struct ggml_tensor *ws[4] = { gate_inp, up_e, gate_e, down_e };
    void *wq[4]; size_t wsz[4];
    for (int i = 0; i < 4; i++) {
        size_t rows = (size_t)ggml_nrows(ws[i]);
        int k = (int)ws[i]->ne[0];
        float *wf = malloc((size_t)k * rows * 4); fill(wf, (int)(k * rows), i == 0 ? 1.0f : 0.2f);
        wsz[i] = ggml_row_size(ws[i]->type, k) * rows; wq[i] = malloc(wsz[i]);
        ggml_quantize_chunk(ws[i]->type, wf, wq[i], 0, rows, k, NULL);
        ggml_backend_tensor_set(ws[i], wq[i], 0, wsz[i]);
        free(wf);
    }
    size_t xn = (size_t)n_embd * n_tok;
    float *xf = malloc(xn * 4); fill(xf, (int)xn, 1.0f);
    ggml_backend_tensor_set(x, xf, 0, xn * 4);
    struct ggml_cgraph *gf = ggml_new_graph(cx);
    ggml_build_forward_expand(gf, selc);
    ggml_build_forward_expand(gf, moe_out);
    ggml_backend_graph_compute(be, gf);
    char name[96];
    snprintf(name, sizeof name, "moe_ffn:%s:%s:%d:%d:%d:%d:%d", ggml_type_name(gt), ggml_type_name(et), n_embd, n_ff, n_expert, n_used, n_tok);
    rec_begin(name, 9);
    arr(xf, xn * 4);
    for (int i = 0; i < 4; i++) arr(wq[i], wsz[i]);
    struct ggml_tensor *outs[4] = { logits, selc, experts, moe_out };
    for (int i = 0; i < 4; i++) {
        size_t n = ggml_nbytes(outs[i]); void *buf = malloc(n);
        ggml_backend_tensor_get(outs[i], buf, 0, n);
        arr(buf, n); free(buf);
    }
    for (int i = 0; i < 4; i++) free(wq[i]);
    free(xf);
    ggml_backend_buffer_free(bg); ggml_backend_buffer_free(bw); ggml_backend_buffer_free(bx);
    ggml_free(cg); ggml_free(ce); ggml_free(cx); ggml_backend_free(be);
}

// quant:<type>:<n>   x, quantized (ggml_quantize_chunk), dequantized (to_float)
static void quant_case(enum ggml_type t, int n, float scale) {
    float *x = malloc((size_t)n * 4); fill(x, n, scale);
    if (n >= 64) { for (int i = 32; i < 64; i++) x[i] = 0.0f; x[40] = 1e-30f; }
    size_t rs = ggml_row_size(t, n); void *q = malloc(rs);
    ggml_quantize_chunk(t, x, q, 0, 1, n, NULL);
    float *back = malloc((size_t)n * 4);
    ggml_get_type_traits(t)->to_float(q, back, n);
    char name[64]; snprintf(name, sizeof name, "quant:%s:%d", ggml_type_name(t), n);
    rec_begin(name, 3); arr(x, (size_t)n * 4); arr(q, rs); arr(back, (size_t)n * 4);
    free(x); free(q); free(back);
}

// quantw:<type>:<n>   x, imatrix, quantized bytes, dequantized (ggml_quantize_chunk with
// importance weights)
static void quantw_case(enum ggml_type t, int n, float scale) {
    float *x = malloc((size_t)n * 4); fill(x, n, scale);
    if (n >= 64) { for (int i = 32; i < 64; i++) x[i] = 0.0f; x[40] = 1e-30f; }
    const float *w = imat(n);
    size_t rs = ggml_row_size(t, n); void *q = malloc(rs);
    ggml_quantize_chunk(t, x, q, 0, 1, n, w);
    float *back = malloc((size_t)n * 4);
    ggml_get_type_traits(t)->to_float(q, back, n);
    char name[64]; snprintf(name, sizeof name, "quantw:%s:%d", ggml_type_name(t), n);
    rec_begin(name, 4); arr(x, (size_t)n * 4); arr(w, (size_t)n * 4); arr(q, rs); arr(back, (size_t)n * 4);
    free(x); free(q); free(back);
}

// mulmat:<type>:<m>:<n>:<k>:<repack>   weights, x, out (2-D weights in the CPU_REPACK buffer when
// llama.cpp puts them there)
static void mulmat_case(enum ggml_type t, int m, int n, int k) {
    const int repack = t == GGML_TYPE_MXFP4 && m % 8 == 0;
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 2);
    struct ggml_init_params p = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *cw = ggml_init(p), *cx = ggml_init(p);
    struct ggml_tensor *w = ggml_new_tensor_2d(cw, t, k, m);
    struct ggml_tensor *x = ggml_new_tensor_2d(cx, GGML_TYPE_F32, k, n);
    struct ggml_tensor *r = ggml_mul_mat(cx, w, x);
    ggml_backend_buffer_t bw = repack ? ggml_backend_alloc_ctx_tensors_from_buft(cw, repack_buft(be))
                                      : ggml_backend_alloc_ctx_tensors(cw, be);
    ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, be);
    float *wf = malloc((size_t)k * m * 4); fill(wf, k * m, 0.1f);
    size_t wsz = ggml_row_size(t, k) * m; void *wq = malloc(wsz);
    ggml_quantize_chunk(t, wf, wq, 0, m, k, imat(k));
    ggml_backend_tensor_set(w, wq, 0, wsz);
    float *xf = malloc((size_t)k * n * 4); fill(xf, k * n, 1.0f);
    ggml_backend_tensor_set(x, xf, 0, (size_t)k * n * 4);
    struct ggml_cgraph *gf = ggml_new_graph(cx);
    ggml_build_forward_expand(gf, r);
    ggml_backend_graph_compute(be, gf);
    float *rf = malloc((size_t)m * n * 4);
    ggml_backend_tensor_get(r, rf, 0, (size_t)m * n * 4);
    char name[64]; snprintf(name, sizeof name, "mulmat:%s:%d:%d:%d:%d", ggml_type_name(t), m, n, k, repack);
    rec_begin(name, 3); arr(wq, wsz); arr(xf, (size_t)k * n * 4); arr(rf, (size_t)m * n * 4);
    free(wf); free(wq); free(xf); free(rf);
    ggml_backend_buffer_free(bw); ggml_backend_buffer_free(bx); ggml_free(cw); ggml_free(cx); ggml_backend_free(be);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    out = fopen(argv[1], "wb");
    fwrite("LXV1", 1, 4, out);
    ggml_cpu_init();
    unary_cases(37, 3, 12.0f); unary_cases(64, 2, 40.0f); unary_cases(5, 1, 1.0f);
    glu_cases(37, 3); glu_cases(64, 2);
    softmax_sinks_case(5, 5, 3, 1, 3.0f); softmax_sinks_case(37, 9, 2, 1, 3.0f);
    softmax_sinks_case(64, 4, 4, 0, 3.0f); softmax_sinks_case(16, 2, 2, 1, 400.0f);
    argsort_case(5, 3, 0, 2); argsort_case(16, 4, 3, 4); argsort_case(17, 4, 4, 8); argsort_case(33, 3, 2, 8);
    argsort_case(64, 2, 5, 8); argsort_case(100, 3, 0, 6); argsort_case(257, 2, 7, 8); argsort_case(1000, 1, 3, 16);
    argsort_case(128, 2, 1, 128);
    moe_route_case(8, 2, 5, 16); moe_route_case(60, 4, 7, 8); moe_route_case(32, 8, 3, 4);
    misc_cases();
    moe_groups_case(16, 4, 2, 4, 5); moe_groups_case(64, 8, 4, 8, 3); moe_groups_case(12, 3, 1, 2, 2);
    rope_offs_case(0, 24, 8, 16, 2, 5); rope_offs_case(2, 24, 8, 16, 2, 5); rope_offs_case(2, 32, 16, 6, 3, 4);
    rope_offs_case(0, 20, 10, 4, 1, 3);
    enum ggml_type ts[] = { GGML_TYPE_F32, GGML_TYPE_F16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0,
                            GGML_TYPE_Q8_0, GGML_TYPE_IQ4_NL, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K,
                            GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4 };
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        int k = ggml_blck_size(ts[i]) == 256 ? 256 : 64;
        mmid_case(ts[i], k, 16, 4, 2, 1, 1, 0);   // decode-like, broadcast b
        mmid_case(ts[i], k, 8, 5, 3, 3, 4, 0);    // b per used expert
        mmid_case(ts[i], k, 12, 3, 2, 2, 13, 1);  // expert 0 gets >= 8 rows; m % 8 != 0
        mmid_case(ts[i], k == 256 ? 256 : 128, 16, 5, 4, 1, 9, 1);
    }
    quant_case(GGML_TYPE_MXFP4, 32 * 9, 0.01f); quant_case(GGML_TYPE_MXFP4, 32 * 9, 1.0f);
    quant_case(GGML_TYPE_MXFP4, 32 * 9, 40.0f); quant_case(GGML_TYPE_MXFP4, 32, 3.0f);
    mulmat_case(GGML_TYPE_MXFP4, 16, 1, 96); mulmat_case(GGML_TYPE_MXFP4, 16, 5, 96);
    mulmat_case(GGML_TYPE_MXFP4, 8, 8, 64); mulmat_case(GGML_TYPE_MXFP4, 12, 3, 96);
    mulmat_case(GGML_TYPE_MXFP4, 6, 1, 160);
    moe_ffn_case(GGML_TYPE_F32, GGML_TYPE_Q4_K, 256, 256, 2, 1, 11);
    moe_ffn_case(GGML_TYPE_Q8_0, GGML_TYPE_Q4_0, 64, 32, 8, 2, 12);
    moe_ffn_case(GGML_TYPE_F16, GGML_TYPE_Q8_0, 64, 64, 4, 3, 4);
    moe_ffn_case(GGML_TYPE_F32, GGML_TYPE_Q5_0, 32, 64, 4, 2, 1);
    moe_ffn_case(GGML_TYPE_F32, GGML_TYPE_MXFP4, 64, 32, 8, 4, 6);
    // The types newer than the cases above (appended, so the records before keep their bytes):
    // reference quantizer and dequantizer, 2-D products (ggml_vec_dot_* per output on x86) and
    // mul_mat_id experts.
    enum ggml_type nts[] = { GGML_TYPE_TQ1_0, GGML_TYPE_TQ2_0, GGML_TYPE_NVFP4, GGML_TYPE_Q1_0,
                             GGML_TYPE_Q2_0 };
    for (size_t i = 0; i < sizeof nts / sizeof nts[0]; i++) {
        const int b = (int)ggml_blck_size(nts[i]), k = b >= 128 ? b : 2 * b;
        quant_case(nts[i], 3 * k, 1.0f); quant_case(nts[i], k, 0.01f);
        mulmat_case(nts[i], 16, 1, k); mulmat_case(nts[i], 8, 5, 2 * k);
        mulmat_case(nts[i], 12, 9, k); mulmat_case(nts[i], 7, 3, 3 * k);
        mmid_case(nts[i], k, 16, 4, 2, 1, 1, 0);
        mmid_case(nts[i], 2 * k, 12, 3, 2, 2, 13, 1);
    }
    // The grid i-quants (appended likewise), quantized with importance weights.
    enum ggml_type its[] = { GGML_TYPE_IQ2_XXS, GGML_TYPE_IQ2_XS, GGML_TYPE_IQ2_S, GGML_TYPE_IQ3_XXS,
                             GGML_TYPE_IQ3_S, GGML_TYPE_IQ1_S, GGML_TYPE_IQ1_M };
    use_imatrix = 1;
    for (size_t i = 0; i < sizeof its / sizeof its[0]; i++) {
        quantw_case(its[i], 3 * 256, 1.0f); quantw_case(its[i], 256, 0.01f);
        mulmat_case(its[i], 16, 1, 256); mulmat_case(its[i], 8, 5, 512);
        mulmat_case(its[i], 12, 9, 256);
        mmid_case(its[i], 256, 16, 4, 2, 1, 1, 0);
        mmid_case(its[i], 512, 12, 3, 2, 2, 13, 1);
    }
    use_imatrix = 0;
    fclose(out);
    return 0;
}
