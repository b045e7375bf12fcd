"""Will a KV-cache type work for this model in the pinned, patched llama.cpp, and as what?

Mirrors llama_init_from_model (src/llama-context.cpp): turbo types need one head dim that is a multiple of 64 across
the layers (K and V separately), else llama.cpp uses q8_0 (f16 when a head dim is not a multiple of 32) with a
warning; turbo types and quantized V need flash attention; with flash attention a quantized type's block size must
divide every head dim; MLA models need K type == V type; without flash attention V rows are padded to the widest layer.
"""

from __future__ import annotations

from dataclasses import dataclass

from . import ggml_types
from .gguf_check import ModelFacts

TURBO = ("turbo2", "turbo3", "turbo4")
REPORT_TYPES = ("f16", "q8_0", "q4_0", "turbo4", "turbo3", "turbo2")
# Cache types that flash attention takes next to a turbo type on each GPU backend of the patched build: CUDA and
# HIP (patch 0011) pair a turbo type with f16, q8_0 or a turbo type; Vulkan's scalar shader (patch 0040) decodes
# every type that its flash attention takes, where bf16 pairs only with bf16
GPU_TURBO_PARTNERS = {
    "cuda": ("f16", "q8_0", *TURBO),
    "hip": ("f16", "q8_0", *TURBO),
    "vulkan": ("f32", "f16", "q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", *TURBO),
}
GPU_BACKENDS = tuple(GPU_TURBO_PARTNERS)
GPU_NAMES = {"cuda": "CUDA", "hip": "HIP", "vulkan": "Vulkan", "metal": "Metal"}
# GPU backends that the series gives no turbo kernels: a turbo cache on their device cannot even be written there
NO_TURBO_BACKENDS = ("metal",)
NO_TURBO_HINT = ("build with -b cuda, -b hip or -b vulkan for turbo caches on the GPU, or run on the CPU with "
                 "-ngl 0")
PAIR_HINT = "use q8_0 or f16 as the partner of a turbo type, or -ngl 0 to run on the CPU"


@dataclass
class Verdict:
    side: str          # "K" or "V"
    type: str          # requested
    status: str        # native | padded | falls back | unsupported | no cache
    effective: str | None
    reason: str

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def _dims(facts: ModelFacts, side: str) -> list[int]:
    return [ly.head_dim_k if side == "K" else ly.head_dim_v for ly in facts.trunk_layers]


def _fmt(dims: list[int]) -> str:
    u = sorted(set(dims))
    return str(u[0]) if len(u) == 1 else "/".join(map(str, u))


def no_fa_reason(facts: ModelFacts) -> str | None:
    return "llama.cpp turns flash attention off for Grok" if facts.arch == "grok" else None


def verdict(facts: ModelFacts, side: str, type_name: str, flash_attn: bool = True) -> Verdict:
    t = ggml_types.cache_type(type_name)
    if not facts.kv_layers:
        return Verdict(side, type_name, "no cache", None, f"{facts.arch} has no attention KV cache")
    if side == "V" and facts.mla:
        return Verdict(side, type_name, "no cache", None, "MLA: V is read from the K cache (K and V types must match)")
    forced = no_fa_reason(facts)
    fa = flash_attn and forced is None
    dims = _dims(facts, side)
    hd = _fmt(dims)
    if type_name in TURBO:
        if not fa:
            return Verdict(side, type_name, "unsupported", None,
                           f"turbo types need flash attention ({forced or 'off with -fa off'})")
        if len(set(dims)) == 1 and dims[0] % 64 == 0:
            g = 64
            while dims[0] % (g * 2) == 0:
                g *= 2
            blocks = dims[0] // 64
            return Verdict(side, type_name, "native", type_name,
                           f"head dim {hd} = {blocks} block{'s' if blocks > 1 else ''} of 64, rotation group {g}")
        fb = "q8_0" if all(d % 32 == 0 for d in dims) else "f16"
        why = "varies by layer" if len(set(dims)) > 1 else "is not a multiple of 64"
        return Verdict(side, type_name, "falls back", fb, f"head dim {hd} {why}: llama.cpp uses {fb} instead")
    if ggml_types.is_quantized(t):
        if side == "V" and not fa:
            return Verdict(side, type_name, "unsupported", None,
                           f"a quantized V cache needs flash attention ({forced or 'off with -fa off'})")
        bad = sorted({d for d in dims if d % t.block})
        if fa and bad:
            return Verdict(side, type_name, "unsupported", None,
                           f"block size {t.block} does not divide head dim {_fmt(bad)}: llama.cpp refuses it")
        return Verdict(side, type_name, "native", type_name, f"head dim {hd} = {dims[0] // t.block} x {t.block}"
                       if len(set(dims)) == 1 else f"head dims {hd} are multiples of {t.block}")
    if side == "V" and not fa:
        widths = {ly.v_values for ly in facts.kv_layers}
        if len(widths) > 1:
            return Verdict(side, type_name, "padded", type_name,
                           f"without flash attention V rows are padded to the widest layer ({max(widths)} values)")
    return Verdict(side, type_name, "native", type_name, "no block constraint")


def config_effective(facts: ModelFacts, k: str, v: str, flash_attn: bool = True) -> tuple[str, str, str | None]:
    """(effective K, effective V, error) for a -ctk/-ctv pair; error is set when llama.cpp would refuse it."""
    vk = verdict(facts, "K", k, flash_attn)
    vv = verdict(facts, "V", v, flash_attn)
    if facts.mla and facts.kv_layers and k != v:
        return k, v, "MLA models need the same K and V cache type"
    for vd in (vk, vv):
        if vd.status == "unsupported":
            return k, v, f"{vd.side} {vd.type}: {vd.reason}"
    ek = vk.effective or k
    ev = (vv.effective or v) if not facts.mla else ek
    return ek, ev, None


def layer_list(layers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, i = [], 0
    layers = sorted(layers)
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(str(layers[i]) if i == j else f"{layers[i]}-{layers[j]}")
        i = j + 1
    return ",".join(out)


@dataclass
class Boundary:
    """The boundary-layer V policy (patch 0010) on a model: which layers, at which type, every layer's V type."""

    layers: list[int]            # the first and last n KV-bearing layers (empty: no policy)
    type: str | None             # their effective V type
    v_layers: dict[int, str]     # layer index -> V type, every KV-bearing layer
    note: str | None = None      # why the policy changes nothing here
    error: str | None = None     # why the boundary type cannot work with this model


def boundary_v(facts: ModelFacts, v: str, n: int, btype: str, flash_attn: bool = True) -> Boundary:
    """The V cache of the first and last n KV-bearing layers at btype (effective V type v elsewhere), as llama.cpp
    with --cache-boundary-layers n --cache-type-v-boundary btype lays it out. The policy only raises precision: a
    btype with no more bits than v changes nothing."""
    kv = [ly.index for ly in facts.kv_layers]
    v_layers = {il: v for il in kv}
    if n <= 0 or not kv:
        return Boundary([], None, v_layers)
    if facts.mla:
        return Boundary([], None, v_layers, note="MLA model: V is stored with K, the boundary policy does not apply")
    vd = verdict(facts, "V", btype, flash_attn)
    if vd.status == "unsupported":
        return Boundary([], None, v_layers, error=vd.reason)
    bt = vd.effective or btype
    m = min(n, len(kv))
    layers = [il for i, il in enumerate(kv) if i < m or i >= len(kv) - m]
    if ggml_types.cache_type(bt).bits_per_value <= ggml_types.cache_type(v).bits_per_value:
        return Boundary(layers, bt, v_layers,
                        note=f"boundary type {bt} does not raise precision over V {v}: the policy changes nothing")
    return Boundary(layers, bt, v_layers | {il: bt for il in layers})


def gpu_pair_error(k: str, v: str, backends: list[str] | tuple[str, ...]) -> str | None:
    """Why a K/V pair cannot run flash attention on a GPU of a patched build with `backends`, or None.

    On CUDA/HIP a turbo type pairs with f16, q8_0 or a turbo type, on Vulkan with any type that its flash attention
    takes but bf16; for another partner (q4_0 or q5_1 on CUDA, bf16 anywhere) llama.cpp would quietly run that
    layer's attention on the CPU and copy the cache every token."""
    if k not in TURBO and v not in TURBO:
        return None
    for b in backends:
        partners = GPU_TURBO_PARTNERS.get(b)
        if partners and (k not in partners or v not in partners):
            return (f"K {k} / V {v} has no {GPU_NAMES[b]} flash-attention kernel: a turbo cache pairs with "
                    f"{', '.join(partners)} on the GPU, otherwise attention runs on the CPU and the cache is "
                    "copied every token")
    return None


def no_turbo_backend_error(backends: list[str] | None, n_gpu_layers: str | int | None, types) -> str | None:
    """Why turbo cache types cannot run with a build's offloaded layers, or None.

    The Metal backend has no turbo kernels. A layer offloaded to such a device keeps its KV cache in the device's
    memory, and the cache write (SET_ROWS) into a turbo cache cannot run there, nor anywhere else, as the cache
    cannot move: llama.cpp stops with "pre-allocated tensor ... cannot run the operation (SET_ROWS)" (seen on Vulkan
    before patch 0040 gave it turbo kernels)."""
    if str(n_gpu_layers) == "0":
        return None
    gpu = [b for b in backends or [] if b in NO_TURBO_BACKENDS]
    turbo = sorted({t for t in types if t in TURBO})
    if not gpu or not turbo:
        return None
    names = " and ".join(GPU_NAMES[b] for b in gpu)
    return (f"this build's {names} backend has no kernels for {', '.join(turbo)} caches: llama.cpp would stop "
            "when it writes the cache on the GPU")


def gpu_config_error(backends: list[str] | None, n_gpu_layers: str | int | None, k: str,
                     vs) -> tuple[str, str] | None:
    """(why, hint) when K type `k` with the V types `vs` (a config's V and its boundary layers' V) cannot run as
    asked on a build with `backends` and `-ngl n_gpu_layers`, else None: turbo types on a GPU without turbo kernels
    (no_turbo_backend_error), or a pair whose attention would fall back to the CPU (gpu_pair_error)."""
    err = no_turbo_backend_error(backends, n_gpu_layers, (k, *vs))
    if err:
        return err, NO_TURBO_HINT
    if gpu_offload(backends, n_gpu_layers):
        for v in dict.fromkeys(vs):
            err = gpu_pair_error(k, v, backends or [])
            if err:
                return err, PAIR_HINT
    return None


def gpu_offload(backends: list[str] | None, n_gpu_layers: str | int | None) -> bool:
    """Whether a run of a build with `backends` and `-ngl n_gpu_layers` puts layers on a CUDA, HIP or Vulkan
    device (llama.cpp offloads all layers by default)."""
    return any(b in GPU_BACKENDS for b in backends or []) and str(n_gpu_layers) != "0"
