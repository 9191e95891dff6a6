#!/usr/bin/env python3
"""Reads the suite's JUnit files (results/{llama,lamina}-test_X.py.xml) and prints, per test file,
the tests passed by llama-server, by Lamina and by both, then the tests llama-server passes and
Lamina fails: those listed in expected-failures.txt (with their reason) and the rest, which are
regressions. Exits 1 when there is any unlisted one.

  table.py RESULTS EXPECTED_FAILURES LLAMA_PASSES [--record]

Where llama-server was not run (CI runs only the Lamina half), what it passes is read from
LLAMA_PASSES (`file::test` per line, with `# file: N tests` lines); `--record` writes that file
from llama-server's results instead."""
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def outcomes(path):
    """{test id: passed?}; skipped tests are left out."""
    result = {}
    if not path.exists():
        return result
    for case in ET.parse(path).getroot().iter("testcase"):
        if case.find("skipped") is not None:
            continue
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        result[name] = case.find("failure") is None and case.find("error") is None
    return result


def expected_failures(path):
    """`test_file.py::test_name[params]  reason` lines; `#` comments. A name ending in `*`
    matches every test that starts with it."""
    listed = {}
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, reason = line.partition(" ")
            listed[name] = reason.strip()
    return listed


def reason_for(test, listed):
    if test in listed:
        return listed[test]
    for name, reason in listed.items():
        if name.endswith("*") and test.startswith(name[:-1]):
            return reason
    return None


def recorded_passes(path):
    """{file: ({test: True}, n_tests)} from a LLAMA_PASSES file."""
    out = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if line.startswith("# ") and ": " in line and line.endswith(" tests"):
            f, n = line[2:].split(": ")
            out.setdefault(f, ({}, 0))
            out[f] = (out[f][0], int(n.split()[0]))
        elif line and not line.startswith("#"):
            f, t = line.split("::", 1)
            stem = f[: -len(".py")]
            out.setdefault(f, ({}, 0))[0][f"{stem}::{t}"] = True
    return out


def record(results, path):
    lines = ["# Tests of llama.cpp's server suite that llama-server (0c1e570, AVX2 build) passes on",
             "# our models, written by scripts/llama-server-suite/run.sh; CI compares Lamina to it."]
    for p in sorted(results.glob("llama-test_*.xml")):
        f = p.name[len("llama-"): -len(".xml")]
        o = outcomes(p)
        lines.append(f"# {f}: {len(o)} tests")
        lines += [f"{f}::{t.split('::', 1)[1]}" for t, ok in sorted(o.items()) if ok]
    path.write_text("\n".join(lines) + "\n")


def main():
    results, listed = Path(sys.argv[1]), expected_failures(Path(sys.argv[2]))
    passes = Path(sys.argv[3])
    if "--record" in sys.argv:
        record(results, passes)
    recorded = recorded_passes(passes)
    files = sorted({p.name.split("-", 1)[1][: -len(".xml")] for p in results.glob("*-test_*.xml")})
    rows, unlisted, explained = [], [], []
    totals = [0, 0, 0, 0]
    for f in files:
        llama_xml = results / f"llama-{f}.xml"
        lamina = outcomes(results / f"lamina-{f}.xml")
        stem = f[: -len(".py")]
        if llama_xml.exists():
            llama = outcomes(llama_xml)
            n = len(set(llama) | set(lamina))
        else:
            llama, n_rec = recorded.get(f, ({}, 0))
            n = max(n_rec, len(lamina))
        a = sum(llama.values())
        b = sum(lamina.values())
        both = sum(1 for t, ok in llama.items() if ok and lamina.get(t))
        rows.append((f, n, a, b, both))
        for i, v in enumerate((n, a, b, both)):
            totals[i] += v
        for t, ok in sorted(llama.items()):
            if ok and not lamina.get(t):
                full = f"{stem}.py::{t.split('::', 1)[1]}"
                why = reason_for(full, listed)
                (explained if why else unlisted).append((full, why))
    print(f"| test file | tests | llama-server | lamina | both |")
    print(f"|---|---:|---:|---:|---:|")
    for f, n, a, b, both in rows:
        print(f"| {f} | {n} | {a} | {b} | {both} |")
    print(f"| **all** | {totals[0]} | {totals[1]} | {totals[2]} | {totals[3]} |")
    if explained:
        print(f"\nPassed by llama-server, failed by Lamina on purpose ({len(explained)}):")
        for t, why in explained:
            print(f"  {t}: {why}")
    if unlisted:
        print(f"\nPassed by llama-server, failed by Lamina, not listed ({len(unlisted)}):")
        for t, _ in unlisted:
            print(f"  {t}")
        sys.exit(1)


if __name__ == "__main__":
    main()
