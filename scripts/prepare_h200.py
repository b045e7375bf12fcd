#!/usr/bin/env python3
"""Prepare what a run on the lent H200 machine needs, under the 64 MiB a run can carry.

Writes (default) .h200/ in the repository root, which .gitignore lists:
  .h200/llama.cpp/     the pinned tree with the patch series applied, without docs/, .git and models/
                       except the vocab file `tqgguf synth` uses; gguf-py stays (synth imports it there)
  .h200/cmake-args.txt the CMake arguments of `tqgguf build --backend cuda --cuda-arch 90-real`, one per line
  .h200/commit.txt     the tqgguf commit the tree was prepared from
  .h200/wiki-300k.txt  300 kB of ../shared/data/wikitext-2-raw-test.txt (parity and diag steps), when present

With --vulkan the tree keeps ggml/src/ggml-vulkan, and .h200/vulkan-sdk/ gets what a Vulkan build needs and the
H200 machine lacks (it has the NVIDIA driver's Vulkan ICD only), copied from this machine's Debian packages:
  include/{vulkan,vk_video,spirv}  libvulkan-dev's and spirv-headers' headers
  lib/libvulkan.so*, lib/libshaderc.so*, bin/glslc   the loader to link and the shader compiler
  share/cmake/SPIRV-Headers        find_package(SPIRV-Headers) (paths relative to the folder)
Both travel as .h200/vulkan.tar.gz (the unpacked tree and SDK would fill the 64 MiB alone); scripts/h200_vulkan.sh
unpacks it there, builds the Vulkan backend and runs test-backend-ops and llama-bench on it.

  .h200/llama.cpp.tar.gz  the tree packed (scripts/h200_run.sh unpacks it where .h200/llama.cpp was not carried)

Then scripts/h200_run.sh builds, synthesizes the models, checks every turbo op against the CPU backend with
test-backend-ops and measures speed; call it through the device tool with carry [".h200/llama.cpp.tar.gz",
".h200/cmake-args.txt", ".h200/commit.txt", ".h200/wiki-300k.txt"] (the unpacked tree and the repository together
exceed the 64 MiB a run carries):
  bash scripts/h200_run.sh            (results under $OUT, or ./h200-out)

The machine there has python3 with numpy, typer and rich, so tqgguf itself runs from the repository.

With --pristine it writes what scripts/gpu_cli.sh needs instead (tqgguf's own commands on the GPU, starting with
`tqgguf build --source`, which applies the series itself):
  .h200/pristine.tar.gz   the pinned tree without the series, slimmed as above but keeping every folder the series
                          patches and tools/ui (llama-server's build configures it)
  .h200/pydeps/           requests and its dependencies, copied from this Python (tqgguf serve and niah talk to
                          llama-server with it; the machine's python3 may not have it)
and carry [".h200/pristine.tar.gz", ".h200/pydeps", ".h200/commit.txt", ".h200/wiki-300k.txt"].
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tqgguf.build import BuildSpec, cmake_args, work_tree  # noqa: E402
from tqgguf.patches import sync_series, touched_files  # noqa: E402
from tqgguf.pin import load_pin  # noqa: E402
from tqgguf.source import pinned_source  # noqa: E402

KEEP_VOCAB = "ggml-vocab-llama-bpe.gguf"
# not configured by a CUDA build without examples and server (h200_run.sh adds -DLLAMA_BUILD_SERVER=OFF)
SKIP_TOP = {".git", "docs", "media", ".github", ".devops", "examples", "pocs", "benches"}
SKIP_TOOLS = {"ui"}
SKIP_GGML_BACKENDS = {"ggml-openvino", "ggml-webgpu", "ggml-et", "ggml-metal", "ggml-hexagon", "ggml-sycl",
                      "ggml-vulkan", "ggml-opencl", "ggml-cann", "ggml-zdnn", "ggml-zendnn", "ggml-virtgpu"}


def ignore(dirpath: str, names: list[str]) -> set[str]:
    d = Path(dirpath)
    skip = {n for n in names if n == "tqgguf-series.json"}
    if (d / "CMakeLists.txt").is_file() and (d / "ggml").is_dir():  # the tree's root
        skip |= {n for n in names if n in SKIP_TOP}
    if d.name == "tools" and d.parent.joinpath("ggml").is_dir():
        skip |= {n for n in names if n in SKIP_TOOLS}
    if d.name == "src" and d.parent.name == "ggml":
        skip |= {n for n in names if n in SKIP_GGML_BACKENDS}
    if d.name == "models" and (d / "ggml-vocab-llama-bpe.gguf").exists():
        skip |= {n for n in names if n != KEEP_VOCAB}
    return skip


# Debian's file locations of the Vulkan build pieces (libvulkan-dev, glslc, libshaderc1, spirv-headers)
VULKAN_SDK_PARTS = {
    "include/vulkan": "/usr/include/vulkan",
    "include/vk_video": "/usr/include/vk_video",
    "include/spirv": "/usr/include/spirv",
    "share/cmake/SPIRV-Headers": "/usr/share/cmake/SPIRV-Headers",
    "bin/glslc": "/usr/bin/glslc",
}
VULKAN_SDK_LIBS = ("libvulkan.so", "libshaderc.so")
# headers that neither vulkan.hpp nor ggml-vulkan include (4 MB of the 64 MiB a run carries); SPIR-V: unified1 only
VULKAN_SDK_SKIP = {"vulkan_raii.hpp", "vulkan_hash.hpp", "vulkan_static_assertions.hpp", "vulkan_format_traits.hpp",
                   "vulkan_shared.hpp", "1.0", "1.1", "1.2", "spir-v.xml"}


# --vulkan: the tree also leaves out what a Vulkan build on x86 does not configure or compile (the CUDA/HIP/MUSA,
# RPC and BLAS backends, the server tools with LLAMA_BUILD_SERVER=OFF, the CPU backend's other architectures, the
# Python conversion scripts), which keeps the archive small
VULKAN_SKIP = {("ggml/src", "ggml-cuda"), ("ggml/src", "ggml-hip"), ("ggml/src", "ggml-musa"), ("tools", "server"),
               ("tools", "cli"), (".", "conversion"), (".", "scripts"), ("ggml/src/ggml-cpu", "spacemit"),
               ("ggml/src/ggml-cpu", "kleidiai"), ("ggml/src", "ggml-rpc"), ("ggml/src", "ggml-blas")}
VULKAN_CPU_ARCHS = {"x86"}


def copy_vulkan_sdk(dest: Path) -> None:
    """Copy this machine's Vulkan headers, loader, glslc and SPIR-V headers into dest (see the module doc)."""
    if dest.exists():
        shutil.rmtree(dest)
    missing = [src for src in VULKAN_SDK_PARTS.values() if not Path(src).exists()]
    libdir = Path("/usr/lib/x86_64-linux-gnu")
    libs = [f for f in sorted(libdir.glob("lib*.so*")) if f.name.startswith(VULKAN_SDK_LIBS)]
    if not any(f.name.startswith("libvulkan.so") for f in libs):
        missing.append(str(libdir / "libvulkan.so"))
    if missing:
        raise SystemExit("prepare_h200 --vulkan: missing " + ", ".join(missing)
                         + " (apt-get install libvulkan-dev glslc spirv-headers)")
    for rel, src in VULKAN_SDK_PARTS.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if Path(src).is_dir():
            shutil.copytree(src, target, symlinks=True, ignore=lambda d, names: {n for n in names if n in VULKAN_SDK_SKIP})
        else:
            shutil.copy2(src, target)
    (dest / "lib").mkdir(parents=True, exist_ok=True)
    for f in libs:
        shutil.copy2(f, dest / "lib" / f.name, follow_symlinks=False)


def write_commit(out: Path) -> None:
    """out/commit.txt: the tqgguf commit (the device copy of the repository may not carry git history)."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "patches"], capture_output=True,
                           text=True).stdout.strip()
    (out / "commit.txt").write_text(f"{head.stdout.strip() or 'unknown'}{' (patches modified)' if dirty else ''}\n")


def write_excerpt(out: Path) -> None:
    """out/wiki-300k.txt: 300 kB of WikiText-2 when ../shared/data has it (the parity, diag and ppl steps' text)."""
    wiki = ROOT.parent / "shared" / "data" / "wikitext-2-raw-test.txt"
    excerpt = out / "wiki-300k.txt"
    if wiki.is_file():
        excerpt.write_bytes(wiki.read_bytes()[:300_000])
    else:
        excerpt.unlink(missing_ok=True)
        print(f"note: {wiki} not found; {excerpt.name} not written (the parity and diag steps need a text there)",
              file=sys.stderr)


# what tqgguf serve and niah import beyond numpy, typer and rich (requests and its dependencies)
PYDEPS = ("requests", "urllib3", "idna", "certifi", "charset_normalizer")


def write_pristine(out: Path, source_root: Path, patches: list[Path]) -> Path:
    """The pinned tree without the series as out/pristine.tar.gz, for `tqgguf build --source` on the machine."""
    patched = {rel for p in patches for rel in touched_files(p)}
    keep_backends = {Path(rel).parts[2] for rel in patched if rel.startswith("ggml/src/ggml-")}

    def ignore_pristine(dirpath: str, names: list[str]) -> set[str]:
        skip = ignore(dirpath, names) - keep_backends
        if Path(dirpath).name == "tools" and Path(dirpath).parent.joinpath("ggml").is_dir():
            skip -= {"ui"}
        return skip

    archive = out / "pristine.tar.gz"
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "llama.cpp"
        shutil.copytree(source_root, tree, ignore=ignore_pristine, symlinks=True)
        missing = sorted(rel for rel in patched if not (tree / rel).exists() and (source_root / rel).exists())
        if missing:
            raise SystemExit(f"prepare_h200 --pristine: the slim tree lacks {missing[0]}, which the series patches")
        with tarfile.open(archive, "w:gz") as tf:
            tf.add(tree, arcname="llama.cpp")
    return archive


def copy_pydeps(dest: Path) -> None:
    """Copy requests and its dependencies from this Python into dest (pure Python; an extension module built for
    this Python's version is passed over elsewhere, where charset_normalizer falls back to its .py files)."""
    import importlib.util

    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for name in PYDEPS:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"prepare_h200 --pristine: {name} is not installed here (pip install requests)")
        shutil.copytree(Path(next(iter(spec.submodule_search_locations))), dest / name,
                        ignore=shutil.ignore_patterns("__pycache__"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / ".h200", help="output folder (default: .h200)")
    ap.add_argument("--cuda-arch", default="90-real",
                    help="CMAKE_CUDA_ARCHITECTURES (default: 90-real, the H200's GPU code without PTX)")
    ap.add_argument("--vulkan", action="store_true",
                    help="keep ggml-vulkan in the tree and add vulkan-sdk/ (for scripts/h200_vulkan.sh)")
    ap.add_argument("--pristine", action="store_true",
                    help="write pristine.tar.gz and pydeps/ for scripts/gpu_cli.sh instead of the patched tree")
    args = ap.parse_args(argv)

    pin = load_pin()
    source = pinned_source(pin, lambda s: print(s, file=sys.stderr))
    if args.pristine:
        args.out.mkdir(parents=True, exist_ok=True)
        archive = write_pristine(args.out, source.root, pin.patch_paths)
        copy_pydeps(args.out / "pydeps")
        write_commit(args.out)
        write_excerpt(args.out)
        print(f"wrote {archive} ({archive.stat().st_size / 2**20:.1f} MiB) and {args.out / 'pydeps'}; pin "
              f"{pin.version} ({pin.upstream_commit}), {len(pin.patch_paths)} patches")
        print('carry [".h200/pristine.tar.gz", ".h200/pydeps", ".h200/commit.txt", ".h200/wiki-300k.txt"]',
              file=sys.stderr)
        return 0
    work = work_tree(source)
    changed = sync_series(source.root, work, pin.patch_paths)
    print(f"series applied to {work} ({len(changed)} file(s) updated)", file=sys.stderr)

    dest = args.out / "llama.cpp"
    if dest.exists():
        shutil.rmtree(dest)
    args.out.mkdir(parents=True, exist_ok=True)
    skip_backends = SKIP_GGML_BACKENDS - ({"ggml-vulkan"} if args.vulkan else set())

    def ignore_for_run(dirpath: str, names: list[str]) -> set[str]:
        skip = ignore(dirpath, names)
        if Path(dirpath).name == "src" and Path(dirpath).parent.name == "ggml":
            skip = (skip - SKIP_GGML_BACKENDS) | {n for n in names if n in skip_backends}
        if args.vulkan:
            rel = Path(dirpath).relative_to(work).as_posix()
            skip |= {n for n in names if (rel, n) in VULKAN_SKIP}
            if rel == "ggml/src/ggml-cpu/arch":
                skip |= {n for n in names if n not in VULKAN_CPU_ARCHS}
        return skip

    shutil.copytree(work, dest, ignore=ignore_for_run, symlinks=True)
    if args.vulkan:
        copy_vulkan_sdk(args.out / "vulkan-sdk")
    else:
        shutil.rmtree(args.out / "vulkan-sdk", ignore_errors=True)
    spec = BuildSpec(backends=["cuda"], cuda_arch=args.cuda_arch)
    (args.out / "cmake-args.txt").write_text("\n".join(cmake_args(spec)) + "\n")
    write_commit(args.out)
    if args.vulkan:
        (args.out / "wiki-300k.txt").unlink(missing_ok=True)  # h200_vulkan.sh reads no text
    else:
        write_excerpt(args.out)

    if args.vulkan:
        # unpacked, the tree and the SDK would take about as much as a run carries with the repository (64 MiB):
        # they travel as one compressed archive, which h200_vulkan.sh unpacks on the machine
        archive = args.out / "vulkan.tar.gz"
        with tarfile.open(archive, "w:gz") as tf:
            tf.add(dest, arcname="llama.cpp")
            tf.add(args.out / "vulkan-sdk", arcname="vulkan-sdk")
        shutil.rmtree(dest)
        shutil.rmtree(args.out / "vulkan-sdk")
        print(f"wrote {archive}: {archive.stat().st_size / 2**20:.1f} MiB; pin {pin.version} ({pin.upstream_commit}), "
              f"{len(pin.patch_paths)} patches")
        return 0
    (args.out / "vulkan.tar.gz").unlink(missing_ok=True)

    # the tree also travels packed (llama.cpp.tar.gz, which h200_run.sh unpacks where the tree was not carried): the
    # unpacked tree and the repository's tracked files together came near the 64 MiB a run carries; the tree stays
    # here unpacked for dry-running experiment diffs
    archive = args.out / "llama.cpp.tar.gz"
    archive.unlink(missing_ok=True)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file() and not p.is_symlink())
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(dest, arcname="llama.cpp")
    print(f"wrote {args.out}: {size / 2**20:.1f} MiB, the tree packed in {archive.name} "
          f"({archive.stat().st_size / 2**20:.1f} MiB); pin {pin.version} ({pin.upstream_commit}), "
          f"{len(pin.patch_paths)} patches")
    print('carry [".h200/llama.cpp.tar.gz", ".h200/cmake-args.txt", ".h200/commit.txt", ".h200/wiki-300k.txt"]',
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
