#!/usr/bin/env python3
"""Prepare what a run on the lent H200 machine needs, under the 64 MiB a run can carry.

Writes (default) .h200/ in the repository root, which .gitignore lists:
  .h200/llama.cpp/     the pinned tree with the patch series applied, without docs/, .git and models/
                       except the vocab file `tqgguf synth` uses; gguf-py stays (synth imports it there)
  .h200/cmake-args.txt the CMake arguments of `tqgguf build --backend cuda --cuda-arch 90-real`, one per line
  .h200/commit.txt     the tqgguf commit the tree was prepared from
  .h200/wiki-300k.txt  300 kB of ../shared/data/wikitext-2-raw-test.txt (parity and diag steps), when present

Then scripts/h200_run.sh builds, synthesizes the models, checks every turbo op against the CPU backend with
test-backend-ops and measures speed; call it through the device tool with carry [".h200"]:
  bash scripts/h200_run.sh            (results under $OUT, or ./h200-out)

The machine there has python3 with numpy, typer and rich, so tqgguf itself runs from the repository.
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
from tqgguf.patches import sync_series  # noqa: E402
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


def packed_mib(path: Path) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp) / "a.tar.gz"
        with tarfile.open(t, "w:gz") as tf:
            tf.add(path, arcname=path.name)
        return t.stat().st_size / 2**20


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / ".h200", help="output folder (default: .h200)")
    ap.add_argument("--cuda-arch", default="90-real",
                    help="CMAKE_CUDA_ARCHITECTURES (default: 90-real, the H200's GPU code without PTX)")
    args = ap.parse_args(argv)

    pin = load_pin()
    source = pinned_source(pin, lambda s: print(s, file=sys.stderr))
    work = work_tree(source)
    changed = sync_series(source.root, work, pin.patch_paths)
    print(f"series applied to {work} ({len(changed)} file(s) updated)", file=sys.stderr)

    dest = args.out / "llama.cpp"
    if dest.exists():
        shutil.rmtree(dest)
    args.out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(work, dest, ignore=ignore, symlinks=True)
    spec = BuildSpec(backends=["cuda"], cuda_arch=args.cuda_arch)
    (args.out / "cmake-args.txt").write_text("\n".join(cmake_args(spec)) + "\n")
    # the device copy of the repository may not carry git history: record what the tree was made from
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "patches"], capture_output=True,
                           text=True).stdout.strip()
    (args.out / "commit.txt").write_text(f"{head.stdout.strip() or 'unknown'}{' (patches modified)' if dirty else ''}\n")

    # the text h200_run.sh's parity and diag steps read: 300 kB of WikiText-2 when ../shared/data has it
    wiki = ROOT.parent / "shared" / "data" / "wikitext-2-raw-test.txt"
    excerpt = args.out / "wiki-300k.txt"
    if wiki.is_file():
        excerpt.write_bytes(wiki.read_bytes()[:300_000])
    else:
        excerpt.unlink(missing_ok=True)
        print(f"note: {wiki} not found; {excerpt.name} not written (the parity and diag steps need a text there)",
              file=sys.stderr)

    size = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
    print(f"wrote {dest}: {size / 2**20:.1f} MiB, {packed_mib(dest):.1f} MiB packed; "
          f"pin {pin.version} ({pin.upstream_commit}), {len(pin.patch_paths)} patches")
    if size > 60 * 2**20:
        print("warning: over 60 MiB; a device run carries at most 64 MiB with the repository", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
