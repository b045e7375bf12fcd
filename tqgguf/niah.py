"""`tqgguf niah`: long-context retrieval (needle in a haystack) per K/V cache config, through the patched server.

For each config, `tqgguf serve`'s machinery starts llama-server (checked before launch, verified from its log:
K/V types, boundary layers, flash attention), then for each context length and depth a prompt is built: filler
text cut to the length in the model's own tokens (the server's /tokenize), with one needle sentence
("The secret passphrase is amber-4721.") planted at the depth (snapped to a sentence end), and a question after it.
The answer is generated at temperature 0 and scored by whether it contains the passphrase (case and punctuation
ignored). Needles depend only on (seed, context, depth, trial), so every config answers the same questions and the
f16 row is the reference. Each answer is appended to DIR/niah.jsonl: a rerun skips what is done.
"""

from __future__ import annotations

import math
import random
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import __version__
from .errors import EXIT_WARN, TqError
from .perplexity import CacheConfig
from .runinfo import build_hash, build_summary, device, file_sha256
from .sweep_store import Store, record_key
from .tables import markdown, write_outputs

DEFAULT_CONFIGS = "f16,q8_0,turbo4,turbo3,q8_0/turbo4,turbo4/turbo2+bv2"
STEM = "niah"
QUESTION = ("What is the secret passphrase mentioned in the text above? "
            "Answer with the passphrase only.")
# the answer is begun for the model (small models then complete it rather than paraphrase the question)
ANSWER_PREFIX = "The secret passphrase is"
PROMPT_VERSION = 1  # part of the store key: a changed prompt is measured anew
WORDS = ("amber", "cobalt", "falcon", "harbor", "juniper", "lantern", "marble", "nectar", "orchid", "pepper",
         "quartz", "raven", "saffron", "thistle", "velvet", "willow")


@dataclass
class Needle:
    passphrase: str

    @property
    def sentence(self) -> str:
        return f"The secret passphrase is {self.passphrase}."

    def number_in(self, answer: str) -> bool:
        """Partial credit: the passphrase's number appears (small models often drop the word)."""
        return self.passphrase.rsplit("-", 1)[1] in re.sub(r"[^0-9]", " ", answer).split()

    def found_in(self, answer: str) -> bool:
        norm = lambda s: re.sub(r"[^a-z0-9]", "", s.lower())  # noqa: E731
        return norm(self.passphrase) in norm(answer)


def make_needle(seed: int, ctx: int, depth: int, trial: int) -> Needle:
    rng = random.Random(f"{seed}/{ctx}/{depth}/{trial}")
    return Needle(f"{rng.choice(WORDS)}-{rng.randrange(1000, 10000)}")


def split_at_sentence(text: str, window: int = 300) -> tuple[str, str]:
    """Cut text at the last sentence end (". ", "\\n") within `window` characters of its end."""
    tail = text[-window:]
    cut = max(tail.rfind(". "), tail.rfind(".\n"), tail.rfind("\n"))
    if cut < 0:
        return text, ""
    i = len(text) - len(tail) + cut + 1
    return text[:i], text[i:]


@dataclass
class NiahSpec:
    model: Path
    configs: list[CacheConfig]
    filler: Path
    out: Path
    ctxs: list[int] = field(default_factory=lambda: [4096, 8192])
    depths: list[int] = field(default_factory=lambda: [0, 25, 50, 75, 100])
    trials: int = 1
    seed: int = 0
    n_predict: int = 24
    threads: int | None = None
    n_gpu_layers: str | None = None
    backends: list[str] = field(default_factory=lambda: ["cpu"])
    extra: list[str] = field(default_factory=list)
    startup_timeout: float = 600.0
    request_timeout: float = 1800.0


@dataclass
class Events:
    start: Callable[[str, int], None] = lambda label, cells: None
    server: Callable[[str, dict], None] = lambda label, effective: None
    answer: Callable[[str, dict], None] = lambda label, result: None
    skip: Callable[[str], None] = lambda label: None
    fail: Callable[[str, str], None] = lambda label, message: None
    info: Callable[[str], None] = lambda msg: None


@dataclass
class NiahResult:
    spec: NiahSpec
    cells: list[dict]          # config, ctx, depth, hits, trials, accuracy
    totals: list[dict]         # per config: hits, trials, accuracy, interval
    records: list[dict]
    failed: list[str]
    meta: dict
    paths: dict[str, Path] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        return EXIT_WARN if self.failed else 0


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a proportion (honest for small n and for 0 or n hits)."""
    if n == 0:
        return 0.0, 1.0
    p = hits / n
    d = 1 + z * z / n
    c = (p + z * z / (2 * n)) / d
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


class Haystack:
    """Prompts of a given length in tokens, from the filler's tokens (as the running server tokenizes them)."""

    def __init__(self, client, filler_text: str, max_tokens: int):
        self.client = client
        # ~3 characters per token is conservative for English BPE vocabularies; take enough text
        text = filler_text
        while len(text) < 5 * max_tokens:
            text += "\n\n" + filler_text
        self.tokens = client.tokenize(text[: 6 * max_tokens + 1000])
        if len(self.tokens) < max_tokens:
            raise TqError(f"the filler text has only {len(self.tokens)} tokens, {max_tokens} needed")

    def prompt(self, ctx: int, depth: int, needle: Needle, n_predict: int) -> tuple[str, int]:
        """(prompt, its length in tokens) of at most ctx - n_predict tokens with the needle at depth %."""
        budget = ctx - n_predict
        n_fill = budget - 48
        for _ in range(4):
            d = round(n_fill * depth / 100)
            before, moved = split_at_sentence(self.client.detokenize(self.tokens[:d])) if d else ("", "")
            after = moved + self.client.detokenize(self.tokens[d:n_fill]) if n_fill > d else moved
            doc = (before.rstrip() + " " + needle.sentence + " " + after.lstrip()).strip()
            prompt = self.client.apply_template([{"role": "user", "content": doc + "\n\n" + QUESTION}]) + ANSWER_PREFIX
            n = len(self.client.tokenize(prompt, add_special=True))
            if n <= budget:
                return prompt, n
            n_fill -= n - budget + 4
        raise TqError(f"could not fit a prompt into {budget} tokens")


def _server_ctx(spec: NiahSpec) -> int:
    need = max(spec.ctxs)
    return -(-need // 256) * 256


def check_spec(spec: NiahSpec) -> None:
    """Bad input as one-line errors, before anything runs."""
    if not spec.model.exists():
        raise TqError(f"model file not found: {spec.model}", "give a GGUF with -m")
    if not spec.model.is_file():
        raise TqError(f"not a file: {spec.model}", "give a GGUF with -m")
    if not spec.filler.is_file():
        raise TqError(f"filler text not found: {spec.filler}")
    if min(spec.ctxs) < 256:
        raise TqError("--ctx values must be >= 256")
    if any(not 0 <= d <= 100 for d in spec.depths):
        raise TqError("--depths are percentages, 0..100")


def run_niah(spec: NiahSpec, ev: Events | None = None) -> NiahResult:
    from .client import Client
    from .serve import StopRequest, Ui, find_server, make_request, start

    ev = ev or Events()
    check_spec(spec)
    binary = find_server(spec.backends)
    f16 = CacheConfig("f16", "f16")
    configs = [f16] + [c for c in spec.configs if c.label != "f16"]
    spec.out.mkdir(parents=True, exist_ok=True)
    store = Store.open(spec.out / f"{STEM}.jsonl")
    common = {"kind": "niah", "prompt": PROMPT_VERSION, "model_sha256": file_sha256(spec.model), "filler_sha256": file_sha256(spec.filler),
              "build": build_hash(binary), "seed": spec.seed, "n_predict": spec.n_predict, "ngl": spec.n_gpu_layers,
              "extra": spec.extra}
    dev = device(binary, spec.n_gpu_layers)
    meta_base = {"device": dev, "build": build_summary(binary), "model": str(spec.model), "tqgguf": __version__}
    cells = [(ctx, depth, t) for ctx in spec.ctxs for depth in spec.depths for t in range(spec.trials)]

    def key(c: CacheConfig, ctx: int, depth: int, t: int) -> str:
        return record_key(common | {"config": c.label, "ctx": ctx, "depth": depth, "trial": t})

    filler_text = spec.filler.read_text(errors="replace")
    failed: list[str] = []
    for c in configs:
        todo = [cell for cell in cells if store.get(key(c, *cell)) is None]
        if not todo:
            ev.skip(c.label)
            continue
        ev.start(c.label, len(todo))
        extra = list(spec.extra)
        if spec.threads:
            extra += ["-t", str(spec.threads)]
        log_dir = spec.out / "logs"
        req = make_request(spec.model, c.k, c.v, c.boundary_n, c.boundary_type, None, ctx=_server_ctx(spec),
                           parallel=1, n_gpu_layers=spec.n_gpu_layers, host="127.0.0.1", port="auto", extra=extra,
                           log_file=(log_dir / f"niah-{re.sub(r'[^A-Za-z0-9_.+-]', '_', c.label)}.log").resolve(),
                           backends=spec.backends, startup_timeout=spec.startup_timeout)
        try:
            server, running = start(req, Ui(), StopRequest())
        except TqError as e:
            if c.label == "f16":
                raise
            failed.append(c.label)
            ev.fail(c.label, e.message)
            continue
        eff = running.effective
        ev.server(c.label, eff)
        try:
            client = Client(running.url, timeout=spec.request_timeout)
            hay = Haystack(client, filler_text, max(spec.ctxs))
            for ctx, depth, t in todo:
                needle = make_needle(spec.seed, ctx, depth, t)
                prompt, n_tok = hay.prompt(ctx, depth, needle, spec.n_predict)
                t0 = time.monotonic()
                r = client.completion(prompt, n_predict=spec.n_predict, temperature=0.0, cache_prompt=True,
                                      seed=spec.seed)
                answer = ANSWER_PREFIX + r.get("content", "")
                result = {"hit": needle.found_in(answer), "number_hit": needle.number_in(answer), "answer": answer.strip()[:200],
                          "passphrase": needle.passphrase, "prompt_tokens": n_tok,
                          "seconds": round(time.monotonic() - t0, 2),
                          "effective": {"k": eff.get("k"), "v": eff.get("v"), "v_types": eff.get("v_types"),
                                        "kv_mib": eff.get("kv_mib"), "flash_attn": eff.get("flash_attn")}}
                fields = common | {"config": c.label, "ctx": ctx, "depth": depth, "trial": t}
                store.append(fields, result, meta_base | {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ")})
                ev.answer(c.label, result | {"ctx": ctx, "depth": depth, "trial": t})
        except TqError as e:
            if c.label == "f16":
                raise
            failed.append(c.label)
            ev.fail(c.label, e.message)
        finally:
            client.close()
            server.stop()
    return _collect(spec, store, configs, cells, key, failed, meta_base | {"binary": str(binary)})


def _collect(spec, store, configs, cells, key, failed, meta) -> NiahResult:
    out_cells, totals, records = [], [], []
    for c in configs:
        th = tt = nh = 0
        for ctx in spec.ctxs:
            for depth in spec.depths:
                recs = [store.get(key(c, ctx, depth, t)) for t in range(spec.trials)]
                recs = [r for r in recs if r is not None]
                hits = sum(1 for r in recs if r["result"]["hit"])
                nh += sum(1 for r in recs if r["result"].get("number_hit"))
                records += recs
                if recs:
                    out_cells.append({"config": c.label, "ctx": ctx, "depth": depth, "hits": hits,
                                      "trials": len(recs), "accuracy": hits / len(recs)})
                th, tt = th + hits, tt + len(recs)
        lo, hi = wilson(th, tt)
        kv = next((r["result"]["effective"].get("kv_mib") for r in records
                   if r["fields"]["config"] == c.label), None)
        totals.append({"config": c.label, "hits": th, "trials": tt, "accuracy": th / tt if tt else None,
                       "ci95_low": round(lo, 3), "ci95_high": round(hi, 3), "number_hits": nh, "kv_mib": kv})
    meta = meta | {"ctxs": spec.ctxs, "depths": spec.depths, "trials": spec.trials, "seed": spec.seed,
                   "n_predict": spec.n_predict, "filler": str(spec.filler), "date": time.strftime("%Y-%m-%d"),
                   "server_ctx": _server_ctx(spec), "threads": spec.threads}
    return NiahResult(spec, out_cells, totals, records, failed, meta)


def niah_table(res: NiahResult) -> str:
    depths = res.spec.depths
    head = ["K/V", "context"] + [f"{d}%" for d in depths] + ["accuracy"]
    by = {(c["config"], c["ctx"], c["depth"]): c for c in res.cells}
    out = []
    for t in res.totals:
        for ctx in res.spec.ctxs:
            row = [t["config"], str(ctx)]
            h = n = 0
            for d in depths:
                c = by.get((t["config"], ctx, d))
                row.append(f"{c['hits']}/{c['trials']}" if c else "-")
                if c:
                    h, n = h + c["hits"], n + c["trials"]
            row.append(f"{h}/{n}" if n else "-")
            out.append(row)
    return markdown(head, out)


def totals_table(res: NiahResult) -> str:
    f16 = next((t for t in res.totals if t["config"] == "f16"), None)
    out = []
    for t in res.totals:
        if not t["trials"]:
            out.append([t["config"], "-", "-", "-", "-", "-"])
            continue
        diff = "reference" if t["config"] == "f16" else (
            f"{t['hits'] - f16['hits']:+d} needles" if f16 and f16["trials"] == t["trials"] else "-")
        out.append([t["config"], f"{t['hits']}/{t['trials']} ({t['accuracy']:.0%})",
                    f"{t['ci95_low']:.0%}-{t['ci95_high']:.0%}", diff, f"{t['number_hits']}/{t['trials']}",
                    "-" if t["kv_mib"] is None else f"{t['kv_mib']:g}"])
    return markdown(["K/V", "found", "95% interval", "vs f16", "number only", "KV MiB (server)"], out)


def report_markdown(res: NiahResult) -> str:
    m, b = res.meta, res.meta["build"]
    return (f"# Needle in a haystack: {Path(m['model']).name}\n\n"
            f"- filler: {Path(m['filler']).name}; needle: \"The secret passphrase is WORD-NNNN.\" at each depth "
            f"(snapped to a sentence end), question after the text, the answer begun with \"{ANSWER_PREFIX}\" and "
            f"completed at temperature 0 ({m['n_predict']} tokens), "
            f"scored by substring; {m['trials']} trial(s) per cell, seed {m['seed']}\n"
            f"- llama-server -c {m['server_ctx']} -np 1 -fa on"
            + (f" -t {m['threads']}" if m.get("threads") else "") + "; "
            f"build: llama.cpp {b.get('llama_cpp')} + patches {', '.join(b.get('patches') or []) or '-'} "
            f"(build hash {b['build_hash']}); device: {m['device']}; date: {m['date']}\n"
            "- found: needles retrieved (word and number); number only: answers with the right number; 95% interval: Wilson score interval of the proportion (few needles give "
            "wide intervals: read differences to f16 against it)\n\n"
            + totals_table(res) + "\n\n" + niah_table(res) + "\n")


def write_report(res: NiahResult, plot: bool = False) -> dict[str, Path]:
    doc = {"meta": res.meta, "totals": res.totals, "cells": res.cells, "failed": res.failed,
           "answers": [r["fields"] | r["result"] for r in res.records]}
    paths = write_outputs(res.spec.out, STEM, report_markdown(res), res.cells, doc)
    if plot:
        from .plot import plot_niah

        paths["png"] = plot_niah(res.cells, res.spec.out / f"{STEM}.png", Path(res.meta["model"]).name)
    res.paths = paths
    return paths


__all__ = ["Needle", "make_needle", "split_at_sentence", "NiahSpec", "Events", "NiahResult", "wilson", "Haystack",
           "run_niah", "niah_table", "totals_table", "report_markdown", "write_report"]
