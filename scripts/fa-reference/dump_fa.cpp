// dump_fa: llama.cpp reference logits for flash attention and quantized KV caches
// (crates/model/tests/data/fa_reference.json, see make.sh and README.md beside this file).
//
// Loads a GGUF with llama.cpp's public API on the CPU only, tokenizes a text file with
// llama_tokenize (add_special = true, parse_special = false) and keeps its first --n-prompt tokens.
// Those are evaluated in ONE llama_decode call (n_batch = n_ctx >= n_prompt; llama.cpp splits the
// batch into ubatches of --ubatch itself) at positions 0.. of sequence 0, logits at every position.
// Then --n-decode single-token llama_decode calls, each feeding the greedy argmax (lowest id on
// ties) of the previous logits row (the first one: of the last prompt row).
//
// Context: n_ctx --ctx, n_ubatch --ubatch, n_seq_max 1, n_threads = n_threads_batch = --threads,
// flash_attn_type ENABLED (--fa 1) or DISABLED (--fa 0), never AUTO; K/V cache types --ctk/--ctv.
//
// stdout: one JSON object
//   {"n_vocab": N, "prompt": [ids], "decode": [ids fed],
//    "prompt_logits": [row, ...], "decode_logits": [row, ...]}
// row = {"hash": "<16 hex digits>", "top": [[id, logit], ...]}: the 5 highest logits (ties: lower
// id first), logits printed %.9g (round-trips float32); hash = FNV-1a 64-bit (offset basis
// 0xcbf29ce484222325, prime 0x100000001b3) over the little-endian bytes of the n_vocab float32
// logits of the row, in order.
//
// Build (see make.sh):
//   g++ -O2 -std=c++17 dump_fa.cpp -I$LLAMA/include -I$LLAMA/ggml/include
//       -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o dump_fa
// Usage: dump_fa MODEL.gguf --fa 0|1 --ctk TYPE --ctv TYPE --threads N --ctx N --ubatch N
//                --prompt-file FILE --n-prompt N --n-decode N [--raw FILE] [--verbose]
//        --raw FILE: also writes every row's n_vocab float32 logits (little-endian, prompt rows then
//                    decode rows) to FILE, to check the hashes or look closer (not used by make.sh).
//        TYPE: f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl

#include "llama.h"
#include "ggml.h"
#include "ggml-backend.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static bool parse_type(const char * name, ggml_type * out) {
    static const struct { const char * name; ggml_type type; } k_types[] = {
        { "f16",    GGML_TYPE_F16    },
        { "bf16",   GGML_TYPE_BF16   },
        { "q8_0",   GGML_TYPE_Q8_0   },
        { "q4_0",   GGML_TYPE_Q4_0   },
        { "q4_1",   GGML_TYPE_Q4_1   },
        { "q5_0",   GGML_TYPE_Q5_0   },
        { "q5_1",   GGML_TYPE_Q5_1   },
        { "iq4_nl", GGML_TYPE_IQ4_NL },
    };
    for (const auto & t : k_types) {
        if (strcmp(name, t.name) == 0) {
            *out = t.type;
            return true;
        }
    }
    return false;
}

static uint64_t fnv1a64(const float * row, int n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (int j = 0; j < n; j++) {
        uint32_t bits;
        memcpy(&bits, &row[j], 4);
        for (int b = 0; b < 4; b++) { // little-endian byte order, whatever the host
            h ^= (uint8_t) (bits >> (8 * b));
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

static int argmax(const float * row, int n) {
    int best = 0;
    for (int j = 1; j < n; j++) {
        if (row[j] > row[best]) { // strict: the lowest id wins ties
            best = j;
        }
    }
    return best;
}

static std::string row_json(const float * row, int n) {
    std::vector<int> idx(n);
    for (int j = 0; j < n; j++) {
        idx[j] = j;
    }
    const int k = std::min(5, n);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), [row](int a, int b) {
        return row[a] > row[b] || (row[a] == row[b] && a < b);
    });
    char buf[64];
    snprintf(buf, sizeof(buf), "%016" PRIx64, fnv1a64(row, n));
    std::string s = "{\"hash\": \"";
    s += buf;
    s += "\", \"top\": [";
    for (int i = 0; i < k; i++) {
        snprintf(buf, sizeof(buf), "%s[%d, %.9g]", i ? ", " : "", idx[i], row[idx[i]]);
        s += buf;
    }
    s += "]}";
    return s;
}

static void silent_log(enum ggml_log_level level, const char * text, void * /*user_data*/) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

static void usage(const char * argv0) {
    fprintf(stderr,
            "usage: %s MODEL.gguf --fa 0|1 --ctk TYPE --ctv TYPE --threads N --ctx N --ubatch N\n"
            "          --prompt-file FILE --n-prompt N --n-decode N [--raw FILE] [--verbose]\n"
            "       TYPE: f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 iq4_nl\n",
            argv0);
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        usage(argv[0]);
        return 2;
    }
    const char * model_path  = argv[1];
    const char * prompt_path = nullptr;
    const char * raw_path    = nullptr;
    int          fa          = -1;
    ggml_type    type_k      = GGML_TYPE_F16;
    ggml_type    type_v      = GGML_TYPE_F16;
    int          n_threads   = 2;
    int          n_ctx       = 1024;
    int          n_ubatch    = 512;
    int          n_prompt    = -1;
    int          n_decode    = 0;
    bool         verbose     = false;
    for (int i = 2; i < argc; i++) {
        const bool has_val = i + 1 < argc;
        if (strcmp(argv[i], "--fa") == 0 && has_val) {
            fa = atoi(argv[++i]);
        } else if ((strcmp(argv[i], "--ctk") == 0 || strcmp(argv[i], "--ctv") == 0) && has_val) {
            ggml_type * dst = argv[i][4] == 'k' ? &type_k : &type_v;
            if (!parse_type(argv[i + 1], dst)) {
                fprintf(stderr, "unknown cache type: %s\n", argv[i + 1]);
                return 2;
            }
            i++;
        } else if (strcmp(argv[i], "--threads") == 0 && has_val) {
            n_threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--ctx") == 0 && has_val) {
            n_ctx = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--ubatch") == 0 && has_val) {
            n_ubatch = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--prompt-file") == 0 && has_val) {
            prompt_path = argv[++i];
        } else if (strcmp(argv[i], "--n-prompt") == 0 && has_val) {
            n_prompt = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--n-decode") == 0 && has_val) {
            n_decode = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--raw") == 0 && has_val) {
            raw_path = argv[++i];
        } else if (strcmp(argv[i], "--verbose") == 0) {
            verbose = true;
        } else {
            fprintf(stderr, "unknown argument: %s\n", argv[i]);
            usage(argv[0]);
            return 2;
        }
    }
    if ((fa != 0 && fa != 1) || prompt_path == nullptr || n_prompt <= 0 || n_decode < 0 || n_threads <= 0 ||
        n_prompt + n_decode > n_ctx) {
        usage(argv[0]);
        return 2;
    }

    std::string text;
    {
        std::ifstream in(prompt_path, std::ios::binary);
        if (!in) {
            fprintf(stderr, "cannot read %s\n", prompt_path);
            return 1;
        }
        std::stringstream ss;
        ss << in.rdbuf();
        text = ss.str();
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

    const llama_vocab * vocab   = llama_model_get_vocab(model);
    const int           n_vocab = llama_vocab_n_tokens(vocab);

    std::vector<llama_token> toks(text.size() + 16);
    int n_tok = llama_tokenize(vocab, text.data(), (int32_t) text.size(), toks.data(), (int32_t) toks.size(),
                               /*add_special*/ true, /*parse_special*/ false);
    if (n_tok < 0) {
        toks.resize(-n_tok);
        n_tok = llama_tokenize(vocab, text.data(), (int32_t) text.size(), toks.data(), (int32_t) toks.size(), true,
                               false);
    }
    if (n_tok < n_prompt) {
        fprintf(stderr, "the text has only %d tokens (wanted %d)\n", n_tok, n_prompt);
        return 1;
    }
    toks.resize(n_prompt);

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = n_ctx;
    cparams.n_batch         = std::max(n_ctx, n_prompt);
    cparams.n_ubatch        = n_ubatch;
    cparams.n_seq_max       = 1;
    cparams.n_threads       = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.type_k          = type_k;
    cparams.type_v          = type_v;
    cparams.embeddings      = false;
    cparams.no_perf         = true;

    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        fprintf(stderr, "failed to create context\n");
        return 3;
    }

    std::vector<std::string> prompt_rows;
    std::vector<std::string> decode_rows;
    std::vector<llama_token> fed;
    FILE *                   raw = nullptr;
    if (raw_path) {
        raw = fopen(raw_path, "wb");
        if (!raw) {
            fprintf(stderr, "cannot open %s\n", raw_path);
            return 1;
        }
    }

    llama_batch batch = llama_batch_init(n_prompt, 0, 1);
    for (int i = 0; i < n_prompt; i++) {
        batch.token[i]     = toks[i];
        batch.pos[i]       = i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = 1;
    }
    batch.n_tokens = n_prompt;
    int rc = llama_decode(ctx, batch);
    if (rc != 0) {
        fprintf(stderr, "llama_decode (prompt) failed: %d\n", rc);
        return 1;
    }
    llama_token next = 0;
    for (int i = 0; i < n_prompt; i++) {
        const float * row = llama_get_logits_ith(ctx, i);
        if (row == nullptr) {
            fprintf(stderr, "no logits at prompt position %d\n", i);
            return 1;
        }
        prompt_rows.push_back(row_json(row, n_vocab));
        if (raw) {
            fwrite(row, sizeof(float), n_vocab, raw);
        }
        if (i == n_prompt - 1) {
            next = argmax(row, n_vocab);
        }
    }

    for (int s = 0; s < n_decode; s++) {
        batch.token[0]     = next;
        batch.pos[0]       = n_prompt + s;
        batch.n_seq_id[0]  = 1;
        batch.seq_id[0][0] = 0;
        batch.logits[0]    = 1;
        batch.n_tokens     = 1;
        fed.push_back(next);
        rc = llama_decode(ctx, batch);
        if (rc != 0) {
            fprintf(stderr, "llama_decode (decode step %d) failed: %d\n", s, rc);
            return 1;
        }
        const float * row = llama_get_logits_ith(ctx, 0);
        if (row == nullptr) {
            fprintf(stderr, "no logits at decode step %d\n", s);
            return 1;
        }
        decode_rows.push_back(row_json(row, n_vocab));
        if (raw) {
            fwrite(row, sizeof(float), n_vocab, raw);
        }
        next = argmax(row, n_vocab);
    }

    printf("{\"n_vocab\": %d, \"prompt\": [", n_vocab);
    for (int i = 0; i < n_prompt; i++) {
        printf("%s%d", i ? ", " : "", toks[i]);
    }
    printf("], \"decode\": [");
    for (size_t i = 0; i < fed.size(); i++) {
        printf("%s%d", i ? ", " : "", fed[i]);
    }
    printf("], \"prompt_logits\": [");
    for (size_t i = 0; i < prompt_rows.size(); i++) {
        printf("%s%s", i ? ", " : "", prompt_rows[i].c_str());
    }
    printf("], \"decode_logits\": [");
    for (size_t i = 0; i < decode_rows.size(); i++) {
        printf("%s%s", i ? ", " : "", decode_rows[i].c_str());
    }
    printf("]}\n");
    if (raw) {
        fclose(raw);
    }

    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
