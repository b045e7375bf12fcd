#!/usr/bin/env python3
"""How far the attention output of a q8_0 cache lies from exact math on that cache, for the arithmetic of three
implementations (numpy, no GPU): why patch 0054's parity KLD against the CPU is 0.000025 where upstream's CUDA vector
kernel's is 0.000001, and what patch 0055 (once cuda-turbo-q8_0-v-fold.diff) changes.

- exact: float64 softmax(K Q / sqrt(D)) V on the dequantized cache;
- CPU (ggml-cpu at the pin): Q rounded to q8_0 (the vec_dot type of a q8_0 K), integer dot products per block
  times the two scales; V dequantized, P in f32. Upstream's CUDA vector kernel rounds Q to q8_1 the same way,
  so it agrees with the CPU closely;
- the turbo decode kernel (0054): Q in f16, K's int8 values exact in f16 with f32 sums, the K scale after the
  product; P times the V block scale rounded to f16 (times a fold factor F, O divided by F after the loop), V's
  int8 values exact in f16, f32 sums.

Each line: mean relative error of the output (L2) over 20 draws of Q, K and V (head size 128, 4096 cache rows).

A second table models the test-backend-ops cases that patch 0055 adds (TURBO_ROT_FATTN with V uniform in
[-v_max, v_max], Q and K uniform in [-1, 1], 1024 cache rows, 16 heads): the NMSE of the turbo kernel's output
against the CPU's, which test-backend-ops compares with its limit of 5e-4.

    python bench/experiments/q8_0_decode_error.py
"""
from __future__ import annotations

import numpy as np

D, N, QK = 128, 4096, 32
SCALE = 1 / np.sqrt(D)  # the attention's KQ scale


def q8_0(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scales (as f16, shape [..., blocks]) and int8 values (shape [..., blocks, 32]) of x's q8_0 blocks."""
    b = x.reshape(*x.shape[:-1], -1, QK)
    d = (np.abs(b).max(-1) / 127).astype(np.float16).astype(np.float32)
    inv = np.divide(1.0, d, out=np.zeros_like(d), where=d > 0)
    return d, np.round(b * inv[..., None]).clip(-127, 127)


def attend(s: np.ndarray, v: np.ndarray) -> np.ndarray:
    p = np.exp(s - s.max())
    return (p @ v) / p.sum()


def cpu_output(q: np.ndarray, dk: np.ndarray, qk: np.ndarray, vd: np.ndarray) -> np.ndarray:
    """The CPU's output: Q rounded to q8_0, integer block products times both scales, P and V in f32 or wider."""
    dq, qq = q8_0(q)
    s = np.einsum("nbj,bj,nb,b->n", qk, qq, dk, dq).astype(np.float32) * SCALE
    return attend(s.astype(np.float64), vd)


def kernel_outputs(q: np.ndarray, dk: np.ndarray, qk: np.ndarray, dv: np.ndarray, qv: np.ndarray,
                   folds: tuple[int, ...]) -> list[np.ndarray]:
    """The turbo kernel's output for each fold factor F: Q in f16, P times F times the V block scale rounded to f16."""
    q16 = q.astype(np.float16).astype(np.float32).reshape(-1, QK)
    s = np.einsum("nbj,bj,nb->n", qk, q16, dk).astype(np.float32) * SCALE
    p = np.exp(s - s.max()).astype(np.float32)
    out = []
    for f in folds:
        pdv = (p[:, None] * dv * f).astype(np.float16).astype(np.float64) / f
        out.append(np.einsum("nb,nbj->bj", pdv, qv).reshape(D) / p.sum())
    return out


def errors(rng: np.random.Generator, v_rms: float, q_temp: float, folds: tuple[int, ...]) -> list[float]:
    q = rng.standard_normal(D).astype(np.float32) * q_temp
    k = rng.standard_normal((N, D)).astype(np.float32)
    v = rng.standard_normal((N, D)).astype(np.float32) * v_rms
    dk, qk = q8_0(k)
    dv, qv = q8_0(v)
    kd = (dk[..., None] * qk).reshape(N, D).astype(np.float64)
    vd = (dv[..., None] * qv).reshape(N, D).astype(np.float64)
    o_exact = attend(kd @ q.astype(np.float64) * SCALE, vd)
    out = [cpu_output(q, dk, qk, vd)] + kernel_outputs(q, dk, qk, dv, qv, folds)
    norm = np.linalg.norm(o_exact)
    return [float(np.linalg.norm(o - o_exact) / norm) for o in out]


def backend_ops_case_nmse(rng: np.random.Generator, v_max: float, folds: tuple[int, ...], n_kv: int = 1024,
                          heads: int = 16) -> list[float]:
    """NMSE of the turbo kernel's output (one value per fold factor) against the CPU's, over `heads` heads."""
    got: list[list[np.ndarray]] = [[] for _ in folds]
    ref = []
    for _ in range(heads):
        q = rng.uniform(-1, 1, D).astype(np.float32)
        dk, qk = q8_0(rng.uniform(-1, 1, (n_kv, D)).astype(np.float32))
        dv, qv = q8_0(rng.uniform(-v_max, v_max, (n_kv, D)).astype(np.float32))
        ref.append(cpu_output(q, dk, qk, (dv[..., None] * qv).reshape(n_kv, D)))
        for g, o in zip(got, kernel_outputs(q, dk, qk, dv, qv, folds)):
            g.append(o)
    b = np.concatenate(ref)
    return [float(((np.concatenate(g) - b) ** 2).sum() / (b ** 2).sum()) for g in got]


def main() -> None:
    rng = np.random.default_rng(0)
    folds = (1, 16)
    print("| V rms | Q scale | CPU | turbo kernel, F = 1 (0054) | F = 16 (0055) |")
    print("| --- | --- | --- | --- | --- |")
    for v_rms in (1.0, 0.05, 0.005, 0.0005):
        for q_temp in (1.0, 3.0):
            e = np.mean([errors(rng, v_rms, q_temp, folds) for _ in range(20)], axis=0)
            print(f"| {v_rms} | {q_temp} | " + " | ".join(f"{x:.1e}" for x in e) + " |")
    print()
    print("| test case v_max | NMSE, F = 1 (0054) | F = 16 (0055) |")
    print("| --- | --- | --- |")
    for v_max in (1.0, 1e-2, 1e-3, 3e-4, 1e-4):
        e = backend_ops_case_nmse(rng, v_max, folds)
        print(f"| {v_max:g} | " + " | ".join(f"{x:.1e}" for x in e) + " |")


if __name__ == "__main__":
    main()
