#!/usr/bin/env bash
# A/B of an experiment diff on the shapes step of scripts/h200_run.sh: the series and the series with DIFF, in
# turn, on one build directory (each switch rebuilds only what the diff touches), until the time is spent.
#   usage: OUT=... bash bench/experiments/shapes-ab.sh DIFF [SECONDS]
# SECONDS (default 540): no new round starts after that many seconds since the start (a round is a rebuild and the
# shapes step, about 1-2 minutes). TQ_SHAPES and TQ_SHAPES_CONFIGS pick the shapes and configs as for h200_run.sh;
# TQ_BUILD_TARGETS defaults to llama-bench here. Results: $OUT/a1, $OUT/b1, $OUT/a2, ... (a: series, b: with DIFF),
# also packed as $OUT/shapes-ab.tgz, since the device tool brings back at most 8 files of a call.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { echo "usage: shapes-ab.sh DIFF [SECONDS]" >&2; exit 2; }
DIFF=$1
LIMIT=${2:-540}
BASE_OUT=${OUT:-$ROOT/h200-out}
export TQ_BUILD_TARGETS=${TQ_BUILD_TARGETS:-llama-bench}
mkdir -p "$BASE_OUT"
. "$ROOT/bench/experiments/patch-tree.sh"
t0=$(date +%s)
refresh_patched_files
round=1
variant=a
applied=0
while :; do
    export OUT=$BASE_OUT/$variant$round
    mkdir -p "$OUT"
    if [ "$variant" = b ] && [ $applied = 0 ]; then
        apply_diff "$DIFF" || { cat "$OUT/patch.log"; exit 1; }
        applied=1
    elif [ "$variant" = a ] && [ $applied = 1 ]; then
        apply_diff "$DIFF" -R || { cat "$OUT/patch.log"; exit 1; }
        refresh_patched_files
        applied=0
    fi
    bash "$ROOT/scripts/h200_run.sh" build shapes || exit 1
    echo "[$(date +%H:%M:%S)] $variant$round done at $(( $(date +%s) - t0 )) s" | tee -a "$BASE_OUT/ab.log"
    if [ "$variant" = a ]; then variant=b; else variant=a; round=$((round + 1)); fi
    # a round (rebuild + shapes) took about as long as the last one: stop if the next would pass the limit
    elapsed=$(( $(date +%s) - t0 ))
    [ "${last_start:-}" ] && per=$(( elapsed - last_start )) || per=0
    last_start=$elapsed
    [ $((elapsed + per)) -le "$LIMIT" ] || break
done
[ $applied = 1 ] && { apply_diff "$DIFF" -R; refresh_patched_files; }
for f in "$BASE_OUT"/*/shapes/*-summary.txt; do echo "== $f"; cat "$f"; done
(cd "$BASE_OUT" && tar czf shapes-ab.tgz --exclude=shapes-ab.tgz ./*)
