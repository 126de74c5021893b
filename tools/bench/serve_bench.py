#!/usr/bin/env python3
"""Measures a running `waste serve`: requests per second and time to first token, cold and warm.

Usage: serve_bench.py BASE_URL [--concurrency C] [--requests N] [--max-tokens T]
                      [--prompt-words W] [--conversations R] [--key KEY]

Three measurements, standard library only (http.client over kept-alive connections):

  health       N x GET /health over C connections: the HTTP layer alone.
  completions  N x POST /v1/completions ("Once upon a time", T tokens, greedy) over C connections:
               requests per second and generated tokens per second through the model thread.
  ttft         R conversations, each two turns, streamed: turn 1 carries a fresh system prompt of
               W words (no slot holds it: a cold prefill), turn 2 is the same conversation plus
               the reply and a short question (the slot holds all but the new message: warm).
               Time to first token = from sending the request to the first chunk with content.
               Reported: the median and the range, and the prompt and cached tokens of each turn.

Prints one JSON object. Figures are measured, never estimated; run against an idle server.
"""

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
import urllib.parse


def connect(base):
    u = urllib.parse.urlparse(base)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)


def headers(key):
    h = {"Content-Type": "application/json"}
    if key:
        h["Authorization"] = f"Bearer {key}"
    return h


def burst(base, key, n, concurrency, make):
    """Sends n requests made by make(i) -> (method, path, body) over `concurrency` connections."""
    errors, done = [], [0]
    lock = threading.Lock()

    def worker(t):
        c = connect(base)
        for i in range(t, n, concurrency):
            method, path, body = make(i)
            c.request(method, path, body=body, headers=headers(key))
            r = c.getresponse()
            data = r.read()
            with lock:
                if r.status != 200:
                    errors.append((r.status, data[:200]))
                else:
                    done[0] += 1
        c.close()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(concurrency)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        sys.exit(f"{len(errors)} requests failed, first: {errors[0]}")
    return elapsed


def stream_ttft(base, key, messages, max_tokens):
    """Streams one chat request; returns (seconds to the first content chunk, reply, usage)."""
    c = connect(base)
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    start = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body=body, headers=headers(key))
    r = c.getresponse()
    if r.status != 200:
        sys.exit(f"chat: {r.status} {r.read()[:200]}")
    first, reply, usage, buf = None, [], None, b""
    while True:
        line = r.fp.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if chunk.get("usage"):
            usage = chunk["usage"]
        for ch in chunk.get("choices", []):
            text = ch.get("delta", {}).get("content")
            if text:
                if first is None:
                    first = time.perf_counter() - start
                reply.append(text)
    c.close()
    return first, "".join(reply), usage


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--prompt-words", type=int, default=400)
    ap.add_argument("--conversations", type=int, default=5)
    ap.add_argument("--key", default="")
    a = ap.parse_args()
    out = {}

    t = burst(a.base, a.key, a.requests * 10, a.concurrency, lambda i: ("GET", "/health", None))
    out["health"] = {"requests": a.requests * 10, "concurrency": a.concurrency, "seconds": round(t, 3),
                     "requests_per_s": round(a.requests * 10 / t, 1)}

    body = json.dumps({"prompt": "Once upon a time", "max_tokens": a.max_tokens, "temperature": 0})
    t = burst(a.base, a.key, a.requests, a.concurrency, lambda i: ("POST", "/v1/completions", body))
    out["completions"] = {"requests": a.requests, "concurrency": a.concurrency, "max_tokens": a.max_tokens,
                          "seconds": round(t, 3), "requests_per_s": round(a.requests / t, 2),
                          "generated_tokens_per_s": round(a.requests * a.max_tokens / t, 1)}

    rng = random.Random(1)
    words = ["river", "stone", "lantern", "harbor", "meadow", "engine", "copper", "winter", "signal", "garden",
             "violet", "anchor", "thunder", "paper", "orbit", "maple", "canyon", "silver", "ember", "tide"]
    cold, warm, turns = [], [], []
    for r in range(a.conversations):
        system = f"Conversation {r}. " + " ".join(rng.choice(words) for _ in range(a.prompt_words))
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": "Tell me a story."}]
        t1, reply, u1 = stream_ttft(a.base, a.key, msgs, a.max_tokens)
        msgs += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]
        t2, _, u2 = stream_ttft(a.base, a.key, msgs, a.max_tokens)
        cold.append(t1)
        warm.append(t2)
        turns.append({"cold": {"ttft_s": round(t1, 4), "prompt": u1["prompt_tokens"], "cached": u1["prompt_tokens_details"]["cached_tokens"]},
                      "warm": {"ttft_s": round(t2, 4), "prompt": u2["prompt_tokens"], "cached": u2["prompt_tokens_details"]["cached_tokens"]}})
    out["ttft"] = {"cold_median_s": round(statistics.median(cold), 4), "cold_range_s": [round(min(cold), 4), round(max(cold), 4)],
                   "warm_median_s": round(statistics.median(warm), 4), "warm_range_s": [round(min(warm), 4), round(max(warm), 4)],
                   "turns": turns}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
