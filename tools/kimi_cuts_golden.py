#!/usr/bin/env python3
"""Golden ids for Kimi's input cuts, from tiktoken driven the way tokenization_kimi.py drives it.

tokenization_kimi.py (moonshotai's Kimi/Moonlight tokenizer) does not hand the whole text to
tiktoken: it encodes windows of 400,000 characters, each cut further wherever a run of
consecutive whitespace (str.isspace) or non-whitespace characters grows past 25,000, and
concatenates the ids. This script reimplements those two loops (from reading the reference)
and encodes each piece with tiktoken, using o200k's ranks as a stand-in for Kimi's
tiktoken.model (Kimi's split pattern, Kimi's numbering of reserved specials after the ranks).

Writes tests/fixtures/tokenizers/kimi_cuts_golden.json: per case the text's recipe, the
number of ids, an FNV-1a-64 hash of the ids (u32 little-endian), and the ids themselves for
the smaller cases.

Usage: python tools/kimi_cuts_golden.py tests/fixtures/tokenizers  (needs `pip install tiktoken`)
"""
import json
import sys

import tiktoken
from tiktoken.load import load_tiktoken_bpe

WINDOW = 400_000
RUN = 25_000


def cuts(text):
    """The pieces tokenization_kimi.py encodes one by one."""
    for w in range(0, len(text), WINDOW):
        s = text[w:w + WINDOW]
        start, run, space = 0, 0, s[0].isspace()
        for i, c in enumerate(s):
            now = c.isspace()
            if now != space:
                run, space = 1, now
            else:
                run += 1
                if run > RUN:
                    yield s[start:i]
                    start, run = i, 1
        yield s[start:]


def fnv(ids):
    h = 0xcbf29ce484222325
    for i in ids:
        for b in i.to_bytes(4, "little"):
            h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


# (name, recipe: list of [string, repeat], markup?)
CASES = [
    ("abc_x10000", [["abc", 10000]], False),
    ("spaces_30001_then_x", [[" ", 30001], ["x", 1]], False),
    ("exact_run_25000", [["q", 25000], [" ", 1], ["q", 25001]], False),
    ("separators_x1c", [["a", 3], ["\x1c", 25010], ["b", 2]], False),
    ("window_ab_space", [["ab ", 140000]], False),
    ("window_cjk", [["\u4e16\u754c", 210000]], False),
    ("special_across_run_cut", [["a", 24995], ["<|reserved_token_200000|>", 1], ["z", 3]], True),
    ("special_before_run_cut", [["a", 24000], ["<|reserved_token_200000|>", 1], [" z", 3]], True),
]


def main(fixtures):
    g = json.load(open(f"{fixtures}/tiktoken_golden.json"))
    ranks = load_tiktoken_bpe(f"{fixtures}/o200k_base.tiktoken")
    specials = {f"<|reserved_token_{i}|>": i for i in range(len(ranks), len(ranks) + 256)}
    enc = tiktoken.Encoding("kimi-o200k", pat_str=g["kimi_pat_str"], mergeable_ranks=ranks, special_tokens=specials)
    out = []
    for name, recipe, markup in CASES:
        text = "".join(s * n for s, n in recipe)
        ids = []
        for piece in cuts(text):
            ids += enc.encode(piece, allowed_special="all") if markup else enc.encode(piece, disallowed_special=())
        whole = enc.encode(text, allowed_special="all") if markup else enc.encode_ordinary(text)
        case = {"name": name, "recipe": recipe, "markup": markup, "n": len(ids), "fnv64": fnv(ids),
                "n_uncut": len(whole)}
        if len(ids) <= 20000:
            case["ids"] = ids
        out.append(case)
        print(name, len(ids), "uncut", len(whole), file=sys.stderr)
    doc = {"generator": "tools/kimi_cuts_golden.py", "tiktoken_version": tiktoken.__version__,
           "note": "o200k ranks with Kimi's pattern and reserved specials, cut as tokenization_kimi.py cuts",
           "cases": out}
    with open(f"{fixtures}/kimi_cuts_golden.json", "w") as f:
        json.dump(doc, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/tokenizers")
