#!/usr/bin/env python3
"""Checks the lane layout of patches 0023 and 0043 (turbo2/turbo3 K scored on int8) without a GPU.

Emulates, per lane of a warp, load_i8's byte-permute selectors (from turbo2/turbo3 blocks packed as
quantize_row_turbo*_0_ref packs them), __byte_perm of the int8 codebook, the int8 Q packed at fattn_tmma_i8_pos,
and mma.m16n8k32's fragment layout (PTX ISA: A rows groupID / groupID + 8, k 4*t.. and 16 + 4*t..; B k 4*t..,
column groupID), and asserts that the products equal the direct int8 dot products of the codes. Q is rounded to two
int8 terms (0043: Q*127/max|Q| = q_hi + q_lo/QLO, a product C_hi*QLO + C_lo) and the codebook to integer codes with
a least-squares step, the scale M of fit_codebook. Then prints the score error of int8 scoring (codebook and Q
rounded, one or two terms of Q) against float scores.

    python bench/experiments/k_int8_layout_check.py
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tqgguf import turbo  # noqa: E402

rng = np.random.default_rng(1)
L3 = turbo.levels("turbo3").astype(np.float64)
L2 = turbo.levels("turbo2").astype(np.float64)


def pack3(idx):  # one block of 64 indices -> qs (16 bytes), qh (8 bytes)
    b = turbo.pack_indices(idx, "turbo3")
    return b[:16], b[16:]


def pack2(idx):
    return turbo.pack_indices(idx, "turbo2")


def word(b, off):
    """Little-endian 32-bit word of the 4 bytes at off."""
    return int(b[off]) | int(b[off + 1]) << 8 | int(b[off + 2]) << 16 | int(b[off + 3]) << 24


def load_i8(bits, blk, t):
    """load_i8's two selector words for lane t of a block (turbo3: (qs, qh); turbo2: qs)."""
    if bits == 3:
        qs, qh = blk
        q = word(qs, 4 * t)
        hw = word(qh, 4 * (t % 2)) >> (t // 2)
        w0 = (q & 0x33333333) | ((hw << 2) & 0x44444444)
        w1 = ((q >> 2) & 0x33333333) | (hw & 0x44444444)
    else:
        q = word(blk, 4 * t)
        w0 = q & 0x33333333
        w1 = (q >> 2) & 0x33333333
    return [w0 & 0xFFFFFFFF, w1 & 0xFFFFFFFF]


def byte_perm(x, y, s):
    """CUDA __byte_perm: byte n of the result is byte (s >> 4n) & 7 of {y:x}."""
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(s >> (4 * n)) & 7] << (8 * n) for n in range(4))


QLO = 254  # FATTN_TMMA_QLO: the second term of Q is worth 1/QLO of an int8 unit of the first


def fit_codebook(levels, scales=range(40, 128)):
    """0043's codebook: for each scale M, the codes round(level/max*M) and their least-squares step; the M whose
    codes times that step move no level by more than any other M's do. Returns (M, codes, step, max error / max)."""
    best = None
    for m in scales:
        c = np.rint(levels * m / levels[-1])
        step = (c * levels).sum() / (c * c).sum()
        err = np.abs(c * step - levels).max() / levels[-1]
        if best is None or err < best[3]:
            best = (m, c.astype(np.int64), step, err)
    return best


def int8_levels(levels):
    return fit_codebook(levels)[1]


def split_q(Q):
    """Q per head (rows) as two int8 terms and the head's max |Q|: Q*127/qmax = hi + lo/QLO up to 1/(2*QLO)."""
    qmax = np.abs(Q).max(axis=1)
    qinv = np.divide(127.0, qmax, out=np.zeros_like(qmax), where=qmax > 0)
    x = Q * qinv[:, None]
    hi = np.rint(x)
    lo = np.rint((x - hi) * QLO)
    return hi.astype(np.int64), lo.astype(np.int64), qmax


def codebook_words(levels):
    """fattn_tmma_i8_codebook: the int8 levels as bytes 0-3 (lo) and 4-7 (hi)."""
    b = [0, 0]
    for i, v in enumerate(int8_levels(levels)):
        b[i // 4] |= (int(v) & 0xFF) << (8 * (i % 4))
    return b[0], b[1]


def s8(w):
    """The 4 signed bytes of a word."""
    return [((w >> (8 * n)) & 0xFF) - 256 * ((w >> (8 * n + 7)) & 1) for n in range(4)]


def pos(t, kk, h, n):
    """fattn_tmma_i8_pos."""
    return 4 * t + 2 * h + n // 2 + 32 * (n % 2) + 16 * kk


def check_layout(bits, D, G):
    """One warp step (16 cache rows, 8 head columns, G real heads): the emulated m16n8k32 products against the
    direct int8 dot products, per scale group."""
    levels = L3 if bits == 3 else L2
    pack = pack3 if bits == 3 else pack2
    NG = D // 64
    codes = rng.integers(0, len(levels), size=(16, D))
    Q = rng.standard_normal((8, D))
    Q[G:] = 0
    lo, hi = codebook_words(levels)
    Qhi, Qlo, _ = split_q(Q)
    assert np.abs(Qhi).max() <= 127 and np.abs(Qlo).max() <= 127
    Qi8 = Qhi * QLO + Qlo  # what the two products give together
    blocks = [[pack(codes[row, 64 * g:64 * (g + 1)]) for g in range(NG)] for row in range(16)]
    for g in range(NG):
        C = np.zeros((16, 8), np.int64)
        C_lo = np.zeros((16, 8), np.int64)
        for kk in range(2):
            A = np.zeros((16, 32), np.int64)
            B = np.zeros((32, 8), np.int64)
            B_lo = np.zeros((32, 8), np.int64)
            for lane in range(32):
                r, t = lane // 4, lane % 4
                for h in range(2):  # A: a0/a2 row r, a1/a3 row 8 + r
                    w = load_i8(bits, blocks[r + 8 * h][g], t)
                    A[r + 8 * h, 4 * t:4 * t + 4] = s8(byte_perm(lo, hi, w[kk] & 0xFFFF))
                    A[r + 8 * h, 16 + 4 * t:16 + 4 * t + 4] = s8(byte_perm(lo, hi, w[kk] >> 16))
                for h in range(2):  # B: b0 k 4t.., b1 k 16 + 4t..; column r = head r
                    for n in range(4):
                        B[16 * h + 4 * t + n, r] = Qhi[r, 64 * g + pos(t, kk, h, n)]
                        B_lo[16 * h + 4 * t + n, r] = Qlo[r, 64 * g + pos(t, kk, h, n)]
            assert np.abs(A).max() <= 127
            C += A @ B
            C_lo += A @ B_lo
        C = C * QLO + C_lo
        assert np.abs(C).max() < 2**31
        ref = int8_levels(levels)[codes[:, 64 * g:64 * (g + 1)]] @ Qi8[:, 64 * g:64 * (g + 1)].T
        assert np.array_equal(C, ref), f"turbo{bits} D={D} G={G} group {g}"


def score_error(bits, D=128, n=4000):
    """rms error of int8 scores against float scores, relative to the scores' spread."""
    levels = L3 if bits == 3 else L2
    codes = rng.integers(0, len(levels), size=(n, D))
    Q = rng.standard_normal((1, D))
    m, c, step, _ = fit_codebook(levels)
    Lq = c * step
    Lq127 = np.rint(levels * 127 / levels[-1]) * levels[-1] / 127  # 0023's codebook
    qhi, qlo, qmax = split_q(Q)
    Qq1 = qhi * qmax[:, None] / 127  # one term: q_hi alone
    Qq2 = (qhi + qlo / QLO) * qmax[:, None] / 127
    S = levels[codes] @ Q.T
    errs = {}
    for name, K, QQ in (("0023 (codebook at 127, one term of Q)", Lq127, Qq1), (f"codebook at M={m}", Lq, Q),
                        ("Q in two terms", levels, Qq2), ("0043 (both)", Lq, Qq2)):
        e = K[codes] @ QQ.T - S
        errs[name] = e.std() / S.std()
        print(f"  turbo{bits} D={D}, {name}: rms score error / std(S) = {errs[name]:.5f}")
    return errs


if __name__ == "__main__":
    for bits in (3, 2):
        for D in (64, 128, 256):
            for G in (1, 4, 8):
                check_layout(bits, D, G)
        print(f"turbo{bits}: the lane layout gives the int8 dot products (head sizes 64/128/256, 1/4/8 heads)")
    for bits in (3, 2):
        score_error(bits)
