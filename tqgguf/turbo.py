"""Numpy reference for the TurboQuant KV-cache types turbo2 / turbo3 / turbo4 (like gguf-py's quants.py).

This module is the specification the C implementation (ggml CPU/CUDA) must match bit for bit.

Types
=====
QK_TURBO = 64 values per block.  All blocks start with ``d``, a little-endian IEEE fp16 scale.

=========  ==============  ===========================================  =====  ======
type       ggml type id    layout                                       bytes  bpv
=========  ==============  ===========================================  =====  ======
turbo2     43 (TURBO2_0)   d:fp16, qs[16]                               18     2.25
turbo3     44 (TURBO3_0)   d:fp16, qs[16] (index bits 0-1), qh[8] (bit 2)  26  3.25
turbo4     45 (TURBO4_0)   d:fp16, qs[32]                               34     4.25
=========  ==============  ===========================================  =====  ======

(Upstream's highest type id is GGML_TYPE_Q2_0 = 42.)

Packing (idx[j] is the codebook index of value j, j = 0..63):
  * turbo2: ``qs[i] = idx[i] | idx[i+16] << 2 | idx[i+32] << 4 | idx[i+48] << 6``  (i = 0..15)
  * turbo3: ``qs[i]`` as turbo2 with the low 2 bits of each index (``idx & 3``);
    ``qh[i] = sum_k ((idx[i+8k] >> 2) & 1) << k``  (i = 0..7, k = 0..7, i.e. values i, i+8, ..., i+56)
  * turbo4: ``qs[i] = idx[i] | idx[i+32] << 4``  (i = 0..31)

Codebooks
=========
``levels`` (2^b entries, ascending) and ``bounds`` (2^b - 1 midpoints) for b = 2, 3, 4 are the Lloyd-Max
codebooks of one coordinate of a uniformly random unit vector in 64 dimensions (see scripts/gen_codebooks.py),
stored in tqgguf/data/codebooks.json as float64 and used here as float32 (``np.float32(value)``; identical to the
``%.9g`` literals of the generated ggml-turbo-codebooks.h).

Quantization of one block x[0..63] (float32)
============================================
All arithmetic below is IEEE with round-to-nearest-even and no fused multiply-add.

1. ``sumsq = 0.0 (double); for j in 0..63: sumsq += (double)x[j] * (double)x[j]``  (sequential order; the
   products are exact in double).
2. ``norm = (float) sqrt(sumsq)``  (double sqrt, rounded to float32).
3. ``inv = norm > 0 ? 1.0f / norm : 0.0f``  (float32 division).
4. ``u[j] = x[j] * inv``  (float32 multiply).
5. ``idx[j]`` = number of k with ``u[j] > bounds[k]``  (strict comparison in float32; a NaN u gives 0).
   In particular u == 0 (and every value when norm == 0) gets index 2^(b-1) - 1, the level just *below* 0.
6. Scale ``d``:
   * ``scale="lsq"`` (default, "corrected" least-squares norm): with ``c[j] = levels[idx[j]]``,
     ``num = sum_j (double)x[j] * (double)c[j]``, ``den = sum_j (double)c[j] * (double)c[j]`` (both sequential
     in j = 0..63, starting from 0.0), ``d = fp16((float)(num / den))``.
   * ``scale="norm"``: ``d = fp16(norm)``.
   If ``norm == 0`` then ``d = +0`` (fp16 bits 0x0000) in both variants.
   ``fp16()`` is the round-to-nearest-even float32 -> fp16 conversion (as GGML_FP32_TO_FP16 / F16C / numpy);
   it is not saturating: a scale above 65504 becomes inf, like an f16 cache value would.

Dequantization
==============
``y[j] = (float)d * levels[idx[j]]``  (fp16 -> float32 exactly, then one float32 multiply).

Rotation (reference)
====================
Randomized Walsh-Hadamard transform over groups of g (power of two; 64/128/256 are used) consecutive values
of the last axis: forward ``R(x) = H D x``, inverse ``R^-1(x) = D H x``, where ``H`` is the normalized
(1/sqrt(g)) Walsh-Hadamard matrix in Sylvester order (``H[r, c] = (-1)^popcount(r & c) / sqrt(g)``) and
``D = diag(s(0), ..., s(g-1))``.  The sign of coordinate i within a group (independent of g, so the signs for g
are a prefix of the signs for 2g) is, with all arithmetic on uint32 (mod 2^32)::

    h = i * 0x9E3779B1 + 0x7F4A7C15
    h ^= h >> 16
    h = h * 0x85EBCA6B
    h ^= h >> 13
    s(i) = (h & 1) ? -1.0f : +1.0f
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

import numpy as np

QK_TURBO = 64

GGML_TYPE_TURBO2_0 = 43
GGML_TYPE_TURBO3_0 = 44
GGML_TYPE_TURBO4_0 = 45


class TurboType(NamedTuple):
    name: str
    ggml_type: int
    bits: int          # bits per index
    block_size: int    # bytes per block of QK_TURBO values
    qs_bytes: int
    qh_bytes: int


TYPES: dict[str, TurboType] = {
    "turbo2": TurboType("turbo2", GGML_TYPE_TURBO2_0, 2, 2 + 16, 16, 0),
    "turbo3": TurboType("turbo3", GGML_TYPE_TURBO3_0, 3, 2 + 16 + 8, 16, 8),
    "turbo4": TurboType("turbo4", GGML_TYPE_TURBO4_0, 4, 2 + 32, 32, 0),
}

SCALES = ("lsq", "norm")

_CODEBOOK_PATH = Path(__file__).resolve().parent / "data" / "codebooks.json"


def _tt(ttype: str) -> TurboType:
    try:
        return TYPES[ttype]
    except KeyError:
        raise ValueError(f"unknown turbo type {ttype!r}; expected one of {sorted(TYPES)}") from None


def block_size(ttype: str) -> int:
    """Bytes per block of QK_TURBO values."""
    return _tt(ttype).block_size


def bits_per_value(ttype: str) -> float:
    return _tt(ttype).block_size * 8 / QK_TURBO


@lru_cache(maxsize=None)
def _codebook_json() -> dict:
    data = json.loads(_CODEBOOK_PATH.read_text())
    if data["d"] != QK_TURBO:
        raise ValueError(f"{_CODEBOOK_PATH}: codebooks were generated for d={data['d']}, need {QK_TURBO}")
    return data


@lru_cache(maxsize=None)
def _codebook(bits: int) -> tuple[np.ndarray, np.ndarray]:
    cb = _codebook_json()["codebooks"][str(bits)]
    levels = np.array(cb["levels"], dtype=np.float64).astype(np.float32)
    bounds = np.array(cb["boundaries"], dtype=np.float64).astype(np.float32)
    if levels.shape != (2**bits,) or bounds.shape != (2**bits - 1,):
        raise ValueError(f"bad codebook shape for b={bits}")
    if not (np.all(np.diff(levels) > 0) and np.all(np.diff(bounds) > 0)):
        raise ValueError(f"codebook b={bits} is not ascending")
    levels.setflags(write=False)
    bounds.setflags(write=False)
    return levels, bounds


def levels(ttype: str) -> np.ndarray:
    """float32 codebook levels (ascending, read-only)."""
    return _codebook(_tt(ttype).bits)[0]


def bounds(ttype: str) -> np.ndarray:
    """float32 decision boundaries (ascending, read-only)."""
    return _codebook(_tt(ttype).bits)[1]


# ----------------------------------------------------------------------------------------------------------------
# Index packing


def pack_indices(idx: np.ndarray, ttype: str) -> np.ndarray:
    """Pack indices (..., 64) into the qs[/qh] bytes of a block: returns uint8 (..., qs_bytes + qh_bytes)."""
    t = _tt(ttype)
    idx = np.asarray(idx)
    if idx.shape[-1] != QK_TURBO:
        raise ValueError("last axis must be QK_TURBO")
    if np.any(idx < 0) or np.any(idx >= 2**t.bits):
        raise ValueError("index out of range")
    q = idx.astype(np.uint8)
    if t.bits == 2:
        q4 = q.reshape(*q.shape[:-1], 4, 16)  # [..., k, i] = idx[i + 16k]
        qs = q4[..., 0, :] | (q4[..., 1, :] << 2) | (q4[..., 2, :] << 4) | (q4[..., 3, :] << 6)
        return qs.astype(np.uint8)
    if t.bits == 3:
        lo = q & 3
        lo4 = lo.reshape(*q.shape[:-1], 4, 16)
        qs = lo4[..., 0, :] | (lo4[..., 1, :] << 2) | (lo4[..., 2, :] << 4) | (lo4[..., 3, :] << 6)
        hi8 = ((q >> 2) & 1).reshape(*q.shape[:-1], 8, 8)  # [..., k, i] = bit2 of idx[i + 8k]
        qh = np.zeros(q.shape[:-1] + (8,), dtype=np.uint8)
        for k in range(8):
            qh |= hi8[..., k, :] << k
        return np.concatenate([qs.astype(np.uint8), qh], axis=-1)
    if t.bits == 4:
        q2 = q.reshape(*q.shape[:-1], 2, 32)
        return (q2[..., 0, :] | (q2[..., 1, :] << 4)).astype(np.uint8)
    raise AssertionError


def unpack_indices(packed: np.ndarray, ttype: str) -> np.ndarray:
    """Inverse of pack_indices: uint8 (..., qs_bytes + qh_bytes) -> uint8 indices (..., 64)."""
    t = _tt(ttype)
    p = np.asarray(packed, dtype=np.uint8)
    if p.shape[-1] != t.qs_bytes + t.qh_bytes:
        raise ValueError("bad packed size")
    lead = p.shape[:-1]
    if t.bits in (2, 3):
        qs = p[..., :16]
        lo = np.stack([(qs >> s) & 3 for s in (0, 2, 4, 6)], axis=-2).reshape(*lead, 64)
        if t.bits == 2:
            return lo
        qh = p[..., 16:24]
        hi = np.stack([(qh >> k) & 1 for k in range(8)], axis=-2).reshape(*lead, 64)
        return (lo | (hi << 2)).astype(np.uint8)
    if t.bits == 4:
        return np.concatenate([p & 0xF, p >> 4], axis=-1).astype(np.uint8)
    raise AssertionError


# ----------------------------------------------------------------------------------------------------------------
# Quantize / dequantize


def _seq_sum_products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """sum_j (double)a[:, j] * (double)b[:, j], accumulated sequentially in j (not pairwise)."""
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    acc = np.zeros(a.shape[0], dtype=np.float64)
    for j in range(a.shape[1]):
        acc += a[:, j] * b[:, j]
    return acc


def quantize_blocks(xb: np.ndarray, ttype: str, scale: str = "lsq") -> tuple[np.ndarray, np.ndarray]:
    """Quantize blocks xb (nb, 64) float32 -> (d as float16 (nb,), indices uint8 (nb, 64))."""
    t = _tt(ttype)
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}")
    xb = np.asarray(xb, dtype=np.float32)
    if xb.ndim != 2 or xb.shape[1] != QK_TURBO:
        raise ValueError("xb must have shape (nb, 64)")
    lv, bd = _codebook(t.bits)

    sumsq = _seq_sum_products(xb, xb)
    norm = np.sqrt(sumsq).astype(np.float32)
    pos = norm > 0
    inv = np.zeros_like(norm)
    np.divide(np.float32(1.0), norm, out=inv, where=pos)
    with np.errstate(invalid="ignore", over="ignore"):
        u = xb * inv[:, None]  # float32 * float32 -> float32
        idx = np.zeros(xb.shape, dtype=np.uint8)
        for bk in bd:
            idx += u > bk

    if scale == "norm":
        d32 = norm
    else:
        c = lv[idx]
        num = _seq_sum_products(xb, c)
        den = _seq_sum_products(c, c)
        with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
            d32 = (num / den).astype(np.float32)
    d32 = np.where(pos, d32, np.float32(0.0))
    with np.errstate(over="ignore"):
        d16 = d32.astype(np.float16)
    return d16, idx


def quantize(x: np.ndarray, ttype: str, scale: str = "lsq") -> np.ndarray:
    """Quantize rows x (rows, n) with n % 64 == 0 -> raw bytes uint8 (rows, n/64 * block_size).

    A 1-D x is treated as one row and gives a 1-D result.
    """
    t = _tt(ttype)
    x = np.asarray(x, dtype=np.float32)
    one_d = x.ndim == 1
    if one_d:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] % QK_TURBO != 0:
        raise ValueError(f"x must be (rows, n) with n a multiple of {QK_TURBO}")
    rows, n = x.shape
    nb = n // QK_TURBO
    d16, idx = quantize_blocks(x.reshape(rows * nb, QK_TURBO), ttype, scale)
    dbytes = d16.astype("<f2").view(np.uint8).reshape(rows * nb, 2)
    raw = np.concatenate([dbytes, pack_indices(idx, ttype)], axis=1)
    assert raw.shape[1] == t.block_size
    raw = raw.reshape(rows, nb * t.block_size)
    return raw[0] if one_d else raw


def split_blocks(raw: np.ndarray, ttype: str) -> tuple[np.ndarray, np.ndarray]:
    """raw bytes (..., nb*block_size) -> (d float16 (N,), indices uint8 (N, 64)) with N = total blocks."""
    t = _tt(ttype)
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if raw.size % t.block_size:
        raise ValueError("raw size is not a multiple of the block size")
    blocks = raw.reshape(-1, t.block_size)
    d16 = blocks[:, :2].copy().view("<f2").reshape(-1).astype(np.float16)
    idx = unpack_indices(blocks[:, 2:], ttype)
    return d16, idx


def dequantize(raw: np.ndarray, ttype: str, n: int | None = None) -> np.ndarray:
    """Dequantize raw bytes (rows, n/64*block_size) -> float32 (rows, n).  A 1-D raw gives a 1-D result."""
    t = _tt(ttype)
    raw = np.asarray(raw, dtype=np.uint8)
    one_d = raw.ndim == 1
    if one_d:
        raw = raw[None, :]
    rows, nbytes = raw.shape
    if nbytes % t.block_size:
        raise ValueError("row byte size is not a multiple of the block size")
    nb = nbytes // t.block_size
    if n is None:
        n = nb * QK_TURBO
    if n != nb * QK_TURBO:
        raise ValueError(f"n={n} does not match {nb} blocks of {QK_TURBO}")
    d16, idx = split_blocks(raw, ttype)
    lv, _ = _codebook(t.bits)
    with np.errstate(over="ignore", invalid="ignore"):
        y = d16.astype(np.float32)[:, None] * lv[idx]
    y = y.astype(np.float32).reshape(rows, n)
    return y[0] if one_d else y


# ----------------------------------------------------------------------------------------------------------------
# Rotation


def _check_group(g: int) -> None:
    if g <= 0 or g & (g - 1):
        raise ValueError(f"group size {g} is not a power of two")


def rotation_signs(g: int) -> np.ndarray:
    """float32 signs s(0..g-1) of the randomized Hadamard transform (see module docstring)."""
    _check_group(g)
    m = np.uint64(0xFFFFFFFF)
    i = np.arange(g, dtype=np.uint64)
    h = (i * np.uint64(0x9E3779B1) + np.uint64(0x7F4A7C15)) & m
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m
    h ^= h >> np.uint64(13)
    return np.where((h & np.uint64(1)) != 0, np.float32(-1.0), np.float32(1.0)).astype(np.float32)


def _fwht(x: np.ndarray, g: int) -> np.ndarray:
    """Normalized Walsh-Hadamard (Sylvester order) on groups of g along the last axis; x float64, copy returned."""
    shape = x.shape
    y = x.reshape(-1, g).copy()
    h = 1
    while h < g:
        y = y.reshape(-1, g // (2 * h), 2, h)
        a = y[:, :, 0, :]
        b = y[:, :, 1, :]
        y = np.stack([a + b, a - b], axis=2)
        h *= 2
    return (y.reshape(shape) / np.sqrt(g))


def _prep(x: np.ndarray, g: int) -> tuple[np.ndarray, np.dtype]:
    _check_group(g)
    x = np.asarray(x)
    if x.shape[-1] % g:
        raise ValueError(f"last axis ({x.shape[-1]}) is not a multiple of the group size {g}")
    out_dtype = np.result_type(x.dtype, np.float32)
    return x.astype(np.float64), out_dtype


def rotate(x: np.ndarray, g: int) -> np.ndarray:
    """Forward rotation R(x) = H D x on groups of g along the last axis (computed in float64)."""
    xf, dt = _prep(x, g)
    s = rotation_signs(g).astype(np.float64)
    xs = (xf.reshape(-1, g) * s).reshape(xf.shape)
    return _fwht(xs, g).astype(dt)


def unrotate(x: np.ndarray, g: int) -> np.ndarray:
    """Inverse rotation R^-1(x) = D H x on groups of g along the last axis (computed in float64)."""
    xf, dt = _prep(x, g)
    s = rotation_signs(g).astype(np.float64)
    y = _fwht(xf, g)
    return (y.reshape(-1, g) * s).reshape(xf.shape).astype(dt)


def rotate_graph(x: np.ndarray, g: int) -> np.ndarray:
    """The rotation llama.cpp's graph applies with the patch series: D H D x on groups of g.

    D H D is orthogonal, symmetric and its own inverse (like H alone), so upstream's call sites that
    reuse one call for rotating and un-rotating (V output, K-shift, MLA output) stay correct; the outer D
    only flips coordinate signs after ``rotate``, which leaves the coordinate distribution unchanged.
    """
    y = rotate(x, g)
    s = rotation_signs(g).astype(y.dtype)
    return (y.reshape(-1, g) * s).reshape(y.shape)
