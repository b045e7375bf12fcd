#!/usr/bin/env python3
"""CPU speed on SmolLM2-135M: `tqgguf bench` at depths 0 and 4096 (-p 512 -n 64 -r 3 -t 2), written to
bench/results/bench-smollm2/. Any `tqgguf bench` option given here wins over these defaults:

    .venv/bin/python scripts/bench_cpu.py [--depth 0,4096] [-t 1] [--configs q8_0,turbo3] [--batched]
"""

from __future__ import annotations

import sys
from pathlib import Path

from tqgguf.cli import app
from tqgguf.models import smollm2_path

REPO = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    app(["bench", "-m", str(smollm2_path()), "--depth", "0,4096", "-p", "512", "-n", "64", "-r", "3", "-t", "2",
         "--out", str(REPO / "bench" / "results" / "bench-smollm2"), "--plot", *sys.argv[1:]])
