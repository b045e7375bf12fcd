#!/usr/bin/env python3
"""The repo's quality table: `tqgguf ppl` on SmolLM2-135M and WikiText-2 (40 chunks of 512, 2 threads), written to
bench/results/ppl-smollm2-40/. Any `tqgguf ppl` option given here wins over these defaults:

    .venv/bin/python scripts/kld_sweep.py [--chunks 20] [--configs q8_0,turbo4] [--out DIR]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tqgguf.cli import app
from tqgguf.models import smollm2_path
from tqgguf.textdata import eval_text

REPO = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    text = eval_text(Path(tempfile.gettempdir()))
    app(["ppl", "-m", str(smollm2_path()), "-f", str(text), "--chunks", "40", "-c", "512", "-t", "2",
         "--out", str(REPO / "bench" / "results" / "ppl-smollm2-40"), "--plot", *sys.argv[1:]])
