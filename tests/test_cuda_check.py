"""Tests for scripts/cuda_check.py: ptxas's resource report, kernel names, and the compile driver (with a fake nvcc,
so that they run without the CUDA toolkit)."""

import json
import stat
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "cuda_check.py"

MMA = "_Z24flash_attn_ext_turbo_mmaILi128ELi4EL9ggml_type44ELS0_44EEvPKcS2_S2_S2_S2_PKiPfP6float2ffffjfi5uint3iiiiiiiiiiiliiliiiiilPKfSA_fif"
COMBINE = "_Z24flash_attn_combine_turboILi128EEvPK6float2PKfPfiiPS3_i"
HELPER = "_Z10fwht_helperPfi"

PTXAS = f"""\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '{MMA}' for 'sm_90'
ptxas info    : Function properties for {MMA}
    0 bytes stack frame, 16 bytes spill stores, 24 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 20752 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 912.3 ms
ptxas info    : Function properties for {HELPER}
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '{COMBINE}' for 'sm_90'
ptxas info    : Function properties for {COMBINE}
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 62 registers, 2560 bytes smem, 392 bytes cmem[0]
"""


@pytest.fixture(scope="module")
def cc(load_script):
    return load_script(SCRIPT)


def test_parse_ptxas_reads_each_entry_and_skips_device_functions(cc):
    ks = cc.parse_ptxas(PTXAS, "a.cu")
    assert [k.name for k in ks] == [MMA, COMBINE]
    mma, comb = ks
    assert (mma.arch, mma.registers, mma.smem, mma.spill_stores, mma.spill_loads, mma.spills) == \
        ("sm_90", 128, 20752, 16, 24, 40)
    assert (comb.registers, comb.smem, comb.spills, comb.stack) == (62, 2560, 0, 0)
    assert mma.file == "a.cu"


def test_short_name_cuts_the_parameters_and_names_the_types(cc):
    demangled = ("void flash_attn_ext_turbo_mma<128, 4, (ggml_type)44, (ggml_type)8>"
                 "(char const*, char const*, float2*, float, int)")
    assert cc.short_name(demangled, {44: "turbo3_0", 8: "q8_0"}) == "flash_attn_ext_turbo_mma<128, 4, turbo3_0, q8_0>"
    assert cc.short_name(demangled) == "flash_attn_ext_turbo_mma<128, 4, 44, 8>"
    assert cc.short_name("k(int)") == "k"


def test_ggml_type_names_from_the_tree(cc, tmp_path):
    inc = tmp_path / "ggml" / "include"
    inc.mkdir(parents=True)
    (inc / "ggml.h").write_text("enum ggml_type {\n    GGML_TYPE_F32 = 0,\n    GGML_TYPE_TURBO3_0 = 44, // x\n};\n")
    assert cc.ggml_type_names(tmp_path) == {0: "f32", 44: "turbo3_0"}
    (inc / "ggml.h").write_text("no enum here\n")
    assert cc.ggml_type_names(tmp_path) == {}
    assert cc.ggml_type_names(tmp_path / "nowhere") == {}


def make_tree(tmp_path: Path, names: list[str]) -> Path:
    tree = tmp_path / "tree"
    inst = tree / "ggml" / "src" / "ggml-cuda" / "template-instances"
    inst.mkdir(parents=True)
    (tree / "ggml" / "include").mkdir(parents=True)
    (tree / "ggml" / "include" / "ggml.h").write_text("enum ggml_type {\n    GGML_TYPE_TURBO3_0 = 44,\n};\n")
    for n in names:
        (inst / f"fattn-turbo-instance-{n}.cu").write_text("// instance\n")
    return tree


def fake_nvcc(tmp_path: Path) -> Path:
    """An nvcc that writes the object and prints PTXAS for its source, or fails with an error for a source named
    *bad*; it also records its arguments."""
    report = tmp_path / "ptxas.txt"
    report.write_text(PTXAS)
    exe = tmp_path / "nvcc"
    exe.write_text(f"""#!/bin/sh
echo "$@" >> {tmp_path}/calls.txt
src=""; out=""; prev=""
for a in "$@"; do
  [ "$prev" = "-c" ] && src="$a"
  [ "$prev" = "-o" ] && out="$a"
  prev="$a"
done
case "$src" in
  *bad*) echo "$src(12): error: identifier \\"nope\\" is undefined" >&2; exit 1;;
esac
cat {report} >&2
: > "$out"
""")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


def test_compiles_every_instance_and_reports_kernels_as_json(cc, tmp_path, capsys):
    tree = make_tree(tmp_path, ["turbo3_0-turbo3_0", "f16-turbo3_0"])
    rc = cc.main([str(tree), "--nvcc", str(fake_nvcc(tmp_path)), "-j", "2", "--include", "/opt/x/include",
                  "--kernels", "turbo_mma", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert [f["file"] for f in out["files"]] == [
        "ggml/src/ggml-cuda/template-instances/fattn-turbo-instance-f16-turbo3_0.cu",
        "ggml/src/ggml-cuda/template-instances/fattn-turbo-instance-turbo3_0-turbo3_0.cu"]
    assert all(f["ok"] for f in out["files"])
    assert len(out["kernels"]) == 2 and {k["name"] for k in out["kernels"]} == {MMA}
    assert all(k["registers"] == 128 and k["spill_stores"] == 16 for k in out["kernels"])
    assert {k["demangled"] for k in out["kernels"]} <= {MMA, "flash_attn_ext_turbo_mma<128, 4, turbo3_0, turbo3_0>"}
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    assert len(calls) == 2
    assert all("-arch=sm_90" in c and "-Xptxas -v" in c and "-I /opt/x/include" in c for c in calls)


def test_a_failing_file_is_exit_1_with_its_error(cc, tmp_path, capsys):
    tree = make_tree(tmp_path, ["turbo3_0-turbo3_0", "bad-pair"])
    rc = cc.main([str(tree), "--nvcc", str(fake_nvcc(tmp_path)), "-j", "1", "--arch", "89"])
    cap = capsys.readouterr()
    assert rc == 1
    assert "fattn-turbo-instance-bad-pair.cu failed:" in cap.err and 'identifier "nope" is undefined' in cap.err
    assert "2 files, 1 failed" in cap.out
    assert "| fattn-turbo-instance-turbo3_0-turbo3_0.cu |" in cap.out and "| 16/24 |" in cap.out
    assert all("-arch=sm_89" in c for c in (tmp_path / "calls.txt").read_text().splitlines())


def test_named_files_only(cc, tmp_path, capsys):
    tree = make_tree(tmp_path, ["turbo3_0-turbo3_0", "bad-pair"])
    rc = cc.main([str(tree), "ggml/src/ggml-cuda/template-instances/fattn-turbo-instance-turbo3_0-turbo3_0.cu",
                  "--nvcc", str(fake_nvcc(tmp_path)), "--json"])
    assert rc == 0
    assert len(json.loads(capsys.readouterr().out)["files"]) == 1


@pytest.mark.parametrize("case", ["not-a-tree", "missing-file", "no-nvcc", "bad-regex"])
def test_bad_arguments_are_exit_2_with_one_line(cc, tmp_path, capsys, case):
    tree = make_tree(tmp_path, ["turbo3_0-turbo3_0"])
    nvcc = str(fake_nvcc(tmp_path))
    args = {
        "not-a-tree": [str(tmp_path), "--nvcc", nvcc],
        "missing-file": [str(tree), "nope.cu", "--nvcc", nvcc],
        "no-nvcc": [str(tree), "--nvcc", str(tmp_path / "no-such-nvcc")],
        "bad-regex": [str(tree), "--nvcc", nvcc, "--kernels", "("],
    }[case]
    assert cc.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cuda_check: ")
    assert not (tmp_path / "calls.txt").exists()


ARCHS_SCRIPT = ROOT / "scripts" / "cuda_archs.py"
OTHER = ["set-rows.cu", "cpy.cu", "convert.cu", "fwht.cu", "rope.cu", "getrows.cu", "ggml-cuda.cu"]


@pytest.fixture(scope="module")
def ca(load_script):
    return load_script(ARCHS_SCRIPT)


def make_full_tree(tmp_path: Path, names: list[str]) -> Path:
    tree = make_tree(tmp_path, names)
    for f in OTHER:
        (tree / "ggml" / "src" / "ggml-cuda" / f).write_text("// source\n")
    return tree


def test_archs_compiles_every_file_once_per_architecture(ca, tmp_path, capsys):
    tree = make_full_tree(tmp_path, ["turbo3_0-turbo3_0", "f16-turbo3_0"])
    out = tmp_path / "out"
    rc = ca.main([str(tree), "--archs", "75,89", "--nvcc", str(fake_nvcc(tmp_path)), "-j", "2", "--out", str(out)])
    assert rc == 0
    rows = json.loads((out / "summary.json").read_text())
    assert [r["arch"] for r in rows] == ["75", "89"]
    for r in rows:
        assert r["files"] == 2 + len(OTHER) and r["failed"] == []
        # each file reports the two entries of PTXAS; the instances keep the turbo kernels, the others all
        assert r["kernels"] == 2 * (2 + len(OTHER))
        assert len(r["spilling"]) == 2 + len(OTHER) and r["max_registers"] == 128
        assert {s["spill_stores"] for s in r["spilling"]} == {16}
    calls = (tmp_path / "calls.txt").read_text().splitlines()
    compiles = [c for c in calls if " -c " in c]
    assert sum("-arch=sm_75" in c for c in compiles) == sum("-arch=sm_89" in c for c in compiles) == 2 + len(OTHER)
    table = (out / "summary.md").read_text()
    assert "| sm_75 |" in table and "| sm_89 |" in table and "| none |" in table
    assert capsys.readouterr().out.strip() == table.strip()


def test_archs_before_turing_take_the_cuda11_nvcc_without_ggml_cuda_cu(ca, tmp_path, capsys):
    tree = make_full_tree(tmp_path, ["turbo2_0-turbo2_0", "bad-pair"])
    c11 = tmp_path / "cuda11"
    c11.mkdir()
    wrapper = fake_nvcc(tmp_path)
    (c11 / "nvcc").write_text(wrapper.read_text())  # an unpacked CUDA 11.8 is used as it is, nothing fetched
    (c11 / "nvcc").chmod(0o755)
    rc = ca.main([str(tree), "--archs", "61", "--cuda11-dir", str(c11), "--nvcc", "/no/such/nvcc", "-j", "1"])
    assert rc == 1
    out = capsys.readouterr().out
    assert "| sm_61 |" in out and "fattn-turbo-instance-bad-pair.cu" in out
    compiles = [c for c in (tmp_path / "calls.txt").read_text().splitlines() if " -c " in c]
    assert all("-arch=sm_61" in c for c in compiles)
    assert len(compiles) == 2 + len(OTHER) - 1 and not any("ggml-cuda.cu" in c for c in compiles)


def test_archs_without_nvcc_or_tree_is_exit_2(ca, tmp_path, capsys):
    tree = make_full_tree(tmp_path, ["turbo3_0-turbo3_0"])
    assert ca.main([str(tree), "--archs", "90", "--nvcc", "/no/such/nvcc"]) == 2
    assert "/no/such/nvcc not found" in capsys.readouterr().err
    assert ca.main([str(tmp_path / "nowhere"), "--archs", "90"]) == 2
    assert "no fattn-turbo instance files" in capsys.readouterr().err
