#!/usr/bin/env bash
# CUDA build, correctness and speed runs for the turbo KV-cache types on the lent H200 (or any CUDA machine).
#
# Needs what scripts/prepare_h200.py writes to .h200/ (the patched slim tree, the CMake arguments of
# `tqgguf build --backend cuda --cuda-arch 90-real`, a text excerpt) and python3 with numpy (tqgguf synth runs from
# this repository with the tree's gguf-py). Every step appends to $OUT (default ./h200-out):
#   bash scripts/h200_run.sh build          configure + build llama-bench, test-backend-ops, llama-perplexity
#   bash scripts/h200_run.sh ops            test-backend-ops -b CUDA0 on every turbo case (vs the CPU backend)
#   bash scripts/h200_run.sh parity         KLD of CUDA vs CPU runs of the same config on a synthetic model (f32
#                                           weights; -ub 1: the decode kernel, -ub 256: the f16 conversion)
#   bash scripts/h200_run.sh diag           decode time: CUDA graphs on/off, graph splits and split inputs, ncu per-kernel
#   bash scripts/h200_run.sh profile        ncu sections (occupancy, stalls, memory) of the decode FlashAttention
#                                           kernel at depth 32768, turbo3 and f16 (TQ_PROFILE_TYPES="a b")
#   bash scripts/h200_run.sh sass           ncu per SASS instruction of the turbo3 decode kernel at depth 32768 (executed
#                                           count and stall samples: where the warps wait; a .csv.gz that
#                                           scripts/sass_stalls.py summarizes; TQ_SASS_TYPE=turbo2 for another type)
#   bash scripts/h200_run.sh kernels        ncu time of each decode FlashAttention and combine launch at depth 32768
#                                           (after llama-bench's warm-up), turbo3 and f16 (TQ_KERNEL_CONFIGS="a b/c")
#   bash scripts/h200_run.sh census         every kernel of a decode step at depth 0 (ncu), per token: f16, turbo3 and
#                                           q8_0/turbo4 (shows which fusions ran and where the time goes)
#   bash scripts/h200_run.sh prefill        ncu time of the prefill attention kernels (the K/V conversion to f16 and the
#                                           tensor-core kernel) at depth ~10k of a depth-32768 prefill, turbo3 and f16
#   bash scripts/h200_run.sh fusion         the rotations fused into SET_ROWS (0014) and into the attention (0015)
#                                           against the unfused ops: KLD (one KV stream; -ub 4, so that the decode
#                                           kernel runs) and decode speed at d0; TQ_FUSION_BATCH=2048 runs the KLD
#                                           with 8 sequences (8 KV streams, 0024) and skips the speed runs
#   bash scripts/h200_run.sh streams        the cache-write kernels (ncu launch counts) of perplexity runs with one
#                                           KV stream and with 8: whether the fused rotating SET_ROWS runs with both
#   bash scripts/h200_run.sh bench [R] [DEPTHS] [CONFIGS]
#                                           llama-bench -fa 1 on the Llama-3-8B shape (q4_0 weights); with
#                                           TQ_BENCH_ROUNDS=N the configs run N times in turn (f16, a, b, f16, a,
#                                           b, ...), so that a slow drift of the machine reaches every config
#   bash scripts/h200_run.sh shapes         llama-bench -fa 1 tg128 at d0 and d32768 (r=2) on other synthetic shapes
#                                           (q4_0 weights): GQA 8 at head size 128, a Gemma-3-12B-like head size 256
#                                           with sliding-window layers, head size 64; one jsonl and summary each
#                                           (TQ_SHAPES: names to run, in order; TQ_SHAPES_CONFIGS: the configs)
#   bash scripts/h200_run.sh unpack         only unpack .h200/llama.cpp.tar.gz (every step does that first where needed)
# Steps can be combined: bash scripts/h200_run.sh build ops bench
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=$ROOT/.h200/llama.cpp
# the tree travels packed (prepare_h200.py's llama.cpp.tar.gz): unpacked where it is missing, and again where an
# unpacked one (.unpacked) is older than the archive; a tree that prepare_h200.py wrote here is left as it is
PACKED=$ROOT/.h200/llama.cpp.tar.gz
if [ -f "$PACKED" ] && { [ ! -d "$SRC" ] || { [ -f "$SRC/.unpacked" ] && [ "$PACKED" -nt "$SRC/.unpacked" ]; }; }; then
    rm -rf "$SRC" && tar -xzf "$PACKED" -C "$ROOT/.h200" && touch "$SRC/.unpacked" \
        || { echo "cannot unpack $PACKED" >&2; exit 2; }
fi
[ -d "$SRC" ] || { echo "no .h200/llama.cpp: run scripts/prepare_h200.py, carry .h200/llama.cpp.tar.gz" >&2; exit 2; }
BUILD=${TQ_BUILD:-$ROOT/h200-out/build}
OUT=${OUT:-$ROOT/h200-out}
MODELS=${TQ_MODELS:-/tmp/tq-models}
BIN=$BUILD/bin
mkdir -p "$OUT" "$MODELS" "$BUILD"
export PYTHONPATH=$ROOT:$SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }

device_info() {
    { echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
      echo "tqgguf commit: $(cat "$ROOT/.h200/commit.txt" 2>/dev/null || echo unknown)"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>/dev/null
      nvcc --version | tail -1
      echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) x $(nproc)"
    } > "$OUT/device.txt"
}

step_build() {
    log "configure"
    local t0=$(date +%s)
    mapfile -t args < "$ROOT/.h200/cmake-args.txt"
    # TQ_CUDA_ARCH: another CMAKE_CUDA_ARCHITECTURES, such as 80-virtual, whose PTX the driver compiles on this GPU,
    # so that the kernels run the code paths of that architecture (ggml picks its features by the highest compiled
    # architecture, and PDL by the kernels' PTX version)
    [ -n "${TQ_CUDA_ARCH:-}" ] && args+=("-DCMAKE_CUDA_ARCHITECTURES=$TQ_CUDA_ARCH")
    cmake -S "$SRC" -B "$BUILD" -G Ninja "${args[@]}" -DLLAMA_BUILD_SERVER=OFF > "$BUILD/build.log" 2>&1 \
        || { tail -30 "$BUILD/build.log" | tee -a "$OUT/steps.log"; return 1; }
    log "build"
    # TQ_BUILD_TARGETS: fewer targets for a quick check on a fresh machine (default: all three)
    read -r -a targets <<< "${TQ_BUILD_TARGETS:-llama-bench test-backend-ops llama-perplexity}"
    cmake --build "$BUILD" -j "$(nproc)" --target "${targets[@]}" >> "$BUILD/build.log" 2>&1 \
        || { grep -m20 -B2 -A8 "error" "$BUILD/build.log" | tee -a "$OUT/steps.log"; return 1; }
    grep -ci "warning" "$BUILD/build.log" | sed 's/^/build warnings: /' | tee -a "$OUT/steps.log"
    local t1=$(date +%s)
    log "build done in $((t1 - t0)) s ($(nproc) jobs)"
    # which GPU code the library holds (SASS per sm_XX, PTX per compute_XX)
    command -v cuobjdump > /dev/null && cuobjdump --list-elf --list-ptx "$BIN/libggml-cuda.so" 2>/dev/null \
        | sed -E 's/^(ELF|PTX) .*\.((sm|compute)_[0-9a-z]+)\.[a-z]+$/\1 \2/' | sort | uniq -c | sed 's/^/gpu code: /' \
        | tee -a "$OUT/steps.log"
    echo "build_seconds: $((t1 - t0))" >> "$OUT/device.txt"
    # where the build's time goes: ninja's log (start and end in ms of each output) and its ten longest steps
    if [ -f "$BUILD/.ninja_log" ]; then
        cp "$BUILD/.ninja_log" "$OUT/ninja-log.txt"
        awk -F'\t' '!/^#/ { printf "%7.1f s  %s\n", ($2 - $1)/1000, $4 }' "$BUILD/.ninja_log" | sort -rn \
            | sed -n '1,10s/^/  longest: /p' | tee -a "$OUT/steps.log" # (sed reads to the end: head's early exit
            # failed the pipe under pipefail, and with it the build step, in the seventeenth round's first call)
    fi
}

bench_jsonl() { # model, config K/V, jsonl file to append to, llama-bench arguments...
    local m=$1 c=$2 f=$3
    shift 3
    "$BIN/llama-bench" -m "$m" -ngl 99 -fa 1 -ctk "${c%%/*}" -ctv "${c##*/}" "$@" -o jsonl >> "$f" 2> "$MODELS/bench.err" \
        || { log "llama-bench failed for $(basename "$m" .gguf) $c"; tail -5 "$MODELS/bench.err" | tee -a "$OUT/steps.log"; }
}

# the shapes of the shapes step: name and tqgguf synth arguments
declare -A SHAPES=(
    [gqa8-hd128]="--layers 32 --n-embd 4096 --n-head 32 --n-head-kv 4 --head-dim 128 --n-ff 14336"
    [gemma3-12b-hd256]="--layers 48 --n-embd 3840 --n-head 16 --n-head-kv 8 --head-dim 256 --n-ff 15360 --sliding-window 1024 --swa-pattern 6"
    [hd64-gqa4]="--layers 32 --n-embd 2048 --n-head 32 --n-head-kv 8 --head-dim 64 --n-ff 8192"
)

step_shapes() {
    local configs=${TQ_SHAPES_CONFIGS:-f16,turbo3,turbo2,turbo4} name c
    mkdir -p "$OUT/shapes"
    for name in ${TQ_SHAPES:-gqa8-hd128 gemma3-12b-hd256 hd64-gqa4}; do
        [ -n "${SHAPES[$name]:-}" ] || { log "unknown shape $name"; continue; }
        # shellcheck disable=SC2086 # (the shape's arguments split into words)
        synth "$name" ${SHAPES[$name]} --weights q4_0
        log "shape $name: ${SHAPES[$name]}"
        : > "$OUT/shapes/$name.jsonl"
        for c in ${configs//,/ }; do
            bench_jsonl "$MODELS/$name.gguf" "$c" "$OUT/shapes/$name.jsonl" -p 0 -n 128 -d 0,32768 -r 2
            log "done $name $c"
        done
        python3 "$ROOT/scripts/bench_rounds.py" "$OUT/shapes/$name.jsonl" | tee "$OUT/shapes/$name-summary.txt"
    done
}

# the small hd128 GQA-4 model of the parity, fusion and streams steps (bench/experiments/parity-noise.sh reads these
# arguments too)
PAR_MODEL_ARGS=(--layers 4 --n-embd 1024 --n-head 8 --n-head-kv 2 --head-dim 128)

synth() { # name, args...
    local name=$1; shift
    [ -f "$MODELS/$name.gguf" ] || python3 -m tqgguf synth -o "$MODELS/$name.gguf" --source "$SRC" --fast "$@" > /dev/null
}

par_model() { # weight type: makes that model once and prints its path
    synth "par-hd128-$1" "${PAR_MODEL_ARGS[@]}" --weights "$1" && echo "$MODELS/par-hd128-$1.gguf"
}

step_ops() {
    log "test-backend-ops (turbo cases, CUDA0 vs CPU)"
    "$BIN/test-backend-ops" test -b CUDA0 -p turbo > "$OUT/test-backend-ops.txt" 2>&1
    local rc=$?
    # the rotating SET_ROWS cases of q8_0 caches (0022), whose names lack "turbo"
    "$BIN/test-backend-ops" test -b CUDA0 -o TURBO_ROT_SET_ROWS -p 'type=q8_0' >> "$OUT/test-backend-ops.txt" 2>&1 || rc=1
    grep -E "tests passed|FAIL|Backend CUDA0|OK$" "$OUT/test-backend-ops.txt" | grep -v " OK$" | tail -15
    # (test-backend-ops colours OK and FAIL even into a file: the colour codes go before counting)
    sed 's/\x1b\[[0-9;]*m//g' "$OUT/test-backend-ops.txt" | grep -v "Backend" | grep -c ": OK$" | sed 's/^/cases OK: /'
    grep -c "not supported" "$OUT/test-backend-ops.txt" | sed 's/^/not supported: /'
    log "test-backend-ops rc=$rc"
}

step_parity() {
    log "parity: CPU vs CUDA perplexity/KLD on a synthetic hd128 GQA-4 model"
    # f32 weights (TQ_PARITY_WEIGHTS): the CUDA matrix products then compute K and V before quantization as the
    # CPU does, in f32, up to the order of the sums. With q8_0 or f16 weights, or f32 weights in batches of 4-16
    # tokens (upstream's TF32 tensor-core kernel, mmf), they differ by more, and the turbo codes turn those
    # differences into flipped indices: that measures the matrix products, not the turbo kernels
    # (bench/results/cuda-h200-round24/). The base runs with --no-op-offload: a CUDA build otherwise sends the
    # matrix products of batches of 32 or more tokens to the GPU even with -ngl 0 (bench/results/cuda-h200-round25/).
    # Batches of 32 or more tokens take cuBLAS, which upstream sets to TF32; each such run is repeated with
    # NVIDIA_TF32_OVERRIDE=0 (cuBLAS in f32), so that the turbo kernels' part shows.
    local m txt=$ROOT/.h200/wiki-300k.txt P=$BIN/llama-perplexity
    m=$(par_model "${TQ_PARITY_WEIGHTS:-f32}") || return 1
    local common=(-m "$m" -f "$txt" -c 256 --chunks 8 -fa on -t "$(nproc)")
    # TQ_PARITY_TYPES, TQ_PARITY_UB: fewer runs for a quick check (bench/experiments/quick-parity.sh)
    local types=${TQ_PARITY_TYPES:-f16 turbo3 turbo4 turbo2} ubs=${TQ_PARITY_UB:-1 256}
    for t in $types; do
        echo "=== CPU $t" >> "$OUT/parity-logs.txt"
        "$P" "${common[@]}" -ngl 0 --no-op-offload -ctk $t -ctv $t --kl-divergence-base "$MODELS/base-cpu-$t.kld" \
            >> "$OUT/parity-logs.txt" 2>&1
    done
    local t ub tf32 label
    for t in $types; do
        for ub in $ubs; do   # 1-4: the turbo decode kernel, 256: f16 conversion + tensor-core kernel
            for tf32 in on off; do
                [ $tf32 = on ] || [ "$ub" -ge 32 ] || continue
                local f=$MODELS/ppl-cuda-$t-ub$ub-tf32$tf32.txt tf32_env=()
                label="ub=$ub"
                [ $tf32 = on ] || { label+=" NVIDIA_TF32_OVERRIDE=0"; tf32_env=(NVIDIA_TF32_OVERRIDE=0); }
                env "${tf32_env[@]}" "$P" "${common[@]}" -ngl 99 -ub $ub -ctk $t -ctv $t \
                    --kl-divergence-base "$MODELS/base-cpu-$t.kld" --kl-divergence > "$f" 2>&1
                { echo "=== CUDA $t $label"; cat "$f"; } >> "$OUT/parity-logs.txt"
                echo "$t $label: $(grep -E 'Mean +KLD|Same top' "$f" | tr -s ' ' | paste -sd ';')" | tee -a "$OUT/parity.txt"
            done
        done
    done
}

step_fusion() {
    local m
    m=$(par_model q8_0) || return 1
    synth l3-8b --preset llama3-8b --weights q4_0
    log "fusion: rotations fused into SET_ROWS and the attention vs GGML_CUDA_DISABLE_FUSION=1"
    local P=$BIN/llama-perplexity
    # -b = -c: one sequence per batch and so one KV stream; -b = 8 c: 8 streams, where llama.cpp reshapes the cache
    # between the rotation and its SET_ROWS (the matchers step over that node since 0024)
    local batch=${TQ_FUSION_BATCH:-256}
    local common=(-m "$m" -f "$ROOT/.h200/wiki-300k.txt" -c 256 -b "$batch" --chunks 8 -fa on -ngl 99 -ub 4)
    for t in turbo3 turbo4 turbo2; do
        GGML_CUDA_DISABLE_FUSION=1 "$P" "${common[@]}" -ctk $t -ctv $t --kl-divergence-base "$MODELS/nofuse-$t.kld" > /dev/null 2>&1
        "$P" "${common[@]}" -ctk $t -ctv $t --kl-divergence-base "$MODELS/nofuse-$t.kld" --kl-divergence 2>&1 \
            | grep -E "Mean +KLD|Maximum KLD|Same top" | tr -s ' ' | paste -sd ';' \
            | sed "s/^/fused vs unfused $t (-b $batch): /" | tee -a "$OUT/fusion.txt"
        [ "$batch" = 256 ] || continue
        for f in 1 0; do
            GGML_CUDA_DISABLE_FUSION=$f "$BIN/llama-bench" -m "$MODELS/l3-8b.gguf" -ngl 99 -fa 1 -p 0 -n 128 -d 0 -r 3 \
                -ctk $t -ctv $t -o jsonl 2>/dev/null | sed "s/^{/{\"disable_fusion\": $f, /" >> "$OUT/fusion-bench.jsonl"
        done
    done
}

step_streams() { # which kernels write the cache with one KV stream and with 8 (ncu launch counts)
    local m
    m=$(par_model q8_0) || return 1
    command -v ncu > /dev/null || { log "streams: no ncu"; return; }
    log "streams: cache-write kernels of llama-perplexity with -b 256 (one stream) and -b 2048 (8 streams)"
    # -ub 4: decode-sized ubatches; the attention launches count the layer steps (4 layers). Fused, a cache write is one
    # k_set_rows_turbo_rot launch and no fwht launch is left; unfused, each write adds a fwht launch
    for t in turbo3 q8_0; do
        for b in 256 2048; do
            local f=$MODELS/ncu-streams.txt
            timeout 150 ncu --clock-control none --metrics gpu__time_duration.sum -k "regex:set_rows|fwht|flash_attn_ext" \
                --launch-skip 60 --launch-count 120 "$BIN/llama-perplexity" -m "$m" \
                -f "$ROOT/.h200/wiki-300k.txt" -c 256 -b $b --chunks 8 -fa on -ngl 99 -ub 4 -ctk $t -ctv $t > "$f" 2>&1
            grep -m1 -E "n_seq *=" "$f" | sed "s/^/$t -b $b: /" | tee -a "$OUT/streams.txt"
            ncu_times mean "$f" | sed "s/^/$t -b $b: /" | tee -a "$OUT/streams.txt"
        done
    done
}

step_bench() { # reps, depths, configs
    local reps=${1:-2} depths=${2:-0,8192,32768} configs=${3:-f16,q8_0,q4_0,turbo4,turbo3,turbo2,q8_0/turbo4}
    synth l3-8b --preset llama3-8b --weights q4_0
    local rounds=${TQ_BENCH_ROUNDS:-1} round
    log "llama-bench r=$reps d=$depths configs=$configs rounds=$rounds"
    : > "$OUT/bench.jsonl"
    for ((round = 1; round <= rounds; round++)); do
        for c in ${configs//,/ }; do
            bench_jsonl "$MODELS/l3-8b.gguf" "$c" "$OUT/bench.jsonl" -p 2048 -n 128 -d "$depths" -r "$reps"
            local tag=""
            ((rounds > 1)) && tag=" (round $round)"
            log "done $c$tag"
        done
    done
    # ratios to f16, pooled and per round
    python3 "$ROOT/scripts/bench_rounds.py" "$OUT/bench.jsonl" > "$OUT/summary.txt" || log "no summary of bench.jsonl"
}

step_diag() { # where decode time goes: CUDA graphs, graph splits, per-kernel times (ncu)
    synth l3-8b --preset llama3-8b --weights q4_0
    local m=$MODELS/l3-8b.gguf
    for c in q8_0 turbo3; do
        for g in 0 1; do
            GGML_CUDA_DISABLE_GRAPHS=$g "$BIN/llama-bench" -m "$m" -ngl 99 -fa 1 -p 0 -n 64 -d 0 -r 1 -ctk $c -ctv $c -o md 2>/dev/null \
                | grep -E "^\|.*tg" | sed "s/^/$c disable_graphs=$g /" | tee -a "$OUT/diag.txt"
        done
        "$BIN/llama-perplexity" -m "$m" -f "$ROOT/.h200/wiki-300k.txt" -c 512 --chunks 1 -ngl 99 -fa on -ctk $c -ctv $c 2>&1 \
            | grep -E "graph splits|graph nodes|CUDA0 KV|sched" | sed "s/^/$c /" | tee -a "$OUT/diag.txt"
    done
    # inputs the scheduler copies to the GPU per decode step: a handful (embeddings, positions, mask, indices and
    # one per rotation input); hundreds would mean per-layer host-to-device copies (the views of patch 0006)
    for c in q8_0 turbo3; do
        GGML_SCHED_DEBUG=2 "$BIN/llama-bench" -v -m "$m" -ngl 99 -fa 1 -p 0 -n 2 -d 0 -r 1 -ctk $c -ctv $c 2>&1 \
            | grep -o "SPLIT #[0-9]*: [A-Za-z0-9]* # [0-9]* inputs" | sort -u | sed "s/^/$c /" | tee -a "$OUT/diag.txt"
    done
    if command -v ncu > /dev/null; then
        # one metric (one replay pass per kernel): the default sections take 10 passes and do not finish in time
        timeout 240 ncu --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
            --launch-skip 3000 --launch-count 1500 \
            "$BIN/llama-bench" -m "$m" -ngl 99 -fa 1 -p 0 -n 32 -d 4096 -r 1 -ctk turbo3 -ctv turbo3 > "$MODELS/ncu.txt" 2>&1
        grep -E "^  [a-zA-Z_].*\(|gpu__time_duration|Duration" "$MODELS/ncu.txt" | head -120 > "$OUT/ncu-summary.txt"
    fi
}

step_profile() { # ncu sections of one decode FlashAttention launch at depth 32768: turbo3 (turbo kernel) and f16 (vec)
    synth l3-8b --preset llama3-8b --weights q4_0
    command -v ncu > /dev/null || { log "profile: no ncu"; return; }
    local m=$MODELS/l3-8b.gguf
    # TQ_PROFILE_TYPES: the cache types to profile (f16 runs upstream's vector kernel, the others the turbo kernel)
    for t in ${TQ_PROFILE_TYPES:-turbo3 f16}; do
        local k=flash_attn_ext_turbo
        [ "$t" = f16 ] && k=flash_attn_ext_vec
        log "profile $t ($k) at d32768"
        # InstructionStats and SourceCounters: the instruction mix and where warps stall (the kernel is
        # issue- and latency-bound, bench/results/cuda-h200-fused)
        timeout 280 ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
            --section InstructionStats --section SourceCounters \
            -k "regex:$k" --launch-skip 32 --launch-count 1 \
            "$BIN/llama-bench" -m "$m" -ngl 99 -fa 1 -p 0 -n 2 -d 32768 -r 1 -ctk $t -ctv $t \
            > "$OUT/ncu-fa-$t-d32768.txt" 2>&1
    done
}

step_sass() { # per-instruction counters of one turbo decode FlashAttention launch at depth 32768 (ncu's source page)
    synth l3-8b --preset llama3-8b --weights q4_0
    command -v ncu > /dev/null || { log "sass: no ncu"; return; }
    local t=${TQ_SASS_TYPE:-turbo3} # the symmetric turbo cache type to profile
    log "sass: $t at d32768"
    timeout 280 ncu --clock-control none --section WarpStateStats --section SourceCounters --section InstructionStats \
        -k "regex:flash_attn_ext_turbo_mma" --launch-skip 32 --launch-count 1 -f -o "$MODELS/sass-$t" \
        "$BIN/llama-bench" -m "$MODELS/l3-8b.gguf" -ngl 99 -fa 1 -p 0 -n 2 -d 32768 -r 1 -ctk $t -ctv $t \
        > "$OUT/sass-$t-d32768.log" 2>&1
    ncu --import "$MODELS/sass-$t.ncu-rep" --page source --print-source sass --csv \
        > "$OUT/sass-$t-d32768.csv" 2>> "$OUT/sass-$t-d32768.log"
    log "sass: $(wc -l < "$OUT/sass-$t-d32768.csv") lines"
    gzip -9 -f "$OUT/sass-$t-d32768.csv"
}

. "$ROOT/scripts/ncu_times.sh" # ncu_times MODE FILE: per-kernel launches and GPU time of an ncu log

step_kernels() { # per-launch time of the decode attention kernels at depth 32768 (FlashAttention + combine)
    synth l3-8b --preset llama3-8b --weights q4_0
    command -v ncu > /dev/null || { log "kernels: no ncu"; return; }
    # TQ_KERNEL_CONFIGS: the K/V configs to time (default: turbo3 and f16)
    for c in ${TQ_KERNEL_CONFIGS:-turbo3 f16}; do
        local k=${c%%/*} v=${c##*/}
        log "kernels $c at d32768"
        # the first 64 attention launches (FlashAttention and combine) are llama-bench's warm-up at short context;
        # the depth prefill uses the f16 tensor-core kernel, which the regex leaves out, so the next ones are
        # decode steps at depth 32768
        timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum \
            -k "regex:flash_attn_ext_turbo|flash_attn_ext_vec|flash_attn_combine" --launch-skip 64 --launch-count 64 \
            "$BIN/llama-bench" -m "$MODELS/l3-8b.gguf" -ngl 99 -fa 1 -p 0 -n 4 -d 32768 -r 1 -ctk "$k" -ctv "$v" \
            > "$OUT/ncu-kernels-${c//\//-}-d32768.txt" 2>&1
        ncu_times mean "$OUT/ncu-kernels-${c//\//-}-d32768.txt" | sed "s|^|$c |" | tee -a "$OUT/kernels.txt"
    done
}

step_census() { # every kernel of a decode step at depth 0, per token (launches and GPU time), f16 against turbo configs
    synth l3-8b --preset llama3-8b --weights q4_0
    command -v ncu > /dev/null || { log "census: no ncu"; return; }
    for c in f16 turbo3 q8_0/turbo4; do
        local k=${c%%/*} v=${c##*/} f=$OUT/census-${c//\//-}.txt
        log "census $c at d0"
        # llama-bench's warm-up and the first tokens are skipped; 1200 launches are 2-3 decode steps of 32 layers
        timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip 1500 --launch-count 1200 \
            "$BIN/llama-bench" -m "$MODELS/l3-8b.gguf" -ngl 99 -fa 1 -p 0 -n 12 -d 0 -r 1 -ctk "$k" -ctv "$v" > "$MODELS/ncu-census.txt" 2>&1
        ncu_times per-token "$MODELS/ncu-census.txt" > "$f"
        head -2 "$f" | sed "s|^|$c |" | tee -a "$OUT/steps.log"
    done
}

step_prefill() { # per-launch time of the prefill attention kernels, a third of the way through a depth-32768 prefill
    synth l3-8b --preset llama3-8b --weights q4_0
    command -v ncu > /dev/null || { log "prefill: no ncu"; return; }
    # matching launches per layer: turbo3 converts K and V, then runs the attention (3); f16 runs the attention (1);
    # 64 ubatches of 512 tokens x 32 layers, so both skips land in ubatch 20-21 of 64 (depth ~10k)
    for c in turbo3:2000 f16:700; do
        local t=${c%%:*} skip=${c##*:}
        log "prefill kernels $t at depth ~10k"
        timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum -k "regex:dequantize|flash_attn" \
            --launch-skip "$skip" --launch-count 96 \
            "$BIN/llama-bench" -m "$MODELS/l3-8b.gguf" -ngl 99 -fa 1 -p 512 -n 0 -d 32768 -r 1 -ctk $t -ctv $t \
            > "$OUT/ncu-prefill-$t.txt" 2>&1
        ncu_times mean "$OUT/ncu-prefill-$t.txt" | sed "s/^/$t /" | tee -a "$OUT/prefill.txt"
    done
}

STEPS='unpack|build|ops|parity|bench|diag|profile|sass|kernels|census|prefill|fusion|streams|shapes' # the step names, for bench's optional arguments

device_info
while [ $# -gt 0 ]; do
    case $1 in
        unpack) shift ;; # (done above, before any step)
        build)  step_build || exit 1; shift ;;
        ops)    step_ops; shift ;;
        parity) step_parity; shift ;;
        diag)   step_diag; shift ;;
        profile) step_profile; shift ;;
        sass)   step_sass; shift ;;
        kernels) step_kernels; shift ;;
        census) step_census; shift ;;
        prefill) step_prefill; shift ;;
        fusion) step_fusion; shift ;;
        streams) step_streams; shift ;;
        shapes) step_shapes; shift ;;
        bench)  shift; r=; d=; c=   # empty: step_bench's defaults
                [[ ${1:-} =~ ^[0-9]+$ ]] && { r=$1; shift; }
                [[ ${1:-} =~ ^[0-9,]+$ ]] && { d=$1; shift; }
                [[ ${1:-} =~ [a-z] && ! ${1:-} =~ ^($STEPS)$ ]] && { c=$1; shift; }
                step_bench "$r" "$d" "$c" ;;
        *) echo "unknown step $1" >&2; exit 2 ;;
    esac
done
