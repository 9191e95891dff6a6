#!/usr/bin/env python3
"""Generates crates/core/tests/data/ggml_vectors.bin: reference vectors from ggml's own C code,
for what the `gguf` Python package cannot check (K-quant, IQ4 and Q8_K/Q8_1 quantizers, and the
generic dot-product kernels).

It fetches ggml's sources from PyPI (`pip download ggml-python==0.0.45`, which vendors ggml),
compiles ggml/src/ggml-quants.c and ggml/src/ggml-cpu/quants.c with gcc into a small shared
library (with `-ffp-contract=off`, so no FMA contraction: the portable arithmetic), and calls
`quantize_row_*_ref`, `quantize_row_q8_*_generic` and `ggml_vec_dot_*_generic` through ctypes.

Run:  python3 crates/core/tests/data/gen_ggml_vectors.py   (needs pip, gcc, numpy)

File layout (little-endian): magic b"LQG1", u32 record count, then records:
    u32 kind   1 = quantize (f32 -> bytes), 2 = dot product
    u32 ggml type id (for dots: the weight type)
    u32 n      element count
    u32 m      byte count
    m bytes    kind 1: the quantized row; kind 2: x row then y row (y in the vec_dot type)
    kind 1: n f32 (the input row); kind 2: 1 f32 (ggml's result)
"""

import ctypes
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

GGML_PYTHON = "ggml-python==0.0.45"
OUT = Path(__file__).resolve().parent / "ggml_vectors.bin"

# ggml type id -> (name, block size, type size)
TYPES = {
    2: ("q4_0", 32, 18),
    3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22),
    7: ("q5_1", 32, 24),
    8: ("q8_0", 32, 34),
    9: ("q8_1", 32, 36),
    10: ("q2_K", 256, 84),
    11: ("q3_K", 256, 110),
    12: ("q4_K", 256, 144),
    13: ("q5_K", 256, 176),
    14: ("q6_K", 256, 210),
    15: ("q8_K", 256, 292),
    20: ("iq4_nl", 32, 18),
    23: ("iq4_xs", 256, 136),
}
# weight type -> its vec_dot type (ggml-cpu type_traits_cpu)
DOT_TYPE = {2: 8, 3: 9, 6: 8, 7: 9, 8: 8, 20: 8, 10: 15, 11: 15, 12: 15, 13: 15, 14: 15, 23: 15}

STUBS = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
float ggml_table_f32_f16[1 << 16];
static float h2f(uint16_t h) {
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, b;
    if (e == 0) {
        if (m == 0) { b = s; }
        else { e = 127 - 15 + 1; while (!(m & 0x400)) { m <<= 1; e--; } m &= 0x3ff; b = s | (e << 23) | (m << 13); }
    } else if (e == 31) { b = s | 0x7f800000 | (m << 13); }
    else { b = s | ((e + 127 - 15) << 23) | (m << 13); }
    float f; memcpy(&f, &b, 4); return f;
}
void oracle_init(void) { for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = h2f((uint16_t)i); }
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
const char * ggml_type_name(int type) { (void)type; return "?"; }
size_t ggml_type_size(int type) { (void)type; abort(); }
"""


def build_oracle(work: Path) -> ctypes.CDLL:
    subprocess.run(
        [sys.executable, "-m", "pip", "download", GGML_PYTHON, "--no-deps", "-d", str(work)],
        check=True,
    )
    sdist = next(work.glob("ggml_python-*.tar.gz"))
    with tarfile.open(sdist) as tf:
        tf.extractall(work, filter="data")
    ggml = next(work.glob("ggml_python-*")) / "vendor" / "ggml"
    (work / "stubs.c").write_text(STUBS)
    lib = work / "oracle.so"
    flags = ["-O2", "-fPIC", "-shared", "-ffp-contract=off", f"-I{ggml}/include", f"-I{ggml}/src", f"-I{ggml}/src/ggml-cpu"]
    srcs = [str(ggml / "src" / "ggml-quants.c"), str(ggml / "src" / "ggml-cpu" / "quants.c"), str(work / "stubs.c")]
    subprocess.run(["gcc", *flags, *srcs, "-o", str(lib), "-lm"], check=True)
    so = ctypes.CDLL(str(lib))
    so.oracle_init()
    return so


def quantize(so, type_id: int, x: np.ndarray) -> bytes:
    name, block, size = TYPES[type_id]
    out = ctypes.create_string_buffer(len(x) // block * size)
    xp = x.ctypes.data_as(ctypes.c_void_p)
    if type_id in (8, 9, 15):  # activation quantizers as ggml-cpu runs them
        fn = getattr(so, f"quantize_row_{name}_generic")
    elif type_id == 23:  # quantize_row_iq4_xs_ref needs ggml_row_size; call what it calls
        fn = so.quantize_iq4_xs
        fn.restype = ctypes.c_size_t
        fn(xp, out, ctypes.c_int64(1), ctypes.c_int64(len(x)), None)
        return out.raw
    else:
        fn = getattr(so, f"quantize_row_{name}_ref")
    fn(xp, out, ctypes.c_int64(len(x)))
    return out.raw


def vec_dot(so, type_id: int, n: int, qx: bytes, qy: bytes) -> float:
    name = TYPES[type_id][0]
    dname = TYPES[DOT_TYPE[type_id]][0]
    fn = getattr(so, f"ggml_vec_dot_{name}_{dname}_generic")
    s = ctypes.c_float(np.inf)
    fn(ctypes.c_int(n), ctypes.byref(s), ctypes.c_size_t(0), qx, ctypes.c_size_t(0), qy, ctypes.c_size_t(0), ctypes.c_int(1))
    return s.value


def test_quantize_fns_data(offset: float, n: int, amplitude: float = 2.0) -> np.ndarray:
    i = np.arange(n, dtype=np.float32)
    c = np.cos((i + np.float32(offset)).astype(np.float32)).astype(np.float32)
    return (0.1 + (np.float32(amplitude) * c).astype(np.float64)).astype(np.float32)


def varied(rng, n: int) -> np.ndarray:
    """A different regime every 32 elements: ordinary, tiny, huge, offset, constant, zero,
    one outlier, exact halves."""
    x = np.empty(n, dtype=np.float32)
    for b in range(n // 32):
        s = slice(32 * b, 32 * b + 32)
        k = rng.integers(8)
        if k == 0:
            x[s] = rng.normal(0, 1, 32)
        elif k == 1:
            x[s] = rng.normal(0, 1e-4, 32)
        elif k == 2:
            x[s] = rng.normal(0, 500, 32)
        elif k == 3:
            x[s] = rng.normal(3, 0.5, 32)
        elif k == 4:
            x[s] = np.float32(rng.normal())
        elif k == 5:
            x[s] = 0.0
        elif k == 6:
            x[s] = rng.normal(0, 0.01, 32)
            x[32 * b + rng.integers(32)] = 7.0
        else:
            x[s] = rng.integers(-16, 17, 32) * 0.5
    return x


def main() -> int:
    rng = np.random.default_rng(7)
    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        so = build_oracle(Path(tmp))
        rows = [
            test_quantize_fns_data(0.0, 512),
            varied(rng, 1024),
        ]
        ys = [test_quantize_fns_data(1.0, 512), varied(rng, 1024)]
        for type_id in TYPES:
            for x in rows:
                if type_id == 20:
                    # ggml-python 0.0.45 vendors a ggml whose IQ4_NL quantizer leaves an all-zero
                    # block's levels as the previous block's (upstream now zeroes them; the scale
                    # is 0 either way), so keep all-zero blocks out of its IQ4_NL input.
                    x = x.copy()
                    for b in range(len(x) // 32):
                        if not x[32 * b : 32 * b + 32].any():
                            x[32 * b : 32 * b + 32] = np.float32(1e-3)
                recs.append((1, type_id, len(x), quantize(so, type_id, x), x))
        for type_id, dot_id in DOT_TYPE.items():
            for x, y in zip(rows, ys):
                qx = quantize(so, type_id, x)
                qy = quantize(so, dot_id, y)
                r = vec_dot(so, type_id, len(x), qx, qy)
                recs.append((2, type_id, len(x), qx + qy, np.array([r], dtype=np.float32)))
    with open(OUT, "wb") as f:
        f.write(b"LQG1")
        f.write(struct.pack("<I", len(recs)))
        for kind, type_id, n, data, floats in recs:
            f.write(struct.pack("<IIII", kind, type_id, n, len(data)))
            f.write(data)
            f.write(np.asarray(floats, dtype="<f4").tobytes())
    print(f"wrote {len(recs)} records, {OUT.stat().st_size} bytes to {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
