"""`tqgguf build`: configure and build the patched llama.cpp for one or more backends, offline."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from . import __version__
from .errors import TqError
from .patches import patch_info, sync_series, tree_series
from .paths import cache_dir
from .pin import Pin
from .progress import error_lines, parse_line
from .source import Source

BACKENDS = ("cpu", "cuda", "hip", "vulkan", "metal")
DEFAULT_TARGETS = [
    "llama-server", "llama-perplexity", "llama-bench", "llama-cli", "llama-quantize",
    "llama-batched-bench", "test-backend-ops", "test-turbo-fattn",
]
# A command per binary that is known to exit 0 at the pinned upstream (not every binary has --version:
# test-backend-ops exits 1 on it, llama-quantize has none and exits 1 on --help). {source} is the source tree.
SMOKE = {
    "llama-server": ["--version"],
    "llama-perplexity": ["--version"],
    "llama-bench": ["--help"],
    "llama-cli": ["--version"],
    "llama-quantize": ["--dry-run", "{source}/models/ggml-vocab-llama-bpe.gguf", "Q8_0"],
    "llama-batched-bench": ["--version"],
    "test-backend-ops": ["test", "-b", "CPU", "-o", "ADD"],
}
# Upstream FlashAttention vector-kernel instances to compile for CUDA/HIP (f16-f16 is always built): upstream's
# default set plus the asymmetric f16/q8_0 pairs. Every pair with a turbo side has its own kernel (patch 0011),
# compiled always; the 19 other upstream quantized pairs are left out to keep the build short.
CUDA_FA_QUANTS = "q8_0-q8_0,f16-q8_0,q8_0-f16,q4_0-q4_0,bf16-bf16"
CUDA_COMPRESSION_MODES = ("none", "speed", "balance", "size")
MANIFEST = "tqgguf-manifest.json"
LOG = "tqgguf-build.log"

Progress = Callable[[int, int, str], None]


@dataclass
class BuildSpec:
    backends: list[str] = field(default_factory=lambda: ["cpu"])
    build_type: str = "Release"
    cuda_arch: str | None = None
    # nvcc's fatbinary compression (GGML_CUDA_COMPRESSION_MODE): upstream's default "size" suits binaries that are
    # shipped; a build for this machine spends that time for nothing, so tqgguf's default is "none" (the objects are
    # about twice as large; with 90-real, 9% less nvcc time in an H200 build, bench/results/cuda-build-local/)
    cuda_compression: str = "none"
    hip_arch: str | None = None
    native: bool = True
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))

    def __post_init__(self) -> None:
        bad = [b for b in self.backends if b not in BACKENDS]
        if bad:
            raise TqError(f"unknown backend {bad[0]!r}", f"choose from {', '.join(BACKENDS)}")
        self.backends = sorted(set(self.backends) | {"cpu"}, key=BACKENDS.index)
        if self.build_type not in ("Release", "Debug", "RelWithDebInfo", "MinSizeRel"):
            raise TqError(f"unknown build type {self.build_type!r}", "use Release, Debug, RelWithDebInfo or MinSizeRel")
        if self.cuda_compression not in CUDA_COMPRESSION_MODES:
            raise TqError(f"unknown CUDA compression mode {self.cuda_compression!r}",
                          f"choose from {', '.join(CUDA_COMPRESSION_MODES)}")
        if "metal" in self.backends and sys.platform != "darwin":
            raise TqError("the metal backend builds only on macOS")


def cmake_args(spec: BuildSpec) -> list[str]:
    """CMake cache arguments for a spec (no paths, no generator): the golden lists in the tests."""
    args = [
        f"-DCMAKE_BUILD_TYPE={spec.build_type}",
        "-DBUILD_SHARED_LIBS=ON",  # libllama.so for the Python bindings
        "-DLLAMA_BUILD_TESTS=ON",  # test-backend-ops
        "-DLLAMA_BUILD_TOOLS=ON",
        "-DLLAMA_BUILD_SERVER=ON",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        # Offline: no web-UI download at configure time, no HTTPS client.
        "-DLLAMA_BUILD_UI=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
        f"-DGGML_NATIVE={'ON' if spec.native else 'OFF'}",
    ]
    if "cuda" in spec.backends:
        args += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={spec.cuda_arch or 'native'}",
                 f"-DGGML_CUDA_COMPRESSION_MODE={spec.cuda_compression}"]
    if "hip" in spec.backends:
        args += ["-DGGML_HIP=ON"]
        if spec.hip_arch:
            args += [f"-DGPU_TARGETS={spec.hip_arch}"]
    if "cuda" in spec.backends or "hip" in spec.backends:
        args += [f"-DGGML_CUDA_FA_QUANTS={CUDA_FA_QUANTS}"]
    if "vulkan" in spec.backends:
        args += ["-DGGML_VULKAN=ON"]
    if "metal" in spec.backends:
        args += ["-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON"]
    elif sys.platform == "darwin":
        # ggml turns Metal on by default on Apple machines: without this a `-b cpu` build would offload layers to a
        # GPU that has no turbo kernels, while its manifest (and so every check of serve/ppl/bench) says CPU only
        args += ["-DGGML_METAL=OFF"]
    return args


def _first_line(cmd: list[str]) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        lines = [ln for ln in (r.stdout or r.stderr).splitlines() if ln.strip()]
        return lines[0].strip() if r.returncode == 0 and lines else "unavailable"
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"


def compiler_id(spec: BuildSpec) -> dict[str, str]:
    ids = {
        "cc": _first_line([os.environ.get("CC", "cc"), "--version"]),
        "cxx": _first_line([os.environ.get("CXX", "c++"), "--version"]),
        "machine": platform.machine(),
    }
    if "cuda" in spec.backends:
        r = _first_line(["nvcc", "--version"])
        try:
            out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True, timeout=20).stdout
            r = [ln for ln in out.splitlines() if ln.strip()][-1]
        except (OSError, subprocess.TimeoutExpired, IndexError):
            pass
        ids["nvcc"] = r
    return ids


def generator() -> str:
    return "Ninja" if shutil.which("ninja") else "Unix Makefiles"


def build_key(source: Source, spec: BuildSpec, compiler: dict[str, str]) -> str:
    blob = json.dumps({"source": source.key, "backends": spec.backends, "args": cmake_args(spec),
                       "generator": generator(), "compiler": compiler}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def work_tree(source: Source) -> Path:
    return cache_dir() / "work" / source.key / "llama.cpp"


def build_dir(source: Source, spec: BuildSpec) -> Path:
    name = "-".join(spec.backends) + "-" + build_key(source, spec, compiler_id(spec))
    return cache_dir() / "build" / name


def exe_name(name: str) -> str:
    return name + (".exe" if sys.platform == "win32" else "")


@dataclass
class BuildResult:
    build_dir: Path
    bin_dir: Path
    manifest: dict
    changed_files: list[str]
    steps: int  # compile and link steps the build ran (0: nothing was rebuilt)


def _run_logged(cmd: list[str], cwd: Path, log_path: Path, on_progress: Progress | None, env=None) -> tuple[int, int]:
    """Run a command, appending its output to the log; returns (exit code, compile/link steps run)."""
    steps = 0
    # line-buffered, so that `tail -f` on the log follows a long build
    with open(log_path, "a", buffering=1) as log:
        log.write(f"\n$ {' '.join(cmd)}\n")
        try:
            p = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                 bufsize=1, env=env, errors="replace")
        except FileNotFoundError as e:
            raise TqError(f"cannot run {cmd[0]}: {e.strerror}", "run `tqgguf doctor` to see what is missing") from None
        assert p.stdout is not None
        try:
            for line in p.stdout:
                log.write(line)
                step = parse_line(line)
                if step:
                    # Compile and link steps only: upstream's UI-assets target runs on every build but builds nothing.
                    steps += int(" Building " in line or " Linking " in line)
                    if on_progress:
                        on_progress(step.done, step.total, step.what)
        except KeyboardInterrupt:
            p.terminate()
            p.wait()
            raise
        return p.wait(), steps


def _fail(what: str, log_path: Path) -> TqError:
    lines = error_lines(log_path.read_text(errors="replace"))
    detail = ("\n  " + "\n  ".join(lines)) if lines else ""
    return TqError(f"{what} failed; full log: {log_path}{detail}", code=1)


def _env(spec: BuildSpec) -> dict:
    env = dict(os.environ)
    if "hip" in spec.backends and "HIPCXX" not in env and shutil.which("hipconfig"):
        llvm = subprocess.run(["hipconfig", "-l"], capture_output=True, text=True).stdout.strip()
        if llvm:
            env["HIPCXX"] = str(Path(llvm) / "clang")
    return env


def smoke(bin_dir: Path, names: list[str], source_root: Path) -> dict[str, str]:
    """Run each binary's known-good command; name -> 'ok' or the failure."""
    out = {}
    for name in names:
        args = [a.format(source=source_root) for a in SMOKE.get(name, [])] or None
        exe = bin_dir / exe_name(name)
        if args is None:
            continue
        if not exe.is_file():
            out[name] = "missing"
            continue
        try:
            r = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=120)
            out[name] = "ok" if r.returncode == 0 else f"exit {r.returncode}: {(r.stderr or r.stdout).strip()[-200:]}"
        except (OSError, subprocess.TimeoutExpired) as e:
            out[name] = f"failed: {e}"
    return out


def run_build(source: Source, pin: Pin, spec: BuildSpec, jobs: int | None = None,
              on_progress: Progress | None = None, log: Callable[[str], None] = lambda s: None) -> BuildResult:
    t0 = time.monotonic()
    if not shutil.which("cmake"):
        raise TqError("cmake is not installed", "apt-get install cmake (or pip install cmake); see `tqgguf doctor`")
    work = work_tree(source)
    if source.series_in_tree:
        # a `tqgguf patches apply` tree: the series (as its commits, perhaps edited) is in it already
        patches = []
        log(f"{source.root} has the series in its commits (tqgguf patches apply): building it as it is")
    else:
        patches = pin.patch_paths
        log(f"applying {len(patches)} patch(es) to {work}")
    changed = sync_series(source.root, work, patches, mirror=source.kind == "local")
    bdir = build_dir(source, spec)
    bdir.mkdir(parents=True, exist_ok=True)
    log_path = bdir / LOG
    log_path.write_text(f"tqgguf {__version__} build log\n")
    args = cmake_args(spec)
    args_file = bdir / "tqgguf-cmake-args.json"
    env = _env(spec)
    if not (bdir / "CMakeCache.txt").is_file() or not args_file.is_file() or json.loads(args_file.read_text()) != args:
        log("configuring with CMake ...")
        rc, _ = _run_logged(["cmake", "-S", str(work), "-B", str(bdir), "-G", generator(), *args], bdir, log_path, None, env)
        if rc != 0:
            raise _fail("CMake configure", log_path)
        args_file.write_text(json.dumps(args) + "\n")
    jobs = jobs or os.cpu_count() or 2
    rc, steps = _run_logged(["cmake", "--build", str(bdir), "--config", spec.build_type, "-j", str(jobs),
                             "--target", *spec.targets], bdir, log_path, on_progress, env)
    if rc != 0:
        raise _fail("build", log_path)
    bin_dir = bdir / "bin"
    smoke_results = smoke(bin_dir, spec.targets, work)
    bad = {k: v for k, v in smoke_results.items() if v != "ok"}
    manifest = {
        "tqgguf": __version__,
        "source": source.to_dict(),
        "patches": (tree_series(source.root) if source.series_in_tree
                    else [{"name": p.name, "sha256": patch_info(p).sha256} for p in patches]),
        "backends": spec.backends,
        "build_type": spec.build_type,
        "cmake_args": args,
        "generator": generator(),
        "compiler": compiler_id(spec),
        "build_dir": str(bdir),
        "binaries": {t: str(bin_dir / exe_name(t)) for t in spec.targets},
        "smoke": smoke_results,
        "steps": steps,
        "duration_s": round(time.monotonic() - t0, 1),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (bin_dir / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    if bad:
        name, why = next(iter(bad.items()))
        raise TqError(f"smoke test of {name} failed ({why}); log: {log_path}", code=1)
    return BuildResult(bdir, bin_dir, manifest, changed, steps)


def _read_manifest(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text()) if path.is_file() else None
    except (OSError, ValueError):
        return None


def find_manifest(source: Source, spec: BuildSpec, name: str | None = None) -> dict | None:
    """The manifest of the build of `source` for exactly this spec; failing that, of the newest build of `source` for
    the same backends (with `name` among its binaries, when given): `tqgguf build -b cuda --cuda-arch 90-real`
    serves `tqgguf serve -b cuda`, which knows only the backends."""
    exact = _read_manifest(build_dir(source, spec) / "bin" / MANIFEST)
    if exact is not None and (name is None or (Path(exact["build_dir"]) / "bin" / exe_name(name)).is_file()):
        return exact
    others = [m for m in builds(spec.backends, name) if (m.get("source") or {}).get("key") == source.key]
    return others[0] if others else exact


def builds(backends: list[str], name: str | None = None) -> list[dict]:
    """The manifests of every build in the cache for exactly these backends (with `name` among its binaries, when
    given), newest first."""
    out = []
    for path in (cache_dir() / "build").glob("-".join(backends) + "-*/bin/" + MANIFEST):
        m = _read_manifest(path)
        if m and m.get("backends") == backends and (name is None or (path.parent / exe_name(name)).is_file()):
            out.append(m)
    return sorted(out, key=lambda m: m.get("built_at", ""), reverse=True)


def find_bin(source: Source, spec: BuildSpec, name: str) -> Path:
    """The path of a built binary for this spec (or, failing that, another build for its backends), without
    building."""
    manifest = find_manifest(source, spec, name)
    cmd = "tqgguf build" + "".join(f" -b {b}" for b in spec.backends if b != "cpu")
    if manifest is None:
        raise TqError(f"no {'+'.join(spec.backends)} build found", f"run `{cmd}` first")
    path = Path(manifest["build_dir"]) / "bin" / exe_name(name)
    if not path.is_file():
        known = ", ".join(sorted(manifest["binaries"]))
        raise TqError(f"{name} is not in the {'+'.join(spec.backends)} build (built: {known})",
                      f"`{cmd}` builds it with the other tools tqgguf drives, or add it with --targets")
    return path
