# Sourced by scripts/h200_run.sh and bench/experiments/layout-call.sh.
# ncu_times MODE FILE: per-kernel launches and GPU time from an ncu log of `--metrics gpu__time_duration.sum`: the
# mean per launch (MODE "mean"), or per token (MODE "per-token": one FlashAttention launch per layer, 32 layers)
ncu_times() {
    # (kernel lines: ncu's "  name(args) (grid)x(block), Context N, Stream M, ..."; a program's own lines that
    # start the same way, such as test-backend-ops' "  FLASH_ATTN_EXT(...)", have no Context)
    grep -E "^  [a-zA-Z_].*\), Context [0-9]+, Stream|gpu__time_duration" "$2" | paste - - | python3 -c '
import collections, re, sys
n = collections.Counter(); t = collections.Counter()
for line in sys.stdin:
    name = re.sub(r"^(void )?", "", line.strip()).split("(")[0]
    unit, val = line.split()[-2:]
    n[name] += 1; t[name] += float(val.replace(",", "")) * {"ns": 1e-3, "us": 1.0, "ms": 1e3}[unit]
if sys.argv[1] == "mean":
    for k in sorted(n):
        print(f"{k}: {n[k]} launches, mean {t[k] / n[k]:.2f} us")
    sys.exit()
tokens = sum(v for k, v in n.items() if k.startswith("flash_attn_ext")) / 32
print(f"tokens: {tokens:.2f} (attention launches / 32 layers)")
print(f"per token: {sum(n.values()) / tokens:.0f} launches, {sum(t.values()) / tokens:.0f} us of kernel time")
for k, v in sorted(t.items(), key=lambda kv: -kv[1]):
    print(f"{v / tokens:9.1f} us {n[k] / tokens:6.1f} x  {k}")
' "$1"
}
