#!/usr/bin/env python3
"""A random-weight qwen3moe GGUF of a realistic layer shape, for MoE speed comparisons with
llama-bench (the test fixtures are too small to measure anything but overhead). Usage:
  synthetic_moe.py OUT.gguf [--layers 4] [--embd 1024] [--experts 16] [--used 4] [--ff 512]
Weights are Q8_0 (norms f32), drawn from N(0, 0.02) with a fixed seed; the vocabulary is
llama.cpp's placeholder `test` one (32000 tokens)."""
import argparse

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--layers", type=int, default=4)
ap.add_argument("--embd", type=int, default=1024)
ap.add_argument("--heads", type=int, default=16)
ap.add_argument("--heads-kv", type=int, default=4)
ap.add_argument("--experts", type=int, default=16)
ap.add_argument("--used", type=int, default=4)
ap.add_argument("--ff", type=int, default=512)
ap.add_argument("--vocab", type=int, default=32000)
a = ap.parse_args()
rng = np.random.default_rng(42)
head = a.embd // a.heads
arch = "qwen3moe"
w = gguf.GGUFWriter(a.out, arch)
w.add_context_length(4096)
w.add_embedding_length(a.embd)
w.add_block_count(a.layers)
w.add_feed_forward_length(a.ff * a.used)
w.add_expert_feed_forward_length(a.ff)
w.add_head_count(a.heads)
w.add_head_count_kv(a.heads_kv)
w.add_key_length(head)
w.add_value_length(head)
w.add_rope_freq_base(1000000.0)
w.add_layer_norm_rms_eps(1e-6)
w.add_expert_count(a.experts)
w.add_expert_used_count(a.used)
w.add_vocab_size(a.vocab)
w.add_tokenizer_model("test")
w.add_token_list([f"tok_{i}" for i in range(a.vocab)])
w.add_token_scores([0.0] * a.vocab)
w.add_token_types([1] * a.vocab)


def mat(name, *shape):  # shape innermost first, as ggml's ne
    data = rng.normal(0, 0.02, size=tuple(reversed(shape))).astype(np.float32)
    w.add_tensor(name, gguf.quants.quantize(data, Q.Q8_0), raw_dtype=Q.Q8_0)


def vec(name, n):
    w.add_tensor(name, (1.0 + rng.normal(0, 0.02, size=n)).astype(np.float32))


mat("token_embd.weight", a.embd, a.vocab)
vec("output_norm.weight", a.embd)
mat("output.weight", a.embd, a.vocab)
for il in range(a.layers):
    p = f"blk.{il}."
    vec(p + "attn_norm.weight", a.embd)
    mat(p + "attn_q.weight", a.embd, a.heads * head)
    mat(p + "attn_k.weight", a.embd, a.heads_kv * head)
    mat(p + "attn_v.weight", a.embd, a.heads_kv * head)
    mat(p + "attn_output.weight", a.heads * head, a.embd)
    vec(p + "attn_q_norm.weight", head)
    vec(p + "attn_k_norm.weight", head)
    vec(p + "ffn_norm.weight", a.embd)
    w.add_tensor(p + "ffn_gate_inp.weight",
                 rng.normal(0, 0.02, size=(a.experts, a.embd)).astype(np.float32))
    mat(p + "ffn_gate_exps.weight", a.embd, a.ff, a.experts)
    mat(p + "ffn_up_exps.weight", a.embd, a.ff, a.experts)
    mat(p + "ffn_down_exps.weight", a.ff, a.embd, a.experts)
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
