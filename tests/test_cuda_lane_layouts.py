"""The lane-layout emulations of the CUDA decode kernel, run against tqgguf.turbo's block packing.

bench/experiments/k_int8_layout_check.py emulates patches 0023 and 0043 (turbo2/turbo3 K scored on int8: selectors
from the packed blocks, byte permutes of the fitted codebook, the m16n8k32 fragments of Q's two int8 terms) and
v_reg_layout_check.py the V expansion of patch 0025 (index transposes, byte-table lookups, the m16n8k16 A fragment,
the output positions). Both assume the bit layout that tqgguf.turbo.pack_indices writes (the C reference's); these
tests keep the two in step, and make sure each check fails on a wrong layout. copy16_layout_check.py emulates the
staging copies of patch 0031 (where each byte of a cache row lands, and which bytes the copies read).
"""

import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parents[1] / "bench" / "experiments"


@pytest.fixture
def experiment(load_script):
    """A function that loads bench/experiments/<name>.py as a fresh module."""
    if str(EXPERIMENTS) not in sys.path:
        sys.path.insert(0, str(EXPERIMENTS))  # v_reg_layout_check imports k_int8_layout_check
    return lambda name: load_script(EXPERIMENTS / f"{name}.py")


# the int8 K emulation checks that the fragments give the dot products; the register V one that every value sits
# where the store reads it and that O^T = V^T P^T
@pytest.mark.parametrize("name, check", [("k_int8_layout_check", "check_layout"), ("v_reg_layout_check", "check")],
                         ids=["int8-k", "register-v"])
@pytest.mark.parametrize("bits", [3, 2])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_lane_layout_emulation_holds(name, check, bits, head_dim, experiment):
    mod = experiment(name)
    for heads in (1, 4, 8):
        getattr(mod, check)(bits, head_dim, heads)


def test_int8_k_layout_check_fails_on_permuted_query_positions(monkeypatch, experiment):
    k8 = experiment("k_int8_layout_check")
    pos = k8.pos
    monkeypatch.setattr(k8, "pos", lambda t, kk, h, n: pos(t, kk, h, (n + 1) % 4))
    with pytest.raises(AssertionError):
        k8.check_layout(3, 128, 4)


def test_register_v_layout_check_fails_on_a_wrong_position_or_selector(monkeypatch, experiment):
    vr = experiment("v_reg_layout_check")
    monkeypatch.setattr(vr, "vreg_dim", lambda r, qq, i: 2 * r + qq % 2 + 32 * (qq // 2) + 16 * (i // 2))
    with pytest.raises(AssertionError):
        vr.check(3, 128, 4)
    monkeypatch.undo()
    vr = experiment("v_reg_layout_check")
    byte_perm = vr.byte_perm
    monkeypatch.setattr(vr, "byte_perm", lambda x, y, s: byte_perm(x, y, 0x0002 if s == 0x0020 else s))
    with pytest.raises(AssertionError):
        vr.check(2, 64, 1)


def test_copy16_staging_places_every_row_byte(experiment):
    """0031 (16-byte copies of row windows for rows of more than 16 words): staged rows, alignment, no overlap, no
    read past the cache, for every staged turbo row size; and the same with windows for every row (the removed
    cuda-turbo-copy16.diff)."""
    c16 = experiment("copy16_layout_check")
    assert c16.main() == 0
    assert c16.main(w16_min=0) == 0


def test_copy16_only_long_rows_take_windows(experiment):
    """turbo2/turbo3 rows at head size 128 (9 and 13 words) keep the 4-byte copies and the series' pitch; turbo4's
    17 words and every row at 256 take 16-byte copies."""
    c16 = experiment("copy16_layout_check")
    sizes = {(kind, d): d // 64 * n for kind, n in c16.BLOCK_BYTES.items() for d in (128, 256)}
    for (kind, d), row_bytes in sizes.items():
        st = c16.Stage(row_bytes)
        assert st.w16 == (row_bytes > 64), (kind, d)
        copies = st.copy(src=0, o=0, nb=8 * row_bytes, wide=True, k0=0, k_last=100)
        assert {n for *_, n in copies} == ({16} if st.w16 else {4}), (kind, d)
    assert c16.Stage(52).pitch == 80 and c16.Stage(36).pitch == 48


def test_copy16_staging_check_fails_when_windows_run_to_the_last_row(monkeypatch, experiment):
    """With 16-byte copies allowed up to the step that ends on the cache's last row, the window of the last head
    reaches past the cache for turbo2 and turbo4 at head size 256; the check must see that read."""
    c16 = experiment("copy16_layout_check")
    copy = c16.Stage.copy

    def loose(self, src, o, nb, wide, k0, k_last):
        return copy(self, src, o, nb, wide, k0, k_last + 1 if wide and k0 + c16.ROWS - 1 <= k_last else k_last)

    monkeypatch.setattr(c16.Stage, "copy", loose)
    with pytest.raises(AssertionError, match="outside the cache"):
        c16.check_sequence("turbo2", 256, n_rows=64)


def test_copy16_staging_check_fails_without_the_window_offset(monkeypatch, experiment):
    c16 = experiment("copy16_layout_check")
    monkeypatch.setattr(c16.Stage, "lane_src",
                        lambda self, src, o, nb, lane: src + (lane // self.wc) * nb + 16 * (lane % self.wc))
    with pytest.raises(AssertionError):
        c16.check_sequence("turbo4", 128)


def test_int8_codebook_fit_matches_the_cuda_constants(experiment):
    """0043's codebook scales (M = 73 for turbo2, 121 for turbo3 in fattn_tmma_i8_codebook) are what the search
    finds, with the codes and level errors its comment gives."""
    k8 = experiment("k_int8_layout_check")
    m2, c2, _, e2 = k8.fit_codebook(k8.L2)
    m3, c3, _, e3 = k8.fit_codebook(k8.L3)
    assert (m2, c2.tolist()) == (73, [-73, -22, 22, 73])
    assert (m3, c3.tolist()) == (121, [-121, -76, -43, -14, 14, 43, 76, 121])
    assert e2 < 0.00005 and 0.001 < e3 < 0.0012
    patch = next((EXPERIMENTS.parents[1] / "patches").glob("0043-*.patch")).read_text()
    assert "constexpr float M = type == GGML_TYPE_TURBO2_0 ? 73.0f : 121.0f;" in patch
    assert "#define FATTN_TMMA_QLO 254" in patch and k8.QLO == 254


def test_two_int8_terms_of_q_cut_the_score_error(experiment):
    """Q in two int8 terms leaves the codebook's rounding as the int8 scores' only sizeable error: turbo3 about 0.11%
    of the scores' spread, turbo2 below 0.01%, against about 0.6% with one term and the codebook at 127 (0023)."""
    k8 = experiment("k_int8_layout_check")
    for bits, limit in ((3, 0.0013), (2, 0.0001)):
        e = k8.score_error(bits, n=2000)
        before, after = e["0023 (codebook at 127, one term of Q)"], e["0043 (both)"]
        assert 0.004 < before < 0.009, (bits, before)
        assert after < limit, (bits, after)
        assert e["Q in two terms"] < 0.0001, bits
