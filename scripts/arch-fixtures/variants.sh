#!/usr/bin/env bash
# Rope-scaling variants of the fixtures and llama.cpp's logits for them, written to
# crates/model/tests/archs/variants.json. Each variant is a fixture with some metadata keys set
# (variant.py); the tensors are unchanged, so the test (crates/model/tests/archs.rs) makes the
# same file in memory instead of committing it. Needs the dumper that make.sh builds:
#   DUMPER=/path/to/dump_logits scripts/arch-fixtures/variants.sh
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
SHARED="$ROOT/../shared/archs"
LOCAL="$ROOT/crates/model/tests/archs"
DUMPER="${DUMPER:?set DUMPER to the dump_logits binary make.sh built}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

# name | base (shared: or local:) | key=type:value ...
VARIANTS=(
  "qwen3-yarn|shared:qwen3-dense.gguf|qwen3.rope.scaling.type=str:yarn qwen3.rope.scaling.factor=f32:4.0 qwen3.rope.scaling.original_context_length=u32:64"
  "deepseek2-yarn|shared:deepseek2-moe.gguf|deepseek2.rope.scaling.type=str:yarn deepseek2.rope.scaling.factor=f32:4.0 deepseek2.rope.scaling.original_context_length=u32:64 deepseek2.rope.scaling.yarn_log_multiplier=f32:0.0707"
  "gpt-oss-yarn|shared:gpt-oss-moe.gguf|gpt-oss.rope.scaling.type=str:yarn gpt-oss.rope.scaling.factor=f32:8.0 gpt-oss.rope.scaling.original_context_length=u32:32"
  "phi3-long|shared:phi3-dense.gguf|phi3.rope.scaling.original_context_length=u32:64"
  "llama-linear|shared:llama-dense.gguf|llama.rope.scaling.factor=f32:2.0"
  "gemma3-global|shared:gemma3-dense.gguf|gemma3.attention.sliding_window=u32:0 gemma3.final_logit_softcapping=f32:30.0"
  "mistral3-yarn|local:mistral3-dense.gguf|mistral3.rope.scaling.type=str:yarn mistral3.rope.scaling.factor=f32:4.0 mistral3.rope.scaling.original_context_length=u32:64 mistral3.rope.scaling.yarn_beta_fast=f32:16.0 mistral3.rope.scaling.yarn_log_multiplier=f32:1.0"
)

python3 - "$DUMPER" "$SHARED" "$LOCAL" "$TMP" "$HERE/variant.py" "${VARIANTS[@]}" <<'PY' > "$LOCAL/variants.json"
import json, subprocess, sys
dumper, shared, local, tmp, variant_py, *variants = sys.argv[1:]
out = {"settings": "llama.cpp 0c1e570 (llama-cpp-python 0.3.36 sdist), CPU AVX2 build, n_ctx 256, "
                    "f16 KV, flash attention off, the 24 tokens in one batch", "variants": []}
for v in variants:
    name, base, edits = v.split("|")
    where, file = base.split(":")
    src = f"{shared if where == 'shared' else local}/{file}"
    dst = f"{tmp}/{name}.gguf"
    subprocess.run(["python3", variant_py, src, dst, *edits.split()], check=True)
    r = json.loads(subprocess.run([dumper, dst], check=True, capture_output=True, text=True).stdout)
    out["tokens"] = r["tokens"]
    sets = {}
    for e in edits.split():
        k, tv = e.split("=", 1)
        t, val = tv.split(":", 1)
        sets[k] = [t, val]
    out["variants"].append({"name": name, "base": base, "set": sets, "logits": r["logits"]})
print(json.dumps(out))
PY
echo "wrote $LOCAL/variants.json" >&2
