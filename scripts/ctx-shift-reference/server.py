#!/usr/bin/env python3
"""server.py — record llama-server's answers with --context-shift, --cache-reuse and
--reasoning-budget, for
crates/cli/tests/data/server_shift_reference.json (checked by crates/cli/tests/cli.rs,
serve_context_shift_and_cache_reuse_match_llama_server).

For each test model and server setting below, starts llama-server (the AVX2 CPU build of
llama.cpp 0c1e570), sends the requests in order (temperature 0, so greedy) and keeps what
each answered: for /completion the generated token ids, the text, and the fields that say what
the server did with the cache (`truncated`, `timings.prompt_n`, `timings.cache_n`,
`timings.predicted_n`); for chat the content, the reasoning content and the token count. The
reasoning budget is tried on SmolLM2 under QwQ's template (crates/cli/tests/data/qwq-32b.jinja, a
copy of ../shared/templates/Qwen-QwQ-32B.jinja), whose generation prompt opens `<think>`.

Usage: scripts/ctx-shift-reference/server.py LLAMA_SERVER [MODELS_DIR] [TEXT] [OUT]
  defaults: ~/.cache/lamina/models, ../shared/reference/areopagitica.txt,
            crates/cli/tests/data/server_shift_reference.json
Not run by CI; about a minute on 2 cores.
"""
import json, os, socket, subprocess, sys, time, urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
server = sys.argv[1]
models = sys.argv[2] if len(sys.argv) > 2 else os.path.expanduser("~/.cache/lamina/models")
text_path = sys.argv[3] if len(sys.argv) > 3 else os.path.join(ROOT, "..", "shared", "reference", "areopagitica.txt")
out = sys.argv[4] if len(sys.argv) > 4 else os.path.join(ROOT, "crates", "cli", "tests", "data", "server_shift_reference.json")
text = open(text_path, encoding="utf-8").read()
A, B, C = text[0:437], text[437:793], text[793:1329]  # each ends at a line end

FILES = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
BASE = ["-np", "1", "-t", "2", "--cache-ram", "0", "--no-warmup"]
SETTINGS = [
    ("context-shift", ["-c", "256", "--context-shift"], [
        {"prompt": A, "n_predict": 300},
        {"prompt": A, "n_predict": 200, "n_keep": 12, "cache_prompt": False},
    ]),
    ("cache-reuse", ["-c", "1024", "--cache-reuse", "16"], [
        {"prompt": A + B + C, "n_predict": 8},
        {"prompt": A + C, "n_predict": 16},
        {"prompt": A + C, "n_predict": 16, "n_cache_reuse": 0},
    ]),
    ("reasoning-budget", ["-c", "1024", "--chat-template-file", "crates/cli/tests/data/qwq-32b.jinja",
                          "--reasoning-budget", "8"], [
        {"path": "/v1/chat/completions", "messages": [{"role": "user", "content": q}], "max_tokens": 48}
        | extra
        for q in ["What is 2+2?", "Name three colours."]
        for extra in [{}, {"reasoning_budget_tokens": 0},
                      {"reasoning_budget_tokens": 3, "reasoning_budget_message": " Enough."},
                      {"reasoning_budget_tokens": -1}]
    ]),
]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(port, body):
    body = dict(body)
    path = body.pop("path", "/completion")
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=600).read())


doc = {"llama_cpp": "llama-server 0c1e570, CPU, AVX2 build (GGML_NATIVE=OFF, AVX2/FMA/F16C)",
       "text": "../shared/reference/areopagitica.txt: A = [0, 437), B = [437, 793), C = [793, 1329) (chars, each ending a line)",
       "cases": []}
for model, file in FILES.items():
    for name, flags, requests in SETTINGS:
        # llama-server keeps gemma3's sliding-window layers in a cache of their own whose
        # old cells are overwritten, and re-evaluates a prompt whose reuse its context
        # checkpoints do not cover (here: all of it). Lamina's cache keeps every cell and
        # reuses what it has, so only the context shift is compared on gemma3.
        if model == "gemma3-270m" and name in ("cache-reuse", "reasoning-budget"):
            continue
        port = free_port()
        args = [server, "-m", os.path.join(models, file), "--port", str(port)] + BASE + flags
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                    break
                except Exception:
                    time.sleep(0.2)
            answers = []
            for body in requests:
                if "path" in body:
                    body = dict(body, temperature=0)
                    m = post(port, body)
                    msg = m["choices"][0]["message"]
                    answers.append({"request": body, "content": msg["content"],
                                    "reasoning_content": msg.get("reasoning_content"),
                                    "completion_tokens": m["usage"]["completion_tokens"]})
                    print(f"  {model:13s} {name:16s} {answers[-1]}", file=sys.stderr)
                    continue
                body = dict(body, temperature=0, return_tokens=True)
                r = post(port, body)
                t = r["timings"]
                answers.append({"request": body, "tokens": r["tokens"], "content": r["content"],
                                "truncated": r["truncated"], "prompt_n": t["prompt_n"],
                                "cache_n": t["cache_n"], "predicted_n": t["predicted_n"]})
                print(f"  {model:13s} {name:16s} prompt_n {t['prompt_n']:4d} cache_n {t['cache_n']:4d} "
                      f"predicted_n {t['predicted_n']:4d} truncated {r['truncated']}", file=sys.stderr)
        finally:
            proc.terminate()
            proc.wait()
        doc["cases"].append({"model": model, "name": name, "flags": BASE + flags, "answers": answers})
os.makedirs(os.path.dirname(out), exist_ok=True)
with open(out, "w") as fh:
    json.dump(doc, fh, indent=1)
    fh.write("\n")
print(f"  -> {out}", file=sys.stderr)
