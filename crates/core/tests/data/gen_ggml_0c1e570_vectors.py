#!/usr/bin/env python3
"""Generates crates/core/tests/data/ggml_0c1e570_vectors.bin: reference vectors for the tensor
types that the older ggml behind gen_ggml_vectors.py (ggml-python 0.0.45) and the installed
`gguf` package lack or predate: TQ1_0, TQ2_0, NVFP4, Q1_0 and Q2_0. (ggml_vectors.bin and
quant_vectors.bin stay as their generators make them.)

Everything comes from llama.cpp 0c1e570 as vendored by the `llama-cpp-python==0.3.36` sdist
(`pip download --no-binary llama-cpp-python llama-cpp-python==0.3.36`, or LLAMA_CPP_SRC=<the
vendored llama.cpp directory> to use a copy already unpacked):

  * its gguf-py (imported from the sdist, not the installed package) dequantizes random blocks
    of the types gguf-py knows (kind 0);
  * ggml/src/ggml-quants.c and ggml/src/ggml-cpu/quants.c, compiled with gcc -O2
    -ffp-contract=off (the portable arithmetic, no FMA contraction), give `dequantize_row_*`
    (kind 3), `quantize_row_*_ref` (kind 1) and the `ggml_vec_dot_*_generic` kernels (kind 2);
  * ggml/src/ggml-cpu/arch/x86/quants.c and ggml-cpu/quants.c compiled as llama.cpp's CPU
    backend is for an AVX2 machine (gcc -O3 -march=haswell, GCC's default contraction; with
    ggml-quants.c built without -march as in ggml-base) give the x86 `ggml_vec_dot_*` that
    llama.cpp runs, on activations quantized by its x86 `quantize_row_q8_K`/`q8_0` (kind 4,
    for lamina-cpu's kernels).

Run:  python3 crates/core/tests/data/gen_ggml_0c1e570_vectors.py   (needs pip, gcc, numpy)

File layout (little-endian) as ggml_vectors.bin: magic b"LQG1", u32 record count, then records:
    u32 kind   0 = dequantize by gguf-py, 1 = quantize (f32 -> bytes), 2 = generic dot product,
               3 = dequantize by ggml's C, 4 = x86 AVX2 dot product
    u32 ggml type id (for dots: the weight type)
    u32 n      element count
    u32 m      byte count
    m bytes    kinds 0, 1, 3: the quantized row; kinds 2, 4: x row then y row (y in the
               vec_dot type)
    kinds 0, 1, 3: n f32 (the dequantized row, or for kind 1 the input row); kinds 2, 4: 1 f32
"""

import ctypes
import os
import struct
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

SDIST = "llama-cpp-python==0.3.36"
OUT = Path(__file__).resolve().parent / "ggml_0c1e570_vectors.bin"

# ggml type id -> (name, block size, type size, byte offsets of f16 scales)
TYPES = {
    8: ("q8_0", 32, 34, [0]),
    15: ("q8_K", 256, 292, []),
    34: ("tq1_0", 256, 54, [52]),
    35: ("tq2_0", 256, 66, [64]),
    40: ("nvfp4", 64, 36, []),
    41: ("q1_0", 128, 18, [0]),
    42: ("q2_0", 64, 18, [0]),
}
# The types this file covers, and each one's vec_dot type (ggml-cpu type_traits_cpu).
NEW_TYPES = [34, 35, 40, 41, 42]
DOT_TYPE = {34: 15, 35: 15, 40: 8, 41: 8, 42: 8}
# x86's ggml_vec_dot_* for these: AVX2 kernels in arch/x86/quants.c, except Q2_0's, which is the
# generic code renamed by arch-fallback.h (and so compiled -O3 -march=haswell).
X86_DOT = [34, 35, 40, 41, 42]

STUBS = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
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
float ggml_table_f32_e8m0_half[1 << 8];
static float e8m0_half(uint8_t x) { /* ggml_e8m0_to_fp32_half */
    uint32_t b = x < 2 ? 0x00200000u << x : (uint32_t)(x - 1) << 23; float f; memcpy(&f, &b, 4); return f;
}
float ggml_table_f32_ue4m3[1 << 8];
static float ue4m3(uint8_t x) { /* ggml_ue4m3_to_fp32 */
    if (x == 0 || x == 0x7F) return 0.0f;
    int exp = (x >> 3) & 0xF, man = x & 0x7;
    float raw = exp == 0 ? ldexpf((float) man, -9) : ldexpf(1.0f + (float) man / 8.0f, exp - 7);
    return raw * 0.5f;
}
void oracle_init(void) {
    for (int i = 0; i < (1 << 8); i++) ggml_table_f32_ue4m3[i] = ue4m3((uint8_t)i);
    for (int i = 0; i < (1 << 16); i++) ggml_table_f32_f16[i] = h2f((uint16_t)i);
    for (int i = 0; i < (1 << 8); i++) ggml_table_f32_e8m0_half[i] = e8m0_half((uint8_t)i);
}
void ggml_abort(const char * file, int line, const char * fmt, ...) { fprintf(stderr, "ggml_abort %s:%d\n", file, line); abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
const char * ggml_type_name(int type) { (void)type; return "?"; }
size_t ggml_type_size(int type) { (void)type; abort(); }
"""


def llama_cpp_source(work: Path) -> Path:
    if os.environ.get("LLAMA_CPP_SRC"):
        return Path(os.environ["LLAMA_CPP_SRC"])
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
         "--no-binary", "llama-cpp-python", SDIST, "-d", str(work)],
        check=False,
    )
    sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tf:
        tf.extractall(work, filter="data")
    return next(work.glob("llama_cpp_python-*/")) / "vendor" / "llama.cpp"


def build_oracles(src: Path, work: Path):
    g = src / "ggml"
    (work / "stubs.c").write_text(STUBS)
    inc = [f"-I{g}/include", f"-I{g}/src", f"-I{g}/src/ggml-cpu"]
    generic = work / "generic.so"
    subprocess.run(
        ["gcc", "-O2", "-fPIC", "-shared", "-ffp-contract=off", *inc,
         str(g / "src" / "ggml-quants.c"), str(g / "src" / "ggml-cpu" / "quants.c"),
         str(work / "stubs.c"), "-o", str(generic), "-lm", "-Wl,-z,defs"],
        check=True,
    )
    # ggml-base (ggml-quants.c) without -march; ggml-cpu with -march=haswell, -O3.
    base_o = work / "ggml-quants.o"
    subprocess.run(["gcc", "-O3", "-fPIC", "-c", *inc, str(g / "src" / "ggml-quants.c"), "-o", str(base_o)], check=True)
    objs = [str(base_o)]
    for f in ["ggml-cpu/quants.c", "ggml-cpu/arch/x86/quants.c"]:
        o = work / (f.replace("/", "_") + ".o")
        subprocess.run(["gcc", "-O3", "-fPIC", "-march=haswell", "-c", *inc, str(g / "src" / f), "-o", str(o)], check=True)
        objs.append(str(o))
    x86 = work / "x86.so"
    subprocess.run(["gcc", "-shared", "-fPIC", *objs, str(work / "stubs.c"), "-o", str(x86), "-lm", "-Wl,-z,defs"], check=True)
    out = []
    for lib in (generic, x86):
        so = ctypes.CDLL(str(lib))
        so.oracle_init()
        out.append(so)
    return out


def quantize(so, type_id: int, x: np.ndarray, cpu_variant: str = "_generic") -> bytes:
    name, block, size, _ = TYPES[type_id]
    out = ctypes.create_string_buffer(len(x) // block * size)
    xp = x.ctypes.data_as(ctypes.c_void_p)
    if type_id in (8, 15):  # activation quantizers as ggml-cpu runs them
        fn = getattr(so, f"quantize_row_{name}{cpu_variant}")
    else:
        fn = getattr(so, f"quantize_row_{name}_ref")
    fn(xp, out, ctypes.c_int64(len(x)))
    return out.raw


def dequantize(so, type_id: int, data: bytes, n: int) -> np.ndarray:
    y = np.zeros(n, dtype=np.float32)
    fn = getattr(so, f"dequantize_row_{TYPES[type_id][0]}")
    fn(data, y.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
    return y


def vec_dot(so, type_id: int, n: int, qx: bytes, qy: bytes, suffix: str) -> float:
    name = TYPES[type_id][0]
    dname = TYPES[DOT_TYPE[type_id]][0]
    # On x86, arch-fallback.h renames the generic kernels that have no x86 version.
    fn = getattr(so, f"ggml_vec_dot_{name}_{dname}{suffix}", None) or getattr(so, f"ggml_vec_dot_{name}_{dname}")
    s = ctypes.c_float(np.inf)
    fn(ctypes.c_int(n), ctypes.byref(s), ctypes.c_size_t(0), qx, ctypes.c_size_t(0), qy, ctypes.c_size_t(0), ctypes.c_int(1))
    return s.value


def f16_scales(rng, count: int) -> np.ndarray:
    mag = 10.0 ** rng.uniform(-7.0, 2.0, count)
    vals = (mag * rng.choice([-1.0, 1.0], count)).astype(np.float16)
    special = np.array([0.0, -0.0, 6.0e-8, 6.1e-5, 65504.0, -65504.0, 1.0, -1.0], dtype=np.float16)
    k = min(len(special), count // 4)
    vals[rng.choice(count, k, replace=False)] = special[:k]
    return vals


def random_blocks(rng, type_id: int, n: int) -> bytes:
    _, block, size, f16s = TYPES[type_id]
    nb = n // block
    raw = rng.integers(0, 256, size=(nb, size), dtype=np.uint8)
    for off in f16s:
        raw[:, off : off + 2] = f16_scales(rng, nb).view(np.uint8).reshape(nb, 2)
    return raw.reshape(-1).tobytes()


def test_quantize_fns_data(offset: float, n: int) -> np.ndarray:
    i = np.arange(n, dtype=np.float32)
    c = np.cos((i + np.float32(offset)).astype(np.float32)).astype(np.float32)
    return (0.1 + (np.float32(2.0) * c).astype(np.float64)).astype(np.float32)


def varied(rng, n: int) -> np.ndarray:
    """A different regime every 32 elements: ordinary, tiny, huge, offset, constant, zero,
    one outlier, exact halves (ternary rounding ties), and exact thirds of the block max."""
    x = np.empty(n, dtype=np.float32)
    for b in range(n // 32):
        s = slice(32 * b, 32 * b + 32)
        k = rng.integers(9)
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
        elif k == 7:
            x[s] = rng.integers(-16, 17, 32) * 0.5
        else:
            x[s] = rng.integers(-2, 3, 32) * np.float32(0.75)
    return x


def main() -> int:
    rng = np.random.default_rng(0xC1E570)
    recs = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = llama_cpp_source(work)
        sys.path.insert(0, str(src / "gguf-py"))
        from gguf import GGMLQuantizationType as T  # noqa: E402  (the sdist's gguf-py)
        from gguf import quants  # noqa: E402

        assert Path(quants.__file__).is_relative_to(src), quants.__file__
        gen, x86 = build_oracles(src, work)

        # Dequantization of random blocks: gguf-py where it has the type, ggml's C for all.
        for type_id in NEW_TYPES:
            n = 1024
            data = random_blocks(rng, type_id, n)
            qt = T(type_id)
            if qt in quants._type_traits:
                out = quants.dequantize(np.frombuffer(data, dtype=np.uint8), qt).astype(np.float32).reshape(-1)
                recs.append((0, type_id, n, data, out))
            recs.append((3, type_id, n, data, dequantize(gen, type_id, data, n)))

        rows = [test_quantize_fns_data(0.0, 512), varied(rng, 1024), varied(rng, 2048)]
        ys = [test_quantize_fns_data(1.0, 512), varied(rng, 1024), varied(rng, 2048)]
        for type_id in NEW_TYPES:
            for x in rows:
                recs.append((1, type_id, len(x), quantize(gen, type_id, x), x))
        for type_id in NEW_TYPES:
            dot_id = DOT_TYPE[type_id]
            for x, y in zip(rows, ys):
                qx = quantize(gen, type_id, x)
                # Random weight bytes too (TQ2_0's level 3, TQ1_0's bytes above 242, odd scales).
                for wx in (qx, random_blocks(rng, type_id, len(x))):
                    qy = quantize(gen, dot_id, y)
                    r = vec_dot(gen, type_id, len(x), wx, qy, "_generic")
                    recs.append((2, type_id, len(x), wx + qy, np.array([r], dtype=np.float32)))
                    if type_id in X86_DOT:
                        qy = quantize(x86, dot_id, y, "")
                        r = vec_dot(x86, type_id, len(x), wx, qy, "")
                        recs.append((4, type_id, len(x), wx + qy, np.array([r], dtype=np.float32)))
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
