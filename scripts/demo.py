#!/usr/bin/env python3
"""The README's first command (`make demo`): perplexity of SmolLM2-135M with several KV-cache types.

Runs the patched llama-perplexity from `tqgguf build` on WikiText-2 (../shared/data when present,
else a bundled-free generated text) and prints PPL and KV-cache size per cache type.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

from tqgguf.build import BuildSpec, find_bin
from tqgguf.models import smollm2_path
from tqgguf.pin import load_pin
from tqgguf.source import cached_pinned_source

REPO = Path(__file__).resolve().parent.parent
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext-2-raw-test.txt"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--configs", default="f16,q8_0,q4_0", help="K/V cache types, e.g. f16,q8_0/q4_0")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=0)
    args = ap.parse_args()

    src = cached_pinned_source(load_pin())
    if src is None:
        sys.exit("error: run `tqgguf build` first")
    ppl = find_bin(src, BuildSpec(), "llama-perplexity")
    model = smollm2_path()
    text = WIKITEXT
    if not text.is_file():
        text = Path("/tmp/tqgguf-demo.txt")
        words = "the river city music game war team season church school state song album film year".split()
        text.write_text("\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(40)) for i in range(3000)))
    print(f"model: {model.name}\ntext:  {text}\n")
    print(f"{'K/V':<14} {'PPL':>10} {'KV MiB':>8} {'time':>7}")
    for cfg in args.configs.split(","):
        k, _, v = cfg.partition("/")
        v = v or k
        cmd = [str(ppl), "-m", str(model), "-f", str(text), "-c", str(args.ctx), "--chunks", str(args.chunks),
               "-fa", "on", "-ctk", k, "-ctv", v]
        if args.threads:
            cmd += ["-t", str(args.threads)]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True)
        log = r.stdout + r.stderr
        m = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", log)
        kv = re.search(r"KV buffer size\s*=\s*([\d.]+) MiB", log)
        if r.returncode != 0 or not m:
            print(f"{cfg:<14} failed (exit {r.returncode}): {log.strip().splitlines()[-1] if log.strip() else ''}")
            continue
        print(f"{cfg:<14} {m.group(1):>10} {kv.group(1) if kv else '?':>8} {time.monotonic() - t0:6.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
