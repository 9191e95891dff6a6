#!/bin/sh
# Regenerates ops_vectors.bin, the llama.cpp outputs that tests/ops_exact.rs holds the CPU
# backend's graph ops to bit for bit (mul_mat_id, argsort/top_k, the unary and GLU ops, softmax
# with sinks, the MoE routing chain, ...). Builds ggml exactly as gen_exact_vectors.sh does
# (OUTSIDE the repository; ggml-cpu with -march=haswell, GCC -O3, llamafile sgemm and CPU repack
# on), then runs ops_harness.c, which writes the vectors.
#
# Usage: gen_ops_vectors.sh            (downloads the sdist with pip into a temp dir)
#        LLAMA_CPP_SRC=/path/to/llama.cpp gen_ops_vectors.sh
#        GGML_OBJ=/dir/with/objects gen_ops_vectors.sh   (reuses objects built by an earlier run)
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
OBJ=${GGML_OBJ:-$WORK/obj}
SRC=${LLAMA_CPP_SRC:-}
if [ -z "$SRC" ]; then
    python3 -m pip download --no-deps --no-build-isolation --no-binary llama-cpp-python \
        llama-cpp-python==0.3.36 -d "$WORK" >/dev/null 2>&1 || true
    TARBALL=$(ls "$WORK"/llama_cpp_python-0.3.36.tar.gz)
    tar xzf "$TARBALL" -C "$WORK"
    SRC="$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp"
fi
G="$SRC/ggml/src"
mkdir -p "$WORK/gen" "$OBJ"
printf '#pragma once\n#define GGML_VERSION "0.25.3"\n#define GGML_COMMIT "0c1e570"\n' > "$WORK/gen/ggml-version.h"
DEFS="-DGGML_SCHED_MAX_COPIES=4 -DGGML_USE_CPU_REPACK -DGGML_USE_LLAMAFILE -DNDEBUG -D_GNU_SOURCE -D_XOPEN_SOURCE=600"
INC="-I$WORK/gen -I$G -I$G/ggml-cpu -I$SRC/ggml/include"
build() { # file, extra flags
    case "$1" in
        *.c) CC="gcc -std=gnu11" ;;
        *) CC="g++ -std=gnu++17" ;;
    esac
    o="$OBJ/$(echo "$1" | tr / _).o"
    [ -f "$o" ] || $CC -O3 $DEFS $INC $2 -c "$G/$1" -o "$o"
}
for f in ggml.c ggml.cpp ggml-alloc.c ggml-backend.cpp ggml-backend-meta.cpp ggml-opt.cpp \
    ggml-threading.cpp ggml-quants.c gguf.cpp; do
    build "$f" "" &
done
wait
for f in ggml-cpu/ggml-cpu.c ggml-cpu/ggml-cpu.cpp ggml-cpu/repack.cpp ggml-cpu/hbm.cpp \
    ggml-cpu/quants.c ggml-cpu/traits.cpp ggml-cpu/amx/amx.cpp ggml-cpu/amx/mmq.cpp \
    ggml-cpu/tiled/tiled.cpp ggml-cpu/tiled/tiled-kernel.cpp ggml-cpu/binary-ops.cpp \
    ggml-cpu/unary-ops.cpp ggml-cpu/vec.cpp ggml-cpu/ops.cpp ggml-cpu/llamafile/sgemm.cpp \
    ggml-cpu/arch/x86/quants.c ggml-cpu/arch/x86/repack.cpp; do
    build "$f" "-march=haswell" &
done
wait
gcc -O2 -I"$SRC/ggml/include" "$HERE/ops_harness.c" "$OBJ"/*.o -lstdc++ -lm -lpthread \
    -o "$WORK/harness"
"$WORK/harness" "$HERE/ops_vectors.bin"
echo "wrote $HERE/ops_vectors.bin"
