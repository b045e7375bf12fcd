"""`tqgguf doctor`: which toolchains are here, which llama.cpp backends can be built, and what fixes each gap.

Everything that touches the machine goes through three injectable seams so tests can fake it:
``which`` (like :func:`shutil.which`), ``run`` (like :func:`subprocess.run`) and the file system under
``fs_root`` (plus explicit ``vulkan_header``). No check ever raises: a tool whose version command fails,
hangs (timeout :data:`VERSION_TIMEOUT_S`) or prints nonsense is reported in its :class:`Tool` row.

Tool statuses:
  "ok"              found and new enough
  "missing"         not found
  "too old"         found, below the minimum the pinned llama.cpp needs
  "not applicable"  not relevant on this platform (Metal off macOS)
  "error"           found, but its version command failed or timed out (treated as unusable)
  "unknown"         found, ran, but its version could not be parsed (treated as usable, with a note)

Thresholds come from the pinned llama.cpp (llama_cpp_python 0.3.36's vendor/llama.cpp); see the constants.
"""

from __future__ import annotations

import csv
import io
import os
import platform as _platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from .runinfo import ARM64_MACHINES, X86_MACHINES, cpu_flags

VERSION_TIMEOUT_S = 10

# ---- thresholds (pinned llama.cpp) ------------------------------------------------------------
# ggml/CMakeLists.txt sets CMAKE_CXX_STANDARD 17; gcc 9 is the first with full C++17 incl. <filesystem>
# without -lstdc++fs, clang 10 the matching bar for clang.
MIN_GCC = (9,)
MIN_CLANG = (10,)
# CMakeLists.txt and ggml/CMakeLists.txt: cmake_minimum_required(VERSION 3.14...3.28)
MIN_CMAKE = (3, 14)
# ggml/src/ggml-cuda/CMakeLists.txt: cmake_minimum_required(VERSION 3.18)  # for CMAKE_CUDA_ARCHITECTURES
MIN_CMAKE_CUDA = (3, 18)
# ggml/src/ggml-vulkan/CMakeLists.txt: cmake_minimum_required(VERSION 3.19)
MIN_CMAKE_VULKAN = (3, 19)
# ggml/src/ggml-hip/CMakeLists.txt: cmake_minimum_required(VERSION 3.21) + enable_language(HIP) (the path
# tqgguf's build takes: HIPCXX from `hipconfig -l`, not hipcc as CXX)
MIN_CMAKE_HIP = (3, 21)
# CMAKE_CUDA_ARCHITECTURES=native (tqgguf build's default without --cuda-arch) needs CMake >= 3.24.
MIN_CMAKE_CUDA_NATIVE = (3, 24)
# ggml-cuda has no hard FATAL_ERROR minimum; common.cuh gates features on CUDART_VERSION >= 11070 and
# docs/build.md uses 11.7 as its "old CUDA" example, so 11.7 is our bar.
MIN_CUDA = (11, 7)
# ggml/src/ggml-hip/CMakeLists.txt: if (${hip_VERSION} VERSION_LESS 6.1) FATAL_ERROR "At least ROCM/HIP V6.1
# is required"; it also find_package()s hip, hipblas and rocblas (all REQUIRED).
MIN_HIP = (6, 1)
# The pinned ggml-vulkan.cpp uses vk::LayerSettingEXT / vk::LayerSettingsCreateInfoEXT unconditionally
# (ggml_vk_instance_init), i.e. VK_EXT_layer_settings. Debian 12's libvulkan-dev 1.3.239 lacks it (checked:
# no "layer_settings" anywhere in its vulkan_core.h / vulkan*.hpp). The extension first shipped in the
# Vulkan-Headers 1.3.268 release (Oct 2023, LunarG SDK 1.3.268.0) as far as we know. Patch 0001 guards that
# block with `#ifdef VK_EXT_layer_settings`, so the patched tree builds without it (the settings only tune the
# optional validation layer): Debian 12's headers built the Vulkan backend and llama-perplexity
# (bench/results/vulkan-lavapipe-turbo/). The check reports which case a machine is in.
VK_LAYER_SETTINGS_MIN_HEADER = (1, 3, 268)
# Other unguarded needs of the pinned ggml-vulkan CMake: find_package(Vulkan COMPONENTS glslc REQUIRED),
# find_package(SPIRV-Headers CONFIG REQUIRED), and #include <spirv/unified1/spirv.hpp> (ggml-vulkan-types.h).

BLOCKING = frozenset({"missing", "too old", "error", "not applicable"})
# Metal builds get upstream's cache types on the GPU, but the series has no turbo kernels for Metal
NO_TURBO_KERNELS_NOTE = ("no turbo kernels: turbo caches run on the CPU only (-ngl 0), and tqgguf refuses them with "
                         "layers on this GPU")
# which CPU code the series gives the turbo types (the dots, dequantizers and V accumulation of flash attention)
GENERIC_TURBO_NOTE = ("turbo caches run ggml's generic C code on this CPU (the series has SIMD turbo code for x86 "
                      "with AVX2 and for 64-bit ARM with NEON only): expect them to decode slower than q8_0 or f16 "
                      "(on x86, with only its V rows on the generic code, turbo3 decoded at 0.6x q8_0's speed)")


def cpu_turbo_note(machine: str, cpuinfo: str | None) -> str:
    """A note for the cpu backend: which turbo code a native build on this CPU runs. `cpuinfo` is /proc/cpuinfo's
    text where there is one (its flags tell whether an x86 CPU has AVX2), else None."""
    arch = machine.lower()
    if arch in ARM64_MACHINES:
        return "turbo caches use the NEON code of patch 0058 on this CPU"
    if arch in X86_MACHINES:
        flags = cpu_flags(cpuinfo)
        if flags is None:
            return "turbo caches use the AVX2 code of patches 0003 and 0009 where the CPU has AVX2"
        if "avx2" in flags:
            return "turbo caches use the AVX2 code of patches 0003 and 0009 on this CPU"
        return "this CPU has no AVX2: " + GENERIC_TURBO_NOTE
    return f"{machine or 'unknown machine'}: " + GENERIC_TURBO_NOTE


# Vulkan's turbo kernels (patch 0040) match the CPU backend on Mesa's lavapipe and on an H200's NVIDIA driver, where
# they decode somewhat slower than f16 at short context (bench/results/vulkan-h200/: 0.64-0.79x before 0042,
# 0.96-0.97x with 0049 (ab-0049/), 0.93-0.98x on a cooperative-matrix build (coopmat-prefill/)) and at about f16's
# speed at depth 32768 (d32768-0049/); prompts convert quantized K and V to f16 (0051: 0.88-0.91x f16 at depth 8192
# against 0.37-0.41x on the scalar shader with coopmat2, coopmat-prefill/)
VULKAN_TURBO_NOTE = ("turbo caches: kernels match the CPU (test-backend-ops on lavapipe and an NVIDIA GPU); on that "
                     "GPU decode runs at 0.93-0.98x an f16 cache's speed at depths 0 and 8192 (about 1x at 32768) "
                     "and prompts at 0.88-0.98x, through an f16 scratch of one layer's K and V when both sides are "
                     "quantized (pair a turbo side with q8_0, not f16)")

Which = Callable[[str], "str | None"]
Run = Callable[..., "subprocess.CompletedProcess"]


@dataclass
class Tool:
    name: str
    found: bool
    path: str | None
    version: str | None
    status: str  # "ok" | "missing" | "too old" | "not applicable" | "error" | "unknown"
    need: str  # minimum / what it is for
    fix: str | None = None  # e.g. "apt-get install ninja-build (or: pip install ninja)"
    detail: str | None = None  # flavour (gcc/clang), error text, extra facts
    optional: bool = False  # missing is fine (ninja, nvidia-smi, ...)


@dataclass
class BackendVerdict:
    backend: str  # "cpu" | "cuda" | "hip" | "vulkan" | "metal"
    buildable: bool
    reasons: list[str] = field(default_factory=list)  # why not buildable
    fixes: list[str] = field(default_factory=list)  # what to install / do
    notes: list[str] = field(default_factory=list)  # non-blocking advice


@dataclass
class DoctorReport:
    tools: list[Tool]
    backends: list[BackendVerdict]
    gpus: list[dict]
    platform: str = ""

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    def backend(self, name: str) -> BackendVerdict | None:
        return next((b for b in self.backends if b.backend == name), None)

    def to_dict(self) -> dict:
        return asdict(self)


# ---- helpers ------------------------------------------------------------------------------------

_VER_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


def parse_version(text: str | None) -> tuple[int, ...] | None:
    """First dotted version in `text` as a tuple ("12.2.0" -> (12, 2, 0)); None if none."""
    if not text:
        return None
    m = _VER_RE.search(text)
    if not m:
        return None
    return tuple(int(g) for g in m.groups() if g is not None)


def _vstr(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


@dataclass
class _Out:
    ok: bool
    text: str
    error: str | None = None


class _Ctx:
    def __init__(self, which: Which, run: Run, platform: str, env: Mapping[str, str], fs_root: Path):
        self._which = which
        self._run = run
        self.platform = platform
        self.env = env
        self.root = Path(fs_root)
        self.darwin = platform == "darwin"

    def which(self, name: str) -> str | None:
        try:
            found = self._which(name)
        except Exception:  # noqa: BLE001 - a broken injected `which` must not crash the doctor
            return None
        return str(found) if found else None

    def p(self, path: str | os.PathLike) -> Path:
        """An absolute machine path, re-rooted under fs_root (tests point fs_root at a fake tree)."""
        s = str(path)
        return self.root / s.lstrip("/") if s.startswith("/") else Path(s)

    def exists(self, path: str | os.PathLike) -> bool:
        try:
            return self.p(path).exists()
        except OSError:
            return False

    def glob(self, pattern: str) -> list[Path]:
        """Glob an absolute pattern under fs_root; returns re-rooted paths."""
        try:
            return sorted(self.root.glob(pattern.lstrip("/")))
        except (OSError, ValueError):
            return []

    def show(self, path: Path) -> str:
        """A re-rooted path shown as the machine path it stands for."""
        try:
            return "/" + str(path.relative_to(self.root)) if self.root != Path("/") else str(path)
        except ValueError:
            return str(path)

    def cmd(self, argv: Sequence[str]) -> _Out:
        shown = " ".join(argv)
        try:
            cp = self._run(list(argv), capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                           stdin=subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            return _Out(False, "", f"`{shown}` timed out after {VERSION_TIMEOUT_S}s")
        except OSError as e:
            return _Out(False, "", f"`{shown}` could not run: {e.strerror or e}")
        except Exception as e:  # noqa: BLE001 - anything from an injected/odd runner is a report, not a crash
            return _Out(False, "", f"`{shown}` failed: {type(e).__name__}: {e}")
        out, err = getattr(cp, "stdout", ""), getattr(cp, "stderr", "")
        text = "\n".join(_txt(x) for x in (out, err) if x)
        rc = getattr(cp, "returncode", 0)
        if rc != 0:
            first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
            return _Out(False, text, f"`{shown}` exited with {rc}" + (f": {first[:160]}" if first else ""))
        return _Out(True, text)

    def fix(self, debian: str, pip: str | None = None, brew: str | None = None) -> str:
        if self.darwin and brew:
            return brew
        return f"{debian} (or: {pip})" if pip else debian


def _txt(x) -> str:
    if isinstance(x, bytes):
        return x.decode(errors="replace")
    return str(x)


def _version_tool(ctx: _Ctx, name: str, exe: str | None, argv_tail: Sequence[str], parse: Callable[[str], str | None],
                  need: str, fix: str, minimum: tuple[int, ...] | None = None, optional: bool = False,
                  too_old_fix: str | None = None) -> Tool:
    """Common shape: find `exe`, run it with `argv_tail`, parse a version, compare with `minimum`."""
    if not exe:
        return Tool(name, False, None, None, "missing", need, fix, optional=optional)
    out = ctx.cmd([exe, *argv_tail])
    if not out.ok:
        return Tool(name, True, exe, None, "error", need, fix, detail=out.error, optional=optional)
    version = parse(out.text)
    if version is None:
        return Tool(name, True, exe, None, "unknown", need, None, optional=optional,
                    detail=f"could not parse a version from `{exe} {' '.join(argv_tail)}`")
    v = parse_version(version)
    if minimum and v is not None and v < minimum:
        return Tool(name, True, exe, version, "too old", need, too_old_fix or fix, optional=optional,
                    detail=f"{version} < {_vstr(minimum)}")
    return Tool(name, True, exe, version, "ok", need, None, optional=optional)


def _regex_version(*patterns: str) -> Callable[[str], str | None]:
    def parse(text: str) -> str | None:
        for pat in patterns:
            m = re.search(pat, text, re.M)
            if m:
                return m.group(1)
        return None

    return parse


def _first_version(text: str) -> str | None:
    m = _VER_RE.search(text)
    return m.group(0) if m else None


# ---- individual checks --------------------------------------------------------------------------


def _compiler_flavour(text: str) -> tuple[str, str | None]:
    """(flavour, version) from a `--version` banner: gcc, clang, apple-clang or unknown."""
    first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    m = re.search(r"Apple (?:LLVM|clang) version (\d+\.\d+(?:\.\d+)?)", text)
    if m:
        return "apple-clang", m.group(1)
    m = re.search(r"clang version (\d+\.\d+(?:\.\d+)?)", text)
    if m:
        return "clang", m.group(1)
    if "Free Software Foundation" in text or re.search(r"\b(gcc|g\+\+|GCC)\b", first):
        # "gcc (Debian 12.2.0-14+deb12u1) 12.2.0" / "gcc (GCC) 8.5.0 20210514 (Red Hat 8.5.0-4)":
        # the version follows the parenthesised package string.
        rest = re.sub(r"^\S+\s+\([^)]*\)\s*", "", first)
        return "gcc", _first_version(rest) or _first_version(first)
    return "unknown", _first_version(first)


def check_compiler(ctx: _Ctx, lang: str) -> Tool:
    if lang == "c":
        name, env_var, candidates = "c-compiler", "CC", ["cc", "gcc", "clang"]
        need = f"C11 compiler: gcc >= {MIN_GCC[0]} or clang >= {MIN_CLANG[0]}"
        fix = ctx.fix("apt-get install build-essential", brew="xcode-select --install")
    else:
        name, env_var, candidates = "c++-compiler", "CXX", ["c++", "g++", "clang++"]
        need = f"C++17 compiler: g++ >= {MIN_GCC[0]} or clang++ >= {MIN_CLANG[0]}"
        fix = ctx.fix("apt-get install build-essential (g++)", brew="xcode-select --install")
    too_old_fix = ctx.fix(f"apt-get install g++-12 and set CC/CXX, or clang >= {MIN_CLANG[0]}",
                          brew="xcode-select --install (update the Command Line Tools)")
    chosen = None
    env_cmd = (ctx.env.get(env_var) or "").split()
    for cand in ([env_cmd[0]] if env_cmd else []) + candidates:
        path = ctx.which(cand)
        if path:
            chosen = path
            break
    if not chosen:
        return Tool(name, False, None, None, "missing", need, fix)
    out = ctx.cmd([chosen, "--version"])
    if not out.ok:
        return Tool(name, True, chosen, None, "error", need, fix, detail=out.error)
    flavour, version = _compiler_flavour(out.text)
    v = parse_version(version)
    if v is None:
        return Tool(name, True, chosen, None, "unknown", need, None, detail=f"{flavour}; version not parsed")
    minimum = MIN_GCC if flavour == "gcc" else MIN_CLANG if flavour in ("clang", "apple-clang") else None
    if minimum is None:
        return Tool(name, True, chosen, version, "ok", need, None,
                    detail="unrecognised compiler: C++17 support not verified")
    if v < minimum:
        return Tool(name, True, chosen, version, "too old", need, too_old_fix,
                    detail=f"{flavour} {version} < {_vstr(minimum)}")
    return Tool(name, True, chosen, version, "ok", need, None, detail=flavour)


def check_cmake(ctx: _Ctx) -> Tool:
    return _version_tool(
        ctx, "cmake", ctx.which("cmake"), ["--version"],
        _regex_version(r"cmake\S* version (\d+\.\d+(?:\.\d+)?)", r"version (\d+\.\d+(?:\.\d+)?)"),
        need=(f">= {_vstr(MIN_CMAKE)} (cpu); >= {_vstr(MIN_CMAKE_CUDA)} cuda, >= {_vstr(MIN_CMAKE_VULKAN)} vulkan, "
              f">= {_vstr(MIN_CMAKE_HIP)} hip"),
        fix=ctx.fix("apt-get install cmake", pip="pip install cmake", brew="brew install cmake"),
        minimum=MIN_CMAKE,
        too_old_fix=ctx.fix("pip install -U cmake", brew="brew upgrade cmake"),
    )


def check_ninja(ctx: _Ctx) -> Tool:
    return _version_tool(
        ctx, "ninja", ctx.which("ninja"), ["--version"], _first_version,
        need="optional: faster builds (CMake -G Ninja; else Unix Makefiles)",
        fix=ctx.fix("apt-get install ninja-build", pip="pip install ninja", brew="brew install ninja"),
        optional=True,
    )


def check_git(ctx: _Ctx) -> Tool:
    return _version_tool(
        ctx, "git", ctx.which("git"), ["--version"], _regex_version(r"git version (\d+\.\d+(?:\.\d+)?)"),
        need="applies the tqgguf patch series (git apply)",
        fix=ctx.fix("apt-get install git", brew="xcode-select --install"),
    )


def check_nvcc(ctx: _Ctx) -> Tool:
    exe = ctx.which("nvcc")
    if not exe:
        for cand in [ctx.env.get("CUDA_PATH"), ctx.env.get("CUDA_HOME"), "/usr/local/cuda"]:
            if cand and ctx.exists(Path(cand) / "bin" / "nvcc"):
                exe = str(ctx.p(Path(cand) / "bin" / "nvcc"))
                break
    return _version_tool(
        ctx, "nvcc", exe, ["--version"],
        _regex_version(r"\bV(\d+\.\d+(?:\.\d+)?)", r"release (\d+\.\d+)"),
        need=f"CUDA toolkit >= {_vstr(MIN_CUDA)} (cuda backend)",
        fix=("apt-get install nvidia-cuda-toolkit (Debian non-free), or NVIDIA's CUDA toolkit (PyPI's "
             "nvidia-cuda-nvcc wheels hold ptxas, not nvcc)"),
        minimum=MIN_CUDA,
        too_old_fix=f"install CUDA toolkit >= {_vstr(MIN_CUDA)} (NVIDIA's repository)",
    )


def _mib(s: str) -> int | None:
    m = re.search(r"(\d+)", s)
    return int(m.group(1)) if m else None


def check_nvidia_smi(ctx: _Ctx) -> tuple[Tool, list[dict]]:
    need = "optional: lists NVIDIA GPUs and their compute capability (for CMAKE_CUDA_ARCHITECTURES)"
    exe = ctx.which("nvidia-smi")
    if not exe:
        return Tool("nvidia-smi", False, None, None, "missing", need,
                    "NVIDIA driver utilities (nvidia-smi); not needed to build with an explicit --cuda-arch",
                    optional=True), []
    out = ctx.cmd([exe, "--query-gpu=name,compute_cap,memory.total,memory.free", "--format=csv,noheader"])
    if not out.ok:
        return Tool("nvidia-smi", True, exe, None, "error", need, None, optional=True,
                    detail=f"no usable GPU/driver: {out.error}"), []
    gpus = []
    for row in csv.reader(io.StringIO(out.text)):
        cells = [c.strip() for c in row]
        if len(cells) < 2 or not cells[0]:
            continue
        cc = cells[1] if re.fullmatch(r"\d+\.\d+", cells[1]) else None
        gpus.append({
            "vendor": "nvidia",
            "name": cells[0],
            "compute_cap": cc,
            "cuda_arch": cc.replace(".", "") if cc else None,
            "memory_total_mib": _mib(cells[2]) if len(cells) > 2 else None,
            "memory_free_mib": _mib(cells[3]) if len(cells) > 3 else None,
        })
    detail = f"{len(gpus)} GPU(s)" if gpus else "no GPU listed"
    return Tool("nvidia-smi", True, exe, None, "ok", need, None, detail=detail, optional=True), gpus


def _vulkan_header_candidates(ctx: _Ctx) -> list[Path]:
    cands = []
    sdk = ctx.env.get("VULKAN_SDK")
    if sdk:
        cands.append(ctx.p(Path(sdk) / "include/vulkan/vulkan_core.h"))
    cands += [ctx.p("/usr/include/vulkan/vulkan_core.h"), ctx.p("/usr/local/include/vulkan/vulkan_core.h")]
    if ctx.darwin:
        cands.append(ctx.p("/opt/homebrew/include/vulkan/vulkan_core.h"))
    return cands


def parse_vulkan_header(text: str) -> dict:
    """VK_HEADER_VERSION, the full version (VK_HEADER_VERSION_COMPLETE) and whether VK_EXT_layer_settings exists."""
    m = re.search(r"^\s*#define\s+VK_HEADER_VERSION\s+(\d+)", text, re.M)
    header = int(m.group(1)) if m else None
    full = None
    m = re.search(r"^\s*#define\s+VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_API_VERSION\(\s*\d+\s*,\s*(\d+)\s*,\s*(\d+)\s*,"
                  r"\s*VK_HEADER_VERSION\s*\)", text, re.M)
    if not m:  # pre-1.2.175 headers: VK_MAKE_VERSION(1, 2, VK_HEADER_VERSION)
        m = re.search(r"^\s*#define\s+VK_HEADER_VERSION_COMPLETE\s+VK_MAKE_VERSION\(\s*(\d+)\s*,\s*(\d+)\s*,"
                      r"\s*VK_HEADER_VERSION\s*\)", text, re.M)
    if m and header is not None:
        full = (int(m.group(1)), int(m.group(2)), header)
    layer_settings = re.search(r"^\s*#define\s+VK_EXT_layer_settings\b", text, re.M) is not None
    return {"header_version": header, "version": full, "layer_settings": layer_settings}


def check_vulkan_headers(ctx: _Ctx, vulkan_header: Path | None) -> Tool:
    need = "Vulkan headers with the C++ bindings (vulkan.hpp)"
    fix = "apt-get install libvulkan-dev"
    if ctx.darwin:
        fix = "brew install vulkan-headers vulkan-loader molten-vk (or the LunarG Vulkan SDK)"
    cands = [Path(vulkan_header)] if vulkan_header is not None else _vulkan_header_candidates(ctx)
    header = next((c for c in cands if c.is_file()), None)
    if header is None:
        return Tool("vulkan-headers", False, None, None, "missing", need, fix,
                    detail="vulkan/vulkan_core.h not found")
    shown = ctx.show(header) if vulkan_header is None else str(header)
    try:
        text = header.read_text(errors="replace")
    except OSError as e:
        return Tool("vulkan-headers", True, shown, None, "error", need, fix, detail=f"cannot read: {e}")
    info = parse_vulkan_header(text)
    full, hv = info["version"], info["header_version"]
    version = _vstr(full) if full else (str(hv) if hv is not None else None)
    hpp = header.parent / "vulkan.hpp"
    if not hpp.is_file():
        return Tool("vulkan-headers", True, shown, version, "missing", need, fix,
                    detail="vulkan.hpp (C++ bindings) missing next to vulkan_core.h")
    if info["layer_settings"]:
        return Tool("vulkan-headers", True, shown, version, "ok", need, None)
    # No VK_EXT_layer_settings (the define is what counts, whatever the number says): upstream's tree would not
    # compile, the patched one leaves the validation layer's settings out (patch 0001)
    older = f" (< {_vstr(VK_LAYER_SETTINGS_MIN_HEADER)})" if full is not None and full < VK_LAYER_SETTINGS_MIN_HEADER else ""
    return Tool("vulkan-headers", True, shown, version, "ok", need, None,
                detail=f"no VK_EXT_layer_settings{older}: builds with patch 0001, without the validation layer's settings")


def check_vulkan_loader(ctx: _Ctx) -> Tool:
    need = "Vulkan loader library to link (libvulkan.so)"
    fix = ctx.fix("apt-get install libvulkan-dev", brew="brew install vulkan-loader")
    dev_name = "libvulkan.dylib" if ctx.darwin else "libvulkan.so"
    runtime = None
    ldconfig = ctx.which("ldconfig") or next((p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if ctx.exists(p)), None)
    if ldconfig and not ctx.darwin:
        out = ctx.cmd([ldconfig, "-p"])
        if out.ok:
            for line in out.text.splitlines():
                m = re.match(r"\s*(libvulkan\.so(?:\.\d+)*)\s.*=>\s*(\S+)", line)
                if not m:
                    continue
                if m.group(1) == "libvulkan.so":
                    return Tool("vulkan-loader", True, m.group(2), None, "ok", need, None)
                runtime = runtime or m.group(2)
    dirs = []
    sdk = ctx.env.get("VULKAN_SDK")
    if sdk:
        dirs.append(f"{sdk}/lib")
    dirs += ["/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
             "/lib/x86_64-linux-gnu", "/opt/homebrew/lib"]
    for d in dirs:
        if ctx.exists(f"{d}/{dev_name}"):
            return Tool("vulkan-loader", True, f"{d}/{dev_name}", None, "ok", need, None)
        if runtime is None and ctx.exists(f"{d}/libvulkan.so.1"):
            runtime = f"{d}/libvulkan.so.1"
    if runtime:
        return Tool("vulkan-loader", False, None, None, "missing", need, fix,
                    detail=f"runtime {runtime} present, but the link-time {dev_name} (libvulkan-dev) is not")
    return Tool("vulkan-loader", False, None, None, "missing", need, fix)


def check_glslc(ctx: _Ctx) -> Tool:
    exe = ctx.which("glslc")
    sdk = ctx.env.get("VULKAN_SDK")
    if not exe and sdk and ctx.exists(f"{sdk}/bin/glslc"):
        exe = str(ctx.p(f"{sdk}/bin/glslc"))
    return _version_tool(
        ctx, "glslc", exe, ["--version"], _regex_version(r"shaderc v?(\d+\.\d+(?:\.\d+)?)", r"(\d+\.\d+(?:\.\d+)?)"),
        need="GLSL -> SPIR-V shader compiler (find_package(Vulkan COMPONENTS glslc REQUIRED))",
        fix=ctx.fix("apt-get install glslc", brew="brew install shaderc"),
    )


def check_spirv_headers(ctx: _Ctx) -> Tool:
    need = "SPIR-V headers: spirv/unified1/spirv.hpp + CMake package SPIRV-Headers (find_package CONFIG REQUIRED)"
    fix = ctx.fix("apt-get install spirv-headers", brew="brew install spirv-headers")
    prefixes = []
    sdk = ctx.env.get("VULKAN_SDK")
    if sdk:
        prefixes.append(sdk.rstrip("/"))
    prefixes += ["/usr", "/usr/local"] + (["/opt/homebrew"] if ctx.darwin else [])
    header = None
    for pre in prefixes:
        for rel in ("include/spirv/unified1/spirv.hpp", "include/spirv-headers/spirv.hpp"):
            if ctx.exists(f"{pre}/{rel}"):
                header = header or f"{pre}/{rel}"
    config = None
    for pre in prefixes:
        for sub in ("share/cmake/SPIRV-Headers", "lib/cmake/SPIRV-Headers", "lib64/cmake/SPIRV-Headers",
                    "lib/*/cmake/SPIRV-Headers", "share/SPIRV-Headers/cmake"):
            for cfg in ("SPIRV-HeadersConfig.cmake", "spirv-headers-config.cmake"):
                hits = ctx.glob(f"{pre}/{sub}/{cfg}")
                if hits and config is None:
                    config = hits[0]
    version = None
    if config is not None:
        for vf in config.parent.glob("*onfig*ersion.cmake"):
            try:
                m = re.search(r'set\(\s*PACKAGE_VERSION\s+"([^"]+)"', vf.read_text(errors="replace"))
            except OSError:
                m = None
            if m:
                version = m.group(1)
                break
    if header and config is not None:
        return Tool("spirv-headers", True, header, version, "ok", need, None)
    missing = [what for what, got in (("spirv.hpp", header), ("SPIRV-HeadersConfig.cmake", config)) if not got]
    return Tool("spirv-headers", bool(header or config), header or (ctx.show(config) if config else None), version,
                "missing", need, fix, detail="not found: " + ", ".join(missing))


def _rocm_path(ctx: _Ctx) -> str:
    """Mirror ggml-hip/CMakeLists.txt: $ROCM_PATH, else /opt/rocm if it exists, else /usr."""
    env = ctx.env.get("ROCM_PATH")
    if env and ctx.exists(env):
        return env.rstrip("/") or "/"
    return "/opt/rocm" if ctx.exists("/opt/rocm") else "/usr"


_HIP_FIX = (f"install ROCm >= {_vstr(MIN_HIP)} from AMD's repository (apt-get install rocm-hip-sdk, or hipcc hipblas-dev "
            "rocblas-dev), or Debian unstable's hipcc libhipblas-dev librocblas-dev (6.4); Debian 12 ships hipcc 5.2 "
            "and no hipBLAS, Debian 13 5.7 (scripts/hip_check.sh compiles in a Debian unstable chroot)")


def check_hip(ctx: _Ctx) -> Tool:
    need = f"HIP/ROCm >= {_vstr(MIN_HIP)} (hipconfig / hipcc; ggml-hip FATAL_ERRORs below 6.1)"
    rocm = _rocm_path(ctx)
    hipconfig = ctx.which("hipconfig") or (str(ctx.p(f"{rocm}/bin/hipconfig")) if ctx.exists(f"{rocm}/bin/hipconfig") else None)
    hipcc = ctx.which("hipcc") or (str(ctx.p(f"{rocm}/bin/hipcc")) if ctx.exists(f"{rocm}/bin/hipcc") else None)
    if not hipconfig and not hipcc:
        return Tool("hip", False, None, None, "missing", need, _HIP_FIX)
    errors = []
    version = None
    path = hipconfig or hipcc
    # hipconfig --version prints e.g. "6.1.40091-a8dbc0c19"; hipcc --version has "HIP version: 5.2.21153-0".
    for exe, argv, parse in ((hipconfig, ["--version"], _first_version),
                             (hipcc, ["--version"], _regex_version(r"HIP version:\s*(\d+\.\d+(?:\.\d+)?)"))):
        if not exe:
            continue
        out = ctx.cmd([exe, *argv])
        if not out.ok:
            errors.append(out.error)
            continue
        version = parse(out.text)
        if version:
            path = exe
            break
    if version is None:
        if errors:
            return Tool("hip", True, path, None, "error", need, _HIP_FIX, detail="; ".join(errors))
        return Tool("hip", True, path, None, "unknown", need, None, detail="HIP version not parsed")
    v = parse_version(version)
    if v is not None and v < MIN_HIP:
        return Tool("hip", True, path, version, "too old", need, _HIP_FIX, detail=f"{version} < {_vstr(MIN_HIP)}")
    detail = None if hipconfig else "hipconfig not found (tqgguf's build uses `hipconfig -l` to find HIP's clang)"
    return Tool("hip", True, path, version, "ok", need, None, detail=detail)


def check_rocm_lib(ctx: _Ctx, lib: str) -> Tool:
    """hipblas / rocblas: find_package(<lib> REQUIRED) needs <lib>-config.cmake under ROCm."""
    need = f"{lib} (find_package({lib} REQUIRED) in ggml-hip)"
    fix = (f"apt-get install {lib}-dev from AMD's ROCm >= {_vstr(MIN_HIP)} repository, or lib{lib}-dev from Debian "
           "unstable (Debian 12 has none, Debian 13 only 5.5)")
    rocm = _rocm_path(ctx)
    pats = [f"{rocm}/lib/cmake/{lib}/{lib}-config.cmake", f"{rocm}/lib64/cmake/{lib}/{lib}-config.cmake",
            f"/usr/lib/*/cmake/{lib}/{lib}-config.cmake", f"/opt/rocm*/lib/cmake/{lib}/{lib}-config.cmake"]
    for pat in pats:
        hits = ctx.glob(pat)
        if hits:
            cfg = hits[0]
            version = None
            vf = cfg.parent / f"{lib}-config-version.cmake"
            try:
                if vf.is_file():
                    m = re.search(r'set\(\s*PACKAGE_VERSION\s+"([^"]+)"', vf.read_text(errors="replace"))
                    version = m.group(1) if m else None
            except OSError:
                pass
            return Tool(lib, True, ctx.show(cfg), version, "ok", need, None)
    return Tool(lib, False, None, None, "missing", need, fix)


def check_metal(ctx: _Ctx) -> list[Tool]:
    sdk_need = "macOS SDK (Xcode Command Line Tools): Metal/MetalKit/Foundation frameworks"
    mc_need = "optional: Metal shader compiler (only for GGML_METAL_EMBED_LIBRARY=OFF; tqgguf embeds)"
    if not ctx.darwin:
        return [Tool("xcode-sdk", False, None, None, "not applicable", sdk_need + " (macOS only)", None),
                Tool("metal", False, None, None, "not applicable", mc_need + " (macOS only)", None, optional=True)]
    fix = "xcode-select --install"
    xcrun = ctx.which("xcrun")
    if not xcrun:
        return [Tool("xcode-sdk", False, None, None, "missing", sdk_need, fix),
                Tool("metal", False, None, None, "missing", mc_need, "install Xcode", optional=True)]
    out = ctx.cmd([xcrun, "--show-sdk-path"])
    if out.ok:
        ver = ctx.cmd([xcrun, "--show-sdk-version"])
        sdk = Tool("xcode-sdk", True, out.text.strip().splitlines()[0] if out.text.strip() else xcrun,
                   _first_version(ver.text) if ver.ok else None, "ok", sdk_need, None)
    else:
        sdk = Tool("xcode-sdk", True, xcrun, None, "error", sdk_need, fix, detail=out.error)
    out = ctx.cmd([xcrun, "-sdk", "macosx", "--find", "metal"])
    if out.ok and out.text.strip():
        metal = Tool("metal", True, out.text.strip().splitlines()[0], None, "ok", mc_need, None, optional=True)
    else:
        metal = Tool("metal", False, None, None, "missing", mc_need,
                     "install full Xcode (xcode-select -s /Applications/Xcode.app)", optional=True,
                     detail=out.error)
    return [sdk, metal]


# ---- verdicts -----------------------------------------------------------------------------------


def _usable(t: Tool | None) -> bool:
    return t is not None and t.status not in BLOCKING


class _Verdict:
    def __init__(self, backend: str, tools: dict[str, Tool]):
        self.v = BackendVerdict(backend, True)
        self.tools = tools

    def need(self, name: str, why: str | None = None) -> None:
        t = self.tools.get(name)
        if _usable(t):
            if t.status == "unknown":
                self.note(f"{name}: {t.detail or 'version unknown'}; assuming it is usable")
            return
        status = t.status if t else "missing"
        text = f"{name} {status}" + (f": {t.detail}" if t and t.detail else "") + (f" [{why}]" if why else "")
        self.block(text, t.fix if t else None)

    def need_cmake(self, minimum: tuple[int, ...]) -> None:
        t = self.tools.get("cmake")
        self.need("cmake")
        if _usable(t) and t.version:
            v = parse_version(t.version)
            if v is not None and v < minimum:
                self.block(f"cmake {t.version} < {_vstr(minimum)} (required by the {self.v.backend} backend)",
                           "pip install -U cmake")

    def block(self, reason: str, fix: str | None) -> None:
        self.v.buildable = False
        self.v.reasons.append(reason)
        if fix and fix not in self.v.fixes:
            self.v.fixes.append(fix)

    def note(self, text: str) -> None:
        if text not in self.v.notes:
            self.v.notes.append(text)


def _base(backend: str, tools: dict[str, Tool], min_cmake: tuple[int, ...]) -> _Verdict:
    vd = _Verdict(backend, tools)
    vd.need("c-compiler")
    vd.need("c++-compiler")
    vd.need_cmake(min_cmake)
    vd.need("git", "needed to apply the patch series")
    ninja = tools.get("ninja")
    if not _usable(ninja) and backend == "cpu":
        vd.note(f"ninja not found: builds use Unix Makefiles (slower); {ninja.fix if ninja else ''}".rstrip("; "))
    return vd


def _verdicts(tools: dict[str, Tool], gpus: list[dict], platform: str,
              cpu_note: str | None = None) -> list[BackendVerdict]:
    cpu = _base("cpu", tools, MIN_CMAKE)
    if cpu_note:
        cpu.note(cpu_note)
    out = [cpu.v]

    cuda = _base("cuda", tools, MIN_CMAKE_CUDA)
    cuda.need("nvcc", "CUDA toolkit")
    nvcc = tools.get("nvcc")
    nv = parse_version(nvcc.version) if nvcc and nvcc.version else None
    if gpus:
        archs = sorted({g["cuda_arch"] for g in gpus if g.get("cuda_arch")})
        names = ", ".join(f"{g['name']} (sm_{g['cuda_arch']})" for g in gpus)
        cuda.note(f"GPU(s): {names}; the default --cuda-arch native works, or pass --cuda-arch {';'.join(archs) or 'N'}")
        if nv is not None and nv >= (13,):
            old = [g["name"] for g in gpus if g.get("cuda_arch") and int(g["cuda_arch"]) < 75]
            if old:
                cuda.note(f"CUDA {nvcc.version} dropped compute capability < 7.5: {', '.join(old)} need CUDA 12.x")
    else:
        cuda.note("no NVIDIA GPU visible: still buildable, but pass an explicit --cuda-arch "
                  "(e.g. 90 for H100/H200, 89 for RTX 40xx/L4, 86 for RTX 30xx, 80 for A100)")
    cm = tools.get("cmake")
    cmv = parse_version(cm.version) if cm and cm.version else None
    if cmv is not None and cmv < MIN_CMAKE_CUDA_NATIVE:
        cuda.note(f"cmake {cm.version} < {_vstr(MIN_CMAKE_CUDA_NATIVE)} cannot use --cuda-arch native: pass it explicitly")
    out.append(cuda.v)

    hip = _base("hip", tools, MIN_CMAKE_HIP)
    hip.need("hip", "HIP compiler/runtime")
    hip.need("hipblas")
    hip.need("rocblas")
    out.append(hip.v)

    vk = _base("vulkan", tools, MIN_CMAKE_VULKAN)
    vk.need("vulkan-headers")
    vk.need("vulkan-loader")
    vk.need("glslc")
    vk.need("spirv-headers")
    if vk.v.buildable:
        vk.note("running needs a Vulkan driver (e.g. mesa-vulkan-drivers or the NVIDIA driver's ICD)")
        vk.note(VULKAN_TURBO_NOTE)
    out.append(vk.v)

    if platform != "darwin":
        out.append(BackendVerdict("metal", False, ["Metal is macOS-only (not applicable on this platform)"], []))
    else:
        mt = _base("metal", tools, MIN_CMAKE)
        mt.need("xcode-sdk", "Metal frameworks")
        if mt.v.buildable:
            mt.note(NO_TURBO_KERNELS_NOTE)
        out.append(mt.v)
    return out


# ---- entry points -------------------------------------------------------------------------------


def _guard(name: str, fn: Callable, *args):
    """Run one check; an unexpected exception becomes an "error" row instead of a crash."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        return Tool(name, False, None, None, "error", "", None, detail=f"check crashed: {type(e).__name__}: {e}")


def nvidia_gpus() -> list[dict]:
    """The NVIDIA GPUs nvidia-smi lists on this machine (as `tqgguf doctor` reports them); empty without it."""
    _, gpus = check_nvidia_smi(_Ctx(shutil.which, subprocess.run, sys.platform, os.environ, Path("/")))
    return gpus


def run_doctor(which: Which = shutil.which, run: Run = subprocess.run, platform: str = sys.platform, *,
               env: Mapping[str, str] | None = None, fs_root: str | os.PathLike = "/",
               vulkan_header: str | os.PathLike | None = None, machine: str | None = None) -> DoctorReport:
    """Check the toolchains on this machine and say which backends the pinned llama.cpp can be built for.

    `which`, `run`, `platform`, `env` (default os.environ), `fs_root` (prefix for every absolute path the
    checks look at), `vulkan_header` (explicit vulkan_core.h) and `machine` (platform.machine()) are injectable for
    tests.
    """
    ctx = _Ctx(which, run, platform, os.environ if env is None else env, Path(fs_root))
    tools: list[Tool] = [
        _guard("c-compiler", check_compiler, ctx, "c"),
        _guard("c++-compiler", check_compiler, ctx, "c++"),
        _guard("cmake", check_cmake, ctx),
        _guard("ninja", check_ninja, ctx),
        _guard("git", check_git, ctx),
        _guard("nvcc", check_nvcc, ctx),
    ]
    smi = _guard("nvidia-smi", check_nvidia_smi, ctx)
    if isinstance(smi, Tool):
        tools.append(smi)
        gpus: list[dict] = []
    else:
        tools.append(smi[0])
        gpus = smi[1]
    tools += [
        _guard("vulkan-headers", check_vulkan_headers, ctx, Path(vulkan_header) if vulkan_header is not None else None),
        _guard("vulkan-loader", check_vulkan_loader, ctx),
        _guard("glslc", check_glslc, ctx),
        _guard("spirv-headers", check_spirv_headers, ctx),
        _guard("hip", check_hip, ctx),
        _guard("hipblas", check_rocm_lib, ctx, "hipblas"),
        _guard("rocblas", check_rocm_lib, ctx, "rocblas"),
    ]
    metal = _guard("xcode-sdk", check_metal, ctx)
    tools += metal if isinstance(metal, list) else [metal]
    by_name = {t.name: t for t in tools}
    cpuinfo = ctx.p("/proc/cpuinfo")
    try:
        text = cpuinfo.read_text(errors="replace") if cpuinfo.is_file() else None
    except OSError:
        text = None
    try:
        backends = _verdicts(by_name, gpus, platform,
                             cpu_turbo_note(_platform.machine() if machine is None else machine, text))
    except Exception as e:  # noqa: BLE001 - never crash; say so instead
        backends = [BackendVerdict(b, False, [f"verdict failed: {type(e).__name__}: {e}"], [])
                    for b in ("cpu", "cuda", "hip", "vulkan", "metal")]
    return DoctorReport(tools=tools, backends=backends, gpus=gpus, platform=platform)


def format_report(report: DoctorReport) -> str:
    """Plain-text tables: tools, GPUs, backends (with reasons and fixes)."""
    lines: list[str] = []
    rows = [(t.name, t.status + (" (optional)" if t.optional and t.status not in ("ok", "not applicable") else ""),
             t.version or "-", t.path or "-", t.detail or "") for t in report.tools]
    heads = ("tool", "status", "version", "path", "detail")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads[:4])]

    def fmt(cells) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells[:4], widths)) + ("  " + cells[4] if cells[4] else "")

    lines.append("Toolchains")
    lines.append("  " + fmt(heads).rstrip())
    lines.append("  " + "  ".join("-" * w for w in widths))
    for r in rows:
        lines.append("  " + fmt(r).rstrip())
    fixes = [(t.name, t.fix) for t in report.tools if t.fix and t.status not in ("ok", "not applicable")]
    if fixes:
        lines.append("")
        lines.append("Fixes")
        for name, fix in fixes:
            lines.append(f"  {name}: {fix}")
    lines.append("")
    lines.append("GPUs")
    if report.gpus:
        for g in report.gpus:
            mem = (f", {g['memory_total_mib']} MiB total, {g['memory_free_mib']} MiB free"
                   if g.get("memory_total_mib") is not None else "")
            lines.append(f"  {g.get('vendor', '?')}: {g['name']} (compute {g.get('compute_cap') or '?'}{mem})")
    else:
        lines.append("  none detected")
    lines.append("")
    lines.append("Backends")
    for b in report.backends:
        lines.append(f"  {b.backend:<7} {'buildable' if b.buildable else 'NOT buildable'}")
        for r in b.reasons:
            lines.append(f"            - {r}")
        for f in b.fixes:
            lines.append(f"            fix: {f}")
        for n in b.notes:
            lines.append(f"            note: {n}")
    return "\n".join(lines)
