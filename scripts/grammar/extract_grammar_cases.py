#!/usr/bin/env python3
"""Extract llama.cpp's GBNF grammar test vectors into JSON data files for
crates/grammar/tests/grammar_cases.rs.

Sources (llama.cpp tests/):
  test-grammar-integration.cpp
    * every `test_grammar(name, grammar, {passing...}, {failing...})` call
        -> crates/grammar/tests/data/grammar_integration_cases.json
           {"name", "grammar", "passing": [...], "failing": [...]}
    * every `test_schema(name, schema, {passing...}, {failing...})` call
        -> crates/grammar/tests/data/schema_integration_cases.json
           {"name", "schema", "passing": [...], "failing": [...]}
    * the build-failure tests (test_failure_*, test_custom_root_symbol_check), which
      build a grammar with some root and assert it is (or is not) null
        -> appended to grammar_integration_cases.json as
           {"name", "grammar", "root", "build": "error" | "ok"}
           (plus "rules_nonempty": true and "absent_symbols": [...] for
           test_failure_missing_root, which asserts on the parser's output directly:
           the rules parse but there is no "root" symbol).
  test-grammar-parser.cpp
    * every `verify_parsing(grammar, {{name, id}...}, {{TYPE, value}...})` call and every
      `verify_failure(grammar)` call
        -> crates/grammar/tests/data/grammar_parser_cases.json
           {"parse": [{"grammar", "symbol_ids": {name: id}, "rules": [[[TYPE, value]...]...]}],
            "failure": [grammar...]}
           TYPE is the LLAMA_GRETYPE_ suffix (CHAR, CHAR_NOT, CHAR_ALT, CHAR_RNG_UPPER,
           CHAR_ANY, RULE_REF, ALT, END, TOKEN, TOKEN_NOT); the expected flat element
           list is split into rules at each END (every rule ends with exactly one END).

Test strings: a string made only of text is a JSON string. test-grammar-integration's
`token(id)` helper splices a special token into a string (match_string then feeds it
to the grammar as that token with piece "<[id]>", and every text code point as token 0
with that code point as piece); such a string becomes a JSON array of parts, each a
string (text) or an integer (a token id).

The C++ is read with a small lexer: // and /* */ comments are skipped (so
commented-out test strings are not extracted), string literals are normal "..." with
C++ escapes (\\n \\t \\r \\" \\\\ \\' \\? \\a \\b \\f \\v \\0 octal \\xHH \\uHHHH
\\UHHHHHHHH) or raw R"delim(...)delim", optionally with an encoding prefix (u8, L, u,
U), and adjacent literals are concatenated as the C++ compiler does.

Usage:
  scripts/grammar/extract_grammar_cases.py [LLAMA_CPP_TESTS_DIR]
"""
import json
import re
import sys
from pathlib import Path

DEFAULT_TESTS = "/tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/tests"
DATA = Path(__file__).resolve().parents[2] / "crates/grammar/tests/data"


# ----------------------------------------------------------------------------- lexer

class Tok:
    __slots__ = ("kind", "value", "pos")

    def __init__(self, kind, value, pos):
        self.kind = kind  # "str", "char", "ident", "num", "punct"
        self.value = value
        self.pos = pos

    def __repr__(self):
        return f"Tok({self.kind}, {self.value!r})"


SIMPLE_ESCAPES = {
    "n": "\n", "t": "\t", "r": "\r", "\"": "\"", "\\": "\\", "'": "'", "?": "?",
    "a": "\a", "b": "\b", "f": "\f", "v": "\v",
}

PUNCT = ["::", "->", "==", "!=", "<=", ">=", "&&", "||", "++", "--", "+=", "-=", "<<", ">>"]


def read_escape(src, i):
    """src[i] is the character after a backslash; returns (text, next index)."""
    c = src[i]
    if c in SIMPLE_ESCAPES:
        return SIMPLE_ESCAPES[c], i + 1
    if c in "01234567":
        j = i
        while j < i + 3 and j < len(src) and src[j] in "01234567":
            j += 1
        return chr(int(src[i:j], 8)), j
    if c == "x":
        j = i + 1
        while j < len(src) and src[j] in "0123456789abcdefABCDEF":
            j += 1
        value = int(src[i + 1:j], 16)
        if value > 0x7F:
            # A byte escape above ASCII would make a non-UTF-8 std::string, which JSON
            # cannot carry; none of the sources have one.
            raise ValueError(f"\\x escape above 0x7f at {i}: {src[i - 1:j]}")
        return chr(value), j
    if c in "uU":
        n = 4 if c == "u" else 8
        return chr(int(src[i + 1:i + 1 + n], 16)), i + 1 + n
    raise ValueError(f"unknown escape \\{c} at {i}")


def lex(src):
    toks = []
    i = 0
    n = len(src)
    while i < n:
        c = src[i]
        if c in " \t\r\n\f\v":
            i += 1
            continue
        if src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j + 1
            continue
        if src.startswith("/*", i):
            i = src.index("*/", i + 2) + 2
            continue
        if c == "#":
            # preprocessor line (with continuations)
            while i < n and src[i] != "\n":
                if src[i] == "\\" and i + 1 < n and src[i + 1] == "\n":
                    i += 2
                    continue
                i += 1
            continue
        m = re.match(r'(u8|u|U|L)?R"([^()\\ \t\n]{0,16})\(', src[i:i + 40])
        if m:
            delim = m.group(2)
            start = i + m.end()
            end = src.index(")" + delim + '"', start)
            toks.append(Tok("str", src[start:end], i))
            i = end + len(delim) + 2
            continue
        m = re.match(r'(u8|u|U|L)?"', src[i:i + 3])
        if m:
            j = i + m.end()
            out = []
            while src[j] != '"':
                if src[j] == "\\":
                    text, j = read_escape(src, j + 1)
                    out.append(text)
                elif src[j] == "\n":
                    raise ValueError(f"newline in string literal at {i}")
                else:
                    out.append(src[j])
                    j += 1
            toks.append(Tok("str", "".join(out), i))
            i = j + 1
            continue
        m = re.match(r"(u8|u|U|L)?'", src[i:i + 3])
        if m and not (i > 0 and (src[i - 1].isalnum() or src[i - 1] == "_")):
            j = i + m.end()
            out = []
            while src[j] != "'":
                if src[j] == "\\":
                    text, j = read_escape(src, j + 1)
                    out.append(text)
                else:
                    out.append(src[j])
                    j += 1
            value = "".join(out)
            if len(value) != 1:
                raise ValueError(f"multi-character char literal at {i}: {value!r}")
            toks.append(Tok("char", ord(value), i))
            i = j + 1
            continue
        if c.isalpha() or c == "_":
            j = i
            while j < n and (src[j].isalnum() or src[j] == "_"):
                j += 1
            toks.append(Tok("ident", src[i:j], i))
            i = j
            continue
        if c.isdigit():
            m = re.match(r"0[xX][0-9a-fA-F']+|[0-9][0-9']*", src[i:])
            text = m.group(0).replace("'", "")
            j = i + m.end()
            while j < n and src[j] in "uUlLzZ":
                j += 1
            toks.append(Tok("num", int(text, 0), i))
            i = j
            continue
        for p in PUNCT:
            if src.startswith(p, i):
                toks.append(Tok("punct", p, i))
                i += len(p)
                break
        else:
            toks.append(Tok("punct", c, i))
            i += 1
    # adjacent string literals are one literal
    merged = []
    for t in toks:
        if t.kind == "str" and merged and merged[-1].kind == "str":
            merged[-1] = Tok("str", merged[-1].value + t.value, merged[-1].pos)
        else:
            merged.append(t)
    return merged


# ---------------------------------------------------------------------------- parser

class Parser:
    def __init__(self, toks, src):
        self.t = toks
        self.i = 0
        self.src = src

    def peek(self, k=0):
        j = self.i + k
        return self.t[j] if j < len(self.t) else Tok("eof", None, len(self.src))

    def is_punct(self, p, k=0):
        t = self.peek(k)
        return t.kind == "punct" and t.value == p

    def is_ident(self, name, k=0):
        t = self.peek(k)
        return t.kind == "ident" and t.value == name

    def expect_punct(self, p):
        t = self.peek()
        if not (t.kind == "punct" and t.value == p):
            self.fail(f"expected {p!r}, got {t}")
        self.i += 1

    def fail(self, msg):
        pos = self.peek().pos
        line = self.src.count("\n", 0, pos) + 1
        raise ValueError(f"line {line}: {msg}")

    def string_expr(self):
        """A string-valued expression: literals, `token(N)` calls, `std::string(...)`
        wrappers, joined by `+`. Returns a list of parts (str or int token id)."""
        parts = []
        while True:
            t = self.peek()
            if t.kind == "str":
                parts.append(t.value)
                self.i += 1
            elif t.kind == "ident" and t.value == "token" and self.is_punct("(", 1):
                self.i += 2
                n = self.peek()
                if n.kind != "num":
                    self.fail(f"token() wants an integer literal, got {n}")
                self.i += 1
                self.expect_punct(")")
                parts.append(int(n.value))
            elif t.kind == "ident" and t.value == "std" and self.is_punct("::", 1) \
                    and self.is_ident("string", 2) and self.is_punct("(", 3):
                self.i += 4
                parts.extend(self.string_expr())
                self.expect_punct(")")
            else:
                self.fail(f"expected a string expression, got {t}")
            if self.is_punct("+"):
                self.i += 1
                continue
            return normalize(parts)

    def string_list(self):
        """`{ expr, expr, ... }` with an optional trailing comma."""
        self.expect_punct("{")
        out = []
        while not self.is_punct("}"):
            out.append(self.string_expr())
            if self.is_punct(","):
                self.i += 1
            elif not self.is_punct("}"):
                self.fail(f"expected ',' or '}}', got {self.peek()}")
        self.i += 1
        return out

    def skip_balanced(self):
        """Skip one balanced (...)/{...}/[...] group starting at the current token."""
        opener = self.peek().value
        closer = {"(": ")", "{": "}", "[": "]"}[opener]
        depth = 0
        while True:
            t = self.peek()
            if t.kind == "eof":
                self.fail("unbalanced group")
            if t.kind == "punct" and t.value == opener:
                depth += 1
            elif t.kind == "punct" and t.value == closer:
                depth -= 1
                if depth == 0:
                    self.i += 1
                    return
            self.i += 1


def normalize(parts):
    """Merge adjacent text parts; a text-only string is returned as a plain str."""
    out = []
    for p in parts:
        if isinstance(p, str) and out and isinstance(out[-1], str):
            out[-1] += p
        else:
            out.append(p)
    out = [p for p in out if p != ""]
    if all(isinstance(p, str) for p in out):
        return "".join(out)
    return out


def find_functions(toks):
    """Top-level function bodies: {name: (start, end) token index range of the body}."""
    funcs = {}
    i = 0
    depth = 0
    while i < len(toks):
        t = toks[i]
        if t.kind == "punct" and t.value == "{":
            if depth == 0:
                # name is the identifier before the parameter list `( ... )`
                j = i - 1
                if toks[j].kind == "punct" and toks[j].value == ")":
                    d = 0
                    while True:
                        if toks[j].kind == "punct" and toks[j].value == ")":
                            d += 1
                        elif toks[j].kind == "punct" and toks[j].value == "(":
                            d -= 1
                            if d == 0:
                                break
                        j -= 1
                    name = toks[j - 1].value if toks[j - 1].kind == "ident" else None
                    start = i
                    d = 0
                    k = i
                    while True:
                        if toks[k].kind == "punct" and toks[k].value == "{":
                            d += 1
                        elif toks[k].kind == "punct" and toks[k].value == "}":
                            d -= 1
                            if d == 0:
                                break
                        k += 1
                    if name:
                        funcs[name] = (start, k)
                    i = k + 1
                    continue
            depth += 1
        elif t.kind == "punct" and t.value == "}":
            depth -= 1
        i += 1
    return funcs


# ----------------------------------------------------------------------- integration

def extract_integration(src):
    toks = lex(src)
    p = Parser(toks, src)
    funcs = find_functions(toks)
    grammar_cases = []
    schema_cases = []
    build_cases = []

    # test_grammar / test_schema calls anywhere (except their own definitions)
    for name in ("test_grammar", "test_schema"):
        for k, t in enumerate(toks):
            if not (t.kind == "ident" and t.value == name):
                continue
            if k + 1 >= len(toks) or not (toks[k + 1].kind == "punct" and toks[k + 1].value == "("):
                continue
            if toks[k - 1].kind == "ident" and toks[k - 1].value == "void":
                continue  # the definition
            p.i = k + 2
            desc = p.string_expr()
            p.expect_punct(",")
            body = p.string_expr()
            p.expect_punct(",")
            passing = p.string_list()
            p.expect_punct(",")
            failing = p.string_list()
            if p.is_punct(","):
                p.i += 1
            p.expect_punct(")")
            assert isinstance(desc, str) and isinstance(body, str)
            case = {"name": desc}
            case["grammar" if name == "test_grammar" else "schema"] = body
            case["passing"] = passing
            case["failing"] = failing
            case["_pos"] = t.pos
            (grammar_cases if name == "test_grammar" else schema_cases).append(case)

    # build-failure tests
    for fname, (start, end) in funcs.items():
        if not (fname.startswith("test_failure_") or fname == "test_custom_root_symbol_check"):
            continue
        strings = {}  # variable -> grammar text
        results = {}  # variable -> (grammar var, root)
        parsed = None  # grammar var of the last llama_grammar_parser::parse
        k = start
        while k < end:
            t = toks[k]
            # const std::string NAME = <string expr> ;
            if t.kind == "ident" and t.value == "string" and toks[k + 1].kind == "ident" \
                    and toks[k + 2].kind == "punct" and toks[k + 2].value == "=":
                p.i = k + 3
                strings[toks[k + 1].value] = p.string_expr()
                k = p.i
                continue
            # test_build_grammar_fails(NAME)
            if t.kind == "ident" and t.value == "test_build_grammar_fails" \
                    and toks[k + 1].value == "(" and toks[k + 2].kind == "ident":
                var = toks[k + 2].value
                build_cases.append({
                    "name": f"{fname}: {var}", "grammar": strings[var], "root": "root",
                    "build": "error", "_pos": t.pos,
                })
                k += 3
                continue
            # llama_grammar * VAR = build_grammar_with_root(NAME, "root");
            if t.kind == "ident" and t.value == "build_grammar_with_root" \
                    and toks[k - 1].value == "=" and toks[k - 2].kind == "ident" \
                    and toks[k + 1].value == "(" and toks[k + 2].kind == "ident":
                p.i = k + 4
                root = p.string_expr()
                results[toks[k - 2].value] = (toks[k + 2].value, root, t.pos)
                k = p.i
                continue
            # assert(VAR == nullptr) / assert(VAR != nullptr)
            if t.kind == "ident" and t.value == "assert" and toks[k + 1].value == "(" \
                    and toks[k + 2].kind == "ident" and toks[k + 2].value in results \
                    and toks[k + 3].value in ("==", "!=") and toks[k + 4].value == "nullptr":
                var, root, pos = results[toks[k + 2].value]
                build_cases.append({
                    "name": f"{fname}: {var} with root {root!r}", "grammar": strings[var],
                    "root": root, "build": "error" if toks[k + 3].value == "==" else "ok",
                    "_pos": pos,
                })
                k += 5
                continue
            # parsed_grammar.parse(NAME.c_str());
            if t.kind == "ident" and t.value == "parse" and toks[k - 1].value == "." \
                    and toks[k + 1].value == "(" and toks[k + 2].kind == "ident" \
                    and toks[k + 2].value in strings:
                parsed = {"name": f"{fname}: {toks[k + 2].value}",
                          "grammar": strings[toks[k + 2].value], "_pos": t.pos}
                k += 3
                continue
            # assert(parsed_grammar.rules.empty()) / assert(!parsed_grammar.rules.empty())
            if parsed is not None and t.kind == "ident" and t.value == "assert":
                p.i = k + 1
                p.skip_balanced()
                text = " ".join(str(x.value) for x in toks[k + 2:p.i - 1])
                m_empty = re.fullmatch(r"(!\s)?\w+ \. rules \. empty \( \)", text)
                m_sym = re.fullmatch(
                    r"\w+ \. symbol_ids \. find \( (\S+) \) == \w+ \. symbol_ids \. end \( \)",
                    text)
                if m_empty and not m_empty.group(1):
                    # the parse fails: no rules
                    build_cases.append({**parsed, "root": "root", "build": "error"})
                elif m_empty:
                    parsed["rules_nonempty"] = True
                elif m_sym:
                    sym = m_sym.group(1)  # the literal's value, quotes already gone
                    parsed.setdefault("absent_symbols", []).append(sym)
                    if "_added" not in parsed:
                        parsed["_added"] = True
                        build_cases.append(parsed)
                k = p.i
                continue
            k += 1
    for c in build_cases:
        c.pop("_added", None)
        if "absent_symbols" in c:
            # building with an absent root fails
            c.setdefault("root", c["absent_symbols"][0])
            c.setdefault("build", "error")
    grammar_cases = sorted(grammar_cases + build_cases, key=lambda c: c["_pos"])
    schema_cases.sort(key=lambda c: c["_pos"])
    for c in grammar_cases + schema_cases:
        del c["_pos"]
    return grammar_cases, schema_cases


# ---------------------------------------------------------------------------- parser

def extract_parser(src):
    toks = lex(src)
    p = Parser(toks, src)
    funcs = find_functions(toks)
    start, end = funcs["main"]
    parse_cases = []
    failures = []
    k = start
    while k < end:
        t = toks[k]
        if t.kind == "ident" and t.value == "verify_failure" and toks[k + 1].value == "(":
            p.i = k + 2
            g = p.string_expr()
            p.expect_punct(")")
            failures.append(g)
            k = p.i
            continue
        if t.kind == "ident" and t.value == "verify_parsing" and toks[k + 1].value == "(":
            p.i = k + 2
            g = p.string_expr()
            p.expect_punct(",")
            symbols = {}
            for name, value in pairs(p, first="str"):
                assert name not in symbols
                symbols[name] = value
            p.expect_punct(",")
            rules = []
            cur = []
            for typ, value in pairs(p, first="ident"):
                assert typ.startswith("LLAMA_GRETYPE_"), typ
                typ = typ[len("LLAMA_GRETYPE_"):]
                cur.append([typ, value])
                if typ == "END":
                    rules.append(cur)
                    cur = []
            assert not cur, f"elements after the last END: {cur}"
            p.expect_punct(")")
            parse_cases.append({"grammar": g, "symbol_ids": symbols, "rules": rules})
            k = p.i
            continue
        k += 1
    return {"parse": parse_cases, "failure": failures}


def pairs(p, first):
    """`{ {a, b}, {a, b}, ... }` where a is a string literal (first="str") or an
    identifier (first="ident") and b an integer or char literal."""
    p.expect_punct("{")
    out = []
    while not p.is_punct("}"):
        p.expect_punct("{")
        a = p.peek()
        if a.kind != first:
            p.fail(f"expected {first}, got {a}")
        p.i += 1
        p.expect_punct(",")
        b = p.peek()
        if b.kind not in ("num", "char"):
            p.fail(f"expected an integer or char literal, got {b}")
        p.i += 1
        p.expect_punct("}")
        out.append((a.value, int(b.value)))
        if p.is_punct(","):
            p.i += 1
    p.i += 1
    return out


def write(path, data):
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def main():
    tests = Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_TESTS)
    integ = (tests / "test-grammar-integration.cpp").read_text()
    parser = (tests / "test-grammar-parser.cpp").read_text()
    grammar_cases, schema_cases = extract_integration(integ)
    parser_cases = extract_parser(parser)
    DATA.mkdir(parents=True, exist_ok=True)
    write(DATA / "grammar_integration_cases.json", grammar_cases)
    write(DATA / "schema_integration_cases.json", schema_cases)
    write(DATA / "grammar_parser_cases.json", parser_cases)
    n_build = sum(1 for c in grammar_cases if "build" in c)
    n_str = lambda cs: sum(len(c.get("passing", [])) + len(c.get("failing", [])) for c in cs)
    print(f"grammar_integration_cases.json: {len(grammar_cases) - n_build} test_grammar cases "
          f"({n_str(grammar_cases)} strings) + {n_build} build checks")
    print(f"schema_integration_cases.json: {len(schema_cases)} test_schema cases "
          f"({n_str(schema_cases)} strings)")
    print(f"grammar_parser_cases.json: {len(parser_cases['parse'])} verify_parsing, "
          f"{len(parser_cases['failure'])} verify_failure")


if __name__ == "__main__":
    main()
