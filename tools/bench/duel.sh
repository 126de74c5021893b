#!/usr/bin/env bash
# waste against llama.cpp on the same weights, on this machine, in one window.
#
#   tools/bench/duel.sh            # everything: build, models, 3 rounds, one table
#   ROUNDS=5 KINDS="q4 q8" tools/bench/duel.sh
#
# What it does (nothing here is part of `make test`):
#  1. builds waste (`cargo build --release`);
#  2. builds llama.cpp under target/llamacpp/ if target/llamacpp/build/bin/llama-bench is not
#     there: the PyPI sdist of llama-cpp-python 0.3.36 (which bundles llama.cpp 0c1e57098;
#     its sha256 is checked), a venv with cmake, ninja, numpy and gguf, and a -DGGML_NATIVE=ON
#     Release build of llama-bench (docs/BENCHMARKS.md, "How llama.cpp was obtained");
#  3. makes the random Llama-3.2-1B-shaped checkpoint (BF16), its Q4B32 and Q8B32
#     quantizations, and their lossless GGUF transcodes (Q4_0, Q8_0, BF16) with
#     tools/bench/waste_to_gguf.py --check, under target/bench/ (skipped when present);
#  4. measures the read bandwidth with `waste bench matmul` (a SIMD sum of 1 GiB);
#  5. runs, ROUNDS times and alternating engine by engine, for each kind of weights:
#       waste bench M --prompt-tokens 128 -n 64      decode (64 after 128) and prefill 128
#       waste bench M --prompt-tokens 512 -n 1       prefill 512
#       llama-bench -m G -p 0 -n 64 -d 128 -r 1      tg64 @ d128 (decode after 128)
#       llama-bench -m G -p 128,512 -n 0 -r 1        pp128, pp512
#     with THREADS threads each (default 2), and prints the load average before each round;
#  6. prints one table: host, ISA, per kind the median over rounds of each figure (the rounds
#     in parentheses) and the waste / llama.cpp ratios, and the read bandwidth.
#
# Environment: ROUNDS (3), THREADS (2), KINDS ("q4 q8 bf16"), WASTE_ARGS (extra options for
# `waste bench`, e.g. --int8-act), LLAMA_ARGS (extra options for llama-bench), DUEL_DIR (where
# the builds and models go; default target/ of this repository), WASTE_BIN (a waste binary to
# time instead of this tree's, e.g. an older build for a before/after table; this tree's
# binary still makes the models), PRIO (a command prefix for every timed run of both engines,
# e.g. "chrt -f 10" on a machine other jobs share: as root, SCHED_FIFO keeps their threads off
# the CPUs while one engine runs; the kernel's RT throttling still leaves them 5 %), ISA (avx2:
# both engines held to AVX2 on an AVX-512 machine, waste by `--isa avx2` and llama.cpp built
# without AVX-512 into target/llamacpp/build-avx2 — a stand-in for an AVX2-only host, with
# this CPU's cores, caches and memory).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${DUEL_DIR:-$ROOT/target}
LL=$DIR/llamacpp
MODELS=$DIR/bench
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
KINDS=${KINDS:-"q4 q8 bf16"}
WASTE_ARGS=${WASTE_ARGS:-}
LLAMA_ARGS=${LLAMA_ARGS:-}
PRIO=${PRIO:-}
WASTE=$ROOT/target/release/waste
TIMED=${WASTE_BIN:-$WASTE}
ISA=${ISA:-}
if [ -n "$ISA" ]; then
    # Both engines held to one instruction set: waste's kernels by --isa, llama.cpp built for it.
    WASTE_ARGS="$WASTE_ARGS --isa $ISA"
    export LLAMA_ISA=$ISA
fi
PY=$LL/venv/bin/python

say() { echo "duel: $*" >&2; }
# build_llamacpp DIR TOOL... (tools/bench/llamacpp.sh)
source "$ROOT/tools/bench/llamacpp.sh"
BENCH=$(llamacpp_build "$LL")/bin/llama-bench

make_models() {
    mkdir -p "$MODELS" "$LL/models"
    [ -f "$MODELS/llama1b/model.safetensors" ] || "$WASTE" random-model --preset llama-1b --out "$MODELS/llama1b" >&2
    [ -f "$MODELS/llama1b-q4/model.safetensors" ] || "$WASTE" quantize --in "$MODELS/llama1b" --out "$MODELS/llama1b-q4" >&2
    [ -f "$MODELS/llama1b-q8/model.safetensors" ] || "$WASTE" quantize --bits 8 --in "$MODELS/llama1b" --out "$MODELS/llama1b-q8" >&2
    [ -x "$PY" ] || { python3 -m venv "$LL/venv" && "$LL/venv/bin/pip" install -q cmake ninja numpy gguf >&2; }
    for k in $KINDS; do
        local g; g=$(gguf_of "$k")
        [ -f "$g" ] || "$PY" "$ROOT/tools/bench/waste_to_gguf.py" "$(waste_of "$k")" "$g" --check >&2
    done
}

waste_of() { case $1 in q4) echo "$MODELS/llama1b-q4";; q8) echo "$MODELS/llama1b-q8";; bf16) echo "$MODELS/llama1b";; esac; }
gguf_of() { case $1 in q4) echo "$LL/models/llama1b-q4_0.gguf";; q8) echo "$LL/models/llama1b-q8_0.gguf";; bf16) echo "$LL/models/llama1b-bf16.gguf";; esac; }

json_field() { "$PY" -c "import json,sys; d=json.loads(sys.stdin.read()); print(d$1)"; }

main() {
    cd "$ROOT"
    cargo build --release >&2
    build_llamacpp "$LL" llama-bench
    make_models
    local out; out=$(mktemp -d)
    say "read bandwidth"
    # shellcheck disable=SC2086
    $PRIO "$TIMED" bench matmul --json --dtype f32 --rows 64 --threads "$THREADS" > "$out/read.json"
    for r in $(seq "$ROUNDS"); do
        say "round $r of $ROUNDS, $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
        for k in $KINDS; do
            local m g; m=$(waste_of "$k"); g=$(gguf_of "$k")
            # shellcheck disable=SC2086
            $PRIO "$TIMED" bench "$m" --threads "$THREADS" --prompt-tokens 128 -n 64 --json $WASTE_ARGS 2>/dev/null > "$out/w-$k-128-$r.json"
            # shellcheck disable=SC2086
            $PRIO "$TIMED" bench "$m" --threads "$THREADS" --prompt-tokens 512 -n 1 --json $WASTE_ARGS 2>/dev/null > "$out/w-$k-512-$r.json"
            # shellcheck disable=SC2086
            $PRIO "$BENCH" -m "$g" -t "$THREADS" -p 0 -n 64 -d 128 -r 1 -o jsonl $LLAMA_ARGS 2>/dev/null > "$out/l-$k-tg-$r.jsonl"
            # shellcheck disable=SC2086
            $PRIO "$BENCH" -m "$g" -t "$THREADS" -p 128,512 -n 0 -r 1 -o jsonl $LLAMA_ARGS 2>/dev/null > "$out/l-$k-pp-$r.jsonl"
        done
    done
    say "done at $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
    "$PY" - "$out" "$ROUNDS" "$KINDS" "$THREADS" "$(git -C "$ROOT" rev-parse --short HEAD)" "$PRIO" <<'EOF'
import json, os, platform, statistics, sys
out, rounds, kinds, threads, commit, prio = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4], sys.argv[5], sys.argv[6]
def load(p):
    with open(os.path.join(out, p)) as f:
        return json.load(f)
def lines(p):
    with open(os.path.join(out, p)) as f:
        return [json.loads(l) for l in f if l.strip()]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), platform.processor())
flags = next((l.split(":", 1)[1].split() for l in open("/proc/cpuinfo") if l.startswith("flags")), [])
isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "no AVX2"
if "avx512_vnni" in flags:
    isa += " VNNI"
read = load("read.json")["read"][-1]["gb_per_s"]
w = load("w-%s-128-1.json" % kinds[0])
llama_isa = os.environ.get("LLAMA_ISA") or "native"
print(f"host: {cpu} ({os.cpu_count()} CPUs, {isa}); waste {commit}, kernels {w['isa']}; llama.cpp built {llama_isa}; {threads} threads"
      f"{', run under ' + repr(prio) if prio else ''}; read bandwidth {read:.1f} GB/s; median of {rounds} rounds (rounds in parentheses)")
print()
print("| weights | figure | waste tok/s | llama.cpp tok/s | waste / llama.cpp |")
print("|---|---|---|---|---|")
names = {"q4": ("Q4B32", "Q4_0"), "q8": ("Q8B32", "Q8_0"), "bf16": ("BF16", "BF16")}
def fmt(v):
    return f"**{statistics.median(v):.2f}** ({', '.join(f'{x:.2f}' for x in v)})"
for k in kinds:
    rs = range(1, rounds + 1)
    wd = [load(f"w-{k}-128-{r}.json")["decode_tok_s"] for r in rs]
    wp = [load(f"w-{k}-128-{r}.json")["prefill_tok_s"] for r in rs]
    wp5 = [load(f"w-{k}-512-{r}.json")["prefill_tok_s"] for r in rs]
    ld = [lines(f"l-{k}-tg-{r}.jsonl")[0]["avg_ts"] for r in rs]
    lp = [[x for x in lines(f"l-{k}-pp-{r}.jsonl") if x["n_prompt"] == 128][0]["avg_ts"] for r in rs]
    lp5 = [[x for x in lines(f"l-{k}-pp-{r}.jsonl") if x["n_prompt"] == 512][0]["avg_ts"] for r in rs]
    label = "%s / %s" % names[k]
    for what, a, b in (("decode 64 after 128", wd, ld), ("prefill 128", wp, lp), ("prefill 512", wp5, lp5)):
        print(f"| {label} | {what} | {fmt(a)} | {fmt(b)} | {statistics.median(a) / statistics.median(b):.2f}x |")
EOF
    rm -r "$out"
}

main "$@"
