#!/usr/bin/env bash
# Makes the importance-matrix reference files of crates/tools/tests/data with llama.cpp's own
# llama-imatrix (commit 0c1e570, the llama-cpp-python 0.3.36 source package, CPU build with
# -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON, the x86 build Lamina follows;
# a native AVX-512 build sums differently and its perplexity here is 154.6 and 61.2, not 150.4
# and 59.96).
#
#   LLAMA_IMATRIX=/path/to/build-avx2/bin/llama-imatrix scripts/imatrix-reference/make.sh
#
# SmolLM2-135M-Instruct Q4_1 and Gemma 3 270M Q4_K_M on the first 2,600 bytes of Areopagitica
# (../shared/reference/areopagitica-short.txt), 2 chunks of -c 128, 2 threads, flash attention
# off (Lamina's attention path is llama.cpp's standard one). The text is passed by the relative
# path below from the workspace root, so the file's imatrix.datasets entry is that string; a
# Lamina run from the same directory with the same arguments writes the same bytes.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${LLAMA_IMATRIX:-/tmp/lcp/build-avx2/bin/llama-imatrix}
MODELS=${LAMINA_CACHE:-$HOME/.cache/lamina}/models
TEXT=../shared/reference/areopagitica-short.txt
OUT=crates/tools/tests/data
ARGS=(-f "$TEXT" -c 128 --chunks 2 -t 2 -fa off)
S=(-m "$MODELS/SmolLM2-135M-Instruct.Q4_1.gguf" "${ARGS[@]}")
"$BIN" "${S[@]}" -o "$OUT/smollm2-imatrix-c128.gguf" > /dev/null 2>&1
"$BIN" "${S[@]}" -o "$OUT/smollm2-imatrix-c128.dat" --output-format dat > /dev/null 2>&1
"$BIN" -m "$MODELS/gemma-3-270m-q4_k_m.gguf" "${ARGS[@]}" -o "$OUT/gemma3-imatrix-c128.gguf" > /dev/null 2>&1
sha256sum "$OUT"/*-imatrix-c128.*
