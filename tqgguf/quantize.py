"""`tqgguf quantize`: the built llama-quantize, with the input checked first and one-line errors."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .errors import TqError
from .gguf_read import GgufError, read_gguf
from .turbo import TYPES as TURBO_TYPES


def _last_error(log: str) -> str:
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in lines:   # llama_model_quantize: failed to quantize: <the reason>
        if "failed to quantize:" in ln:
            return ln.split("failed to quantize:", 1)[1].strip()[:400]
    for ln in reversed(lines):
        if "invalid" in ln or "failed" in ln or "error" in ln.lower():
            return ln[:400]
    return lines[-1][:400] if lines else "no output"


def quantize(binary: Path, src: Path, out: Path, qtype: str, threads: int | None = None,
             extra: list[str] | None = None) -> Path:
    if qtype.lower() in TURBO_TYPES:
        raise TqError(f"{qtype} is a KV-cache type, not a weight type",
                      f"use it at run time: -ctk {qtype.lower()} -ctv {qtype.lower()}")
    try:
        read_gguf(src)
    except GgufError as e:
        raise TqError(f"{src}: {e}") from None
    except OSError as e:
        raise TqError(f"cannot read {src}: {e.strerror}") from None
    out = out.expanduser().resolve()
    if out == src.expanduser().resolve():
        raise TqError("the output would overwrite the input", "give another output path")
    if not out.parent.is_dir():
        raise TqError(f"output folder {out.parent} does not exist")
    part = out.with_name(out.name + ".part")
    cmd = [str(binary), *(extra or []), str(src), str(part), qtype]
    if threads:
        cmd.append(str(threads))
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    log = r.stdout + r.stderr
    if "invalid ftype" in log:
        part.unlink(missing_ok=True)
        raise TqError(f"unknown quantization type {qtype!r}", f"`{binary} --help` lists them (Q4_K_M, Q8_0, ...)")
    if r.returncode != 0 or not part.is_file() or "failed to quantize" in log:
        part.unlink(missing_ok=True)
        why = _last_error(log)
        if "requantizing from type" in why:
            raise TqError(f"{src.name} is quantized already ({why})",
                          "start from an f16/bf16 GGUF, or pass --allow-requantize (quality is lost twice)", code=2)
        raise TqError(f"llama-quantize failed (exit {r.returncode}): {why}")
    os.replace(part, out)
    return out
