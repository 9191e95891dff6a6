// dump_shift: llama.cpp reference logits after KV-cache position shifts (context shift and
// cache reuse), for crates/model/tests/data/ctx_shift_reference.json (see make.sh beside this).
//
// Loads a GGUF with llama.cpp's public API on the CPU only and tokenizes a text file with
// llama_tokenize (add_special = true, parse_special = false). Two modes, each as llama-server
// 0c1e570 does it (tools/server/server-context.cpp):
//
//   --mode shift: the first --n-prompt tokens in one llama_decode, then --n-decode greedy
//     single-token steps (argmax, lowest id on ties). Before a step, when the cache holds
//     n_ctx - 1 tokens, the context is shifted as llama-server's pre_decode does:
//     n_left = n_cache - keep, n_discard = n_left / 2, seq_rm(keep, keep + n_discard),
//     seq_add(keep + n_discard, n_cache, -n_discard).
//   --mode reuse: prompt A = the first --n-prompt tokens, decoded. Prompt B = A without its
//     tokens [--cut0, --cut1). The cached A is reused for B as llama-server's --cache-reuse
//     does (common prefix, then chunks of at least --reuse tokens moved with seq_rm / seq_add),
//     the rest of B is decoded (at least its last token again, for its logits), then
//     --n-decode greedy steps.
//
// stdout: one JSON object {"n_vocab", "prompt": [A's ids], "steps": [step, ...]}, where a step
// is {"ops": [[op, p0, p1, delta], ...], "feed": [ids], "pos0": p, "hash": "<16 hex>",
// "top": [[id, logit] x 5]}: the cache operations done first (op "rm" or "add", seq 0), then
// the tokens fed in one llama_decode at positions pos0.., and the logits of the last one
// (FNV-1a 64 over the little-endian float32 row; top 5, ties lower id first, %.9g). The first
// step is the prompt (its row: the last prompt token's).
//
// Build: g++ -O2 -std=c++17 dump_shift.cpp -I$LLAMA/include -I$LLAMA/ggml/include
//            -L$BUILD/bin -lllama -lggml -lggml-base -Wl,-rpath,$BUILD/bin -o dump_shift
// Usage: dump_shift MODEL.gguf --mode shift|reuse --fa 0|1 --ctk T --ctv T --threads N --ctx N
//            --prompt-file F --n-prompt N --n-decode N [--keep N] [--cut0 N --cut1 N --reuse N]

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
        { "f16", GGML_TYPE_F16 }, { "q8_0", GGML_TYPE_Q8_0 }, { "q4_0", GGML_TYPE_Q4_0 },
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
        for (int b = 0; b < 4; b++) {
            h ^= (uint8_t) (bits >> (8 * b));
            h *= 0x100000001b3ULL;
        }
    }
    return h;
}

static int argmax(const float * row, int n) {
    int best = 0;
    for (int j = 1; j < n; j++) {
        if (row[j] > row[best]) {
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
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [row](int a, int b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
    char buf[64];
    snprintf(buf, sizeof(buf), "%016" PRIx64, fnv1a64(row, n));
    std::string s = "\"hash\": \"";
    s += buf;
    s += "\", \"top\": [";
    for (int i = 0; i < k; i++) {
        snprintf(buf, sizeof(buf), "%s[%d, %.9g]", i ? ", " : "", idx[i], row[idx[i]]);
        s += buf;
    }
    s += "]";
    return s;
}

static void silent_log(enum ggml_log_level level, const char * text, void *) {
    if (level == GGML_LOG_LEVEL_ERROR || level == GGML_LOG_LEVEL_WARN) {
        fputs(text, stderr);
    }
}

struct Step {
    std::string              ops;
    std::vector<llama_token> feed;
    int                      pos0;
    std::string              row;
};

static llama_context * g_ctx;
static int             g_n_vocab;
static std::vector<Step> g_steps;
static std::string     g_ops;

static void op_rm(int p0, int p1) {
    llama_memory_seq_rm(llama_get_memory(g_ctx), 0, p0, p1);
    char buf[64];
    snprintf(buf, sizeof(buf), "%s[\"rm\", %d, %d, 0]", g_ops.empty() ? "" : ", ", p0, p1);
    g_ops += buf;
}

static void op_add(int p0, int p1, int d) {
    llama_memory_seq_add(llama_get_memory(g_ctx), 0, p0, p1, d);
    char buf[64];
    snprintf(buf, sizeof(buf), "%s[\"add\", %d, %d, %d]", g_ops.empty() ? "" : ", ", p0, p1, d);
    g_ops += buf;
}

// Feeds `toks` at positions pos0.. in one llama_decode; returns the argmax of the last row.
static llama_token feed(const std::vector<llama_token> & toks, int pos0) {
    llama_batch batch = llama_batch_init((int) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) {
        batch.token[i]     = toks[i];
        batch.pos[i]       = pos0 + (int) i;
        batch.n_seq_id[i]  = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i]    = i + 1 == toks.size();
    }
    batch.n_tokens = (int) toks.size();
    if (llama_decode(g_ctx, batch) != 0) {
        fprintf(stderr, "llama_decode failed\n");
        exit(1);
    }
    llama_batch_free(batch);
    const float * row = llama_get_logits_ith(g_ctx, (int) toks.size() - 1);
    g_steps.push_back({ g_ops, toks, pos0, row_json(row, g_n_vocab) });
    g_ops.clear();
    return argmax(row, g_n_vocab);
}

int main(int argc, char ** argv) {
    if (argc < 2) {
        return 2;
    }
    const char * model_path = argv[1];
    std::string  mode;
    const char * prompt_path = nullptr;
    int fa = -1, n_threads = 2, n_ctx = 256, n_prompt = -1, n_decode = 0, keep = 0;
    int cut0 = -1, cut1 = -1, n_reuse = 0;
    ggml_type type_k = GGML_TYPE_F16, type_v = GGML_TYPE_F16;
    for (int i = 2; i < argc; i++) {
        const bool has = i + 1 < argc;
        std::string a  = argv[i];
        if (a == "--mode" && has) mode = argv[++i];
        else if (a == "--fa" && has) fa = atoi(argv[++i]);
        else if ((a == "--ctk" || a == "--ctv") && has) {
            if (!parse_type(argv[++i], a == "--ctk" ? &type_k : &type_v)) return 2;
        }
        else if (a == "--threads" && has) n_threads = atoi(argv[++i]);
        else if (a == "--ctx" && has) n_ctx = atoi(argv[++i]);
        else if (a == "--prompt-file" && has) prompt_path = argv[++i];
        else if (a == "--n-prompt" && has) n_prompt = atoi(argv[++i]);
        else if (a == "--n-decode" && has) n_decode = atoi(argv[++i]);
        else if (a == "--keep" && has) keep = atoi(argv[++i]);
        else if (a == "--cut0" && has) cut0 = atoi(argv[++i]);
        else if (a == "--cut1" && has) cut1 = atoi(argv[++i]);
        else if (a == "--reuse" && has) n_reuse = atoi(argv[++i]);
        else { fprintf(stderr, "unknown argument: %s\n", argv[i]); return 2; }
    }
    if ((mode != "shift" && mode != "reuse") || (fa != 0 && fa != 1) || !prompt_path || n_prompt <= 0 ||
        n_prompt >= n_ctx) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    std::string text;
    {
        std::ifstream in(prompt_path, std::ios::binary);
        std::stringstream ss;
        ss << in.rdbuf();
        text = ss.str();
    }
    llama_log_set(silent_log, nullptr);
    llama_backend_init();
    ggml_backend_dev_t cpu_dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    ggml_backend_dev_t devs[2] = { cpu_dev, nullptr };
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    mparams.devices      = devs;
    llama_model * model  = llama_model_load_from_file(model_path, mparams);
    if (!model) return 1;
    const llama_vocab * vocab = llama_model_get_vocab(model);
    g_n_vocab                 = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> toks(text.size() + 16);
    int n_tok = llama_tokenize(vocab, text.data(), (int32_t) text.size(), toks.data(), (int32_t) toks.size(), true, false);
    if (n_tok < n_prompt) return 1;
    toks.resize(n_prompt);

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx           = n_ctx;
    cparams.n_batch         = n_ctx;
    cparams.n_ubatch        = 512;
    cparams.n_seq_max       = 1;
    cparams.n_threads       = n_threads;
    cparams.n_threads_batch = n_threads;
    cparams.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.type_k          = type_k;
    cparams.type_v          = type_v;
    cparams.no_perf         = true;
    g_ctx = llama_init_from_model(model, cparams);
    if (!g_ctx) return 3;
    if ((int) llama_n_ctx(g_ctx) != n_ctx) {
        fprintf(stderr, "llama.cpp made the context %u cells, not %d\n", llama_n_ctx(g_ctx), n_ctx);
        return 2;
    }

    llama_token next = feed(toks, 0);
    int n_cache = n_prompt;
    if (mode == "reuse") {
        if (cut0 < 0 || cut1 <= cut0 || cut1 > n_prompt || n_reuse <= 0) return 2;
        // B: A without [cut0, cut1).
        std::vector<llama_token> cache = toks;
        std::vector<llama_token> b(toks.begin(), toks.begin() + cut0);
        b.insert(b.end(), toks.begin() + cut1, toks.end());
        // llama-server: the common prefix, then chunks moved into place.
        size_t n_past = 0;
        while (n_past < cache.size() && n_past < b.size() && cache[n_past] == b[n_past]) n_past++;
        size_t head_c = n_past, head_p = n_past;
        while (head_c < cache.size() && head_p < b.size()) {
            size_t n_match = 0;
            while (head_c + n_match < cache.size() && head_p + n_match < b.size() &&
                   cache[head_c + n_match] == b[head_p + n_match]) {
                n_match++;
            }
            if (n_match >= (size_t) n_reuse) {
                const int kv_shift = (int) head_p - (int) head_c;
                op_rm((int) head_p, (int) head_c);
                op_add((int) head_c, (int) (head_c + n_match), kv_shift);
                for (size_t i = 0; i < n_match; i++) {
                    cache[head_p + i] = cache[head_c + i];
                    n_past++;
                }
                head_c += n_match;
                head_p += n_match;
            } else {
                head_c += 1;
            }
        }
        // At least the last token is evaluated again; what follows n_past is dropped.
        if (n_past >= b.size()) n_past = b.size() - 1;
        op_rm((int) n_past, -1);
        std::vector<llama_token> rest(b.begin() + n_past, b.end());
        next    = feed(rest, (int) n_past);
        n_cache = (int) b.size();
    }
    for (int s = 0; s < n_decode; s++) {
        if (mode == "shift" && n_cache + 1 >= n_ctx) {
            const int n_left    = n_cache - keep;
            const int n_discard = std::clamp(n_left / 2, 0, std::max(0, n_left - 1));
            op_rm(keep, keep + n_discard);
            op_add(keep + n_discard, n_cache, -n_discard);
            n_cache -= n_discard;
        }
        next = feed({ next }, n_cache);
        n_cache++;
    }

    printf("{\"n_vocab\": %d, \"prompt\": [", g_n_vocab);
    for (int i = 0; i < n_prompt; i++) printf("%s%d", i ? ", " : "", toks[i]);
    printf("], \"steps\": [\n");
    for (size_t i = 0; i < g_steps.size(); i++) {
        const Step & st = g_steps[i];
        printf("  {\"ops\": [%s], \"feed\": [", st.ops.c_str());
        const size_t n_show = i == 0 ? 0 : st.feed.size();  // the prompt is "prompt" above
        for (size_t j = 0; j < n_show; j++) printf("%s%d", j ? ", " : "", st.feed[j]);
        printf("], \"pos0\": %d, %s}%s\n", st.pos0, st.row.c_str(), i + 1 < g_steps.size() ? "," : "");
    }
    printf("]}\n");
    return 0;
}
