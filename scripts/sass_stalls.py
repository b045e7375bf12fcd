#!/usr/bin/env python3
"""Summarize ncu's per-instruction counters of one kernel: where the warps wait, before, in and after its main loop.

Reads the CSV that `ncu --import REPORT --page source --print-source sass --csv` writes (`scripts/h200_run.sh sass`
makes one for the turbo3 decode kernel). The main loop is the backward branch executed most often; the instructions
before it are the kernel's prologue (index math, the query's load and rotation, the first copies), those after it the
merge and the writes. Per region it prints the share of executed instructions and of stall samples, with the most
frequent stall reasons, then the instructions with the most samples.

    python scripts/sass_stalls.py bench/results/cuda-h200-round12/call3/sass/sass-turbo3-d32768.csv.gz

--part NAME=START-END (offsets from the kernel's start, hex, END exclusive; repeatable) adds a table of address
ranges inside the loop, per loop step: the instructions executed (divided by the executions of the loop's first
instruction) and the share of all stall samples, e.g. the copies, the K scoring or the softmax of a decode kernel
(`bench/results/cuda-h200-round18/README.md` names the turbo2 kernel's parts).
"""

import argparse
import collections
import csv
import gzip
import io
import re
import sys
from dataclasses import dataclass, field

BRANCH = re.compile(r"\bBRA\s+(?:\S+\s+)?0x([0-9a-f]+)\s*;?$")


@dataclass
class Insn:
    address: int  # as ncu lists it (branch targets use the same addresses)
    offset: int  # from the kernel's first instruction
    source: str
    executed: float  # warp-level instructions executed
    samples: float  # warp stall samples, all
    stalls: dict[str, float] = field(default_factory=dict)  # reason (without "stall_") -> samples


def _num(text: str) -> float:
    text = text.replace(",", "").strip()
    return float(text) if text not in ("", "-") else 0.0


def read_source_csv(text: str) -> list[Insn]:
    """The instructions of the first kernel in ncu's source-page CSV (a "Kernel Name" line, a header, the rows)."""
    rows = list(csv.reader(io.StringIO(text)))
    start = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if start is None:
        raise ValueError("no header with Address and Source columns: not ncu's source page as CSV")
    hdr = rows[start]
    col = {name: i for i, name in enumerate(hdr)}
    for need in ("Instructions Executed", "Warp Stall Sampling (All Samples)"):
        if need not in col:
            raise ValueError(f"no column {need!r} (collect with --section SourceCounters --section WarpStateStats)")
    reasons = [(i, h[len("stall_"):]) for i, h in enumerate(hdr) if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    base = None
    for r in rows[start + 1:]:
        if len(r) < len(hdr) or not r[col["Address"]].startswith("0x"):
            continue
        addr = int(r[col["Address"]], 16)
        base = addr if base is None else base
        out.append(Insn(addr, addr - base, r[col["Source"]].strip(), _num(r[col["Instructions Executed"]]),
                        _num(r[col["Warp Stall Sampling (All Samples)"]]), {n: _num(r[i]) for i, n in reasons}))
    if not out:
        raise ValueError("no instruction rows")
    return out


def main_loop(insns: list[Insn]) -> tuple[int, int] | None:
    """(first, last offset) of the backward branch executed most often, or None when the kernel has no loop."""
    base = insns[0].address
    best = None
    for insn in insns:
        m = BRANCH.search(insn.source)
        if not m or insn.executed <= 0:
            continue
        target = int(m.group(1), 16) - base
        if 0 <= target < insn.offset and (best is None or insn.executed > best[2]):
            best = (target, insn.offset, insn.executed)
    return (best[0], best[1]) if best else None


@dataclass
class Region:
    name: str
    executed: float = 0.0
    samples: float = 0.0
    stalls: collections.Counter = field(default_factory=collections.Counter)


def regions(insns: list[Insn]) -> list[Region]:
    loop = main_loop(insns)
    out = {n: Region(n) for n in ("before", "loop", "after")}
    for insn in insns:
        if loop is None:
            name = "before"
        else:
            name = "before" if insn.offset < loop[0] else "loop" if insn.offset <= loop[1] else "after"
        reg = out[name]
        reg.executed += insn.executed
        reg.samples += insn.samples
        reg.stalls.update(insn.stalls)
    return list(out.values())


def report(insns: list[Insn], top: int = 20) -> str:
    loop = main_loop(insns)
    regs = regions(insns)
    total_ex = sum(r.executed for r in regs) or 1.0
    total_s = sum(r.samples for r in regs) or 1.0
    lines = [f"{len(insns)} instructions, {total_ex:.0f} executed, {total_s:.0f} stall samples"]
    lines.append("main loop: " + (f"{loop[0]:#06x}-{loop[1]:#06x}" if loop else "none found"))
    for r in regs:
        reasons = ", ".join(f"{k} {v / r.samples * 100:.0f}%" for k, v in r.stalls.most_common(6) if v > 0) \
            if r.samples else "-"
        lines.append(f"{r.name:6s} executed {r.executed / total_ex * 100:5.1f}%  samples {r.samples / total_s * 100:5.1f}%"
                     f"  stalls: {reasons}")
    lines.append(f"the {top} instructions with the most samples (offset, samples, instruction, main reasons):")
    for insn in sorted(insns, key=lambda i: -i.samples)[:top]:
        if insn.samples <= 0:
            break
        main = ", ".join(f"{k} {v:.0f}" for k, v in collections.Counter(insn.stalls).most_common(2) if v > 0)
        lines.append(f"  {insn.offset:#06x} {insn.samples:5.0f}  {insn.source[:64]:64s} {main}")
    return "\n".join(lines)


@dataclass
class Part:
    name: str
    start: int  # offset, inclusive
    end: int  # offset, exclusive


def parse_part(text: str) -> Part:
    """NAME=START-END, offsets in hex (0x optional)."""
    m = re.fullmatch(r"([^=]+)=(?:0x)?([0-9a-fA-F]+)-(?:0x)?([0-9a-fA-F]+)", text.strip())
    if not m:
        raise ValueError(f"bad part {text!r}: expected NAME=START-END with hex offsets, e.g. copies=0x42e0-0x5330")
    part = Part(m.group(1).strip(), int(m.group(2), 16), int(m.group(3), 16))
    if part.end <= part.start:
        raise ValueError(f"bad part {text!r}: END must be past START")
    return part


def parts_report(insns: list[Insn], parts: list[Part]) -> str:
    """Per part: instructions per loop step and the share of all samples; then the loop's and the regions' counts."""
    loop = main_loop(insns)
    if loop is None:
        raise ValueError("no main loop, so no loop steps to divide by")
    first = next(i for i in insns if i.offset == loop[0])
    steps = first.executed or 1.0
    warps = insns[0].executed or 1.0  # the first instruction runs once per warp
    total_s = sum(i.samples for i in insns) or 1.0
    lines = [f"{steps:.0f} loop steps, {steps / warps:.2f} per warp",
             "| part | offsets | instructions per step | samples |", "| --- | --- | --- | --- |"]
    for part in parts:
        sel = [i for i in insns if part.start <= i.offset < part.end]
        lines.append(f"| {part.name} | {part.start:#06x}-{part.end:#06x} | {sum(i.executed for i in sel) / steps:.1f} "
                     f"| {sum(i.samples for i in sel) / total_s * 100:.1f}% |")
    regs = {r.name: r for r in regions(insns)}
    lines.append(f"loop: {regs['loop'].executed / steps:.1f} instructions per step; before it "
                 f"{regs['before'].executed / warps:.0f} and after it {regs['after'].executed / warps:.0f} per warp")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu source page as CSV (.csv or .csv.gz)")
    ap.add_argument("--top", type=int, default=20, help="how many of the most-sampled instructions to list")
    ap.add_argument("--part", action="append", default=[], metavar="NAME=START-END",
                    help="an address range of the loop to count per step (hex offsets, END exclusive; repeatable)")
    args = ap.parse_args(argv)
    try:
        parts = [parse_part(p) for p in args.part]
        opener = gzip.open if args.csv.endswith(".gz") else open
        with opener(args.csv, "rt", encoding="utf-8", errors="replace") as f:
            text = f.read()
        insns = read_source_csv(text)
        print(report(insns, args.top))
        if parts:
            print(parts_report(insns, parts))
    except (OSError, ValueError) as e:
        print(f"sass_stalls.py: {args.csv}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
