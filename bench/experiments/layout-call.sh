#!/usr/bin/env bash
# Does the cache's layout limit the turbo decode kernel? test-backend-ops perf on the Llama-3-8B attention shape
# (tbo-perf-layout.diff) with llama.cpp's layout (a token's 8 KV heads adjacent) and with each head's rows
# contiguous; then ncu kernel times (L2 flushed before each launch) at depth 32768.
#   bash bench/experiments/layout-call.sh                  the series (round 21, call 1)
#   bash bench/experiments/layout-call.sh series A.diff+B.diff ...
# Each argument is a variant, as in run-variant.sh: `series`, or diffs (relative to the repository) joined with `+`,
# applied on top of tbo-perf-layout.diff in that order and reverted after the variant; a variant rebuilds only what
# its diffs touch. The probe diffs (cuda-turbo-probe-loop*.diff) give the memory side or the arithmetic alone.
#   TQ_LAYOUT_KV: depths of the perf runs (default "262144 32768"); TQ_LAYOUT_TYPES: symmetric K/V types of the perf
#   and ncu runs (default: perf all five, ncu "f16 turbo2 turbo3")
# Run from the repository root with OUT set; needs .h200 (scripts/prepare_h200.py). Output: stdout, per variant.
set -uo pipefail
ROOT=$(pwd)
E=bench/experiments
. $E/patch-tree.sh
. scripts/ncu_times.sh
refresh_patched_files
apply_diff $E/tbo-perf-layout.diff || { cat "$OUT/patch.log"; exit 1; }
BIN=${TQ_BUILD:-$ROOT/h200-out/build}/bin

measure() {
    local kv t p types=${TQ_LAYOUT_TYPES:-}
    for kv in ${TQ_LAYOUT_KV:-262144 32768}; do
        echo "== perf kv=$kv"
        TQ_PERF_KV=$kv timeout 200 "$BIN/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT \
            -p "nh=8,nr23=\[4,1\],kv=$kv,nb=1,.*type_K=(${types// /|})" 2>&1 \
            | grep -E "FLASH_ATTN_EXT|runs" | sed 's/\x1b\[[0-9;]*m//g'
    done
    command -v ncu > /dev/null || return
    for t in ${types:-f16 turbo2 turbo3}; do
        for p in "0,2,1,3" "0,1,2,3"; do
            echo "== ncu kv=32768 type=$t permute=[$p]"
            TQ_PERF_KV=32768 timeout 60 ncu --clock-control none --cache-control all --metrics gpu__time_duration.sum \
                --launch-skip 20 --launch-count 20 -k "regex:flash_attn" \
                "$BIN/test-backend-ops" perf -b CUDA0 -o FLASH_ATTN_EXT \
                -p "nh=8,nr23=\[4,1\],kv=32768,nb=1,.*type_K=$t,.*permute=\[$p\]" > "$OUT/ncu-layout.txt" 2>&1
            ncu_times mean "$OUT/ncu-layout.txt"
        done
    done
}

[ $# -gt 0 ] || set -- series
for what in "$@"; do
    if apply_variant "$what"; then
        echo "==== variant $what"
        TQ_BUILD_TARGETS=test-backend-ops bash scripts/h200_run.sh build && measure
    fi
    revert_variant
done
cat "$OUT/device.txt"
