#!/usr/bin/env python3
"""Generates crates/core/tests/data/ggml_0c1e570_iq_vectors.bin: reference vectors for the grid
i-quants IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S and IQ1_M, from llama.cpp 0c1e570 (the
same sources, oracles and file layout as gen_ggml_0c1e570_vectors.py, whose helpers this
imports):

  * kind 0: gguf-py (the sdist's) dequantizes random blocks;
  * kind 3: ggml's C `dequantize_row_iq*` on the same blocks;
  * kind 2: `ggml_vec_dot_iq*_q8_K_generic` (gcc -O2 -ffp-contract=off);
  * kind 4: the x86 `ggml_vec_dot_iq*_q8_K` (arch/x86/quants.c, gcc -O3 -march=haswell) on
    activations from x86's `quantize_row_q8_K`;
  * kind 1: `quantize_iq3_xxs` / `quantize_iq3_s` / `quantize_iq2_s` / `quantize_iq1_m`
    without importance weights (floats: the row);
  * kind 5: `quantize_iq*` with importance weights (floats: the row, then one weight per
    element: 2n floats).

Quantizer records come from ggml-quants.c built as ggml-base is (gcc -O3, no -march: x86-64
has no FMA, so nothing is contracted); the script checks that the -ffp-contract=off build gives
the same bytes, and, with LLAMA_CPP_BUILD=<a llama.cpp build dir>, that its bin/libggml-base.so
(what llama-quantize runs) does too.

Run:  python3 crates/core/tests/data/gen_ggml_0c1e570_iq_vectors.py   (needs pip, gcc, numpy)
"""

import ctypes
import os
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_ggml_0c1e570_vectors as base  # noqa: E402

OUT = Path(__file__).resolve().parent / "ggml_0c1e570_iq_vectors.bin"

base.TYPES.update({
    16: ("iq2_xxs", 256, 66, [0]),
    17: ("iq2_xs", 256, 74, [0]),
    18: ("iq3_xxs", 256, 98, [0]),
    19: ("iq1_s", 256, 50, [0]),
    21: ("iq3_s", 256, 110, [0]),
    22: ("iq2_s", 256, 82, [0]),
    29: ("iq1_m", 256, 56, []),
})
IQ_TYPES = [16, 17, 22, 18, 21, 19, 29]
for t in IQ_TYPES:
    base.DOT_TYPE[t] = 15
# Quantizers in the order of priority; IQ2_XXS, IQ2_XS and IQ1_S need importance weights
# (IQ3_XXS, IQ3_S, IQ2_S and IQ1_M also quantize without).
QUANT_TYPES = [21, 16, 18, 17, 22, 19, 29]
NEED_WEIGHTS = {16, 17, 19}


def iq1_m_blocks(rng, n: int) -> bytes:
    """Random IQ1_M blocks with a sane f16 super-block scale in the scale words' top nibbles."""
    nb = n // 256
    raw = rng.integers(0, 256, size=(nb, 56), dtype=np.uint8)
    d = base.f16_scales(rng, nb).view(np.uint16)
    for b in range(nb):
        sc = raw[b, 48:56].view(np.uint16).copy()
        for k in range(4):
            sc[k] = (sc[k] & 0x0FFF) | (((int(d[b]) >> (4 * k)) & 0xF) << 12)
        raw[b, 48:56] = sc.view(np.uint8)
    return raw.reshape(-1).tobytes()


def blocks(rng, type_id: int, n: int) -> bytes:
    return iq1_m_blocks(rng, n) if type_id == 29 else base.random_blocks(rng, type_id, n)


def quantize_iq(so, type_id: int, x: np.ndarray, qw) -> bytes:
    name, block, size, _ = base.TYPES[type_id]
    out = ctypes.create_string_buffer(len(x) // block * size)
    fn = getattr(so, f"quantize_{name}")
    fn.restype = ctypes.c_size_t
    wp = None if qw is None else qw.ctypes.data_as(ctypes.c_void_p)
    fn(x.ctypes.data_as(ctypes.c_void_p), out, ctypes.c_int64(1), ctypes.c_int64(len(x)), wp)
    return out.raw


def init_tables(so):
    # ggml_quantize_init: iq2xs_init_impl for IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M;
    # iq3xs_init_impl(256) for IQ3_XXS, (512) for IQ3_S.
    for t in (16, 17, 22, 19, 29):
        so.iq2xs_init_impl(ctypes.c_int(t))
    so.iq3xs_init_impl(ctypes.c_int(256))
    so.iq3xs_init_impl(ctypes.c_int(512))


def weights(rng, x: np.ndarray, k: int) -> np.ndarray:
    """Importance weights: random positive, imatrix-like (x^2 times a random positive column
    weight), or with zeros mixed in."""
    n = len(x)
    if k == 0:
        w = rng.uniform(0.01, 4.0, n)
    elif k == 1:
        w = rng.uniform(0.1, 2.0, n) * (x.astype(np.float64) ** 2 + 1e-3)
    else:
        w = rng.uniform(0.0, 1.0, n)
        w[rng.random(n) < 0.2] = 0.0
    return w.astype(np.float32)


def main() -> int:
    rng = np.random.default_rng(0x1C0A)
    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = base.llama_cpp_source(work)
        sys.path.insert(0, str(src / "gguf-py"))
        from gguf import GGMLQuantizationType as T  # noqa: E402  (the sdist's gguf-py)
        from gguf import quants  # noqa: E402

        assert Path(quants.__file__).is_relative_to(src), quants.__file__
        gen, x86 = base.build_oracles(src, work)
        real = None
        if os.environ.get("LLAMA_CPP_BUILD"):
            real = ctypes.CDLL(str(Path(os.environ["LLAMA_CPP_BUILD"]) / "bin" / "libggml-base.so"))
        for so in (gen, x86, real):
            if so is not None:
                init_tables(so)

        for type_id in IQ_TYPES:
            n = 1024
            data = blocks(rng, type_id, n)
            out = quants.dequantize(np.frombuffer(data, dtype=np.uint8), T(type_id)).astype(np.float32).reshape(-1)
            recs.append((0, type_id, n, data, out))
            recs.append((3, type_id, n, data, base.dequantize(gen, type_id, data, n)))

        ys = [base.test_quantize_fns_data(1.0, 512), base.varied(rng, 1024), base.varied(rng, 2048)]
        for type_id in IQ_TYPES:
            for y in ys:
                n = len(y)
                for _ in range(2):
                    wx = blocks(rng, type_id, n)
                    qy = base.quantize(gen, 15, y)
                    r = base.vec_dot(gen, type_id, n, wx, qy, "_generic")
                    recs.append((2, type_id, n, wx + qy, np.array([r], dtype=np.float32)))
                    qy = base.quantize(x86, 15, y, "")
                    r = base.vec_dot(x86, type_id, n, wx, qy, "")
                    recs.append((4, type_id, n, wx + qy, np.array([r], dtype=np.float32)))

        qrng = np.random.default_rng(0x1C0B)
        rows = [base.test_quantize_fns_data(0.0, 512), base.varied(qrng, 1024),
                qrng.normal(0, 1, 2048).astype(np.float32)]
        mismatch = 0
        for type_id in QUANT_TYPES:
            if not hasattr(x86, f"quantize_{base.TYPES[type_id][0]}"):
                continue
            for i, x in enumerate(rows):
                variants = [weights(qrng, x, i % 3)]
                if type_id not in NEED_WEIGHTS:
                    variants.append(None)
                for qw in variants:
                    q = quantize_iq(x86, type_id, x, qw)
                    for so in (gen, real):
                        if so is not None and quantize_iq(so, type_id, x, qw) != q:
                            mismatch += 1
                            print(f"quantize_{base.TYPES[type_id][0]}: builds differ", file=sys.stderr)
                    if qw is None:
                        recs.append((1, type_id, len(x), q, x))
                    else:
                        recs.append((5, type_id, len(x), q, np.concatenate([x, qw])))
        print(f"quantizer builds that differ: {mismatch}")
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
