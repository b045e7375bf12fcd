"""The CPU backend's turbo code on 64-bit ARM (patch 0058: NEON dots, dequantizers and V accumulation).

Apple Silicon, Graviton, Ampere and Raspberry Pi machines run ggml-cpu's arch/arm code. This module cross-compiles
the patched tree for aarch64 (Debian's g++-aarch64-linux-gnu, GGML_NATIVE off: plain ARMv8-A with NEON) and runs
test-turbo-fattn under qemu-aarch64. That program checks flash attention over turbo K/V (the decode row path: the
turbo x f32 dots for K and the fused V accumulation; the tiled path: the dequantizers), GET_ROWS, CPY, MUL_MAT and the
K-shift pattern against computations on the dequantized f32 values, so a wrong NEON lookup fails it. The
disassembly check makes sure those are the NEON functions (table lookups), not the generic C ones.

Needs g++-aarch64-linux-gnu and qemu-user (`.ci/run` installs them on Debian); skipped, naming what is missing,
without them. The cross build takes about 4 minutes on 2 cores and is kept in tqgguf's cache; the run under qemu
about 3 minutes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tqgguf.build import generator, work_tree
from tqgguf.paths import cache_dir

CROSS = "aarch64-linux-gnu"
SYSROOT = Path("/usr") / CROSS
TOOLS = {f"{CROSS}-gcc": "g++-aarch64-linux-gnu", f"{CROSS}-g++": "g++-aarch64-linux-gnu",
         f"{CROSS}-objdump": "binutils-aarch64-linux-gnu", "qemu-aarch64": "qemu-user"}


def _missing() -> list[str]:
    missing = sorted({f"{tool} (apt-get install {pkg})" for tool, pkg in TOOLS.items() if not shutil.which(tool)})
    if not (SYSROOT / "lib").is_dir():
        missing.append(f"the {CROSS} C library in {SYSROOT} (apt-get install libc6-dev-arm64-cross)")
    if not shutil.which("cmake"):
        missing.append("cmake")
    return missing


_MISSING = _missing()
pytestmark = [pytest.mark.build,
              pytest.mark.skipif(bool(_MISSING), reason="no aarch64 cross toolchain or qemu: " + "; ".join(_MISSING))]

TOOLCHAIN = f"""set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER {CROSS}-gcc)
set(CMAKE_CXX_COMPILER {CROSS}-g++)
set(CMAKE_FIND_ROOT_PATH {SYSROOT})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
"""

# the NEON functions of 0058 (arch/arm/quants.c); each must look its codebook up with TBL
NEON_FUNCTIONS = [f"ggml_{kind}_turbo{b}_0{suffix}" for b in (2, 3, 4)
                  for kind, suffix in (("vec_dot", "_f32"), ("dequantize_row", "_cpu"), ("vec_mad", "_cpu"))]


@pytest.fixture(scope="module")
def arm_build(cpu_build, pinned) -> Path:
    """An aarch64 build folder of the patched tree (the one the shared CPU build used), with test-turbo-fattn."""
    src = work_tree(pinned)
    build = cache_dir() / "build" / f"cross-{CROSS}-{pinned.key}"
    build.mkdir(parents=True, exist_ok=True)
    toolchain = build / "aarch64-toolchain.cmake"
    toolchain.write_text(TOOLCHAIN)
    log = build / "tqgguf-build.log"
    configure = ["cmake", "-S", str(src), "-B", str(build), "-G", generator(), f"-DCMAKE_TOOLCHAIN_FILE={toolchain}",
                 "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DBUILD_SHARED_LIBS=OFF", "-DGGML_OPENMP=OFF",
                 "-DLLAMA_BUILD_TESTS=ON", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                 "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF"]
    with open(log, "w") as f:
        for cmd in (configure, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2),
                                "--target", "test-turbo-fattn"]):
            r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=3600)
            assert r.returncode == 0, f"{' '.join(cmd[:2])} failed:\n" + log.read_text()[-4000:]
    return build


def _find(build: Path, name: str) -> Path:
    hits = sorted(build.rglob(name))
    assert hits, f"{name} not found under {build}"
    return hits[0]


def test_neon_functions_use_table_lookups(arm_build):
    """The turbo functions of the aarch64 ggml-cpu are 0058's NEON code: each has TBL lookups and calls no generic
    fallback."""
    obj = [p for p in arm_build.rglob("quants.c.o") if "arch/arm" in p.as_posix()]
    assert obj, "arch/arm/quants.c was not compiled"
    asm = subprocess.run([f"{CROSS}-objdump", "-d", "--no-show-raw-insn", str(obj[0])], capture_output=True,
                         text=True, check=True).stdout
    bodies = dict(re.findall(r"<(\w+)>:\n(.*?)(?=\n\n|\Z)", asm, flags=re.S))
    for fn in NEON_FUNCTIONS:
        assert fn in bodies, f"{fn} is not defined in arch/arm/quants.c"
        body = bodies[fn]
        assert re.search(r"\btbl\b", body), f"{fn} has no TBL: the generic code was compiled\n{body[:2000]}"
        assert "_generic" not in body, f"{fn} calls the generic code\n{body[:2000]}"


def test_turbo_fattn_under_qemu(arm_build):
    """test-turbo-fattn (flash attention, GET_ROWS, CPY, MUL_MAT, K-shift over turbo tensors against f32 math on the
    dequantized values) passes on aarch64."""
    exe = _find(arm_build, "test-turbo-fattn")
    r = subprocess.run(["qemu-aarch64", "-L", str(SYSROOT), str(exe)], capture_output=True, text=True, timeout=2400)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "FAIL" not in r.stdout, "\n".join(line for line in r.stdout.splitlines() if "FAIL" in line)
    m = re.search(r"(\d+)/(\d+) passed", out)
    assert m and m.group(1) == m.group(2) and int(m.group(2)) >= 700, out[-2000:]
    assert "PASS" in r.stdout
