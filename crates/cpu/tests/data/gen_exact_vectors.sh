#!/bin/sh
# Regenerates exact_vectors.bin, the llama.cpp outputs that tests/exact.rs holds lamina-cpu's
# `kernels` to bit for bit. Builds ggml (from the llama.cpp vendored in llama-cpp-python 0.3.36,
# the reference version) OUTSIDE the repository, the way the reference build compiled it:
# ggml-base without -march, ggml-cpu with AVX2/FMA/F16C (-march=haswell; the reference machine's
# -march=native had no AVX-512), GCC -O3, llamafile sgemm and CPU repack on. Then runs
# exact_harness.c, which writes the vectors.
#
# Usage: gen_exact_vectors.sh            (downloads the sdist with pip into a temp dir)
#        LLAMA_CPP_SRC=/path/to/llama.cpp gen_exact_vectors.sh
set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SRC=${LLAMA_CPP_SRC:-}
if [ -z "$SRC" ]; then
    python3 -m pip download --no-deps --no-build-isolation --no-binary llama-cpp-python \
        llama-cpp-python==0.3.36 -d "$WORK" >/dev/null 2>&1 || true
    TARBALL=$(ls "$WORK"/llama_cpp_python-0.3.36.tar.gz)
    tar xzf "$TARBALL" -C "$WORK"
    SRC="$WORK/llama_cpp_python-0.3.36/vendor/llama.cpp"
fi
G="$SRC/ggml/src"
mkdir -p "$WORK/gen" "$WORK/obj"
printf '#pragma once\n#define GGML_VERSION "0.25.3"\n#define GGML_COMMIT "0c1e570"\n' > "$WORK/gen/ggml-version.h"
DEFS="-DGGML_SCHED_MAX_COPIES=4 -DGGML_USE_CPU_REPACK -DGGML_USE_LLAMAFILE -DNDEBUG -D_GNU_SOURCE -D_XOPEN_SOURCE=600"
INC="-I$WORK/gen -I$G -I$G/ggml-cpu -I$SRC/ggml/include"
build() { # file, extra flags
    case "$1" in
        *.c) CC="gcc -std=gnu11" ;;
        *) CC="g++ -std=gnu++17" ;;
    esac
    $CC -O3 $DEFS $INC $2 -c "$G/$1" -o "$WORK/obj/$(echo "$1" | tr / _).o"
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
gcc -O2 -I"$SRC/ggml/include" "$HERE/exact_harness.c" "$WORK"/obj/*.o -lstdc++ -lm -lpthread \
    -o "$WORK/harness"
"$WORK/harness" "$HERE/exact_vectors.bin"
echo "wrote $HERE/exact_vectors.bin"
