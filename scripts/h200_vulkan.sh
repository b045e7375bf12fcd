#!/usr/bin/env bash
# The Vulkan backend's turbo kernels (patch 0040) on the H200 machine's NVIDIA GPU through its Vulkan driver.
#
# Needs what `scripts/prepare_h200.py --vulkan` writes (.h200/vulkan.tar.gz: the patched tree with ggml-vulkan, and
# the headers, loader, glslc and SPIR-V headers that the machine lacks; it has the driver's Vulkan ICD), unpacked to
# $VK_UNPACK_DIR (default /tmp/tq-vulkan-src), and python3 with numpy for `tqgguf synth` (which imports the tree's
# gguf-py). The machine's container lacks the GL dispatch libraries that the NVIDIA Vulkan driver loads (without
# them the loader found "no drivers", bench/results/vulkan-h200-probe/); the device tool's notes say how to fetch
# them as Debian packages into .gl/ (libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2) and unpack
# them first. Run through the device tool with carry [".h200/vulkan.tar.gz", ".h200/commit.txt", ".gl"]:
#   for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig; bash scripts/h200_vulkan.sh build ops bench
#   bash scripts/h200_vulkan.sh build          configure + build test-backend-ops and llama-bench (-DGGML_VULKAN=ON)
#   bash scripts/h200_vulkan.sh ops            test-backend-ops -b Vulkan0 on every turbo case (SET_ROWS, GET_ROWS,
#                                              CPY, FLASH_ATTN_EXT) against the CPU backend
#   bash scripts/h200_vulkan.sh bench          llama-bench -fa 1 -ngl 99 on the Llama-3-8B shape (q4_0 weights):
#                                              tg128 at VK_DEPTHS (default 0,8192) for VK_CONFIGS (K/V pairs),
#                                              and a prompt of VK_PROMPT tokens (default 0: none)
#   bash scripts/h200_vulkan.sh profile        each op's GPU time in decode steps at depth VK_PROFILE_DEPTH (default
#                                              0; GGML_VK_PERF_LOGGER) for VK_PROFILE_CONFIGS (default f16, q8_0,
#                                              turbo3)
#   bash scripts/h200_vulkan.sh unpack         only unpack the tree and the SDK (to patch the tree before a build)
# Steps can be chained: bash scripts/h200_vulkan.sh build ops bench. Results go to $OUT (or ./h200-vulkan-out).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
H=$ROOT/.h200
UNPACK=${VK_UNPACK_DIR:-/tmp/tq-vulkan-src}
SRC=$UNPACK/llama.cpp
SDK=$UNPACK/vulkan-sdk
BUILD=${VK_BUILD_DIR:-/tmp/tq-vulkan-build${VK_SDK_OVERLAY:+-overlay}}
OUT=${OUT:-$ROOT/h200-vulkan-out}
MODELS=${VK_MODELS:-/tmp/tq-vulkan-models}
mkdir -p "$OUT" "$MODELS"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

[ -f "$H/vulkan.tar.gz" ] || { echo "run scripts/prepare_h200.py --vulkan first" >&2; exit 2; }
# VK_SDK_OVERLAY: an archive unpacked over the SDK (bench/experiments/vulkan-sdk-trixie.sh: a glslc with the
# cooperative-matrix extensions and the headers to match); it gets a build directory of its own
overlay=${VK_SDK_OVERLAY:-}
if ! cmp -s "$H/vulkan.tar.gz" "$UNPACK/vulkan.tar.gz" 2>/dev/null \
   || [ "$(cat "$UNPACK/overlay.txt" 2>/dev/null)" != "$overlay" ]; then
    rm -rf "$UNPACK" && mkdir -p "$UNPACK" && tar -xzf "$H/vulkan.tar.gz" -C "$UNPACK" && cp "$H/vulkan.tar.gz" "$UNPACK/"
    if [ -n "$overlay" ]; then
        tar -xzf "$overlay" -C "$UNPACK/vulkan-sdk" || { echo "cannot unpack $overlay" >&2; exit 2; }
    fi
    echo "$overlay" > "$UNPACK/overlay.txt"
fi
export VULKAN_SDK=$SDK PATH=$SDK/bin:$PATH LD_LIBRARY_PATH=$SDK/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONPATH=$ROOT:$SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH} # tqgguf synth imports gguf (the machine has none)
BIN=$BUILD/bin

step_build() {
    log "build: Vulkan backend, test-backend-ops and llama-bench ($(nproc) jobs)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/device.txt" 2>&1
    cat "$H/commit.txt" > "$OUT/commit.txt"
    local t0=$SECONDS
    cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_VULKAN=ON -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_OPENSSL=OFF -DSPIRV-Headers_DIR="$SDK/share/cmake/SPIRV-Headers" \
        > "$OUT/build.log" 2>&1 \
      && cmake --build "$BUILD" -j "$(nproc)" --target test-backend-ops llama-bench >> "$OUT/build.log" 2>&1
    local rc=$?
    log "build: rc $rc in $((SECONDS - t0)) s"
    [ $rc = 0 ] || { tail -30 "$OUT/build.log"; return 1; }
    # (sed reads to the end: head's early exit failed this pipe under pipefail once a device was listed, and with it
    # the build step, in the twenty-third round's first Vulkan call)
    "$BIN/test-backend-ops" -b Vulkan0 -o ADD 2>&1 | grep -E "ggml_vulkan|Vulkan0" | sed -n 1,5p | tee -a "$OUT/steps.log"
}

step_ops() {
    log "ops: test-backend-ops -b Vulkan0, every turbo case"
    local t0=$SECONDS
    "$BIN/test-backend-ops" -b Vulkan0 -o SET_ROWS,GET_ROWS,CPY,FLASH_ATTN_EXT -p turbo > "$OUT/test-backend-ops.txt" 2>&1
    log "ops: rc $? in $((SECONDS - t0)) s: $(grep -c ': .*OK' "$OUT/test-backend-ops.txt") OK," \
        "$(grep -c 'FAIL' "$OUT/test-backend-ops.txt") FAIL, $(grep -c 'not supported' "$OUT/test-backend-ops.txt") not supported"
    grep -E "tests passed|FAIL" "$OUT/test-backend-ops.txt" | tail -8 | tee -a "$OUT/steps.log"
}

synth_model() { # the Llama-3-8B shape with q4_0 weights, made once
    local model=$MODELS/l3-8b.gguf
    if [ ! -f "$model" ]; then
        log "synth: tqgguf synth --preset llama3-8b --weights q4_0"
        (cd "$ROOT" && python3 -m tqgguf synth -o "$model" --source "$SRC" --fast --preset llama3-8b --weights q4_0) \
            > "$OUT/synth.log" 2>&1 || { tail -5 "$OUT/synth.log"; return 1; }
    fi
}

step_bench() {
    local model=$MODELS/l3-8b.gguf
    synth_model || return 1
    local depths=${VK_DEPTHS:-0,8192}
    local configs=${VK_CONFIGS:-"f16/f16 q8_0/q8_0 turbo3/turbo3 turbo4/turbo4 turbo2/turbo2 q8_0/turbo4"}
    for c in $configs; do
        log "bench: $c, tg128${VK_PROMPT:+ and pp$VK_PROMPT} at d $depths"
        "$BIN/llama-bench" -m "$model" -ngl 99 -fa 1 -ctk "${c%%/*}" -ctv "${c##*/}" -p "${VK_PROMPT:-0}" -n 128 \
            -d "$depths" -r 2 -o jsonl >> "$OUT/bench.jsonl" 2>> "$OUT/bench.err" \
            || log "bench: $c failed ($(tail -1 "$OUT/bench.err"))"
    done
    python3 "$ROOT/scripts/bench_rounds.py" "$OUT/bench.jsonl" | tee "$OUT/summary.txt"
}

step_profile() { # each op's GPU time in a decode step at VK_PROFILE_DEPTH (the perf logger), per config
    local model=$MODELS/l3-8b.gguf
    synth_model || return 1
    mkdir -p "$OUT/profile"
    local configs=${VK_PROFILE_CONFIGS:-f16/f16 q8_0/q8_0 turbo3/turbo3} c depth=${VK_PROFILE_DEPTH:-0} suffix=
    [ "$depth" = 0 ] || suffix=-d$depth
    for c in $configs; do
        log "profile: $c, 16 decode steps at depth $depth, each op's time"
        # the logger prints one table per graph; every 8th graph keeps the output short (the last table is a decode
        # step's: the prompt that fills the depth runs first)
        GGML_VK_PERF_LOGGER=1 GGML_VK_PERF_LOGGER_FREQUENCY=8 "$BIN/llama-bench" -m "$model" -ngl 99 -fa 1 \
            -ctk "${c%%/*}" -ctv "${c##*/}" -p 0 -n 16 -d "$depth" -r 1 > "$OUT/profile/${c//\//-}$suffix.txt" 2>&1 \
            || log "profile: $c failed"
    done
}

[ $# -gt 0 ] || set -- build ops bench
for s in "$@"; do
    case $s in
        unpack) ;;
        build) step_build || exit 1 ;;
        ops) step_ops ;;
        bench) step_bench ;;
        profile) step_profile ;;
        *) echo "unknown step: $s" >&2; exit 2 ;;
    esac
done
