#!/usr/bin/env python3
"""Times the Hugging Face `tokenizers` library's markup encoding (added tokens resolved,
`add_special_tokens=False`) of a text file, for comparison with
`waste bench tokenize --markup`; best of five passes after a warm-up, one call at a time.

Usage: python tools/bench_hf_tokenizers.py FILE tokenizer.json  (needs `pip install tokenizers`)
"""
import sys
import time

import tokenizers
from tokenizers import Tokenizer


def main():
    text = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
    nbytes = len(text.encode("utf-8"))
    tok = Tokenizer.from_file(sys.argv[2])
    ids = tok.encode(text, add_special_tokens=False).ids
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        best = min(best, time.perf_counter() - t)
    print(f"tokenizers {tokenizers.__version__}: {nbytes} bytes, {len(ids)} tokens, {best:.3f} s, "
          f"{nbytes / 1e6 / best:.2f} MB/s (markup, best of 5)")


if __name__ == "__main__":
    main()
