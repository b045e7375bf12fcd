"""Tests for scripts/sass_loop.py: parsing cuobjdump's SASS listing and finding a kernel's main loop."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "sass_loop.py"

# the shape of `cuobjdump -sass` output: two functions, the second with an outer loop around an inner loop that
# holds the MMA, a branch forward and a never-executed placeholder (@!PT), as ptxas puts next to cp.async copies
LISTING = """
Fatbin elf code:
================
arch = sm_90

        code for sm_90
                Function : _Z5otheri
        .headerflags    @"EF_CUDA_SM90"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x00000a0000017a02 */
        /*0010*/                   EXIT ;                                   /* 0x000000000000794d */
                Function : _Z6kernelILi128EEvv
        .headerflags    @"EF_CUDA_SM90"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x00000a0000017a02 */
        /*0010*/                   IMAD R2, R3, 0x50, RZ ;                 /* 0x0000005003027824 */
        /*0020*/                   LDS R4, [R2] ;                          /* 0x0000000002047984 */
        /*0030*/                   HMMA.16816.F32 R8, R4, R6, R8 ;          /* 0x000000060408723c */
        /*0040*/              @!P0 LDGSTS.E [R5], desc[UR6][R76.64] ;      /* 0x000000004c05afae */
        /*0050*/               @P1 BRA 0x80 ;                               /* 0x0000000000001947 */
        /*0060*/              @!PT LDS RZ, [RZ] ;                           /* 0x00000000fffff984 */
        /*0070*/                   IADD3 R2, R2, 0x1, RZ ;                 /* 0x0000000102027810 */
        /*0080*/              @!P0 BRA 0x20 ;                               /* 0xfffffffc00008947 */
        /*0090*/                   IADD3 R9, R9, 0x1, RZ ;                 /* 0x0000000109097810 */
        /*00a0*/              @!P2 BRA 0x10 ;                               /* 0xfffffff800008947 */
        /*00b0*/                   EXIT ;                                   /* 0x000000000000794d */
"""


@pytest.fixture(scope="module")
def sl(load_script):
    return load_script(SCRIPT)


def test_functions_splits_the_listing_per_kernel(sl):
    fns = sl.functions(LISTING)
    assert set(fns) == {"_Z5otheri", "_Z6kernelILi128EEvv"}
    assert fns["_Z5otheri"] == [(0x0, "MOV R1, c[0x0][0x28]"), (0x10, "EXIT")]
    kernel = fns["_Z6kernelILi128EEvv"]
    assert len(kernel) == 12
    assert kernel[4] == (0x40, "@!P0 LDGSTS.E [R5], desc[UR6][R76.64]")


def test_main_loop_is_the_smallest_backward_branch_around_the_marker(sl):
    kernel = sl.functions(LISTING)["_Z6kernelILi128EEvv"]
    loop = sl.main_loop(kernel, "HMMA")
    # the inner loop 0x20-0x80, not the outer one from 0x10; the forward branch at 0x50 closes no loop
    assert [a for a, _ in loop] == [0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x80]
    assert sl.main_loop(kernel, "DADD") == []


def test_opcode_drops_predicates_and_modifiers(sl):
    assert sl.opcode("@!P0 LDGSTS.E [R5], desc[UR6][R76.64]") == "LDGSTS"
    assert sl.opcode("@P1 BRA 0x70") == "BRA"
    assert sl.opcode("HMMA.16816.F32 R8, R4, R6, R8") == "HMMA"


def test_cli_counts_the_loop_and_reports_bad_input(tmp_path):
    fake = tmp_path / "cuobjdump"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{LISTING}\nEOF\n")
    fake.chmod(0o755)

    def run(*args):
        return subprocess.run([sys.executable, str(SCRIPT), "--cuobjdump", str(fake), *args],
                              capture_output=True, text=True)

    ok = run("x.o", "kernelILi128")
    assert ok.returncode == 0, ok.stderr
    assert "main loop 7" in ok.stdout
    lines = ok.stdout.splitlines()
    counts = dict(item.split(":") for item in lines[2].split())
    assert counts == {"LDS": "2", "HMMA": "1", "LDGSTS": "1", "BRA": "2", "IADD3": "1"}
    assert lines[3] == "of them never executed (@!PT): LDS:1"

    ambiguous = run("x.o", "_Z")
    assert ambiguous.returncode == 1 and "2 functions match" in ambiguous.stderr

    no_loop = run("x.o", "other")
    assert no_loop.returncode == 1 and "no loop with HMMA" in no_loop.stderr

    missing = subprocess.run([sys.executable, str(SCRIPT), "--cuobjdump", str(tmp_path / "nope"), "x.o", "k"],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "not found" in missing.stderr
