#!/usr/bin/env python3
"""The README's first command (`make demo`): KV-cache types compared on SmolLM2-135M.

Runs the patched llama-perplexity from `tqgguf build` on WikiText-2 (../shared/data when present, else
a generated text): an f16-cache run saves its logits, every other K/V configuration reports PPL and
KL divergence against it, and the KV-cache size llama.cpp allocated.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from tqgguf.build import BuildSpec, find_bin
from tqgguf.errors import TqError
from tqgguf.models import smollm2_path
from tqgguf.perplexity import CacheConfig, run_perplexity
from tqgguf.pin import load_pin
from tqgguf.source import cached_pinned_source
from tqgguf.textdata import eval_text



def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--configs", default="q8_0,q4_0,turbo4,turbo3,turbo2,q8_0/turbo4,turbo4/turbo3",
                    help="K/V cache types compared with f16, e.g. q8_0,turbo4/turbo3")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=None)
    args = ap.parse_args()

    try:
        src = cached_pinned_source(load_pin())
        if src is None:
            raise TqError("the pinned source is not in the cache", "run `tqgguf build` first")
        ppl = find_bin(src, BuildSpec(), "llama-perplexity")
        model = smollm2_path()
        text = eval_text(Path(tempfile.gettempdir()))
        print(f"model: {model.name}   text: {text.name}   -c {args.ctx}, {args.chunks} chunks\n", flush=True)
        print(f"{'K/V':<14} {'PPL':>9} {'KLD vs f16':>11} {'same top':>9} {'KV MiB':>8} {'time':>6}", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            base = Path(tmp) / "f16.kld"
            for cfg in ["f16", *args.configs.split(",")]:
                t0 = time.monotonic()
                r = run_perplexity(ppl, model, text, CacheConfig.parse(cfg), ctx=args.ctx, chunks=args.chunks,
                                   threads=args.threads, kld_base=None if cfg == "f16" else base,
                                   save_base=base if cfg == "f16" else None)
                kld = f"{r.kld:.5f}" if r.kld is not None else "-"
                top = f"{r.same_top:.1f}%" if r.same_top is not None else "-"
                kv = f"{r.kv_mib:.1f}" if r.kv_mib is not None else "?"
                print(f"{r.config:<14} {r.ppl:9.3f} {kld:>11} {top:>9} {kv:>8} {time.monotonic() - t0:5.0f}s", flush=True)
    except TqError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.code
    return 0


if __name__ == "__main__":
    sys.exit(main())
