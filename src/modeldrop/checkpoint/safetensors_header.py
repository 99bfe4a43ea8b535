"""Strict parsing of a safetensors header, as strict as the reference implementation.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the data section. Every
tensor's [begin, end) must be in bounds, non-overlapping, contiguous from 0 and together cover
the data section exactly; shape x dtype size must equal the byte span.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from math import prod
from typing import Any

MAX_HEADER_BYTES = 100_000_000

# Bits per element; sub-byte types (F4, F6) pack into whole bytes per tensor.
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


class HeaderError(ValueError):
    """A safetensors header that the engines' loaders would reject."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    header_len: int
    data_len: int

    @property
    def file_size(self) -> int:
        return 8 + self.header_len + self.data_len


def read_header_length(prefix: bytes, file_size: int) -> int:
    if file_size < 8 or len(prefix) < 8:
        raise HeaderError(f"file is {file_size} bytes: too short to hold the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_BYTES:
        raise HeaderError(f"header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit")
    if 8 + n > file_size:
        raise HeaderError(f"header length {n} runs past the end of the {file_size}-byte file")
    return n


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise HeaderError(f"duplicate key {key!r} in header")
        out[key] = value
    return out


def parse_header(header_bytes: bytes, file_size: int) -> SafetensorsHeader:
    """Parse and check a header; ``file_size`` is the whole file's size in bytes."""
    header_len = len(header_bytes)
    data_len = file_size - 8 - header_len
    if data_len < 0:
        raise HeaderError("header runs past the end of the file")
    try:
        text = header_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header is not UTF-8: {exc.reason}") from None
    if not text.startswith("{"):
        raise HeaderError("header is not a JSON object")
    try:
        raw = json.loads(text.rstrip(" "), object_pairs_hook=_no_duplicates)
    except HeaderError:
        raise
    except (json.JSONDecodeError, RecursionError) as exc:
        raise HeaderError(f"header is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise HeaderError("header is not a JSON object")

    metadata: dict[str, str] = {}
    tensors: dict[str, TensorInfo] = {}
    for name, entry in raw.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise HeaderError("__metadata__ must map strings to strings")
            metadata = dict(entry)
            continue
        tensors[name] = _tensor(name, entry)

    spans = sorted(tensors.values(), key=lambda t: (t.begin, t.end))
    cursor = 0
    for t in spans:
        if t.begin != cursor:
            kind = "overlaps the previous tensor" if t.begin < cursor else "leaves a gap"
            raise HeaderError(f"tensor {t.name!r} at offset {t.begin} {kind} (expected {cursor})")
        cursor = t.end
    if cursor != data_len:
        raise HeaderError(f"tensors cover {cursor} bytes but the data section is {data_len} bytes")
    return SafetensorsHeader(tensors, metadata, header_len, data_len)


def _tensor(name: str, entry: Any) -> TensorInfo:
    if not isinstance(entry, dict):
        raise HeaderError(f"tensor {name!r}: entry is not an object")
    extra = set(entry) - {"dtype", "shape", "data_offsets"}
    missing = {"dtype", "shape", "data_offsets"} - set(entry)
    if missing or extra:
        raise HeaderError(f"tensor {name!r}: bad fields (missing {sorted(missing)}, extra {sorted(extra)})")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPE_BITS:
        raise HeaderError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise HeaderError(f"tensor {name!r}: shape must be a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
    ):
        raise HeaderError(f"tensor {name!r}: data_offsets must be two non-negative integers")
    begin, end = offsets
    if end < begin:
        raise HeaderError(f"tensor {name!r}: data_offsets end {end} is before begin {begin}")
    bits = prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise HeaderError(f"tensor {name!r}: {dtype} x {shape} is not a whole number of bytes")
    if bits // 8 != end - begin:
        raise HeaderError(f"tensor {name!r}: {dtype} x {shape} needs {bits // 8} bytes but spans {end - begin}")
    return TensorInfo(name, dtype, tuple(shape), begin, end)
