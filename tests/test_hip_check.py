"""scripts/hip_check.sh: its arguments (the build itself needs root, debootstrap and a network; it is run by hand)."""

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "hip_check.sh"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0


def test_help_describes_the_options():
    p = run("--help")
    assert p.returncode == 0
    for word in ("--root", "--arch", "--full", "--out", "gfx942", "Debian sid", "Exit codes"):
        assert word in p.stdout


def test_an_unknown_argument_is_one_line_and_exit_2():
    p = run("--bogus")
    assert p.returncode == 2
    assert p.stderr.strip() == "hip_check: unknown argument --bogus (see --help)"
    assert p.stdout == ""
