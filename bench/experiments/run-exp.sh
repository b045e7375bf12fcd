#!/usr/bin/env bash
# The device run that measured cuda-turbo-prefetch.diff against the series in one build (the switch is off by
# default). Prepare with `python scripts/prepare_h200.py`, then `cd .h200/llama.cpp && patch -p1 <
# ../../bench/experiments/cuda-turbo-prefetch.diff`, and run this through the device tool with .h200 carried.
# Results under $OUT (default ./h200-out): exp-ops.txt, bench-series.jsonl, bench-prefetch.jsonl and a ratio table.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/h200-out}; mkdir -p "$OUT"; export OUT
RUN=$ROOT/scripts/h200_run.sh
bash "$RUN" build || exit 1
GGML_CUDA_TURBO_PREFETCH=1 "$ROOT/h200-out/build/bin/test-backend-ops" test -b CUDA0 -o FLASH_ATTN_EXT -p turbo 2>&1 \
    | grep -E "FAIL|tests passed" | tail -5 | tee "$OUT/exp-ops.txt"
bash "$RUN" bench 2 0,32768 f16,turbo3,turbo2,turbo4 && mv "$OUT/bench.jsonl" "$OUT/bench-series.jsonl"
GGML_CUDA_TURBO_PREFETCH=1 bash "$RUN" bench 2 0,32768 turbo3,turbo2,turbo4 && mv "$OUT/bench.jsonl" "$OUT/bench-prefetch.jsonl"
python3 - "$OUT/bench-series.jsonl" "$OUT/bench-prefetch.jsonl" <<'PY'
import json, sys
runs = {f.rsplit("bench-", 1)[1][:-6]: [json.loads(l) for l in open(f) if l.strip()] for f in sys.argv[1:]}
f16 = {(r["n_depth"], r["n_gen"]): r["avg_ts"] for r in runs["series"] if r["type_k"] == "f16"}
for variant, rows in runs.items():
    for r in rows:
        if r["n_gen"]:  # tg rows (llama-bench also writes the pp2048 rows)
            print(f'{variant:9} {r["type_k"]}/{r["type_v"]} d{r["n_depth"]:<6} {r["avg_ts"]:8.1f} t/s  '
                  f'{r["avg_ts"] / f16[(r["n_depth"], r["n_gen"])]:.3f}x f16')
PY
