# Sourced by run-variant.sh and run-switches.sh: apply experiment diffs to the carried tree .h200/llama.cpp so that
# a warm machine's build directory (h200-out/build, which outlives a call) rebuilds what they touch.
# Needs OUT (where patch.log goes); ROOT (the repository) defaults to this file's repository.
ROOT=${ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
# the tree travels packed: unpack it before the first diff goes in (h200_run.sh does it where needed)
[ -d "$ROOT/.h200/llama.cpp" ] || OUT=${OUT:-$ROOT/h200-out} bash "$ROOT/scripts/h200_run.sh" unpack

# the files that diffs patched, kept beside the build directory
PATCHED_LIST=${TQ_BUILD:-$ROOT/h200-out/build}/../rv-patched-files
mkdir -p "$(dirname "$PATCHED_LIST")"

# Files that an earlier diff patched get a fresh time stamp: the tree restored after a variant, or carried again by
# the next call (with the development machine's time stamps, older than the objects built from the patched files),
# would otherwise leave those objects in the build.
refresh_patched_files() {
    if [ -s "$PATCHED_LIST" ]; then
        sort -u "$PATCHED_LIST" | (cd "$ROOT/.h200/llama.cpp" && xargs -r touch -c)
        : > "$PATCHED_LIST"
    fi
}

# apply_diff DIFF [-R]: patch the tree (a path relative to ROOT unless absolute), output to $OUT/patch.log; the
# diff's files join the list first, since a failed patch may have touched some of them
apply_diff() {
    local diff=$1
    [[ $diff = /* ]] || diff=$ROOT/$diff
    sed -n 's|^+++ b/||p' "$diff" | cut -f1 >> "$PATCHED_LIST"
    (cd "$ROOT/.h200/llama.cpp" && patch -p1 --no-backup-if-mismatch ${2:-} < "$diff") >> "$OUT/patch.log" 2>&1
}

# apply_variant WHAT: a variant as run-variant.sh takes it, `series` or diffs joined with `+`, applied in that order;
# VARIANT_APPLIED lists the diffs that applied. On a failed diff it prints patch.log and returns 1 (what applied
# stays applied); revert_variant then undoes VARIANT_APPLIED in reverse order either way.
apply_variant() {
    VARIANT_APPLIED=()
    local diffs=() d
    [ "$1" = series ] || read -r -a diffs <<< "${1//+/ }"
    for d in "${diffs[@]}"; do
        apply_diff "$d" || { cat "$OUT/patch.log"; return 1; }
        VARIANT_APPLIED+=("$d")
    done
}
revert_variant() {
    local i rc=0
    for ((i = ${#VARIANT_APPLIED[@]} - 1; i >= 0; i--)); do
        apply_diff "${VARIANT_APPLIED[i]}" -R || rc=1
    done
    VARIANT_APPLIED=()
    return $rc
}
