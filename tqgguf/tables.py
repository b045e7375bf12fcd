"""Small output helpers shared by the sweeps: Markdown tables, CSV files, and the one rule for calling two
measurements different (no false winners)."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

Z = 2.0  # differences within Z standard errors are shown as "≈"


def markdown(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def csv_text(rows: list[dict]) -> str:
    cols: list[str] = []
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue()


def write_outputs(out_dir: Path, stem: str, md: str, rows: list[dict], doc: dict) -> dict[str, Path]:
    """STEM.md, STEM.csv and STEM.json in out_dir (written atomically); returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"md": out_dir / f"{stem}.md", "csv": out_dir / f"{stem}.csv", "json": out_dir / f"{stem}.json"}
    for kind, text in (("md", md), ("csv", csv_text(rows)), ("json", json.dumps(doc, indent=1, default=str) + "\n")):
        tmp = paths[kind].with_suffix(paths[kind].suffix + ".tmp")
        tmp.write_text(text)
        tmp.replace(paths[kind])
    return paths


def differ(a: float, ea: float, b: float, eb: float, z: float = Z) -> bool:
    """True when a and b are more than z combined standard errors apart. The errors are combined as if
    independent; for two runs over the same tokens they are positively correlated, so this overstates the
    error of the difference: a difference called real is real, one called "≈" is only not shown."""
    if any(x is None or not math.isfinite(x) for x in (a, ea, b, eb)):
        return False
    return abs(a - b) > z * math.hypot(ea, eb)


def fmt_pm(x: float | None, e: float | None, digits: int = 4) -> str:
    """x ± e with at least `digits` decimals, and enough to show two significant digits of e."""
    if x is None:
        return "-"
    if e is None:
        return f"{x:.{digits}f}"
    if e > 0 and math.isfinite(e):
        digits = min(8, max(digits, 1 - math.floor(math.log10(e))))
    return f"{x:.{digits}f} ± {e:.{digits}f}"


def fmt_g(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}g}"
