#!/usr/bin/env bash
# The shortest GPU check of a decode-kernel diff on a fresh H200 machine (more than 4.5 minutes: in the tenth round
# its build had not finished after 246 s, when the device time ran out; the build of llama-perplexity alone had taken
# 227 s that day without the diff, so a diff that touches fattn-turbo-mma.cuh costs more): apply the diff to the
# carried .h200 tree, build llama-perplexity alone (upstream's vector FlashAttention instances cut to f16-f16, which
# these runs do not use), then scripts/h200_run.sh's parity step for the given types at -ub 1 only (the CUDA decode
# kernel against the CPU run; until the twenty-fourth round -ub 4 on q8_0 weights, where upstream's matrix
# products set most of the KLD, ../results/cuda-h200-round24/). Results go to $OUT/parity.txt (default ./h200-out).
#   bash bench/experiments/quick-parity.sh bench/experiments/<diff> turbo3 turbo2
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { echo "usage: quick-parity.sh <diff> <type>..." >&2; exit 2; }
diff=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); shift
OUT=${OUT:-$ROOT/h200-out} bash "$ROOT/scripts/h200_run.sh" unpack || exit 2 # (the tree travels packed)
(cd "$ROOT/.h200/llama.cpp" && patch -p1 -s --forward < "$diff") || { echo "the diff does not apply" >&2; exit 1; }
sed -i 's/^-DGGML_CUDA_FA_QUANTS=.*/-DGGML_CUDA_FA_QUANTS=f16-f16/' "$ROOT/.h200/cmake-args.txt"
TQ_BUILD_TARGETS=llama-perplexity TQ_PARITY_TYPES="$*" TQ_PARITY_UB=1 bash "$ROOT/scripts/h200_run.sh" build parity
