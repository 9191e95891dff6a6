#!/usr/bin/env python3
"""Adds llama-perplexity's results on the quantized test models to
crates/cli/tests/data/quantize_reference.json (key "perplexity"): each model requantized by
llama-quantize to each type below, then `llama-perplexity -f areopagitica-short.txt -c 128 -t 2
-fa off` (its standard attention path, as ../shared/reference is made). `lamina quantize` writes the
same files (the hashes of make.py), and `lamina perplexity` must give the same final estimate
(crates/cli/tests/quantize.rs).

Use llama.cpp built for AVX2 (cmake -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON):
Lamina's CPU kernels give that build's bits on every ISA; a native build on an AVX-512 machine
runs other kernels (SmolLM2 on this text: 60.2106 there, 59.9963 with AVX2 and in Lamina).

Run after make.py:  LLAMA_BIN=/tmp/lcp/build-avx2/bin python3 scripts/quantize-reference/perplexity.py
"""

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
TYPES = ["Q4_0", "Q8_0", "Q4_K_M", "Q6_K", "IQ4_XS", "TQ2_0"]


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
                subprocess.run([str(BIN / "llama-quantize"), "--allow-requantize",
                                str(CACHE / file), str(out), qtype, "2"],
                               check=True, capture_output=True)
                p = subprocess.run([str(BIN / "llama-perplexity"), "-m", str(out), "-f", str(TEXT),
                                    "-c", "128", "-t", "2", "-fa", "off"],
                                   check=True, capture_output=True, text=True)
                m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", p.stdout + p.stderr)
                results.append({"model": model, "type": qtype, "ppl": m.group(1), "err": m.group(2)})
                print(model, qtype, m.group(1), m.group(2), flush=True)
    ref["perplexity"] = {
        "tool": "llama-perplexity -f ../shared/reference/areopagitica-short.txt -c 128 -t 2 -fa off",
        "results": results,
    }
    OUT.write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
