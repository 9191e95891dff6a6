#!/usr/bin/env python3
"""The deepseek2 fixture in the layout of files converted before llama.cpp's absorbed MLA:
one `attn_kv_b` matrix [kv_lora_rank, n_head * (nope + head_v)] instead of `attn_k_b` and
`attn_v_b`, no `key_length_mla`/`value_length_mla`, K and V head sizes 192 and 128 with as many
KV heads as query heads. The new matrix is random (N(0, 0.1), seed 42). Usage:
  deepseek2_legacy.py IN.gguf OUT.gguf"""
import sys

import gguf
import numpy as np
from gguf.constants import GGUFValueType as T

src, dst = sys.argv[1:]
r = gguf.GGUFReader(src)
w = gguf.GGUFWriter(dst, "deepseek2")
fields = {k: f for k, f in r.fields.items()}
n_head = int(fields["deepseek2.attention.head_count"].contents())
kv_lora = int(fields["deepseek2.attention.kv_lora_rank"].contents())
head_k = int(fields["deepseek2.attention.key_length_mla"].contents())
head_v = int(fields["deepseek2.attention.value_length_mla"].contents())
n_rot = int(fields["deepseek2.rope.dimension_count"].contents())
set_to = {
    "deepseek2.attention.key_length": head_k,
    "deepseek2.attention.value_length": head_v,
    "deepseek2.attention.head_count_kv": n_head,
    "deepseek2.attention.key_length_mla": 0,
    "deepseek2.attention.value_length_mla": 0,
}
for k, f in r.fields.items():
    if k.startswith("GGUF.") or k == "general.architecture":
        continue
    vt = f.types[0]
    if k in set_to:
        w.add_key_value(k, set_to[k], vt)
    elif vt == T.ARRAY:
        if len(f.data):
            w.add_key_value(k, f.contents(), vt, sub_type=f.types[-1])
    else:
        w.add_key_value(k, f.contents(), vt)
rng = np.random.default_rng(42)
nope = head_k - n_rot
for t in r.tensors:
    if t.name.endswith("attn_k_b.weight"):
        il = t.name.split(".")[1]
        kv_b = rng.normal(0, 0.1, size=(n_head * (nope + head_v), kv_lora)).astype(np.float32)
        w.add_tensor(f"blk.{il}.attn_kv_b.weight", kv_b)
        continue
    if t.name.endswith("attn_v_b.weight"):
        continue
    w.add_tensor(t.name, np.array(t.data), raw_shape=list(reversed([int(x) for x in t.shape])),
                 raw_dtype=t.tensor_type)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
