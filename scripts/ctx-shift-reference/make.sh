#!/usr/bin/env bash
# make.sh — regenerate crates/model/tests/data/ctx_shift_reference.json: llama.cpp's logits after
# the KV cache's positions were shifted (llama-server's context shift and --cache-reuse), on the
# two real test models.
#
# Why: a shift moves cached tokens to new positions and rotates their keys by RoPE again
# (llama.cpp's K-shift); Lamina must compute the same bits afterwards, for each K cache type
# (f16; q8_0 goes through the Walsh-Hadamard rotation), with and without flash attention, and
# for gemma3's per-layer RoPE bases.
#
# What it does: compiles dump_shift.cpp (beside this script) against the AVX2-only CPU build of
# llama.cpp 0c1e570 ($BUILD, as in scripts/arch-fixtures/make.sh step 3), runs each case below
# (see dump_shift.cpp for what a case does) and writes $OUT: {"llama_cpp", "hash", "text",
# "cases": [{"name", "model", "mode", "flash_attn", "type_k", "type_v", "n_threads", "n_ctx",
# "keep", "prompt", "steps": [{"ops", "feed", "pos0", "hash", "top"}]}]}; "top" keeps the two
# highest logits of a row.
#
# Not run by CI. Needs bash, python3, g++, the llama.cpp build and source, the two models in
# $MODELS. Under a minute on 2 cores.
#
# Usage: scripts/ctx-shift-reference/make.sh
#   env: BUILD (default /tmp/lcp/build-avx2)  LLAMA (default
#        /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp)  MODELS (default ~/.cache/lamina/models)
#        WORK (default /tmp/lamina-ctx-shift-reference)  OUT (default
#        crates/model/tests/data/ctx_shift_reference.json)  TEXT (default ../shared/reference/areopagitica.txt)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="${BUILD:-/tmp/lcp/build-avx2}"
LLAMA="${LLAMA:-/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp}"
MODELS="${MODELS:-$HOME/.cache/lamina/models}"
WORK="${WORK:-/tmp/lamina-ctx-shift-reference}"
OUT="${OUT:-$ROOT/crates/model/tests/data/ctx_shift_reference.json}"
TEXT="${TEXT:-$ROOT/../shared/reference/areopagitica.txt}"

for f in "$BUILD/bin/libllama.so" "$LLAMA/include/llama.h" "$TEXT" \
         "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODELS/gemma-3-270m-q4_k_m.gguf"; do
    [ -e "$f" ] || { echo "missing: $f" >&2; exit 1; }
done
mkdir -p "$WORK"
DUMPER="$WORK/dump_shift"
g++ -O2 -std=c++17 "$HERE/dump_shift.cpp" -I"$LLAMA/include" -I"$LLAMA/ggml/include" \
    -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin" -o "$DUMPER"

python3 - "$DUMPER" "$MODELS" "$TEXT" "$OUT" <<'PY'
import json, os, subprocess, sys

dumper, models, text, out = sys.argv[1:5]
FILES = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
N_CTX = 256
# name, model, mode, fa, type_k, type_v, keep (gemma3 adds BOS: llama-server keeps it), extra args
CASES = [
    ("shift-fa-f16", "smollm2-135m", "shift", 1, "f16", "f16", 0, ["--n-prompt", "200", "--n-decode", "200"]),
    ("shift-nofa-f16-keep20", "smollm2-135m", "shift", 0, "f16", "f16", 20, ["--n-prompt", "200", "--n-decode", "200"]),
    ("shift-fa-q8_0", "smollm2-135m", "shift", 1, "q8_0", "q8_0", 0, ["--n-prompt", "200", "--n-decode", "200"]),
    ("shift-fa-f16", "gemma3-270m", "shift", 1, "f16", "f16", 1, ["--n-prompt", "200", "--n-decode", "200"]),
    ("shift-nofa-f16", "gemma3-270m", "shift", 0, "f16", "f16", 1, ["--n-prompt", "200", "--n-decode", "200"]),
    ("reuse-fa-f16", "smollm2-135m", "reuse", 1, "f16", "f16", 0,
     ["--n-prompt", "150", "--n-decode", "20", "--cut0", "30", "--cut1", "60", "--reuse", "16"]),
    ("reuse-nofa-f16", "gemma3-270m", "reuse", 0, "f16", "f16", 0,
     ["--n-prompt", "150", "--n-decode", "20", "--cut0", "30", "--cut1", "60", "--reuse", "16"]),
]
cases = []
for name, model, mode, fa, tk, tv, keep, extra in CASES:
    cmd = [dumper, os.path.join(models, FILES[model]), "--mode", mode, "--fa", str(fa), "--ctk", tk,
           "--ctv", tv, "--threads", "2", "--ctx", str(N_CTX), "--prompt-file", text, "--keep", str(keep)] + extra
    r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    steps = [dict(s, top=s["top"][:2]) for s in r["steps"]]
    shifts = sum(1 for s in steps if s["ops"])
    print(f"  {model:13s} {name:22s} {len(steps)} steps, {shifts} with cache operations", file=sys.stderr)
    cases.append({"name": name, "model": model, "mode": mode, "flash_attn": bool(fa), "type_k": tk,
                  "type_v": tv, "n_threads": 2, "n_ctx": N_CTX, "keep": keep, "prompt": r["prompt"],
                  "steps": steps})
with open(out, "w") as fh:
    fh.write('{\n  "llama_cpp": "0c1e570, CPU, AVX2 build (GGML_NATIVE=OFF, AVX2/FMA/F16C)",\n')
    fh.write('  "hash": "fnv1a64 over the little-endian f32 logits of a row",\n')
    fh.write('  "text": "first N tokens of ../shared/reference/areopagitica.txt",\n  "cases": [\n')
    for i, c in enumerate(cases):
        head = {k: v for k, v in c.items() if k != "steps"}
        fh.write("    " + json.dumps(head)[:-1] + ', "steps": [\n')
        for j, s in enumerate(c["steps"]):
            fh.write("      " + json.dumps(s) + ("," if j + 1 < len(c["steps"]) else "") + "\n")
        fh.write("    ]}" + ("," if i + 1 < len(cases) else "") + "\n")
    fh.write("  ]\n}\n")
json.load(open(out))
print(f"  {len(cases)} cases -> {out}", file=sys.stderr)
PY
