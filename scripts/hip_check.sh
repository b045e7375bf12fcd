#!/usr/bin/env bash
# Compile the patched tree's HIP backend without an AMD GPU, in a Debian sid chroot: the pinned ggml-hip needs HIP,
# hipBLAS and rocBLAS >= 6.1, Debian 12 ships HIP 5.2 and Debian 13 5.7, and sid ships 6.4. Nothing runs on a GPU;
# this checks that the series compiles for HIP (wave64 and wave32 targets) and that the HIP build lists are complete.
#
#   scripts/hip_check.sh [--root DIR] [--arch 'gfx942;gfx1100'] [--full] [--out DIR] [-j N]
#
#   --root  the chroot (default /opt/tqgguf-sid; made with debootstrap on the first run, about 600 MB with ROCm)
#   --arch  GPU_TARGETS (default gfx942, a wave64 CDNA3 part, and gfx1100, a wave32 RDNA3 part)
#   --full  build and link test-backend-ops, llama-bench and llama-perplexity (every upstream HIP file; 17 minutes
#           for gfx942 alone on 2 cores) instead of only the ggml-cuda files the series touches (3-4 minutes)
#   --out   where the logs and summary.txt go (default bench/results/hip-build-local/latest)
#   -j      parallel compile jobs (default: the number of cores)
#
# Needs root (debootstrap, chroot, mount) and the repository's tqgguf (.venv/bin/tqgguf, or on PATH), which applies
# the series to a fresh tree inside the chroot. Exit codes: 0 everything compiled, 1 a build step failed (its
# errors are in the log and the summary), 2 bad arguments or a missing tool.
set -euo pipefail

ROOT=/opt/tqgguf-sid
ARCH="gfx942;gfx1100"
FULL=0
JOBS=$(nproc)
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUTDIR="$REPO/bench/results/hip-build-local/latest"

usage() { sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --root) ROOT=$2; shift 2 ;;
        --arch) ARCH=$2; shift 2 ;;
        --full) FULL=1; shift ;;
        --out) OUTDIR=$2; shift 2 ;;
        -j) JOBS=$2; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "hip_check: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

[ "$(id -u)" = 0 ] || { echo "hip_check: needs root (debootstrap, chroot, mount)" >&2; exit 2; }
TQ="$REPO/.venv/bin/tqgguf"
[ -x "$TQ" ] || TQ=$(command -v tqgguf || true)
[ -n "$TQ" ] || { echo "hip_check: tqgguf not found (make setup, or pip install -e .)" >&2; exit 2; }
TQ_PY="$(dirname "$TQ")/python" # the interpreter tqgguf is installed in
[ -x "$TQ_PY" ] || TQ_PY=python3
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
log() { echo "[hip_check $(date -u +%H:%M:%S)] $*" | tee -a "$OUTDIR/steps.log"; }
: > "$OUTDIR/steps.log"
# a failed set-up step (debootstrap, apt, patching, configuring) stops the script: say which, and where its log is
trap 'echo "hip_check: the step at line $LINENO failed (exit $?); its log is in $OUTDIR" >&2' ERR

# sid's Release files carry a Valid-Until; a mirror snapshot older than that is refused without this option
APT_OPTS="-o Acquire::Check-Valid-Until=false -q"
PKGS="hipcc libhipblas-dev librocblas-dev cmake ninja-build g++ make"
if [ ! -x "$ROOT/usr/bin/hipconfig" ]; then
    command -v debootstrap > /dev/null || { echo "hip_check: debootstrap not found (apt-get install debootstrap)" >&2; exit 2; }
    if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
        log "debootstrap sid into $ROOT"
        debootstrap --variant=minbase --include=ca-certificates sid "$ROOT" http://deb.debian.org/debian > "$OUTDIR/debootstrap.log" 2>&1
    fi
    cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
    log "installing $PKGS"
    chroot "$ROOT" bash -c "apt-get $APT_OPTS update && DEBIAN_FRONTEND=noninteractive apt-get $APT_OPTS install -y --no-install-recommends $PKGS" \
        > "$OUTDIR/apt.log" 2>&1
fi
if ! mountpoint -q "$ROOT/proc"; then
    mount -t proc proc "$ROOT/proc"
    trap 'umount "$ROOT/proc" || true' EXIT
fi

TREE=/src/llama.cpp
rm -rf "${ROOT:?}$TREE"
mkdir -p "$ROOT/src"
log "applying the series to $ROOT$TREE"
"$TQ" patches apply "$ROOT$TREE" > "$OUTDIR/apply.log" 2>&1
git -C "$ROOT$TREE" log -1 --format='tree: %h %s' | tee -a "$OUTDIR/steps.log"

in_root() { chroot "$ROOT" bash -c "$1"; }
{
    echo "hipcc: $(in_root 'hipconfig --version')"
    echo "HIP compiler: $(in_root '$(hipconfig -l)/clang --version | head -1')"
    in_root "dpkg-query -W -f='\${Package} \${Version}\n' libamdhip64-dev libhipblas-dev librocblas-dev cmake"
} > "$OUTDIR/versions.txt"
cat "$OUTDIR/versions.txt" | tee -a "$OUTDIR/steps.log"

# the CMake arguments of `tqgguf build -b hip --hip-arch $ARCH`, quoted for the chroot's shell
ARGS=$("$TQ_PY" -c 'import shlex, sys
from tqgguf.build import BuildSpec, cmake_args
print(shlex.join(cmake_args(BuildSpec(backends=["hip"], hip_arch=sys.argv[1]))))' "$ARCH")
log "configuring: $ARGS"
in_root "cd $TREE && HIPCXX=\$(hipconfig -l)/clang cmake -S . -B build-hip -G Ninja $ARGS" > "$OUTDIR/configure.log" 2>&1

if [ "$FULL" = 1 ]; then
    TARGETS="test-backend-ops llama-bench llama-perplexity"
else
    # the objects of the ggml-cuda sources the series changes or adds (headers come in through them)
    files=$("$TQ" patches list --json | python3 -c 'import json, sys
print("\n".join(sorted({f[len("ggml/src/ggml-cuda/"):] for p in json.load(sys.stdin) for f in p["files"]
                         if f.startswith("ggml/src/ggml-cuda/") and f.endswith(".cu")})))')
    TARGETS=$(in_root "cd $TREE/build-hip && ninja -t targets all" | cut -d: -f1 |
        grep -E "ggml-hip\.dir/__/ggml-cuda/(template-instances/fattn-turbo[^/]*|$(echo "$files" | paste -sd'|' | sed 's/\./\\./g'))\.o$" | sort -u | tr '\n' ' ')
fi
[ -n "$TARGETS" ] || { log "no targets found"; exit 1; }
log "building $(echo $TARGETS | wc -w) target(s) with -j$JOBS"
start=$(date +%s)
rc=0
in_root "cd $TREE/build-hip && ninja -j$JOBS -k 0 $TARGETS" > "$OUTDIR/build.log" 2>&1 || rc=$?
secs=$(( $(date +%s) - start ))

{
    echo "tqgguf: $(git -C "$REPO" log -1 --format='%h %s')$(git -C "$REPO" diff --quiet HEAD -- patches || echo ' (patches/ modified)')"
    echo "tree: $(git -C "$ROOT$TREE" log -1 --format='%h %s')"
    echo "GPU_TARGETS: $ARCH"
    echo "mode: $([ "$FULL" = 1 ] && echo 'full (test-backend-ops, llama-bench, llama-perplexity)' || echo 'the files the series touches')"
    echo "build: rc=$rc in ${secs}s with -j$JOBS"
    echo "steps built: $(grep -c '^\[[0-9]*/[0-9]*\]' "$OUTDIR/build.log" || true)"
    echo "errors: $(grep -c 'error:' "$OUTDIR/build.log" || true)"
    echo "warnings by file and line:"
    grep -o '[^ ]*: warning: [^[]*' "$OUTDIR/build.log" | sed 's|^/src/llama.cpp/||' | sort | uniq -c | sort -rn | head -20 || true
    if [ "$rc" != 0 ]; then
        echo "first errors:"
        grep -m 20 'error:' "$OUTDIR/build.log" || true
    fi
} > "$OUTDIR/summary.txt"
cat "$OUTDIR/summary.txt"
[ "$rc" = 0 ] || exit 1
