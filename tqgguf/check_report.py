"""`tqgguf check`: integrity, shape facts, per-type verdicts, KV memory, fit and a recommendation, as one report."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import advice, kvcompat, kvmem
from .errors import EXIT_ERROR, EXIT_OK, EXIT_WARN
from .gguf_check import ModelFacts, load_facts
from .kvmem import GIB, MIB, Runtime

DEFAULT_CONFIGS = ("f16", "q8_0", "q4_0", "turbo4", "turbo3", "turbo2",
                   "q8_0/turbo4", "q8_0/turbo3", "q8_0/turbo2", "turbo4/turbo3", "turbo4/turbo2")


@dataclass
class CheckOptions:
    ctx: int | None = None          # -c; None: the model's training context (llama-server's -c 0)
    parallel: int = 4               # -np (llama-server's default: 4 slots)
    unified: bool = True            # --kv-unified (llama-server's default with automatic slots)
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool = True
    configs: tuple[str, ...] = DEFAULT_CONFIGS
    mem: int | None = None          # budget in bytes
    mem_source: str = ""
    margin: int | None = None       # bytes; None: kvmem.compute_margin
    fit: str = "ctx"                # ctx | slots


def _mib(b: int) -> float:
    return round(b / MIB, 2)


def _v_layers(facts: ModelFacts, flash_attn: bool, cfg: str) -> tuple[dict, dict[int, str] | None]:
    """A config as written (`K/V`, `T`, with `+bvN[:TYPE]` for the boundary-layer V policy): its row's first fields
    (an error when llama.cpp would refuse it) and the V type of each layer where the boundary policy changes it."""
    from .perplexity import CacheConfig

    c = CacheConfig.parse(cfg)
    row = {"config": c.label, "k": c.k, "v": c.v}
    ek, ev, err = kvcompat.config_effective(facts, c.k, c.v, flash_attn)
    if err:
        return row | {"supported": False, "error": err}, None
    row |= {"supported": True, "effective_k": ek, "effective_v": ev}
    if not c.boundary_n:
        return row, None
    b = kvcompat.boundary_v(facts, ev, c.boundary_n, c.boundary_type, flash_attn)
    if b.error:
        return row | {"supported": False, "error": f"boundary type {c.boundary_type}: {b.error}"}, None
    row |= {"boundary_layers": b.layers, "boundary_type": b.type} | ({"note": b.note} if b.note else {})
    return row, (None if b.note else b.v_layers)


def _config_row(facts: ModelFacts, rt: Runtime, cfg: str,
                f16_total: int | None) -> tuple[dict, dict[int, str] | None]:
    """The memory row of a config, and its boundary layers' V types (for the fit)."""
    row, v_layers = _v_layers(facts, rt.flash_attn, cfg)
    if not row["supported"]:
        return row, None
    size = kvmem.kv_size(facts, rt, row["effective_k"], row["effective_v"], v_layers)
    row |= {"k_bytes": size.k_bytes, "v_bytes": size.v_bytes, "k_mib": _mib(size.k_bytes),
            "v_mib": _mib(size.v_bytes), "total_mib": _mib(size.total), "bits_per_value": round(size.bits_per_value, 3),
            "caches": [c.__dict__ for c in size.caches]}
    if f16_total and size.total:
        row["vs_f16"] = round(f16_total / size.total, 2)
    return row, v_layers


def build_report(path: Path, opts: CheckOptions) -> dict:
    """Everything `check` prints. Raises gguf_read.GgufError for a file that cannot be used."""
    g, facts = load_facts(path)
    ctx = opts.ctx if opts.ctx else facts.n_ctx_train
    rt = Runtime(ctx=ctx, n_seq=opts.parallel, unified=opts.unified, n_batch=opts.n_batch, n_ubatch=opts.n_ubatch,
                 flash_attn=opts.flash_attn)
    cells, streams, n_ubatch = kvmem.cells(facts, rt)
    warnings: list[str] = []
    if not facts.arch_known:
        warnings.append(facts.notes[0])
    verdicts = {t: {s: kvcompat.verdict(facts, s, t, opts.flash_attn).to_dict() for s in ("K", "V")}
                for t in kvcompat.REPORT_TYPES}
    if facts.kv_layers:
        bad: dict[tuple[str, str], list[str]] = {}   # (status, reason) -> ["K turbo4", ...]
        for t in kvcompat.TURBO:
            for s in ("K", "V"):
                vd = verdicts[t][s]
                if vd["status"] in ("falls back", "unsupported"):
                    bad.setdefault((vd["status"], vd["reason"]), []).append(f"{s} {t}")
        for (status, reason), which in bad.items():
            warnings.append(f"{', '.join(which)}: {status} ({reason})")
    else:
        warnings.append(f"{facts.arch} has no attention KV cache: cache types make no difference")
    if facts.kv_layers and cells > facts.n_ctx_train:
        warnings.append(f"{cells} cells per sequence exceed the model's training context ({facts.n_ctx_train}): "
                        "llama.cpp warns of a possible context overflow")
    if kvcompat.no_fa_reason(facts):
        warnings.append(kvcompat.no_fa_reason(facts))
    f16 = kvmem.kv_size(facts, rt, "f16", "f16").total if facts.kv_layers else None
    sized = [_config_row(facts, rt, c, f16) for c in opts.configs] if facts.kv_layers else []
    rows = [row for row, _ in sized]

    fit = None
    fits_fn = None
    if opts.mem is not None:
        margin = opts.margin if opts.margin is not None else kvmem.compute_margin(facts, rt)
        fits_out = []
        for row, v_layers in sized:
            if not row["supported"]:
                continue
            f = kvmem.fit(facts, rt, row["effective_k"], row["effective_v"], opts.mem, opts.fit, opts.margin, v_layers)
            fits_out.append(f.__dict__ | {"config": row["config"], "need_mib": _mib(f.need)})

        def fits_fn(cfg: str) -> bool:
            k, v = advice.split(cfg)
            ek, ev, err = kvcompat.config_effective(facts, k, v, opts.flash_attn)
            if err:
                return False
            m = opts.margin if opts.margin is not None else kvmem.compute_margin(facts, rt)
            return facts.weights_bytes + kvmem.kv_size(facts, rt, ek, ev).total + m <= opts.mem
        fit = {"budget_mib": _mib(opts.mem), "source": opts.mem_source, "what": opts.fit,
               "weights_mib": _mib(facts.weights_bytes), "margin_mib_at_ctx": _mib(margin),
               "margin_rule": "given" if opts.margin is not None else
               "4 B x n_ubatch x (n_vocab + 3 n_ff + 4 n_embd) + f16 mask + 512 MiB runtime",
               "results": fits_out}
    adv = advice.recommend(facts, opts.flash_attn, fits_fn)
    if adv.rule == "fit-none":
        warnings.append(f"no K/V pair fits {opts.mem / MIB:.0f} MiB at -c {ctx} with {opts.parallel} slot(s): "
                        "lower --ctx or --parallel, or raise the budget")
    elif adv.rule == "fit":
        warnings.append(adv.reason)
    return {
        "file": {"path": str(g.path), "gguf_version": g.version, "size": g.file_size, "tensors": len(g.tensors),
                 "alignment": g.alignment, "integrity": "ok"},
        "facts": facts.to_dict(),
        "runtime": {"ctx": ctx, "parallel": opts.parallel, "unified": opts.unified, "n_batch": opts.n_batch,
                    "n_ubatch": n_ubatch, "flash_attn": opts.flash_attn, "cells_per_stream": cells,
                    "streams": streams},
        "verdicts": verdicts,
        "memory": rows,
        "fit": fit,
        "recommendation": adv.to_dict(),
        "warnings": warnings,
        "exit_code": EXIT_WARN if warnings else EXIT_OK,
    }


def error_report(path: Path, message: str) -> dict:
    return {"file": {"path": str(path), "integrity": "error"}, "error": message, "exit_code": EXIT_ERROR}


# ---- text ----------------------------------------------------------------------------------------


def _layers(idx: list[int]) -> str:
    return kvcompat.layer_list(idx) or "none"


def _heads(f: dict) -> str:
    def one(xs: list[int]) -> str:
        return "/".join(map(str, xs)) or "-"
    gqa = f"GQA {f['gqa_ratio']:g}:1" if f["gqa_ratio"] else "no GQA"
    return (f"n_head {one(f['n_head'])}, n_head_kv {one(f['n_head_kv'])} ({gqa}); head dim K {one(f['head_dim_k'])}, "
            f"V {one(f['head_dim_v'])}")


def format_text(r: dict) -> str:
    f, fl, rt = r["facts"], r["file"], r["runtime"]
    out = [f"{Path(fl['path']).name}: {f['arch']}{' (' + f['name'] + ')' if f['name'] else ''}, {f['n_layer']} layers, "
           f"{f['weights_bytes'] / MIB:.1f} MiB of weights in {fl['tensors']} tensors, GGUF v{fl['gguf_version']}: "
           "file OK"]
    kv = f["kv_layers"]
    if kv:
        swa = (f"; sliding window {f['n_swa']} ({f['swa_type']}) on layers {_layers(f['swa_layers'])}"
               if f["swa_layers"] else "; all full attention")
        out.append(f"  KV cache on {len(kv)} of {f['n_layer']} layers ({_layers(kv)}){swa}{'; MLA' if f['mla'] else ''}")
        out.append(f"  {_heads(f)}")
    for n in f["notes"]:
        if f["arch_in_table"] or n != f["notes"][0]:
            out.append(f"  note: {n}")
    if kv:
        out.append("")
        no_v = all(sides["V"]["status"] == "no cache" for sides in r["verdicts"].values())
        out.append("cache types (K):" if no_v else "cache types (K | V):")
        for t, sides in r["verdicts"].items():
            k, v = sides["K"], sides["V"]
            vtxt = "" if no_v else " | same as K" if (v["status"], v["reason"]) == (k["status"], k["reason"]) else \
                f" | {v['status']}: {v['reason']}"
            out.append(f"  {t:<7} {k['status']}: {k['reason']}{vtxt}")
        if no_v:
            out.append(f"  V: {next(iter(r['verdicts'].values()))['V']['reason']}")
        mode = "unified" if rt["unified"] else "one stream per slot"
        out.append("")
        out.append(f"KV memory at -c {rt['ctx']}, {rt['parallel']} slot(s), {mode}: {rt['streams']} x "
                   f"{rt['cells_per_stream']} cells (flash attention {'on' if rt['flash_attn'] else 'off'}):")
        w = max([14] + [len(row["config"]) for row in r["memory"]])
        out.append(f"  {'K/V':<{w}} {'K MiB':>10} {'V MiB':>10} {'total MiB':>10} {'bits/val':>9}  vs f16")
        for row in r["memory"]:
            if not row["supported"]:
                out.append(f"  {row['config']:<{w}} unsupported: {row['error']}")
                continue
            eff = f"{row['effective_k']}/{row['effective_v']}"
            fb = f"  (runs as {eff})" if (row["effective_k"], row["effective_v"]) != (row["k"], row["v"]) else ""
            if row.get("note"):
                fb += f"  ({row['note']})"
            elif row.get("boundary_layers"):
                fb += f"  (V of layers {_layers(row['boundary_layers'])} at {row['boundary_type']})"
            ratio = row.get("vs_f16")
            rtxt = "-" if not ratio or row["config"] == "f16" else f"{ratio:.1f}x smaller"
            out.append(f"  {row['config']:<{w}} {row['k_mib']:>10.2f} {row['v_mib']:>10.2f} {row['total_mib']:>10.2f} "
                       f"{row['bits_per_value']:>9.2f}  {rtxt}{fb}")
    fit = r["fit"]
    if fit:
        what = "largest -c" if fit["what"] == "ctx" else f"most slots of {rt['ctx']} tokens"
        out.append("")
        out.append(f"fit in {fit['budget_mib'] / 1024:.2f} GiB{' (' + fit['source'] + ')' if fit['source'] else ''}: "
                   f"weights {fit['weights_mib']:.0f} MiB + KV + margin ({fit['margin_rule']}; "
                   f"{fit['margin_mib_at_ctx']:.0f} MiB at -c {rt['ctx']}); {what}:")
        for x in fit["results"]:
            val = "nothing fits" if x["value"] == 0 else f"{x['value']}"
            cap = f"  (capped by {x['capped']})" if x["capped"] else ""
            out.append(f"  {x['config']:<{max([14] + [len(y['config']) for y in fit['results']])}} {val:>12}  "
                       f"needs {x['need_mib'] / 1024:.2f} GiB{cap}")
    rec = r["recommendation"]
    out.append("")
    if rec["config"]:
        out.append(f"recommendation: -ctk {rec['k']} -ctv {rec['v']}: {rec['reason']}")
    else:
        out.append(f"recommendation: none: {rec['reason']}")
    for n in rec["notes"]:
        out.append(f"  note: {n}")
    for w in r["warnings"]:
        out.append(f"warning: {w}")
    return "\n".join(out)


def parse_size(text: str) -> int:
    """'24GiB', '24G', '1.5 GB', '800MiB', '123456' (bytes) -> bytes (binary units for G/M/K)."""
    s = text.strip().lower().replace(" ", "")
    units = [("gib", GIB), ("gb", GIB), ("g", GIB), ("mib", MIB), ("mb", MIB), ("m", MIB), ("kib", 1024),
             ("kb", 1024), ("k", 1024), ("b", 1)]
    for suf, mult in units:
        if s.endswith(suf):
            num = s[:-len(suf)]
            break
    else:
        num, mult = s, 1
    try:
        val = float(num)
    except ValueError:
        raise ValueError(f"cannot read the size {text!r} (examples: 24GiB, 800MiB)") from None
    if val <= 0:
        raise ValueError(f"size must be positive, got {text!r}")
    return int(val * mult)


