#!/usr/bin/env bash
# The turbo decode kernel alone (twenty-fifth round). h200_run.sh's parity step compares CUDA runs against a base
# run with -ngl 0, but in a CUDA build that base is not all CPU: llama.cpp offloads the matrix products of batches of
# 32 or more tokens whose weights sit in host memory to the GPU (op offload), so the base's K and V come from
# cuBLAS, the CUDA run's at -ub 1-3 from the small-batch kernels (mmvf), and the turbo codes turn those last-bit
# differences into flipped indices. Two comparisons without that:
#   A. same matrix products: the base is CUDA at the same -ub with GGML_CUDA_TURBO_DECODE_OFF=1 (upstream's path:
#      K and V converted to f16, the tensor-core kernel); the run compared is the decode kernel. What differs is the
#      attention kernel only.
#   B. a CPU base with --no-op-offload (all CPU), against CUDA at -ub 1 and 256. (h200_run.sh parity takes that base
#      too since the twenty-fifth round, and adds the runs with TF32 off; B stays here so that one call gives both.)
# Runs on the device after `h200_run.sh build` with cuda-turbo-decode-off-env.diff applied and a parity step (which
# leaves the f32 model in /tmp/tq-models). OUT: where the results go.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${TQ_BUILD:-$ROOT/h200-out/build}/bin
M=${TQ_MODELS:-/tmp/tq-models}/par-hd128-f32.gguf
W=/tmp/tq-dk; mkdir -p "$W" "$OUT"
P=$BIN/llama-perplexity
common=(-m "$M" -f "$ROOT/.h200/wiki-300k.txt" -c 256 --chunks 8 -fa on -t "$(nproc)")
kld() { grep -E 'Mean +KLD|Maximum KLD|Same top' "$1" | tr -s ' ' | paste -sd ';'; }
for t in ${TQ_DK_TYPES:-f16 turbo3 turbo4 turbo2}; do
    for ub in 1 3; do
        GGML_CUDA_TURBO_DECODE_OFF=1 "$P" "${common[@]}" -ngl 99 -ub $ub -ctk $t -ctv $t \
            --kl-divergence-base "$W/off-$t-$ub.kld" > "$W/off-$t-$ub.txt" 2>&1
        "$P" "${common[@]}" -ngl 99 -ub $ub -ctk $t -ctv $t --kl-divergence-base "$W/off-$t-$ub.kld" \
            --kl-divergence > "$W/dk-$t-$ub.txt" 2>&1
        echo "A $t ub=$ub decode kernel vs upstream path: $(kld "$W/dk-$t-$ub.txt")" | tee -a "$OUT/decode-kernel.txt"
    done
    "$P" "${common[@]}" -ngl 0 --no-op-offload -ctk $t -ctv $t --kl-divergence-base "$W/cpu-$t.kld" \
        > "$W/cpu-$t.txt" 2>&1
    for ub in 1 256; do
        "$P" "${common[@]}" -ngl 99 -ub $ub -ctk $t -ctv $t --kl-divergence-base "$W/cpu-$t.kld" \
            --kl-divergence > "$W/cuda-$t-$ub.txt" 2>&1
        echo "B $t ub=$ub CUDA vs CPU without op offload: $(kld "$W/cuda-$t-$ub.txt")" | tee -a "$OUT/decode-kernel.txt"
    done
done
