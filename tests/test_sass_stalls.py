"""Tests for scripts/sass_stalls.py: reading ncu's source page (CSV) and splitting a kernel at its main loop."""

import csv
import gzip
import io
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "sass_stalls.py"

BASE = 0x7F0000001000
HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "# Samples", "Instructions Executed", "stall_long_sb", "stall_wait", "stall_math",
          "stall_long_sb (Not Issued)"]

# (offset, source, executed, samples, long_sb, wait, math): a prologue, a loop of 8 iterations (0x30-0x60) with a
# forward branch inside, an epilogue; the forward branch and a never-taken backward branch must not be the loop
ROWS = [
    (0x00, "LDC R1, c[0x0][0x28]", 4, 3, 0, 1, 0),
    (0x10, "LDG.E R2, desc[UR4][R4.64]", 4, 0, 0, 0, 0),
    (0x20, "FMUL R3, R2, R2", 4, 10, 10, 0, 0),
    (0x30, "IMMA.16832.S8.S8 R8, R4.ROW, R6.COL, R8", 32, 20, 0, 4, 16),
    (0x40, f"@P0 BRA {BASE + 0x60:#x}", 32, 1, 0, 1, 0),
    (0x50, "FADD R9, R9, R8", 32, 9, 0, 9, 0),
    (0x60, f"@!P1 BRA {BASE + 0x30:#x}", 32, 2, 0, 2, 0),
    (0x70, f"@!PT BRA {BASE + 0x00:#x}", 0, 0, 0, 0, 0),
    (0x80, "STG.E desc[UR4][R4.64], R9", 4, 5, 0, 5, 0),
]


def csv_text(rows=ROWS, header=HEADER, kernel_line=True):
    buf = io.StringIO()
    w = csv.writer(buf, quoting=csv.QUOTE_ALL)
    if kernel_line:
        w.writerow(["Kernel Name", "void kernel<128>(int)"])
    w.writerow(header)
    for off, src, ex, s, lsb, wait, math in rows:
        w.writerow([f"{BASE + off:#x}", src, f"{s:,}", "0", f"{s}", f"{ex * 1000:,}", f"{lsb}", f"{wait}", f"{math}",
                    "0"])
    return buf.getvalue()


@pytest.fixture(scope="module")
def st(load_script):
    return load_script(SCRIPT)


def test_reads_offsets_counts_and_stall_reasons(st):
    insns = st.read_source_csv(csv_text())
    assert [i.offset for i in insns] == [r[0] for r in ROWS]
    assert insns[3].executed == 32000  # thousands separators are read
    assert insns[3].samples == 20
    # only the issued-or-not totals per reason, without the "(Not Issued)" columns
    assert insns[3].stalls == {"long_sb": 0, "wait": 4, "math": 16}


def test_main_loop_is_the_most_executed_backward_branch(st):
    insns = st.read_source_csv(csv_text())
    assert st.main_loop(insns) == (0x30, 0x60)


def test_regions_split_executed_and_samples_at_the_loop(st):
    regs = {r.name: r for r in st.regions(st.read_source_csv(csv_text()))}
    assert regs["before"].executed == 12000 and regs["before"].samples == 13
    assert regs["loop"].executed == 128000 and regs["loop"].samples == 32
    assert regs["after"].executed == 4000 and regs["after"].samples == 5
    assert regs["loop"].stalls["math"] == 16 and regs["before"].stalls["long_sb"] == 10


def test_report_names_the_loop_shares_and_hottest_instructions(st):
    text = st.report(st.read_source_csv(csv_text()), top=2)
    assert "main loop: 0x0030-0x0060" in text
    loop_line = next(line for line in text.splitlines() if line.startswith("loop"))
    # 128 of 144 thousand executed, 32 of 50 samples; math is half of the loop's samples
    assert "88.9%" in loop_line and "64.0%" in loop_line and "math 50%" in loop_line
    hot = text.splitlines()[-2:]
    assert "IMMA" in hot[0] and "math 16" in hot[0]
    assert "FMUL" in hot[1] and "long_sb 10" in hot[1]


def test_a_kernel_without_a_loop_is_all_before(st):
    rows = [r for r in ROWS if "BRA" not in r[1]]
    insns = st.read_source_csv(csv_text(rows))
    assert st.main_loop(insns) is None
    regs = {r.name: r for r in st.regions(insns)}
    assert regs["loop"].executed == 0 and regs["before"].samples == sum(r[3] for r in rows)
    assert "main loop: none found" in st.report(insns)


def test_bad_input_is_a_clear_error(st, tmp_path, capsys):
    with pytest.raises(ValueError, match="Address and Source"):
        st.read_source_csv("a,b\n1,2\n")
    with pytest.raises(ValueError, match="Instructions Executed"):
        st.read_source_csv(csv_text(header=[h if h != "Instructions Executed" else "x" for h in HEADER]))
    bad = tmp_path / "bad.csv"
    bad.write_text("not a csv of ncu\n")
    assert st.main([str(bad)]) == 1
    assert "sass_stalls.py" in capsys.readouterr().err
    assert st.main([str(tmp_path / "missing.csv")]) == 1


def test_cli_reads_gzip(st, tmp_path, capsys):
    path = tmp_path / "k.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write(csv_text(kernel_line=False))
    assert st.main([str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "9 instructions" in out and "main loop: 0x0030-0x0060" in out


def test_parts_count_instructions_per_loop_step(st):
    insns = st.read_source_csv(csv_text())
    parts = [st.parse_part("mma=0x30-0x40"), st.parse_part("tail=40-70")]
    text = st.parts_report(insns, parts)
    # the loop's first instruction ran 32000 times (warp-level), the kernel's first 4000: 8 steps per warp
    assert "32000 loop steps, 8.00 per warp" in text
    assert "| mma | 0x0030-0x0040 | 1.0 | 40.0% |" in text  # 20 of 50 samples
    assert "| tail | 0x0040-0x0070 | 3.0 | 24.0% |" in text  # 3 instructions per step, 12 samples
    assert "loop: 4.0 instructions per step; before it 3 and after it 1 per warp" in text


def test_bad_parts_are_clear_errors(st, tmp_path, capsys):
    for bad in ("copies", "x=0x50-0x40", "x=zz-0x40"):
        with pytest.raises(ValueError, match="bad part"):
            st.parse_part(bad)
    rows = [r for r in ROWS if "BRA" not in r[1]]
    with pytest.raises(ValueError, match="no main loop"):
        st.parts_report(st.read_source_csv(csv_text(rows)), [st.parse_part("a=0-10")])
    path = tmp_path / "k.csv"
    path.write_text(csv_text())
    assert st.main([str(path), "--part", "nonsense"]) == 1
    assert "bad part" in capsys.readouterr().err


def test_cli_prints_the_parts_table(st, tmp_path, capsys):
    path = tmp_path / "k.csv"
    path.write_text(csv_text())
    assert st.main([str(path), "--part", "loop=0x30-0x70"]) == 0
    assert "| loop | 0x0030-0x0070 | 4.0 | 64.0% |" in capsys.readouterr().out
