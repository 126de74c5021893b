#!/usr/bin/env python3
"""Compares two logit dumps of `waste eval --dump-logits` (raw little-endian f32,
positions x vocab): max and mean |a - b|, the relative error max|a - b| / max|a| (a is the
reference), the RMS relative error ||a - b|| / ||a|| per position (worst and mean), and how
many positions keep the reference's top-1 token. Standard library only.

    python3 tools/compare_logits.py REFERENCE.logits OTHER.logits VOCAB
"""
import array
import math
import sys


def load(path):
    a = array.array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    ref, other, vocab = load(sys.argv[1]), load(sys.argv[2]), int(sys.argv[3])
    if len(ref) != len(other) or len(ref) % vocab:
        sys.exit(f"sizes differ or are not a multiple of {vocab}: {len(ref)} vs {len(other)}")
    positions = len(ref) // vocab
    diffs = [abs(x - y) for x, y in zip(ref, other)]
    ref_max = max(abs(x) for x in ref)
    rel_rms, top1 = [], 0
    for p in range(positions):
        r, o = ref[p * vocab:(p + 1) * vocab], other[p * vocab:(p + 1) * vocab]
        num = math.sqrt(sum((x - y) ** 2 for x, y in zip(r, o)))
        den = math.sqrt(sum(x * x for x in r)) or 1.0
        rel_rms.append(num / den)
        top1 += max(range(vocab), key=r.__getitem__) == max(range(vocab), key=o.__getitem__)
    print(f"positions={positions} vocab={vocab} max_abs={max(diffs):.6f} mean_abs={sum(diffs) / len(diffs):.6f} "
          f"ref_absmax={ref_max:.4f} max_rel={max(diffs) / ref_max:.2e} "
          f"rms_rel_worst={max(rel_rms):.2e} rms_rel_mean={sum(rel_rms) / positions:.2e} top1_same={top1}/{positions}")


if __name__ == "__main__":
    main()
