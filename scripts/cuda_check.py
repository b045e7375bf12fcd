#!/usr/bin/env python3
"""Compile a patched tree's CUDA sources for one architecture, without a GPU, and report each kernel's registers,
shared memory and spills: the check before spending device time on a change.

By default it compiles the turbo FlashAttention instance files (`fattn-turbo-instance-*.cu`), where the decode
kernel is instantiated for every pair of K/V types and head size; other files can be named. Each file is compiled
alone (`nvcc -c`, as ggml's build does, with ptxas's resource report), several at a time, and the report lists the
kernels whose names match --kernels.

    python scripts/cuda_check.py /work/lt --include /tmp/cublas/nvidia/cu13/include -j 2
    python scripts/cuda_check.py .h200/llama.cpp ggml/src/ggml-cuda/set-rows.cu --kernels set_rows --json

ggml-cuda's headers include cuBLAS's; a machine with nvcc but without cuBLAS can take the headers from PyPI:

    pip download --no-deps nvidia-cublas -d /tmp/cublas && unzip -q -o '/tmp/cublas/*.whl' 'nvidia/*/include/*' -d /tmp/cublas

Exit codes: 0 all files compiled, 1 a file failed to compile (its first error lines are printed), 2 bad arguments
(no tree, no files, no nvcc).
"""

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqgguf.bindings import ggml_types
from tqgguf.errors import TqError

DEFAULT_GLOB = "ggml/src/ggml-cuda/template-instances/fattn-turbo-instance-*.cu"
DEFAULT_KERNELS = r"turbo"

ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\w+)'")
PROPS = re.compile(r"Function properties for (?P<name>\S+)")
SPILL = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads")
USED = re.compile(r"Used (?P<regs>\d+) registers")
SMEM = re.compile(r"(?P<smem>\d+) bytes smem")


@dataclass
class Kernel:
    file: str
    name: str  # mangled, as ptxas prints it
    arch: str
    registers: int = 0
    smem: int = 0  # static shared memory, bytes
    stack: int = 0
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spills(self) -> int:
        return self.spill_stores + self.spill_loads


def parse_ptxas(text: str, file: str = "") -> list[Kernel]:
    """The kernels of ptxas's -v report (nvcc -Xptxas -v), in order. A function's properties line comes right
    after its entry line, but device functions without an entry (non-inlined calls) also have properties: those are
    matched by name and left out."""
    kernels: dict[str, Kernel] = {}
    cur: Kernel | None = None
    for line in text.splitlines():
        if m := ENTRY.search(line):
            cur = kernels.setdefault(m["name"], Kernel(file, m["name"], m["arch"]))
            continue
        if m := PROPS.search(line):
            cur = kernels.get(m["name"])
            continue
        if cur is None:
            continue
        if m := SPILL.search(line):
            cur.stack, cur.spill_stores, cur.spill_loads = int(m["stack"]), int(m["st"]), int(m["ld"])
        if m := USED.search(line):
            cur.registers = int(m["regs"])
            if s := SMEM.search(line):
                cur.smem = int(s["smem"])
    return list(kernels.values())


def demangle(names: list[str]) -> dict[str, str]:
    """Readable names through c++filt where it is installed (binutils); the mangled names otherwise."""
    exe = shutil.which("c++filt")
    if not exe or not names:
        return {n: n for n in names}
    try:
        out = subprocess.run([exe], input="\n".join(names), capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return {n: n for n in names}
    lines = out.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {n: n for n in names}


def ggml_type_names(tree: Path) -> dict[int, str]:
    """ggml_type's values -> lower-case names (turbo3_0, q8_0), from the tree's ggml.h; empty if it is not there."""
    try:
        types = ggml_types(tree / "ggml" / "include" / "ggml.h")
    except (OSError, TqError):
        return {}
    return {v: k.removeprefix("GGML_TYPE_").lower() for k, v in types.items()}


def short_name(demangled: str, types: dict[int, str] | None = None) -> str:
    """The kernel's name with its template arguments, without the parameter list; ggml_type arguments by name."""
    name = demangled
    if name.startswith("void "):
        name = name[5:]
    depth = 0
    for i, c in enumerate(name):  # cut at the parameter list: the first '(' outside the template brackets
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            name = name[:i]
            break
    types = types or {}
    return re.sub(r"\(ggml_type\)(\d+)", lambda m: types.get(int(m[1]), m[1]), name)


def nvcc_command(nvcc: str, tree: Path, src: Path, obj: Path, arch: str, includes: list[str]) -> list[str]:
    cmd = [nvcc, "-std=c++17", f"-arch=sm_{arch}", "-O3", "-DNDEBUG", "-use_fast_math", "-extended-lambda",
           "-Xptxas", "-v", "-I", str(tree / "ggml/include"), "-I", str(tree / "ggml/src"),
           "-I", str(tree / "ggml/src/ggml-cuda")]
    for inc in includes:
        cmd += ["-I", inc]
    return cmd + ["-c", str(src), "-o", str(obj)]


@dataclass
class Result:
    file: str
    ok: bool
    seconds: float
    kernels: list[Kernel]
    errors: list[str]


def compile_one(nvcc: str, tree: Path, src: Path, arch: str, includes: list[str], tmp: Path) -> Result:
    obj = tmp / (src.name + ".o")
    t0 = time.monotonic()
    p = subprocess.run(nvcc_command(nvcc, tree, src, obj, arch, includes), capture_output=True, text=True)
    dt = time.monotonic() - t0
    rel = str(src.relative_to(tree)) if src.is_relative_to(tree) else str(src)
    text = p.stdout + "\n" + p.stderr
    errors = [ln for ln in text.splitlines() if "error" in ln.lower() and "ptxas info" not in ln][:8]
    if p.returncode != 0 and not errors:
        errors = [ln for ln in text.splitlines() if ln.strip()][-8:]
    return Result(rel, p.returncode == 0, dt, parse_ptxas(text, rel), errors)


def table(rows: list[tuple[Kernel, str]]) -> str:
    out = ["| file | kernel | registers | smem | spill stores/loads |", "| --- | --- | --- | --- | --- |"]
    for k, name in rows:
        spill = f"{k.spill_stores}/{k.spill_loads}" if k.spills else "0"
        out.append(f"| {Path(k.file).name} | {name} | {k.registers} | {k.smem} | {spill} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("tree", type=Path, help="a patched llama.cpp tree (its root, with ggml/)")
    ap.add_argument("files", nargs="*", help=f"CUDA sources, relative to the tree (default: {DEFAULT_GLOB})")
    ap.add_argument("--arch", default="90", help="compute capability without the dot (default: 90)")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1, help="files compiled at a time")
    ap.add_argument("--include", action="append", default=[], metavar="DIR", help="another include directory")
    ap.add_argument("--kernels", default=DEFAULT_KERNELS, metavar="REGEX",
                    help=f"report the kernels whose mangled name matches (default: {DEFAULT_KERNELS!r})")
    ap.add_argument("--nvcc", default=os.environ.get("NVCC", "nvcc"), help="the nvcc to run (default: $NVCC or nvcc)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    a = ap.parse_args(argv)

    tree = a.tree.resolve()
    if not (tree / "ggml" / "src" / "ggml-cuda").is_dir():
        print(f"cuda_check: {a.tree} is not a llama.cpp tree (no ggml/src/ggml-cuda)", file=sys.stderr)
        return 2
    files = [tree / f for f in a.files] if a.files else sorted(tree.glob(DEFAULT_GLOB))
    missing = [f for f in files if not f.is_file()]
    if missing or not files:
        print(f"cuda_check: no such source: {missing[0]}" if missing else f"cuda_check: no {DEFAULT_GLOB} in {tree}",
              file=sys.stderr)
        return 2
    nvcc = shutil.which(a.nvcc)
    if not nvcc:
        print(f"cuda_check: {a.nvcc} not found (install the CUDA toolkit, or pass --nvcc)", file=sys.stderr)
        return 2
    try:
        pattern = re.compile(a.kernels)
    except re.error as e:
        print(f"cuda_check: bad --kernels pattern: {e}", file=sys.stderr)
        return 2

    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="cuda-check-") as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        futs = [pool.submit(compile_one, nvcc, tree, f, a.arch, a.include, Path(tmp)) for f in files]
        for n, fut in enumerate(concurrent.futures.as_completed(futs), 1):
            r = fut.result()
            results.append(r)
            print(f"[{n}/{len(files)}] {'ok    ' if r.ok else 'FAILED'} {Path(r.file).name} ({r.seconds:.0f} s)",
                  file=sys.stderr)
    results.sort(key=lambda r: r.file)

    kernels = [k for r in results for k in r.kernels if pattern.search(k.name)]
    names = demangle([k.name for k in kernels])
    types = ggml_type_names(tree)
    failed = [r for r in results if not r.ok]
    if a.json:
        print(json.dumps({
            "tree": str(tree), "arch": a.arch,
            "files": [{"file": r.file, "ok": r.ok, "seconds": round(r.seconds, 1), "errors": r.errors} for r in results],
            "kernels": [dict(asdict(k), demangled=short_name(names[k.name], types)) for k in kernels],
        }, indent=1))
    else:
        print(table([(k, short_name(names[k.name], types)) for k in kernels]))
        spilling = [k for k in kernels if k.spills]
        print(f"\n{len(results)} files, {len(failed)} failed; {len(kernels)} kernels, {len(spilling)} spill; "
              f"most registers {max((k.registers for k in kernels), default=0)}, "
              f"most static shared memory {max((k.smem for k in kernels), default=0)} bytes")
    for r in failed:
        print(f"{r.file} failed:", *("  " + e for e in r.errors), sep="\n", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
