// Test-vector generator for lamina-cpu's `kernels` (built against llama.cpp's ggml by
// gen_exact_vectors.sh; not part of the Rust build). Writes records
//   u32 name_len, name, u32 n_arrays, { u32 len, bytes }*
// after the magic "LXV1" to the file named by argv[1].
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
static uint64_t rng = 0x243F6A8885A308D3ull;
static float frand(void) { // uniform in [-1, 1)
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (float)((rng * 0x2545F4914F6CDD1Dull) >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}
static void rec_begin(const char *name, uint32_t n) {
    uint32_t l = (uint32_t)strlen(name);
    fwrite(&l, 4, 1, out); fwrite(name, 1, l, out); fwrite(&n, 4, 1, out);
}
static void arr(const void *p, size_t len) {
    uint32_t l = (uint32_t)len; fwrite(&l, 4, 1, out); fwrite(p, 1, len, out);
}
static void fill(float *x, int n, float scale) { for (int i = 0; i < n; i++) x[i] = frand() * scale; }

static void quant_case(enum ggml_type t, int n, float scale) {
    float *x = malloc(n * sizeof(float)); fill(x, n, scale);
    if (n > 64) { for (int i = 32; i < 64; i++) x[i] = 0.0f; x[64] = 0.5f; }
    size_t rs = ggml_row_size(t, n); void *q = malloc(rs);
    ggml_get_type_traits_cpu(t)->from_float(x, q, n);
    char name[64]; snprintf(name, sizeof name, "quant:%s", ggml_type_name(t));
    rec_begin(name, 2); arr(x, n * 4); arr(q, rs);
    free(x); free(q);
}

static void dot_case(enum ggml_type t, int n) {
    const struct ggml_type_traits_cpu *tr = ggml_get_type_traits_cpu(t);
    enum ggml_type vt = tr->vec_dot_type;
    float *w = malloc(n * 4), *x = malloc(n * 4);
    fill(w, n, 0.1f); fill(x, n, 2.0f);
    size_t wrs = ggml_row_size(t, n), xrs = ggml_row_size(vt, n);
    void *wq = malloc(wrs), *xq = malloc(xrs);
    ggml_quantize_chunk(t, w, wq, 0, 1, n, NULL);
    ggml_get_type_traits_cpu(vt)->from_float(x, xq, n);
    float s = 0; tr->vec_dot(n, &s, 0, wq, 0, xq, 0, 1);
    char name[64]; snprintf(name, sizeof name, "dot:%s", ggml_type_name(t));
    rec_begin(name, 4); arr(wq, wrs); arr(x, n * 4); arr(xq, xrs); arr(&s, 4);
    free(w); free(x); free(wq); free(xq);
}

static struct ggml_context *new_ctx(void) {
    struct ggml_init_params p = { 64 * 1024 * 1024, NULL, false };
    return ggml_init(p);
}
static void run(struct ggml_context *ctx, struct ggml_tensor *t) {
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, t);
    ggml_graph_compute_with_ctx(ctx, gf, 2);
}
static struct ggml_tensor *rand_t(struct ggml_context *ctx, int ne0, int ne1, float scale) {
    struct ggml_tensor *t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ne0, ne1);
    fill((float *)t->data, ne0 * ne1, scale); return t;
}

// unary/glu/norm rows: input(s) and output
static void unary_cases(int ne0, int ne1) {
    char name[64];
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = rand_t(ctx, ne0, ne1, 12.0f), *b = rand_t(ctx, ne0, ne1, 1.0f);
    struct ggml_tensor *r[5] = { ggml_silu(ctx, a), ggml_gelu(ctx, a), ggml_swiglu_split(ctx, a, b),
                                 ggml_geglu_split(ctx, a, b), ggml_rms_norm(ctx, a, 1e-6f) };
    const char *nm[5] = { "silu", "gelu", "swiglu", "geglu", "rms_norm" };
    for (int i = 0; i < 5; i++) {
        run(ctx, r[i]);
        snprintf(name, sizeof name, "%s:%d", nm[i], ne0);
        rec_begin(name, 3); arr(a->data, ggml_nbytes(a)); arr(b->data, ggml_nbytes(b)); arr(r[i]->data, ggml_nbytes(r[i]));
    }
    ggml_free(ctx);
}

static void softmax_case(int nkv, int nq, float scale) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = rand_t(ctx, nkv, nq, 30.0f);
    struct ggml_tensor *m = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, nkv, nq);
    for (int j = 0; j < nq; j++) for (int i = 0; i < nkv; i++)
        ((float *)m->data)[j * nkv + i] = (i > j + nkv - nq) ? -INFINITY : 0.0f;
    struct ggml_tensor *r = ggml_soft_max_ext(ctx, a, m, scale, 0.0f);
    run(ctx, r);
    char name[64]; snprintf(name, sizeof name, "softmax:%d:%g", nkv, scale);
    rec_begin(name, 3); arr(a->data, ggml_nbytes(a)); arr(m->data, ggml_nbytes(m)); arr(r->data, ggml_nbytes(r));
    ggml_free(ctx);
}

static void rope_case(int mode, int head, int n_dims, int n_head, int n_tok, float base) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *a = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head, n_head, n_tok);
    fill((float *)a->data, head * n_head * n_tok, 3.0f);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tok);
    for (int i = 0; i < n_tok; i++) ((int32_t *)pos->data)[i] = i * 7 + (i > 2 ? 100 : 0);
    struct ggml_tensor *r = ggml_rope_ext(ctx, a, pos, NULL, n_dims, mode, 4096, base, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
    run(ctx, r);
    char name[64]; snprintf(name, sizeof name, "rope:%d:%d:%d:%g", mode, head, n_dims, base);
    rec_begin(name, 3); arr(a->data, ggml_nbytes(a)); arr(pos->data, ggml_nbytes(pos)); arr(r->data, ggml_nbytes(r));
    ggml_free(ctx);
}

// mul_mat with f16 weights: m weight rows, n activation rows, k; activations f32
static void mulmat_f16_case(int m, int n, int k) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, k, m);
    for (int i = 0; i < k * m; i++) ((ggml_fp16_t *)w->data)[i] = ggml_fp32_to_fp16(frand());
    struct ggml_tensor *x = rand_t(ctx, k, n, 1.0f);
    struct ggml_tensor *r = ggml_mul_mat(ctx, w, x);
    run(ctx, r);
    char name[64]; snprintf(name, sizeof name, "mulmat_f16:%d:%d:%d", m, n, k);
    rec_begin(name, 3); arr(w->data, ggml_nbytes(w)); arr(x->data, ggml_nbytes(x)); arr(r->data, ggml_nbytes(r));
    ggml_free(ctx);
}

// quantized mul_mat (tinyBLAS for n >= 2 on the Q0 types, vec_dot otherwise)
static void mulmat_q_case(enum ggml_type t, int m, int n, int k) {
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, t, k, m);
    float *wf = malloc((size_t)k * m * 4); fill(wf, k * m, 0.1f);
    ggml_quantize_chunk(t, wf, w->data, 0, m, k, NULL); free(wf);
    struct ggml_tensor *x = rand_t(ctx, k, n, 1.0f);
    struct ggml_tensor *r = ggml_mul_mat(ctx, w, x);
    run(ctx, r);
    char name[64]; snprintf(name, sizeof name, "mulmat:%s:%d:%d:%d", ggml_type_name(t), m, n, k);
    rec_begin(name, 3); arr(w->data, ggml_nbytes(w)); arr(x->data, ggml_nbytes(x)); arr(r->data, ggml_nbytes(r));
    ggml_free(ctx);
}

// quantized mul_mat with the weight in the CPU_REPACK buffer (Q4_K: gemm/gemv 8x8 kernels)
static void mulmat_repack_case(enum ggml_type t, int m, int n, int k) {
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 2);
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get_extra =
        (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = NULL;
    for (ggml_backend_buffer_type_t *b = get_extra(dev); b && *b; b++)
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) repack = *b;
    if (!repack) { fprintf(stderr, "no CPU_REPACK\n"); exit(1); }
    struct ggml_init_params p = { 16 * ggml_tensor_overhead() + ggml_graph_overhead(), NULL, true };
    struct ggml_context *cw = ggml_init(p), *cx = ggml_init(p);
    struct ggml_tensor *w = ggml_new_tensor_2d(cw, t, k, m);
    struct ggml_tensor *x = ggml_new_tensor_2d(cx, GGML_TYPE_F32, k, n);
    struct ggml_tensor *r = ggml_mul_mat(cx, w, x);
    ggml_backend_buffer_t bw = ggml_backend_alloc_ctx_tensors_from_buft(cw, repack);
    ggml_backend_buffer_t bx = ggml_backend_alloc_ctx_tensors(cx, be);
    float *wf = malloc((size_t)k * m * 4); fill(wf, k * m, 0.1f);
    size_t wsz = ggml_row_size(t, k) * m; void *wq = malloc(wsz);
    ggml_quantize_chunk(t, wf, wq, 0, m, k, NULL);
    ggml_backend_tensor_set(w, wq, 0, wsz);
    float *xf = malloc((size_t)k * n * 4); fill(xf, k * n, 1.0f);
    ggml_backend_tensor_set(x, xf, 0, (size_t)k * n * 4);
    struct ggml_cgraph *gf = ggml_new_graph(cx);
    ggml_build_forward_expand(gf, r);
    ggml_backend_graph_compute(be, gf);
    float *rf = malloc((size_t)m * n * 4);
    ggml_backend_tensor_get(r, rf, 0, (size_t)m * n * 4);
    char name[64]; snprintf(name, sizeof name, "mulmat_repack:%s:%d:%d:%d", ggml_type_name(t), m, n, k);
    rec_begin(name, 3); arr(wq, wsz); arr(xf, (size_t)k * n * 4); arr(rf, (size_t)m * n * 4);
    free(wf); free(wq); free(xf); free(rf);
    ggml_backend_buffer_free(bw); ggml_backend_buffer_free(bx); ggml_free(cw); ggml_free(cx); ggml_backend_free(be);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    out = fopen(argv[1], "wb");
    fwrite("LXV1", 1, 4, out);
    ggml_cpu_init();
    for (int s = 0; s < 3; s++) {
        float sc = s == 0 ? 0.01f : s == 1 ? 1.0f : 40.0f;
        quant_case(GGML_TYPE_Q8_0, 32 * 9, sc);
        quant_case(GGML_TYPE_Q8_1, 32 * 9, sc);
        quant_case(GGML_TYPE_Q8_K, 256 * 2, sc);
    }
    enum ggml_type dts[] = { GGML_TYPE_Q4_0, GGML_TYPE_Q4_1, GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0,
                             GGML_TYPE_IQ4_NL, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K, GGML_TYPE_Q4_K, GGML_TYPE_Q5_K,
                             GGML_TYPE_Q6_K, GGML_TYPE_IQ4_XS };
    for (size_t i = 0; i < sizeof dts / sizeof dts[0]; i++) {
        int qk = ggml_blck_size(dts[i]);
        int nbs[3] = { 1, 2, qk == 32 ? 17 : 3 };
        for (int j = 0; j < 3; j++) for (int rep = 0; rep < (j == 2 ? 1 : 2); rep++) dot_case(dts[i], nbs[j] * qk);
    }
    int ns[4] = { 7, 64, 67, 136 };
    for (int i = 0; i < 4; i++) unary_cases(ns[i], 2);
    softmax_case(5, 5, 0.125f); softmax_case(37, 9, 0.125f); softmax_case(256, 4, 1.0f);
    rope_case(0, 64, 64, 3, 5, 10000.0f); rope_case(2, 64, 64, 3, 3, 10000.0f);
    rope_case(0, 16, 10, 2, 3, 10000.0f); rope_case(2, 256, 256, 2, 2, 1000000.0f);
    rope_case(0, 40, 40, 2, 3, 500.0f); rope_case(0, 24, 12, 2, 3, 10000.0f);
    rope_case(0, 8, 6, 2, 6, 10000.0f); rope_case(0, 16, 14, 2, 6, 10000.0f); rope_case(0, 18, 18, 1, 6, 10000.0f);
    mulmat_f16_case(8, 1, 64); mulmat_f16_case(8, 3, 64); mulmat_f16_case(6, 3, 40); mulmat_f16_case(4, 2, 37);
    mulmat_q_case(GGML_TYPE_Q8_0, 5, 3, 96); mulmat_q_case(GGML_TYPE_Q8_0, 4, 1, 96);
    mulmat_q_case(GGML_TYPE_Q4_1, 4, 3, 96);
    mulmat_q_case(GGML_TYPE_Q6_K, 4, 9, 256); mulmat_q_case(GGML_TYPE_Q6_K, 4, 3, 256);
    mulmat_q_case(GGML_TYPE_Q4_K, 4, 8, 256); mulmat_q_case(GGML_TYPE_Q5_K, 4, 8, 256);
    mulmat_q_case(GGML_TYPE_Q2_K, 4, 8, 256); mulmat_q_case(GGML_TYPE_IQ4_XS, 4, 8, 256);
    mulmat_q_case(GGML_TYPE_Q3_K, 4, 8, 256);
    mulmat_repack_case(GGML_TYPE_Q4_K, 16, 1, 512); mulmat_repack_case(GGML_TYPE_Q4_K, 8, 7, 256);
    mulmat_repack_case(GGML_TYPE_Q4_K, 8, 4, 256);
    mulmat_repack_case(GGML_TYPE_Q4_0, 8, 5, 64); mulmat_repack_case(GGML_TYPE_IQ4_NL, 8, 5, 64);
    fclose(out);
    return 0;
}
