#!/usr/bin/env python3
"""What rounding the softmax weights P to FP8 (e4m3) would do to a turbo2 attention output, in numpy.

An FP8 PV product would expand turbo2's V with one byte permute per four values instead of the f16 expansion's
five per four half2 (the decode loop's largest item, about 100 of 330 instructions per 16-row step), but it rounds
each weight to 3 mantissa bits. This estimates the output error that adds, against the error turbo2's own V
quantization makes, for one query over 4096 random rows at four score sharpnesses (the kernel's lazy maximum lets
weights reach e^2, the worst case is taken). The denominator stays in f32, as the kernel keeps it.

    python bench/experiments/fp8_p_error.py
"""

import numpy as np

LEVELS = np.array([-1.5104, -0.4528, 0.4528, 1.5104])  # turbo2's codebook (4-level Lloyd-Max for N(0, 1))


def e4m3(x: np.ndarray) -> np.ndarray:
    """Round non-negative x to FP8 e4m3 (3 mantissa bits, subnormal step 2^-9, largest 448)."""
    e = np.maximum(np.floor(np.log2(np.maximum(x, 1e-30))), -6)
    q = np.round(x / 2.0**e * 8) / 8 * 2.0**e
    return np.where(x < 2.0**-10, 0.0, np.minimum(q, 448.0))


def turbo2_rows(v: np.ndarray) -> np.ndarray:
    """Each row's nearest levels times the row's least-squares scale (one scale per row here)."""
    c = LEVELS[np.abs(v[:, :, None] - LEVELS).argmin(-1)]
    return c * ((v * c).sum(1) / (c * c).sum(1))[:, None]


def main(d: int = 128, n: int = 4096, trials: int = 20, seed: int = 0) -> list[tuple[int, float, float]]:
    rng = np.random.default_rng(seed)
    out = []
    for sharp in (1, 2, 4, 8):
        e_fp8, e_v = [], []
        for _ in range(trials):
            q = rng.standard_normal(d)
            k = rng.standard_normal((n, d))
            v = rng.standard_normal((n, d))
            vq = turbo2_rows(v)
            s = sharp * (k @ q) / np.sqrt(d)
            p = np.exp(s - (s.max() - 2.0))
            o_ref = (p[:, None] * vq).sum(0) / p.sum()
            o_fp8 = (e4m3(p)[:, None] * vq).sum(0) / p.sum()
            o_v = (p[:, None] * v).sum(0) / p.sum()
            e_fp8.append(np.linalg.norm(o_fp8 - o_ref) / np.linalg.norm(o_ref))
            e_v.append(np.linalg.norm(o_ref - o_v) / np.linalg.norm(o_v))
        out.append((sharp, float(np.mean(e_fp8)), float(np.mean(e_v))))
    return out


if __name__ == "__main__":
    for sharp, ef, ev in main():
        print(f"scores x{sharp}: e4m3 P adds {ef:.4f} of |o|; turbo2's V quantization itself {ev:.4f} ({ef / ev:.3f} of it)")
