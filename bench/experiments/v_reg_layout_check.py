#!/usr/bin/env python3
"""Checks the lane layout of patch 0025 (turbo2/turbo3 V expanded from registers) without a GPU.

Emulates one warp step of the decode kernel's V side: load_i8's index words of each lane's own rows (r and 8 + r),
movmatrix.m8n8.trans.b16 over the warp, fattn_tmma_expand_v's byte permutes of the f16 codebook's low and high
bytes, and the A fragment of mma.m16n8k16 (PTX ISA: a0a1 row groupID, k 2t..; a2a3 row groupID + 8; a4a5 k + 8;
a6a7 both). Asserts that every A register holds the V values of its two cache rows at the head-dim position that
fattn_tmma_vreg_dim gives (a permutation of the group's 64 positions), and that O^T = V^T P^T computed from the
fragments and stored at those positions equals the direct product.

    python bench/experiments/v_reg_layout_check.py
"""
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from k_int8_layout_check import L2, L3, byte_perm, load_i8, pack2, pack3  # noqa: E402

rng = np.random.default_rng(2)


def f16_bits(x):
    return int(np.float16(x).view(np.uint16))


def f16_codebook(levels):
    """fattn_tmma_f16_codebook: low bytes of levels 0-3 / 4-7 in cb[0] / cb[1], high bytes in cb[2] / cb[3]."""
    cb = [0, 0, 0, 0]
    for i, v in enumerate(levels):
        b = f16_bits(v)
        cb[i // 4] |= (b & 0xFF) << (8 * (i % 4))
        cb[2 + i // 4] |= (b >> 8) << (8 * (i % 4))
    return cb


def movmatrix(words):
    """movmatrix.m8n8.trans.b16 over 32 lanes: lane 4*r + t holds elements (r, 2t) and (r, 2t + 1) before, and
    (2t, r) and (2t + 1, r) after."""
    def elem(row, col):
        w = words[4 * row + col // 2]
        return (w >> (16 * (col % 2))) & 0xFFFF
    return [elem(2 * (lane % 4), lane // 4) | elem(2 * (lane % 4) + 1, lane // 4) << 16 for lane in range(32)]


def expand_v(m, cb):
    """fattn_tmma_expand_v: four half2 (as pairs of float16 values)."""
    out = []
    for k in range(2):
        sel = byte_perm(m, 0, 0x0020 if k == 0 else 0x0031)
        lo = byte_perm(cb[0], cb[1], sel)
        hi = byte_perm(cb[2], cb[3], sel)
        for s in (0x6240, 0x7351):
            v = byte_perm(lo, hi, s)
            out.append((np.uint16(v & 0xFFFF).view(np.float16), np.uint16(v >> 16).view(np.float16)))
    return out


def vreg_dim(r, qq, i):
    """fattn_tmma_vreg_dim."""
    return 2 * r + qq // 2 + 32 * (qq % 2) + 16 * (i // 2)


def check(bits, D, G):
    levels = L3 if bits == 3 else L2
    pack = pack3 if bits == 3 else pack2
    NG = D // 64
    codes = rng.integers(0, len(levels), size=(16, D))
    V = levels[codes].astype(np.float16)  # the f16 values the table path uses too
    P = rng.random((16, 8)).astype(np.float16)  # P^T's values: cache row x head (scales folded in)
    P[:, G:] = 0
    cb = f16_codebook(levels)
    dims = sorted(vreg_dim(r, qq, i) for r in range(8) for qq in range(4) for i in (0, 2))
    assert dims == list(range(64)), "the positions of a group are not a permutation"
    for g in range(NG):
        blocks = [pack(codes[row, 64 * g:64 * (g + 1)]) for row in range(16)]
        E = {}  # (lane, h, j) -> the four expanded half2
        for h in range(2):
            for j in range(2):
                words = [load_i8(bits, blocks[8 * h + lane // 4], lane % 4)[j] for lane in range(32)]
                for lane, m in enumerate(movmatrix(words)):
                    E[lane, h, j] = expand_v(m, cb)
        for qq in range(4):
            A = np.zeros((16, 16), np.float32)  # tile rows (head dims) x k (cache rows)
            for lane in range(32):
                r, t = lane // 4, lane % 4
                for h in range(2):
                    for j in range(2):
                        a, b = E[lane, h, j][qq]
                        dim = 64 * g + vreg_dim(r, qq, 2 * j)
                        assert a == V[8 * h + 2 * t, dim] and b == V[8 * h + 2 * t + 1, dim], \
                            f"turbo{bits} D={D} lane {lane} h={h} j={j} qq={qq}"
                        A[8 * j + r, 8 * h + 2 * t] = a
                        A[8 * j + r, 8 * h + 2 * t + 1] = b
            OT = A @ P.astype(np.float32)  # what the mma accumulates: tile rows x heads
            for row in range(16):
                dim = 64 * g + vreg_dim(row % 8, qq, 2 * (row // 8))
                ref = V[:, dim].astype(np.float32) @ P.astype(np.float32)
                assert np.allclose(OT[row], ref, rtol=1e-6, atol=1e-6), f"turbo{bits} D={D} O^T row {row}"


if __name__ == "__main__":
    for bits in (3, 2):
        for D in (64, 128, 256):
            for G in (1, 4, 8):
                check(bits, D, G)
        print(f"turbo{bits}: the expanded V fragments and the output positions match (head sizes 64/128/256, "
              f"1/4/8 heads)")
