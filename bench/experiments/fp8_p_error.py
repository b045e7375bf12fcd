#!/usr/bin/env python3
"""What rounding the softmax weights P to FP8 (e4m3) would do to a turbo2 attention output, in numpy.

An FP8 PV product would expand turbo2's V with one byte permute per four values instead of the f16 expansion's
five per four half2 (the decode loop's largest item, about 100 of 330 instructions per 16-row step), but it rounds
each weight to 3 mantissa bits. This estimates the output error that adds, against the error turbo2's own V
quantization makes, for one query over 4096 random rows at four score sharpnesses (the kernel's lazy maximum lets
weights reach e^2, the worst case is taken). The denominator stays in f32, as the kernel keeps it. It also
prints P in f16 (today's product), P as two e4m3 terms (two `mma` on k=32 rows, as many per row as f16's one),
and the two terms with turbo2's level sizes rounded to e4m3 (1.125 and 3.75, ratio 10/3).

    python bench/experiments/fp8_p_error.py
"""

import collections

import numpy as np

LEVELS = np.array([-1.5104, -0.4528, 0.4528, 1.5104])  # turbo2's codebook (4-level Lloyd-Max for N(0, 1))


def e4m3(x: np.ndarray) -> np.ndarray:
    """Round non-negative x to FP8 e4m3 (3 mantissa bits, subnormal step 2^-9, largest 448)."""
    e = np.maximum(np.floor(np.log2(np.maximum(x, 1e-30))), -6)
    q = np.round(x / 2.0**e * 8) / 8 * 2.0**e
    return np.where(x < 2.0**-10, 0.0, np.minimum(q, 448.0))


def turbo2_codes(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each value's nearest level, and each row's least-squares scale (one scale per row here)."""
    c = LEVELS[np.abs(v[:, :, None] - LEVELS).argmin(-1)]
    return c, (v * c).sum(1) / (c * c).sum(1)


def e4m3_two_terms(x: np.ndarray) -> np.ndarray:
    """x as the sum of two e4m3 values: x's rounding plus the rounding of what is left."""
    hi = e4m3(x)
    rest = x - hi
    return hi + np.sign(rest) * e4m3(np.abs(rest))


def main(d: int = 128, n: int = 4096, trials: int = 20, seed: int = 0) -> list[tuple[int, dict[str, float]]]:
    """Per score sharpness, each variant's error relative to |o| with f32 P and the exact levels."""
    # turbo2's two level sizes as e4m3 values: 1.125 and 3.75 (ratio 10/3, 0.07% from the codebook's 3.336)
    ratio = (10 / 3) / (LEVELS[3] / LEVELS[2])
    rng = np.random.default_rng(seed)
    out = []
    for sharp in (1, 2, 4, 8):
        errs: dict[str, list[float]] = collections.defaultdict(list)
        for _ in range(trials):
            q = rng.standard_normal(d)
            k = rng.standard_normal((n, d))
            v = rng.standard_normal((n, d))
            c, scale = turbo2_codes(v)
            vq = c * scale[:, None]
            v103 = np.where(np.abs(c) > 1, c * ratio, c) * scale[:, None]
            s = sharp * (k @ q) / np.sqrt(d)
            p = np.exp(s - (s.max() - 2.0))
            p2 = e4m3_two_terms(p)
            def attend(w: np.ndarray, vals: np.ndarray) -> np.ndarray:
                return (w[:, None] * vals).sum(0) / p.sum()  # the denominator in f32, as the kernel keeps it

            o_ref = attend(p, vq)
            outs = {
                "f16 P": attend(p.astype(np.float16).astype(np.float64), vq),
                "e4m3 P": attend(e4m3(p), vq),
                "two-term e4m3 P": attend(p2, vq),
                "two-term e4m3 P, 10/3 levels": attend(p2, v103),
            }
            for name, o in outs.items():
                errs[name].append(np.linalg.norm(o - o_ref) / np.linalg.norm(o_ref))
            o_v = attend(p, v)
            errs["turbo2 V itself"].append(np.linalg.norm(o_ref - o_v) / np.linalg.norm(o_v))
        out.append((sharp, {name: float(np.mean(e)) for name, e in errs.items()}))
    return out


if __name__ == "__main__":
    for sharp, errs in main():
        print(f"scores x{sharp}: " + "; ".join(f"{name} {e:.5f}" for name, e in errs.items()) + " (of |o|)")
