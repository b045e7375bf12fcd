#!/bin/bash
B=~/.cache/tqgguf/build/cpu-vulkan-2102d428924f/bin/test-backend-ops
export GGML_VK_VISIBLE_DEVICES=0
: > /tmp/kv-each.txt
while read -r c; do
  p=$(python3 -c 'import re,sys; s=sys.argv[1]; s=s[s.index("(")+1:-1]; print("^"+re.escape(s)+"$")' "$c")
  out=$(timeout 120 $B test -b Vulkan0 -o TURBO_ROT_SET_ROWS_KV -p "$p" 2>&1); rc=$?
  echo "rc=$rc $(echo "$out" | grep -o '[0-9]*/[0-9]* tests passed') $c" >> /tmp/kv-each.txt
done < /tmp/kv-cases.txt
echo done >> /tmp/kv-each.txt
