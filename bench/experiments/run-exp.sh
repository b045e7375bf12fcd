#!/usr/bin/env bash
# One device run for the experiments in this folder, on a tree where both diffs are applied
# (python scripts/prepare_h200.py; then in .h200/llama.cpp: patch -p1 < each diff). Both are off by default,
# so one build measures the series and each variant. Results under $OUT (default ./h200-out).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/h200-out}; mkdir -p "$OUT"
B=$ROOT/h200-out/build/bin; MODELS=${TQ_MODELS:-/tmp/tq-models}
export PYTHONPATH=$ROOT:$ROOT/.h200/llama.cpp/gguf-py
bash "$ROOT/scripts/h200_run.sh" build || exit 1
python3 -m tqgguf synth -o $MODELS/l3-8b.gguf --source $ROOT/.h200/llama.cpp --fast --preset llama3-8b --weights q4_0 > /dev/null &
{
  echo "== test-backend-ops FLASH_ATTN_EXT turbo, GGML_CUDA_TURBO_PREFETCH=1"
  GGML_CUDA_TURBO_PREFETCH=1 $B/test-backend-ops test -b CUDA0 -o FLASH_ATTN_EXT -p turbo 2>&1 | grep -E "FAIL|tests passed" | tail -5
  echo "== test-backend-ops SET_ROWS turbo (series kernel; the fused one is checked by KLD below)"
  $B/test-backend-ops test -b CUDA0 -o SET_ROWS -p turbo 2>&1 | grep -E "FAIL|tests passed" | tail -3
} | tee "$OUT/exp-ops.txt"
python3 -m tqgguf synth -o $MODELS/par-hd128.gguf --source $ROOT/.h200/llama.cpp --fast --layers 4 --n-embd 1024 \
    --n-head 8 --n-head-kv 2 --head-dim 128 --weights q8_0 > /dev/null
wait
M=$MODELS/par-hd128.gguf; T=$ROOT/.h200/wiki-300k.txt
for t in turbo3 turbo4; do
  for ub in 4 256; do
    $B/llama-perplexity -m $M -f $T -c 256 --chunks 4 -ngl 99 -fa on -ub $ub -ctk $t -ctv $t --kl-divergence-base /tmp/b-$t-$ub.kld > /dev/null 2>&1
    GGML_CUDA_TURBO_ROT_SET_ROWS=1 $B/llama-perplexity -m $M -f $T -c 256 --chunks 4 -ngl 99 -fa on -ub $ub -ctk $t -ctv $t \
      --kl-divergence-base /tmp/b-$t-$ub.kld --kl-divergence 2>&1 | grep -E "Mean +KLD|Maximum KLD|Same top" | tr -s ' ' | paste -sd ';' \
      | sed "s/^/rot-set-rows vs series $t ub=$ub: /" | tee -a "$OUT/exp-rot-kld.txt"
  done
done
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
bench rotk GGML_CUDA_TURBO_ROT_SET_ROWS=1 0 f16,turbo3,turbo4
python3 - "$OUT/exp-bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
base = {(r["n_depth"]): r["avg_ts"] for r in rows if r["type_k"] == "f16" and r["variant"] == "series"}
for r in rows:
    print(f'{r["variant"]:9} {r["type_k"]}/{r["type_v"]} d{r["n_depth"]:<6} tg{r["n_gen"]} {r["avg_ts"]:8.1f} t/s  {r["avg_ts"]/base[r["n_depth"]]:.3f}x f16')
PY
