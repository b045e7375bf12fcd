#!/usr/bin/env bash
# How far two CPU runs of the same cache type drift apart when only the arithmetic's order changes, on the model of
# h200_run.sh's parity step. It is the yardstick for that step's CUDA-against-CPU KLD (issue #7: "at the level of
# f16-vs-f16 noise"). The base run takes whole 256-token batches (as the parity step's CPU base). The run compared
# against it takes batches of 4 tokens, as the CUDA run with -ub 4 does: other matrix-product kernels and another
# attention path, the same model, text and cache type. A second pair moves the RoPE base by 0.1%, a small change to
# the model itself, and shows how much each cache type amplifies a difference of that size.
#   bash bench/experiments/parity-noise.sh [OUT]     (default bench/results/cpu-parity-noise)
# TQ_NOISE_WEIGHTS: the model's weight type (default f32, as the parity step's since the twenty-fourth round;
# q8_0 before: bench/results/cpu-parity-noise/noise.txt)
# TQ_NOISE_TYPES: the cache types (default f16 turbo3 turbo4 turbo2)
# Needs a CPU build with llama-perplexity (tqgguf build --targets llama-perplexity), the pinned source (tqgguf
# source) and ../shared/data/wikitext-2-raw-test.txt or .h200/wiki-300k.txt.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$ROOT/bench/results/cpu-parity-noise}
TQ=$ROOT/.venv/bin/tqgguf
P=$("$TQ" build --print-bin llama-perplexity)
SRC=$("$TQ" source)
WORK=${TQ_NOISE_WORK:-/tmp/tq-parity-noise}
mkdir -p "$OUT" "$WORK"
TXT=$WORK/wiki-300k.txt
if [ ! -f "$TXT" ]; then
    src=$ROOT/../shared/data/wikitext-2-raw-test.txt
    [ -f "$src" ] || src=$ROOT/.h200/wiki-300k.txt
    head -c 300000 "$src" > "$TXT"
fi
W=${TQ_NOISE_WEIGHTS:-f32}
M=$WORK/par-hd128-$W.gguf
# the parity step's model: its arguments as scripts/h200_run.sh defines them
eval "$(grep '^PAR_MODEL_ARGS=' "$ROOT/scripts/h200_run.sh")"
[ -f "$M" ] || PYTHONPATH=$ROOT:$SRC/gguf-py "$ROOT/.venv/bin/python" -m tqgguf synth -o "$M" --source "$SRC" --fast \
    "${PAR_MODEL_ARGS[@]}" --weights "$W" > /dev/null
# the RoPE base (llama.cpp's default where the file has none) and 0.1% more
read -r BASE_FREQ PERT_FREQ < <("$ROOT/.venv/bin/python" -c "
import sys
from tqgguf.gguf_read import read_gguf
f = float(read_gguf(sys.argv[1]).kv.get('llama.rope.freq_base', 10000.0))
print(f'{f:.9g} {f*1.001:.9g}')" "$M")
common=(-m "$M" -f "$TXT" -c 256 --chunks 8 -fa on -t "$(nproc)")
{ echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"; echo "tqgguf commit: $(git -C "$ROOT" rev-parse --short HEAD)";
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) x $(nproc)";
  echo "weights: $W"; echo "rope base: $BASE_FREQ, perturbed: $PERT_FREQ"; } > "$OUT/device.txt"
: > "$OUT/noise.txt"
for t in ${TQ_NOISE_TYPES:-f16 turbo3 turbo4 turbo2}; do
    "$P" "${common[@]}" -ctk "$t" -ctv "$t" --kl-divergence-base "$WORK/base-$W-$t.kld" > "$WORK/base-$W-$t.log" 2>&1
    for v in ub4 rope; do
        extra=(-ub 4)
        [ $v = rope ] && extra=(--rope-freq-base "$PERT_FREQ")
        "$P" "${common[@]}" -ctk "$t" -ctv "$t" "${extra[@]}" --kl-divergence-base "$WORK/base-$W-$t.kld" \
            --kl-divergence > "$WORK/$v-$W-$t.log" 2>&1
        echo "$t $v: $(grep -E 'Mean +KLD|Same top' "$WORK/$v-$W-$t.log" | tr -s ' ' | paste -sd ';')" | tee -a "$OUT/noise.txt"
    done
done
