#!/usr/bin/env bash
# The whole TURBO_ROT_SET_ROWS_KV suite, N runs in one process each, on this machine's lavapipe and, where
# TRIXIE names a Debian 13 root (debootstrap --variant=minbase --include=mesa-vulkan-drivers,libvulkan1,valgrind
# trixie DIR, with /root/.cache, /proc and /dev bound into it), on that root's lavapipe: the same binary.
# usage: mesa-compare.sh BIN_DIR [N]
set -u
bin=$1/test-backend-ops; n=${2:-5}
run() {  # label, then the command prefix
  local label=$1; shift
  for i in $(seq 1 "$n"); do
    out=$("$@" env GGML_VK_VISIBLE_DEVICES=0 "$bin" test -b Vulkan0 -o TURBO_ROT_SET_ROWS_KV 2>&1); rc=$?
    ok=$(grep -c 'TURBO_ROT_SET_ROWS_KV.*OK' <<<"$out")
    mesa=$(grep -o 'LLVM [0-9.]*' <<<"$out" | head -1)
    echo "$label run $i: rc $rc, $ok/96 cases OK before exit (lavapipe, $mesa)"
  done
}
run "debian12 mesa $(dpkg-query -W -f '${Version}' mesa-vulkan-drivers)"
if [ -n "${TRIXIE:-}" ]; then
  run "debian13 mesa $(chroot "$TRIXIE" dpkg-query -W -f '${Version}' mesa-vulkan-drivers)" chroot "$TRIXIE"
fi
