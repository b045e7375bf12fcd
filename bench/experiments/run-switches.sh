#!/usr/bin/env bash
# Measure run-time switches of one build against each other on the H200, in alternating rounds on one machine, so
# that a drift of the machine reaches every setting. The fifteenth round measured the set_rows kernel's PDL trigger
# and the merge's 128-part hold this way (now 0033/0034; the diff with their switches:
# `git show fc5beea:bench/experiments/cuda-turbo-lc-hold-switches.diff`; a diff must be in the working tree to
# travel to the device, e.g. as bench/experiments/switches.diff):
#   RS_SECONDS=125 RS_RUNS='f16 -;turbo3 -;turbo3 GGML_CUDA_TURBO_SET_ROWS_LC=0' \
#     bash bench/experiments/run-switches.sh bench/experiments/switches.diff
# Prepare with `python scripts/prepare_h200.py`, then run it through the device tool with .h200/llama.cpp.tar.gz
# carried (as run-variant.sh), on a fresh machine (build about 260 s). Several diffs are applied in the order given;
# a path is taken relative to the repository root unless it is absolute.
# Steps: apply the diffs, build llama-bench and test-backend-ops, the turbo test cases, the decode kernels' ncu
# times per setting, then llama-bench tg128 (no prompt run) at RS_DEPTHS for each "config setting" of RS_RUNS, in
# rounds until RS_SECONDS have passed (at least one round). Results go to $OUT/switches/ (default ./h200-out).
#   RS_RUNS (required): ";"-separated "config [VAR=value ...]"; "-" for no setting; the ratios are to the run
#     "f16 -", so include it
#   RS_KERNELS: ";"-separated "config [VAR=value ...]" for the ncu times at d32768 (default "turbo3 -;turbo4 -")
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: run-switches.sh <diff> [<diff> ...]" >&2; exit 2; }
export OUT=${OUT:-$ROOT/h200-out}/switches
mkdir -p "$OUT"
BIN=${TQ_BUILD:-$ROOT/h200-out/build}/bin
MODELS=${TQ_MODELS:-/tmp/tq-models}
RUNS=${RS_RUNS:?set RS_RUNS, e.g. RS_RUNS='f16 -;turbo3 -;turbo3 VAR=0'}
KERNELS=${RS_KERNELS:-"turbo3 -;turbo4 -"}
DEPTHS=${RS_DEPTHS:-0,32768}

. "$ROOT/bench/experiments/patch-tree.sh"
refresh_patched_files
for diff in "$@"; do
    apply_diff "$diff" || { cat "$OUT/patch.log"; exit 1; }
done
TQ_BUILD_TARGETS="llama-bench test-backend-ops" bash "$ROOT/scripts/h200_run.sh" build ops || exit 1

IFS=';' read -r -a kernels <<< "$KERNELS"
for run in "${kernels[@]}"; do
    read -r c setting <<< "$run"
    [ "$setting" = - ] && setting=
    tag=${setting:-default}
    # (h200_run.sh kernels appends to $OUT/kernels.txt; one sub-folder per setting keeps the ncu outputs apart)
    env $setting OUT="$OUT/kernels-$tag" TQ_KERNEL_CONFIGS="$c" bash "$ROOT/scripts/h200_run.sh" kernels \
        | sed "s|^|$tag: |" | tee -a "$OUT/kernels.txt"
done

IFS=';' read -r -a runs <<< "$RUNS"
: > "$OUT/bench.jsonl"
round=0
start=$SECONDS # (RS_SECONDS counts the rounds only; in the fifteenth round it counted the kernels' 50 s too)
while ((round == 0 || SECONDS - start < ${RS_SECONDS:-200})); do
    round=$((round + 1))
    for run in "${runs[@]}"; do
        read -r c setting <<< "$run"
        [ "$setting" = - ] && setting=
        k=${c%%/*} v=${c##*/}
        # each JSON line gets the setting, so that the summary can tell the runs apart
        env $setting "$BIN/llama-bench" -m "$MODELS/l3-8b.gguf" -ngl 99 -fa 1 -p 0 -n 128 -d "$DEPTHS" -r 2 \
            -ctk "$k" -ctv "$v" -o jsonl 2> "$OUT/bench.err" \
            | sed "s|^{|{\"setting\": \"${setting:-default}\", \"round\": $round, |" >> "$OUT/bench.jsonl"
        echo "[$(date +%H:%M:%S)] round $round: $c ${setting:-default}" | tee -a "$OUT/steps.log"
    done
done

# ratios to the f16 run without a setting (the package's llama-bench parser, pooling and table): of all rounds
# together, then of each round alone (the rounds alternate the settings, so a drift of the machine reaches them all)
python3 "$ROOT/scripts/bench_rounds.py" "$OUT/bench.jsonl" | tee "$OUT/summary.txt"
