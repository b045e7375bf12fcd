#!/usr/bin/env bash
# The shortest GPU check of a decode-kernel diff on a fresh H200 machine (more than 4.5 minutes: in the tenth round
# its build had not finished after 246 s, when the device time ran out; the build of llama-perplexity alone had taken
# 227 s that day without the diff, so a diff that touches fattn-turbo-mma.cuh costs more): apply the diff to the
# carried .h200 tree, build llama-perplexity alone (upstream's vector FlashAttention instances cut to f16-f16, which
# these runs do not use), then the parity step's KLD of the CUDA decode kernel (-ub 4) against the CPU run for the
# given types. Results go to $OUT/quick-parity.txt (default ./h200-out).
#   bash bench/experiments/quick-parity.sh bench/experiments/cuda-turbo-v-reg.diff turbo3 turbo2
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { echo "usage: quick-parity.sh <diff> <type>..." >&2; exit 2; }
diff=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); shift
OUT=${OUT:-$ROOT/h200-out}
mkdir -p "$OUT"
(cd "$ROOT/.h200/llama.cpp" && patch -p1 -s --forward < "$diff") || { echo "the diff does not apply" >&2; exit 1; }
sed -i 's/^-DGGML_CUDA_FA_QUANTS=.*/-DGGML_CUDA_FA_QUANTS=f16-f16/' "$ROOT/.h200/cmake-args.txt"
OUT=$OUT TQ_BUILD_TARGETS=llama-perplexity bash "$ROOT/scripts/h200_run.sh" build || exit 1

SRC=$ROOT/.h200/llama.cpp
BIN=${TQ_BUILD:-$ROOT/h200-out/build}/bin
M=${TQ_MODELS:-/tmp/tq-models}
mkdir -p "$M"
# the parity step's model (scripts/h200_run.sh, PAR_MODEL_ARGS)
[ -f "$M/par-hd128.gguf" ] || PYTHONPATH="$ROOT:$SRC/gguf-py" python3 -m tqgguf synth -o "$M/par-hd128.gguf" \
    --source "$SRC" --fast --layers 4 --n-embd 1024 --n-head 8 --n-head-kv 2 --head-dim 128 --weights q8_0 > /dev/null
common=(-m "$M/par-hd128.gguf" -f "$ROOT/.h200/wiki-300k.txt" -c 256 --chunks 8 -fa on -t "$(nproc)")
for t in "$@"; do
    "$BIN/llama-perplexity" "${common[@]}" -ngl 0 -ctk "$t" -ctv "$t" --kl-divergence-base "$M/qp-$t.kld" > /dev/null 2>&1
    "$BIN/llama-perplexity" "${common[@]}" -ngl 99 -ub 4 -ctk "$t" -ctv "$t" --kl-divergence-base "$M/qp-$t.kld" \
        --kl-divergence 2>&1 | grep -E "Mean +KLD|Same top" | tr -s ' ' | paste -sd ';' | sed "s/^/$t ub=4: /" \
        | tee -a "$OUT/quick-parity.txt"
done
