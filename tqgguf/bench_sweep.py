"""`tqgguf bench`: speed of K/V cache configs with the patched llama-bench (-fa 1), or with llama-batched-bench
(--batched: aggregate throughput of N parallel sequences, optionally as many as fit a memory budget).

Speed depends on the machine's state, so ratios are only taken within one invocation: whenever an invocation
measures anything, it measures f16 again, and each row's ratio is to the f16 measured in the same invocation (a row
resumed from an earlier invocation without its own f16 is marked). Results go to DIR/bench.jsonl (or batched.jsonl),
one record per config, as each finishes; a rerun skips configs already measured with the same settings.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from . import __version__
from .errors import EXIT_WARN, TqError
from .perplexity import CacheConfig
from .runinfo import X86_MACHINES, build_hash, build_summary, check_gpu_pairs, cpu_flags, cpuinfo_text, device, \
    file_sha256, manifest_of
from .sweep_store import Store, record_key
from .tables import differ, markdown, write_outputs
from .toolrun import stream, tail

DEFAULT_CONFIGS = "f16,q8_0,q4_0,turbo4,turbo3,turbo2,q8_0/turbo4,q8_0/turbo3,turbo4/turbo3,turbo4/turbo2+bv2"


# ---- parsing --------------------------------------------------------------------------------------


@dataclass
class SpeedRow:
    config: str
    test: str          # "pp512", "tg128"; batched: "pp128+tg16 x4"
    depth: int         # tokens in the cache before the test; batched: the number of parallel sequences
    avg_ts: float
    stddev_ts: float
    n_threads: int = 0
    extra: dict = field(default_factory=dict)
    ratio: float | None = None      # to f16, same test and depth, same invocation
    ratio_err: float | None = None
    ratio_sig: bool | None = None   # differs from 1 by more than 2 errors
    ratio_note: str = ""            # "*": the f16 reference is from another invocation

    def to_dict(self) -> dict:
        return asdict(self)


def _json_objects(text: str) -> Iterator[dict]:
    """The JSON objects of a tool's jsonl output, one per line; log lines and a line cut by a kill are skipped."""
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            yield d


def parse_bench_jsonl(config: str, text: str) -> list[SpeedRow]:
    """llama-bench -o jsonl: one object per test (pp or tg at a depth)."""
    rows = []
    for d in _json_objects(text):
        if "avg_ts" not in d:
            continue
        test = f"pp{d['n_prompt']}" if d.get("n_prompt") and not d.get("n_gen") else f"tg{d['n_gen']}"
        rows.append(SpeedRow(config, test, int(d.get("n_depth", 0)), float(d["avg_ts"]), float(d["stddev_ts"]),
                             int(d.get("n_threads", 0)),
                             {"cpu_info": d.get("cpu_info", ""), "gpu_info": d.get("gpu_info", ""),
                              "samples_ts": d.get("samples_ts")}))
    return rows


def pool_rows(rows: list[SpeedRow]) -> list[SpeedRow]:
    """One row per (config, test, depth), from rows measured several times (llama-bench run again for the same
    config, as in interleaved rounds): the mean and sample standard deviation of all their repetitions' tok/s
    (samples_ts), in the order the keys first appear. Rows without samples count as one sample of their average."""
    groups: dict[tuple[str, str, int], list[SpeedRow]] = {}
    for r in rows:
        groups.setdefault((r.config, r.test, r.depth), []).append(r)
    out = []
    for (config, test, depth), rs in groups.items():
        if len(rs) == 1:
            out.append(rs[0])
            continue
        samples = [float(x) for r in rs for x in (r.extra.get("samples_ts") or [r.avg_ts])]
        mean = sum(samples) / len(samples)
        sd = math.sqrt(sum((x - mean) ** 2 for x in samples) / (len(samples) - 1))  # (two rows: >= 2 samples)
        out.append(SpeedRow(config, test, depth, mean, sd, rs[0].n_threads,
                            {**rs[0].extra, "samples_ts": samples, "runs": len(rs)}))
    return out


def parse_batched_jsonl(config: str, text: str) -> list[SpeedRow]:
    """llama-batched-bench --output-format jsonl: one object per (pp, tg, pl). Three rows each: the aggregate
    speed over prompt and generation ("all"), prefill ("pp") and decode ("tg") tokens/s of all sequences."""
    rows = []
    for d in _json_objects(text):
        if "speed" not in d:
            continue
        base = f"pp{d['pp']}+tg{d['tg']}"
        ex = {"n_kv": d.get("n_kv"), "n_kv_max": d.get("n_kv_max"), "t": d.get("t")}
        for what, key in (("all", "speed"), ("pp", "speed_pp"), ("tg", "speed_tg")):
            rows.append(SpeedRow(config, f"{base} {what}", int(d["pl"]), float(d[key]), 0.0,
                                 int(d.get("n_threads", 0)), ex))
    return rows


def parse_batched_md(config: str, text: str) -> list[SpeedRow]:
    """The default Markdown table of llama-batched-bench (for logs without jsonl)."""
    rows = []
    for m in re.finditer(r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|"
                         r"\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|", text, re.M):
        pp, tg, pl, n_kv = (int(m.group(i)) for i in range(1, 5))
        base = f"pp{pp}+tg{tg}"
        for what, grp in (("all", 10), ("pp", 6), ("tg", 8)):
            rows.append(SpeedRow(config, f"{base} {what}", pl, float(m.group(grp)), 0.0, 0, {"n_kv": n_kv}))
    return rows


# ---- ratios ----------------------------------------------------------------------------------------


def add_ratios(rows: list[SpeedRow], run_of: dict[str, str] | None = None, ref: str = "f16") -> None:
    """Each row's ratio to the ref config's row of the same test and depth, with the error propagated from both
    standard deviations, and whether it differs from 1 by more than 2 errors. run_of maps config -> invocation id:
    a row whose ref was measured in another invocation gets ratio_note "*"."""
    by = {(r.config, r.test, r.depth): r for r in rows}
    for r in rows:
        b = by.get((ref, r.test, r.depth))
        if b is None or b.avg_ts <= 0:
            continue
        r.ratio = r.avg_ts / b.avg_ts
        rel = math.hypot(r.stddev_ts / r.avg_ts if r.avg_ts else 0.0, b.stddev_ts / b.avg_ts)
        r.ratio_err = r.ratio * rel
        r.ratio_sig = differ(r.ratio, r.ratio_err, 1.0, 0.0) if rel > 0 else None
        if run_of is not None and run_of.get(r.config) != run_of.get(ref):
            r.ratio_note = "*"


def _fmt_ratio(r: SpeedRow) -> str:
    if r.ratio is None:
        return "-"
    s = f"{r.ratio:.2f}" + (f" ± {r.ratio_err:.2f}" if r.ratio_err else "")
    if r.ratio_sig is False and r.config != "f16":
        s += " ≈1"
    return s + r.ratio_note


def bench_table(rows: list[SpeedRow]) -> str:
    out = [[r.config, r.test, str(r.depth), f"{r.avg_ts:.2f} ± {r.stddev_ts:.2f}", _fmt_ratio(r)] for r in rows]
    return markdown(["K/V", "test", "depth", "tok/s", "x f16"], out)


# ---- running ---------------------------------------------------------------------------------------


@dataclass
class BenchSpec:
    model: Path
    configs: list[CacheConfig]
    binary: Path
    out: Path
    depths: list[int] = field(default_factory=lambda: [0, 4096, 32768])
    n_prompt: int = 512
    n_gen: int = 128
    reps: int = 3
    threads: int | None = None
    n_gpu_layers: str | None = None
    extra: list[str] = field(default_factory=list)
    timeout: float | None = None
    # --batched
    batched: bool = False
    npl: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    ctx: int | None = None           # context per sequence (default: n_prompt + n_gen)
    mem: int | None = None           # bytes: run each config at the most sequences that fit
    mem_source: str = ""
    max_npl: int = 256

    @property
    def stem(self) -> str:
        return "batched" if self.batched else "bench"

    @property
    def seq_ctx(self) -> int:
        return self.ctx or (self.n_prompt + self.n_gen)


@dataclass
class Events:
    start: Callable[[str, int, int, int], None] = lambda label, i, n, tests: None
    test: Callable[[str, int], None] = lambda label, done: None
    done: Callable[[str, list], None] = lambda label, rows: None
    skip: Callable[[str], None] = lambda label: None
    fail: Callable[[str, str], None] = lambda label, message: None
    info: Callable[[str], None] = lambda msg: None


@dataclass
class BenchResult:
    spec: BenchSpec
    rows: list[SpeedRow]
    fits: dict[str, dict]
    failed: list[str]
    ran: list[str]
    skipped: list[str]
    meta: dict
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_WARN if self.failed else 0


def parse_list(text: str, what: str, minimum: int = 0) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise TqError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or any(v < minimum for v in vals):
        raise TqError(f"{what} needs integers >= {minimum}, got {text!r}")
    return sorted(dict.fromkeys(vals))


def bench_cmd(spec: BenchSpec, cfg: CacheConfig) -> list[str]:
    cmd = [str(spec.binary), "-m", str(spec.model), "-fa", "1", *cfg.args(), "-p", str(spec.n_prompt),
           "-n", str(spec.n_gen), "-d", ",".join(map(str, spec.depths)), "-r", str(spec.reps), "-o", "jsonl"]
    if spec.threads:
        cmd += ["-t", str(spec.threads)]
    if spec.n_gpu_layers is not None:
        cmd += ["-ngl", str(spec.n_gpu_layers)]
    return cmd + list(spec.extra)


def batched_cmd(spec: BenchSpec, cfg: CacheConfig, npl: list[int]) -> list[str]:
    # -c is the whole cache: max(npl) streams of the per-sequence context each
    cmd = [str(spec.binary), "-m", str(spec.model), "-fa", "on", *cfg.args(), "-c", str(spec.seq_ctx * max(npl)),
           "-npp", str(spec.n_prompt), "-ntg", str(spec.n_gen), "-npl", ",".join(map(str, npl)),
           "--output-format", "jsonl"]
    if spec.threads:
        cmd += ["-t", str(spec.threads)]
    if spec.n_gpu_layers is not None:
        cmd += ["-ngl", str(spec.n_gpu_layers)]
    return cmd + list(spec.extra)


def fit_sequences(model: Path, configs: list[CacheConfig], seq_ctx: int, budget: int) -> dict[str, dict]:
    """Per config: the most sequences of seq_ctx tokens whose weights + KV cache + compute margin fit the budget
    (`tqgguf check --fit slots`, one KV stream per sequence as llama-batched-bench allocates it)."""
    from . import kvcompat, kvmem
    from .gguf_check import load_facts
    from .gguf_read import GgufError

    try:
        _, facts = load_facts(model)
    except GgufError as e:
        raise TqError(f"{model}: {e}") from None
    base = kvmem.Runtime(ctx=seq_ctx, n_seq=1, unified=False)
    out = {}
    for c in configs:
        ek, ev, err = kvcompat.config_effective(facts, c.k, c.v, True)
        if err:
            out[c.label] = {"sequences": 0, "error": err}
            continue
        b = kvcompat.boundary_v(facts, ev, c.boundary_n, c.boundary_type)
        if b.error:
            out[c.label] = {"sequences": 0, "error": f"boundary type {c.boundary_type}: {b.error}"}
            continue
        f = kvmem.fit(facts, base, ek, ev, budget, "slots", v_layers=None if b.note else b.v_layers)
        out[c.label] = {"sequences": f.value, "need_mib": round(f.need / kvmem.MIB, 1), "capped": f.capped,
                        "note": b.note or ""}
    return out


def check_spec(spec: BenchSpec) -> None:
    """Bad input as one-line errors, before anything runs."""
    check_gpu_pairs(spec.binary, spec.n_gpu_layers, spec.configs)
    if not spec.model.exists():
        raise TqError(f"model file not found: {spec.model}", "give a GGUF with -m")
    if not spec.model.is_file():
        raise TqError(f"not a file: {spec.model}")
    with open(spec.model, "rb") as f:
        if f.read(4) != b"GGUF":
            raise TqError(f"{spec.model} is not a GGUF file", "check it with `tqgguf check`")
    if spec.n_prompt < 0 or spec.n_gen < 0 or (spec.n_prompt == 0 and spec.n_gen == 0):
        raise TqError("-p and -n must be >= 0 and not both 0")
    if spec.reps < 1:
        raise TqError(f"-r must be >= 1, got {spec.reps}")


# With AVX512-FP16, ggml-cpu's f16 dot product and accumulation (ggml_vec_dot_f16, ggml_vec_mad_f16) run their SIMD
# loop over whole steps of GGML_F16_STEP = 128 values only; the rest of a row goes through the scalar tail. A head
# dim of 64 is all tail, and there an f16 cache decoded 3.1-3.5x slower than the turbo types on SmolLM2, against
# 0.98-1.23x at head dim 128 (bench/results/cpu-xeon-0055/). That is upstream's f16 path, not the turbo cache.
F16_STEP_AVX512FP16 = 128


def f16_reference_note(manifest: dict | None, n_gpu_layers: str | None, head_dims: set[int],
                       cpuinfo: str | None) -> str | None:
    """A note for the report where f16, the reference of every ratio, decodes on upstream's scalar path: a run on
    the CPU (no GPU backend, or -ngl 0), a native x86 build on a CPU with AVX512-FP16 (/proc/cpuinfo's text), and a
    K or V head dim that is not a multiple of 128."""
    from .kvcompat import gpu_offload

    m = manifest or {}
    if gpu_offload(m.get("backends"), n_gpu_layers) or "-DGGML_NATIVE=ON" not in (m.get("cmake_args") or []):
        return None
    if str((m.get("compiler") or {}).get("machine")).lower() not in X86_MACHINES:
        return None
    if "avx512_fp16" not in (cpu_flags(cpuinfo) or set()):
        return None
    odd = sorted(d for d in head_dims if d % F16_STEP_AVX512FP16)
    if not odd:
        return None
    return (f"f16 decode on this CPU runs ggml's scalar f16 code for head dim {'/'.join(map(str, odd))}: with "
            f"AVX512-FP16 its f16 dot product works in steps of {F16_STEP_AVX512FP16} values, so decode ratios to "
            "f16 overstate what a smaller cache gains (compare with the q8_0 row; bench/results/cpu-xeon-0055/ in "
            "tqgguf's repo)")


def _head_dims(model: Path) -> set[int]:
    """The K and V head dims of the model's KV-cache layers (empty where the file cannot be read)."""
    from .gguf_check import load_facts
    from .gguf_read import GgufError

    try:
        _, facts = load_facts(model)
    except (GgufError, OSError, ValueError):  # the note is optional; llama-bench reports a bad model itself
        return set()
    return {d for ly in facts.kv_layers for d in (ly.head_dim_k, ly.head_dim_v)}


def run_bench_sweep(spec: BenchSpec, ev: Events | None = None) -> BenchResult:
    ev = ev or Events()
    check_spec(spec)
    notes = [n for n in [f16_reference_note(manifest_of(spec.binary), spec.n_gpu_layers, _head_dims(spec.model),
                                            cpuinfo_text())] if n]
    for n in notes:
        ev.info("note: " + n)
    f16 = CacheConfig("f16", "f16")
    configs = [f16] + [c for c in spec.configs if c.label != "f16"]
    fits: dict[str, dict] = {}
    npl_of: dict[str, list[int]] = {}
    if spec.batched:
        if spec.mem is not None:
            fits = fit_sequences(spec.model, configs, spec.seq_ctx, spec.mem)
            for c in configs:
                n = min(fits[c.label]["sequences"], spec.max_npl)
                npl_of[c.label] = sorted({x for x in spec.npl if x <= n} | ({n} if n > 0 else set()))
        else:
            npl_of = {c.label: list(spec.npl) for c in configs}
    spec.out.mkdir(parents=True, exist_ok=True)
    store = Store.open(spec.out / f"{spec.stem}.jsonl")
    common = {"kind": spec.stem, "model_sha256": file_sha256(spec.model), "build": build_hash(spec.binary),
              "p": spec.n_prompt, "n": spec.n_gen, "threads": spec.threads, "ngl": spec.n_gpu_layers,
              "extra": spec.extra}
    if spec.batched:
        common |= {"seq_ctx": spec.seq_ctx}
    else:
        common |= {"depths": spec.depths, "r": spec.reps}

    def key_of(c: CacheConfig) -> str:
        f = common | {"config": c.label}
        if spec.batched:
            f["npl"] = npl_of[c.label]
        return record_key(f)

    run_id = uuid.uuid4().hex[:12]
    meta_base = {"device": device(spec.binary, spec.n_gpu_layers), "build": build_summary(spec.binary),
                 "model": str(spec.model), "tqgguf": __version__, "run_id": run_id}
    todo = [c for c in configs if store.get(key_of(c)) is None and (not spec.batched or npl_of[c.label])]
    if todo and f16 not in todo:
        todo.insert(0, f16)  # ratios only within one invocation: measure the reference again
    ran, skipped, failed = [], [], []
    for i, c in enumerate(configs):
        if spec.batched and not npl_of[c.label]:
            failed.append(c.label)
            ev.fail(c.label, f"{c.label}: not even one sequence of {spec.seq_ctx} tokens fits the budget")
            continue
        if c not in todo:
            skipped.append(c.label)
            ev.skip(c.label)
            continue
        if spec.batched:
            cmd = batched_cmd(spec, c, npl_of[c.label])
            n_tests = len(npl_of[c.label])
        else:
            cmd = bench_cmd(spec, c)
            n_tests = len(spec.depths) * ((spec.n_prompt > 0) + (spec.n_gen > 0))
        ev.start(c.label, i, len(configs), n_tests)
        seen = {"n": 0}

        def on_output(piece: str, which: str, label: str = c.label) -> None:
            if which == "stdout":
                seen["n"] += piece.count("\n{") + (1 if piece.startswith("{") else 0)
                ev.test(label, seen["n"])

        t0 = time.time()
        tool = "llama-batched-bench" if spec.batched else "llama-bench"
        run = stream(cmd, f"{tool} for {c.label}", on_output, spec.timeout)
        log_dir = spec.out / "logs"
        log_dir.mkdir(exist_ok=True)
        (log_dir / (spec.stem + "-" + re.sub(r"[^A-Za-z0-9_.+-]", "_", c.label) + ".log")).write_text(
            "# " + " ".join(cmd) + "\n" + run.log)
        rows = (parse_batched_jsonl if spec.batched else parse_bench_jsonl)(c.label, run.stdout)
        if run.returncode != 0 or not rows:
            why = f"exit {run.returncode}" if run.returncode != 0 else "no results"
            msg = f"{tool} failed for {c.label} ({why}): {tail(run.stderr or run.log)}"
            if c.label == "f16":
                raise TqError(msg, f"log: {log_dir}", code=EXIT_WARN)
            failed.append(c.label)
            ev.fail(c.label, msg)
            continue
        fields = common | {"config": c.label}
        if spec.batched:
            fields["npl"] = npl_of[c.label]
        meta = meta_base | {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "command": cmd,
                            "seconds": run.seconds}
        store.append(fields, {"rows": [r.to_dict() for r in rows]}, meta)
        ran.append(c.label)
        ev.done(c.label, rows)

    rows: list[SpeedRow] = []
    run_of: dict[str, str] = {}
    for c in configs:
        rec = store.get(key_of(c)) if (not spec.batched or npl_of[c.label]) else None
        if rec is None:
            continue
        run_of[c.label] = rec["meta"].get("run_id", "")
        rows += [SpeedRow(**r) for r in rec["result"]["rows"]]
    add_ratios(rows, run_of)
    meta = meta_base | {"date": time.strftime("%Y-%m-%d"), "p": spec.n_prompt, "n": spec.n_gen,
                        "threads": spec.threads, "notes": notes}
    if spec.batched:
        meta |= {"seq_ctx": spec.seq_ctx, "npl": npl_of, "mem_mib": round(spec.mem / 2**20) if spec.mem else None,
                 "mem_source": spec.mem_source}
    else:
        meta |= {"depths": spec.depths, "reps": spec.reps}
    return BenchResult(spec, rows, fits, failed, ran, skipped, meta)


def batched_table(res: BenchResult) -> str:
    """One line per (config, sequences): aggregate tok/s over prompt and generation, prefill and decode tok/s of
    all sequences, and the aggregate's ratio to f16 at the same number of sequences."""
    by: dict[tuple[str, int], dict[str, SpeedRow]] = {}
    for r in res.rows:
        by.setdefault((r.config, r.depth), {})[r.test.rsplit(" ", 1)[1]] = r
    head = ["K/V", "sequences", "tok/s (all)", "prefill tok/s", "decode tok/s", "x f16 (all)"]
    if res.fits:
        head.append("fits the budget")
    out = []
    for (cfg, pl), d in by.items():
        a = d.get("all")
        line = [cfg, str(pl), f"{a.avg_ts:.1f}" if a else "-", f"{d['pp'].avg_ts:.1f}" if "pp" in d else "-",
                f"{d['tg'].avg_ts:.1f}" if "tg" in d else "-",
                (f"{a.ratio:.2f}{a.ratio_note}" if a and a.ratio is not None else "-")]
        if res.fits:
            f = res.fits.get(cfg, {})
            line.append(f"max {f.get('sequences')}" + (" (this row)" if f.get("sequences") == pl else ""))
        out.append(line)
    return markdown(head, out)


def max_fit_summary(res: BenchResult) -> str:
    """With a memory budget: each config at the most sequences that fit, against f16 at its own maximum."""
    if not res.fits:
        return ""
    by = {(r.config, r.depth): r for r in res.rows if r.test.endswith(" all")}
    f16n = res.fits.get("f16", {}).get("sequences", 0)
    f16r = by.get(("f16", min(f16n, res.spec.max_npl)))
    out = []
    for cfg, f in res.fits.items():
        fit = f.get("sequences", 0)
        n = min(fit, res.spec.max_npl)
        r = by.get((cfg, n))
        out.append([cfg, str(fit) + (f" ({f['capped']})" if f.get("capped") else ""),
                    str(n) + (" (--max-npl)" if n < fit else ""), f"{r.avg_ts:.1f}" if r else "-",
                    f"{r.avg_ts / f16r.avg_ts:.2f}" if r and f16r and f16r.avg_ts else "-", f.get("note", "")])
    return markdown(["K/V", "sequences that fit", "run with", "tok/s (all)", "x f16 (f16 at its own)", "note"], out)


def report_markdown(res: BenchResult) -> str:
    m, b = res.meta, res.meta["build"]
    if res.spec.batched:
        what = (f"llama-batched-bench -fa on -npp {m['p']} -ntg {m['n']} -c {m['seq_ctx']} x max(npl)"
                + (f" (budget {m['mem_mib']} MiB from {m['mem_source']})" if m.get("mem_mib") else ""))
        table = batched_table(res)
        fit = max_fit_summary(res)
        if fit:
            table += "\n\nAt the most sequences that fit the budget (weights + KV + compute margin, as `tqgguf check "\
                     "--fit slots` sizes them):\n\n" + fit
    else:
        what = f"llama-bench -fa 1 -p {m['p']} -n {m['n']} -d {','.join(map(str, m['depths']))} -r {m['reps']}"
        table = bench_table(res.rows)
    if m.get("threads"):
        what += f" -t {m['threads']}"
    return (f"# Speed of K/V cache configs: {Path(m['model']).name}\n\n- command per config: `{what}`\n"
            f"- build: llama.cpp {b.get('llama_cpp')} + patches {', '.join(b.get('patches') or []) or '-'} "
            f"(build hash {b['build_hash']}); device: {m['device']}; date: {m['date']}\n"
            "- tok/s: mean ± standard deviation over the repetitions; x f16: ratio to f16 measured in the same "
            "invocation (\"*\": f16 from another invocation), with the error of both; \"≈1\": within 2 errors of 1\n"
            + "".join(f"- note: {n}\n" for n in m.get("notes") or []) + "\n" + table + "\n")


def write_report(res: BenchResult, plot: bool = False) -> dict[str, Path]:
    rows = [r.to_dict() | {"extra": json.dumps(r.extra)} for r in res.rows]
    doc = {"meta": res.meta, "rows": [r.to_dict() for r in res.rows], "fits": res.fits, "failed": res.failed}
    paths = write_outputs(res.spec.out, res.spec.stem, report_markdown(res), rows, doc)
    if plot:
        from .plot import plot_batched, plot_bench

        png = res.spec.out / f"{res.spec.stem}.png"
        name = Path(res.meta["model"]).name
        paths["png"] = plot_batched(res.rows, png, name) if res.spec.batched else plot_bench(res.rows, png, name)
    res.paths = paths
    return paths
