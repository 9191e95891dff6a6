"""Drives a running `lamina serve` with the official `openai` Python package.

Usage: python3 openai_client.py BASE_URL [EXPECTED_JSON]

EXPECTED_JSON (optional) holds what the server's model must answer, computed by the
caller: {"chat": str, "completion": str}, both greedy (temperature 0, max_tokens 32), and
"lenient_tools": true for a model that may not finish a tool call within the token limit
(the fake engine): then cut-off calls are not checked.
Prints "ok" and exits 0 when every check passes; any failure raises.
"""

import json
import sys

import openai

base_url = sys.argv[1]
expected = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
client = openai.OpenAI(base_url=base_url, api_key="test-key", max_retries=0, timeout=60)
# A real model's logits depend on how tokens are batched (as llama.cpp's do): reusing a cached
# prompt prefix decodes the prompt's last token alone, which can change a greedy answer. The
# answers compared for equality below are therefore computed without prompt caching.
NO_CACHE = {"cache_prompt": False}
MESSAGES = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Say something."},
]

# Models.
models = client.models.list()
assert len(models.data) == 1, models
model = models.data[0].id

# Chat, not streamed.
chat = client.chat.completions.create(
    model=model, messages=MESSAGES, temperature=0, max_tokens=32, extra_body=NO_CACHE
)
choice = chat.choices[0]
assert choice.message.role == "assistant"
assert choice.finish_reason in ("stop", "length"), choice.finish_reason
assert chat.usage.prompt_tokens > 0
assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
if "chat" in expected:
    assert choice.message.content == expected["chat"], (choice.message.content, expected["chat"])

# Chat, streamed, with usage: same text as the non-streamed answer.
stream = client.chat.completions.create(
    model=model,
    messages=MESSAGES,
    temperature=0,
    max_tokens=32,
    stream=True,
    stream_options={"include_usage": True},
    extra_body=NO_CACHE,
)
parts, finish, usage = [], None, None
for chunk in stream:
    if chunk.usage is not None:
        usage = chunk.usage
    for c in chunk.choices:
        if c.delta.content:
            parts.append(c.delta.content)
        if c.finish_reason:
            finish = c.finish_reason
assert "".join(parts) == choice.message.content, ("".join(parts), choice.message.content)
assert finish == choice.finish_reason
assert usage is not None and usage.completion_tokens == chat.usage.completion_tokens

# n > 1 with a seed.
multi = client.chat.completions.create(
    model=model, messages=MESSAGES, temperature=1.0, seed=5, n=2, max_tokens=16
)
assert [c.index for c in multi.choices] == [0, 1]

# Legacy completions.
cmpl = client.completions.create(
    model=model, prompt="Once upon a time", temperature=0, max_tokens=32, extra_body=NO_CACHE
)
assert cmpl.choices[0].finish_reason in ("stop", "length")
if "completion" in expected:
    assert cmpl.choices[0].text == expected["completion"], (cmpl.choices[0].text, expected["completion"])
streamed = "".join(
    c.choices[0].text
    for c in client.completions.create(
        model=model, prompt="Once upon a time", temperature=0, max_tokens=32, stream=True,
        extra_body=NO_CACHE,
    )
    if c.choices
)
assert streamed == cmpl.choices[0].text

# Logprobs.
lp = client.chat.completions.create(
    model=model, messages=MESSAGES, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3,
    extra_body=NO_CACHE,
)
content = lp.choices[0].logprobs.content
assert len(content) == lp.usage.completion_tokens
for entry in content:
    assert len(entry.top_logprobs) == 3
    assert entry.logprob <= 0.0
    assert entry.token == entry.top_logprobs[0].token  # greedy picks the most likely
clp = client.completions.create(model=model, prompt="Once", temperature=0, max_tokens=4, logprobs=2)
assert len(clp.choices[0].logprobs.token_logprobs) == 4

# Embeddings.
emb = client.embeddings.create(model=model, input=["one", "two"])
assert len(emb.data) == 2 and len(emb.data[0].embedding) > 0
emb64 = client.embeddings.create(model=model, input="one")  # the package asks for base64
assert abs(sum(x * x for x in emb64.data[0].embedding) - 1.0) < 1e-4

# Tool calls: `required` always yields a call with JSON arguments that fit the schema.
TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"],
        },
    },
}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
LENIENT = expected.get("lenient_tools", False)


def check_tool_calls():
    """A required call, streamed and not, its result sent back, named and `none` choices."""
    tc = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96,
        extra_body=NO_CACHE,
    )
    call_choice = tc.choices[0]
    if LENIENT and call_choice.finish_reason == "length":
        return
    assert call_choice.finish_reason == "tool_calls", call_choice
    (call,) = call_choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather", call
    assert isinstance(json.loads(call.function.arguments)["city"], str), call.function.arguments
    assert call.id.startswith("call_")

    # The same call, streamed: delta.tool_calls chunks accumulate to the same name and arguments.
    stream = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="required", temperature=0, max_tokens=96,
        stream=True, extra_body=NO_CACHE,
    )
    name, arguments, finish = "", "", None
    for chunk in stream:
        for c in chunk.choices:
            for d in c.delta.tool_calls or []:
                assert d.index == 0
                name += d.function.name or ""
                arguments += d.function.arguments or ""
            if c.finish_reason:
                finish = c.finish_reason
    assert (name, arguments, finish) == (call.function.name, call.function.arguments, "tool_calls")

    # The result goes back as a `tool` message; the answer may now be text or another call.
    follow = client.chat.completions.create(
        model=model,
        messages=ASK + [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
        ],
        tools=TOOLS, temperature=0, max_tokens=48,
    )
    assert follow.choices[0].finish_reason in ("stop", "length", "tool_calls")

    # A named function and `none`.
    named = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, max_tokens=96,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    assert LENIENT or named.choices[0].message.tool_calls[0].function.name == "get_weather"
    plain = client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, tool_choice="none", max_tokens=8
    )
    assert not plain.choices[0].message.tool_calls


check_tool_calls()

# An unknown function is the package's BadRequestError.
try:
    client.chat.completions.create(
        model=model, messages=ASK, tools=TOOLS, max_tokens=8,
        tool_choice={"type": "function", "function": {"name": "nope"}},
    )
    raise AssertionError("unknown function accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400

# response_format: a strict JSON schema, and json_object.
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
rf = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Invent a person."}], max_tokens=64,
    temperature=0,
    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
)
if rf.choices[0].finish_reason == "stop":
    person = json.loads(rf.choices[0].message.content)
    assert set(person) == {"name", "age"} and isinstance(person["age"], int), person
obj = client.chat.completions.create(
    model=model, messages=[{"role": "user", "content": "Some JSON."}], max_tokens=64,
    temperature=0, response_format={"type": "json_object"},
)
assert obj.choices[0].message.content.lstrip().startswith("{"), obj.choices[0].message.content
if obj.choices[0].finish_reason == "stop":
    assert isinstance(json.loads(obj.choices[0].message.content), dict)

# Errors surface as the package's typed exceptions.
try:
    client.chat.completions.create(model=model, messages=[{"role": "user"}], max_tokens=4)
    raise AssertionError("a message without content accepted")
except openai.BadRequestError as e:
    assert e.status_code == 400
bad = openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0)
try:
    bad.models.list()
    raise AssertionError("wrong key accepted")
except openai.AuthenticationError as e:
    assert e.status_code == 401

print("ok")
