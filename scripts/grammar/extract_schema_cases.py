#!/usr/bin/env python3
"""Extract the JSON-Schema-to-GBNF test vectors from llama.cpp's
tests/test-json-schema-to-grammar.cpp into crates/grammar/tests/data/json_schema_cases.json.

Each `test({ STATUS, "name", schema, expected })` call inside `test_all` becomes one
record. The expected grammar is normalised the way the C++ test's `trim()` does
(strip the ends, strip leading blanks of every line), so the Rust test can compare
byte-for-byte against the converter's output minus its final newline.

Usage:
  scripts/grammar/extract_schema_cases.py [path/to/test-json-schema-to-grammar.cpp] [out.json]
"""
import json
import re
import sys
from pathlib import Path

DEFAULT_SRC = "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/tests/test-json-schema-to-grammar.cpp"
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "crates/grammar/tests/data/json_schema_cases.json"

ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}


def read_literal(src, i):
    """Read one C++ string literal starting at src[i]; return (value, next_index)."""
    if src.startswith('R"', i):
        # raw string: R"delim( ... )delim"
        j = src.index("(", i)
        delim = src[i + 2 : j]
        end = src.index(")" + delim + '"', j)
        return src[j + 1 : end], end + len(delim) + 2
    assert src[i] == '"', src[i : i + 40]
    out = []
    i += 1
    while src[i] != '"':
        if src[i] == "\\":
            out.append(ESCAPES[src[i + 1]])
            i += 2
        else:
            out.append(src[i])
            i += 1
    return "".join(out), i + 1


def skip_ws(src, i):
    while True:
        while i < len(src) and src[i] in " \t\r\n":
            i += 1
        if src.startswith("//", i):
            i = src.index("\n", i)
            continue
        return i


def read_strings(src, i):
    """Read a comma-separated list of (possibly concatenated) literals up to '}'."""
    values = []
    while True:
        i = skip_ws(src, i)
        if src[i] == "}":
            return values, i
        parts = []
        while src[i] == '"' or src.startswith('R"', i):
            v, i = read_literal(src, i)
            parts.append(v)
            i = skip_ws(src, i)
        values.append("".join(parts))
        if src[i] == ",":
            i += 1


def trim(s):
    # same as the C++ test's trim(): ends, then leading blanks of each line
    s = s.strip(" \n\r\t")
    return re.sub(r"(^|\n)[ \t]+", r"\1", s)


def main():
    src_path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_SRC
    out_path = Path(sys.argv[2]) if len(sys.argv) > 2 else DEFAULT_OUT
    src = Path(src_path).read_text()
    # only the cases of test_all(), which ends where main() begins
    body = src[src.index("static void test_all") : src.index("int main()")]
    cases = []
    for m in re.finditer(r"\btest\(\{\s*(SUCCESS|FAILURE)\s*,", body):
        strings, _ = read_strings(body, m.end())
        assert len(strings) == 3, (m.group(1), strings)
        name, schema, expected = strings
        case = {"name": name, "status": m.group(1).lower(), "schema": schema}
        if m.group(1) == "SUCCESS":
            case["grammar"] = trim(expected)
        cases.append(case)
    out_path.write_text(json.dumps(cases, indent=2, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases -> {out_path}")


if __name__ == "__main__":
    main()
