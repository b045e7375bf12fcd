"""Run the patched llama-perplexity and parse PPL / KL-divergence results."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TqError
from .toolrun import stream, tail

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
_PM = rf"{_NUM}\s*(?:±|\+/-)\s*{_NUM}"


@dataclass
class CacheConfig:
    """A K/V cache configuration as written on the command line: `q8_0/turbo4`, `turbo3` (K = V), or with the
    boundary-layer V policy of patch 0010 as a suffix: `turbo4/turbo2+bv2` (the V cache of the first and last 2
    KV-bearing layers at q8_0) or `turbo4/turbo2+bv2:f16` (at another type). `+b2` is accepted for `+bv2`."""

    k: str
    v: str
    boundary_n: int = 0
    boundary_type: str = "q8_0"

    @classmethod
    def parse(cls, text: str) -> "CacheConfig":
        from .ggml_types import CACHE_TYPES

        text = text.strip()
        pair, plus, suffix = text.partition("+")
        k, slash, v = pair.strip().partition("/")
        if not k or (slash and not v):
            raise TqError(f"empty cache config in {text!r}", "write K/V, e.g. q8_0/turbo4, or one type for both")
        cfg = cls(k, v or k)
        if plus:
            m = re.fullmatch(r"bv?(\d+)(?::(\w+))?", suffix.strip())
            if not m:
                raise TqError(f"bad boundary suffix {'+' + suffix!r} in cache config {text!r}",
                              "write +bvN (the V of the first and last N layers at q8_0) or +bvN:TYPE")
            cfg.boundary_n = int(m.group(1))
            cfg.boundary_type = m.group(2) or "q8_0"
        for what, t in (("K", cfg.k), ("V", cfg.v), ("boundary V", cfg.boundary_type)):
            if t not in CACHE_TYPES:
                raise TqError(f"unknown {what} cache type {t!r} in cache config {text!r}",
                              f"known: {', '.join(CACHE_TYPES)}")
        return cfg

    @property
    def label(self) -> str:
        base = self.k if self.k == self.v else f"{self.k}/{self.v}"
        if self.boundary_n:
            base += f"+bv{self.boundary_n}" + ("" if self.boundary_type == "q8_0" else f":{self.boundary_type}")
        return base

    def nominal_bits_per_value(self) -> float:
        """Bits per K/V value of the pair, ignoring the boundary layers (which depend on the model's layer count)."""
        from .ggml_types import cache_type

        return (cache_type(self.k).bits_per_value + cache_type(self.v).bits_per_value) / 2

    def args(self) -> list[str]:
        a = ["-ctk", self.k, "-ctv", self.v]
        if self.boundary_n:
            a += ["--cache-boundary-layers", str(self.boundary_n), "--cache-type-v-boundary", self.boundary_type]
        return a


@dataclass
class PplResult:
    config: str
    ppl: float
    ppl_err: float
    kv_mib: float | None = None
    kv_k_mib: float | None = None
    kv_v_mib: float | None = None
    kld: float | None = None
    kld_err: float | None = None
    kld_p99: float | None = None
    same_top: float | None = None  # percent
    same_top_err: float | None = None
    ppl_ratio: float | None = None
    ppl_ratio_err: float | None = None
    kld_max: float | None = None
    kld_median: float | None = None
    ppl_base: float | None = None   # PPL of the stored base logits (quantized), in a --kl-divergence run
    log: str = field(default="", repr=False)


def _f(x: str) -> float:
    return float(x)


def parse_output(config: str, text: str) -> PplResult:
    """Parse llama-perplexity's log (PPL run, or a --kl-divergence run)."""
    kv = re.search(r"llama_kv_cache: size =\s*" + _NUM + r" MiB.*?K \((\w+)\):\s*" + _NUM + r" MiB, V \((\w+)\):\s*" + _NUM, text)
    kv_mib = kv_k = kv_v = None
    if kv:
        # iSWA models log one line per cache; sum them
        kv_mib = kv_k = kv_v = 0.0
        for m in re.finditer(r"llama_kv_cache: size =\s*" + _NUM + r" MiB.*?K \(\w+\):\s*" + _NUM + r" MiB, V \(\w+\):\s*" + _NUM, text):
            kv_mib += _f(m.group(1))
            kv_k += _f(m.group(2))
            kv_v += _f(m.group(3))
    m = re.search(r"Final estimate: PPL = " + _NUM + r" \+/- " + _NUM, text)
    if m:
        return PplResult(config, _f(m.group(1)), _f(m.group(2)), kv_mib, kv_k, kv_v, log=text)
    q = re.search(r"Mean PPL\(Q\)\s*:\s*" + _PM, text)
    if not q:
        short = re.search(r"you need at least (\d+) tokens to evaluate perplexity with a context of (\d+)", text)
        if short:
            raise TqError(f"{config}: the text is too short: llama-perplexity needs at least {short.group(1)} tokens "
                          f"at -c {short.group(2)}", "give a longer text (-f) or a smaller -c", code=2)
        raise TqError(f"no perplexity result in the output of {config}: {tail(text)}", code=1)
    res = PplResult(config, _f(q.group(1)), _f(q.group(2)), kv_mib, kv_k, kv_v, log=text)
    if (m := re.search(r"Mean PPL\(Q\)/PPL\(base\)\s*:\s*" + _PM, text)):
        res.ppl_ratio, res.ppl_ratio_err = _f(m.group(1)), _f(m.group(2))
    if (m := re.search(r"Mean\s+KLD:\s*" + _PM, text)):
        res.kld, res.kld_err = _f(m.group(1)), _f(m.group(2))
    if (m := re.search(r"99\.0%\s+KLD:\s*" + _NUM, text)):
        res.kld_p99 = _f(m.group(1))
    if (m := re.search(r"Maximum KLD:\s*" + _NUM, text)):
        res.kld_max = _f(m.group(1))
    if (m := re.search(r"Median\s+KLD:\s*" + _NUM, text)):
        res.kld_median = _f(m.group(1))
    if (m := re.search(r"Mean PPL\(base\)\s*:\s*" + _PM, text)):
        res.ppl_base = _f(m.group(1))
    if (m := re.search(r"Same top p:\s*" + _PM, text)):
        res.same_top, res.same_top_err = _f(m.group(1)), _f(m.group(2))
    return res


# llama-perplexity's --kl-divergence scores the second half of each chunk (n_ctx - 1 - n_ctx/2 tokens) and prints
# its summary (the PPL, KLD and same-top lines tqgguf reads) only over at least 100 scored tokens
KLD_MIN_TOKENS = 100


def check_kld_size(ctx: int, chunks: int | None) -> None:
    """A KL-divergence run that llama-perplexity would finish without a summary, as a one-line error before any run."""
    if chunks is None:
        return  # the whole text
    per_chunk = ctx - 1 - ctx // 2
    scored = chunks * max(per_chunk, 0)
    if scored < KLD_MIN_TOKENS:
        hint = f"use --chunks {-(-KLD_MIN_TOKENS // per_chunk)} or more at -c {ctx}" if per_chunk > 0 else "use a larger -c"
        raise TqError(f"{chunks} chunk(s) of {ctx} tokens score {scored} tokens; llama-perplexity prints the KL "
                      f"divergence only over at least {KLD_MIN_TOKENS}", hint)


def run_perplexity(binary: Path, model: Path, text: Path, config: CacheConfig, ctx: int = 512,
                   chunks: int | None = None, threads: int | None = None, kld_base: Path | None = None,
                   save_base: Path | None = None, extra: list[str] | None = None, timeout: float | None = None) -> PplResult:
    """One llama-perplexity run. `save_base` writes the logits (f16 base run); `kld_base` compares with them."""
    if kld_base or save_base:
        check_kld_size(ctx, chunks)
    # -lv 4: the KV-cache size line that llama.cpp logs is only printed at this verbosity
    cmd = [str(binary), "-m", str(model), "-c", str(ctx), "-fa", "on", "-lv", "4", *config.args()]
    if kld_base:
        cmd += ["--kl-divergence-base", str(kld_base), "--kl-divergence"]
    else:
        cmd += ["-f", str(text)]
        if save_base:
            cmd += ["--kl-divergence-base", str(save_base)]
    if chunks:
        cmd += ["--chunks", str(chunks)]
    if threads:
        cmd += ["-t", str(threads)]
    cmd += extra or []
    r = stream(cmd, f"llama-perplexity for {config.label}", timeout=timeout)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        raise TqError(f"llama-perplexity failed for {config.label} (exit {r.returncode}): {tail(log)}", code=1)
    return parse_output(config.label, log)
