#!/usr/bin/env python3
"""How well a routing trace's past predicts each layer's next choice (issue 15).

    python3 tools/bench/route_predict.py tests/fixtures/traces/olmoe_299.jsonl [...]

For every token from the 20th on and every MoE layer, the top-k experts by each score are
compared with the layer's actual choice (precision: the share of the top k chosen), every
count learned online from the tokens before:
  recency  chosen at the previous token (ties broken by frequency)
  freq     decayed frequency (x0.95 a token)
  follow   chosen after the experts this layer chose at the previous token
  cross    chosen together with the experts the previous layer chose in the same token
Standard library only.
"""
import json
import sys


def top(score, k):
    return set(sorted(range(len(score)), key=lambda e: -score[e])[:k])


def main(path):
    toks = [json.loads(line)["layers"] for line in open(path) if line.strip()]
    layers, k = len(toks[0]), len(toks[0][0])
    experts = 1 + max(e for t in toks for layer in t for e in layer)
    zeros = lambda: [[[0.0] * experts for _ in range(experts)] for _ in range(layers)]
    cross, follow = zeros(), zeros()
    freq = [[0.0] * experts for _ in range(layers)]
    hits = {"recency": [], "freq": [], "follow": [], "cross": []}
    for t, tok in enumerate(toks):
        for l, chosen in enumerate(tok):
            chosen = set(chosen)
            if t >= 20:
                f = freq[l]
                prev = set(toks[t - 1][l])
                scores = {
                    "recency": [(e in prev) + 1e-3 * f[e] for e in range(experts)],
                    "freq": f,
                    "follow": [sum(follow[l][a][e] for a in prev) + 1e-3 * f[e] for e in range(experts)],
                }
                if l > 0:
                    scores["cross"] = [sum(cross[l][a][e] for a in tok[l - 1]) + 1e-3 * f[e] for e in range(experts)]
                for name, s in scores.items():
                    hits[name].append(len(chosen & top(s, k)) / k)
            if l > 0:
                for a in tok[l - 1]:
                    for e in chosen:
                        cross[l][a][e] += 1
            if t > 0:
                for a in toks[t - 1][l]:
                    for e in chosen:
                        follow[l][a][e] += 1
            freq[l] = [v * 0.95 for v in freq[l]]
            for e in chosen:
                freq[l][e] += 1
    print(path, " ".join(f"{n} {sum(v) / len(v):.3f}" for n, v in hits.items()))


if __name__ == "__main__":
    for p in sys.argv[1:]:
        main(p)
