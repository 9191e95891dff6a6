#!/usr/bin/env bash
# Per-token cost of constrained decoding, Lamina against llama.cpp, on the replays of
# crates/model/tests/data/grammar_reference.json (both models, every grammar and
# schema). Usage: scripts/grammar-bench/run.sh LLAMA_CPP_SRC LLAMA_CPP_BUILD
# (llama.cpp 0c1e570 from the llama-cpp-python 0.3.36 sdist, built with cmake).
set -euo pipefail
SRC=$1 BUILD=$2
here=$(cd "$(dirname "$0")" && pwd)
root=$here/../..
work=$(mktemp -d)
g++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" "$here/llama_grammar_bench.cpp" \
    -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin" -o "$work/bench"
cargo build -q --release -p lamina-grammar --example mask_bench --example schema2gbnf \
    --manifest-path "$root/Cargo.toml"
bin=$root/target/release/examples
cache=${LAMINA_CACHE:-$HOME/.cache/lamina}/models
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) flags: $(grep -m1 flags /proc/cpuinfo | grep -o 'avx512[a-z_]*\|avx2' | sort -u | tr '\n' ' ')"
for pair in "smollm2-135m-instruct-q4_1 SmolLM2-135M-Instruct.Q4_1.gguf" "gemma3-270m-q4_k_m gemma-3-270m-q4_k_m.gguf"; do
    set -- $pair
    dirs=()
    python3 - "$root/crates/model/tests/data/grammar_reference.json" "$1" "$work/$1" "$bin/schema2gbnf" <<'PY'
import json, os, subprocess, sys
ref, key, out, s2g = sys.argv[1:]
for c in json.load(open(ref))["models"][key]["completions"]:
    d = os.path.join(out, c["name"]); os.makedirs(d, exist_ok=True)
    g = c.get("grammar")
    if g is None:
        s = c["json_schema"] or {"type": "object"}
        g = subprocess.run([s2g, json.dumps(s)], capture_output=True, text=True, check=True).stdout
    open(os.path.join(d, "grammar.gbnf"), "w").write(g)
    open(os.path.join(d, "tokens.txt"), "w").write(" ".join(map(str, c["tokens"])))
PY
    for d in "$work/$1"/*; do dirs+=("$d"); done
    echo "== $1: llama.cpp grammar sampler"
    "$work/bench" "$cache/$2" "${dirs[@]}" 2>/dev/null
    echo "== $1: Lamina"
    "$bin/mask_bench" "$cache/$2" "$root/crates/model/tests/data/grammar_reference.json" "$1"
done
