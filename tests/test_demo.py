"""The README's first command (`make demo` runs scripts/demo.py on the CPU build): a short run of the same script on
the shared build, and its error when nothing is built."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "scripts" / "demo.py"


def _rows(stdout: str) -> dict[str, list[str]]:
    """The demo's table: K/V config -> its other columns (PPL, KLD vs f16, same top, KV MiB, time)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("K/V"))
    return {parts[0]: parts[1:] for parts in (line.split() for line in lines[start + 1:] if line.strip())}


def test_demo_compares_cache_types(cpu_build):
    r = subprocess.run([sys.executable, str(DEMO), "--configs", "q8_0/turbo3,turbo2", "--chunks", "2", "-c", "128",
                        "-t", str(min(os.cpu_count() or 1, 4))],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    rows = _rows(r.stdout)
    assert list(rows) == ["f16", "q8_0/turbo3", "turbo2"], r.stdout
    ppl = {k: float(v[0]) for k, v in rows.items()}
    kv = {k: float(v[3]) for k, v in rows.items()}
    assert all(math.isfinite(p) and p > 1 for p in ppl.values()), ppl
    assert rows["f16"][1] == "-"  # the base has no KLD against itself
    kld = {k: float(rows[k][1]) for k in ("q8_0/turbo3", "turbo2")}
    # on SmolLM2 a turbo2 cache costs tens of times q8_0/turbo3's KLD (README: 1.09 against 0.036 at 40 chunks)
    assert 0 < kld["q8_0/turbo3"] < kld["turbo2"], kld
    # KV MiB as llama.cpp allocated it: turbo2 (2.25 bits) is about 7x smaller than f16, q8_0/turbo3 about 2.7x
    assert kv["turbo2"] < kv["q8_0/turbo3"] < kv["f16"], kv
    assert 6 < kv["f16"] / kv["turbo2"] < 8, kv


def test_demo_without_a_build_says_what_to_run(tmp_path):
    env = dict(os.environ, TQGGUF_CACHE=str(tmp_path / "empty-cache"))
    r = subprocess.run([sys.executable, str(DEMO), "--chunks", "1"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    assert "tqgguf build" in r.stderr, r.stderr
