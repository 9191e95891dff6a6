#!/usr/bin/env bash
# fa-reference.sh — regenerate crates/model/tests/archs/reference-logits-fa.json: llama.cpp's
# logits for every architecture fixture (../shared/archs/*.gguf and crates/model/tests/archs/*.gguf)
# with flash attention ON, the fixed 24-token batch of dump_logits.cpp, n_ctx 256, f16 KV, 2 threads.
#
# Needs the dumper built by make.sh against the AVX2 llama.cpp build (the one Lamina replicates):
# $DUMPER (default $WORK/dump_logits, WORK as in make.sh). Not run by CI; a few seconds.
# Usage: scripts/arch-fixtures/fa-reference.sh
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
WORK="${WORK:-/tmp/lamina-arch-fixtures}"
DUMPER="${DUMPER:-$WORK/dump_logits}"
SHARED="${SHARED:-$ROOT/../shared/archs}"
OUT="${OUT:-$ROOT/crates/model/tests/archs/reference-logits-fa.json}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

for f in "$SHARED"/*.gguf "$ROOT"/crates/model/tests/archs/*.gguf; do
    "$DUMPER" "$f" --fa 1 --threads 2 > "$TMP/$(basename "$f").json"
done

python3 - "$TMP" "$OUT" <<'PY'
import glob, json, os, sys
tmp, out = sys.argv[1], sys.argv[2]
ref = {"tokens": None,
       "settings": "llama.cpp 0c1e570 AVX2 CPU build (scripts/arch-fixtures/dump_logits.cpp --fa 1 "
                   "--threads 2): n_ctx 256, one batch of 24 tokens, f16 KV, flash attention ON; "
                   "logits at full float32 precision",
       "models": {}}
for f in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    d = json.load(open(f))
    if ref["tokens"] is None:
        ref["tokens"] = d["tokens"]
    assert ref["tokens"] == d["tokens"], f
    ref["models"][os.path.basename(f)[:-5]] = {"logits": d["logits"]}
json.dump(ref, open(out, "w"))
print(f"{out}: {len(ref['models'])} models")
PY
