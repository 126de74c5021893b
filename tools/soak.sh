#!/usr/bin/env bash
# The soak of issue 16: one long-lived `waste chat` (or, with MODE=run, one `waste run` per
# prompt) driven for SOAK_SECONDS inside a cgroup v1 memory cgroup whose limit is the RAM
# budget, on a random MoE container whose experts are several times the budget (so they stream
# from disk the whole time). Not part of `make test`.
#
#   sudo tools/soak.sh                          # 30 minutes
#   SOAK_SECONDS=60 THREADS=1 tools/soak.sh     # a short check
#
# What it does:
#  1. makes the model under DIR if it is not there: `waste random-model --container` from a
#     Qwen3-MoE-shaped config (16 layers × 64 experts of 1.33 MB in Q4B32, 4 routed per token
#     as Qwen3-30B-A3B routes 8 of 128: 1.36 GB of experts, 5.3 times the default budget,
#     ~30 MB of trunk) and a vocabulary of 1,005: the Qwen2 test tokenizer
#     (tests/fixtures/tokenizers/hf/qwen2.json, which has the ChatML tokens) is its tokenizer;
#  2. checks the budget against the model's floor (`waste plan`);
#  3. creates /sys/fs/cgroup/memory/waste-soak-PID with memory.limit_in_bytes = BUDGET + SLACK
#     (and memsw the same, so swap cannot stand in for RAM), and starts the process in it (the
#     subshell writes its own pid into cgroup.procs, then execs waste);
#  4. MODE=chat (default): feeds `waste chat --template chatml` one turn at a time through a
#     fifo, waits for each reply's summary line, and sends /reset every RESET_EVERY turns (and
#     when the conversation no longer fits the context), so the same process serves every turn
#     and any growth shows. MODE=run: one `waste run` per prompt, each started in the cgroup;
#  5. samples every second, while the process lives: VmRSS and Threads (/proc/PID/status), open
#     descriptors (/proc/PID/fd), the cgroup's memory.usage_in_bytes, max_usage_in_bytes, its
#     rss and cache (memory.stat), failcnt, and OOM kills (memory.oom_control's oom_kill, or
#     under_oom where the kernel has no counter);
#  6. writes DIR/soak-PID.csv (one row a second) and DIR/soak-PID-turns.csv (per turn: samples,
#     min/median/max RSS), and prints a summary: turns completed, errors, RSS overall and per
#     turn (first, last, and the medians of the first and last tenth of the samples), fd and
#     thread counts min/max, the cgroup's peak, failcnt and OOM kills.
#
# The slack (SLACK, default 16M) is what the budget does not count by design (docs/MEMORY.md,
# "What an open model reports"): the executable and C library (~4 MiB resident), the expert
# cache mapping's rounding to 2 MiB huge pages, the conversation's text, and the kernel's own
# pages for the process (page tables, the fifo). The cgroup also charges the page cache of the
# files the process reads (the trunk, the tokenizer); the kernel reclaims it at the limit, which
# counts in failcnt but is not an OOM: expert records are read with O_DIRECT and do not pass
# through the page cache.
#
# Environment: SOAK_SECONDS (1800), DIR (/tmp/waste-soak: the model and the results), BUDGET
# (256M), SLACK (16M), MODE (chat | run), TOKENS (tokens per reply, 48), CTX (1024), THREADS
# (compute threads; default: the engine's), RESET_EVERY (8 turns), WASTE_BIN (the binary;
# default this tree's target/release/waste, built if missing), WASTE_ARGS (more options for
# chat/run, e.g. --lookahead or --purgeable), TURN_TIMEOUT (300 s: a turn taking longer is an
# error and ends the soak). Needs root and the cgroup v1 memory controller.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SOAK_SECONDS=${SOAK_SECONDS:-1800}
DIR=${DIR:-/tmp/waste-soak}
BUDGET=${BUDGET:-256M}
SLACK=${SLACK:-16M}
MODE=${MODE:-chat}
TOKENS=${TOKENS:-48}
CTX=${CTX:-1024}
THREADS=${THREADS:-}
RESET_EVERY=${RESET_EVERY:-8}
TURN_TIMEOUT=${TURN_TIMEOUT:-300}
WASTE_ARGS=${WASTE_ARGS:-}
WASTE=${WASTE_BIN:-$ROOT/target/release/waste}
CGROUPS=/sys/fs/cgroup/memory
CG=$CGROUPS/waste-soak-$$
MODEL=$DIR/qwen3moe-soak.waste
CSV=$DIR/soak-$$.csv
TURNS=$DIR/soak-$$-turns.csv
OUT=$DIR/soak-$$.out
ERR=$DIR/soak-$$.err
FIFO=$DIR/soak-$$.fifo
PIDFILE=$DIR/soak-$$.pid
STOP=$DIR/soak-$$.stop

say() { echo "soak: $*" >&2; }
die() { say "$*"; exit 1; }

# Bytes of a size with an optional binary suffix (K, M, G).
bytes() {
    local v=$1 n=${1%[KkMmGg]}
    case $v in
        *[Kk]) echo $((n << 10)) ;; *[Mm]) echo $((n << 20)) ;; *[Gg]) echo $((n << 30)) ;; *) echo "$n" ;;
    esac
}

[ "$MODE" = chat ] || [ "$MODE" = run ] || die "MODE must be chat or run, not $MODE"
[ -w "$CGROUPS/cgroup.procs" ] || die "needs root and the cgroup v1 memory controller at $CGROUPS"
if [ ! -x "$WASTE" ]; then
    say "building waste (cargo build --release)"
    (cd "$ROOT" && cargo build --release >&2)
fi
mkdir -p "$DIR"

# 1. The model.
make_model() {
    [ -f "$MODEL/tokenizer.json" ] && grep -q '"hf-bytelevel"' "$MODEL/manifest.json" 2>/dev/null && return
    say "making a random Qwen3-MoE container under $MODEL (about 1.4 GB)"
    cat >"$DIR/config.json" <<'EOF'
{"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 1024, "intermediate_size": 2048,
 "moe_intermediate_size": 768, "num_hidden_layers": 16, "num_attention_heads": 16,
 "num_key_value_heads": 4, "head_dim": 64, "num_experts": 64, "num_experts_per_tok": 4,
 "norm_topk_prob": true, "vocab_size": 1005, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
 "max_position_embeddings": 4096, "bos_token_id": 1000, "eos_token_id": 1002, "tie_word_embeddings": false}
EOF
    rm -rf "$MODEL"
    "$WASTE" random-model --config "$DIR/config.json" --out "$MODEL" --container --experts q4 --seed 7 >&2
    # A random container has no tokenizer; the manifest names the one added (the open checks it).
    cp "$ROOT/tests/fixtures/tokenizers/hf/qwen2.json" "$MODEL/tokenizer.json"
    python3 - "$MODEL/manifest.json" <<'PY'
import re, sys
path = sys.argv[1]
text = open(path).read()
new, n = re.subn(r'("tokenizer":\s*\{\s*"kind":\s*)null(,\s*"files":\s*)\[\]', r'\1"hf-bytelevel"\2["tokenizer.json"]', text)
if n != 1:
    sys.exit(f"{path}: no empty tokenizer entry to fill")
open(path + ".tmp", "w").write(new)
PY
    mv "$MODEL/manifest.json.tmp" "$MODEL/manifest.json"
}
make_model

COMMON=(--budget "$BUDGET" --ctx "$CTX" -n "$TOKENS" --temp 0.8 --seed 1)
[ -n "$THREADS" ] && COMMON+=(--threads "$THREADS")
# shellcheck disable=SC2206
[ -n "$WASTE_ARGS" ] && COMMON+=($WASTE_ARGS)

# 2. The plan: the budget must be above the floor, and the experts several times the cache.
"$WASTE" plan "$MODEL" --budget "$BUDGET" --ctx "$CTX" ${THREADS:+--threads "$THREADS"} >"$DIR/plan.txt" 2>&1 \
    || { cat "$DIR/plan.txt" >&2; die "the budget $BUDGET does not hold the model's floor"; }
sed 's/^/soak: plan: /' "$DIR/plan.txt" >&2
experts_bytes=$(du -cb "$MODEL"/experts-*.bank | tail -1 | cut -f1)

# 3. The cgroup, and everything stopped and removed on the way out.
LIMIT=$(( $(bytes "$BUDGET") + $(bytes "$SLACK") ))
PID= SAMPLER=
cleanup() {
    set +e
    touch "$STOP" 2>/dev/null
    [ -n "$PID" ] && kill -0 "$PID" 2>/dev/null && { kill "$PID"; sleep 1; kill -9 "$PID" 2>/dev/null; }
    [ -n "$SAMPLER" ] && { kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; }
    exec 3>&- 2>/dev/null
    if [ -d "$CG" ]; then
        # Anything still inside goes back to the root group before the group is removed.
        while read -r p; do echo "$p" >"$CGROUPS/cgroup.procs" 2>/dev/null; done <"$CG/cgroup.procs"
        rmdir "$CG" 2>/dev/null || say "could not remove $CG"
    fi
    rm -f "$FIFO" "$PIDFILE" "$STOP"
}
trap cleanup EXIT
# Ctrl-C or SIGTERM ends the soak early, still with its summary (the reply in flight is stopped).
STOPPED=0
trap 'STOPPED=1' INT TERM
mkdir "$CG"
echo "$LIMIT" >"$CG/memory.limit_in_bytes"
[ -f "$CG/memory.memsw.limit_in_bytes" ] && echo "$LIMIT" >"$CG/memory.memsw.limit_in_bytes"
say "cgroup $CG: limit $LIMIT bytes (budget $BUDGET + slack $SLACK); experts on disk: $experts_bytes bytes"

# Starts `waste ARGS...` inside the cgroup with stdin from $1 (stdout, stderr to the logs);
# its pid goes to $PID and the pid file the sampler follows.
start_in_cgroup() {
    local input=$1; shift
    ( exec 3>&-; echo "$BASHPID" >"$CG/cgroup.procs" && exec "$WASTE" "$@" ) <"$input" >>"$OUT" 2>>"$ERR" &
    PID=$!
    echo "$PID" >"$PIDFILE"
}

# 5. The sampler: one CSV row a second while a process is there.
cgval() { local v; read -r v <"$CG/$1" 2>/dev/null && echo "$v" || echo -1; }
stat_of() { awk -v k="$1" '$1 == k { print $2; found = 1 } END { if (!found) print -1 }' "$CG/memory.stat" 2>/dev/null; }
oom_kills() {
    awk '$1 == "oom_kill" { k = $2 } $1 == "under_oom" { u = $2 } END { print (k != "" ? k : u) }' "$CG/memory.oom_control"
}
sampler() {
    echo "t_s,turn,pid,rss_kb,fds,threads,cg_usage,cg_max_usage,cg_rss,cg_cache,failcnt,oom_kill" >"$CSV"
    local start=$SECONDS p rss thr fds turn
    while [ ! -e "$STOP" ]; do
        p=$(cat "$PIDFILE" 2>/dev/null || true)
        if [ -n "$p" ] && [ -r "/proc/$p/status" ]; then
            rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
            thr=$(awk '/^Threads:/ { print $2 }' "/proc/$p/status" 2>/dev/null || true)
            fds=$(ls "/proc/$p/fd" 2>/dev/null | wc -l)
            turn=$(grep -c '^\[.* tokens, ' "$ERR" 2>/dev/null || true)
            # A process between exec and exit (no VmRSS yet, or a zombie) is not sampled.
            if [ -n "$rss" ] && [ -n "$thr" ]; then
                echo "$((SECONDS - start)),${turn:-0},$p,$rss,$fds,$thr,$(cgval memory.usage_in_bytes),$(cgval memory.max_usage_in_bytes),$(stat_of rss),$(stat_of cache),$(cgval memory.failcnt),$(oom_kills)" >>"$CSV"
            fi
        fi
        sleep 1
    done
}
: >"$OUT"; : >"$ERR"; rm -f "$STOP"
sampler &
SAMPLER=$!

PROMPTS=(
    "Tell me a story about a lighthouse keeper and a storm."
    "What is the difference between a list and a set?"
    "Write a short poem about the sea at night."
    "Explain how a bicycle stays upright."
    "Give me three ideas for a rainy afternoon."
    "Why is the sky blue? Answer in two sentences."
    "Summarise the plot of a heist film you would like to see."
    "List the planets of the solar system in order."
)
completions() { grep -c -E '^\[.* tokens, |^waste chat: the conversation is ' "$ERR" 2>/dev/null || true; }

turns=0 errors=0 rc=0
began=$SECONDS end=$((SECONDS + SOAK_SECONDS))
# 4. Drive it.
if [ "$MODE" = chat ]; then
    rm -f "$FIFO"; mkfifo "$FIFO"
    exec 3<>"$FIFO"    # read-write: opening never blocks, and the fifo stays open between turns
    start_in_cgroup "$FIFO" chat "$MODEL" --template chatml "${COMMON[@]}"
    say "waste chat is pid $PID; driving it for $SOAK_SECONDS s"
    while [ $SECONDS -lt $end ] && [ $STOPPED = 0 ] && kill -0 "$PID" 2>/dev/null; do
        before=$(completions)
        printf '%s\n' "${PROMPTS[turns % ${#PROMPTS[@]}]}" >&3
        deadline=$((SECONDS + TURN_TIMEOUT))
        while [ "$(completions)" -le "$before" ] && kill -0 "$PID" 2>/dev/null; do
            [ $SECONDS -ge $deadline ] && { say "turn $turns: no reply within $TURN_TIMEOUT s"; errors=$((errors + 1)); break 2; }
            [ $STOPPED = 1 ] && { kill -INT "$PID" 2>/dev/null; break 2; }    # chat's Ctrl-C: the reply stops
            sleep 0.2
        done
        kill -0 "$PID" 2>/dev/null || break
        turns=$((turns + 1))
        if [ $((turns % RESET_EVERY)) -eq 0 ] || tail -n 1 "$ERR" | grep -q '^waste chat: the conversation is '; then
            echo /reset >&3
        fi
    done
    echo /quit >&3 2>/dev/null || true
    exec 3>&-
    for _ in $(seq 1 60); do kill -0 "$PID" 2>/dev/null || break; sleep 1; done
    kill -0 "$PID" 2>/dev/null && { say "waste chat did not quit: killed"; kill -9 "$PID"; errors=$((errors + 1)); }
    wait "$PID" || rc=$?
    [ $rc -eq 0 ] || [ $STOPPED = 1 ] || { say "waste chat exited with status $rc"; errors=$((errors + 1)); }
else
    say "one waste run per prompt for $SOAK_SECONDS s"
    while [ $SECONDS -lt $end ] && [ $STOPPED = 0 ]; do
        start_in_cgroup /dev/null run "$MODEL" "${COMMON[@]}" -- "${PROMPTS[turns % ${#PROMPTS[@]}]}"
        rc=0; wait "$PID" || rc=$?
        if [ $STOPPED = 1 ]; then
            kill -INT "$PID" 2>/dev/null; wait "$PID" 2>/dev/null || true
            break
        fi
        [ $rc -eq 0 ] || { say "run $turns exited with status $rc"; errors=$((errors + 1)); }
        turns=$((turns + 1))
    done
fi
PID=
sleep 1.2    # the sampler's last row
touch "$STOP"; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=

# Errors the process reported (the context-full notice of chat is not one: /reset follows).
reported=$(grep -v -E '^\[.* tokens, |^waste chat: the conversation is |^\[budget |^waste: ' "$ERR" | grep -c . || true)
errors=$((errors + reported))

# 6. The summary.
completed=$(grep '^\[.* tokens, ' "$ERR" | grep -vc '(interrupted)$' || true)
max_usage=$(cgval memory.max_usage_in_bytes) failcnt=$(cgval memory.failcnt) ooms=$(oom_kills)
awk -F, 'NR > 1 { print $2 "," $4 }' "$CSV" | sort -t, -k1,1n -k2,2n | awk -F, '
    function flush() { if (n) printf "%d,%d,%d,%d,%d\n", turn, n, v[1], v[int((n + 1) / 2)], v[n] }
    { if (NR > 1 && $1 != turn) { flush(); n = 0 } turn = $1; v[++n] = $2 }
    END { flush() }' | { echo "turn,samples,rss_min_kb,rss_median_kb,rss_max_kb"; cat; } >"$TURNS"
samples=$(($(wc -l <"$CSV") - 1))
{
    [ $STOPPED = 0 ] || echo "soak: stopped early (signal) after $((SECONDS - began)) s of $SOAK_SECONDS"
    echo "soak: $MODE, $SOAK_SECONDS s, budget $BUDGET, cgroup limit $LIMIT bytes, experts $experts_bytes bytes on disk"
    echo "soak: turns completed $completed (driven $turns), errors $errors, samples $samples"
    if [ "$samples" -gt 0 ]; then
        awk -F, 'NR > 1 { print $4 }' "$CSV" | sort -n | awk '{ v[++n] = $1 } END {
            printf "soak: RSS overall: min %.1f MiB, median %.1f MiB, max %.1f MiB\n", v[1] / 1024, v[int((n + 1) / 2)] / 1024, v[n] / 1024 }'
        # Growth: the median of the first tenth of the samples against the last tenth.
        k=$((samples / 10)); [ $k -ge 1 ] || k=1
        median_kib() { sort -n | awk '{ v[++n] = $1 } END { printf "%.1f", v[int((n + 1) / 2)] / 1024 }'; }
        first=$(awk -F, 'NR > 1 { print $4 }' "$CSV" | head -n $k | median_kib)
        last=$(awk -F, 'NR > 1 { print $4 }' "$CSV" | tail -n $k | median_kib)
        echo "soak: RSS median of the first $k samples $first MiB, of the last $k $last MiB"
        awk -F, 'NR > 1 { if (min5 == "" || $5 < min5) min5 = $5; if ($5 > max5) max5 = $5
                          if (min6 == "" || $6 < min6) min6 = $6; if ($6 > max6) max6 = $6 }
            END { printf "soak: open fds min %d max %d; threads min %d max %d\n", min5, max5, min6, max6 }' "$CSV"
        echo "soak: RSS per turn (KiB: samples, min, median, max) — first and last turns; all in $TURNS:"
        { sed -n '2,4p' "$TURNS"; [ "$(wc -l <"$TURNS")" -gt 7 ] && echo "..."; tail -n +5 "$TURNS" | tail -n 3; } | sed 's/^/soak:   turn /'
    fi
    echo "soak: cgroup peak (memory.max_usage_in_bytes, page cache included) $max_usage bytes; failcnt $failcnt; OOM kills $ooms"
    echo "soak: samples in $CSV; replies in $OUT; stderr in $ERR"
} | tee "$DIR/soak-$$-summary.txt"
[ "$errors" -eq 0 ] && [ "$ooms" = 0 ]
