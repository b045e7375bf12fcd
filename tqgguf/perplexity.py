"""Run the patched llama-perplexity and parse PPL / KL-divergence results."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TqError

_NUM = r"([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))"
_PM = rf"{_NUM}\s*(?:±|\+/-)\s*{_NUM}"


@dataclass
class CacheConfig:
    """A K/V cache configuration as written on the command line: `q8_0/turbo4` or `turbo3` (K = V)."""

    k: str
    v: str

    @classmethod
    def parse(cls, text: str) -> "CacheConfig":
        k, _, v = text.strip().partition("/")
        if not k:
            raise TqError(f"empty cache config in {text!r}")
        return cls(k, v or k)

    @property
    def label(self) -> str:
        return self.k if self.k == self.v else f"{self.k}/{self.v}"

    def args(self) -> list[str]:
        return ["-ctk", self.k, "-ctv", self.v]


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
        raise TqError(f"no perplexity result in the output of {config}: {_tail(text)}", code=1)
    res = PplResult(config, _f(q.group(1)), _f(q.group(2)), kv_mib, kv_k, kv_v, log=text)
    if (m := re.search(r"Mean PPL\(Q\)/PPL\(base\)\s*:\s*" + _PM, text)):
        res.ppl_ratio, res.ppl_ratio_err = _f(m.group(1)), _f(m.group(2))
    if (m := re.search(r"Mean\s+KLD:\s*" + _PM, text)):
        res.kld, res.kld_err = _f(m.group(1)), _f(m.group(2))
    if (m := re.search(r"99\.0%\s+KLD:\s*" + _NUM, text)):
        res.kld_p99 = _f(m.group(1))
    if (m := re.search(r"Same top p:\s*" + _PM, text)):
        res.same_top, res.same_top_err = _f(m.group(1)), _f(m.group(2))
    return res


def _tail(text: str, n: int = 3) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def run_tool(cmd: list[str], what: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    """Run a llama.cpp tool, capturing its output; a time-out or a missing binary is a TqError."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, errors="replace")
    except subprocess.TimeoutExpired:
        raise TqError(f"{what} timed out after {timeout} s", code=1) from None
    except OSError as e:
        raise TqError(f"cannot run {cmd[0]}: {e.strerror}", "run `tqgguf build` first") from None


def run_perplexity(binary: Path, model: Path, text: Path, config: CacheConfig, ctx: int = 512,
                   chunks: int | None = None, threads: int | None = None, kld_base: Path | None = None,
                   save_base: Path | None = None, extra: list[str] | None = None, timeout: float | None = None) -> PplResult:
    """One llama-perplexity run. `save_base` writes the logits (f16 base run); `kld_base` compares with them."""
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
    r = run_tool(cmd, f"llama-perplexity for {config.label}", timeout)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        raise TqError(f"llama-perplexity failed for {config.label} (exit {r.returncode}): {_tail(log)}", code=1)
    return parse_output(config.label, log)
