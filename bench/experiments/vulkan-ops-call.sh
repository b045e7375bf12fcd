#!/usr/bin/env bash
# One device call: build the Vulkan backend with a cooperative-matrix glslc (vulkan-sdk-trixie.sh) and run
# test-backend-ops -b Vulkan0 on the flash-attention cases with a q8_0 K (the scalar shader's int8 variant on a
# device with integer dot products; patch 0052), then on every turbo case (scripts/h200_vulkan.sh ops).
# Carry [".h200/vulkan.tar.gz", ".h200/commit.txt", ".h200/vulkan-sdk-trixie.tar.gz", ".gl"] and run from the
# repository root:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; OUT=/tmp/vo bash bench/experiments/vulkan-ops-call.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export VK_SDK_OVERLAY=$ROOT/.h200/vulkan-sdk-trixie.tar.gz
export OUT=${OUT:-$ROOT/h200-vulkan-out}
mkdir -p "$OUT"
B=/tmp/tq-vulkan-build-overlay/bin
export LD_LIBRARY_PATH=/tmp/tq-vulkan-src/vulkan-sdk/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

bash scripts/h200_vulkan.sh build || exit 1
# the int8 variant (the device's default where it has integer dot products) and the f16 one, on the same cases
for s in "" GGML_VK_DISABLE_INTEGER_DOT_PRODUCT=1; do
    f=$OUT/ops-q8_0-k${s:+-no-int-dot}.txt
    log "q8_0 K: FLASH_ATTN_EXT type_K=q8_0 ${s:-(int8 Q where the device has integer dot products)}"
    env $s "$B/test-backend-ops" -b Vulkan0 -o FLASH_ATTN_EXT -p "type_K=q8_0" > "$f" 2>&1
    log "q8_0 K: $(grep -c ': .*OK' "$f") OK, $(grep -c 'FAIL' "$f") FAIL; $(grep -E 'tests passed' "$f" | tail -1)"
    grep FAIL "$f" | sed 's/\x1b\[[0-9;]*m//g' | cut -c1-220 | head -8 | tee -a "$OUT/steps.log"
done
bash scripts/h200_vulkan.sh ops
