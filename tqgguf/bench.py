"""Run the patched llama-bench (flash attention on) and collect tokens/s per K/V config, test and depth."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from .errors import TqError
from .perplexity import CacheConfig, run_tool


@dataclass
class BenchRow:
    config: str
    test: str  # "pp512", "tg64", ...
    depth: int
    avg_ts: float
    stddev_ts: float
    n_threads: int
    build_commit: str
    cpu_info: str
    gpu_info: str

    def to_dict(self) -> dict:
        return asdict(self)


def parse_jsonl(config: str, text: str) -> list[BenchRow]:
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        d = json.loads(line)
        test = f"pp{d['n_prompt']}" if d["n_prompt"] and not d["n_gen"] else f"tg{d['n_gen']}"
        rows.append(BenchRow(config, test, int(d.get("n_depth", 0)), float(d["avg_ts"]), float(d["stddev_ts"]),
                             int(d.get("n_threads", 0)), str(d.get("build_commit", "")), str(d.get("cpu_info", "")),
                             str(d.get("gpu_info", ""))))
    return rows


def run_bench(binary: Path, model: Path, config: CacheConfig, depths: list[int], n_prompt: int = 512,
              n_gen: int = 128, reps: int = 3, threads: int | None = None, extra: list[str] | None = None,
              timeout: float | None = None) -> list[BenchRow]:
    cmd = [str(binary), "-m", str(model), "-fa", "1", *config.args(), "-p", str(n_prompt), "-n", str(n_gen),
           "-d", ",".join(map(str, depths)), "-r", str(reps), "-o", "jsonl"]
    if threads:
        cmd += ["-t", str(threads)]
    cmd += extra or []
    r = run_tool(cmd, f"llama-bench for {config.label}", timeout)
    if r.returncode != 0:
        tail = " | ".join(r.stderr.strip().splitlines()[-3:])
        raise TqError(f"llama-bench failed for {config.label} (exit {r.returncode}): {tail}", code=1)
    rows = parse_jsonl(config.label, r.stdout)
    if not rows:
        raise TqError(f"llama-bench printed no results for {config.label}", code=1)
    return rows


def ratio_table(rows: list[BenchRow], refs: tuple[str, ...] = ("f16", "q8_0")) -> str:
    """Markdown: one line per (config, test, depth) with tokens/s and ratios to the reference configs."""
    by = {(r.config, r.test, r.depth): r for r in rows}
    head = "| K/V | test | depth | tok/s | " + " | ".join(f"x {ref}" for ref in refs) + " |"
    out = [head, "|" + " --- |" * (4 + len(refs))]
    for r in rows:
        ratios = []
        for ref in refs:
            b = by.get((ref, r.test, r.depth))
            ratios.append(f"{r.avg_ts / b.avg_ts:.2f}" if b and b.avg_ts > 0 else "-")
        out.append(f"| {r.config} | {r.test} | {r.depth} | {r.avg_ts:.2f} ± {r.stddev_ts:.2f} | " + " | ".join(ratios) + " |")
    return "\n".join(out)
