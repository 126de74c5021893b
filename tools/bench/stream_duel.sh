#!/usr/bin/env bash
# The streaming duel (issue 15): waste, llama.cpp (mmap) and ramvamp on one random model of
# Qwen3-30B-A3B's shape, in RAM and in real memory cgroups, in one window, one table.
#
#   tools/bench/stream_duel.sh                       # 48 layers, limits 8G 6G 4G, 3 rounds
#   LAYERS=2 N_EXPERTS=16 LIMITS="1200M 900M" ROUNDS=1 PROMPT=16 GEN=8 tools/bench/stream_duel.sh
#
# What it does (nothing here is part of `make test`; run it as root, it makes cgroups):
#  1. builds waste (`cargo build --release`), llama.cpp under target/llamacpp/ as
#     tools/bench/duel.sh does (plus llama-quantize and llama-completion), and ramvamp 0.1.1
#     with `cargo install --root target/ramvamp ramvamp ramvamp-repack`; each only when absent;
#  2. makes under DIR the model: `waste random-model --config C --container --experts EXPERTS`
#     where C is the qwen3-30b-a3b preset with LAYERS layers and N_EXPERTS experts; its lossless
#     GGUF (tools/bench/waste_to_gguf.py --check: Q8B32 -> Q8_0, Q4B32 -> Q4_0, F32 routers) for
#     llama.cpp; and ramvamp's install: ramvamp 0.1.1 loads only the tensor types of a Q4_K_M
#     Qwen3-30B-A3B (token_embd Q4_K, output Q6_K, attn_q Q4_K, attn_k Q8_0, attn_v Q4_K/Q6_K,
#     attn_output Q5_K, experts Q4_K (down Q4_K/Q6_K), routers and norms F32; ramvamp-core's
#     model/weights.rs), so our GGUF is requantized to exactly that mix with
#     `llama-quantize --allow-requantize` and repacked with `ramvamp-repack install --local`.
#     ramvamp therefore computes a requantization of the model the other two compute (same
#     shape, about the same bytes per expert as Q4B32/Q4_0, different numbers);
#  3. checks once that waste and llama.cpp decode the same 8 greedy tokens from the same ids
#     (`waste compare M M --ids`, `llama-completion` with the one-character vocabulary), or
#     differ first at a near-tie of waste's logits (within TIE, 0.05: llama.cpp rounds the
#     activations to Q8_0), and prints ramvamp's tokens for the same prompt beside llama.cpp's
#     on ramvamp's requantized weights (those two should agree);
#  4. measures the disk with `waste bench disk` at the expert record size;
#  5. for each setting — in RAM (no limit, page cache left warm) and each of LIMITS (a fresh
#     memory cgroup per run, v1 or v2, swap off; our model files evicted from the page cache
#     with posix_fadvise before each run) — runs ROUNDS rounds, engine after engine:
#       waste bench M --prompt-tokens PROMPT -n GEN --threads THREADS --json
#         (in RAM with `--warmup WARMUP` too: llama.cpp's model is in a warm page cache there,
#         so waste's expert cache starts warm as well, after an untimed run on other tokens)
#       llama-bench -m G -p 0 -n GEN -r 1 --no-warmup    (decode) and -p PROMPT -n 0 (prefill)
#       ramvamp generate --prompt <PROMPT ids> --max-new GEN --greedy --cache-bytes RV_CACHE
#     each killed after TIMEOUT seconds;
#  6. prints one table (tools/bench/stream_duel.py table): decode and prefill tok/s, hit rate,
#     bytes read per decoded token, peak memory (cgroup peak under a limit, VmHWM otherwise).
#
# Environment: LAYERS (48), N_EXPERTS (128), EXPERTS (q4; q8 writes Q8B32 experts, which
#   llama.cpp reads as Q8_0 and ramvamp only after its requantization to Q4_K), LIMITS
#   ("8G 6G 4G"), SETTINGS (default "ram $LIMITS"), ROUNDS (3), THREADS (2), PROMPT (128),
#   GEN (32), WARMUP (128: waste's warm-up decode steps in RAM; 0 for a cold cache),
#   TIMEOUT (1800 s per run), RV_CACHE (ramvamp's --cache-bytes per limit: "auto" =
#   the limit minus ramvamp's common weights, KV cache and 512 MiB; in RAM all its experts,
#   if they fit in MemAvailable less 3 GiB, and at most 4 GiB, the cap of ramvamp 0.1.1's slot
#   pool; or a fixed size), WASTE_BUDGET (waste's --budget per setting: "auto" = the limit
#   less 128 MiB for what the budget does not count, and in RAM the container's size plus
#   1 GiB, so that every expert fits in its cache; "default" = no --budget, waste's own
#   choice, which never goes past the floor plus three working sets; or a fixed size), CTX (512, the context each engine sizes for), DIR (where the model
#   goes; default target/stream-duel), LLAMA_DIR (a llama.cpp build directory to use instead of
#   building one, e.g. another worktree's target/llamacpp), KEEP_RV_GGUF (0: the requantized
#   GGUF is deleted after the repack), WASTE_BIN (a waste binary to use instead of building
#   this tree's), DISK_LIMIT (8G: bytes `waste bench disk` reads).
# Disk: a 48-layer q4 model needs about 17.5 GB for the container, 17.5 for the GGUF and 17.4
# for ramvamp's install (plus 17.4 while the requantized GGUF exists); the script refuses to
# start without that much free space (use fewer LAYERS, and say so with the figures).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
DIR=${DIR:-$ROOT/target/stream-duel}
LL=${LLAMA_DIR:-$ROOT/target/llamacpp}
RV=$ROOT/target/ramvamp
LAYERS=${LAYERS:-48}
N_EXPERTS=${N_EXPERTS:-128}
EXPERTS=${EXPERTS:-q4}
LIMITS=${LIMITS:-"8G 6G 4G"}
SETTINGS=${SETTINGS:-"ram $LIMITS"}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
PROMPT=${PROMPT:-128}
GEN=${GEN:-32}
WARMUP=${WARMUP:-128}
TIMEOUT=${TIMEOUT:-1800}
RV_CACHE=${RV_CACHE:-auto}
WASTE_BUDGET=${WASTE_BUDGET:-auto}
CTX=${CTX:-512}
KEEP_RV_GGUF=${KEEP_RV_GGUF:-0}
DISK_LIMIT=${DISK_LIMIT:-8G}
WASTE=${WASTE_BIN:-$ROOT/target/release/waste}
PY=$LL/venv/bin/python
HELP=$ROOT/tools/bench/stream_duel.py
TAG=l${LAYERS}-e${N_EXPERTS}-${EXPERTS}
MODEL=$DIR/$TAG.waste
GGUF=$DIR/$TAG.gguf
RVGGUF=$DIR/$TAG-rv.gguf
RVMP=$DIR/$TAG.rvmp
TOK=$DIR/$TAG-tokenizer

say() { echo "stream-duel: $*" >&2; }
# build_llamacpp DIR TOOL... (tools/bench/llamacpp.sh)
source "$ROOT/tools/bench/llamacpp.sh"
# Where build_llamacpp puts the tools (build/, or build-avx2/ with LLAMA_ISA=avx2).
LLBIN=$(llamacpp_build "$LL")/bin

build_ramvamp() {
    [ -x "$RV/bin/ramvamp" ] && [ -x "$RV/bin/ramvamp-repack" ] && return
    say "installing ramvamp 0.1.1 into $RV (cargo install, several minutes)"
    cargo install --locked --version 0.1.1 --root "$RV" ramvamp >&2
    cargo install --locked --version 0.1.1 --root "$RV" ramvamp-repack >&2
}

check_disk() {
    [ -d "$RVMP" ] && return
    local per_layer need free block=18
    [ "$EXPERTS" = q8 ] && block=34
    per_layer=$(( N_EXPERTS * 3 * 768 * 2048 * block / 32 ))
    # container + GGUF + requantized GGUF + install (the last two at Q4_K), plus ~2.5 GB of trunk each
    need=$(( 2 * LAYERS * per_layer + 2 * LAYERS * N_EXPERTS * 3 * 768 * 2048 * 18 / 32 + 4 * 1200000000 ))
    mkdir -p "$DIR"
    free=$(( $(df --output=avail -B1 "$DIR" | tail -1) ))
    if [ "$free" -lt "$need" ]; then
        say "needs about $((need / 1000000000)) GB free under $DIR, has $((free / 1000000000)) GB: use fewer LAYERS"
        exit 1
    fi
}

make_model() {
    mkdir -p "$DIR"
    if [ ! -f "$MODEL/manifest.json" ]; then
        "$PY" - "$DIR/$TAG.json" "$LAYERS" "$N_EXPERTS" <<'EOF'
import json, sys
# the qwen3-30b-a3b preset of src/tools/random.rs with the layer and expert counts replaced
cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
       "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
       "num_hidden_layers": int(sys.argv[2]), "num_attention_heads": 32, "num_key_value_heads": 4,
       "head_dim": 128, "num_experts": int(sys.argv[3]), "num_experts_per_tok": 8,
       "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [], "vocab_size": 151936,
       "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": False,
       "max_position_embeddings": 40960, "bos_token_id": 151643, "eos_token_id": 151645}
json.dump(cfg, open(sys.argv[1], "w"), indent=1)
EOF
        "$WASTE" random-model --config "$DIR/$TAG.json" --container --experts "$EXPERTS" --out "$MODEL" >&2
    fi
    # each output is written under a temporary name and renamed once whole, so an interrupted
    # run never leaves a truncated file that the next run would take as done
    if [ ! -f "$GGUF" ]; then
        "$PY" "$ROOT/tools/bench/waste_to_gguf.py" "$MODEL" "$GGUF.tmp" --check --tokenizer-dir "$TOK" >&2
        mv "$GGUF.tmp" "$GGUF"
    fi
    if [ ! -f "$RVMP/manifest.json" ]; then
        if [ ! -f "$RVGGUF" ]; then
            "$LLBIN/llama-quantize" --allow-requantize \
                --token-embedding-type q4_k --output-tensor-type q6_k \
                --tensor-type attn_q=q4_k --tensor-type attn_k=q8_0 --tensor-type attn_v=q4_k \
                --tensor-type attn_output=q5_k --tensor-type ffn_gate_exps=q4_k \
                --tensor-type ffn_up_exps=q4_k --tensor-type ffn_down_exps=q4_k \
                "$GGUF" "$RVGGUF.tmp" Q4_K_M "$THREADS" > "$DIR/$TAG-quantize.log" 2>&1
            mv "$RVGGUF.tmp" "$RVGGUF"
        fi
        "$RV/bin/ramvamp-repack" install --local "$RVGGUF" --output "$RVMP" --overwrite --tokenizer-dir "$TOK" >&2
        llama_tokens "$RVGGUF" > "$DIR/$TAG-rv-llama.tokens"
        [ "$KEEP_RV_GGUF" = 1 ] || rm -f "$RVGGUF"
    fi
}

# The check prompt: 8 ids, and the same as text of the one-character vocabulary.
CHECK_IDS="1000,2000,3000,4000,5000,6000,7000,8000"
check_text() { "$PY" "$ROOT/tools/bench/waste_moe_to_gguf.py" ids-to-text "$CHECK_IDS"; }
to_ids() { "$PY" "$ROOT/tools/bench/waste_moe_to_gguf.py" text-to-ids 151936 | cut -d, -f1-8; }
llama_tokens() { # GGUF -> llama.cpp's 8 greedy tokens after the check prompt
    "$LLBIN/llama-completion" -m "$1" -p "$(check_text)" -n 8 --temp 0 --ignore-eos -no-cnv \
        --no-display-prompt --no-warmup -t "$THREADS" -c 64 --simple-io 2>/dev/null | to_ids
}

# Where waste's and llama.cpp's greedy tokens first differ, llama.cpp's choice must be within
# TIE (0.05) of waste's top logit at that position: llama.cpp multiplies Q4_0/Q8_0 weights by
# activations it rounds to Q8_0, so on random weights, whose logits are often within 0.01 of
# each other, a deep model can flip a near-tie (24 layers: 3.7145 against 3.7068 at token 7).
# A larger gap means the two engines do not compute the same model: stop.
near_tie() {
    local w=$1 l=$2 i=0 prefix=$CHECK_IDS wt lt gap
    IFS=, read -ra W <<< "$w"; IFS=, read -ra L <<< "$l"
    while [ "$i" -lt "${#W[@]}" ] && [ "${W[$i]}" = "${L[$i]:-}" ]; do prefix=$prefix,${W[$i]}; i=$((i + 1)); done
    wt=${W[$i]:-}; lt=${L[$i]:-}
    gap=$("$WASTE" eval "$MODEL" --ids "$prefix" --top 64 --ctx 64 --threads "$THREADS" 2>/dev/null \
        | awk -v w="$wt" -v l="$lt" '$1 == w {a = $2} $1 == l {b = $2} END {if (a == "" || b == "") print "inf"; else print a - b}')
    if [ "$gap" = inf ] || awk -v g="$gap" -v t="${TIE:-0.05}" 'BEGIN {exit !(g > t)}'; then
        say "waste and llama.cpp disagree on the same weights at token $((i + 1)) (logit gap $gap under waste): stopping"
        exit 1
    fi
    say "first difference at token $((i + 1)): a near-tie (waste's logits: $wt is $gap above llama.cpp's $lt), as Q8_0 activations can flip"
}

# The same ids through every engine: waste and llama.cpp must agree (same weights), and so must
# ramvamp and llama.cpp on ramvamp's requantized weights (recorded before that GGUF is deleted).
check_tokens() {
    local w l r rl
    w=$("$WASTE" compare "$MODEL" "$MODEL" --ids "$CHECK_IDS" -n 8 --threads "$THREADS" 2>/dev/null | awk '/^COMPARE tokens_quant/{$1=$2=""; print}' | xargs | tr ' ' ',')
    l=$(llama_tokens "$GGUF")
    r=$("$RV/bin/ramvamp" generate --model "$RVMP" --prompt "$(check_text)" --max-new 8 --greedy --threads "$THREADS" \
        --context 64 --skip-hashes 2>/dev/null | to_ids || true)
    rl=$(cat "$DIR/$TAG-rv-llama.tokens" 2>/dev/null || echo "not recorded")
    say "greedy tokens after $CHECK_IDS: waste [$w], llama.cpp [$l]; on the requantized weights: ramvamp [$r], llama.cpp [$rl]"
    [ "$w" = "$l" ] || near_tie "$w" "$l"
    [ "$r" = "$rl" ] || say "WARNING: ramvamp and llama.cpp disagree on ramvamp's weights"
}

limit_bytes() { # a setting's limit ("6G") in bytes
    "$PY" -c "import sys; sys.path.insert(0, '$ROOT/tools/bench'); import stream_duel as d; print(d.parse_size('$1'))"
}

waste_budget() { # waste's --budget option for a setting (nothing for "default")
    local s=$1
    case "$WASTE_BUDGET" in
        default) return ;;
        auto) ;;
        *) echo "--budget $WASTE_BUDGET"; return ;;
    esac
    if [ "$s" = ram ]; then
        echo "--budget $(( $(du -sb "$MODEL" | cut -f1) + (1 << 30) ))"
    else
        echo "--budget $(( $(limit_bytes "$s") - (128 << 20) ))"
    fi
}

rv_cache() { # the ramvamp expert-cache budget for a setting
    local s=$1
    if [ "$RV_CACHE" != auto ]; then echo "$RV_CACHE"; return; fi
    local lim experts
    if [ "$s" = ram ]; then
        # in RAM every engine may hold every expert: waste sizes its cache from usable RAM and
        # llama.cpp keeps the page cache warm, so ramvamp gets all its experts (when they fit)
        experts=$(stat -c %s "$RVMP"/experts/layer_*.bin | awk '{t += $1} END {printf "%.0f\n", t}')
        lim=$(( $(awk '/^MemAvailable/{print $2}' /proc/meminfo) * 1024 - (3 << 30) ))
        lim=$(( experts + (64 << 20) < lim ? experts + (64 << 20) : lim ))
    else
        local common; common=$(stat -c %s "$RVMP/common.bin")
        # common weights + KV (CTX x layers x 2 x 512 x 4 bytes, generous) + 512 MiB for the rest
        lim=$(( $(limit_bytes "$s") - common - CTX * LAYERS * 4096 - (512 << 20) ))
    fi
    # at most the 4 GiB cap of ramvamp 0.1.1's slot pool (it refuses more)
    echo $(( lim < (4 << 30) ? lim : (4 << 30) ))
}

main() {
    cd "$ROOT"
    [ "$(id -u)" = 0 ] || { say "run as root: the limits are real memory cgroups"; exit 1; }
    [ -n "${WASTE_BIN:-}" ] || cargo build --release >&2
    build_llamacpp "$LL" llama-bench llama-quantize llama-completion
    build_ramvamp
    check_disk
    make_model
    check_tokens
    local out; out=$DIR/runs-$(date -u +%Y%m%d-%H%M%S); mkdir -p "$out"
    say "results in $out"
    local disk
    disk=$("$PY" "$HELP" run --out "$out/disk.json" --evict "$MODEL" -- "$WASTE" bench disk "$MODEL" --threads 4 --limit "$DISK_LIMIT" \
        && "$PY" -c "import json,sys; print(' '.join(json.load(open(sys.argv[1]))['stdout'].split()))" "$out/disk.json")
    "$PY" - "$out/meta.json" "$(git rev-parse --short HEAD)" "$TAG" "$THREADS" "$PROMPT" "$GEN" "$ROUNDS" "$LIMITS" "$disk" <<'EOF'
import json, os, sys
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
ram = next(l.split(":", 1)[1].strip() for l in open("/proc/meminfo") if l.startswith("MemTotal"))
a = sys.argv
json.dump({"cpu": cpu, "cpus": os.cpu_count(), "ram": "RAM " + ram, "commit": a[2], "model": a[3],
           "threads": a[4], "prompt": a[5], "gen": a[6], "rounds": a[7], "limits": a[8].split(),
           "disk": a[9]}, open(a[1], "w"))
EOF
    local text; text=$("$PY" "$HELP" prompt "$PROMPT")
    for s in $SETTINGS; do
        local lim=() ev=() repack=() warm=(--warmup "$WARMUP")
        if [ "$s" != ram ]; then
            warm=()
            # Under a limit llama.cpp reads its weights through the mmap: its default repacks
            # Q4_0 into anonymous memory at load (an OOM kill when the model exceeds the limit)
            lim=(--limit "$s") repack=(--repack 0)
            ev=(--evict "$MODEL" --evict "$GGUF" --evict "$RVMP")
        fi
        local cache wb; cache=$(rv_cache "$s"); wb=$(waste_budget "$s")
        for r in $(seq "$ROUNDS"); do
            say "setting $s, round $r of $ROUNDS, $(date -u +%H:%M:%S) UTC, load $(cut -d' ' -f1-3 /proc/loadavg)"
            "$PY" "$HELP" run --out "$out/waste_${s}_$r.json" --timeout "$TIMEOUT" "${lim[@]}" "${ev[@]}" -- \
                "$WASTE" bench "$MODEL" --prompt-tokens "$PROMPT" -n "$GEN" --ctx "$CTX" --threads "$THREADS" $wb "${warm[@]}" --json
            "$PY" "$HELP" run --out "$out/llama_${s}_$r.json" --timeout "$TIMEOUT" "${lim[@]}" "${ev[@]}" -- \
                "$LLBIN/llama-bench" -m "$GGUF" -t "$THREADS" -p 0 -n "$GEN" -r 1 --no-warmup "${repack[@]}" -o jsonl
            "$PY" "$HELP" run --out "$out/llama_${s}_${r}_pp.json" --timeout "$TIMEOUT" "${lim[@]}" "${ev[@]}" -- \
                "$LLBIN/llama-bench" -m "$GGUF" -t "$THREADS" -p "$PROMPT" -n 0 -r 1 --no-warmup "${repack[@]}" -o jsonl
            "$PY" "$HELP" run --out "$out/ramvamp_${s}_$r.json" --timeout "$TIMEOUT" "${lim[@]}" "${ev[@]}" -- \
                "$RV/bin/ramvamp" generate --model "$RVMP" --prompt "$text" --max-new "$GEN" --greedy \
                --threads "$THREADS" --context "$CTX" --cache-bytes "$cache" --skip-hashes
        done
    done
    say "done at $(date -u +%H:%M:%S) UTC"
    "$PY" "$HELP" table "$out"
}

main "$@"
