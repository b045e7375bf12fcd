#!/usr/bin/env bash
# tqgguf's own commands end to end on a CUDA machine, as a user runs them: `tqgguf build -b cuda --source` applies
# the series to a pristine tree and builds it, then doctor, synth, check --gpu, serve (asymmetric K/V with the
# boundary-layer V policy, a completion, a pair CUDA has no kernel for), bench, bench --batched --gpu, ppl and niah
# run on that build. scripts/h200_run.sh measures the kernels with the tools themselves; this checks the Python side
# on a GPU.
#
# Needs .h200/pristine.tar.gz (`scripts/prepare_h200.py --pristine`: the pinned tree without the series, slimmed;
# TQ_SOURCE=DIR uses an unpacked tree instead), python3 with numpy, typer and rich (requests from .h200/pydeps
# where python3 has none), cmake, ninja and nvcc. TQ_BACKEND=cpu rehearses every step on a machine without a GPU.
#
#   bash scripts/gpu_cli.sh            (results in $OUT, default ./gpu-cli-out)
#
# Every check prints PASS or FAIL and goes to $OUT/checks.txt; each command's output is kept next to it, and all of
# it in $OUT/all.tgz. The exit code is the number of failed checks (0: all passed). Settings: TQ_WORK (the unpacked
# tree, the cache and the model; default /tmp/tq-gpu-cli), TQ_CUDA_ARCH (90-real), TQ_SYNTH_ARGS (the model's
# shape: 8 layers, head size 128, GQA 4, q4_0), TQ_TEXT (the ppl text), TQ_MAX_NPL (64).
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-cli-out}
BACKEND=${TQ_BACKEND:-cuda}
WORK=${TQ_WORK:-/tmp/tq-gpu-cli}
mkdir -p "$OUT" "$WORK"
: > "$OUT/checks.txt"
export TQGGUF_CACHE=${TQGGUF_CACHE:-$WORK/cache}
export NO_COLOR=1 COLUMNS=160

log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/steps.log"; }
FAILS=0
check() {  # check "what" command...: PASS when the command succeeds
    local what=$1; shift
    if "$@" >> "$OUT/steps.log" 2>&1; then echo "PASS $what" | tee -a "$OUT/checks.txt"
    else echo "FAIL $what" | tee -a "$OUT/checks.txt"; FAILS=$((FAILS + 1)); fi
}
jtest() {  # jtest FILE 'python expression on d (the JSON document)'
    python3 -c "import json, sys; d = json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"
}

SRC=${TQ_SOURCE:-}
if [ -z "$SRC" ]; then
    [ -f "$ROOT/.h200/pristine.tar.gz" ] || { echo "no .h200/pristine.tar.gz: run scripts/prepare_h200.py --pristine" >&2; exit 2; }
    rm -rf "$WORK/llama.cpp" && tar -xzf "$ROOT/.h200/pristine.tar.gz" -C "$WORK" || exit 2
    SRC=$WORK/llama.cpp
fi
export PYTHONPATH=$ROOT:$SRC/gguf-py${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import requests" 2>/dev/null || export PYTHONPATH=$PYTHONPATH:$ROOT/.h200/pydeps
tq() { python3 -m tqgguf "$@"; }

BUILD=(-b "$BACKEND" --source "$SRC" --targets llama-server,llama-bench,llama-perplexity,llama-batched-bench)
[ "$BACKEND" = cuda ] && BUILD+=(--cuda-arch "${TQ_CUDA_ARCH:-90-real}")
GPU=(-ngl 99)
{ echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "tqgguf commit: $(cat "$ROOT/.h200/commit.txt" 2>/dev/null || git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo "python: $(python3 --version 2>&1)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) x $(nproc)"
} > "$OUT/device.txt"

log "doctor"
tq doctor --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"
check "doctor: $BACKEND can be built" jtest "$OUT/doctor.json" \
    "any(b['backend'] == '$BACKEND' and b['buildable'] for b in d['backends'])"
[ "$BACKEND" = cuda ] && check "doctor: lists the GPU" jtest "$OUT/doctor.json" "len(d['gpus']) >= 1"

log "build"
t0=$(date +%s)
tq build "${BUILD[@]}" -j "$(nproc)" > "$OUT/build.txt" 2>&1
rc=$?
echo "build: exit $rc in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/steps.log"
check "build: exit 0" test "$rc" = 0
[ "$rc" = 0 ] || { tail -20 "$OUT/build.txt"; exit 99; }
check "build: says how to use a --source build" grep -q "pass --bin-dir" "$OUT/build.txt"
BIN=$(dirname "$(tq build "${BUILD[@]}" --print-bin llama-server)")
tq build "${BUILD[@]}" --json > "$OUT/manifest.json" 2>/dev/null
check "build: every smoke test passed" jtest "$OUT/manifest.json" \
    "d['smoke'] and all(v == 'ok' for v in d['smoke'].values()) and d['source']['kind'] == 'local'"
check "build: an unchanged rebuild is a no-op" grep -q "nothing to rebuild" <(tq build "${BUILD[@]}" 2>&1)

log "synth"
MODEL=$WORK/synth.gguf
read -r -a SYNTH <<< "${TQ_SYNTH_ARGS:---layers 8 --n-embd 2048 --n-head 16 --n-head-kv 4 --head-dim 128 --weights q4_0 --fast}"
tq synth -o "$MODEL" "${SYNTH[@]}" --source "$SRC" --json > "$OUT/synth.json" 2> "$OUT/synth.err"
check "synth: a model" test -s "$MODEL"

log "check"
MEM=(--gpu); [ "$BACKEND" = cpu ] && MEM=(--mem 24GiB)
tq check "$MODEL" "${MEM[@]}" --ctx 32768 --json > "$OUT/check.json" 2> "$OUT/check.err"
WHERE="== '--mem'"; [ "$BACKEND" = cpu ] || WHERE=".startswith('GPU 0 ')"   # --gpu: the GPU's name and free memory
check "check: integrity ok, memory budget from $([ "$BACKEND" = cpu ] && echo --mem || echo the GPU)" jtest \
    "$OUT/check.json" "d['file']['integrity'] == 'ok' and d['fit']['source'] $WHERE and d['fit']['budget_mib'] > 0"

log "serve"
TEXT=${TQ_TEXT:-$ROOT/.h200/wiki-300k.txt}
[ -f "$TEXT" ] || { python3 -c "print(' '.join(f'word{i % 97} sentence {i}.' for i in range(40000)))" > "$WORK/text.txt"; TEXT=$WORK/text.txt; }
# python3 itself in the background (a shell function there would be a subshell, which SIGTERM would stop alone)
python3 -m tqgguf serve -m "$MODEL" --bin-dir "$BIN" -ctk q8_0 -ctv turbo3 --boundary-v 2 -c 8192 "${GPU[@]}" --port auto --json \
    > "$OUT/serve.json" 2> "$OUT/serve.err" &
spid=$!
for _ in $(seq 600); do [ -s "$OUT/serve.json" ] || ! kill -0 $spid 2>/dev/null && break; sleep 0.5; done
if [ -s "$OUT/serve.json" ]; then
    check "serve: K q8_0, V turbo3 with q8_0 boundary layers, nothing else" jtest "$OUT/serve.json" \
        "d['effective']['k'] == 'q8_0' and d['effective']['boundary_type'] == 'q8_0' \
         and len(d['effective']['boundary_layers']) == 4 and 'turbo3' in d['effective']['v_types'] \
         and not d['deviations']"
    check "serve: flash attention on every layer's own device" jtest "$OUT/serve.json" \
        "d['effective']['flash_attn'] and d['effective']['attention_layers'] \
         and d['effective']['attention_on_layer_device'] == d['effective']['attention_layers']"
    check "serve: KV size as tqgguf check estimated" jtest "$OUT/serve.json" \
        "d['kv_estimate'] and not any('estimated' in n for n in d['notes'])"
    URL=$(python3 -c "import json; print(json.load(open('$OUT/serve.json'))['url'])")
    python3 - "$URL" > "$OUT/completion.json" 2>> "$OUT/steps.log" <<'EOF'
import json, sys, urllib.request
req = urllib.request.Request(sys.argv[1] + "/completion", json.dumps({"prompt": "The capital of France is",
                             "n_predict": 16, "temperature": 0}).encode(), {"Content-Type": "application/json"})
print(urllib.request.urlopen(req, timeout=120).read().decode())
EOF
    check "serve: a completion" jtest "$OUT/completion.json" "d['tokens_predicted'] == 16"
    SLOG=$(python3 -c "import json; print(json.load(open('$OUT/serve.json'))['log'])")
    grep -h "CUDA0\|offloaded\|KV buffer\|V types\|boundary" "$SLOG" > "$OUT/serve-log-lines.txt" 2>/dev/null
    [ "$BACKEND" = cuda ] && check "serve: the KV cache lives on the GPU (CUDA0 KV buffer)" \
        grep -q "CUDA0 KV buffer size" "$SLOG"
fi
kill -TERM $spid 2>/dev/null; wait $spid; rc=$?
check "serve: started, and stopped by SIGTERM with exit 0" test "$rc" = 0 -a -s "$OUT/serve.json"
if [ "$BACKEND" != cpu ]; then
    tq serve -m "$MODEL" --bin-dir "$BIN" -ctk q4_0 -ctv turbo3 "${GPU[@]}" --port auto > "$OUT/serve-refused.txt" 2>&1
    rc=$?
    check "serve: K q4_0 / V turbo3 refused on the GPU (exit 2)" test "$rc" = 2
    check "serve: the refusal names the pair" grep -q "q4_0" "$OUT/serve-refused.txt"
fi

log "bench"
tq bench -m "$MODEL" --bin-dir "$BIN" --configs f16,turbo3,turbo2,q8_0/turbo4 --depth 0,8192 -p 512 -n 64 -r 2 \
    "${GPU[@]}" --out "$OUT/bench" --json > "$OUT/bench.json" 2> "$OUT/bench.err"
rc=$?
check "bench: exit 0" test "$rc" = 0
check "bench: a ratio to f16 for every config and depth" jtest "$OUT/bench.json" \
    "not d['failed'] and len([r for r in d['rows'] if r.get('ratio') is not None]) == 16"
[ "$BACKEND" = cuda ] && check "bench: recorded as run on the GPU" jtest "$OUT/bench.json" "d['meta']['device'].endswith('(cuda)')"

log "bench --batched"
# each config at the most sequences of 4096 tokens that fit the GPU's free memory (at most TQ_MAX_NPL)
tq bench -m "$MODEL" --bin-dir "$BIN" --batched --npl 1,4 -c 4096 "${MEM[@]}" --max-npl "${TQ_MAX_NPL:-64}" \
    --configs f16,turbo3 -p 256 -n 32 "${GPU[@]}" --out "$OUT/batched" --json > "$OUT/batched.json" 2> "$OUT/batched.err"
rc=$?
check "bench --batched: exit 0" test "$rc" = 0
check "bench --batched: a fit per config, turbo3 at least as many sequences as f16, and a ratio for each row" \
    jtest "$OUT/batched.json" "not d['failed'] and d['fits']['turbo3']['sequences'] >= d['fits']['f16']['sequences'] >= 1 \
    and all(r['ratio'] is not None for r in d['rows']) and len({r['depth'] for r in d['rows']}) == 3"

log "ppl"
tq ppl -m "$MODEL" -f "$TEXT" --bin-dir "$BIN" --configs turbo3,q8_0/turbo2+bv2 -c 512 --chunks 8 "${GPU[@]}" \
    --out "$OUT/ppl" --json > "$OUT/ppl.json" 2> "$OUT/ppl.err"
rc=$?
check "ppl: exit 0 or 1 (usable with warnings)" test "$rc" -le 1
check "ppl: a KL divergence against f16 for each config" jtest "$OUT/ppl.json" \
    "not d['failed'] and all(r['kld'] is not None for r in d['rows']) \
     and {'turbo3', 'q8_0/turbo2+bv2'} <= {r['config'] for r in d['rows']}"

log "niah"
tq niah -m "$MODEL" --bin-dir "$BIN" --configs f16,turbo3 --ctx 4096 --depths 50 --trials 1 "${GPU[@]}" \
    --out "$OUT/niah" --json > "$OUT/niah.json" 2> "$OUT/niah.err"
check "niah: both configs ran their cell (random weights: whether the needle is found is not the point)" \
    jtest "$OUT/niah.json" "len(d['cells']) == 2 and not d['failed'] and d['totals'][1]['kv_mib'] < d['totals'][0]['kv_mib']"

log "done: $FAILS failed check(s)"
# a device call returns a few files: everything in one archive too (the server's log included)
[ -n "${SLOG:-}" ] && cp "$SLOG" "$OUT/serve-llama-server.log" 2>/dev/null
tar -czf "$WORK/gpu-cli-out.tgz" -C "$(dirname "$OUT")" "$(basename "$OUT")" && mv "$WORK/gpu-cli-out.tgz" "$OUT/all.tgz"
exit "$FAILS"
