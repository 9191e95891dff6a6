#!/usr/bin/env python3
"""Adds llama-perplexity's results on the quantized test models to
crates/cli/tests/data/quantize_reference.json (key "perplexity"): each model requantized by
llama-quantize to each type below, then `llama-perplexity -f areopagitica-short.txt -c 128 -t 2
-fa off` (its standard attention path, as ../shared/reference is made). `lamina quantize` writes the
same files (the sha256 recorded here; the i-quant files are checked only here, so each is made
once in the tests), and `lamina perplexity` must give the same final estimate
(crates/cli/tests/quantize.rs).

`-kvu` (one KV cache for all sequences, as Lamina has): llama-perplexity's default is a cache
stream per sequence, and there its result for the fifth 128-token chunk of a Q4_K_M model
changes with the micro-batch size (SmolLM2: 64.7848 at the default -ub 512 and at 256, 64.8207
at -ub 128, 64.8093 at 64, 320 or 384; chunks 1-4 never change), while with -kvu it is 64.8093
at every -ub, as in Lamina. The other types give the same result both ways.

Use llama.cpp built for AVX2 (cmake -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON):
Lamina's CPU kernels give that build's bits on every ISA; a native build on an AVX-512 machine
runs other kernels (SmolLM2 on this text: 60.2106 there, 59.9963 with AVX2 and in Lamina).

Run after make.py:  LLAMA_BIN=/tmp/lcp/build-avx2/bin python3 scripts/quantize-reference/perplexity.py
"""

import hashlib
import json
import os
import re
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/cli/tests/data/quantize_reference.json"
BIN = Path(os.environ.get("LLAMA_BIN", "/tmp/lcp/build-avx2/bin"))
CACHE = Path(os.environ.get("LAMINA_CACHE", Path.home() / ".cache/lamina")) / "models"
TEXT = ROOT.parent / "shared/reference/areopagitica-short.txt"
MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
}
TYPES = ["Q4_0", "Q8_0", "Q4_K_M", "Q6_K", "IQ4_XS", "TQ2_0", "IQ3_S", "IQ2_XXS"]
# IQ2_XXS needs an importance matrix: each model's own (scripts/imatrix-reference/make.sh),
# by its path from the repository root, as the test passes it.
IMATRIX = {
    "smollm2-135m": "crates/tools/tests/data/smollm2-imatrix-c128.gguf",
    "gemma3-270m": "crates/tools/tests/data/gemma3-imatrix-c128.gguf",
}
NEEDS_IMATRIX = {"IQ2_XXS"}


def main():
    ref = json.loads(OUT.read_text())
    # Results already recorded are kept (set FRESH=1 to redo them).
    old = [] if os.environ.get("FRESH") else ref.get("perplexity", {}).get("results", [])
    done = {(r["model"], r["type"]) for r in old}
    results = list(old)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "q.gguf"
        for model, file in MODELS.items():
            for qtype in TYPES:
                if (model, qtype) in done:
                    continue
                im = ["--imatrix", IMATRIX[model]] if qtype in NEEDS_IMATRIX else []
                subprocess.run([str(BIN / "llama-quantize"), "--allow-requantize", *im,
                                str(CACHE / file), str(out), qtype, "2"],
                               check=True, capture_output=True, cwd=ROOT)
                p = subprocess.run([str(BIN / "llama-perplexity"), "-m", str(out), "-f", str(TEXT),
                                    "-c", "128", "-t", "2", "-fa", "off", "-kvu"],
                                   check=True, capture_output=True, text=True)
                m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", p.stdout + p.stderr)
                r = {"model": model, "type": qtype, "ppl": m.group(1), "err": m.group(2),
                     "sha256": hashlib.sha256(out.read_bytes()).hexdigest()}
                if im:
                    r["imatrix"] = im[1]
                results.append(r)
                print(model, qtype, m.group(1), m.group(2), flush=True)
    ref["perplexity"] = {
        "tool": "llama-perplexity -f ../shared/reference/areopagitica-short.txt -c 128 -t 2 -fa off -kvu",
        "results": results,
    }
    OUT.write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
