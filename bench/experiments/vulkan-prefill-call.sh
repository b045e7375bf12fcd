#!/usr/bin/env bash
# One device call: the Vulkan backend built with a cooperative-matrix glslc (vulkan-sdk-trixie.sh) and
# vulkan-turbo-prefill-f16.diff (turbo caches to f16 for flash attention's prefill), measured against the series
# without it on one build through the switch of vulkan-turbo-dequant-kv-env.diff (GGML_VK_TURBO_DEQUANT_KV=0):
# llama-bench with a 512-token prompt and tg128 at depths 0 and 8192 (in vulkan-ab.sh's summary, plain labels are
# the diff's path and "... without" the series' own), and test-backend-ops on patch 0050's prefill cases.
# Carry [".h200/vulkan.tar.gz", ".h200/commit.txt", ".h200/vulkan-sdk-trixie.tar.gz", ".gl"] and run from the
# repository root:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; OUT=/tmp/vo bash bench/experiments/vulkan-prefill-call.sh
# Settings: VPC_CONFIGS (K/V pairs of the A/B, default "f16/f16 turbo3/turbo3 q8_0/turbo4"), VPC_ROUNDS (default 1),
# VPC_STEPS (default "build ab ops"; a warm machine's second call can skip the build).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
export VK_SDK_OVERLAY=$ROOT/.h200/vulkan-sdk-trixie.tar.gz
export OUT=${OUT:-$ROOT/h200-vulkan-out}
mkdir -p "$OUT"
B=/tmp/tq-vulkan-build-overlay/bin
for step in ${VPC_STEPS:-build ab ops}; do
    case $step in
    build)
        bash scripts/h200_vulkan.sh unpack || exit 1
        if ! grep -q GGML_VK_TURBO_DEQUANT_KV /tmp/tq-vulkan-src/llama.cpp/ggml/src/ggml-vulkan/ggml-vulkan.cpp; then
            for d in vulkan-turbo-prefill-f16 vulkan-turbo-dequant-kv-env; do
                (cd /tmp/tq-vulkan-src/llama.cpp && patch -p1 < "$ROOT/bench/experiments/$d.diff") || exit 1
            done
        fi
        bash scripts/h200_vulkan.sh build || exit 1
        ;;
    ab)
        # the model (tqgguf synth) and f16 with the prompt, then the alternating rounds
        VK_CONFIGS=f16/f16 VK_PROMPT=512 bash scripts/h200_vulkan.sh bench
        VK_AB_ENV=GGML_VK_TURBO_DEQUANT_KV=0 VK_AB_PROMPT=512 VK_AB_ROUNDS=${VPC_ROUNDS:-1} \
            VK_AB_CONFIGS=${VPC_CONFIGS:-"f16/f16 turbo3/turbo3 q8_0/turbo4"} bash bench/experiments/vulkan-ab.sh
        ;;
    ops)
        echo "[$(date +%H:%M:%S)] ops: TURBO_ROT_FATTN prefill cases (cache layout)" | tee -a "$OUT/steps.log"
        "$B/test-backend-ops" -b Vulkan0 -o TURBO_ROT_FATTN -p cache_layout=1 > "$OUT/ops-prefill.txt" 2>&1
        grep -E "tests passed|FAIL" "$OUT/ops-prefill.txt" | tail -5 | tee -a "$OUT/steps.log"
        ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
    esac
done
