"""Random-weight GGUF model writer.

Writes a llama.cpp-loadable GGUF with random weights and a real tokenizer, for
speed/correctness testing of KV-cache shapes that no small real model has
(head_dim 64/128/256, wide GQA, sliding-window layers, 8B-sized layouts, ...).

Architectures
-------------
* ``llama`` for plain models (no ``sliding_window``).  ``head_dim`` may differ
  from ``n_embd / n_head``: ``llama.attention.key_length`` / ``value_length``
  and ``llama.rope.dimension_count`` are always written (llama.cpp requires
  n_rot == head_dim for llama).
* ``gemma3`` for models with sliding-window layers.  In the pinned llama.cpp,
  gemma3 reads ``gemma3.attention.sliding_window`` and then
  ``load_swa_pattern()``, which accepts ``gemma3.attention.sliding_window_pattern``
  either as an integer or as a per-layer bool array; we always write the
  explicit bool array (True = sliding layer), so the layout does not depend on
  the loader's default pattern.  gemma3 also takes ``key_length`` != n_embd/n_head,
  GQA, and a separate RoPE base for sliding layers (``rope.freq_base_swa``,
  written as 10000 like real Gemma 3).  Alternatives were rejected: olmo2 and
  exaone4 force head_dim == n_embd/n_head, mellum is MoE-only.
  Gemma-3 specifics you get with it: q/k RMS norms, post-attention and
  post-FFN norms, GELU FFN, embeddings scaled by sqrt(n_embd), attention scale
  1/sqrt(head_dim) (except for 62-layer models, where llama.cpp assumes the 27B
  value 1/sqrt(n_embd/n_head)).

Sliding-window pattern convention (gemma-3 / llama.cpp ``set_swa_pattern(P)``):
with ``swa_pattern = P``, every P-th layer is full attention and the other
layers are sliding, the full one being the *last* of each group of P:
layer ``il`` is full iff ``il % P == P - 1``.  P=6 gives gemma-3's
5 sliding : 1 full.  Default when ``sliding_window`` is set: ``min(6, n_layer)``.
``swa_pattern`` must be in ``[2, n_layer]`` so that there is at least one
sliding and one full layer.

Weights
-------
The big matrices are ``q4_0``, ``q8_0`` (via ``gguf.quants.quantize``),
``f16`` or ``f32``; norm weights are f32 ones (gemma3 GGUFs store norm weights already
offset by +1, so 1 is the identity).  Matrix entries are uniform with
std = 1/sqrt(fan_in) (fan_in = row length, for token_embd n_embd), which keeps
activations O(1) through all layers and the logits finite.  Every tensor has
its own RNG stream seeded from (``seed``, crc32(name)), so files are
deterministic.

Streaming
---------
All tensor infos are registered first (``GGUFWriter.add_tensor_info``), header,
KV and tensor-info sections are written, then each tensor is generated and
written in row chunks of at most ``CHUNK_ELEMS`` elements; peak memory is a few
chunks (tens of MB), independent of the file size.  The file is written to
``<out>.part`` and renamed on success.
"""

from __future__ import annotations

import math
import os
import struct
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import gguf
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.quants import quant_shape_to_byte_shape, quantize

__all__ = [
    "SynthShape", "SynthInfo", "PRESETS", "WEIGHT_TYPES",
    "synth", "find_vocab", "validate", "read_tokenizer_kv", "plan_tensors", "swa_layers",
]

LLAMA_MAX_LAYERS = 512          # llama-hparams.h
QK = 32                         # block size of q4_0 / q8_0
CHUNK_ELEMS = 1 << 20           # elements generated per chunk (4 MiB of f32)
RMS_EPS = 1e-5
GEMMA3_RMS_EPS = 1e-6
GEMMA3_ROPE_BASE_SWA = 10000.0
DEFAULT_SWA_PATTERN = 6         # gemma-3

WEIGHT_TYPES: dict[str, tuple[GGMLQuantizationType, LlamaFileType]] = {
    "q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "f16":  (GGMLQuantizationType.F16,  LlamaFileType.MOSTLY_F16),
    "f32":  (GGMLQuantizationType.F32,  LlamaFileType.ALL_F32),
}


@dataclass
class SynthShape:
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int | None = None             # default: 8/3 * n_embd rounded up to a multiple of 256
    sliding_window: int | None = None   # set: gemma3 model with sliding-window layers
    swa_pattern: int | None = None      # layer il is full iff il % P == P-1 (default min(6, n_layer))
    n_ctx_train: int = 131072
    rope_theta: float = 500000.0

    @property
    def ff(self) -> int:
        if self.n_ff is not None:
            return self.n_ff
        return -(-(8 * self.n_embd) // (3 * 256)) * 256

    @property
    def pattern(self) -> int | None:
        if self.sliding_window is None:
            return None
        if self.swa_pattern is not None:
            return self.swa_pattern
        return min(DEFAULT_SWA_PATTERN, self.n_layer)

    @property
    def arch(self) -> str:
        return "llama" if self.sliding_window is None else "gemma3"


PRESETS: dict[str, SynthShape] = {
    "llama3-8b":  SynthShape(n_layer=32, n_embd=4096, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336),
    "tiny-hd64":  SynthShape(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=768,
                             n_ctx_train=4096),
    "tiny-hd128": SynthShape(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=128, n_ff=768,
                             n_ctx_train=4096),
    "tiny-hd256": SynthShape(n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=256, n_ff=768,
                             n_ctx_train=4096),
    "tiny-gqa8":  SynthShape(n_layer=4, n_embd=256, n_head=8, n_head_kv=1, head_dim=256, n_ff=768,
                             n_ctx_train=4096),
    "tiny-swa":   SynthShape(n_layer=6, n_embd=256, n_head=4, n_head_kv=2, head_dim=128, n_ff=768,
                             sliding_window=64, swa_pattern=3, n_ctx_train=4096, rope_theta=1000000.0),
}


@dataclass
class SynthInfo:
    path: Path
    arch: str
    shape: SynthShape
    n_params: int
    file_size: int
    vocab: Path
    n_vocab: int
    weights: str
    seed: int
    n_tensors: int


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]      # numpy order: (rows, row_len); ggml ne = reversed
    qtype: GGMLQuantizationType
    std: float | None = None    # None: norm weight (all ones)

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return math.prod(quant_shape_to_byte_shape(self.shape, self.qtype))


# ---------------------------------------------------------------------------
# validation

def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def validate(shape: SynthShape, weights: str = "q8_0") -> None:
    """Raise ValueError (one-line message) if the shape/weights can't make a loadable model."""
    for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_ctx_train"):
        v = getattr(shape, name)
        _check(isinstance(v, int) and not isinstance(v, bool) and v > 0, f"{name} must be a positive integer, got {v!r}")
    _check(shape.n_layer <= LLAMA_MAX_LAYERS, f"n_layer must be <= {LLAMA_MAX_LAYERS}, got {shape.n_layer}")
    _check(shape.n_head_kv <= shape.n_head, f"n_head_kv ({shape.n_head_kv}) must be <= n_head ({shape.n_head})")
    _check(shape.n_head % shape.n_head_kv == 0,
           f"n_head ({shape.n_head}) must be a multiple of n_head_kv ({shape.n_head_kv})")
    _check(shape.head_dim % 2 == 0, f"head_dim must be even (RoPE), got {shape.head_dim}")
    if shape.n_ff is not None:
        _check(isinstance(shape.n_ff, int) and shape.n_ff > 0, f"n_ff must be a positive integer, got {shape.n_ff!r}")
    _check(shape.rope_theta > 0, f"rope_theta must be > 0, got {shape.rope_theta}")
    _check(weights in WEIGHT_TYPES, f"weights must be one of {', '.join(WEIGHT_TYPES)}, got {weights!r}")
    if weights in ("q4_0", "q8_0"):
        for what, n in (("n_embd", shape.n_embd), ("n_head*head_dim", shape.n_head * shape.head_dim),
                        ("n_ff", shape.ff)):
            _check(n % QK == 0, f"{what} ({n}) must be a multiple of {QK} for {weights} weights")
    if shape.sliding_window is None:
        _check(shape.swa_pattern is None, "swa_pattern requires sliding_window")
    else:
        _check(isinstance(shape.sliding_window, int) and shape.sliding_window > 0,
               f"sliding_window must be a positive integer, got {shape.sliding_window!r}")
        _check(shape.n_layer >= 2, "a sliding-window model needs n_layer >= 2")
        p = shape.pattern
        _check(isinstance(p, int) and 2 <= p <= shape.n_layer,
               f"swa_pattern must be in [2, n_layer={shape.n_layer}], got {p!r}")


def swa_layers(shape: SynthShape) -> list[bool]:
    """Per-layer flags, True = sliding-window layer (all False for plain models)."""
    p = shape.pattern
    if p is None:
        return [False] * shape.n_layer
    return [il % p != p - 1 for il in range(shape.n_layer)]


# ---------------------------------------------------------------------------
# vocab

def find_vocab(llama_source: Path, name: str = "llama-bpe") -> Path:
    """models/ggml-vocab-<name>.gguf in a llama.cpp tree; ValueError listing the available ones."""
    models = Path(llama_source) / "models"
    p = models / f"ggml-vocab-{name}.gguf"
    if p.is_file():
        return p
    avail = sorted(q.name[len("ggml-vocab-"):-len(".gguf")] for q in models.glob("ggml-vocab-*.gguf"))
    raise ValueError(f"no vocab {name!r} in {models} (available: {', '.join(avail) or 'none'})")


_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


def read_tokenizer_kv(path: Path, prefix: str = "tokenizer.") -> dict[str, tuple[GGUFValueType, Any, GGUFValueType | None]]:
    """KV fields of a (little-endian) GGUF whose key starts with ``prefix``.

    Returns key -> (type, value, array element type).  Strings are raw bytes
    (copied verbatim), arrays are lists.  This is a minimal KV-section parser:
    gguf.GGUFReader takes ~10 s on a 128k-token BPE vocab, this takes well under 1 s.
    """
    data = Path(path).read_bytes()
    mv = memoryview(data)
    _check(data[:4] == b"GGUF", f"{path}: not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", data, 4)
    _check(version in (2, 3), f"{path}: unsupported GGUF version {version}")
    off = 24
    out: dict[str, tuple[GGUFValueType, Any, GGUFValueType | None]] = {}

    def read_str(o: int) -> tuple[bytes, int]:
        (n,) = struct.unpack_from("<Q", data, o)
        return bytes(mv[o + 8:o + 8 + n]), o + 8 + n

    def read_val(t: GGUFValueType, o: int) -> tuple[Any, int]:
        if t == GGUFValueType.STRING:
            return read_str(o)
        fmt = _SCALAR[t]
        return struct.unpack_from(fmt, data, o)[0], o + struct.calcsize(fmt)

    for _ in range(n_kv):
        key_b, off = read_str(off)
        key = key_b.decode("utf-8")
        (t,) = struct.unpack_from("<I", data, off)
        off += 4
        vt = GGUFValueType(t)
        sub = None
        if vt == GGUFValueType.ARRAY:
            st, n = struct.unpack_from("<IQ", data, off)
            off += 12
            sub = GGUFValueType(st)
            if sub == GGUFValueType.STRING:
                val: Any = []
                for _i in range(n):
                    s, off = read_str(off)
                    val.append(s)
            elif sub == GGUFValueType.ARRAY:
                raise ValueError(f"{path}: nested array in {key} is not supported")
            else:
                fmt = _SCALAR[sub]
                sz = struct.calcsize(fmt)
                val = np.frombuffer(data, dtype=np.dtype(fmt), count=n, offset=off).tolist()
                off += sz * n
        else:
            val, off = read_val(vt, off)
        if key.startswith(prefix):
            out[key] = (vt, val, sub)
    return out


# ---------------------------------------------------------------------------
# tensors

def plan_tensors(shape: SynthShape, n_vocab: int, weights: str = "q8_0") -> list[_Tensor]:
    """The tensors of the model, in file order (no data)."""
    qt = WEIGHT_TYPES[weights][0]
    F32 = GGMLQuantizationType.F32
    E, hd, ff = shape.n_embd, shape.head_dim, shape.ff
    nq, nkv = shape.n_head * hd, shape.n_head_kv * hd
    gemma = shape.arch == "gemma3"

    def w(name: str, rows: int, cols: int) -> _Tensor:   # cols = fan_in = ggml ne0
        return _Tensor(name, (rows, cols), qt, 1.0 / math.sqrt(cols))

    def norm(name: str, n: int) -> _Tensor:
        return _Tensor(name, (n,), F32, None)

    ts = [w("token_embd.weight", n_vocab, E)]
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        ts.append(norm(b + "attn_norm.weight", E))
        ts += [w(b + "attn_q.weight", nq, E), w(b + "attn_k.weight", nkv, E), w(b + "attn_v.weight", nkv, E)]
        if gemma:
            ts += [norm(b + "attn_q_norm.weight", hd), norm(b + "attn_k_norm.weight", hd)]
        ts.append(w(b + "attn_output.weight", E, nq))
        if gemma:
            ts.append(norm(b + "post_attention_norm.weight", E))
        ts.append(norm(b + "ffn_norm.weight", E))
        ts += [w(b + "ffn_gate.weight", ff, E), w(b + "ffn_up.weight", ff, E), w(b + "ffn_down.weight", E, ff)]
        if gemma:
            ts.append(norm(b + "post_ffw_norm.weight", E))
    ts += [norm("output_norm.weight", E), w("output.weight", n_vocab, E)]
    return ts


def _chunks(t: _Tensor, seed: int) -> Iterator[np.ndarray]:
    """Generate the tensor's data (already in its file dtype) in row chunks."""
    if t.std is None:
        yield np.ones(t.shape, dtype=np.float32)
        return
    rows, cols = t.shape
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
    a = np.float32(math.sqrt(3.0) * t.std)          # uniform(-a, a) has std t.std
    step = max(1, CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        x = rng.random((min(step, rows - r0), cols), dtype=np.float32)
        x *= 2 * a
        x -= a
        if t.qtype == GGMLQuantizationType.F16:
            yield x.astype(np.float16)
        elif t.qtype == GGMLQuantizationType.F32:
            yield x
        else:
            yield quantize(x, t.qtype)


# Root mean square of the code values of a block (uniformly random codes): q4_0 codes q - 8 for q in 0..15,
# q8_0 codes -128..127. A block scale of std / rms gives the matrix the same std as the uniform weights.
_CODE_RMS = {
    GGMLQuantizationType.Q4_0: math.sqrt(sum(k * k for k in range(-8, 8)) / 16),
    GGMLQuantizationType.Q8_0: math.sqrt(sum(k * k for k in range(-128, 128)) / 256),
}


def _fast_chunks(t: _Tensor, seed: int) -> Iterator[np.ndarray]:
    """Like _chunks, but q4_0/q8_0 matrices get uniformly random codes with one fixed scale per tensor instead of
    quantized uniform floats: the same std, no float generation or quantization (about 20x faster), for speed
    runs on large shapes. Other tensors come from _chunks."""
    if t.std is None or t.qtype not in _CODE_RMS:
        yield from _chunks(t, seed)
        return
    rows, cols = t.shape
    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode()), 1])
    blck, tsize = gguf.GGML_QUANT_SIZES[t.qtype]
    d = np.frombuffer(np.float16(t.std / _CODE_RMS[t.qtype]).tobytes(), dtype=np.uint8)
    step = max(1, CHUNK_ELEMS // cols)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        b = rng.integers(0, 256, size=(n, cols // blck, tsize), dtype=np.uint8)
        b[:, :, 0:2] = d
        yield b.reshape(n, (cols // blck) * tsize)


# ---------------------------------------------------------------------------
# writer

def synth(out: Path, shape: SynthShape, vocab_gguf: Path, weights: str = "q8_0", seed: int = 0,
          progress: Callable[[int, int, str], None] | None = None, fast: bool = False) -> SynthInfo:
    """Write a random-weight GGUF to ``out``; see the module docstring.

    ``progress(i, n, name)`` is called after each tensor is written, i = 1..n. ``fast`` writes random q4_0/q8_0
    codes directly (see _fast_chunks): for speed runs on large shapes, where quantizing floats takes minutes.
    """
    validate(shape, weights)
    _check(isinstance(seed, int) and seed >= 0, f"seed must be a non-negative integer, got {seed!r}")
    vocab_gguf = Path(vocab_gguf)
    _check(vocab_gguf.is_file(), f"vocab file not found: {vocab_gguf}")
    tok = read_tokenizer_kv(vocab_gguf)
    _check("tokenizer.ggml.tokens" in tok, f"{vocab_gguf}: no tokenizer.ggml.tokens")
    n_vocab = len(tok["tokenizer.ggml.tokens"][1])

    arch = shape.arch
    ftype = WEIGHT_TYPES[weights][1]
    tensors = plan_tensors(shape, n_vocab, weights)
    out = Path(out)
    _check(out.parent.is_dir(), f"output directory does not exist: {out.parent}")
    part = out.with_name(out.name + ".part")

    w = GGUFWriter(None, arch)
    w.add_name(f"tqgguf-synth {arch} L{shape.n_layer} E{shape.n_embd} H{shape.n_head}/{shape.n_head_kv} "
               f"hd{shape.head_dim} {weights}")
    w.add_description(f"random weights (tqgguf synth, seed {seed}); not a real model")
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_rope_dimension_count(shape.head_dim)
    w.add_rope_freq_base(float(shape.rope_theta))
    w.add_vocab_size(n_vocab)
    if arch == "gemma3":
        w.add_layer_norm_rms_eps(GEMMA3_RMS_EPS)
        w.add_sliding_window(shape.sliding_window)
        w.add_key_value(f"{arch}.attention.sliding_window_pattern",
                        swa_layers(shape), GGUFValueType.ARRAY, GGUFValueType.BOOL)
        w.add_float32(f"{arch}.rope.freq_base_swa", GEMMA3_ROPE_BASE_SWA)
    else:
        w.add_layer_norm_rms_eps(RMS_EPS)
    w.add_file_type(int(ftype))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    for key, (vt, val, sub) in tok.items():
        w.add_key_value(key, val, vt, sub)

    for t in tensors:
        np_dtype = np.float16 if t.qtype == GGMLQuantizationType.F16 else np.float32
        raw = None if t.qtype in (GGMLQuantizationType.F16, GGMLQuantizationType.F32) else t.qtype
        w.add_tensor_info(t.name, t.shape, np.dtype(np_dtype), t.nbytes, raw_dtype=raw)

    try:
        w.write_header_to_file(part)
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None and len(w.fout) == 1
        fout = w.fout[0]
        for i, t in enumerate(tensors):
            w.write_padding(fout, fout.tell())
            written = 0
            for chunk in (_fast_chunks if fast else _chunks)(t, seed):
                chunk.tofile(fout)
                written += chunk.nbytes
            if written != t.nbytes:
                raise RuntimeError(f"internal error: {t.name} wrote {written} bytes, expected {t.nbytes}")
            w.write_padding(fout, t.nbytes)
            if progress is not None:
                progress(i + 1, len(tensors), t.name)
        w.close()
        os.replace(part, out)
    except BaseException:
        w.close()
        part.unlink(missing_ok=True)
        raise

    return SynthInfo(path=out, arch=arch, shape=replace(shape), n_params=sum(t.n_elements for t in tensors),
                     file_size=out.stat().st_size, vocab=vocab_gguf, n_vocab=n_vocab, weights=weights,
                     seed=seed, n_tensors=len(tensors))
