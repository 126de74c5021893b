#!/usr/bin/env python3
"""Builds the ~10 MB mixed text for the tokenizer throughput benchmark, deterministically
from files on this machine, and prints its size and sha256.

Three parts, each taken in sorted path order and cut at a byte budget (on a line boundary):
  code    6,000,000 bytes: every *.py of the running Python's standard library
          (sys.prefix/lib/python3.X, without test/ and site-packages/)
  prose   1,000,000 bytes: /usr/share/common-licenses/* then /usr/share/doc/*/copyright
  i18n    3,000,000 bytes: the translated strings (msgstr) of every /usr/share/locale/*/LC_MESSAGES/*.mo,
          one per line (dozens of languages and scripts: Latin, Cyrillic, Greek, Arabic,
          Hebrew, Devanagari, Thai, CJK...)
Files that are not valid UTF-8 are skipped.

Usage: python3 tools/make_bench_corpus.py /tmp/bench_corpus.txt
"""
import glob
import hashlib
import os
import struct
import sys


def take(paths, budget, read):
    out, size = [], 0
    for p in paths:
        try:
            text = read(p)
        except (UnicodeDecodeError, OSError, ValueError, struct.error):
            continue
        for line in text.splitlines(keepends=True):
            n = len(line.encode("utf-8"))
            if size + n > budget:
                return "".join(out)
            out.append(line)
            size += n
    return "".join(out)


def read_text(p):
    with open(p, encoding="utf-8") as f:
        return f.read()


def read_mo(p):
    """The msgstr strings of a GNU .mo catalog (format: magic, revision, count, offsets)."""
    with open(p, "rb") as f:
        data = f.read()
    magic = struct.unpack("<I", data[:4])[0]
    order = "<" if magic == 0x950412DE else ">"
    n, _, trans = struct.unpack(order + "3I", data[8:20])
    lines = []
    for i in range(n):
        length, off = struct.unpack(order + "2I", data[trans + 8 * i: trans + 8 * i + 8])
        s = data[off:off + length].decode("utf-8")
        if i == 0 and s.startswith("Project-Id") or "Content-Type" in s:
            continue  # the catalog header
        lines.extend(part for part in s.split("\0") if part.strip())
    return "\n".join(lines) + "\n"


def main():
    lib = os.path.join(sys.prefix, "lib", "python%d.%d" % sys.version_info[:2])
    code = sorted(p for p in glob.glob(os.path.join(lib, "**", "*.py"), recursive=True)
                  if "/test/" not in p and "/site-packages/" not in p)
    prose = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright"))
    mo = sorted(glob.glob("/usr/share/locale/*/LC_MESSAGES/*.mo"))
    text = take(code, 6_000_000, read_text) + take(prose, 1_000_000, read_text) + take(mo, 3_000_000, read_mo)
    data = text.encode("utf-8")
    with open(sys.argv[1], "wb") as f:
        f.write(data)
    print(f"{sys.argv[1]}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}, "
          f"{sum(1 for c in text if ord(c) > 127)} non-ASCII characters; from {lib}")


main()
