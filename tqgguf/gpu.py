"""NVIDIA GPUs as nvidia-smi reports them: the free memory of a visible one (for `tqgguf check --gpu`), and the
architectures of all (for `tqgguf build -b cuda` without --cuda-arch)."""

from __future__ import annotations

import os
import shutil
import subprocess

from .errors import TqError
from .kvmem import MIB


def _visible_index() -> str:
    """The first GPU of CUDA_VISIBLE_DEVICES (an index or a UUID), else GPU 0."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return vis or "0"


def gpu_free() -> tuple[int, str]:
    """(free bytes, description) of the first visible NVIDIA GPU."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise TqError("--gpu: nvidia-smi is not on PATH (no NVIDIA driver here)", "give the budget with --mem 24GiB")
    idx = _visible_index()
    cmd = [smi, f"--id={idx}", "--query-gpu=name,memory.free,memory.total", "--format=csv,noheader,nounits"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TqError(f"--gpu: nvidia-smi failed: {e}", "give the budget with --mem 24GiB") from None
    line = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
    parts = [p.strip() for p in line.rsplit(",", 2)]
    if r.returncode != 0 or len(parts) != 3 or not parts[1].isdigit():
        why = (r.stderr or r.stdout).strip().splitlines()
        raise TqError(f"--gpu: cannot read GPU {idx} from nvidia-smi: {why[0] if why else 'no output'}",
                      "give the budget with --mem 24GiB")
    name, free, total = parts[0], int(parts[1]), int(parts[2])
    return free * MIB, f"GPU {idx} {name}: {free} of {total} MiB free"


def cuda_archs() -> list[str]:
    """The CUDA architectures (e.g. "90") of the NVIDIA GPUs nvidia-smi lists; empty without nvidia-smi or GPU."""
    from .doctor import nvidia_gpus

    return sorted({g["cuda_arch"] for g in nvidia_gpus() if g["cuda_arch"]})
