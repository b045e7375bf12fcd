#!/usr/bin/env python3
"""Checks the staging of patch 0031 (16-byte copies of the decode kernel's long rows) without a GPU.

Emulates fattn_tmma_stage::copy of 0031 lane by lane for every staged turbo row size (turbo2/3/4 at head sizes
128 and 256) and every head of a cache with 8 KV heads, over whole sequences: for rows of more than 16 words, the
16-byte copies of a row window (cp.async.cg, from the row's start rounded down to 16 bytes), and the 4-byte copies
of the last step and of caches whose strides do not allow windows; rows of up to 16 words (turbo2/turbo3 at head
size 128) take the 4-byte copies only, as before 0031. Stage(row_bytes, w16_min=0) models the removed
cuda-turbo-copy16.diff, which gave every staged row the windows (`git show
abbbc10:bench/experiments/cuda-turbo-copy16.diff`). Asserts that every staged row holds its cache row's byte j at
o + j, that every copy is aligned to its size, writes inside the warp's buffer and does not overlap another copy of
the step, and that no read leaves the cache.

    python bench/experiments/copy16_layout_check.py
"""
import numpy as np

WARP_SIZE = 32
ROWS = 16  # FATTN_TMMA_ROWS
BLOCK_BYTES = {"turbo2": 18, "turbo3": 26, "turbo4": 34}  # per 64 values (QK_TURBO)


class Stage:
    """fattn_tmma_stage<type, D> of 0031: its constants and its copy(). w16_min: rows of more words than this
    take the 16-byte windows."""

    def __init__(self, row_bytes: int, w16_min: int = 16):
        assert row_bytes % 4 == 0
        self.row_bytes = row_bytes
        self.nw = row_bytes // 4
        self.w16 = self.nw > w16_min
        self.wc = (row_bytes + 12 + 15) // 16
        self.wrpi = WARP_SIZE // self.wc
        self.wni = (ROWS + self.wrpi - 1) // self.wrpi
        self.lpr = 16 if self.nw <= 16 else 8
        self.rpi = WARP_SIZE // self.lpr
        self.nc = (self.nw + self.lpr - 1) // self.lpr
        if self.w16:
            self.pitch = 16 * self.wc + (16 if self.wc % 2 == 0 else 0)
        else:
            self.pitch = 4 * (self.nw + (12 - self.nw % 8) % 8)
        assert self.wrpi >= 1

    def offset(self, src: int) -> int:
        """o: where a row's byte 0 lands in its staged row."""
        return src % 16 if self.w16 else 0

    def lane_dst(self, lane: int) -> int:
        return (lane // self.wc) * self.pitch + 16 * (lane % self.wc)

    def lane_src(self, src: int, o: int, nb: int, lane: int) -> int:
        return src - o + (lane // self.wc) * nb + 16 * (lane % self.wc)

    def copy(self, src: int, o: int, nb: int, wide: bool, k0: int, k_last: int):
        """The (lane, dst, src, size) of every copy one warp issues for rows k0 .. k0 + 15 (dst: offset in the warp's
        buffer; src: byte address in the cache)."""
        out = []
        if self.w16 and wide and k0 + ROWS <= k_last:
            for lane in range(WARP_SIZE):
                d = self.lane_dst(lane)
                s = self.lane_src(src, o, nb, lane) + k0 * nb
                for a in range(self.wni):
                    if (self.wrpi * self.wc == WARP_SIZE or lane // self.wc < self.wrpi) and \
                            (ROWS % self.wrpi == 0 or a * self.wrpi + lane // self.wc < ROWS):
                        out.append((lane, d + a * self.wrpi * self.pitch, s, 16))
                    s += self.wrpi * nb
        else:
            for lane in range(WARP_SIZE):
                lw = lane % self.lpr
                for a in range(ROWS // self.rpi):
                    row = a * self.rpi + lane // self.lpr
                    sa = src + min(k0 + row, k_last) * nb + 4 * lw
                    da = row * self.pitch + o + 4 * lw
                    for c in range(self.nc):
                        if c * self.lpr + lw < self.nw:
                            out.append((lane, da + 4 * c * self.lpr, sa + 4 * c * self.lpr, 4))
        return out


def check_sequence(kind: str, head_dim: int, n_heads: int = 8, n_rows: int = 100, pad: int = 0, base: int = 0,
                   w16_min: int = 16) -> int:
    """All heads and steps of one cache of n_rows positions (row stride n_heads*row_bytes + pad bytes, at byte
    `base` of the buffer). Returns the number of copies checked."""
    row_bytes = head_dim // 64 * BLOCK_BYTES[kind]
    st = Stage(row_bytes, w16_min)
    nb = n_heads * row_bytes + pad
    size = base + n_rows * nb
    mem = np.random.default_rng(row_bytes + pad).integers(0, 256, size, dtype=np.uint8)
    wide = base % 16 == 0 and nb % 16 == 0  # the kernel's wideK (one sequence: nb13 plays no part)
    k_last = n_rows - 1
    count = 0
    for kvh in range(n_heads):
        src = base + kvh * row_bytes
        o = st.offset(src)
        for k0 in range(0, n_rows, ROWS):
            buf = np.zeros(ROWS * st.pitch, dtype=np.int32) - 1
            written = np.zeros(ROWS * st.pitch, dtype=bool)
            for lane, d, s, n in st.copy(src, o, nb, wide, k0, k_last):
                assert d % n == 0 and s % n == 0, (kind, head_dim, kvh, k0, lane, d, s, n)
                assert 0 <= d and d + n <= len(buf), f"write outside the buffer: {d}+{n}"
                assert 0 <= s and s + n <= size, f"{kind} D={head_dim} head {kvh} rows {k0}: read {s}..{s + n} " \
                                                 f"outside the cache (0..{size})"
                assert not written[d:d + n].any(), f"copies overlap at {d}"
                written[d:d + n] = True
                buf[d:d + n] = mem[s:s + n]
                count += 1
            for i in range(ROWS):
                k = min(k0 + i, k_last)
                want = mem[src + k * nb: src + k * nb + row_bytes]
                got = buf[i * st.pitch + o: i * st.pitch + o + row_bytes]
                assert (got == want).all(), f"{kind} D={head_dim} head {kvh} step {k0}: staged row {i} is wrong"
    return count


def main(w16_min: int = 16) -> int:
    total = 0
    for kind in BLOCK_BYTES:
        for head_dim in (128, 256):
            row_bytes = head_dim // 64 * BLOCK_BYTES[kind]
            if row_bytes % 4:
                continue
            st = Stage(row_bytes, w16_min)
            # 8 heads with contiguous rows (the cache as llama.cpp allocates it), over a length that ends inside
            # a step and one that ends with a whole step (whose last row has no next position to read into); a row
            # stride that is not a multiple of 16 (4-byte copies throughout); 4 heads, and a cache that starts 4
            # bytes into its buffer (4-byte copies)
            for case in ({}, {"n_rows": 64}, {"pad": 4}, {"n_heads": 4, "n_rows": 48}, {"n_rows": 40, "base": 4}):
                total += check_sequence(kind, head_dim, w16_min=w16_min, **case)
            copies = f"window {st.wc} x 16 B, {st.wni} 16-byte copies per lane and step" if st.w16 else "4-byte copies"
            print(f"{kind} D={head_dim}: row {row_bytes} B, {copies} (4-byte: {ROWS // st.rpi * st.nc}), "
                  f"pitch {st.pitch} B")
    print(f"ok: {total} copies checked")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
