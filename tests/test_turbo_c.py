"""The C implementation of turbo2/3/4 (ggml-base + CPU backend of the patched tree) against the numpy reference.

* ggml_quantize_chunk output is byte-identical to tqgguf.turbo.quantize (Gaussian rows, huge/tiny norms,
  zero rows, several shapes);
* the type traits (size, block size, name, to_float) of ids 43/44/45;
* relative MSE of the C round trip on rotated Gaussian rows is close to the codebook design MSE;
* test-turbo-fattn (a small C++ program of the series) checks CPU flash attention over turbo K/V against the
  same attention over the dequantized (f32) K/V.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tqgguf import turbo as T  # noqa: E402

# the reference divides 1/norm for subnormal inputs on purpose (1/norm overflows to inf, as in C)
pytestmark = [pytest.mark.build, pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")]

TTYPES = ("turbo2", "turbo3", "turbo4")
BITS = {"turbo2": 2, "turbo3": 3, "turbo4": 4}
CODEBOOKS = ROOT / "tqgguf" / "data" / "codebooks.json"


class TypeTraits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)),
        ("from_float_ref", ctypes.c_void_p),
    ]


class Ggml:
    def __init__(self, path: Path):
        self.lib = lib = ctypes.CDLL(str(path))
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
        lib.ggml_type_size.restype = ctypes.c_size_t
        lib.ggml_type_size.argtypes = [ctypes.c_int]
        lib.ggml_blck_size.restype = ctypes.c_int64
        lib.ggml_blck_size.argtypes = [ctypes.c_int]
        lib.ggml_type_name.restype = ctypes.c_char_p
        lib.ggml_type_name.argtypes = [ctypes.c_int]
        lib.ggml_is_quantized.restype = ctypes.c_bool
        lib.ggml_is_quantized.argtypes = [ctypes.c_int]
        lib.ggml_get_type_traits.restype = ctypes.POINTER(TypeTraits)
        lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
        lib.ggml_validate_row_data.restype = ctypes.c_bool
        lib.ggml_validate_row_data.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]

    def quantize(self, x: np.ndarray, ttype: str) -> np.ndarray:
        t = T.TYPES[ttype]
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, n = x.shape
        out = np.full((rows, n // T.QK_TURBO * t.block_size), 0xAB, dtype=np.uint8)
        size = self.lib.ggml_quantize_chunk(t.ggml_type, x.ctypes.data, out.ctypes.data, 0, rows, n, None)
        assert size == out.nbytes
        return out

    def dequantize(self, raw: np.ndarray, ttype: str) -> np.ndarray:
        t = T.TYPES[ttype]
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        rows, nbytes = raw.shape
        n = nbytes // t.block_size * T.QK_TURBO
        y = np.full((rows, n), np.nan, dtype=np.float32)
        to_float = self.lib.ggml_get_type_traits(t.ggml_type).contents.to_float
        to_float(raw.ctypes.data, y.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), rows * n)
        return y

    def validate(self, raw: np.ndarray, ttype: str) -> bool:
        raw = np.ascontiguousarray(raw, dtype=np.uint8)
        return bool(self.lib.ggml_validate_row_data(T.TYPES[ttype].ggml_type, raw.ctypes.data, raw.nbytes))


def _bin_dir(llama_bin) -> Path:
    """The build's binary folder (the shared ggml libraries live next to the binaries)."""
    for name in ("test-turbo-fattn", "llama-cli", "test-backend-ops"):
        try:
            return llama_bin(name).parent
        except AssertionError:
            continue
    pytest.fail("no test-turbo-fattn / llama-cli / test-backend-ops in the build")


@pytest.fixture(scope="module")
def ggml(llama_bin) -> Ggml:
    bin_dir = _bin_dir(llama_bin)
    path = bin_dir / "libggml-base.so"
    assert path.is_file(), f"libggml-base.so not in {bin_dir} (needs BUILD_SHARED_LIBS=ON)"
    return Ggml(path)


def _cases(rng: np.random.Generator) -> list[tuple[str, np.ndarray]]:
    cases = []
    for rows, n in ((1, 64), (3, 128), (7, 256), (16, 64 * 5), (2, 64 * 32)):
        cases.append((f"gauss{rows}x{n}", rng.standard_normal((rows, n)).astype(np.float32)))
    x = rng.standard_normal((8, 256)).astype(np.float32)
    x *= np.float32(10.0) ** rng.uniform(-4, 4, size=(8, 1)).astype(np.float32)
    cases.append(("mixed_scales", x))
    for name, s in (("huge_1e3", 1e3), ("huge_1e4", 1e4), ("huge_1e20", 1e20), ("huge_1e37", 1e37),
                    ("tiny_1e-6", 1e-6), ("tiny_1e-20", 1e-20), ("tiny_1e-38", 1e-38), ("subnormal_1e-42", 1e-42)):
        cases.append((name, (rng.standard_normal((4, 128)) * s).astype(np.float32)))
    z = rng.standard_normal((6, 192)).astype(np.float32)
    z[1] = 0.0
    z[3, 64:128] = 0.0
    z[4] = -0.0
    z[5, ::3] = 0.0  # exact zeros inside a block land on the level just below 0
    cases.append(("zero_rows_and_blocks", z))
    sparse = np.zeros((4, 128), dtype=np.float32)
    sparse[0, 5] = 1.0
    sparse[1, 70] = -3.5
    sparse[2, :64] = 1.0  # every u equal: ties against the bounds
    sparse[3, :] = rng.choice(np.float32([-2, -1, 1, 2]), size=128)
    cases.append(("sparse_and_ties", sparse))
    # values exactly on a bound after normalisation are not reachable in general; exercise near-bound values
    for ttype in TTYPES:
        bd = T.bounds(ttype)
        nb = np.zeros((1, 64), dtype=np.float32)
        vals = np.concatenate([bd, np.nextafter(bd, np.float32(1)), np.nextafter(bd, np.float32(-1))])
        nb[0, : min(64, vals.size)] = vals[:64]
        cases.append((f"near_bounds_{ttype}", nb))
    return cases


# ------------------------------------------------------------------------------------------------ type traits


def test_type_traits(ggml):
    for ttype, (tid, size, name) in zip(TTYPES, ((43, 18, b"turbo2"), (44, 26, b"turbo3"), (45, 34, b"turbo4"))):
        assert T.TYPES[ttype].ggml_type == tid
        assert ggml.lib.ggml_type_size(tid) == size == T.block_size(ttype)
        assert ggml.lib.ggml_blck_size(tid) == 64 == T.QK_TURBO
        assert ggml.lib.ggml_type_name(tid) == name
        assert ggml.lib.ggml_is_quantized(tid)
        tr = ggml.lib.ggml_get_type_traits(tid).contents
        assert tr.type_name == name and tr.blck_size == 64 and tr.type_size == size and tr.is_quantized
        assert tr.to_float and tr.from_float_ref
    # upstream's last type is untouched
    assert ggml.lib.ggml_type_name(42) == b"q2_0"


# ------------------------------------------------------------------------------------------------ bit exactness


@pytest.mark.parametrize("ttype", TTYPES)
def test_quantize_bytes_match_reference(ggml, ttype):
    rng = np.random.default_rng(1234 + BITS[ttype])
    for name, x in _cases(rng):
        c = ggml.quantize(x, ttype)
        ref = T.quantize(x, ttype)
        assert c.shape == ref.shape, name
        if not np.array_equal(c, ref):
            bad = np.argwhere(c != ref)[:5]
            pytest.fail(f"{ttype}/{name}: C bytes differ from the reference at {bad.tolist()}")


@pytest.mark.parametrize("ttype", TTYPES)
def test_quantize_chunk_start_offset(ggml, ttype):
    """ggml_quantize_chunk with start > 0 writes only its rows, at the right offset."""
    t = T.TYPES[ttype]
    rng = np.random.default_rng(7)
    x = rng.standard_normal((6, 128)).astype(np.float32)
    out = np.zeros((6, 2 * t.block_size), dtype=np.uint8)
    size = ggml.lib.ggml_quantize_chunk(t.ggml_type, x.ctypes.data, out.ctypes.data, 3 * 128, 3, 128, None)
    assert size == 3 * 2 * t.block_size
    assert not out[:3].any()
    assert np.array_equal(out[3:], T.quantize(x[3:], ttype))


@pytest.mark.parametrize("ttype", TTYPES)
def test_dequantize_matches_reference(ggml, ttype):
    rng = np.random.default_rng(99 + BITS[ttype])
    for name, x in _cases(rng):
        raw = T.quantize(x, ttype)
        c = ggml.dequantize(raw, ttype)
        ref = T.dequantize(raw, ttype)
        assert np.array_equal(c, ref, equal_nan=True), name
    # arbitrary bytes (every index pattern, random scales) decode identically too
    t = T.TYPES[ttype]
    raw = rng.integers(0, 256, size=(32, 4 * t.block_size), dtype=np.uint8)
    blocks = raw.reshape(-1, t.block_size)
    blocks[:, :2] = np.float16(rng.standard_normal(blocks.shape[0]) * 4).astype("<f2").view(np.uint8).reshape(-1, 2)
    assert np.array_equal(ggml.dequantize(raw, ttype), T.dequantize(raw, ttype))


# ------------------------------------------------------------------------------------------------ quality / edge cases


@pytest.mark.parametrize("ttype", TTYPES)
def test_rotated_gaussian_mse_near_design(ggml, ttype):
    design = json.loads(CODEBOOKS.read_text())["codebooks"][str(BITS[ttype])]["rel_mse"]
    rng = np.random.default_rng(2024 + BITS[ttype])
    for g in (64, 128, 256):
        x = T.rotate(rng.standard_normal((2048, 256)).astype(np.float32) * np.float32(0.7), g)
        y = ggml.dequantize(ggml.quantize(x, ttype), ttype)
        rel = float(np.sum((x.astype(np.float64) - y) ** 2) / np.sum(x.astype(np.float64) ** 2))
        assert rel <= design * 1.03, (ttype, g, rel, design)
        # lsq scale: below the plain-norm design value, and not absurdly low either (a broken quantizer)
        assert rel >= design * 0.9, (ttype, g, rel, design)


@pytest.mark.parametrize("ttype", TTYPES)
def test_edge_rows_stay_finite(ggml, ttype):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((6, 128)).astype(np.float32)
    x[0] = 0.0
    x[1] *= np.float32(1e3)    # norm ~1e4: scale still representable in fp16
    x[2] *= np.float32(1e-6)   # tiny norm: scale rounds to fp16 subnormal / zero
    x[3] *= np.float32(1e-30)
    x[4] *= np.float32(1e-42)  # subnormal inputs (1/norm overflows to inf)
    x[5, :64] = 0.0
    raw = ggml.quantize(x, ttype)
    y = ggml.dequantize(raw, ttype)
    assert np.all(np.isfinite(y))
    assert not y[0].any() and not y[5, :64].any()
    assert ggml.validate(raw, ttype)
    rel = np.sum((x[1] - y[1]) ** 2) / np.sum(x[1] ** 2)
    assert rel < 0.3
    # a scale beyond the fp16 range becomes inf (non-saturating, like an f16 cache); validation catches it
    big = (rng.standard_normal((1, 64)) * 1e5).astype(np.float32)
    raw_big = ggml.quantize(big, ttype)
    assert np.isinf(ggml.dequantize(raw_big, ttype)).any()
    assert not ggml.validate(raw_big, ttype)


# ------------------------------------------------------------------------------------------------ CPU vec_dot


VEC_DOT = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t, ctypes.c_void_p,
                           ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


class TypeTraitsCpu(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", VEC_DOT),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


@pytest.fixture(scope="module")
def ggml_cpu(ggml):
    path = Path(ggml.lib._name).parent / "libggml-cpu.so"
    assert path.is_file(), f"{path} missing"
    lib = ctypes.CDLL(str(path))
    lib.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)
    lib.ggml_get_type_traits_cpu.argtypes = [ctypes.c_int]
    lib.ggml_cpu_init.restype = None
    lib.ggml_cpu_init()
    return lib


def _dot(fn, raw: np.ndarray, y: np.ndarray) -> float:
    out = ctypes.c_float(np.nan)
    fn(y.size, ctypes.byref(out), 0, raw.ctypes.data, 0, y.ctypes.data, 0, 1)
    return out.value


@pytest.mark.parametrize("ttype", TTYPES)
def test_cpu_vec_dot(ggml, ggml_cpu, ttype):
    """The CPU backend's turbo x f32 dot (SIMD and, where exported, the generic one) against float64 numpy."""
    t = T.TYPES[ttype]
    tr = ggml_cpu.ggml_get_type_traits_cpu(t.ggml_type).contents
    assert tr.vec_dot_type == 0  # GGML_TYPE_F32: Q stays in f32
    assert tr.nrows == 1 and tr.from_float
    fns = {"vec_dot": tr.vec_dot}
    generic = getattr(ggml_cpu, f"ggml_vec_dot_{ttype}_0_f32_generic", None)  # internal symbol, if visible
    if generic is not None:
        fns["generic"] = VEC_DOT(ctypes.cast(generic, ctypes.c_void_p).value)
    rng = np.random.default_rng(11 + BITS[ttype])
    for n in (64, 128, 256, 64 * 7):
        for _ in range(20):
            x = rng.standard_normal((1, n)).astype(np.float32) * np.float32(rng.uniform(0.1, 10))
            raw = np.ascontiguousarray(T.quantize(x, ttype)[0])
            y = rng.standard_normal(n).astype(np.float32)
            ref = float(np.dot(T.dequantize(raw, ttype).astype(np.float64), y.astype(np.float64)))
            scale = float(np.sum(np.abs(T.dequantize(raw, ttype).astype(np.float64) * y)))
            for name, fn in fns.items():
                got = _dot(fn, raw, y)
                assert abs(got - ref) <= 1e-5 * scale + 1e-30, (ttype, name, n, got, ref)


# ------------------------------------------------------------------------------------------------ CPU flash attention


def test_cpu_flash_attn_turbo_vs_dequantized(llama_bin):
    exe = llama_bin("test-turbo-fattn")
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=1800)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "FAIL" not in proc.stdout, out[-4000:]
    assert "PASS" in proc.stdout, out[-4000:]
