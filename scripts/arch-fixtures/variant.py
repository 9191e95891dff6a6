#!/usr/bin/env python3
"""Copies a GGUF file with some metadata keys set (or added): the fixtures' rope-scaling
variants. Usage: variant.py IN OUT KEY=TYPE:VALUE ... with TYPE one of str, f32, u32, bool.
Tensor data is copied unchanged, so a test can make the same variant in memory. Empty arrays
are dropped (the gguf writer refuses them; nothing reads them)."""
import sys

import gguf
import numpy as np
from gguf.constants import GGUFValueType as T

src, dst, *edits = sys.argv[1:]
r = gguf.GGUFReader(src)
arch = r.fields["general.architecture"].contents()
w = gguf.GGUFWriter(dst, arch)
parse = {"str": (T.STRING, str), "f32": (T.FLOAT32, float), "u32": (T.UINT32, int),
         "bool": (T.BOOL, lambda v: v == "true")}
new = {}
for e in edits:
    k, tv = e.split("=", 1)
    t, v = tv.split(":", 1)
    new[k] = (parse[t][0], parse[t][1](v))
for k, f in r.fields.items():
    if k.startswith("GGUF.") or k == "general.architecture":
        continue
    if k in new:
        vt, v = new.pop(k)
        w.add_key_value(k, v, vt)
        continue
    vt = f.types[0]
    if vt == T.ARRAY:
        if len(f.data) == 0:
            continue  # the writer refuses empty arrays; no loader needs these
        w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1])
    else:
        w.add_key_value(k, f.contents(), vt)
for k, (vt, v) in new.items():
    w.add_key_value(k, v, vt)
for t in r.tensors:
    data = np.array(t.data)
    w.add_tensor(t.name, data, raw_shape=list(reversed([int(x) for x in t.shape])), raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
