#!/usr/bin/env python3
"""Reads the suite's JUnit files (results/{llama,lamina}-test_X.py.xml) and prints, per test file,
the tests passed by llama-server, by Lamina and by both, then the tests llama-server passes and
Lamina fails: those listed in expected-failures.txt (with their reason) and the rest, which are
regressions. Exits 1 when there is any unlisted one."""
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


def main():
    results, listed = Path(sys.argv[1]), expected_failures(Path(sys.argv[2]))
    files = sorted({p.name.split("-", 1)[1][: -len(".xml")] for p in results.glob("*-test_*.xml")})
    rows, unlisted, explained = [], [], []
    totals = [0, 0, 0, 0]
    for f in files:
        llama = outcomes(results / f"llama-{f}.xml")
        lamina = outcomes(results / f"lamina-{f}.xml")
        stem = f[: -len(".py")]
        n = len(set(llama) | set(lamina))
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
