#!/usr/bin/env bash
# One call on a fresh H200 machine for cuda-probe-skip.diff: apply it to .h200, synthesize the Llama-3-8B-shape model
# while llama-bench builds, then probe-skip.sh. Output under $OUT (default ./h200-out).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
export OUT=${OUT:-$ROOT/h200-out}
M=${TQ_MODELS:-/tmp/tq-models}
mkdir -p "$OUT" "$M"
OUT=${OUT:-$ROOT/h200-out} bash "$ROOT/scripts/h200_run.sh" unpack || exit 2 # (the tree travels packed)
(cd "$ROOT/.h200/llama.cpp" && patch -p1 -s --forward < "$ROOT/bench/experiments/cuda-probe-skip.diff") \
    || { echo "the diff does not apply" >&2; exit 1; }
sed -i 's/^-DGGML_CUDA_FA_QUANTS=.*/-DGGML_CUDA_FA_QUANTS=f16-f16/' "$ROOT/.h200/cmake-args.txt"
(PYTHONPATH=$ROOT:$ROOT/.h200/llama.cpp/gguf-py python3 -m tqgguf synth -o "$M/l3-8b.tmp.gguf" \
    --source "$ROOT/.h200/llama.cpp" --fast --preset llama3-8b --weights q4_0 > /dev/null \
    && mv "$M/l3-8b.tmp.gguf" "$M/l3-8b.gguf") &
TQ_BUILD_TARGETS=llama-bench bash "$ROOT/scripts/h200_run.sh" build || exit 1
wait
bash "$ROOT/bench/experiments/probe-skip.sh"
