"""KV-cache memory as the pinned llama.cpp allocates it, and what fits in a memory budget.

Sizing (src/llama-context.cpp, src/llama-kv-cache.cpp, src/llama-kv-cache-iswa.cpp, src/llama-model.cpp):
  * n_batch = min(n_ctx, -b); n_ubatch = min(n_batch, -ub)  (with the requested, unpadded n_ctx)
  * n_ctx = PAD(n_ctx, 256); unified: one stream of n_ctx cells; else n_seq streams of PAD(n_ctx / n_seq, 256) cells
  * each cache layer holds K: row_size(type_k, n_head_kv * head_dim_k) per cell and stream, V likewise
    (no V for MLA; without flash attention V rows are padded to the widest layer's)
  * models with sliding-window layers get two caches: the full layers as above, the SWA layers with
    PAD(min(cells, n_swa * (unified ? n_seq : 1) + n_ubatch), 256) cells per stream (--swa-full: the full size)
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ggml_types
from .gguf_check import ModelFacts

MIB = 1024 * 1024
GIB = 1024 * MIB
LLAMA_MAX_SEQ = 256


def pad(x: int, n: int = 256) -> int:
    return -(-x // n) * n


@dataclass
class Runtime:
    """How llama.cpp is launched: -c, -np, --kv-unified, -b, -ub, -fa, --swa-full."""

    ctx: int
    n_seq: int = 1
    unified: bool = True
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool = True
    swa_full: bool = False


@dataclass
class CacheSize:
    """One llama_kv_cache, as its `llama_kv_cache: size = ...` log line reports it."""

    name: str          # "base" or "swa"
    cells: int         # per stream
    streams: int
    layers: int
    k_bytes: int
    v_bytes: int
    values: int        # K + V values stored (for bits per value)


@dataclass
class KvSize:
    k: str             # effective types (after any turbo fallback)
    v: str
    caches: list[CacheSize]

    @property
    def k_bytes(self) -> int:
        return sum(c.k_bytes for c in self.caches)

    @property
    def v_bytes(self) -> int:
        return sum(c.v_bytes for c in self.caches)

    @property
    def total(self) -> int:
        return self.k_bytes + self.v_bytes

    @property
    def bits_per_value(self) -> float:
        values = sum(c.values for c in self.caches)
        return self.total * 8 / values if values else 0.0


def cells(facts: ModelFacts, rt: Runtime) -> tuple[int, int, int]:
    """(cells per stream of the full cache, streams, n_ubatch) for this launch."""
    if rt.n_seq < 1 or rt.n_seq > LLAMA_MAX_SEQ:
        raise ValueError(f"--parallel must be in 1..{LLAMA_MAX_SEQ}, got {rt.n_seq}")
    n_ctx = rt.ctx if rt.ctx > 0 else facts.n_ctx_train
    n_batch = min(n_ctx, rt.n_batch)
    n_ubatch = min(n_batch, rt.n_ubatch)
    n_ctx = pad(n_ctx)
    if rt.unified:
        return n_ctx, 1, n_ubatch
    return pad(n_ctx // rt.n_seq), rt.n_seq, n_ubatch


def kv_size(facts: ModelFacts, rt: Runtime, type_k: str, type_v: str, v_layers: dict[int, str] | None = None) -> KvSize:
    """Bytes of the KV cache(s) for effective cache types type_k / type_v; v_layers gives layers another V type
    (the boundary-layer V policy, kvcompat.boundary_v)."""
    tk, tv = ggml_types.cache_type(type_k), ggml_types.cache_type(type_v)
    v_layers = v_layers or {}
    size, streams, n_ubatch = cells(facts, rt)
    v_max = max((ly.v_values for ly in facts.layers), default=0)
    caches = []
    groups = [("base", [ly for ly in facts.kv_layers if not ly.swa], size)]
    if facts.swa_type != "none":
        n_swa = facts.n_swa * (rt.n_seq if rt.unified else 1)
        size_swa = size if rt.swa_full else pad(min(size, n_swa + n_ubatch))
        groups.append(("swa", [ly for ly in facts.kv_layers if ly.swa], size_swa))
    for name, layers, n_cells in groups:
        kb = vb = values = 0
        for ly in layers:
            v_width = 0 if facts.mla else (ly.v_values if rt.flash_attn else v_max)
            kb += tk.row_bytes(ly.k_values) * n_cells * streams
            tvl = ggml_types.cache_type(v_layers[ly.index]) if ly.index in v_layers else tv
            vb += tvl.row_bytes(v_width) * n_cells * streams
            values += (ly.k_values + v_width) * n_cells * streams
        caches.append(CacheSize(name, n_cells, streams, len(layers), kb, vb, values))
    return KvSize(type_k, type_v, caches)


def compute_margin(facts: ModelFacts, rt: Runtime, overhead: int = 512 * MIB) -> int:
    """A stated estimate of what llama.cpp needs besides weights and KV: one ubatch of logits and activations
    (4 bytes x n_ubatch x (n_vocab + 3 n_ff + 4 n_embd)), the f16 attention mask over the cache, and a fixed
    overhead for the runtime (backend context, graph, small buffers)."""
    size, streams, n_ubatch = cells(facts, rt)
    act = 4 * n_ubatch * (facts.n_vocab + 3 * facts.n_ff + 4 * facts.n_embd)
    mask = 2 * n_ubatch * size * streams
    return act + mask + overhead


@dataclass
class Fit:
    config: str
    what: str          # "ctx" or "slots"
    value: int         # largest -c (ctx) or number of slots; 0 when nothing fits
    need: int          # bytes needed at that value (weights + KV + margin)
    capped: str = ""   # why the search stopped before memory ran out


def _need(facts: ModelFacts, rt: Runtime, k: str, v: str, margin: int | None,
          v_layers: dict[int, str] | None = None) -> int:
    m = compute_margin(facts, rt) if margin is None else margin
    return facts.weights_bytes + kv_size(facts, rt, k, v, v_layers).total + m


def fit(facts: ModelFacts, base: Runtime, k: str, v: str, budget: int, what: str = "ctx",
        margin: int | None = None, v_layers: dict[int, str] | None = None) -> Fit:
    """Largest context (-c, a multiple of 256, at most n_ctx_train per slot) or the largest number of slots with
    base.ctx tokens each (-c = slots x ctx, at most 256) whose weights + KV + margin fit in budget bytes; v_layers
    as for kv_size."""
    from dataclasses import replace

    label = k if k == v else f"{k}/{v}"
    if what == "ctx":
        hi_cap = max(1, facts.n_ctx_train // 256) * base.n_seq

        def rt_at(i: int) -> Runtime:
            return replace(base, ctx=256 * i)
        unit = 256
    else:
        hi_cap = LLAMA_MAX_SEQ

        def rt_at(i: int) -> Runtime:
            return replace(base, ctx=base.ctx * i, n_seq=i)
        unit = 1
    if _need(facts, rt_at(1), k, v, margin, v_layers) > budget:
        return Fit(label, what, 0, _need(facts, rt_at(1), k, v, margin, v_layers))
    lo, hi = 1, hi_cap
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if _need(facts, rt_at(mid), k, v, margin, v_layers) <= budget:
            lo = mid
        else:
            hi = mid - 1
    capped = ""
    if lo == hi_cap:
        capped = "the model's training context" if what == "ctx" else f"llama.cpp's {LLAMA_MAX_SEQ} sequences"
    return Fit(label, what, lo * unit, _need(facts, rt_at(lo), k, v, margin, v_layers), capped)
