#!/usr/bin/env python3
"""Generates crates/core/tests/data/quant_vectors.bin: reference vectors for lamina-core's quant
module, produced by the `gguf` Python package (`pip install gguf`; gguf.quants mirrors ggml).

Run from anywhere:  python3 crates/core/tests/data/gen_quant_vectors.py
The output is deterministic for a given gguf version (the seed is fixed).

File layout (all little-endian):
    magic  b"LQV1"
    u32    record count
    records, each:
        u32  kind       0 = dequantize (bytes -> f32), 1 = quantize (f32 -> bytes)
        u32  ggml type id
        u32  element count n
        u32  byte count m
        m bytes   quantized row
        n f32     dequantized row (kind 0: expected output; kind 1: input)
"""

import struct
import sys
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGML_QUANT_SIZES
from gguf import quants

OUT = Path(__file__).resolve().parent / "quant_vectors.bin"
rng = np.random.default_rng(20241130)

# Byte offsets of the f16 fields (scales, mins) inside each block, from ggml-common.h.
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
    T.IQ4_NL: [0],
    T.IQ4_XS: [0],
}

DEQUANT_TYPES = [T.F16, T.BF16, *F16_FIELDS.keys()]
QUANT_TYPES = [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0]


def f16_scales(count: int) -> np.ndarray:
    """Finite f16 scale values over many magnitudes and both signs, with the awkward ones."""
    mag = 10.0 ** rng.uniform(-7.0, 2.0, count)
    vals = (mag * rng.choice([-1.0, 1.0], count)).astype(np.float16)
    special = np.array([0.0, -0.0, 6.0e-8, 6.1e-5, 65504.0, -65504.0, 1.0, -1.0], dtype=np.float16)
    k = min(len(special), count // 4)
    vals[rng.choice(count, k, replace=False)] = special[:k]
    return vals


def random_blocks(qtype: T, n_elems: int) -> np.ndarray:
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = n_elems // block_size
    raw = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    for off in F16_FIELDS[qtype]:
        raw[:, off : off + 2] = f16_scales(n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw.reshape(-1)


def float_row(n: int, block: int) -> np.ndarray:
    """Inputs for the quantizers: a different regime per block (ordinary, tiny, huge, constant,
    all zero, one outlier, exact halves that test rounding)."""
    x = np.empty(n, dtype=np.float32)
    for b in range(n // block):
        s = slice(b * block, (b + 1) * block)
        kind = b % 7
        if kind == 0:
            x[s] = rng.normal(0.0, 1.0, block)
        elif kind == 1:
            x[s] = rng.normal(0.0, 1e-3, block)
        elif kind == 2:
            x[s] = rng.normal(0.0, 300.0, block)
        elif kind == 3:
            x[s] = np.float32(rng.normal())
        elif kind == 4:
            x[s] = 0.0
        elif kind == 5:
            x[s] = rng.normal(0.0, 0.01, block)
            x[b * block + rng.integers(block)] = -5.0
        else:
            x[s] = rng.integers(-16, 17, block) * 0.5
    return x


def records():
    for qtype in DEQUANT_TYPES:
        n = 1024
        if qtype == T.F16:
            data = (rng.normal(0, 1, n) * 10.0 ** rng.uniform(-9, 4, n)).astype(np.float16).view(np.uint8)
        elif qtype == T.BF16:
            data = (rng.normal(0, 1, n) * 10.0 ** rng.uniform(-30, 30, n)).astype(np.float32)
            data = (data.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
        else:
            data = random_blocks(qtype, n)
        out = quants.dequantize(data, qtype).astype(np.float32).reshape(-1)
        assert out.size == n
        yield 0, qtype, data, out

    for qtype in QUANT_TYPES:
        n = 32 * 7 * 4
        block = GGML_QUANT_SIZES[qtype][0]
        x = float_row(n, 32 if block == 1 else block)
        if qtype == T.BF16:
            # bf16 rounding: halfway cases both ways, and an overflow to infinity.
            x[:4] = np.array([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF], dtype=np.uint32).view(np.float32)
        data = quants.quantize(x, qtype).view(np.uint8).reshape(-1)
        yield 1, qtype, data, x


def main() -> int:
    recs = list(records())
    with open(OUT, "wb") as f:
        f.write(b"LQV1")
        f.write(struct.pack("<I", len(recs)))
        for kind, qtype, data, floats in recs:
            f.write(struct.pack("<IIII", kind, int(qtype), floats.size, data.size))
            f.write(data.tobytes())
            f.write(floats.astype("<f4").tobytes())
    print(f"wrote {len(recs)} records, {OUT.stat().st_size} bytes to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
