#!/usr/bin/env bash
# Measure experiment diffs against the series on the H200. Prepare with `python scripts/prepare_h200.py`, then run
# through the device tool with .h200/llama.cpp.tar.gz, cmake-args.txt and commit.txt carried, for example:
#   call 1: bash bench/experiments/run-variant.sh series
#   call 2: bash bench/experiments/run-variant.sh bench/experiments/a.diff bench/experiments/a.diff+bench/experiments/b.diff
# Each argument is a variant: `series`, or diffs joined with `+`, applied in that order. The variants of one call run
# one after the other on the same build directory (h200-out/build, which also survives between calls of a warm
# machine), so after the first build each variant rebuilds only what its diffs touch; the tree is restored after
# each variant. Each variant runs test-backend-ops (turbo cases), llama-bench and the per-launch ncu times of the
# decode attention kernels; results go to $OUT/<variant>/ (default ./h200-out), and a summary of ratios to f16 is
# printed. Keep a call under 10 minutes: a fresh build takes about 5, each later variant about 3.
#   RV_BENCH: llama-bench's reps, depths and configs (default "2 0,8192,32768 f16,turbo3,turbo4,turbo2,q8_0/turbo4")
#   RV_OPS=0: skip test-backend-ops
#   TQ_BENCH_ROUNDS=N: llama-bench runs the configs N times in turn (scripts/h200_run.sh); the summary pools them
#   TQ_KERNEL_CONFIGS: the configs the kernels step times (scripts/h200_run.sh; default "turbo3 f16")
#   RV_ENV="GGML_CUDA_TURBO_MAX_PARTS=33 GGML_CUDA_TURBO_COMBINE=1": after a variant's steps, bench and kernels
#     again with each of these settings (one at a time; for diffs that read them), into $OUT/<variant>-<VAR>-<value>/
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] || { echo "usage: run-variant.sh series|<diff>[+<diff>...] ..." >&2; exit 2; }
BASE_OUT=${OUT:-$ROOT/h200-out}
read -r -a bench_args <<< "${RV_BENCH:-2 0,8192,32768 f16,turbo3,turbo4,turbo2,q8_0/turbo4}"
steps=(build)
[ "${RV_OPS:-1}" = 0 ] || steps+=(ops)
steps+=(bench "${bench_args[@]}" kernels)

. "$ROOT/bench/experiments/patch-tree.sh"
rc=0
for what in "$@"; do
    diffs=()
    [ "$what" = series ] || read -r -a diffs <<< "${what//+/ }"
    name=series
    if [ ${#diffs[@]} -gt 0 ]; then
        # (joined with "_and_": the device tool does not bring back files under names with a "+")
        name=
        for d in "${diffs[@]}"; do name=${name:+${name}_and_}$(basename "$d" .diff); done
    fi
    export OUT=$BASE_OUT/$name
    mkdir -p "$OUT"
    refresh_patched_files
    if apply_variant "$what"; then
        echo "== $name"
        bash "$ROOT/scripts/h200_run.sh" "${steps[@]}" || rc=1
        [ -s "$OUT/summary.txt" ] && cat "$OUT/summary.txt" # (h200_run.sh bench's ratios to f16)
        for setting in ${RV_ENV:-}; do
            echo "== $name with $setting"
            sub=$BASE_OUT/$name-${setting//=/-}
            env OUT="$sub" "$setting" bash "$ROOT/scripts/h200_run.sh" bench "${bench_args[@]}" kernels || rc=1
            [ -s "$sub/summary.txt" ] && cat "$sub/summary.txt"
        done
    else
        rc=1
    fi
    revert_variant || rc=1 # the series again for the next variant
done
exit $rc
