#!/usr/bin/env python3
"""PPL and KL divergence of every K/V config against an f16 cache on SmolLM2-135M (the issue's report table).

    .venv/bin/python scripts/kld_sweep.py [--chunks 40] [-c 512] [-t 2]

Writes bench/results/kld-smollm2.md (and .json) with the command, commit, device, bits per value and
the KV-cache MiB llama.cpp allocated for each config.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqgguf.build import BuildSpec, find_bin, find_manifest
from tqgguf.models import smollm2_path
from tqgguf.perplexity import CacheConfig, run_perplexity
from tqgguf.pin import load_pin
from tqgguf.source import cached_pinned_source
from tqgguf.textdata import eval_text

REPO = Path(__file__).resolve().parent.parent
CONFIGS = ("q8_0,q4_0,turbo4,turbo3,turbo2,q8_0/q4_0,q8_0/turbo4,q8_0/turbo3,q8_0/turbo2,"
           "turbo4/turbo3,turbo4/turbo2")
BPV = {"f16": 16.0, "q8_0": 8.5, "q4_0": 4.5, "turbo4": 4.25, "turbo3": 3.25, "turbo2": 2.25}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "kld-smollm2")
    args = ap.parse_args()

    pin = load_pin()
    src = cached_pinned_source(pin)
    if src is None:
        sys.exit("error: run `tqgguf build` first")
    ppl = find_bin(src, BuildSpec(), "llama-perplexity")
    manifest = find_manifest(src, BuildSpec())
    text = eval_text(Path(tempfile.gettempdir()))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "f16.kld"
        for cfg in ["f16", *args.configs.split(",")]:
            t0 = time.monotonic()
            r = run_perplexity(ppl, smollm2_path(), text, CacheConfig.parse(cfg), ctx=args.ctx, chunks=args.chunks,
                               threads=args.threads, kld_base=None if cfg == "f16" else base,
                               save_base=base if cfg == "f16" else None)
            c = CacheConfig.parse(cfg)
            row = {"config": cfg, "bpv": (BPV[c.k] + BPV[c.v]) / 2, "ppl": r.ppl, "ppl_err": r.ppl_err,
                   "ppl_ratio": r.ppl_ratio or 1.0, "ppl_ratio_err": r.ppl_ratio_err or 0.0, "kld": r.kld or 0.0,
                   "kld_err": r.kld_err or 0.0, "kld_p99": r.kld_p99 or 0.0, "same_top": r.same_top or 100.0,
                   "kv_mib": r.kv_mib, "seconds": round(time.monotonic() - t0, 1)}
            rows.append(row)
            print(f"{cfg:<14} PPL {r.ppl:8.4f}  KLD {row['kld']:.5f} ± {row['kld_err']:.5f}  "
                  f"top {row['same_top']:.2f}%  KV {r.kv_mib} MiB  ({row['seconds']} s)", flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cmd = (f"llama-perplexity -m SmolLM2-135M-Instruct.Q4_1.gguf -f {text.name} -c {args.ctx} --chunks {args.chunks} "
           f"-fa on -ctk K -ctv V -t {args.threads} (f16 with --kl-divergence-base, the others with --kl-divergence)")
    lines = ["| K/V | bits/value | PPL | PPL ratio | mean KLD | KLD p99 | same top | KV MiB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in sorted(rows, key=lambda r: -r["bpv"]):
        lines.append(f"| {r['config']} | {r['bpv']:.3g} | {r['ppl']:.4f} ± {r['ppl_err']:.4f} | "
                     f"{r['ppl_ratio']:.4f} ± {r['ppl_ratio_err']:.4f} | {r['kld']:.5f} ± {r['kld_err']:.5f} | "
                     f"{r['kld_p99']:.4f} | {r['same_top']:.2f}% | {r['kv_mib']} |")
    md = (f"# PPL and KL divergence vs an f16 cache, SmolLM2-135M Q4_1\n\n- command: `{cmd}`\n"
          f"- text: {text} ({args.chunks} chunks of {args.ctx})\n- tqgguf commit: {commit}; series: "
          f"{len(manifest['patches'])} patches on llama.cpp {pin.upstream_commit}\n"
          f"- device: {platform.processor() or platform.machine()}, {args.threads} threads, CPU backend; "
          f"date: {time.strftime('%Y-%m-%d')}\n- KV MiB: what llama.cpp logged (4 sequences of {args.ctx})\n\n"
          + "\n".join(lines) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(md)
    args.out.with_suffix(".json").write_text(json.dumps({"command": cmd, "commit": commit, "rows": rows}, indent=1) + "\n")
    print("\n" + md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
