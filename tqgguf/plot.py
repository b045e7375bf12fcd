"""PNG plots of the sweeps. matplotlib is an optional extra (`pip install 'tqgguf[plot]'`), imported only here and
only when a plot is asked for; without it --plot is a one-line error, not a traceback."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import TqError


def pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise TqError("--plot needs matplotlib, which is not installed",
                      "pip install 'tqgguf[plot]'  (or leave out --plot)") from None
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=120, bbox_inches="tight")
    tmp.replace(path)
    return path


def plot_ppl(rows: list, path: Path, title: str = "") -> Path:
    """Mean KLD (log scale, with 2-error bars) against bits per value, one labelled point per config; the f16
    floor (a second f16 run against the base) as a dashed line."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    pts = [r for r in rows if r.role == "kld" and r.status == "ok" and r.kld and r.kld > 0]
    floor = next((r for r in rows if r.role == "floor" and r.status == "ok" and r.kld is not None), None)
    if not pts:
        plt.close(fig)
        raise TqError("nothing to plot: no KLD results yet", code=1)
    for r in pts:
        err = 2 * (r.kld_err or 0.0)
        ax.errorbar([r.bits_per_value], [r.kld], yerr=[[min(err, r.kld * 0.999)], [err]], fmt="o", capsize=3,
                    color="tab:orange" if "turbo" in r.config else "tab:blue")
        ax.annotate(r.config, (r.bits_per_value, r.kld), textcoords="offset points", xytext=(5, 4), fontsize=8)
    if floor is not None and floor.kld > 0:
        ax.axhline(floor.kld, ls="--", color="grey", lw=1)
        ax.annotate(f"f16 floor {floor.kld:.2g}", (ax.get_xlim()[0], floor.kld), textcoords="offset points",
                    xytext=(4, 4), fontsize=8, color="grey")
    elif floor is not None:  # below the 6 decimals llama-perplexity prints
        ax.text(0.99, 0.02, "f16 against its own stored logits: mean KLD < 5e-7", transform=ax.transAxes,
                ha="right", va="bottom", fontsize=8, color="grey")
    ax.set_yscale("log")
    ax.set_xlabel("bits per K/V value (from the KV MiB llama.cpp logged)")
    ax.set_ylabel("mean KL divergence vs f16 cache (log; bars: 2 errors)")
    ax.set_title(title or "KL divergence against bits per value", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_bench(rows: list, path: Path, title: str = "") -> Path:
    """Decode tok/s against depth, one line per config (bars: one standard deviation over the repetitions)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    tg = [r for r in rows if r.test.startswith("tg")]
    if not tg:
        plt.close(fig)
        raise TqError("nothing to plot: no decode (tg) results", code=1)
    for cfg in dict.fromkeys(r.config for r in tg):
        pts = sorted((r for r in tg if r.config == cfg), key=lambda r: r.depth)
        ax.errorbar([r.depth for r in pts], [r.avg_ts for r in pts], yerr=[r.stddev_ts for r in pts], marker="o",
                    capsize=3, label=cfg, ls="--" if cfg == "f16" else "-")
    ax.set_xlabel("depth (tokens already in the KV cache)")
    ax.set_ylabel(f"decode tok/s ({tg[0].test})")
    ax.set_title(title or "decode speed against depth", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_batched(rows: list, path: Path, title: str = "") -> Path:
    """Aggregate tok/s (prompt and generation of all sequences) against the number of parallel sequences."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    agg = [r for r in rows if r.test.endswith(" all")]
    if not agg:
        plt.close(fig)
        raise TqError("nothing to plot: no batched results", code=1)
    for cfg in dict.fromkeys(r.config for r in agg):
        pts = sorted((r for r in agg if r.config == cfg), key=lambda r: r.depth)
        ax.plot([r.depth for r in pts], [r.avg_ts for r in pts], marker="o", label=cfg,
                ls="--" if cfg == "f16" else "-")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("parallel sequences")
    ax.set_ylabel("aggregate tok/s (prompt + generation)")
    ax.set_title(title or "throughput against parallel sequences", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)


def plot_niah(cells: list[dict], path: Path, title: str = "") -> Path:
    """A heat map of retrieval accuracy: one row per (config, context), one column per depth."""
    plt = pyplot()
    rows = list(dict.fromkeys((c["config"], c["ctx"]) for c in cells))
    depths = sorted({c["depth"] for c in cells})
    if not rows:
        raise TqError("nothing to plot: no results", code=1)
    grid = [[float("nan")] * len(depths) for _ in rows]
    for c in cells:
        grid[rows.index((c["config"], c["ctx"]))][depths.index(c["depth"])] = c["accuracy"]
    fig, ax = plt.subplots(figsize=(1.2 * len(depths) + 3, 0.45 * len(rows) + 1.8))
    im = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(depths)), [f"{d}%" for d in depths])
    ax.set_yticks(range(len(rows)), [f"{cfg} @ {ctx}" for cfg, ctx in rows])
    for i, row in enumerate(grid):
        for j, v in enumerate(row):
            if v == v:
                ax.text(j, i, f"{v:.0%}", ha="center", va="center", fontsize=8,
                        color="white" if v < 0.25 or v > 0.85 else "black")
    ax.set_xlabel("needle depth")
    ax.set_title(title or "needle-in-a-haystack accuracy", fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.05)
    try:
        return _save(fig, path)
    finally:
        plt.close(fig)
