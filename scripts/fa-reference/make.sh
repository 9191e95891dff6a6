#!/usr/bin/env bash
# make.sh — regenerate crates/model/tests/data/fa_reference.json: llama.cpp reference logits for
# flash attention (FA) and quantized K/V caches on the two real test models.
#
# Why: Lamina must match llama.cpp bit for bit. The FA kernel of ggml-cpu (tiled path for ubatches
# of >= 64 rows, per-row path below that, split-KV path for single-token decode over a long cache,
# whose chunking depends on the thread count) and the quantized K/V caches (q8_0, q4_0, q4_1, q5_0,
# q5_1, iq4_nl, bf16) each round differently; this file pins what llama.cpp computes for each.
#
# What it does:
#   1. compiles dump_fa.cpp (beside this script) against an existing llama.cpp build ($BUILD) and
#      its source tree ($LLAMA); the build must be the CPU-only one with GGML_NATIVE=OFF and
#      AVX/AVX2/FMA/F16C/BMI2 (no AVX-512), made as in scripts/arch-fixtures/make.sh step 3:
#      Lamina replicates that build's arithmetic;
#   2. runs every case below on each model: the first N tokens of ../shared/reference/areopagitica.txt
#      (llama_tokenize, add_special on, parse_special off) in one llama_decode (ubatches of 512),
#      logits at every prompt position, then single-token greedy decode steps;
#      a case llama.cpp refuses (context creation fails) is dropped, with a message;
#   3. checks determinism: cases fa-f16-p100 and fa-f16-p300-t2 are run a second time and must give
#      identical hashes; prints which rows differ between fa-f16-p300-t1 and fa-f16-p300-t2;
#   4. writes $OUT (python3): {"llama_cpp", "hash", "text", "cases": [...]}, one case per model and
#      setting, each row as an FNV-1a 64 hash of its float32 logits plus its 5 highest logits.
#
# Not run by CI. Needs: bash, python3, g++ (C++17), an x86-64 CPU with AVX2, the llama.cpp build
# and source named below, the two GGUF models in $MODELS. About a minute on 2 cores.
#
# Usage: scripts/fa-reference/make.sh
#   env: BUILD  (default /tmp/lcp/build-avx2: holds bin/libllama.so, libggml*.so)
#        LLAMA  (default /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp: llama.cpp 0c1e570 source)
#        MODELS (default ~/.cache/lamina/models)  WORK (default /tmp/lamina-fa-reference)
#        OUT    (default crates/model/tests/data/fa_reference.json)
#        TEXT   (default <workspace>/../shared/reference/areopagitica.txt)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
BUILD="${BUILD:-/tmp/lcp/build-avx2}"
LLAMA="${LLAMA:-/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp}"
MODELS="${MODELS:-$HOME/.cache/lamina/models}"
WORK="${WORK:-/tmp/lamina-fa-reference}"
OUT="${OUT:-$ROOT/crates/model/tests/data/fa_reference.json}"
TEXT="${TEXT:-$ROOT/../shared/reference/areopagitica.txt}"

log() { printf '\n== %s\n' "$*" >&2; }

for f in "$BUILD/bin/libllama.so" "$LLAMA/include/llama.h" "$TEXT" \
         "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" "$MODELS/gemma-3-270m-q4_k_m.gguf"; do
    [ -e "$f" ] || { echo "missing: $f" >&2; exit 1; }
done
mkdir -p "$WORK" "$(dirname "$OUT")"

# 1. dumper
DUMPER="$WORK/dump_fa"
if [ ! -x "$DUMPER" ] || [ "$HERE/dump_fa.cpp" -nt "$DUMPER" ] || [ "$BUILD/bin/libllama.so" -nt "$DUMPER" ]; then
    log "compile dump_fa"
    nice -n 19 g++ -O2 -std=c++17 "$HERE/dump_fa.cpp" \
        -I"$LLAMA/include" -I"$LLAMA/ggml/include" \
        -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin" -o "$DUMPER"
fi

# 2.-4. cases, determinism checks, assembly
log "cases -> $OUT"
python3 - "$DUMPER" "$MODELS" "$TEXT" "$OUT" <<'EOF'
import json, os, subprocess, sys

dumper, models_dir, text, out = sys.argv[1:5]

MODELS = [
    ("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
]

# name, flash_attn, type_k, type_v, n_threads, n_prompt, n_decode   (all: n_ctx 1024, n_ubatch 512)
CASES = [
    ("fa-f16-p100",       True,  "f16",  "f16", 2, 100, 8),  # tiled FA path (>= 64 rows); decode n_kv 256
    ("fa-f16-p20",        True,  "f16",  "f16", 2,  20, 8),  # per-row FA path
    ("fa-f16-p300-t2",    True,  "f16",  "f16", 2, 300, 4),  # decode n_kv 512: split-KV path
    ("fa-f16-p300-t1",    True,  "f16",  "f16", 1, 300, 4),  # the same, one thread
]
for t in ["q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "bf16"]:
    CASES.append((f"fa-{t}-p70", True, t, t, 2, 70, 6))
CASES += [
    ("fa-kq8_0-vf16-p20",   True,  "q8_0", "f16", 2,  20, 6),
    ("nofa-kq8_0-vf16-p20", False, "q8_0", "f16", 2,  20, 6),  # quantized K without FA
    ("nofa-f16-p100",       False, "f16",  "f16", 2, 100, 8),  # standard path, a control
    ("nofa-bf16-p70",       False, "bf16", "bf16", 2, 70, 6),  # bf16 cache without FA (tinyBLAS bf16)
]
N_CTX, N_UBATCH = 1024, 512


def run(model_file, fa, tk, tv, nt, npr, nd):
    cmd = [dumper, os.path.join(models_dir, model_file), "--fa", "1" if fa else "0",
           "--ctk", tk, "--ctv", tv, "--threads", str(nt), "--ctx", str(N_CTX),
           "--ubatch", str(N_UBATCH), "--prompt-file", text, "--n-prompt", str(npr), "--n-decode", str(nd)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode == 3:  # context creation refused
        return None, p.stderr
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr}")
    r = json.loads(p.stdout)
    assert len(r["prompt"]) == npr and len(r["prompt_logits"]) == npr
    assert len(r["decode"]) == nd and len(r["decode_logits"]) == nd
    return r, p.stderr


def hashes(r):
    return [x["hash"] for x in r["prompt_logits"]], [x["hash"] for x in r["decode_logits"]]


cases, dropped, results = [], [], {}
for model, model_file in MODELS:
    for name, fa, tk, tv, nt, npr, nd in CASES:
        r, err = run(model_file, fa, tk, tv, nt, npr, nd)
        if r is None:
            print(f"  {model:13s} {name:20s} DROPPED: llama.cpp refused the context\n{err}", file=sys.stderr)
            dropped.append((model, name))
            continue
        results[(model, name)] = (r, (model_file, fa, tk, tv, nt, npr, nd))
        cases.append({
            "name": name, "model": model, "flash_attn": fa, "type_k": tk, "type_v": tv,
            "n_threads": nt, "n_ctx": N_CTX, "n_ubatch": N_UBATCH,
            "prompt": r["prompt"], "decode": r["decode"],
            "prompt_logits": r["prompt_logits"], "decode_logits": r["decode_logits"],
        })
        print(f"  {model:13s} {name:20s} {npr:3d}+{nd} rows, decode {r['decode']}", file=sys.stderr)

# determinism: the same case twice gives the same bits
print("\n  determinism:", file=sys.stderr)
for model, _ in MODELS:
    for name in ["fa-f16-p100", "fa-f16-p300-t2"]:
        if (model, name) not in results:
            continue
        r, args = results[(model, name)]
        r2, _ = run(*args)
        same = hashes(r) == hashes(r2) and r["decode"] == r2["decode"]
        print(f"  {model:13s} {name:20s} rerun identical: {same}", file=sys.stderr)
        if not same:
            sys.exit("llama.cpp is not deterministic for this case")
    # thread count: prompt rows are expected equal, decode rows (split-KV chunks) not
    if (model, "fa-f16-p300-t1") in results and (model, "fa-f16-p300-t2") in results:
        p1, d1 = hashes(results[(model, "fa-f16-p300-t1")][0])
        p2, d2 = hashes(results[(model, "fa-f16-p300-t2")][0])
        np_ = sum(a != b for a, b in zip(p1, p2))
        nd_ = sum(a != b for a, b in zip(d1, d2))
        print(f"  {model:13s} p300 t1 vs t2: {np_} of {len(p1)} prompt rows differ, "
              f"{nd_} of {len(d1)} decode rows differ", file=sys.stderr)

doc = {
    "llama_cpp": "0c1e570, CPU, AVX2 build (GGML_NATIVE=OFF, AVX2/FMA/F16C)",
    "hash": "fnv1a64 over the little-endian f32 logits of a row",
    "text": "first N tokens of ../shared/reference/areopagitica.txt",
    "cases": cases,
}
# one row per line keeps the file readable and its diffs small
with open(out, "w") as fh:
    fh.write("{\n")
    for k in ["llama_cpp", "hash", "text"]:
        fh.write(f"  {json.dumps(k)}: {json.dumps(doc[k])},\n")
    fh.write('  "cases": [\n')
    for i, c in enumerate(cases):
        fh.write("    {\n")
        keys = list(c)
        for k in keys:
            v = c[k]
            end = "," if k != keys[-1] else ""
            if k in ("prompt_logits", "decode_logits"):
                fh.write(f"      {json.dumps(k)}: [\n")
                for j, row in enumerate(v):
                    fh.write(f"        {json.dumps(row)}{',' if j + 1 < len(v) else ''}\n")
                fh.write(f"      ]{end}\n")
            else:
                fh.write(f"      {json.dumps(k)}: {json.dumps(v)}{end}\n")
        fh.write("    }" + ("," if i + 1 < len(cases) else "") + "\n")
    fh.write("  ]\n}\n")
assert json.load(open(out)) == json.loads(json.dumps(doc))
print(f"\n  {len(cases)} cases written, {len(dropped)} dropped {dropped}", file=sys.stderr)
EOF

log "done"
ls -l "$OUT"
