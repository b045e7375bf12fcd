#!/usr/bin/env python3
"""Compile a patched tree's turbo CUDA sources for every NVIDIA architecture users build for, without a GPU.

`tqgguf build -b cuda` builds for the local GPU, and upstream's default list for builds without GGML_NATIVE starts
with 50-virtual, 61-virtual and 70-virtual under CUDA 12: a turbo kernel that does not compile for one of them
breaks those builds. This runs scripts/cuda_check.py on the turbo FlashAttention instances and the other CUDA
files the series patches, once per architecture, and writes a Markdown summary and a JSON file.

CUDA 13 (the local `nvcc`) compiles for sm_75 and newer only. For Maxwell, Pascal and Volta (sm_50, sm_61, sm_70)
the script fetches Debian 12's CUDA 11.8 packages (non-free: nvidia-cuda-toolkit and nvidia-cuda-dev, 858 MB,
checked by sha256 and unpacked without installing) into --cuda11-dir. CUDA 11.8 predates GCC 12, so it runs with
-allow-unsupported-compiler; ggml-cuda.cu does not compile that way even without the series (GCC 12's <map>), so it
is left out of the CUDA 11.8 runs.

    python scripts/cuda_archs.py TREE --out bench/results/cuda-archs-local
    python scripts/cuda_archs.py TREE --archs 61,86 -j 2

Exit codes: 0 every file compiled for every architecture, 1 a file failed, 2 bad arguments or a missing toolkit.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import requests

from tqgguf.source import sha256_file

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "scripts" / "cuda_check.py"

OTHER_FILES = ["set-rows.cu", "cpy.cu", "convert.cu", "fwht.cu", "rope.cu", "getrows.cu", "ggml-cuda.cu"]
NOT_ON_CUDA11 = {"ggml-cuda.cu"}  # fails with CUDA 11.8 and GCC 12 on the pristine tree too
DEFAULT_ARCHS = "50,61,70,75,80,86,89,90,120"
CUDA11_ARCHS = {"50", "52", "53", "60", "61", "62", "70", "72"}

POOL = "http://deb.debian.org/debian/pool/non-free/n/nvidia-cuda-toolkit/"
CUDA11_DEBS = {  # Debian 12 (bookworm) non-free, 11.8.89~11.8.0-5~deb12u1
    "nvidia-cuda-toolkit_11.8.89%7e11.8.0-5%7edeb12u1_amd64.deb":
        "d1156026e704fe0368b6295db06224ed00a727966fb13454f34e3f3102db0457",
    "nvidia-cuda-dev_11.8.89%7e11.8.0-5%7edeb12u1_amd64.deb":
        "dc63bf2fb94aaaf903e9bad0c35f631266077d016b34329ec7af456bd7fed5ec",
}


def cuda11(dest: Path) -> Path:
    """The CUDA 11.8 nvcc wrapper under dest, fetched and unpacked on first use."""
    wrapper = dest / "nvcc"
    if wrapper.is_file():
        return wrapper
    if not shutil.which("dpkg-deb"):
        raise SystemExit("cuda_archs: dpkg-deb is needed to unpack CUDA 11.8 (Debian's dpkg)")
    dest.mkdir(parents=True, exist_ok=True)
    root = dest / "root"
    for name, digest in CUDA11_DEBS.items():
        deb = dest / name.replace("%7e", "~")
        if not deb.is_file() or sha256_file(deb) != digest:
            print(f"fetching {POOL}{name} ...", file=sys.stderr)
            with requests.get(POOL + name, stream=True, timeout=60) as r, open(deb, "wb") as f:
                r.raise_for_status()
                for chunk in r.iter_content(1 << 20):
                    f.write(chunk)
            if sha256_file(deb) != digest:
                deb.unlink()
                raise SystemExit(f"cuda_archs: {deb.name}: sha256 mismatch")
        subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    bindir = root / "usr/lib/nvidia-cuda-toolkit/bin"
    # the package's profile names /usr paths: point it at the unpacked tree instead
    (bindir / "nvcc.profile").unlink(missing_ok=True)
    (bindir / "nvcc.profile").write_text(
        f"NVVMIR_LIBRARY_DIR = {root}/usr/lib/nvidia-cuda-toolkit/libdevice\n"
        f"PATH += {bindir}:{root}/usr/bin:\n"
        f'INCLUDES += "-I{root}/usr/include" $(_SPACE_)\n')
    # Debian's bin/g++ and bin/gcc pick an older GCC that is not installed: name the system's compiler
    cxx = shutil.which("g++") or "g++"
    wrapper.write_text(f'#!/bin/sh\nexec "{bindir}/nvcc" -ccbin "{cxx}" -allow-unsupported-compiler "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


def nvcc_release(nvcc: str) -> str:
    """'CUDA 13.0' from nvcc --version."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
    rel = next((ln.split("release ", 1)[1].split(",")[0] for ln in out.splitlines() if "release " in ln), "?")
    return f"CUDA {rel}"


def run_check(tree: Path, arch: str, files: list[str], kernels: str, nvcc: str, includes: list[str],
              jobs: int) -> dict:
    cmd = [sys.executable, str(CHECK), str(tree), *files, "--arch", arch, "--kernels", kernels, "--nvcc", nvcc,
           "-j", str(jobs), "--json"]
    for inc in includes:
        cmd += ["--include", inc]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode == 2 or not p.stdout.strip():
        raise SystemExit(f"cuda_archs: cuda_check failed for sm_{arch}: {p.stderr.strip()[-400:]}")
    return json.loads(p.stdout)


def summarize(arch: str, toolkit: str, report: dict) -> dict:
    files = report["files"]
    spilling = [k for k in report["kernels"] if k["spill_stores"] + k["spill_loads"]]
    return {
        "arch": arch, "toolkit": toolkit, "files": len(files),
        "failed": [{"file": f["file"], "errors": f["errors"][:3]} for f in files if not f["ok"]],
        "kernels": len(report["kernels"]),
        "spilling": [{"kernel": k.get("demangled") or k["name"], "registers": k["registers"],
                      "spill_stores": k["spill_stores"], "spill_loads": k["spill_loads"]} for k in spilling],
        "max_registers": max((k["registers"] for k in report["kernels"]), default=0),
        "seconds": round(sum(f["seconds"] for f in files), 1),
    }


def markdown(rows: list[dict]) -> str:
    out = ["| arch | toolkit | files | failed | kernels | spilling kernels | most registers |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        failed = ", ".join(Path(f["file"]).name for f in r["failed"]) or "none"
        out.append(f"| sm_{r['arch']} | {r['toolkit']} | {r['files']} | {failed} | {r['kernels']} | "
                   f"{len(r['spilling'])} | {r['max_registers']} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("tree", type=Path, help="a patched llama.cpp tree")
    ap.add_argument("--archs", default=DEFAULT_ARCHS, help=f"compute capabilities (default: {DEFAULT_ARCHS})")
    ap.add_argument("--out", type=Path, help="write summary.md and summary.json here")
    ap.add_argument("--include", action="append", default=[], metavar="DIR",
                    help="cuBLAS's headers for CUDA 13 (see scripts/cuda_check.py)")
    ap.add_argument("--cuda11-dir", type=Path, default=Path(tempfile.gettempdir()) / "tqgguf-cuda-11.8",
                    help="where CUDA 11.8 is fetched and unpacked (default: %(default)s)")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"),
                    help="the nvcc for sm_75 and newer (default: $NVCC or nvcc)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    a = ap.parse_args(argv)

    tree = a.tree.resolve()
    inst = sorted(p.relative_to(tree).as_posix() for p in
                  (tree / "ggml/src/ggml-cuda/template-instances").glob("fattn-turbo-instance-*.cu"))
    if not inst:
        print(f"cuda_archs: {a.tree} has no fattn-turbo instance files (not a patched tree)", file=sys.stderr)
        return 2
    rows = []
    for arch in [x.strip() for x in a.archs.split(",") if x.strip()]:
        old = arch in CUDA11_ARCHS
        nvcc = str(cuda11(a.cuda11_dir)) if old else (shutil.which(a.nvcc) or "")
        if not nvcc:
            print(f"cuda_archs: {a.nvcc} not found, which sm_75 and newer need (install the CUDA toolkit, or pass "
                  "--nvcc)", file=sys.stderr)
            return 2
        includes = [str(a.cuda11_dir / "root/usr/include")] if old else a.include
        other = [f"ggml/src/ggml-cuda/{f}" for f in OTHER_FILES if not (old and f in NOT_ON_CUDA11)]
        print(f"sm_{arch}: {len(inst)} turbo instance files and {len(other)} other files ...", file=sys.stderr)
        turbo = run_check(tree, arch, inst, "turbo", nvcc, includes, a.jobs)
        rest = run_check(tree, arch, other, ".", nvcc, includes, a.jobs)
        merged = {"files": turbo["files"] + rest["files"], "kernels": turbo["kernels"] + rest["kernels"]}
        rows.append(summarize(arch, nvcc_release(nvcc), merged))
        print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr)
    table = markdown(rows)
    print(table)
    if a.out:
        a.out.mkdir(parents=True, exist_ok=True)
        (a.out / "summary.md").write_text(table + "\n")
        (a.out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if any(r["failed"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
