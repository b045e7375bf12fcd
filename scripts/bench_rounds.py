#!/usr/bin/env python3
"""Ratios to f16 of llama-bench runs made in alternating rounds on one machine: pooled over all rounds, then each
round alone (the rounds alternate the configs, so a drift of the machine reaches them all).

Reads the JSON lines of `llama-bench -o jsonl`, as `scripts/h200_run.sh bench` (with TQ_BENCH_ROUNDS) and
`bench/experiments/run-switches.sh` write them. A line's round is its "round" key where it has one (run-switches.sh
adds it, and a "setting" that becomes part of the config's label); otherwise the n-th line of the same config, test
and depth is round n.

    python scripts/bench_rounds.py h200-out/bench.jsonl > h200-out/summary.txt
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tqgguf.bench_sweep import _json_objects, add_ratios, bench_table, parse_bench_jsonl, pool_rows  # noqa: E402


def label_of(d: dict) -> str:
    k, v = d["type_k"], d["type_v"]
    setting = d.get("setting", "default")
    return (k if k == v else f"{k}/{v}") + ("" if setting == "default" else f" {setting}")


def split_rounds(text: str) -> dict[tuple[str, int], list[dict]]:
    """(label, round) -> the llama-bench objects of that config in that round."""
    runs: dict[tuple[str, int], list[dict]] = {}
    seen: dict[tuple, int] = {}
    for d in _json_objects(text):
        if "type_k" not in d or "avg_ts" not in d:
            continue
        label = label_of(d)
        if "round" in d:
            n = int(d["round"])
        else:
            key = (label, d.get("n_prompt"), d.get("n_gen"), d.get("n_depth"))
            seen[key] = n = seen.get(key, 0) + 1
        runs.setdefault((label, n), []).append(d)
    return runs


def summary(text: str) -> str:
    rows = {key: parse_bench_jsonl(key[0], "\n".join(json.dumps(d) for d in ds))
            for key, ds in split_rounds(text).items()}
    # (pool_rows passes a row that has no repetition through as it is: the rounds get copies for their ratios)
    pooled = pool_rows([replace(r) for rs in rows.values() for r in rs])
    add_ratios(pooled)
    per: dict[tuple, list[str]] = {}  # (label, test, depth) -> the rounds' ratios
    for n in sorted({n for _, n in rows}):
        rs = [r for (_, m), rr in rows.items() if m == n for r in rr]
        add_ratios(rs)
        for r in rs:
            per.setdefault((r.config, r.test, r.depth), []).append("-" if r.ratio is None else f"{r.ratio:.3f}")
    out = [bench_table(pooled), "", "| K/V | test | depth | x f16 per round |", "| --- | --- | --- | --- |"]
    out += [f"| {r.config} | {r.test} | {r.depth} | {', '.join(per[(r.config, r.test, r.depth)])} |" for r in pooled]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("jsonl", type=Path, help="llama-bench JSON lines")
    args = ap.parse_args(argv)
    try:
        text = args.jsonl.read_text()
    except OSError as e:
        print(f"error: cannot read {args.jsonl}: {e.strerror}", file=sys.stderr)
        return 2
    if not split_rounds(text):
        print(f"error: no llama-bench JSON lines in {args.jsonl}", file=sys.stderr)
        return 1
    print(summary(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
