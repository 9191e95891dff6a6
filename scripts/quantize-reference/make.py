#!/usr/bin/env python3
"""Makes crates/cli/tests/data/quantize_reference.json: the sha256 and size of what
llama-quantize writes for each case below, on the project's two test models, and the exit
status of the cases it refuses. `lamina quantize` must write the same bytes
(crates/cli/tests/quantize.rs).

llama-quantize comes from llama.cpp 0c1e570 as vendored by the llama-cpp-python 0.3.36 source
package. Build it once (about 10 minutes on 2 cores):

    pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    cmake -S /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp -B /tmp/lcp/build -DGGML_NATIVE=ON
    cmake --build /tmp/lcp/build --target llama-quantize -j2

Run:  LLAMA_QUANTIZE=/tmp/lcp/build/bin/llama-quantize python3 scripts/quantize-reference/make.py
(models from `lamina pull`, i.e. ~/.cache/lamina/models or $LAMINA_CACHE/models).
"""

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "crates/cli/tests/data/quantize_reference.json"
QUANTIZE = os.environ.get("LLAMA_QUANTIZE", "/tmp/lcp/build/bin/llama-quantize")
# llama-gguf-split (cmake --build /tmp/lcp/build --target llama-gguf-split) makes the split input.
GGUF_SPLIT = os.environ.get("LLAMA_GGUF_SPLIT", str(Path(QUANTIZE).parent / "llama-gguf-split"))
CACHE = Path(os.environ.get("LAMINA_CACHE", Path.home() / ".cache/lamina")) / "models"
MODELS = {
    "smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m": "gemma-3-270m-q4_k_m.gguf",
}

R = ["--allow-requantize"]
# (flags, type): every file type Lamina can write, then the options that change the choice.
CASES = [(R, t) for t in [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L",
    "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K", "IQ4_NL", "IQ4_XS", "F16", "BF16",
    "F32", "COPY", "MXFP4_MOE", "TQ1_0", "TQ2_0", "Q1_0", "Q2_0",
]] + [
    (R + ["--pure"], "Q4_K_M"),
    (R + ["--leave-output-tensor"], "Q6_K"),
    (R + ["--output-tensor-type", "q8_0", "--token-embedding-type", "q4_0"], "Q5_K_M"),
    (R + ["--tensor-type", "attn_v=q8_0", "--tensor-type", r"blk\.1\.ffn_.*=q5_1"], "Q4_0"),
    (R + ["--prune-layers", "3,5,1"], "Q8_0"),
    (R + ["--override-kv", "general.name=str:hello", "--override-kv", "foo.bar=int:-3",
          "--override-kv", "a.f=float:1.5", "--override-kv", "a.b=bool:false"], "Q4_0"),
    # Refused: requantizing without --allow-requantize; Q2_K_S without an importance matrix.
    ([], "Q4_0"),
    (R, "Q2_K_S"),
    (R, "IQ2_XXS"),
]
# With llama-imatrix's importance matrix of SmolLM2 (crates/tools/tests/data, made by
# scripts/imatrix-reference/make.sh), as a path relative to the repository root: llama-quantize
# records the path as given in quantize.imatrix.file.
IM = "crates/tools/tests/data/smollm2-imatrix-c128"
# The i-quant searches are slow: those cases keep two layers (--prune-layers), which also
# checks that the matrix is looked up by the tensors' original names.
def prune(n_layer):
    return ["--prune-layers", ",".join(str(i) for i in range(2, n_layer))]


SMOLLM2_CASES = [(R + ["--imatrix", IM + ".gguf"], t) for t in [
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q2_K_S", "Q3_K_M", "Q4_K_M", "Q5_K_S", "Q6_K",
    "IQ4_NL", "IQ4_XS", "Q8_0",
]] + [(R + ["--imatrix", IM + ".gguf"] + prune(30), t) for t in [
    "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ1_S", "IQ1_M",
]] + [
    (R + ["--imatrix", IM + ".dat"], "Q4_K_M"),
    (R + ["--imatrix", IM + ".gguf", "--include-weights", "ffn"], "Q4_K_M"),
    (R + ["--imatrix", IM + ".gguf", "--exclude-weights", "attn_v"], "Q4_K_M"),
]
# Gemma 3's own matrix (same text and arguments), the low-bit types on two layers (IQ2_XXS of
# the whole model is checked with its perplexity, perplexity.py).
IMG = "crates/tools/tests/data/gemma3-imatrix-c128.gguf"
GEMMA3_CASES = [
    (R + ["--imatrix", IMG] + prune(18), "IQ2_XXS"),
    (R + ["--imatrix", IMG] + prune(18), "IQ2_S"),
    (R + ["--imatrix", IMG] + prune(18), "IQ1_M"),
    (R + ["--imatrix", IMG], "Q4_K_M"),
    # IQ3 types need no importance matrix.
    (R + prune(18), "IQ3_S"),
    (R + prune(18), "IQ3_XXS"),
    (R + prune(18), "IQ3_M"),
    # SmolLM2's imatrix on Gemma 3: the sizes do not match, refused (Q4_0 requantizes every
    # tensor; Q4_K_M would keep most of them as they are and never look the matrix up).
    (R + ["--imatrix", IM + ".gguf"], "Q4_0"),
]


# Split models: SmolLM2 cut by llama-gguf-split into files of at most 100 tensors, quantized
# from its first file into one file, or with --keep-split into as many; and --keep-split of the
# one-file model (PREFIX-00001-of-00001.gguf). The test makes the same split files itself and
# checks them against "inputs" first.
SPLIT_MAX_TENSORS = 100
SPLIT_CASES = [
    ("split", R + ["--keep-split"], "Q4_0"),
    ("split", R, "Q4_K_M"),
    ("split", R + ["--keep-split", "--prune-layers", "0,29"], "Q8_0"),
    # COPY merges the splits into one file (what Lamina's loader asks for).
    ("split", [], "COPY"),
    ("one", R + ["--keep-split"], "Q4_K_M"),
]


def split_reference(tmp):
    model = CACHE / MODELS["smollm2-135m"]
    src = Path(tmp) / "split"
    subprocess.run([GGUF_SPLIT, "--split", "--split-max-tensors", str(SPLIT_MAX_TENSORS),
                    str(model), str(src)], check=True, capture_output=True)
    inputs = sorted(Path(tmp).glob("split-*-of-*.gguf"))
    ref = {
        "model": "smollm2-135m",
        "split_max_tensors": SPLIT_MAX_TENSORS,
        "inputs": [{"name": p.name, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                   for p in inputs],
        "cases": [],
    }
    for source, flags, qtype in SPLIT_CASES:
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        inp = inputs[0] if source == "split" else model
        p = subprocess.run([QUANTIZE, *flags, str(inp), str(out_dir / "q.gguf"), qtype, "2"],
                           capture_output=True, cwd=ROOT)
        outs = sorted(out_dir.iterdir())
        ref["cases"].append({
            "input": source, "args": flags + [qtype], "status": p.returncode,
            "outputs": [{"name": o.name, "sha256": hashlib.sha256(o.read_bytes()).hexdigest()}
                        for o in outs],
        })
        print("split", source, " ".join(flags + [qtype]), p.returncode, [o.name for o in outs])
        for o in outs:
            o.unlink()
        out_dir.rmdir()
    return ref


def main():
    # ONLY=--imatrix: recompute only the cases whose flags contain that (an argument, e.g. a
    # matrix's path), keep the others.
    only = os.environ.get("ONLY")
    old = {}
    if only and OUT.exists():
        for c in json.loads(OUT.read_text())["cases"]:
            old[(c["model"], tuple(c["args"]))] = c
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.gguf"
        for model, file in MODELS.items():
            path = CACHE / file
            if not path.exists():
                sys.exit(f"{path} is missing: run `lamina pull {model}`")
            extra = SMOLLM2_CASES if model == "smollm2-135m" else GEMMA3_CASES
            for flags, qtype in CASES + extra:
                key = (model, tuple(flags + [qtype]))
                if only and only not in flags and key in old:
                    cases.append(old[key])
                    continue
                out.unlink(missing_ok=True)
                p = subprocess.run([QUANTIZE, *flags, str(path), str(out), qtype, "2"],
                                   capture_output=True, cwd=ROOT)
                case = {"model": model, "args": flags + [qtype], "status": p.returncode}
                if p.returncode == 0:
                    data = out.read_bytes()
                    case["sha256"] = hashlib.sha256(data).hexdigest()
                    case["size"] = len(data)
                cases.append(case)
                print(model, " ".join(case["args"]), case["status"], case.get("sha256", "")[:16])
        split = split_reference(tmp)
    ref = {
        "generator": "scripts/quantize-reference/make.py (then perplexity.py)",
        "llama.cpp": "0c1e570 (llama-cpp-python 0.3.36 sdist), GGML_NATIVE=ON",
        "cases": cases,
        "split": split,
    }
    if OUT.exists() and "perplexity" in json.loads(OUT.read_text()):
        ref["perplexity"] = json.loads(OUT.read_text())["perplexity"]
    OUT.write_text(json.dumps(ref, indent=1) + "\n")


if __name__ == "__main__":
    main()
