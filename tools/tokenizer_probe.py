#!/usr/bin/env python3
"""Cross-checks waste's tokenizers against the reference libraries beyond the committed goldens.

1. Unicode classes: for every code point, the membership in \\p{L}, \\p{Lu}, \\p{Ll}, \\p{Lt},
   \\p{Lm}, \\p{Lo}, \\p{M}, \\p{N}, \\p{P}, \\p{S}, \\s and \\p{Han} as tiktoken's regex engine
   (fancy-regex) and Hugging Face tokenizers' (Oniguruma) see it, against the generated
   src/tokenizer/unicode_tables.rs. (A pattern that matches one class drops everything else
   from tiktoken's output, so membership is observable through encode_ordinary.)
2. Differential encoding of seeded random texts (every scalar value, ASCII-heavy, with the
   characters that stress the patterns): tiktoken encode_ordinary vs `waste tokenize --content`
   for the tiktoken rank files, o200k ranks under Kimi's pattern (as a tiktoken.model), and the
   HF tokenizers library vs waste for DeepSeek-V3 and the family fixtures.

Usage: /tmp/tokvenv/bin/python tools/tokenizer_probe.py [--texts N]   (pip install tiktoken tokenizers)
Needs target/release/waste built. Prints a summary; exits 1 on any difference.
"""
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile

import tiktoken
from tiktoken.load import load_tiktoken_bpe
from tokenizers import Regex, Tokenizer, pre_tokenizers

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
WASTE = os.path.join(ROOT, "target", "release", "waste")
FIX = os.path.join(ROOT, "tests", "fixtures", "tokenizers")
GOLDEN = json.load(open(os.path.join(FIX, "tiktoken_golden.json"), encoding="utf-8"))
ALL = [c for c in range(0x110000) if not 0xD800 <= c < 0xE000]


def _marks():
    src = open(os.path.join(ROOT, "src", "tokenizer", "unicode_tables.rs"), encoding="utf-8").read()
    body = src[src.index("CCC_RUNS"):]
    runs = [int(x, 16) for x in re.findall(r"0x([0-9a-f]+)", body[body.index("= [") + 3:body.index("];")])]
    out = []
    for i, r in enumerate(runs):
        if r & 0xFF:
            out.extend(chr(c) for c in range(r >> 8, runs[i + 1] >> 8) if not 0xD800 <= c < 0xE000)
    return out


MARKS = _marks()


def our_classes():
    src = open(os.path.join(ROOT, "src", "tokenizer", "unicode_tables.rs"), encoding="utf-8").read()
    body = src[src.index("CLASS_RUNS"):]
    body = body[body.index("= [") + 3:body.index("];")]
    runs = [int(x, 16) for x in re.findall(r"0x([0-9a-f]+)", body)]
    table = bytearray(0x110000)
    for i, r in enumerate(runs):
        end = runs[i + 1] >> 8 if i + 1 < len(runs) else 0x110000
        table[r >> 8:end] = bytes([r & 0xFF]) * (end - (r >> 8))
    groups = {"L": {1, 2, 3, 4, 5}, "Lu": {1}, "Ll": {2}, "Lt": {3}, "Lm": {4}, "Lo": {5}, "M": {6}, "N": {7}, "P": {8}, "S": {9}}
    out = {k: {c for c in ALL if table[c] & 0x0F in g} for k, g in groups.items()}
    out["s"] = {c for c in ALL if table[c] & 0x10}
    out["Han"] = {c for c in ALL if table[c] & 0x20}
    return out


def probe_classes():
    text = "".join(chr(c) for c in ALL)
    ranks = {bytes([i]): i for i in range(256)}
    ours = our_classes()
    bad = 0
    for name, ref in ours.items():
        pat = r"\s" if name == "s" else r"\p{%s}" % name
        enc = tiktoken.Encoding(name="probe", pat_str=pat, mergeable_ranks=ranks, special_tokens={})
        tik = set(map(ord, bytes(enc.encode_ordinary(text)).decode("utf-8")))
        split = pre_tokenizers.Split(Regex(pat), behavior="removed")
        keep = set()
        for i in range(0, len(text), 100000):
            for piece, _ in split.pre_tokenize_str(text[i:i + 100000]):
                keep.update(map(ord, piece))
        hf = set(ALL) - keep
        d1, d2 = len(tik ^ ref), len(hf ^ ref)
        bad += d1 + (d2 if name != "Han" else 0)
        print(f"class {pat:8} ours {len(ref):6}  tiktoken differs in {d1}  HF differs in {d2}")
    return bad


def random_text(rng, n):
    tricky = " \n\r\t'sS\u017f\u0301\u0308\u200d\ufe0f\U0001F3FD\U0001F468世界かナ한مन\u094dก1٣①\u00a0\u3000\u0085\u2028<|>/ǅßİ"
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.5:
            out.append(chr(rng.randrange(0x20, 0x7F)))
        elif r < 0.8:
            out.append(rng.choice(tricky))
        else:
            c = rng.randrange(0x110000)
            out.append(chr(c) if not 0xD800 <= c < 0xE000 else "x")
    return "".join(out)


def marks_text(rng, n):
    """Bases followed by runs of combining marks of every age: NFC reordering and composition."""
    import unicodedata
    bases = "aeiouAEIOUnNcCsSzZ\u0391\u03b1\u0415\u0435\u1100\u1161\u11a8\u0627\u0928 "
    marks = MARKS
    return "".join(rng.choice(bases) + "".join(rng.choice(marks) for _ in range(rng.randrange(0, 4))) for _ in range(n))


def waste_ids(tok_path, text):
    r = subprocess.run([WASTE, "tokenize", "--tokenizer", tok_path, "--content", "--json", "-"], input=text.encode(),
                       capture_output=True, check=True)
    return json.loads(r.stdout)["ids"]


def differential(count):
    rng = random.Random(20261129)
    texts = [random_text(rng, rng.randrange(1, 3000)) for _ in range(count)]
    texts += [marks_text(rng, rng.randrange(1, 400)) for _ in range(count // 4)]
    bad = 0
    tmp = tempfile.mkdtemp()
    try:
        shutil.copy(os.path.join(FIX, "o200k_base.tiktoken"), os.path.join(tmp, "tiktoken.model"))
        cases = []
        for name, enc in GOLDEN["encodings"].items():
            path = os.path.join(FIX, enc["file"])
            ref = tiktoken.Encoding(name=name, pat_str=enc["pat_str"], mergeable_ranks=load_tiktoken_bpe(path), special_tokens={})
            cases.append((name, path, ref.encode_ordinary))
        kimi = tiktoken.Encoding(name="kimi", pat_str=GOLDEN["kimi_pat_str"],
                                 mergeable_ranks=load_tiktoken_bpe(os.path.join(FIX, "o200k_base.tiktoken")), special_tokens={})
        cases.append(("kimi pattern, o200k ranks", os.path.join(tmp, "tiktoken.model"), kimi.encode_ordinary))
        hf = [("deepseek_v3", os.path.join(ROOT, "tests", "fixtures", "tokenizers", "deepseek_v3_tokenizer.json"))]
        hf += [(f, os.path.join(FIX, "hf", f + ".json")) for f in
               ["gpt2", "smollm2", "qwen2", "olmoe", "llama3", "llama2", "llama2_metaspace"]]
        for name, path in hf:
            if not os.path.exists(path):
                print(f"skip {name}: {path} missing")
                continue
            doc = json.load(open(path, encoding="utf-8"))
            doc["added_tokens"] = []
            ref = Tokenizer.from_str(json.dumps(doc))
            cases.append((name, path, lambda t, ref=ref: ref.encode(t, add_special_tokens=False).ids))
        for name, path, ref in cases:
            diffs = sum(1 for t in texts if ref(t) != waste_ids(path, t))
            bad += diffs
            print(f"{name:28} {len(texts)} random texts ({sum(map(len, texts))} chars): {diffs} differ")
    finally:
        shutil.rmtree(tmp)
    return bad


def main():
    count = int(sys.argv[sys.argv.index("--texts") + 1]) if "--texts" in sys.argv else 100
    bad = probe_classes() + differential(count)
    print("all identical" if bad == 0 else f"{bad} differences")
    sys.exit(1 if bad else 0)


main()
