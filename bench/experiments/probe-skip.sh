#!/usr/bin/env bash
# Decode time with parts of the step left out, on a build with cuda-probe-skip.diff: for each cache type, llama-bench
# tg128 at the given depths with GGML_CUDA_PROBE_SKIP unset ("none"), =fa (no attention, nor its fused rotations,
# for one-token batches), =writes (no KV-cache SET_ROWS, fused or not) and =combine (no merge of a split attention).
# The differences are what those parts cost inside the CUDA graph, which ncu, timing each kernel alone with cold
# caches, cannot show. The tokens decoded with a part left out are wrong; only their times mean something.
#   fresh machine: TQ_BUILD_TARGETS=llama-bench bash scripts/h200_run.sh build   (with the diff applied to .h200)
#   then:          bash bench/experiments/probe-skip.sh        (results: $OUT/probe.jsonl, $OUT/probe.txt)
#   PROBE_TYPES (default "f16 turbo3 turbo2"), PROBE_DEPTHS (default "0,32768"), PROBE_REPS (default 3),
#   PROBE_SKIPS (default "none fa writes", what the eleventh round ran; "combine" needs the current diff, not
#   251a99e's)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$ROOT/h200-out}
BIN=${TQ_BUILD:-$ROOT/h200-out/build}/bin
MODELS=${TQ_MODELS:-/tmp/tq-models}
M=$MODELS/l3-8b.gguf
mkdir -p "$OUT" "$MODELS"
export PYTHONPATH=$ROOT:$ROOT/.h200/llama.cpp/gguf-py${PYTHONPATH:+:$PYTHONPATH}
[ -f "$M" ] || python3 -m tqgguf synth -o "$M" --source "$ROOT/.h200/llama.cpp" --fast --preset llama3-8b \
    --weights q4_0 > /dev/null || exit 1
for t in ${PROBE_TYPES:-f16 turbo3 turbo2}; do
    for s in ${PROBE_SKIPS:-none fa writes}; do
        skip=()
        [ "$s" = none ] || skip=(GGML_CUDA_PROBE_SKIP=$s)
        env "${skip[@]}" "$BIN/llama-bench" -m "$M" -ngl 99 -fa 1 -p 0 -n 128 -d "${PROBE_DEPTHS:-0,32768}" \
            -r "${PROBE_REPS:-3}" -ctk "$t" -ctv "$t" -o jsonl 2> /dev/null \
            | sed "s/^{/{\"probe_skip\": \"$s\", /" | tee -a "$OUT/probe.jsonl" \
            | python3 -c 'import json, sys
for line in sys.stdin:
    d = json.loads(line)
    t, s, depth, ts = d["type_k"], d["probe_skip"], d["n_depth"], d["avg_ts"]
    print(f"{t} skip={s} d={depth}: {ts:.2f} tok/s, {1e3 / ts:.3f} ms/token", flush=True)' | tee -a "$OUT/probe.txt"
    done
done
