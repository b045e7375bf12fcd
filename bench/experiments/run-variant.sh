#!/usr/bin/env bash
# Measure an experiment diff against the series on the H200, in two device calls (each stays under 10 minutes;
# the build directory h200-out/build survives between calls of a warm machine). Prepare with
# `python scripts/prepare_h200.py`, then run through the device tool with .h200 carried:
#   call 1: bash bench/experiments/run-variant.sh series
#   call 2: bash bench/experiments/run-variant.sh bench/experiments/<diff>[+bench/experiments/<diff>...]
# Each call runs test-backend-ops (turbo cases), llama-bench (tg and pp at d0/8192/32768, five configs) and the
# per-launch ncu times of the decode attention kernels; results go to $OUT/<name>/ (default ./h200-out).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
what=${1:?usage: run-variant.sh series|<diff>[+<diff>...]}
name=
# (joined with "_and_": the device tool does not bring back files under names with a "+")
for d in ${what//+/ }; do name=${name:+${name}_and_}$(basename "$d" .diff); done
OUT=${OUT:-$ROOT/h200-out}/$name; mkdir -p "$OUT"; export OUT
if [ "$what" != series ]; then
    # the carried tree is the unpatched series again in every call; patching it makes the build incremental
    for d in ${what//+/ }; do
        (cd "$ROOT/.h200/llama.cpp" && patch -p1 < "$ROOT/$d") >> "$OUT/patch.log" 2>&1 \
            || { cat "$OUT/patch.log"; exit 1; }
    done
fi
bash "$ROOT/scripts/h200_run.sh" build ops bench 2 0,8192,32768 f16,turbo3,turbo4,turbo2,q8_0/turbo4 kernels
python3 - "$OUT/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
f16 = {(r["n_prompt"], r["n_gen"], r["n_depth"]): r["avg_ts"] for r in rows if r["type_k"] == r["type_v"] == "f16"}
for r in rows:
    key = (r["n_prompt"], r["n_gen"], r["n_depth"])
    test = f'pp{r["n_prompt"]}' if r["n_prompt"] else f'tg{r["n_gen"]}'
    print(f'{r["type_k"]}/{r["type_v"]:7} {test:7} d{r["n_depth"]:<6} {r["avg_ts"]:9.1f} t/s  {r["avg_ts"] / f16[key]:.3f}x f16')
PY
