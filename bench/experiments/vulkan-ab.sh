#!/usr/bin/env bash
# A/B of Vulkan patches on the H200, on one build folder: the series ("series") against the series with VK_AB_PATCHES
# reversed ("without"), in VK_AB_ROUNDS alternating rounds of llama-bench tg128 at VK_AB_DEPTHS for VK_AB_CONFIGS;
# then, on the series, one tg128 run at VK_AB_LONG_DEPTH for VK_AB_LONG_CONFIGS. Each switch rebuilds llama-bench:
# 42-55 s on the H200 machine when the patches touch ggml-vulkan.cpp (0046, 0047), so 2 rounds of 3 configs at
# depths 0 and 8192 need about 330 s after the build. Run `scripts/h200_vulkan.sh build bench` first (the build and
# the synthetic Llama-3-8B model), then, with OUT set:
#   VK_AB_PATCHES="patches/0046-... patches/0047-..." bash bench/experiments/vulkan-ab.sh
# VK_AB_ENV="VAR=value" instead of VK_AB_PATCHES: "without" is the same build run with that setting (a switch that a
# measurement diff adds), so nothing is rebuilt.
# VK_AB_PROMPT=N adds a prompt of N tokens to each run (llama-bench -p N; default 0: decode only). With
# VK_SDK_OVERLAY set (as for h200_vulkan.sh), the build folder is that of the overlay's build.
# Output: $OUT/ab/bench.jsonl (each line with its "setting", default or without, and its "round"), $OUT/ab/long.jsonl
# and scripts/bench_rounds.py's tables of them, $OUT/ab/summary.txt and long-summary.txt (ratios to the series' f16,
# pooled and per round; "without" rows are labelled so).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
UNPACK=${VK_UNPACK_DIR:-/tmp/tq-vulkan-src}
SRC=$UNPACK/llama.cpp
BUILD=${VK_BUILD_DIR:-/tmp/tq-vulkan-build${VK_SDK_OVERLAY:+-overlay}}
MODEL=${VK_MODELS:-/tmp/tq-vulkan-models}/l3-8b.gguf
OUT=${OUT:-$ROOT/h200-vulkan-out}
export VULKAN_SDK=$UNPACK/vulkan-sdk PATH=$UNPACK/vulkan-sdk/bin:$PATH
export LD_LIBRARY_PATH=$UNPACK/vulkan-sdk/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
AB_ENV=${VK_AB_ENV:-}
PATCHES=${VK_AB_PATCHES:-}
[ -n "$PATCHES$AB_ENV" ] || { echo "name the patches to reverse (VK_AB_PATCHES) or a setting (VK_AB_ENV)" >&2; exit 2; }
ROUNDS=${VK_AB_ROUNDS:-2}
DEPTHS=${VK_AB_DEPTHS:-0,8192}
CONFIGS=${VK_AB_CONFIGS:-f16/f16 turbo3/turbo3 turbo2/turbo2 turbo4/turbo4}
mkdir -p "$OUT/ab"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/ab/steps.log"; }
[ -f "$MODEL" ] || { echo "no model at $MODEL: run scripts/h200_vulkan.sh build bench first" >&2; exit 2; }

switch() { # series | without
    [ -z "$AB_ENV" ] || return 0 # the setting is applied per run
    local p list=""
    for p in $PATCHES; do list="$p $list"; done # reversed
    if [ "$1" = without ]; then
        for p in $list; do (cd "$SRC" && patch -s -p1 -R < "$ROOT/$p") || return 1; done
    else
        for p in $PATCHES; do (cd "$SRC" && patch -s -p1 < "$ROOT/$p") || return 1; done
    fi
    local t0=$SECONDS
    cmake --build "$BUILD" -j "$(nproc)" --target llama-bench >> "$OUT/ab/build.log" 2>&1 || return 1
    log "$1: rebuilt in $((SECONDS - t0)) s"
}

bench() { # variant round
    local c setting=() tag=default
    [ "$1" = without ] && tag=without
    [ "$1" = without ] && [ -n "$AB_ENV" ] && setting=("$AB_ENV")
    for c in $CONFIGS; do
        # each JSON line gets the variant ("default" for the series) and the round, for scripts/bench_rounds.py
        env "${setting[@]}" "$BUILD/bin/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -ctk "${c%%/*}" -ctv "${c##*/}" \
            -p "${VK_AB_PROMPT:-0}" -n 128 -d "$DEPTHS" -r 2 -o jsonl 2>> "$OUT/ab/bench.err" \
            | sed "s|^{|{\"setting\": \"$tag\", \"round\": $2, |" >> "$OUT/ab/bench.jsonl"
        [ "${PIPESTATUS[0]}" = 0 ] || log "$1 $c failed"
    done
    log "$1 round $2 done"
}

state=series
for r in $(seq 1 "$ROUNDS"); do
    for v in series without; do
        if [ "$v" != "$state" ]; then switch "$v" || { log "switch to $v failed"; exit 1; }; state=$v; fi
        bench "$v" "$r"
    done
done
[ "$state" = series ] || switch series || exit 1
if [ -n "${VK_AB_LONG_DEPTH:-}" ]; then
    for c in ${VK_AB_LONG_CONFIGS:-f16/f16 turbo3/turbo3 turbo2/turbo2}; do
        "$BUILD/bin/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -ctk "${c%%/*}" -ctv "${c##*/}" -p 0 -n 128 \
            -d "$VK_AB_LONG_DEPTH" -r 1 -o jsonl >> "$OUT/ab/long.jsonl" 2>> "$OUT/ab/bench.err" || log "long $c failed"
    done
    log "long depth done"
fi

python3 "$ROOT/scripts/bench_rounds.py" "$OUT/ab/bench.jsonl" | tee "$OUT/ab/summary.txt"
if [ -s "$OUT/ab/long.jsonl" ]; then
    python3 "$ROOT/scripts/bench_rounds.py" "$OUT/ab/long.jsonl" | tee "$OUT/ab/long-summary.txt"
fi
