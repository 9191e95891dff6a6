// llama.cpp's grammar sampler on the same replays as Lamina's mask_bench example:
// for each case of crates/model/tests/data/grammar_reference.json (given here as
// files: a GBNF grammar and the token ids llama.cpp generated), the time of
// llama_sampler_apply over the whole vocabulary (the mask) and over the one sampled
// token (the check), per generated token. Build: see README.md.
#include "llama.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static double pct(std::vector<double> v, double p) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    return v[(size_t) std::lround((v.size() - 1) * p)];
}

int main(int argc, char ** argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODEL.gguf CASE_DIR...\n", argv[0]);
        return 2;
    }
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    std::vector<double> all_mask, all_check;
    printf("%-16s %5s  %24s  %24s\n", "case", "steps", "check p50/p99/max us", "mask p50/p99/max us");
    for (int a = 2; a < argc; a++) {
        std::string dir = argv[a];
        std::ifstream gf(dir + "/grammar.gbnf");
        std::stringstream gs; gs << gf.rdbuf();
        std::ifstream tf(dir + "/tokens.txt");
        std::vector<llama_token> tokens; llama_token t;
        while (tf >> t) tokens.push_back(t);
        llama_sampler * g = llama_sampler_init_grammar(vocab, gs.str().c_str(), "root");
        std::vector<llama_token_data> cur(n_vocab);
        std::vector<double> mask, check;
        for (llama_token tok : tokens) {
            for (int i = 0; i < n_vocab; i++) cur[i] = {i, 0.0f, 0.0f};
            llama_token_data_array arr = {cur.data(), cur.size(), -1, false};
            auto t0 = std::chrono::steady_clock::now();
            llama_sampler_apply(g, &arr);
            auto t1 = std::chrono::steady_clock::now();
            mask.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            llama_token_data one = {tok, 1.0f, 0.0f};
            llama_token_data_array single = {&one, 1, -1, false};
            t0 = std::chrono::steady_clock::now();
            llama_sampler_apply(g, &single);
            t1 = std::chrono::steady_clock::now();
            check.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
            if (cur[tok].logit == -INFINITY) { fprintf(stderr, "%s: token %d rejected\n", dir.c_str(), tok); return 1; }
            llama_sampler_accept(g, tok);
        }
        auto f = [](const std::vector<double> & v) {
            char b[64]; snprintf(b, sizeof b, "%.1f/%.1f/%.0f", pct(v, .5), pct(v, .99), pct(v, 1)); return std::string(b);
        };
        std::string name = dir.substr(dir.find_last_of('/') + 1);
        printf("%-16s %5zu  %24s  %24s\n", name.c_str(), tokens.size(), f(check).c_str(), f(mask).c_str());
        all_mask.insert(all_mask.end(), mask.begin(), mask.end());
        all_check.insert(all_check.end(), check.begin(), check.end());
        llama_sampler_free(g);
    }
    printf("%-16s %5zu  %24.1f  %24.1f\n", "all p50", all_mask.size(), pct(all_check, .5), pct(all_mask, .5));
    printf("%-16s %5s  %24.1f  %24.1f\n", "all p99", "", pct(all_check, .99), pct(all_mask, .99));
    llama_model_free(model);
    return 0;
}
