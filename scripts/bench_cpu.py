#!/usr/bin/env python3
"""CPU speed of every K/V config on SmolLM2-135M, with ratios to f16 and q8_0 from the same run.

    .venv/bin/python scripts/bench_cpu.py [--depths 0,4096] [-p 512] [-n 64] [-r 3] [-t 2]

Writes bench/results/cpu-smollm2.md (and .json): the command, the tqgguf commit, the patch series,
the CPU, and one row per (config, test, depth).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from tqgguf.bench import ratio_table, run_bench
from tqgguf.build import BuildSpec, find_bin, find_manifest
from tqgguf.models import smollm2_path
from tqgguf.perplexity import CacheConfig
from tqgguf.pin import load_pin
from tqgguf.source import cached_pinned_source

REPO = Path(__file__).resolve().parent.parent
CONFIGS = "f16,q8_0,q4_0,turbo4,turbo3,turbo2,q8_0/turbo4,q8_0/turbo3,q8_0/turbo2,turbo4/turbo3"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", default=CONFIGS)
    ap.add_argument("--depths", default="0,4096")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "cpu-smollm2")
    ap.add_argument("--note", default="", help="A line added to the report (for example why -t differs)")
    args = ap.parse_args()

    pin = load_pin()
    src = cached_pinned_source(pin)
    if src is None:
        sys.exit("error: run `tqgguf build` first")
    bench = find_bin(src, BuildSpec(), "llama-bench")
    manifest = find_manifest(src, BuildSpec())
    depths = [int(d) for d in args.depths.split(",")]
    rows = []
    for cfg in args.configs.split(","):
        t0 = time.monotonic()
        got = run_bench(bench, smollm2_path(), CacheConfig.parse(cfg), depths, args.p, args.n, args.r, args.t)
        rows += got
        print(f"{cfg:<14} " + "  ".join(f"{r.test}@{r.depth}: {r.avg_ts:8.2f}" for r in got)
              + f"   ({time.monotonic() - t0:.0f} s)", flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cmd = (f"llama-bench -m SmolLM2-135M-Instruct.Q4_1.gguf -fa 1 -ctk K -ctv V -p {args.p} -n {args.n} "
           f"-d {args.depths} -r {args.r} -t {args.t}")
    cpu = rows[0].cpu_info or platform.processor()
    table = ratio_table(rows)
    md = (f"# CPU speed, SmolLM2-135M Q4_1\n\n"
          f"- command (per config): `{cmd}`\n- tqgguf commit: {commit}; series: "
          f"{', '.join(p['name'][:4] for p in manifest['patches'])} on llama.cpp {pin.upstream_commit}\n"
          f"- device: {cpu}, {args.t} threads; date: {time.strftime('%Y-%m-%d')}\n"
          f"- ratios are to f16 / q8_0 measured in the same run (shared machine: expect a few % noise)\n"
          + (f"- note: {args.note}\n" if args.note else "") + "\n"
          f"{table}\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(md)
    args.out.with_suffix(".json").write_text(json.dumps(
        {"command": cmd, "commit": commit, "cpu": cpu, "rows": [r.to_dict() for r in rows]}, indent=1) + "\n")
    print("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
