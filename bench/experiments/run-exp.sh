#!/usr/bin/env bash
# The device run that measured cuda-turbo-prefetch.diff against the series in one build (the switch is off by
# default). Prepare with `python scripts/prepare_h200.py`, then `cd .h200/llama.cpp && patch -p1 <
# ../../bench/experiments/cuda-turbo-prefetch.diff`, and run this through the device tool with .h200 carried.
# Results under $OUT (default ./h200-out): exp-ops.txt, exp-bench.jsonl and a ratio table on stdout.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/h200-out}; mkdir -p "$OUT"
B=$ROOT/h200-out/build/bin; MODELS=${TQ_MODELS:-/tmp/tq-models}
export PYTHONPATH=$ROOT:$ROOT/.h200/llama.cpp/gguf-py
bash "$ROOT/scripts/h200_run.sh" build || exit 1
[ -f $MODELS/l3-8b.gguf ] || python3 -m tqgguf synth -o $MODELS/l3-8b.gguf --source $ROOT/.h200/llama.cpp --fast \
    --preset llama3-8b --weights q4_0 > /dev/null
{
  echo "== test-backend-ops FLASH_ATTN_EXT turbo, GGML_CUDA_TURBO_PREFETCH=1"
  GGML_CUDA_TURBO_PREFETCH=1 $B/test-backend-ops test -b CUDA0 -o FLASH_ATTN_EXT -p turbo 2>&1 | grep -E "FAIL|tests passed" | tail -5
} | tee "$OUT/exp-ops.txt"
bench() { # label, env, depths, configs
  local label=$1 env=$2 d=$3 cs=$4
  for c in ${cs//,/ }; do
    env $env $B/llama-bench -m $MODELS/l3-8b.gguf -ngl 99 -fa 1 -p 0 -n 128 -d $d -r ${REPS:-2} -ctk ${c%%/*} -ctv ${c##*/} -o jsonl 2>/dev/null \
      | sed "s/^{/{\"variant\": \"$label\", /" >> "$OUT/exp-bench.jsonl"
  done
}
: > "$OUT/exp-bench.jsonl"
bench series X=0 0,32768 f16,turbo3,turbo2,turbo4
bench prefetch GGML_CUDA_TURBO_PREFETCH=1 0,32768 turbo3,turbo2,turbo4
python3 - "$OUT/exp-bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["n_depth"]): r["avg_ts"] for r in rows if r["type_k"] == "f16" and r["variant"] == "series"}
for r in rows:
    print(f'{r["variant"]:9} {r["type_k"]}/{r["type_v"]} d{r["n_depth"]:<6} tg{r["n_gen"]} {r["avg_ts"]:8.1f} t/s  {r["avg_ts"]/base[r["n_depth"]]:.3f}x f16')
PY
