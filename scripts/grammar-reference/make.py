#!/usr/bin/env python3
"""Greedy generations of llama.cpp under grammars and JSON schemas, for
crates/model/tests/grammar.rs (writes crates/model/tests/data/grammar_reference.json).

Runs llama.cpp's llama-server (built from the llama-cpp-python 0.3.36 sdist, llama.cpp
0c1e570) once per model and asks /completion for each case with temperature 0, so the
tokens are llama.cpp's grammar sampler's choice. Usage:

    scripts/grammar-reference/make.py LLAMA_SERVER_BIN LLAMA_CPP_SRC

LLAMA_CPP_SRC is the vendored llama.cpp tree (for its grammars/*.gbnf). Models come
from the Lamina cache (~/.cache/lamina/models, or $LAMINA_CACHE/models).
"""
import json
import os
import subprocess
import sys
import time
import urllib.request

SERVER, SRC = sys.argv[1], sys.argv[2]
CACHE = os.environ.get("LAMINA_CACHE", os.path.expanduser("~/.cache/lamina"))
MODELS = {
    "smollm2-135m-instruct-q4_1": "SmolLM2-135M-Instruct.Q4_1.gguf",
    "gemma3-270m-q4_k_m": "gemma-3-270m-q4_k_m.gguf",
}
PORT = 18431


def gbnf(name):
    with open(os.path.join(SRC, "grammars", name)) as f:
        return f.read()


CASES = [
    {"name": "yes-no", "prompt": "Is the sky blue? Answer:",
     "grammar": 'root ::= ("yes" | "no") ", because " [a-z ]+ "."', "n_predict": 32},
    {"name": "json-gbnf", "prompt": "A JSON object describing a cat:",
     "grammar": gbnf("json.gbnf"), "n_predict": 48},
    {"name": "list-gbnf", "prompt": "Things to buy at the market:\n",
     "grammar": gbnf("list.gbnf"), "n_predict": 40},
    {"name": "arithmetic-gbnf", "prompt": "An arithmetic expression:",
     "grammar": gbnf("arithmetic.gbnf"), "n_predict": 24},
    {"name": "chess-gbnf", "prompt": "A chess game in PGN notation: ",
     "grammar": gbnf("chess.gbnf"), "n_predict": 32},
    {"name": "japanese-gbnf", "prompt": "日本語で自己紹介をしてください。",
     "grammar": gbnf("japanese.gbnf"), "n_predict": 24},
    {"name": "unicode-class", "prompt": "Write a word with accents:",
     "grammar": 'root ::= [a-zà-ÿ€]{1,12} (" " [a-zà-ÿ]{1,12}){0,3} "."', "n_predict": 24},
    {"name": "schema-object", "prompt": "List three colors as JSON:",
     "json_schema": {"type": "object",
                     "properties": {"colors": {"type": "array", "items": {"type": "string"},
                                               "minItems": 1, "maxItems": 3}},
                     "required": ["colors"]}, "n_predict": 48},
    {"name": "schema-person", "prompt": "A person as JSON:",
     "json_schema": {"type": "object",
                     "properties": {"name": {"type": "string", "maxLength": 20},
                                    "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                    "email": {"type": "string", "format": "email"},
                                    "city": {"enum": ["Paris", "London", "Tokyo"]}},
                     "required": ["name", "age", "city"]}, "n_predict": 64},
    {"name": "schema-any", "prompt": "Some JSON:", "json_schema": {}, "n_predict": 32},
    {"name": "schema-pattern", "prompt": "A phone number:",
     "json_schema": {"type": "string", "pattern": "^\\([0-9]{3}\\) [0-9]{3}-[0-9]{4}$"},
     "n_predict": 20},
]


S_PERSON = {"type": "object",
            "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
            "required": ["name", "age"]}
CHAT_CASES = [
    {"name": "chat-json-schema", "messages": [{"role": "user", "content": "Invent a person."}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": S_PERSON}}},
    {"name": "chat-json-object", "messages": [{"role": "user", "content": "Some JSON about cats."}],
     "response_format": {"type": "json_object"}},
    {"name": "chat-json-array", "messages": [{"role": "user", "content": "List some fruits."}],
     "response_format": {"type": "json_schema", "json_schema": {"name": "l", "schema": {
         "type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 4}}}},
    {"name": "chat-system", "messages": [{"role": "system", "content": "Answer in JSON."},
                                         {"role": "user", "content": "What is 2+2?"}],
     "response_format": {"type": "json_object"}},
    {"name": "chat-grammar", "messages": [{"role": "user", "content": "Is water wet? Answer yes or no."}],
     "grammar": 'root ::= "yes" | "no"'},
]


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def run_model(key, file):
    path = os.path.join(CACHE, "models", file)
    proc = subprocess.Popen([SERVER, "-m", path, "-c", "2048", "-np", "1", "-t", "2",
                             "--port", str(PORT), "--no-warmup"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.2)
        out = []
        for case in CASES:
            body = {"prompt": case["prompt"], "n_predict": case["n_predict"],
                    "temperature": 0, "cache_prompt": False, "return_tokens": True}
            for k in ("grammar", "json_schema"):
                if k in case:
                    body[k] = case[k]
            r = post("/completion", body)
            prompt_tokens = post("/tokenize", {"content": case["prompt"], "add_special": True,
                                               "parse_special": True})["tokens"]
            out.append({**case, "prompt_tokens": prompt_tokens, "tokens": r["tokens"],
                        "content": r["content"], "stop_type": r.get("stop_type")})
            print(key, case["name"], repr(r["content"])[:100], file=sys.stderr)
        chat = []
        for case in CHAT_CASES:
            body = {k: v for k, v in case.items() if k != "name"}
            body.update({"temperature": 0, "max_tokens": 64, "cache_prompt": False})
            r = post("/v1/chat/completions", body)
            chat.append({**case, "content": r["choices"][0]["message"]["content"],
                         "finish_reason": r["choices"][0]["finish_reason"]})
            print(key, case["name"], repr(chat[-1]["content"])[:100], file=sys.stderr)
        return {"completions": out, "chat": chat}
    finally:
        proc.terminate()
        proc.wait()


result = {"llama_cpp": "0c1e570 (llama-cpp-python 0.3.36)",
          "models": {k: run_model(k, f) for k, f in MODELS.items()}}
dst = os.path.join(os.path.dirname(__file__), "../../crates/model/tests/data/grammar_reference.json")
with open(dst, "w") as f:
    json.dump(result, f, indent=1, ensure_ascii=False)
    f.write("\n")
