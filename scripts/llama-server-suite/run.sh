#!/usr/bin/env bash
# llama.cpp's own server test suite (tools/server/tests of llama.cpp 0c1e570, as vendored in the
# llama-cpp-python 0.3.36 source package), run against llama-server and against `lamina serve`,
# with the suite's Hugging Face models replaced by our local ones (utils.patch).
#
#   scripts/llama-server-suite/run.sh [--only lamina|llama] [--files "test_a.py test_b.py"]
#
# Both halves (the default) also record what llama-server passes in llama-server-passes.txt;
# `--only lamina` (what CI runs: no llama.cpp build) compares Lamina against that record.
#
# Environment:
#   LLAMA_SRC      llama.cpp source tree (default: the llama-cpp-python 0.3.36 source package,
#                  fetched from PyPI into $SUITE_WORK by fetch_llama_src.py)
#   LLAMA_SERVER   a llama-server binary (default: built from LLAMA_SRC with cmake into $SUITE_WORK)
#   LAMINA         the lamina binary (default: target/release/lamina, built if missing)
#   SUITE_WORK     work folder (default: $TMPDIR/lamina-llama-server-suite-UID, outside any git
#                  checkout: the suite's grep tool honours .gitignore)
#   MODEL_DEFAULT / MODEL_GEMMA3   the models (default: pulled by lamina into its cache)
# Prints the table of passes per test file; results land in $SUITE_WORK/results/.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
# Outside the repository: the suite's grep tool honours .gitignore, and target/ is ignored.
work=${SUITE_WORK:-${TMPDIR:-/tmp}/lamina-llama-server-suite-$(id -u)}
only=""
files=""
while [ $# -gt 0 ]; do
    case "$1" in
        --only) only=$2; shift 2 ;;
        --files) files=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$work/results"
rm -f "$work/results"/*.xml

lamina=${LAMINA:-$root/target/release/lamina}
if [ ! -x "$lamina" ]; then (cd "$root" && cargo build --release -p lamina-cli); fi
model_default=${MODEL_DEFAULT:-$("$lamina" pull smollm2-135m | sed "s/^[^:]*: //")}
model_gemma=${MODEL_GEMMA3:-$("$lamina" pull gemma3-270m | sed "s/^[^:]*: //")}

if [ -z "${LLAMA_SRC:-}" ]; then
    LLAMA_SRC=$(python3 "$here/fetch_llama_src.py" "$work/src")
fi

if [ "$only" != "lamina" ] && [ -z "${LLAMA_SERVER:-}" ]; then
    if [ ! -x "$work/llama-build/bin/llama-server" ]; then
        cmake -S "$LLAMA_SRC" -B "$work/llama-build" -DCMAKE_BUILD_TYPE=Release \
            -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
        cmake --build "$work/llama-build" --target llama-server -j"$(nproc)" >/dev/null
    fi
    LLAMA_SERVER=$work/llama-build/bin/llama-server
fi

# The suite, patched, where its relative paths (../../../models/templates, ../../../tools)
# still reach llama.cpp's tree; and the Python packages it asks for.
rm -rf "$work/tree"
mkdir -p "$work/tree/tools/server"
ln -s "$LLAMA_SRC/models" "$work/tree/models"
ln -s "$LLAMA_SRC/tools/mtmd" "$work/tree/tools/mtmd"
cp -r "$LLAMA_SRC/tools/server/tests" "$work/tree/tools/server/tests"
tests=$work/tree/tools/server/tests
mkdir -p "$tests/tmp"
(cd "$tests" && git apply -p1 "$here/utils.patch")
if [ ! -x "$work/venv/bin/pytest" ]; then
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install -q -r "$tests/requirements.txt"
fi

# `lamina serve` takes llama-server's command line; the suite starts it through this shim.
cat > "$work/lamina-server" <<SHIM
#!/bin/sh
exec "$lamina" serve "\$@"
SHIM
chmod +x "$work/lamina-server"

[ -n "$files" ] || files=$(cd "$tests/unit" && ls test_*.py)
run_one() { # server-name binary port
    local name=$1 bin=$2 port=$3 f
    for f in $files; do
        (cd "$tests" && PORT=$port SUITE_MODEL_DEFAULT=$model_default SUITE_MODEL_GEMMA3=$model_gemma \
            LLAMA_SERVER_BIN_PATH=$bin LLAMA_CACHE=$work/hf-cache \
            timeout 1800 "$work/venv/bin/pytest" -q -m "not slow" -p no:cacheprovider \
            --junitxml="$work/results/$name-$f.xml" "unit/$f" > "$work/results/$name-$f.log" 2>&1) || true
        echo "$name $f: $(tail -1 "$work/results/$name-$f.log")"
    done
}
# Each half on its own port, so that both may run at once.
[ "$only" = "lamina" ] || run_one llama "$LLAMA_SERVER" "${SUITE_PORT_LLAMA:-28080}"
[ "$only" = "llama" ] || run_one lamina "$work/lamina-server" "${SUITE_PORT_LAMINA:-18080}"
record=""
[ -n "$only" ] || record="--record"
python3 "$here/table.py" "$work/results" "$here/expected-failures.txt" "$here/llama-server-passes.txt" $record
