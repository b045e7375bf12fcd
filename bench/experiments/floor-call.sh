#!/usr/bin/env bash
# Round 21, call 3: the decode loop's memory floor with two staging buffers per warp and with three. With the
# scores and the PV products left out (cuda-turbo-probe-loop.diff + -k-pv.diff, mode 4) the loop only copies rows,
# waits for them and runs the softmax's bookkeeping; with cuda-turbo-stages.diff under it (and the probe rebased on
# it, cuda-turbo-probe-loop-on-stages.diff) each warp has two steps' rows in flight instead of one. Mode 2 (no copies
# of the next step: arithmetic only) gives the loop's compute time on the same machine. llama-bench f16 and turbo2
# at d32768 per variant, all on one machine; the tokens of the probe builds are wrong by design.
# Run from the repository root with OUT set; needs .h200 (scripts/prepare_h200.py).
set -uo pipefail
ROOT=$(pwd)
E=bench/experiments
BASE=$OUT
. $E/patch-tree.sh
run() { # name: build what the applied diffs changed, then bench
    export OUT=$BASE/$1
    mkdir -p "$OUT"
    TQ_BUILD_TARGETS=llama-bench bash scripts/h200_run.sh build bench 2 32768 f16,turbo2 > "$OUT/run.txt" 2>&1
    echo "== $1"; grep -E "build done|turbo2 \| tg128 \| 32768|f16 \| tg128 \| 32768" "$OUT/run.txt" "$OUT/summary.txt" 2>/dev/null | head -6
}
variant() { # name diffs: the series plus these diffs (joined with +), then the tree restored
    export OUT=$BASE/$1; mkdir -p "$OUT"
    refresh_patched_files
    apply_variant "$2" && run "$1"
    revert_variant
}
run series
variant nokpv-2buf $E/cuda-turbo-probe-loop.diff+$E/cuda-turbo-probe-loop-k-pv.diff
variant nokpv-3buf $E/cuda-turbo-stages.diff+$E/cuda-turbo-probe-loop-on-stages.diff+$E/cuda-turbo-probe-loop-k-pv.diff
variant nocopies-2buf $E/cuda-turbo-probe-loop.diff+$E/cuda-turbo-probe-loop-copies.diff
refresh_patched_files
