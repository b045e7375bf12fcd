"""A strict, bounds-checked GGUF reader (header, metadata, tensor infos) for `tqgguf check`.

It checks what llama.cpp's gguf.cpp and model loader check before they trust a file: magic and version, counts,
string lengths, value types, duplicate keys and tensor names, tensor dims and types (against the pinned ggml type
table, turbo types included), the alignment, and that each tensor's data starts where the previous one ended (padded
to the alignment) and lies inside the file. Every problem is one GgufError with a one-line message. The file is
memory-mapped; tensor data is never read.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import ggml_types

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_NAME = 64          # GGML_MAX_NAME
MAX_DIMS = 4
SMALL_ARRAY = 4096     # arrays up to this many elements are kept; longer ones only counted

# GGUF metadata value types: id -> (name, struct format or None)
VALUE_TYPES = {
    0: ("u8", "<B"), 1: ("i8", "<b"), 2: ("u16", "<H"), 3: ("i16", "<h"), 4: ("u32", "<I"), 5: ("i32", "<i"),
    6: ("f32", "<f"), 7: ("bool", "<?"), 8: ("string", None), 9: ("array", None), 10: ("u64", "<Q"),
    11: ("i64", "<q"), 12: ("f64", "<d"),
}


class GgufError(Exception):
    """The file is not a usable GGUF; the message says where and why, in one line."""


@dataclass
class LongArray:
    """A metadata array too long to keep (a tokenizer's token list): its element type and length."""

    elem_type: str
    count: int


@dataclass
class TensorInfo:
    name: str
    ne: tuple[int, ...]     # ggml order: ne[0] is the row length
    type_id: int
    offset: int             # relative to the data section

    @property
    def type(self) -> ggml_types.GgmlType:
        return ggml_types.BY_ID[self.type_id]

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.ne:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        t = self.type
        return self.n_elements // t.block * t.size


@dataclass
class GgufFile:
    path: Path
    version: int
    file_size: int
    alignment: int
    data_offset: int
    kv: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


class _Cursor:
    def __init__(self, buf, size: int):
        self.buf = buf
        self.size = size
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise GgufError(f"truncated: the file ends at byte {self.size} while reading {what} at byte {self.pos}")

    def unpack(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v[0] if len(v) == 1 else v

    def string(self, what: str, limit: int | None = None) -> str:
        start = self.pos
        n = self.unpack("<Q", f"the length of {what}")
        if limit is not None and n > limit:
            raise GgufError(f"corrupted: {what} at byte {start} claims {n} bytes (at most {limit} allowed)")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GgufError(f"corrupted: {what} at byte {start} is not valid UTF-8") from None

    def skip_string(self, what: str) -> None:
        n = self.unpack("<Q", f"the length of {what}")
        self.need(n, what)
        self.pos += n


def _value(cur: _Cursor, vtype: int, key: str) -> Any:
    if vtype not in VALUE_TYPES:
        raise GgufError(f"corrupted: key {key!r} has unknown value type {vtype} (at byte {cur.pos - 4})")
    name, fmt = VALUE_TYPES[vtype]
    if fmt:
        return cur.unpack(fmt, f"the value of {key!r}")
    if name == "string":
        return cur.string(f"the value of {key!r}")
    etype, count = cur.unpack("<IQ", f"the array header of {key!r}")
    if etype not in VALUE_TYPES or etype == 9:
        raise GgufError(f"corrupted: array {key!r} has invalid element type {etype}")
    ename, efmt = VALUE_TYPES[etype]
    if efmt:
        size = struct.calcsize(efmt)
        cur.need(count * size, f"the {count} elements of {key!r}")
        if count > SMALL_ARRAY:
            cur.pos += count * size
            return LongArray(ename, count)
        vals = list(struct.unpack_from(f"<{count}{efmt[1]}", cur.buf, cur.pos))
        cur.pos += count * size
        return vals
    # array of strings: at least 8 bytes each
    cur.need(count * 8, f"the {count} strings of {key!r}")
    if count > SMALL_ARRAY:
        for i in range(count):
            cur.skip_string(f"string {i} of {key!r}")
        return LongArray(ename, count)
    return [cur.string(f"string {i} of {key!r}") for i in range(count)]


def _header(cur: _Cursor) -> tuple[int, int, int]:
    magic = bytes(cur.buf[:4]) if cur.size >= 4 else bytes(cur.buf[:cur.size])
    if magic != GGUF_MAGIC:
        raise GgufError(f"not a GGUF file: it starts with {magic!r}, not b'GGUF'")
    cur.pos = 4
    version = cur.unpack("<I", "the version")
    if version & 0xFFFFFF == 0 and version >> 24 in (1, 2, 3):
        raise GgufError(f"big-endian GGUF (version {version >> 24}) is not supported by llama.cpp on this machine")
    if version == 1:
        raise GgufError("GGUF version 1 is no longer supported by llama.cpp")
    if version not in (2, 3):
        raise GgufError(f"unsupported GGUF version {version} (llama.cpp reads versions 2 and 3)")
    n_tensors, n_kv = cur.unpack("<QQ", "the tensor and metadata counts")
    # every metadata pair takes at least 12 bytes, every tensor info at least 24
    if n_kv * 12 > cur.size or n_tensors * 24 > cur.size:
        raise GgufError(f"corrupted: the header claims {n_tensors} tensors and {n_kv} metadata pairs, "
                        f"more than a {cur.size}-byte file can hold")
    return version, n_tensors, n_kv


def _tensor_info(cur: _Cursor, i: int, names: set[str]) -> TensorInfo:
    name = cur.string(f"the name of tensor {i}", limit=1 << 16)
    if len(name.encode()) >= MAX_NAME:
        raise GgufError(f"corrupted: tensor {i} has a {len(name)}-character name (llama.cpp allows {MAX_NAME - 1})")
    if name in names:
        raise GgufError(f"corrupted: duplicate tensor name {name!r}")
    names.add(name)
    n_dims = cur.unpack("<I", f"the dims of {name!r}")
    if n_dims > MAX_DIMS:
        raise GgufError(f"corrupted: tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
    ne = tuple(cur.unpack("<q", f"the shape of {name!r}") for _ in range(n_dims))
    if any(d < 0 for d in ne):
        raise GgufError(f"corrupted: tensor {name!r} has a negative dimension {ne}")
    type_pos = cur.pos
    type_id = cur.unpack("<I", f"the type of {name!r}")
    offset = cur.unpack("<Q", f"the data offset of {name!r}")
    if type_id in ggml_types.REMOVED:
        raise GgufError(f"tensor {name!r} uses type {ggml_types.REMOVED[type_id]} (id {type_id}), which llama.cpp "
                        "no longer supports")
    if type_id not in ggml_types.BY_ID:
        raise GgufError(f"corrupted: tensor {name!r} has unknown type id {type_id} (at byte {type_pos})")
    t = TensorInfo(name, ne, type_id, offset)
    if ne and ne[0] % t.type.block:
        raise GgufError(f"corrupted: tensor {name!r} of type {t.type.name} has rows of {ne[0]} values, "
                        f"not a multiple of its block size {t.type.block}")
    return t


def read_gguf(path: Path) -> GgufFile:
    """Parse and validate the file's structure. Raises GgufError (or OSError for an unreadable path)."""
    path = Path(path)
    if not path.is_file():
        raise GgufError("not a regular file" if path.exists() else "no such file")
    size = path.stat().st_size
    if size < 4:
        raise GgufError(f"not a GGUF file: only {size} bytes")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, size)
        version, n_tensors, n_kv = _header(cur)
        kv: dict[str, Any] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key {i}", limit=1 << 16)
            if not key:
                raise GgufError(f"corrupted: metadata key {i} is empty")
            if key in kv:
                raise GgufError(f"corrupted: duplicate metadata key {key!r}")
            vtype = cur.unpack("<I", f"the type of {key!r}")
            kv[key] = _value(cur, vtype, key)
        alignment = kv.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise GgufError(f"corrupted: general.alignment {alignment!r} is not a power of 2")
        names: set[str] = set()
        tensors = [_tensor_info(cur, i, names) for i in range(n_tensors)]
        data_offset = -(-cur.pos // alignment) * alignment
    expected = 0
    for t in tensors:
        if t.offset % alignment:
            raise GgufError(f"corrupted: tensor {t.name!r} data offset {t.offset} is not aligned to {alignment} bytes")
        end = data_offset + t.offset + t.nbytes
        if end > size:
            what = "truncated" if t.offset == expected else "corrupted"
            raise GgufError(f"{what}: tensor {t.name!r} ({t.type.name}, {t.nbytes} bytes) ends at byte {end}, "
                            f"past the end of the {size}-byte file")
        if t.offset != expected:
            raise GgufError(f"corrupted: tensor {t.name!r} data starts at offset {t.offset}, expected {expected} "
                            "(overlapping or out-of-order tensor data)")
        expected = t.offset + -(-t.nbytes // alignment) * alignment
    return GgufFile(path, version, size, alignment, data_offset, kv, tensors)
