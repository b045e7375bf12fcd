#!/usr/bin/env bash
# One device call: patch 0051 (turbo caches to f16 for flash attention's prefill) on the H200's Vulkan driver, built
# with a cooperative-matrix glslc (vulkan-sdk-trixie.sh), under the three flash-attention paths one build can take:
# coopmat2 (the driver's default), coopmat1 (GGML_VK_DISABLE_COOPMAT2=1) and scalar only (GGML_VK_DISABLE_COOPMAT=1
# as well, what a build with an older glslc gives every GPU). In each, vulkan-ab.sh alternates the series with
# GGML_VK_DISABLE_TURBO_DEQUANT_KV=1 (0051's path off) on llama-bench -p 512 -n 128 -d 0,8192. Then
# test-backend-ops: 0050's prefill cases with and without the path, and every turbo case (h200_vulkan.sh ops).
# The step q8k-ops (not in the default list) runs every FLASH_ATTN_EXT case with a q8_0 K, with int8 Q (the scalar
# shader's variant where the device has integer dot products; patch 0052) and with GGML_VK_DISABLE_INTEGER_DOT_PRODUCT=1;
# VPM_STEPS="build q8k-ops ops" is the call that verified 0052 (bench/results/vulkan-h100-0052/).
# Carry [".h200/vulkan.tar.gz", ".h200/commit.txt", ".h200/vulkan-sdk-trixie.tar.gz", ".gl"] and run from the
# repository root:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; OUT=/tmp/vm bash bench/experiments/vulkan-prefill-modes.sh
# Settings: VPM_MODES (default "cm2 cm1 scalar"), VPM_CONFIGS (default "f16/f16 turbo3/turbo3"), VPM_ROUNDS
# (default 2), VPM_STEPS (default "build prefill-ops modes ops").
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export VK_SDK_OVERLAY=$ROOT/.h200/vulkan-sdk-trixie.tar.gz
export OUT=${OUT:-$ROOT/h200-vulkan-out}
mkdir -p "$OUT"
B=/tmp/tq-vulkan-build-overlay/bin
export LD_LIBRARY_PATH=/tmp/tq-vulkan-src/vulkan-sdk/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

mode_env() { # the settings that give a mode's flash-attention path
    case $1 in
    cm2) echo "" ;;
    cm1) echo "GGML_VK_DISABLE_COOPMAT2=1" ;;
    scalar) echo "GGML_VK_DISABLE_COOPMAT=1 GGML_VK_DISABLE_COOPMAT2=1" ;;
    *) echo "unknown mode $1" >&2; return 1 ;;
    esac
}

for step in ${VPM_STEPS:-build prefill-ops modes ops}; do
    case $step in
    build)
        bash scripts/h200_vulkan.sh build || exit 1
        ;;
    prefill-ops)
        for s in "" GGML_VK_DISABLE_TURBO_DEQUANT_KV=1; do
            log "prefill-ops: TURBO_ROT_FATTN cache_layout=1 ${s:-(the f16 scratch of 0051)}"
            env $s "$B/test-backend-ops" -b Vulkan0 -o TURBO_ROT_FATTN -p cache_layout=1 \
                > "$OUT/ops-prefill${s:+-disabled}.txt" 2>&1
            grep -E "tests passed|FAIL" "$OUT/ops-prefill${s:+-disabled}.txt" | tail -5 | tee -a "$OUT/steps.log"
        done
        ;;
    modes)
        # the model (tqgguf synth) once, through the bench step with nothing but f16 decode at depth 0
        VK_CONFIGS=f16/f16 VK_DEPTHS=0 OUT=$OUT/model bash scripts/h200_vulkan.sh bench > /dev/null
        for m in ${VPM_MODES:-cm2 cm1 scalar}; do
            me=$(mode_env "$m") || exit 2
            log "mode $m (${me:-driver default}): $(env $me "$B/test-backend-ops" -b Vulkan0 -o ADD 2>&1 \
                | grep -o 'matrix cores: [A-Za-z0-9_]*' | head -1)"
            env $me VK_AB_ENV=GGML_VK_DISABLE_TURBO_DEQUANT_KV=1 VK_AB_PROMPT=512 VK_AB_ROUNDS=${VPM_ROUNDS:-2} \
                VK_AB_CONFIGS="${VPM_CONFIGS:-f16/f16 turbo3/turbo3}" OUT=$OUT/$m \
                bash bench/experiments/vulkan-ab.sh > "$OUT/$m.console.txt" 2>&1
            tail -n "$((4 * 2 * $(echo ${VPM_CONFIGS:-f16/f16 turbo3/turbo3} | wc -w) + 2))" "$OUT/$m/ab/summary.txt" \
                | tee -a "$OUT/steps.log"
        done
        ;;
    q8k-ops)
        for s in "" GGML_VK_DISABLE_INTEGER_DOT_PRODUCT=1; do
            f=$OUT/ops-q8_0-k${s:+-no-int-dot}.txt
            log "q8_0 K: FLASH_ATTN_EXT type_K=q8_0 ${s:-(int8 Q where the device has integer dot products)}"
            env $s "$B/test-backend-ops" -b Vulkan0 -o FLASH_ATTN_EXT -p "type_K=q8_0" > "$f" 2>&1
            log "q8_0 K: $(grep -c ': .*OK' "$f") OK, $(grep -c 'FAIL' "$f") FAIL; $(grep -E 'tests passed' "$f" | tail -1)"
            grep FAIL "$f" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-220 | head -8 | tee -a "$OUT/steps.log"
        done
        ;;
    ops)
        bash scripts/h200_vulkan.sh ops
        ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
    esac
done
