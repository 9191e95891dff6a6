#!/usr/bin/env python3
"""Writes the kld_reader seeds: small llama.cpp --kl-divergence-base files
(b"_logits_", i32 n_ctx, n_vocab, n_chunk, n_ctx*n_chunk i32 tokens, then per chunk
n_ctx-1-n_ctx/2 rows of 2 f32 (scale, min_log_prob) + n_vocab u16 rounded up to even),
plus a few broken ones. Run from fuzz/: python3 scripts/kld_seeds.py"""
import os, random, struct

out = "seeds/kld_reader"
os.makedirs(out, exist_ok=True)
rng = random.Random(20)


def logits_file(n_ctx, n_vocab, n_chunk, scale=None, minlp=None, tokens=None):
    b = bytearray(b"_logits_")
    b += struct.pack("<3i", n_ctx, n_vocab, n_chunk)
    toks = tokens or [rng.randrange(n_vocab) for _ in range(n_ctx * n_chunk)]
    b += struct.pack(f"<{len(toks)}i", *toks)
    rows = n_ctx - 1 - n_ctx // 2
    padded = n_vocab + (n_vocab & 1)
    for _ in range(rows * n_chunk):
        s = scale if scale is not None else rng.uniform(1e-4, 1e-3)
        m = minlp if minlp is not None else -rng.uniform(5, 30)
        b += struct.pack("<2f", s, m)
        q = [rng.randrange(65536) for _ in range(n_vocab)] + [0] * (padded - n_vocab)
        b += struct.pack(f"<{padded}H", *q)
    return bytes(b)


seeds = {
    "min": logits_file(3, 1, 1),
    "small": logits_file(10, 33, 3),
    "even_vocab": logits_file(8, 16, 2),
    "hundred_rows": logits_file(6, 2, 50),  # >= 100 scored tokens: the final report
    "big_vocab": logits_file(4, 260, 2),
    "nan_scale": logits_file(6, 5, 2, scale=float("nan"), minlp=float("inf")),
    "inf_scale": logits_file(6, 5, 2, scale=float("inf"), minlp=float("-inf")),
    "zero_scale": logits_file(6, 5, 2, scale=0.0, minlp=0.0),
}
seeds["truncated"] = seeds["small"][:-7]
seeds["trailing"] = seeds["small"] + b"\0\0"
seeds["bad_token"] = logits_file(4, 3, 1, tokens=[0, 1, 2, 3])
seeds["header_only"] = b"_logits_" + struct.pack("<3i", 10, 33, 3)
seeds["huge_header"] = b"_logits_" + struct.pack("<3i", 0x7FFFFFFF, 0x7FFFFFFF, 0x7FFFFFFF)
seeds["bad_magic"] = b"_logit__" + seeds["small"][8:]
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
print(f"{len(seeds)} seeds in {out}")
