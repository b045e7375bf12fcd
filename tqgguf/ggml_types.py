"""ggml tensor types as the pinned llama.cpp defines them (ggml/include/ggml.h, gguf-py GGML_QUANT_SIZES).

Kept here rather than taken from the PyPI `gguf` package: that package does not know the turbo types (43-45), and
tqgguf must not depend on its release keeping pace with the pinned tree.
"""

from __future__ import annotations

from typing import NamedTuple

from . import turbo

QK_K = 256


class GgmlType(NamedTuple):
    id: int
    name: str
    block: int   # values per block
    size: int    # bytes per block

    @property
    def bits_per_value(self) -> float:
        return self.size * 8 / self.block

    def row_bytes(self, n: int) -> int:
        """ggml_row_size: bytes of n values (n must be a multiple of the block size)."""
        return n // self.block * self.size


_TABLE = [
    (0, "f32", 1, 4), (1, "f16", 1, 2), (2, "q4_0", 32, 18), (3, "q4_1", 32, 20),
    (6, "q5_0", 32, 22), (7, "q5_1", 32, 24), (8, "q8_0", 32, 34), (9, "q8_1", 32, 36),
    (10, "q2_K", QK_K, 2 + 2 + QK_K // 16 + QK_K // 4), (11, "q3_K", QK_K, 2 + QK_K // 4 + QK_K // 8 + 12),
    (12, "q4_K", QK_K, 2 + 2 + QK_K // 2 + 12), (13, "q5_K", QK_K, 2 + 2 + QK_K // 2 + QK_K // 8 + 12),
    (14, "q6_K", QK_K, 2 + QK_K // 2 + QK_K // 4 + QK_K // 16), (15, "q8_K", QK_K, 4 + QK_K + QK_K // 8),
    (16, "iq2_xxs", QK_K, 2 + QK_K // 4), (17, "iq2_xs", QK_K, 2 + QK_K // 4 + QK_K // 32),
    (18, "iq3_xxs", QK_K, 2 + QK_K // 4 + QK_K // 8), (19, "iq1_s", QK_K, 2 + QK_K // 8 + QK_K // 16),
    (20, "iq4_nl", 32, 18), (21, "iq3_s", QK_K, 2 + QK_K // 4 + QK_K // 8 + QK_K // 32 + 4),
    (22, "iq2_s", QK_K, 2 + QK_K // 4 + QK_K // 16), (23, "iq4_xs", QK_K, 2 + 2 + QK_K // 2 + QK_K // 64),
    (24, "i8", 1, 1), (25, "i16", 1, 2), (26, "i32", 1, 4), (27, "i64", 1, 8), (28, "f64", 1, 8),
    (29, "iq1_m", QK_K, QK_K // 8 + QK_K // 16 + QK_K // 32), (30, "bf16", 1, 2),
    (34, "tq1_0", QK_K, 2 + 4 * 13), (35, "tq2_0", QK_K, 2 + 64), (39, "mxfp4", 32, 17),
    (40, "nvfp4", 64, 36), (41, "q1_0", 128, 18), (42, "q2_0", 64, 18),
] + [(t.ggml_type, t.name, turbo.QK_TURBO, t.block_size) for t in turbo.TYPES.values()]

BY_ID: dict[int, GgmlType] = {i: GgmlType(i, n, b, s) for i, n, b, s in _TABLE}
BY_NAME: dict[str, GgmlType] = {t.name: t for t in BY_ID.values()}

# ids that once existed and were removed: a file using one is from an old or foreign tool
REMOVED: dict[int, str] = {4: "q4_2", 5: "q4_3", 31: "q4_0_4_4", 32: "q4_0_4_8", 33: "q4_0_8_8",
                           36: "iq4_nl_4_4", 37: "iq4_nl_4_8", 38: "iq4_nl_8_8"}

# what llama.cpp accepts for --cache-type-k/-v (common/arg.cpp kv_cache_types, plus the turbo types)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
               "turbo2", "turbo3", "turbo4")


def cache_type(name: str) -> GgmlType:
    if name not in CACHE_TYPES:
        raise ValueError(f"unknown KV cache type {name!r} (known: {', '.join(CACHE_TYPES)})")
    return BY_NAME[name]


def is_quantized(t: GgmlType) -> bool:
    return t.block > 1
