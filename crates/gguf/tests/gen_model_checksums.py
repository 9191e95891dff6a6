#!/usr/bin/env python3
"""Writes crates/gguf/tests/model_checksums.txt: for each test model (their sha256 pins their
content) and each tensor type in it, the first tensor of that type
dequantized by the `gguf` Python package, hashed (FNV-1a 64 over the little-endian f32 bytes of
its first 65536 elements). tests/dequantize_models.rs recomputes these with lamina-core's dequantizers.

Run:  python3 crates/gguf/tests/gen_model_checksums.py [MODEL_DIR]   (default ~/.cache/lamina/models)
"""

import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader, quants

MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
LIMIT = 65536
OUT = Path(__file__).resolve().parent / "model_checksums.txt"


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def main() -> int:
    model_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path.home() / ".cache/lamina/models"
    lines = ["# model tensor type elements_hashed fnv1a64(f32 le bytes)"]
    for name, file_name in MODELS.items():
        reader = GGUFReader(model_dir / file_name)
        done = set()
        for t in reader.tensors:
            if t.tensor_type in done:
                continue
            done.add(t.tensor_type)
            values = quants.dequantize(t.data, t.tensor_type).astype("<f4").reshape(-1)[:LIMIT]
            lines.append(f"{name} {t.name} {t.tensor_type.name} {values.size} {fnv1a64(values.tobytes()):016x}")
    OUT.write_text("\n".join(lines) + "\n")
    print(OUT.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
