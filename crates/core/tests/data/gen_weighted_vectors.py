#!/usr/bin/env python3
"""Generates crates/core/tests/data/weighted_vectors.bin: what ggml's tensor quantizers
(`quantize_<type>(src, dst, nrow, n_per_row, quant_weights)`, the functions
`ggml_quantize_chunk` and so llama-quantize call) write, with importance weights and without.

ggml comes from the llama-cpp-python 0.3.36 source package (llama.cpp 0c1e570; set
LLAMA_CPP_SRC to a vendored llama.cpp to skip the download). ggml-quants.c is compiled as
llama.cpp compiles ggml-base: gcc -O3 without -march, so on x86-64 there is no FMA to
contract into, and the arithmetic is the one llama-quantize runs.

Run:  python3 crates/core/tests/data/gen_weighted_vectors.py   (needs pip, gcc, numpy)

File layout (little-endian): magic b"LQW1", u32 record count, then records:
    u32 ggml type id, u32 nrow, u32 n_per_row, u32 has_weights,
    nrow*n_per_row f32 (the rows), n_per_row f32 if has_weights (the importance, per column),
    u32 m, m bytes (the quantized rows).
"""

import ctypes
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_ggml_0c1e570_vectors as g0  # noqa: E402

OUT = Path(__file__).resolve().parent / "weighted_vectors.bin"

# id -> (name, block size, type size)
TYPES = {
    2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20), 6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24),
    10: ("q2_K", 256, 84), 11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144),
    13: ("q5_K", 256, 176), 14: ("q6_K", 256, 210), 20: ("iq4_nl", 32, 18),
    23: ("iq4_xs", 256, 136),
}

ROW_SIZE = "size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }"


def stubs() -> str:
    table = " ".join(f"case {t}: return ne / {b} * {s};" for t, (_, b, s) in TYPES.items())
    assert ROW_SIZE in g0.STUBS
    return g0.STUBS.replace(
        ROW_SIZE,
        f"size_t ggml_row_size(int type, int64_t ne) {{ switch (type) {{ {table} }} abort(); }}",
    )


def build(src: Path, work: Path):
    g = src / "ggml"
    (work / "stubs.c").write_text(stubs())
    inc = [f"-I{g}/include", f"-I{g}/src", f"-I{g}/src/ggml-cpu"]
    lib = work / "base.so"
    subprocess.run(
        ["gcc", "-O3", "-fPIC", "-shared", *inc, str(g / "src" / "ggml-quants.c"),
         str(work / "stubs.c"), "-o", str(lib), "-lm", "-Wl,-z,defs"],
        check=True,
    )
    so = ctypes.CDLL(str(lib))
    so.oracle_init()
    return so


def quantize(so, type_id, x, nrow, n, w):
    name, block, size = TYPES[type_id]
    out = ctypes.create_string_buffer(nrow * n // block * size)
    fn = getattr(so, f"quantize_{name}")
    fn.restype = ctypes.c_size_t
    wp = w.ctypes.data_as(ctypes.c_void_p) if w is not None else None
    got = fn(x.ctypes.data_as(ctypes.c_void_p), out, ctypes.c_int64(nrow), ctypes.c_int64(n), wp)
    assert got == len(out.raw), (name, got, len(out.raw))
    return out.raw


def rows(rng, kind, nrow, n):
    if kind == 0:  # weight-like: gaussian with a few outliers
        x = rng.normal(0, 0.02, (nrow, n)).astype(np.float32)
        idx = rng.choice(nrow * n, max(1, nrow * n // 200), replace=False)
        x.reshape(-1)[idx] *= 20
    elif kind == 1:  # mixed scales per block of 32, zeros and an all-zero block
        x = (rng.normal(0, 1, (nrow, n)) * 10.0 ** rng.uniform(-4, 1, (nrow, n // 32, 1)).repeat(32, 2).reshape(nrow, n)).astype(np.float32)
        x[0, :32] = 0
        x[:, 40:44] = 0
    else:  # all positive, all negative halves
        x = np.abs(rng.normal(0, 1, (nrow, n))).astype(np.float32)
        x[:, n // 2:] *= -1
    return np.ascontiguousarray(x)


def main() -> int:
    rng = np.random.default_rng(20261201)
    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        so = build(g0.llama_cpp_source(work), work)
        for type_id in TYPES:
            for kind in range(3):
                nrow, n = 3, 512
                x = rows(rng, kind, nrow, n)
                w = (rng.gamma(0.6, 1.0, n) * 10.0 ** rng.uniform(-3, 3)).astype(np.float32)
                if kind == 2:
                    w[:7] = 0  # columns never seen
                for weights in (w, None):
                    q = quantize(so, type_id, x, nrow, n, weights)
                    recs.append((type_id, nrow, n, x, weights, q))
    with open(OUT, "wb") as f:
        f.write(b"LQW1" + struct.pack("<I", len(recs)))
        for type_id, nrow, n, x, w, q in recs:
            f.write(struct.pack("<IIII", type_id, nrow, n, int(w is not None)))
            f.write(x.astype("<f4").tobytes())
            if w is not None:
                f.write(w.astype("<f4").tobytes())
            f.write(struct.pack("<I", len(q)) + q)
    print(f"{len(recs)} records -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
