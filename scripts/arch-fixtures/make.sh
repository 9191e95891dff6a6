#!/usr/bin/env bash
# make.sh — regenerate the random-weight architecture fixtures in crates/model/tests/archs/
#
# What it does, from scratch (every step is skipped when its result is already there, so the
# script can be re-run; the fixtures themselves are always regenerated):
#   1. a Python venv in $WORK with scikit-build-core, cmake and ninja (from PyPI);
#   2. `pip download` of the llama-cpp-python 0.3.36 sdist (it vendors llama.cpp commit 0c1e570);
#      with scikit-build-core installed and --no-build-isolation, pip can prepare the metadata and
#      saves the tarball (without it, the download fails at metadata generation); sha256 checked;
#   3. a CPU-only Release build of llama.cpp with GGML_NATIVE=OFF and AVX/AVX2/FMA/F16C/BMI2 on:
#      that is the build that reproduces ../shared/archs/reference-logits.json exactly (a native
#      AVX-512 build differs by ~1e-7 in most logits and by up to ~1e-5 in the GELU models, where
#      ggml's f16 GELU lookup table amplifies last-bit differences); targets: llama, test-llama-archs;
#   4. the logits dumper dump_logits.cpp (beside this script) against that build;
#   5. `test-llama-archs -a <arch> -s $SEED -o <dir>` for each fixture architecture, keeping the
#      files listed in FIXTURES (test-llama-archs names them <arch>-dense.gguf / <arch>-moe.gguf);
#   6. if ../shared/archs exists: checks that the dumper reproduces its reference-logits.json
#      (which holds numpy float32 values rounded to 6 decimals) exactly after the same rounding;
#   7. the logits of the fixed 24-token batch for each fixture -> $OUT/reference-logits.json,
#      in the format of ../shared/archs/reference-logits.json, values at full float32 precision;
#   8. optionally ($DUMPS set): a text dump of every graph node (name, op, type, shape, sources,
#      first and last 8 values, sum) for each fixture and each ../shared/archs model, to $DUMPS/<file>.txt.
#
# The dumper settings: CPU only, n_ctx 256, n_batch = n_ubatch = 256, f16 K/V cache, flash attention
# off, the 24 tokens in one llama_decode at positions 0..23 of sequence 0, logits at every position.
# Weights: std::mt19937/std::normal_distribution (libstdc++) seeded by $SEED ^ hash(tensor name).
#
# Not run by CI. Needs: bash, python3 (with venv), gcc/g++ >= 12, an x86-64 CPU with AVX2, network
# access to PyPI. About 6 minutes of build on 2 cores.
#
# Usage: scripts/arch-fixtures/make.sh
#   env: WORK (default /tmp/lamina-arch-fixtures)  OUT (default crates/model/tests/archs)
#        JOBS (default 2)  SEED (default 42)  DUMPS (default unset: no tensor dumps)
#        SHARED (default <workspace>/../shared/archs)  SKIP_SHARED_CHECK=1 to skip step 6
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${WORK:-/tmp/lamina-arch-fixtures}"
OUT="${OUT:-$ROOT/crates/model/tests/archs}"
JOBS="${JOBS:-2}"
SEED="${SEED:-42}"
DUMPS="${DUMPS:-}"
SHARED="${SHARED:-$ROOT/../shared/archs}"

LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
LLAMA_COMMIT=0c1e570

# architecture (as test-llama-archs -a takes it) : file it writes that we keep
FIXTURES=(
    "qwen3moe:qwen3moe-moe.gguf"
    "llama:llama-moe.gguf"
    "mistral3:mistral3-dense.gguf"
    "gemma2:gemma2-dense.gguf"
    "olmo2:olmo2-dense.gguf"
    "starcoder2:starcoder2-dense.gguf"
)

SETTINGS="llama.cpp $LLAMA_COMMIT via llama-cpp-python $LCP_VERSION, CPU, n_ctx 256, f16 KV, flash attention off, one batch; ggml-cpu built with GGML_NATIVE=OFF + AVX/AVX2/FMA/F16C/BMI2 (no AVX-512); models from test-llama-archs -s $SEED; logits at full float32 precision"

log() { printf '\n== %s\n' "$*" >&2; }

mkdir -p "$WORK" "$OUT"
WORK="$(cd "$WORK" && pwd)"

# 1. tools
if [ ! -x "$WORK/venv/bin/cmake" ] || [ ! -x "$WORK/venv/bin/ninja" ]; then
    log "venv with scikit-build-core, cmake, ninja"
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install --quiet scikit-build-core cmake ninja
fi
export PATH="$WORK/venv/bin:$PATH"

# 2. source
TARBALL="$WORK/llama_cpp_python-$LCP_VERSION.tar.gz"
if [ ! -f "$TARBALL" ]; then
    log "pip download llama-cpp-python==$LCP_VERSION (sdist)"
    "$WORK/venv/bin/pip" download --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-python==$LCP_VERSION" -d "$WORK"
fi
echo "$LCP_SHA256  $TARBALL" | sha256sum -c -
SRC="$WORK/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp"
if [ ! -f "$SRC/tests/test-llama-archs.cpp" ]; then
    log "unpack"
    tar -xzf "$TARBALL" -C "$WORK"
fi

# 3. build
BUILD="$WORK/build"
log "configure + build llama.cpp ($BUILD)"
nice -n 19 cmake -S "$SRC" -B "$BUILD" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
    -DGGML_AVX512=OFF -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_COMMIT="$LLAMA_COMMIT" >/dev/null
nice -n 19 ninja -C "$BUILD" -j "$JOBS" llama test-llama-archs

# 4. dumper
DUMPER="$WORK/dump_logits"
if [ ! -x "$DUMPER" ] || [ "$HERE/dump_logits.cpp" -nt "$DUMPER" ] || [ "$BUILD/bin/libllama.so" -nt "$DUMPER" ]; then
    log "compile dump_logits"
    nice -n 19 g++ -O2 -std=c++17 "$HERE/dump_logits.cpp" \
        -I"$SRC/include" -I"$SRC/ggml/include" \
        -L"$BUILD/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$BUILD/bin" -o "$DUMPER"
fi

# 5. models
GEN="$WORK/gen"
rm -rf "$GEN"
mkdir -p "$GEN"
declare -A seen=()
for entry in "${FIXTURES[@]}"; do
    arch="${entry%%:*}"
    if [ -z "${seen[$arch]:-}" ]; then
        log "test-llama-archs -a $arch -s $SEED"
        "$BUILD/bin/test-llama-archs" -a "$arch" -s "$SEED" -o "$GEN"
        seen[$arch]=1
    fi
done
FILES=()
for entry in "${FIXTURES[@]}"; do
    f="${entry#*:}"
    [ -f "$GEN/$f" ] || { echo "test-llama-archs did not write $f" >&2; exit 1; }
    cp "$GEN/$f" "$OUT/$f"
    FILES+=("$f")
done

# 6. the dumper must reproduce the shared reference
if [ -z "${SKIP_SHARED_CHECK:-}" ] && [ -f "$SHARED/reference-logits.json" ]; then
    log "check against $SHARED/reference-logits.json"
    python3 - "$DUMPER" "$SHARED" <<'EOF'
import json, os, struct, subprocess, sys
dumper, shared = sys.argv[1], sys.argv[2]
f32 = lambda x: struct.unpack('f', struct.pack('f', x))[0]
E6 = f32(1e6)
def np_round6_f32(x):  # what numpy's np.round(float32_array, 6) computes
    return f32(round(f32(x * E6)) / E6)
ref = json.load(open(os.path.join(shared, 'reference-logits.json')))
bad = 0
for name, v in ref['models'].items():
    out = json.loads(subprocess.run([dumper, os.path.join(shared, name)], check=True,
                                    capture_output=True, text=True).stdout)
    got = [[f32(x) for x in row] for row in out['logits']]
    n = sum(1 for gr, rr in zip(got, v['logits']) for g, r in zip(gr, rr) if np_round6_f32(g) != f32(r))
    mad = max(abs(g - r) for gr, rr in zip(got, v['logits']) for g, r in zip(gr, rr))
    print(f"  {name:22s} {n} of {sum(map(len, got))} differ after rounding; max |diff| unrounded {mad:.3g}")
    bad += n
if bad:
    sys.exit("the dumper does not reproduce the shared reference (build flags? CPU?)")
EOF
fi

# 7. reference logits
log "reference logits -> $OUT/reference-logits.json"
python3 - "$DUMPER" "$OUT" "$SETTINGS" "${FILES[@]}" <<'EOF'
import json, os, struct, subprocess, sys
dumper, out, settings, files = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
f32 = lambda x: struct.unpack('f', struct.pack('f', x))[0]
tokens, models = None, {}
for name in files:
    r = json.loads(subprocess.run([dumper, os.path.join(out, name)], check=True,
                                  capture_output=True, text=True).stdout)
    assert tokens is None or tokens == r['tokens']
    tokens = r['tokens']
    assert len(r['logits']) == len(tokens) and all(len(row) == r['n_vocab'] for row in r['logits'])
    models[name] = {'logits': [[f32(x) for x in row] for row in r['logits']]}
    print(f"  {name}: {len(r['logits'])} x {r['n_vocab']}")
with open(os.path.join(out, 'reference-logits.json'), 'w') as fh:
    json.dump({'tokens': tokens, 'settings': settings, 'models': models}, fh)
    fh.write('\n')
EOF

# 8. intermediate tensors (debugging aid, not committed)
if [ -n "$DUMPS" ]; then
    mkdir -p "$DUMPS"
    log "tensor dumps -> $DUMPS"
    for f in "$OUT"/*.gguf "$SHARED"/*.gguf; do
        [ -f "$f" ] || continue
        "$DUMPER" "$f" --dump "$DUMPS/$(basename "$f").txt" >/dev/null
        echo "  $DUMPS/$(basename "$f").txt"
    done
fi

log "done"
ls -l "$OUT"
