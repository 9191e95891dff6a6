// dump_logits: reference logits (and optionally every intermediate tensor) from llama.cpp
// for the architecture fixtures in crates/model/tests/archs/.
//
// Loads a GGUF with llama.cpp's public API on the CPU and evaluates a fixed 24-token batch
// in ONE llama_decode call: positions 0..23, sequence 0, logits requested at every position.
// Context: n_ctx 256, n_batch = n_ubatch = 256, f16 K and V cache, flash attention disabled.
//
// stdout: one JSON object {"n_vocab": N, "tokens": [...], "logits": [[N floats] x 24]},
//         floats printed with %.9g (round-trips float32).
// --dump FILE: also writes, for every graph node as the scheduler computes it (cb_eval),
//         one line "name op type [ne0,ne1,ne2,ne3] src=[...] first8=[...] last8=[...] sum=S" (values %.9g, sum in double).
//         Note: asking for every node makes the scheduler compute the graph node by node; the
//         logits printed are those of that run (they are checked to be equal to a plain run).
//
// Build (see make.sh):
//   g++ -O2 -std=c++17 dump_logits.cpp -I$LLAMA/include -I$LLAMA/ggml/include \
//       -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o dump_logits
// Usage: dump_logits MODEL.gguf [--dump FILE] [--threads N] [--verbose]
//        (--ctx N, --ubatch N, --fa 1 only exist to investigate settings; the fixtures use the defaults)

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static const llama_token k_tokens[24] = {
    11, 99, 83, 56, 55, 109, 11, 89, 25, 12, 67, 124, 94, 97, 91, 100, 65, 16, 107, 57, 64, 47, 23, 118,
};

struct dump_state {
    FILE *               f = nullptr;
    std::vector<uint8_t> buf;
    int                  n_nodes = 0;
};

static double get_value(const uint8_t * data, ggml_type type, size_t off) {
    switch (type) {
        case GGML_TYPE_F32:  return *(const float *) (data + off);
        case GGML_TYPE_F16:  return ggml_fp16_to_fp32(*(const ggml_fp16_t *) (data + off));
        case GGML_TYPE_BF16: return ggml_bf16_to_fp32(*(const ggml_bf16_t *) (data + off));
        case GGML_TYPE_I64:  return (double) *(const int64_t *) (data + off);
        case GGML_TYPE_I32:  return (double) *(const int32_t *) (data + off);
        case GGML_TYPE_I16:  return (double) *(const int16_t *) (data + off);
        case GGML_TYPE_I8:   return (double) *(const int8_t *) (data + off);
        default:             return 0.0;
    }
}

static bool dump_cb(struct ggml_tensor * t, bool ask, void * user_data) {
    auto * st = (dump_state *) user_data;
    if (ask) {
        return true; // we want every node
    }
    const uint8_t * data = nullptr;
    if (t->buffer && ggml_backend_buffer_is_host(t->buffer)) {
        data = (const uint8_t *) t->data;
    } else {
        // copy the whole viewed region: offset 0 .. nbytes of the (possibly strided) tensor
        st->buf.resize(ggml_nbytes(t));
        ggml_backend_tensor_get(t, st->buf.data(), 0, ggml_nbytes(t));
        data = st->buf.data();
    }

    fprintf(st->f, "%-28s %-14s %-5s [%" PRId64 ",%" PRId64 ",%" PRId64 ",%" PRId64 "]",
            t->name, ggml_op_desc(t), ggml_type_name(t->type), t->ne[0], t->ne[1], t->ne[2], t->ne[3]);
    fprintf(st->f, " src=[");
    for (int i = 0; i < GGML_MAX_SRC && t->src[i]; i++) {
        fprintf(st->f, "%s%s", i ? "," : "", t->src[i]->name);
    }
    fprintf(st->f, "]");

    const bool readable = t->type == GGML_TYPE_F32 || t->type == GGML_TYPE_F16 || t->type == GGML_TYPE_BF16 ||
                          t->type == GGML_TYPE_I64 || t->type == GGML_TYPE_I32 || t->type == GGML_TYPE_I16 ||
                          t->type == GGML_TYPE_I8;
    if (!readable) {
        fprintf(st->f, " (values not dumped: type %s)\n", ggml_type_name(t->type));
        st->n_nodes++;
        return true;
    }

    double sum = 0.0;
    int    n_first = 0;
    double first[8];
    double last[8];
    int64_t n_seen = 0;
    for (int64_t i3 = 0; i3 < t->ne[3]; i3++) {
        for (int64_t i2 = 0; i2 < t->ne[2]; i2++) {
            for (int64_t i1 = 0; i1 < t->ne[1]; i1++) {
                for (int64_t i0 = 0; i0 < t->ne[0]; i0++) {
                    const size_t off = i3 * t->nb[3] + i2 * t->nb[2] + i1 * t->nb[1] + i0 * t->nb[0];
                    const double v = get_value(data, t->type, off);
                    if (n_first < 8) {
                        first[n_first++] = v;
                    }
                    last[n_seen % 8] = v;
                    n_seen++;
                    sum += v;
                }
            }
        }
    }
    fprintf(st->f, " first8=[");
    for (int i = 0; i < n_first; i++) {
        fprintf(st->f, "%s%.9g", i ? "," : "", first[i]);
    }
    fprintf(st->f, "] last8=[");
    const int n_last = n_seen < 8 ? (int) n_seen : 8;
    for (int i = 0; i < n_last; i++) {
        fprintf(st->f, "%s%.9g", i ? "," : "", last[(n_seen - n_last + i) % 8]);
    }
    fprintf(st->f, "] sum=%.9g\n", sum);
    st->n_nodes++;
    return true;
}

static void silent_log(enum ggml_log_level level, const char * text, void * /*user_data*/) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s MODEL.gguf [--dump FILE] [--threads N] [--verbose] [--ctx N] [--ubatch N] [--fa 0|1]\n", argv[0]);
        return 2;
    }
    const char * model_path = argv[1];
    const char * dump_path  = nullptr;
    int          n_threads  = 2;
    bool         verbose    = false;
    // experiment knobs (defaults are the fixture settings)
    int          n_ctx      = 256;
    int          n_ubatch   = 256;
    int          fa         = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
            dump_path = argv[++i];
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            n_threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--ctx") == 0 && i + 1 < argc) {
            n_ctx = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--ubatch") == 0 && i + 1 < argc) {
            n_ubatch = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--fa") == 0 && i + 1 < argc) {
            fa = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--verbose") == 0) {
            verbose = true;
        } else {
            fprintf(stderr, "unknown argument: %s\n", argv[i]);
            return 2;
        }
    }

    if (!verbose) {
        llama_log_set(silent_log, nullptr);
    }
    llama_backend_init();

    // CPU only: pass an explicit device list holding just the CPU device.
    ggml_backend_dev_t cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (cpu_dev == nullptr) {
        fprintf(stderr, "no CPU device\n");
        return 1;
    }
    ggml_backend_dev_t devs[2] = { cpu_dev, nullptr };

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    mparams.devices      = devs;

    llama_model * model = llama_model_load_from_file(model_path, mparams);
    if (model == nullptr) {
        fprintf(stderr, "failed to load %s\n", model_path);
        return 1;
    }

    const int n_tokens = 24;

    dump_state st;
    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = n_ctx;
    cparams.n_batch         = n_ctx;
    cparams.n_ubatch        = n_ubatch;
    cparams.n_seq_max       = 1;
    cparams.n_threads       = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.type_k          = GGML_TYPE_F16;
    cparams.type_v          = GGML_TYPE_F16;
    cparams.embeddings      = false;
    cparams.no_perf         = true;
    if (dump_path) {
        st.f = fopen(dump_path, "w");
        if (!st.f) {
            fprintf(stderr, "cannot open %s\n", dump_path);
            return 1;
        }
        cparams.cb_eval           = dump_cb;
        cparams.cb_eval_user_data = &st;
    }

    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "failed to create context\n");
        return 1;
    }

    const llama_vocab * vocab   = llama_model_get_vocab(model);
    const int           n_vocab = llama_vocab_n_tokens(vocab);

    llama_batch batch = llama_batch_init(n_tokens, 0, 1);
    for (int i = 0; i < n_tokens; i++) {
        batch.token[i]     = k_tokens[i];
        batch.pos[i]       = i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = 1;
    }
    batch.n_tokens = n_tokens;

    if (dump_path) {
        fprintf(st.f, "# model %s, 24 tokens in one batch, n_ctx %u, n_ubatch %u, f16 KV, flash attn off, %d threads\n",
                model_path, llama_n_ctx(ctx), llama_n_ubatch(ctx), n_threads);
        fprintf(st.f, "# name op type [ne0,ne1,ne2,ne3] src=[...] first8=[...] last8=[...] (element order: ne0 fastest) sum=(double)\n");
    }

    const int rc = llama_decode(ctx, batch);
    if (rc != 0) {
        fprintf(stderr, "llama_decode failed: %d\n", rc);
        return 1;
    }

    printf("{\"n_vocab\": %d, \"tokens\": [", n_vocab);
    for (int i = 0; i < n_tokens; i++) {
        printf("%s%d", i ? ", " : "", k_tokens[i]);
    }
    printf("], \"logits\": [");
    for (int i = 0; i < n_tokens; i++) {
        const float * row = llama_get_logits_ith(ctx, i);
        if (row == nullptr) {
            fprintf(stderr, "no logits at %d\n", i);
            return 1;
        }
        printf("%s[", i ? ", " : "");
        for (int j = 0; j < n_vocab; j++) {
            printf("%s%.9g", j ? ", " : "", row[j]);
        }
        printf("]");
    }
    printf("]}\n");

    if (st.f) {
        fprintf(st.f, "# %d nodes\n", st.n_nodes);
        fclose(st.f);
    }

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
