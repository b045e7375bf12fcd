#!/usr/bin/env bash
# Measure experiment diffs against the series on the H200. Prepare with `python scripts/prepare_h200.py`, then run
# through the device tool with .h200 carried, for example:
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
#   TQ_KERNEL_CONFIGS: the configs the kernels step times (scripts/h200_run.sh; default "turbo3 f16")
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -gt 0 ] || { echo "usage: run-variant.sh series|<diff>[+<diff>...] ..." >&2; exit 2; }
BASE_OUT=${OUT:-$ROOT/h200-out}
read -r -a bench_args <<< "${RV_BENCH:-2 0,8192,32768 f16,turbo3,turbo4,turbo2,q8_0/turbo4}"
steps=(build)
[ "${RV_OPS:-1}" = 0 ] || steps+=(ops)
steps+=(bench "${bench_args[@]}" kernels)

summary() { # ratios to f16 of a bench.jsonl
    python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
f16 = {(r["n_prompt"], r["n_gen"], r["n_depth"]): r["avg_ts"] for r in rows if r["type_k"] == r["type_v"] == "f16"}
for r in rows:
    key = (r["n_prompt"], r["n_gen"], r["n_depth"])
    test = f'pp{r["n_prompt"]}' if r["n_prompt"] else f'tg{r["n_gen"]}'
    ratio = f'{r["avg_ts"] / f16[key]:.3f}x f16' if key in f16 else ''
    print(f'{r["type_k"]}/{r["type_v"]:7} {test:7} d{r["n_depth"]:<6} {r["avg_ts"]:9.1f} t/s  {ratio}')
PY
}

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
    applied=()
    for d in "${diffs[@]}"; do
        if (cd "$ROOT/.h200/llama.cpp" && patch -p1 < "$ROOT/$d") >> "$OUT/patch.log" 2>&1; then
            applied+=("$d")
        else
            cat "$OUT/patch.log"; rc=1; break
        fi
    done
    if [ ${#applied[@]} -eq ${#diffs[@]} ]; then
        echo "== $name"
        bash "$ROOT/scripts/h200_run.sh" "${steps[@]}" || rc=1
        [ -s "$OUT/bench.jsonl" ] && summary "$OUT/bench.jsonl"
    fi
    # restore the series for the next variant (in reverse order)
    for ((i = ${#applied[@]} - 1; i >= 0; i--)); do
        (cd "$ROOT/.h200/llama.cpp" && patch -p1 -R < "$ROOT/${applied[i]}") >> "$OUT/patch.log" 2>&1 || rc=1
    done
done
exit $rc
