#!/usr/bin/env bash
# One device call for cuda-q8_0-turbo-decode.diff on a fresh machine (.h200 carried, see README.md "Next device
# session"): build with the diff, the turbo and q8_0 test-backend-ops cases, llama-bench (two alternating rounds) and
# CPU parity of q8_0 at decode batch sizes, each with the q8_0 decode path on (the turbo kernel) and off
# (GGML_CUDA_Q8_0_TURBO_DECODE=0, upstream's kernels) in the same build. Writes under $OUT (on/ and off/).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
: "${OUT:?set OUT}"
mkdir -p "$OUT"
. bench/experiments/patch-tree.sh
apply_diff bench/experiments/cuda-q8_0-turbo-decode.diff || { cat "$OUT/patch.log"; exit 1; }
TQ_BUILD_TARGETS="test-backend-ops llama-bench llama-perplexity" bash scripts/h200_run.sh build ops || exit 1
B=${TQ_BUILD:-$ROOT/h200-out/build}/bin
for what in "FLASH_ATTN_EXT type_K=q8_0.*type_V=q8_0 fa-q8" "TURBO_ROT_FATTN type_K=q8_0,type_V=q8_0 rot-q8"; do
    read -r op pat name <<< "$what"
    "$B/test-backend-ops" test -b CUDA0 -o "$op" -p "$pat" > "$OUT/tbo-$name.txt" 2>&1
    echo "$name rc=$? ok=$(grep -c ' OK$' "$OUT/tbo-$name.txt") $(grep -E 'tests passed' "$OUT/tbo-$name.txt")"
    grep -m5 FAIL "$OUT/tbo-$name.txt"
done
bench_round() { # round: f16 and q8_0 with the q8_0 decode path on, then off
    local mode env_set
    for mode in on off; do
        env_set=()
        [ $mode = on ] || env_set=(GGML_CUDA_Q8_0_TURBO_DECODE=0)
        mkdir -p "$OUT/$mode/r$1"
        env "${env_set[@]}" OUT="$OUT/$mode/r$1" bash scripts/h200_run.sh bench 2 0,8192,32768 f16,q8_0
        cat "$OUT/$mode/r$1/summary.txt"
    done
}
bench_round 1
# parity of q8_0 against the CPU at decode batch sizes (f16's is 0 to the printed digits in every earlier run)
for mode in on off; do
    env_set=(); ubs="1 4"
    [ $mode = on ] || { env_set=(GGML_CUDA_Q8_0_TURBO_DECODE=0); ubs=1; }
    mkdir -p "$OUT/$mode"
    env "${env_set[@]}" OUT="$OUT/$mode" TQ_PARITY_TYPES=q8_0 TQ_PARITY_UB="$ubs" bash scripts/h200_run.sh parity
done
bench_round 2
