#!/usr/bin/env bash
# Does reading the disk slow this host's computation? A streamed decode computes while its
# expert records stream in; on some VMs the host's own I/O work competes with the vCPUs, so the
# same arithmetic runs slower whenever the disk is busy, whoever reads (docs/BENCHMARKS.md,
# 2026-12-05 morning: 29 % on two threads on the Zen 4 host). This separates that from
# anything waste does: an in-RAM decode (every expert cached, nothing read) timed alone and
# with READERS `dd iflag=direct` loops reading the container's bank files alongside,
# alternating, per thread count.
#
#   tools/bench/contention.sh [CONTAINER]     # default target/stream-duel/l24-e128-q4.waste
#
# Environment: THREADS ("2 1"), ROUNDS (2), READERS (3), GEN (200 decoded tokens), WARMUP (100),
#   WASTE_BIN (default target/release/waste, built if absent). Not part of `make test`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
M=${1:-$ROOT/target/stream-duel/l24-e128-q4.waste}
THREADS=${THREADS:-"2 1"}
ROUNDS=${ROUNDS:-2}
READERS=${READERS:-3}
GEN=${GEN:-200}
WARMUP=${WARMUP:-100}
if [ -n "${WASTE_BIN:-}" ]; then
    WASTE=$WASTE_BIN
else
    WASTE=$ROOT/target/release/waste
    [ -x "$WASTE" ] || (cd "$ROOT" && cargo build --release >&2)
fi
[ -x "$WASTE" ] || { echo "contention: $WASTE is not an executable" >&2; exit 2; }
[ -d "$M" ] || { echo "contention: $M is not a container directory (make one with tools/bench/stream_duel.sh)" >&2; exit 2; }
mapfile -t BANKS < <(ls "$M"/*.bank)
[ ${#BANKS[@]} -gt 0 ] || { echo "contention: $M has no expert banks" >&2; exit 2; }
# Every expert fits the cache: the container's size and 1 GiB for the rest.
BUDGET=$(( $(du -sb "$M" | cut -f1) + (1 << 30) ))
STOP=$(mktemp -u /tmp/contention-stop.XXXXXX)

decode() { # threads -> decode tok/s
    "$WASTE" bench "$M" --prompt-tokens 16 -n "$GEN" --ctx 1024 --threads "$1" --budget "$BUDGET" \
        --warmup "$WARMUP" --json | python3 -c 'import json, sys; print("%.2f" % json.load(sys.stdin)["decode_tok_s"])'
}

readers_start() { # READERS loops, reader i over every READERS-th bank from bank i
    for ((i = 0; i < READERS; i++)); do
        (while [ ! -e "$STOP" ]; do
            for ((b = i; b < ${#BANKS[@]}; b += READERS)); do
                dd if="${BANKS[b]}" of=/dev/null bs=4M iflag=direct 2>/dev/null
                [ -e "$STOP" ] && break
            done
        done) &
    done
    sleep 1
}

readers_stop() {
    touch "$STOP"
    wait
    rm -f "$STOP"
}
trap 'touch "$STOP"; wait; rm -f "$STOP"' EXIT

echo "host: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) CPUs; $M; $READERS readers; $(date -u +%FT%TZ)"
echo "threads  round  quiet tok/s  with readers tok/s"
for t in $THREADS; do
    for ((r = 1; r <= ROUNDS; r++)); do
        q=$(decode "$t")
        readers_start
        d=$(decode "$t")
        readers_stop
        echo "$t        $r      $q        $d"
    done
done
