"""`tqgguf ppl`: perplexity and KL divergence of K/V cache configs against an f16 cache, resumable.

The f16 run saves the model's log-probabilities once (llama-perplexity --kl-divergence-base, kept under the tqgguf
cache and reused while model, text, context, chunks and build match); every other config is a --kl-divergence run
against it. A second f16 run against the base (the "floor") measures what the comparison itself costs: the base
stores log-probabilities quantized to 16 bits, so its KLD is small but not zero, and a config whose KLD is within
the error of the floor is indistinguishable from an f16 cache.

Results go to DIR/ppl.jsonl (tqgguf.sweep_store) as each run finishes; DIR/ppl.md, .csv, .json (and .png with
--plot) are rewritten from the store at the end, so a rerun skips what is done and completes the table.
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from . import __version__
from .errors import EXIT_WARN, TqError
from .paths import cache_dir
from .perplexity import CacheConfig, PplResult, check_kld_size, parse_output
from .runinfo import build_hash, build_summary, check_gpu_pairs, device, file_sha256
from .sweep_store import Store, record_key
from .tables import differ, fmt_g, fmt_pm, markdown, write_outputs
from .toolrun import stream, tail

DEFAULT_CONFIGS = "f16,q8_0,q4_0,turbo4,turbo3,turbo2,q8_0/turbo4,q8_0/turbo3,turbo4/turbo3,turbo4/turbo2+bv2"
FLOOR = "f16 (floor)"
STEM = "ppl"

# ---- per-chunk progress -------------------------------------------------------------------------

_TOTAL = re.compile(r"(?:calculating perplexity over|computing over) (\d+) chunks")
_PPL_CHUNK = re.compile(r"\[(\d+)\]\s*(?:[-+]?[0-9.]+(?:[eE][-+]?\d+)?|nan|inf|-nan),")
_KLD_CHUNK = re.compile(r"^\s*(\d+)\s+[-+0-9.naif]+\s+±", re.M)
_PASS = re.compile(r"([0-9.]+) seconds per pass - ETA")


@dataclass
class ChunkProgress:
    """Chunks done out of total, from llama-perplexity's output as it arrives: `[3]12.34,` in a PPL run, a table
    row per chunk in a --kl-divergence run. Chunks are computed n_seq at a time (4 at -c 512 with the default -b)."""

    total: int | None = None
    done: int = 0
    seconds_per_pass: float | None = None
    _bufs: dict = field(default_factory=dict)

    def feed(self, piece: str, stream: str = "stdout") -> bool:
        """Take more output of one stream; True when total or done changed."""
        buf = self._bufs.get(stream, "") + piece
        before = (self.total, self.done)
        if self.total is None and (m := _TOTAL.search(buf)):
            self.total = int(m.group(1))
        if self.seconds_per_pass is None and (m := _PASS.search(buf)):
            self.seconds_per_pass = float(m.group(1))
        for rx in (_PPL_CHUNK, _KLD_CHUNK):
            for m in rx.finditer(buf):
                self.done = max(self.done, int(m.group(1)))
        self._bufs[stream] = buf[-4000:]  # enough to hold a line cut between two pieces
        return (self.total, self.done) != before


def progress_of(text: str) -> ChunkProgress:
    p = ChunkProgress()
    p.feed(text)
    return p


# ---- spec, rows, events -------------------------------------------------------------------------


@dataclass
class PplSpec:
    model: Path
    text: Path
    configs: list[CacheConfig]
    binary: Path
    out: Path
    ctx: int = 512
    chunks: int = 40
    threads: int | None = None
    n_gpu_layers: str | None = None
    floor: bool = True
    extra: list[str] = field(default_factory=list)
    timeout: float | None = None


@dataclass
class PplRow:
    config: str
    role: str                      # base (f16, saves the logits), floor (f16 vs the base), kld (vs the base)
    status: str = "ok"             # ok | failed | missing
    bits_per_value: float | None = None
    kv_mib: float | None = None
    ppl: float | None = None
    ppl_err: float | None = None
    ppl_ratio: float | None = None
    ppl_ratio_err: float | None = None
    kld: float | None = None
    kld_err: float | None = None
    kld_p99: float | None = None
    same_top: float | None = None
    same_top_err: float | None = None
    kld_max: float | None = None
    seconds: float | None = None
    reused: bool = False           # taken from the store or the base cache, not run now
    vs_above: str = ""             # "≈", "x1.23", "base", "floor" (the comparison column)
    ppl_ratio_sig: bool | None = None  # PPL ratio differs from 1 by more than 2 errors
    error: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Events:
    """How a sweep reports (the CLI draws a progress bar; tests may pass nothing)."""

    start: Callable[[str, int, int], None] = lambda label, i, n: None   # a run begins (i of n)
    chunk: Callable[[str, int, int | None], None] = lambda label, done, total: None
    done: Callable[[PplRow], None] = lambda row: None
    skip: Callable[[PplRow, str], None] = lambda row, why: None
    fail: Callable[[str, str], None] = lambda label, message: None
    info: Callable[[str], None] = lambda msg: None


@dataclass
class PplSweep:
    spec: PplSpec
    rows: list[PplRow]
    failed: list[str]
    ran: list[str]
    skipped: list[str]
    meta: dict
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_WARN if self.failed else 0


# ---- running ------------------------------------------------------------------------------------


def parse_configs(text: str) -> list[CacheConfig]:
    """'f16,q8_0/turbo4,turbo4/turbo2+bv2' -> configs (duplicates dropped, order kept)."""
    out: list[CacheConfig] = []
    for part in text.split(","):
        if not part.strip():
            continue
        c = CacheConfig.parse(part)
        if c.label not in [o.label for o in out]:
            out.append(c)
    if not out:
        raise TqError("no cache configs given", f"e.g. --configs {DEFAULT_CONFIGS}")
    return out


def perplexity_cmd(spec: PplSpec, cfg: CacheConfig, *, save_base: Path | None = None,
                   kld_base: Path | None = None) -> list[str]:
    # -lv 4: llama.cpp logs its KV-cache size only at this verbosity
    cmd = [str(spec.binary), "-m", str(spec.model), "-c", str(spec.ctx), "--chunks", str(spec.chunks), "-fa", "on",
           "-lv", "4", *cfg.args()]
    if kld_base is not None:
        cmd += ["--kl-divergence-base", str(kld_base), "--kl-divergence"]
    else:
        cmd += ["-f", str(spec.text)]
        if save_base is not None:
            cmd += ["--kl-divergence-base", str(save_base)]
    if spec.threads:
        cmd += ["-t", str(spec.threads)]
    if spec.n_gpu_layers is not None:
        cmd += ["-ngl", str(spec.n_gpu_layers)]
    return cmd + list(spec.extra)


def _result_dict(r: PplResult) -> dict:
    d = asdict(r)
    d.pop("log", None)
    return d


def check_spec(spec: PplSpec) -> None:
    """Bad input as one-line errors, before anything runs."""
    check_gpu_pairs(spec.binary, spec.n_gpu_layers, spec.configs)
    for what, p in (("model", spec.model), ("text", spec.text)):
        if not p.exists():
            raise TqError(f"{what} file not found: {p}", "give a GGUF with -m" if what == "model" else "give a text file with -f")
        if not p.is_file():
            raise TqError(f"not a file: {p}")
    if spec.chunks < 1:
        raise TqError(f"--chunks must be >= 1, got {spec.chunks}")
    if spec.ctx < 16:
        raise TqError(f"-c must be >= 16, got {spec.ctx}")
    check_kld_size(spec.ctx, spec.chunks)
    with open(spec.model, "rb") as f:
        if f.read(4) != b"GGUF":
            raise TqError(f"{spec.model} is not a GGUF file", "check it with `tqgguf check`")


def run_sweep(spec: PplSpec, ev: Events | None = None) -> PplSweep:
    ev = ev or Events()
    check_spec(spec)
    spec.out.mkdir(parents=True, exist_ok=True)
    store = Store.open(spec.out / f"{STEM}.jsonl")
    if store.skipped_lines:
        ev.info(f"{store.path}: ignored {store.skipped_lines} unreadable line(s) (a run killed while writing)")
    common = {"kind": "ppl", "model_sha256": file_sha256(spec.model), "text_sha256": file_sha256(spec.text),
              "ctx": spec.ctx, "chunks": spec.chunks, "build": build_hash(spec.binary),
              "ngl": spec.n_gpu_layers, "extra": spec.extra}
    dev = device(spec.binary, spec.n_gpu_layers)
    meta_base = {"device": dev, "build": build_summary(spec.binary), "model": str(spec.model), "text": str(spec.text),
                 "threads": spec.threads, "tqgguf": __version__}
    base_dir = cache_dir() / "kld-base"
    base_id = record_key(common)
    base_path = base_dir / f"{base_id}.kld"
    base_json = base_dir / f"{base_id}.json"

    f16 = CacheConfig("f16", "f16")
    kld_cfgs = ([("floor", f16)] if spec.floor else []) + [("kld", c) for c in spec.configs if c.label != "f16"]
    plan = [("base", f16)] + kld_cfgs
    keys = {(role, c.label): record_key(common | {"config": c.label, "role": role}) for role, c in plan}
    ran: list[str] = []
    skipped: list[str] = []
    failed: list[str] = []

    def label_of(role: str, c: CacheConfig) -> str:
        return FLOOR if role == "floor" else c.label

    def run_one(i: int, role: str, c: CacheConfig) -> dict | None:
        label = label_of(role, c)
        ev.start(label, i, len(plan))
        prog = ChunkProgress()

        def on_output(piece: str, which: str) -> None:
            if prog.feed(piece, which):
                ev.chunk(label, prog.done, prog.total or spec.chunks)

        if role == "base":
            base_dir.mkdir(parents=True, exist_ok=True)
            tmp = base_path.with_suffix(".kld.partial")
            cmd = perplexity_cmd(spec, c, save_base=tmp)
        else:
            cmd = perplexity_cmd(spec, c, kld_base=base_path)
        t0 = time.time()
        run = stream(cmd, f"llama-perplexity for {label}", on_output, spec.timeout)
        log_dir = spec.out / "logs"
        log_dir.mkdir(exist_ok=True)
        (log_dir / (re.sub(r"[^A-Za-z0-9_.+-]", "_", label) + ".log")).write_text(
            "# " + " ".join(cmd) + "\n" + run.log)
        try:
            if run.returncode != 0:
                raise TqError(f"llama-perplexity failed for {label} (exit {run.returncode}): {_cause(run.log)}", code=1)
            res = parse_output(label, run.text)
            if role != "base" and res.kld is None:
                raise TqError(f"no KL divergence in the output of {label}: {tail(run.log)}", code=1)
        except TqError as e:
            if role == "base":
                raise
            failed.append(label)
            ev.fail(label, e.message)
            return None
        if role == "base":
            tmp.replace(base_path)
        result = _result_dict(res) | {"seconds": run.seconds}
        meta = meta_base | {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "command": cmd}
        rec = store.append(common | {"config": c.label, "role": role}, result, meta)
        if role == "base":
            tmp_json = base_json.with_suffix(".json.partial")
            tmp_json.write_text(json.dumps(rec, default=str))
            tmp_json.replace(base_json)
        ran.append(label)
        ev.done(_row(role, label, rec, reused=False))
        return rec

    # the f16 base: needed when a KLD run is to be done and the logits file is missing
    todo = [(role, c) for role, c in kld_cfgs if store.get(keys[(role, c.label)]) is None]
    base_rec = store.get(keys[("base", "f16")])
    if base_rec is None and base_path.is_file() and base_json.is_file():
        try:  # measured by an earlier invocation with another --out
            cached = json.loads(base_json.read_text())
            base_rec = store.append(cached["fields"], cached["result"], cached.get("meta", {}) | {"reused_base": True})
        except (OSError, ValueError, KeyError):
            base_rec = None
    if base_rec is None or (todo and not base_path.is_file()):
        why = "" if base_rec is None else " (its logits file is gone)"
        if why:
            ev.info(f"running f16 again{why}")
        run_one(0, "base", f16)
    else:
        skipped.append("f16")
        ev.skip(_row("base", "f16", base_rec, reused=True), "done")
    for i, (role, c) in enumerate(kld_cfgs, start=1):
        rec = store.get(keys[(role, c.label)])
        if rec is not None:
            skipped.append(label_of(role, c))
            ev.skip(_row(role, label_of(role, c), rec, reused=True), "done")
            continue
        run_one(i, role, c)

    rows = table_rows(store, keys, plan, ran)
    meta = meta_base | {"ctx": spec.ctx, "chunks": spec.chunks, "model_sha256": common["model_sha256"],
                        "text_sha256": common["text_sha256"], "base_logits": str(base_path),
                        "base_logits_bytes": base_path.stat().st_size if base_path.is_file() else None,
                        "date": time.strftime("%Y-%m-%d"), "command_per_config": " ".join(
                            perplexity_cmd(spec, CacheConfig("K", "V"), kld_base=Path("BASE"))[1:]).replace(
                                str(spec.model), spec.model.name)}
    sweep = PplSweep(spec, rows, failed, ran, skipped, meta)
    return sweep


def _cause(log: str) -> str:
    """The line that says why a tool failed (llama.cpp's error lines carry an " E " level), else the last lines."""
    errs = [ln.strip() for ln in log.splitlines() if re.search(r"^\S+ E |error|failed|GGML_ASSERT", ln)]
    if errs:
        return re.sub(r"^[0-9.]+ E\s+", "", errs[-1])[:300]
    return tail(log)


def _row(role: str, label: str, rec: dict, reused: bool) -> PplRow:
    r = rec["result"]
    row = PplRow(label, role, kv_mib=r.get("kv_mib"), ppl=r.get("ppl"), ppl_err=r.get("ppl_err"),
                 seconds=r.get("seconds"), reused=reused)
    if role == "base":
        row.ppl_ratio, row.ppl_ratio_err, row.kld, row.kld_err, row.kld_p99 = 1.0, 0.0, 0.0, 0.0, 0.0
        row.same_top, row.same_top_err = 100.0, 0.0
    else:
        for k in ("ppl_ratio", "ppl_ratio_err", "kld", "kld_err", "kld_p99", "kld_max", "same_top", "same_top_err"):
            setattr(row, k, r.get(k))
    return row


def table_rows(store: Store, keys: dict, plan: list[tuple[str, CacheConfig]], ran: list[str]) -> list[PplRow]:
    """The rows of this sweep's configs from the store, sorted by bits per value (then KLD), with comparisons."""
    rows: list[PplRow] = []
    f16_kv = None
    for role, c in plan:
        label = FLOOR if role == "floor" else c.label
        rec = store.get(keys[(role, c.label)])
        if rec is None:
            rows.append(PplRow(label, role, status="missing"))
        else:
            rows.append(_row(role, label, rec, reused=label not in ran))
        if role == "base" and rec is not None:
            f16_kv = rec["result"].get("kv_mib")
    cfg_of = {(FLOOR if role == "floor" else c.label): c for role, c in plan}
    for row in rows:
        c = cfg_of[row.config]
        if row.kv_mib and f16_kv:
            row.bits_per_value = round(16.0 * row.kv_mib / f16_kv, 3)   # measured: counts boundary layers too
        else:
            row.bits_per_value = c.nominal_bits_per_value()
    order = {"base": 0, "floor": 1, "kld": 2}
    rows.sort(key=lambda r: (-(r.bits_per_value or 0), order[r.role], r.kld if r.kld is not None else math.inf))
    annotate(rows)
    return rows


def annotate(rows: list[PplRow]) -> None:
    """The comparison column: each KLD row against the KLD row above it (more bits); "≈" when the difference is
    within 2 standard errors. And whether each PPL ratio differs from 1 by more than 2 of its errors."""
    prev: PplRow | None = None
    for r in rows:
        if r.role == "base":
            r.vs_above = "base"
            continue
        if r.status != "ok" or r.kld is None:
            r.vs_above = r.status
            continue
        if r.ppl_ratio is not None and r.ppl_ratio_err is not None:
            r.ppl_ratio_sig = differ(r.ppl_ratio, r.ppl_ratio_err, 1.0, 0.0)
        if prev is None:
            r.vs_above = "floor" if r.role == "floor" else "-"
        elif not differ(r.kld, r.kld_err or 0.0, prev.kld, prev.kld_err or 0.0):
            r.vs_above = f"≈ {prev.config}"
        elif prev.kld > 0:
            r.vs_above = f"x{r.kld / prev.kld:.3g} {prev.config}"
        else:
            r.vs_above = f"{'>' if r.kld > prev.kld else '<'} {prev.config}"
        prev = r


HEADERS = ["K/V", "bits/value", "KV MiB", "PPL", "PPL ratio", "mean KLD", "KLD p99", "same top", "KLD vs row above"]


def markdown_table(rows: list[PplRow]) -> str:
    out = []
    for r in rows:
        if r.status != "ok":
            out.append([r.config, fmt_g(r.bits_per_value), "-", r.status, "", "", "", "", ""])
            continue
        if r.role == "base":
            ratio, kld, p99, top = "1 (base)", "0 (base)", "0", "100%"
        else:
            ratio = fmt_pm(r.ppl_ratio, r.ppl_ratio_err) + (" ≈1" if r.ppl_ratio_sig is False else "")
            # llama-perplexity prints the mean KLD with 6 decimals: a 0 is below that resolution
            kld = "< 0.0000005" if r.kld == 0 and not r.kld_err else fmt_pm(r.kld, r.kld_err, 5)
            p99 = "-" if r.kld_p99 is None else f"{r.kld_p99:.4g}"
            top = f"{r.same_top:.2f} ± {r.same_top_err:.2f}%" if r.same_top is not None else "-"
        out.append([r.config, fmt_g(r.bits_per_value, 4), "-" if r.kv_mib is None else f"{r.kv_mib:g}",
                    fmt_pm(r.ppl, r.ppl_err), ratio, kld, p99, top, r.vs_above])
    return markdown(HEADERS, out)


NOTES = ("- bits/value: 16 x KV MiB / the f16 cache's KV MiB, both as llama.cpp logged them (counts boundary layers)\n"
         "- f16 (floor): a second f16 run against the stored f16 logits; the base stores log-probabilities quantized, "
         "so this is the smallest KLD the comparison can show (its mean is usually below the 6 decimals "
         "llama-perplexity prints; its p99 is not)\n"
         "- errors are one standard error as llama-perplexity reports them; \"≈ X\": the KLD differs from row X's by "
         "less than 2 combined standard errors (not shown to differ; errors combined as if independent, which is "
         "conservative for runs over the same tokens); \"≈1\" after a PPL ratio: within 2 errors of 1\n")


def report_markdown(sweep: PplSweep) -> str:
    m = sweep.meta
    build = m["build"]
    head = (f"# PPL and KL divergence vs an f16 cache: {Path(m['model']).name}\n\n"
            f"- text: {Path(m['text']).name} ({m['chunks']} chunks of {m['ctx']} tokens)\n"
            f"- command per config: `llama-perplexity {m['command_per_config']}` "
            f"(f16: `-f TEXT --kl-divergence-base BASE`)\n"
            f"- build: llama.cpp {build.get('llama_cpp')} + patches {', '.join(build.get('patches') or []) or '-'} "
            f"(build hash {build['build_hash']}); device: {m['device']}"
            + (f", {m['threads']} threads" if m.get("threads") else "") + f"; date: {m['date']}\n" + NOTES + "\n")
    return head + markdown_table(sweep.rows) + "\n"


def write_report(sweep: PplSweep, plot: bool = False) -> dict[str, Path]:
    rows = [r.to_dict() for r in sweep.rows]
    doc = {"meta": sweep.meta, "rows": rows, "failed": sweep.failed}
    paths = write_outputs(sweep.spec.out, STEM, report_markdown(sweep), rows, doc)
    if plot:
        from .plot import plot_ppl

        paths["png"] = plot_ppl(sweep.rows, sweep.spec.out / f"{STEM}.png",
                                title=f"{Path(sweep.meta['model']).name}, {sweep.meta['chunks']} x {sweep.meta['ctx']} tokens")
    sweep.paths = paths
    return paths


def base_cache_size() -> int:
    d = cache_dir() / "kld-base"
    return sum(p.stat().st_size for p in d.glob("*.kld")) if d.is_dir() else 0


__all__ = ["DEFAULT_CONFIGS", "ChunkProgress", "progress_of", "PplSpec", "PplRow", "Events", "PplSweep",
           "parse_configs", "perplexity_cmd", "run_sweep", "table_rows", "annotate", "markdown_table",
           "report_markdown", "write_report", "base_cache_size"]
