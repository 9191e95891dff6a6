#!/usr/bin/env python3
"""Load generator for an OpenAI-compatible completion server (lamina serve or llama-server).

N clients, each in a loop for the whole run: one POST /v1/completions with a prompt of its own
(so that prompts are not shared across slots), `max_tokens` generated tokens, temperature 0,
`ignore_eos` so every request generates exactly max_tokens where the server honours it. Prints
the aggregate generated tokens per second (usage.completion_tokens summed over the requests that
finished inside the run, divided by the run's wall time) and the requests per second.

Usage: load.py [--url http://127.0.0.1:8080] [--clients 8] [--seconds 30] [--max-tokens 64]
Standard library only.
"""

import argparse
import json
import threading
import time
import urllib.request

WORDS = ("river stone lantern market winter garden letter harbor violin meadow "
         "engine candle orchard bridge thunder window silver forest mirror castle").split()


def prompt_for(client, n):
    """A distinct prompt per client and request: about 40 words."""
    words = [WORDS[(client * 7 + n * 3 + i * 5) % len(WORDS)] for i in range(36)]
    return f"Story {client}-{n}: " + " ".join(words) + ". Continue the story:"


def client_loop(url, client, deadline, max_tokens, out, lock):
    n = 0
    while time.time() < deadline:
        body = json.dumps({
            "prompt": prompt_for(client, n),
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        }).encode()
        req = urllib.request.Request(url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                reply = json.load(r)
        except Exception as e:  # a failed request counts as nothing, and is reported
            with lock:
                out["errors"] += 1
                out["last_error"] = str(e)
            time.sleep(0.1)
            continue
        done = time.time()
        if done <= deadline:
            with lock:
                out["tokens"] += reply.get("usage", {}).get("completion_tokens", 0)
                out["requests"] += 1
        n += 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    out = {"tokens": 0, "requests": 0, "errors": 0, "last_error": None}
    lock = threading.Lock()
    start = time.time()
    deadline = start + a.seconds
    threads = [threading.Thread(target=client_loop,
                                args=(a.url, c, deadline, a.max_tokens, out, lock))
               for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = a.seconds
    print(json.dumps({
        "clients": a.clients, "seconds": a.seconds, "max_tokens": a.max_tokens,
        "generated_tokens": out["tokens"], "requests": out["requests"],
        "generated_tok_per_s": round(out["tokens"] / wall, 2),
        "requests_per_s": round(out["requests"] / wall, 3),
        "errors": out["errors"], "last_error": out["last_error"],
    }))


if __name__ == "__main__":
    main()
