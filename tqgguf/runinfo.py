"""What a measurement ran on: the llama.cpp binary (and its build manifest), the device, and content hashes of the
model and text files. Sweeps key their stored results on these, so a changed build, model or text is measured anew."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from .errors import TqError
from .paths import cache_dir

BIN_DIR_ENV = "TQGGUF_BIN_DIR"
MANIFEST = "tqgguf-manifest.json"
# the manifest fields that say what the binaries are (not when or how fast they were built)
_BUILD_FIELDS = ("source", "patches", "backends", "build_type", "cmake_args", "generator", "compiler")


def find_tool(name: str, bin_dir: Path | None = None, backends: list[str] | None = None) -> Path:
    """A built llama.cpp tool: from bin_dir, else $TQGGUF_BIN_DIR, else tqgguf's build for `backends`."""
    from .build import exe_name

    folder = bin_dir or (Path(os.environ[BIN_DIR_ENV]) if os.environ.get(BIN_DIR_ENV) else None)
    if folder is not None:
        path = Path(folder).expanduser() / exe_name(name)
        if not path.is_file():
            where = f"--bin-dir {folder}" if bin_dir else f"${BIN_DIR_ENV} ({folder})"
            raise TqError(f"no {name} in {where}", "build it with `tqgguf build`, or point at the build's bin folder")
        return path
    from .build import BuildSpec, find_bin
    from .pin import load_pin
    from .source import cached_pinned_source

    spec = BuildSpec(backends=backends or ["cpu"])
    src = cached_pinned_source(load_pin())
    try:
        if src is None:
            raise TqError("llama.cpp has not been built yet", "run `tqgguf build` first")
        return find_bin(src, spec, name)
    except TqError as e:
        local = local_build(spec.backends, name)
        if local is None:
            raise
        raise TqError(f"{e.message}; there is a build of the local tree {local['source']}",
                      f"use it with --bin-dir {local['bin']} (or ${BIN_DIR_ENV})", e.code) from None


def local_build(backends: list[str], name: str) -> dict | None:
    """The newest `tqgguf build --source DIR` for exactly these backends that has `name`: {source, bin}, or None."""
    from .build import builds

    for m in builds(backends, name):
        if (m.get("source") or {}).get("kind") == "local":
            return {"source": m["source"].get("root"), "bin": str(Path(m["build_dir"]) / "bin")}
    return None


def manifest_of(binary: Path) -> dict | None:
    path = Path(binary).parent / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def build_hash(binary: Path) -> str:
    """A short hash of what the build is (source, patches and their hashes, flags, compiler) from its manifest;
    without a manifest, of the binary file itself."""
    m = manifest_of(binary)
    if m is not None:
        subset = {k: m.get(k) for k in _BUILD_FIELDS}
        if isinstance(subset.get("source"), dict):  # where the tree lies is not what it is
            subset["source"] = {k: v for k, v in subset["source"].items() if k != "root"}
        data = json.dumps(subset, sort_keys=True).encode()
        return "m-" + hashlib.sha256(data).hexdigest()[:16]
    return "b-" + file_sha256(binary)[:16]


def build_summary(binary: Path) -> dict:
    m = manifest_of(binary) or {}
    src = m.get("source") or {}
    return {"binary": str(binary), "build_hash": build_hash(binary), "llama_cpp": src.get("commit"),
            "patches": [p["name"][:4] for p in m.get("patches", [])], "backends": m.get("backends")}


def file_sha256(path: Path) -> str:
    """sha256 of a file, remembered per (path, size, mtime) under the tqgguf cache: big models are hashed once."""
    path = Path(path).resolve()
    st = path.stat()
    memo_path = cache_dir() / "hashes.json"
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    try:
        memo = json.loads(memo_path.read_text())
    except (OSError, ValueError):
        memo = {}
    if key in memo:
        return memo[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    digest = h.hexdigest()
    memo = {k: v for k, v in memo.items() if not k.startswith(f"{path}|")}
    memo[key] = digest
    try:
        memo_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo_path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(json.dumps(memo, indent=0))
        tmp.replace(memo_path)
    except OSError:
        pass
    return digest


# platform.machine() names (lower-cased) of x86 and 64-bit ARM CPUs
X86_MACHINES = ("x86_64", "amd64", "i386", "i686", "x86")
ARM64_MACHINES = ("aarch64", "arm64")


def cpuinfo_text() -> str | None:
    """/proc/cpuinfo's text, None where there is none (macOS, Windows)."""
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None


def cpu_flags(cpuinfo: str | None) -> set[str] | None:
    """The feature flags of /proc/cpuinfo's first `flags` line (x86: "avx2", "avx512_fp16", ...); None without one."""
    m = re.search(r"^flags\s*:(.*)$", cpuinfo or "", flags=re.M)
    return set(m.group(1).split()) if m else None


def cpu_name() -> str:
    m = re.search(r"^model name\s*:(.*)$", cpuinfo_text() or "", flags=re.M)
    return m.group(1).strip() if m else (platform.processor() or platform.machine())


def gpu_names() -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                           text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln.strip() for ln in r.stdout.splitlines() if ln.strip()] if r.returncode == 0 else []


def list_devices(binary: Path) -> list[str] | None:
    """The GPUs a llama.cpp tool would use, as llama.cpp describes them (`<tool> --list-devices`, which llama-bench,
    llama-perplexity and llama-server share; "  Vulkan0: llvmpipe (LLVM 15.0.6, 256 bits) (2048 MiB, 2048 MiB
    free)" becomes "llvmpipe (LLVM 15.0.6, 256 bits)"); [] when it found none, None when the tool could not tell."""
    try:
        r = subprocess.run([str(binary), "--list-devices"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    _, sep, rest = r.stdout.partition("Available devices:")
    if r.returncode != 0 or not sep:
        return None
    devs = []
    for line in rest.splitlines():
        m = re.match(r"\s*[^:\s]+: (.*?)(?: \(\d+ MiB, \d+ MiB free\))?\s*$", line)
        if m and m.group(1):
            devs.append(m.group(1))
    return devs


def device(binary: Path | None = None, n_gpu_layers: str | None = None) -> str:
    """The device a run used, in words: the GPU(s) when the build has a GPU backend and layers are offloaded (as
    the tool lists them, else from nvidia-smi for a CUDA build), else the CPU model and its core count. A GPU
    build that finds no GPU runs on the CPU (ggml lists no CPU-emulated Vulkan device unless asked to)."""
    backends = (manifest_of(binary) or {}).get("backends", []) if binary else []
    gpu = [b for b in backends if b != "cpu"]
    cpu = f"{cpu_name()} ({os.cpu_count()} cores)"
    if gpu and str(n_gpu_layers) != "0":
        listed = list_devices(binary)
        if listed == []:
            return f"{cpu}; the {'+'.join(gpu)} build found no GPU"
        names = listed or (gpu_names() if "cuda" in gpu else [])
        if names:
            return ", ".join(names) + f" ({'+'.join(gpu)})"
        return f"{'+'.join(gpu)} GPU"
    return cpu


def check_gpu_pairs(binary: Path | None, n_gpu_layers, configs) -> None:
    """Refuse cache configs that a GPU build would run on the CPU or cannot run at all (kvcompat.gpu_config_error),
    before any run."""
    from .kvcompat import gpu_config_error

    backends = (manifest_of(binary) or {}).get("backends", []) if binary else []
    for c in configs:
        found = gpu_config_error(backends, n_gpu_layers, c.k, (c.v, c.boundary_type if c.boundary_n else c.v))
        if found:
            raise TqError(f"config {c.label}: {found[0]}", found[1])
