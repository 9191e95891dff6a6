#!/usr/bin/env python3
"""Fetches the llama-cpp-python 0.3.36 source package (it vendors llama.cpp 0c1e570 with its
server test suite) from PyPI's simple index into DEST and unpacks it; checks its sha256.
(`pip download --no-binary` would build the package's metadata with cmake first.)"""
import hashlib
import re
import sys
import tarfile
import urllib.request
from pathlib import Path

NAME, VERSION = "llama-cpp-python", "0.3.36"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"

dest = Path(sys.argv[1])
dest.mkdir(parents=True, exist_ok=True)
tarball = dest / f"llama_cpp_python-{VERSION}.tar.gz"
if not tarball.exists():
    index = urllib.request.urlopen(f"https://pypi.org/simple/{NAME}/", timeout=120).read().decode()
    links = re.findall(rf'href="([^"#]+llama_cpp_python-{re.escape(VERSION)}\.tar\.gz)[^"]*"', index)
    if not links:
        sys.exit(f"{NAME} {VERSION}: no source package in the index")
    data = urllib.request.urlopen(links[0], timeout=600).read()
    if hashlib.sha256(data).hexdigest() != SHA256:
        sys.exit(f"{tarball.name}: sha256 mismatch")
    tmp = tarball.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.rename(tarball)
with tarfile.open(tarball) as t:
    t.extractall(dest, filter="data")
print(dest / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp")
