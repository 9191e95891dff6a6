#!/usr/bin/env python3
"""Writes the server_request seeds in the target's raw form, `METHOD /path\\n` then the
body: one or more valid requests per endpoint, shaped as the API documents them, plus a
few broken bodies. Run from fuzz/: python3 scripts/server_seeds.py"""
import json, os

out = "seeds/server_request"
os.makedirs(out, exist_ok=True)
msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
tool = {"type": "function", "function": {"name": "get_weather", "description": "w",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}
schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0},
          "b": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
          "required": ["a"]}
S = [
    ("chat", "/v1/chat/completions", {"model": "m", "messages": msgs, "max_tokens": 2}),
    ("chat_stream", "/v1/chat/completions", {"messages": msgs, "max_tokens": 3, "stream": True,
                                              "stream_options": {"include_usage": True}}),
    ("chat_tools", "/v1/chat/completions", {"messages": msgs, "tools": [tool], "tool_choice": "auto",
                                             "max_tokens": 2}),
    ("chat_tool_turn", "/v1/chat/completions", {"messages": msgs + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3C"}], "max_tokens": 2}),
    ("chat_schema", "/v1/chat/completions", {"messages": msgs, "max_tokens": 4, "response_format":
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
    ("chat_sampling", "/chat/completions", {"messages": msgs, "max_tokens": 2, "temperature": 0.7,
        "top_k": 5, "top_p": 0.9, "min_p": 0.05, "seed": 1, "logprobs": True, "top_logprobs": 2,
        "logit_bias": {"101": -100}, "stop": ["\n"], "n": 2, "presence_penalty": 0.5,
        "samplers": ["top_k", "temperature"], "chat_template_kwargs": {"enable_thinking": False}}),
    ("chat_parts", "/v1/chat/completions", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}],
        "max_tokens": 1}),
    ("completions", "/v1/completions", {"prompt": "hi", "max_tokens": 2, "echo": True, "logprobs": 1}),
    ("completions_many", "/v1/completions", {"prompt": ["a", "b"], "max_tokens": 1}),
    ("completion", "/completion", {"prompt": "hi", "n_predict": 2, "n_probs": 2, "cache_prompt": True,
        "grammar": "root ::= [a-z]+", "return_tokens": True, "id_slot": 0}),
    ("completion_tokens", "/completion", {"prompt": [104, 105, "x"], "n_predict": 2,
        "json_schema": schema, "stream": True, "timings_per_token": True}),
    ("completion_dry", "/completions", {"prompt": "hi", "n_predict": 2, "dry_multiplier": 0.8,
        "mirostat": 2, "xtc_probability": 0.5, "typical_p": 0.9, "repeat_last_n": -1}),
    ("embeddings", "/v1/embeddings", {"input": ["hi", "there"], "model": "m"}),
    ("embeddings_b64", "/v1/embeddings", {"input": [[104, 105]], "encoding_format": "base64"}),
    ("embeddings_native", "/embeddings", {"content": "hi"}),
    ("tokenize", "/tokenize", {"content": "hi <s> é", "add_special": True, "with_pieces": True}),
    ("detokenize", "/detokenize", {"tokens": [104, 105, 256]}),
    ("infill", "/infill", {"input_prefix": "def f(", "input_suffix": "):\n", "n_predict": 2,
        "input_extra": [{"filename": "a.py", "text": "x = 1\n"}], "prompt": ""}),
    ("messages", "/v1/messages", {"model": "m", "max_tokens": 2, "system": "Be brief.",
        "messages": [{"role": "user", "content": "hi"}]}),
    ("messages_blocks", "/v1/messages", {"model": "m", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "3C"}]}],
        "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}],
        "tool_choice": {"type": "auto"}, "thinking": {"type": "enabled", "budget_tokens": 16},
        "stop_sequences": ["\n"], "stream": True}),
    ("count_tokens", "/v1/messages/count_tokens", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ("responses", "/v1/responses", {"input": "hi", "max_output_tokens": 2, "instructions": "Be brief."}),
    ("responses_items", "/v1/responses", {"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "3C"}],
        "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
        "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}},
        "reasoning": {"effort": "low"}, "max_output_tokens": 3, "stream": True}),
    ("responses_tokens", "/v1/responses/input_tokens", {"input": "hi"}),
    ("apply_template", "/apply-template", {"messages": msgs}),
    ("input_tokens", "/chat/completions/input_tokens", {"messages": msgs}),
    ("rerank", "/rerank", {"query": "q", "documents": ["a", "b"], "top_n": 1}),
    ("rerank_tei", "/v1/rerank", {"query": "q", "texts": ["a", "b"]}),
    ("predict", "/predict", {"instances": [{"@requestFormat": "chatCompletions", "messages": msgs,
        "max_tokens": 2}, {"@requestFormat": "/tokenize", "content": "hi"}]}),
]
for name, path, body in S:
    with open(os.path.join(out, name), "wb") as f:
        f.write(f"POST {path}\n".encode() + json.dumps(body, ensure_ascii=False).encode())
raw = {
    "get_models": b"GET /v1/models\n",
    "get_props": b"GET /props\n",
    "get_slots": b"GET /slots\n",
    "get_health": b"GET /health\n",
    "slot_erase": b"POST /slots/0?action=erase\n",
    "not_json": b"POST /v1/chat/completions\n{\"messages\": [",
    "not_object": b"POST /completion\n[1, 2]",
    "bad_utf8": b"POST /tokenize\n{\"content\": \"\xff\xfe\"}",
    "deep": b"POST /v1/chat/completions\n" + b"[" * 300 + b"]" * 300,
}
for name, data in raw.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)

# Structured-form seeds: bytes for `arbitrary::Unstructured` (0xFF first, so that they are
# never read as the raw form).
import random
r = random.Random(7)
for i in range(12):
    n = r.choice([32, 64, 128, 256, 512, 1024])
    data = bytes([0xFF]) + bytes(r.randrange(256) for _ in range(n))
    with open(os.path.join(out, f"structured_{i:02}"), "wb") as f:
        f.write(data)
print(f"{len(S) + len(raw) + 12} seeds in {out}")
