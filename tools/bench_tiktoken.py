#!/usr/bin/env python3
"""Times Python tiktoken's single-thread `encode_ordinary` on a text file, for comparison with
`waste bench tokenize`. Encodings are built from local rank files with tiktoken's published
patterns (no network); best of five passes after a warm-up, like the waste bench.

Usage: /tmp/tokvenv/bin/python tools/bench_tiktoken.py FILE tests/fixtures/tokenizers/cl100k_base.tiktoken ...
"""
import os
import sys
import time

import tiktoken
from tiktoken.load import load_tiktoken_bpe

PATTERNS = {
    "cl100k_base": r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""",
    "o200k_base": "|".join([
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""", r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""", r"""\s*[\r\n]+""", r"""\s+(?!\S)""", r"""\s+""",
    ]),
}


def main():
    text = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
    nbytes = len(text.encode("utf-8"))
    for path in sys.argv[2:]:
        name = os.path.basename(path).removesuffix(".tiktoken")
        enc = tiktoken.Encoding(name=name, pat_str=PATTERNS[name], mergeable_ranks=load_tiktoken_bpe(path), special_tokens={})
        ids = enc.encode_ordinary(text)
        best = float("inf")
        for _ in range(5):
            t = time.perf_counter()
            ids = enc.encode_ordinary(text)
            best = min(best, time.perf_counter() - t)
        print(f"tiktoken {tiktoken.__version__} {name}: {nbytes} bytes, {len(ids)} tokens, {best:.3f} s, "
              f"{nbytes / 1e6 / best:.2f} MB/s (best of 5, one thread)")


main()
