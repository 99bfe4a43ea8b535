"""Strict parsing of a safetensors header, as strict as the reference implementation.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the data section. Every
tensor's [begin, end) must be in bounds, non-overlapping, contiguous from 0 and together cover
the data section exactly; shape x dtype size must equal the byte span.
"""

from __future__ import annotations

import json
import re
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from math import prod
from operator import itemgetter
from typing import Any, NamedTuple

MAX_HEADER_BYTES = 100_000_000  # the reference's own limit
# Stricter than the reference, to bound the validator's memory on any input (the reference itself
# needs ~770 MB for an 81 MB header of 880k tensors): no real shard comes near either number.
MAX_MODELDROP_HEADER_BYTES = 32 * 1024 * 1024
MAX_TENSORS_PER_SHARD = 100_000
# serde_json's nesting limit: the 128th nested array/object is refused.
MAX_JSON_DEPTH = 127
_U64 = 2**64
_F64_MAX = int(sys.float_info.max)

# Bits per element, as the reference's Dtype::bitsize (sub-byte types pack into whole bytes per tensor).
DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
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
}


class HeaderError(ValueError):
    """A safetensors header that the engines' loaders would reject (or a documented stricter rule)."""

    def __init__(self, message: str, code: str = "HEADER_INVALID") -> None:
        super().__init__(message)
        self.code = code


class TensorInfo(NamedTuple):
    # A NamedTuple: built in C, a few hundred thousand of them cost little time and memory.
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
    if n > MAX_MODELDROP_HEADER_BYTES:
        raise HeaderError(
            f"header of {n} bytes is over modeldrop's {MAX_MODELDROP_HEADER_BYTES}-byte limit (real shards have "
            "headers of kilobytes)",
            code="HEADER_TOO_LARGE",
        )
    return n


class _Int(int):
    """A JSON integer with the text it was written as: serde reads `-0` and integers past u64 as floats."""

    raw: str


def _parse_int(text: str) -> int:
    digits = len(text) - text.startswith("-")
    if digits > 308 and (digits > 309 or abs(int(text)) > _F64_MAX):
        raise HeaderError("header is not valid JSON: a number is out of range")  # serde reads it as an infinite f64
    value = _Int(text if digits <= 25 else ("-" if text.startswith("-") else "") + str(_U64))
    value.raw = text
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise HeaderError("header is not valid JSON: a number is out of range")
    return value


def _refuse_constant(name: str) -> Any:
    raise HeaderError(f"header is not valid JSON: {name} is not a JSON value")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _v in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        # The reference keeps the last of two top-level keys; an ambiguous header is refused here.
        raise HeaderError(f"duplicate key {dup!r} in header", code="HEADER_DUPLICATE_KEY")
    return out


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def _depth(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


_NEGATIVE_ZERO = re.compile(r"(?<=[\[,:\s])-0(?![0-9])")


def _loads(text: str, exact: bool) -> Any:
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_int=_parse_int if exact else None,
            parse_float=_parse_float,
            parse_constant=_refuse_constant,
        )
    except RecursionError:
        raise HeaderError(f"header is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except HeaderError:
        raise
    except ValueError as exc:
        if exact:
            raise HeaderError(f"header is not valid JSON: {exc}") from None
        raise


_KEY_SPACE_COLON = re.compile(r'"\s+:')
_LONG_NUMBER = re.compile(r"[0-9]{309}")  # an integer past f64's range, which serde refuses


def _parse_json(text: str) -> Any:
    """The header as serde_json would read it, or HeaderError.

    Fast path: the C parser with plain dicts and ints, when no key can hide a duplicate (no
    backslash in the text, no space before a colon, and as many `":` as keys parsed) and no
    `-0` can be present. Otherwise the exact path: every object's pairs checked for duplicates
    and every integer kept with its text.
    """
    plain = "\\" not in text and not _KEY_SPACE_COLON.search(text)
    if plain and not ("-0" in text and _NEGATIVE_ZERO.search(text)) and not _LONG_NUMBER.search(text):
        try:
            raw = json.loads(text, parse_float=_parse_float, parse_constant=_refuse_constant)
        except RecursionError:
            raise HeaderError(f"header is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
        except HeaderError:
            raise
        except ValueError:
            pass  # e.g. an integer too long for int(): the exact path reads it
        else:
            if _key_count(raw) == text.count('":'):
                return raw
    return _loads(text, exact=True)


def _key_count(raw: Any) -> int:
    """Keys in the top-level object and its objects (deeper only under extra fields): an undercount
    only sends the header to the exact path, so it is safe."""
    if type(raw) is not dict:
        return -1
    count = len(raw)
    for value in raw.values():
        if type(value) is dict:
            count += len(value)
            if len(value) != 3:
                count += sum(_deep_keys(v) for v in value.values())
    return count


def _deep_keys(value: Any) -> int:
    if type(value) is dict:
        return len(value) + sum(_deep_keys(v) for v in value.values())
    if type(value) is list:
        return sum(_deep_keys(v) for v in value)
    return 0


def parse_header(header_bytes: bytes, file_size: int) -> SafetensorsHeader:
    """Parse and check a header; ``file_size`` is the whole file's size in bytes.

    Accepts exactly what the reference (`safetensors`, serde_json) accepts, except two documented
    stricter rules: duplicate keys (HEADER_DUPLICATE_KEY) and headers over modeldrop's size or
    tensor-count limits (HEADER_TOO_LARGE). Raises only HeaderError.
    """
    header_len = len(header_bytes)
    data_len = file_size - 8 - header_len
    if data_len < 0:
        raise HeaderError("header runs past the end of the file")
    if header_len > MAX_MODELDROP_HEADER_BYTES:
        raise HeaderError(f"header of {header_len} bytes is over modeldrop's limit", code="HEADER_TOO_LARGE")
    try:
        text = header_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header is not UTF-8: {exc.reason}") from None
    entries = text.count('"data_offsets"')
    if entries > MAX_TENSORS_PER_SHARD:
        raise HeaderError(
            f"header has {entries} tensor entries, over modeldrop's {MAX_TENSORS_PER_SHARD} per shard",
            code="HEADER_TOO_LARGE",
        )
    raw = _parse_json(text)
    del text
    if not isinstance(raw, dict):
        raise HeaderError("header is not a JSON object")
    if (
        (b"\\ud" in header_bytes or b"\\uD" in header_bytes)
        and _SURROGATE_ESCAPE.search(header_bytes)
        and any(_LONE_SURROGATE.search(s) for s in _strings(raw))
    ):
        raise HeaderError("header is not valid JSON: a string holds an unpaired surrogate escape")

    metadata: dict[str, str] = {}
    tensors: dict[str, TensorInfo] = {}
    get_bits = DTYPE_BITS.get
    for name, entry in raw.items():
        # The plain entry, checked inline (most of the time goes here on big headers); anything
        # else goes through _tensor, which names exactly what is wrong.
        if type(entry) is dict and len(entry) == 3 and name != "__metadata__":
            dtype = entry.get("dtype")
            shape = entry.get("shape")
            offsets = entry.get("data_offsets")
            bits_per = get_bits(dtype) if type(dtype) is str else None
            if bits_per and type(shape) is list and type(offsets) is list and len(offsets) == 2:
                begin, end = offsets
                if (
                    type(begin) is int
                    and type(end) is int
                    and 0 <= begin <= end < _U64
                    and (not shape or (set(map(type, shape)) == _INT_ONLY and min(shape) > 0 and max(shape) < _U64))
                ):
                    numel = prod(shape)
                    if numel < _U64 and numel * bits_per == (end - begin) * 8:
                        tensors[name] = TensorInfo(name, str(dtype), tuple(shape), begin, end)
                        continue
        if name == "__metadata__":
            if entry is None:
                continue
            if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
                raise HeaderError("__metadata__ must map strings to strings")
            metadata = dict(entry)
            continue
        tensors[name] = _tensor(name, entry)

    spans = sorted(tensors.values(), key=itemgetter(3, 4))  # (begin, end)
    cursor = 0
    for t in spans:
        if t.begin != cursor:
            kind = "overlaps the previous tensor" if t.begin < cursor else "leaves a gap"
            raise HeaderError(f"tensor {t.name!r} at offset {t.begin} {kind} (expected {cursor})")
        cursor = t.end
    if cursor != data_len:
        raise HeaderError(f"tensors cover {cursor} bytes but the data section is {data_len} bytes")
    return SafetensorsHeader(tensors, metadata, header_len, data_len)


def _usize(value: Any) -> bool:
    """What serde reads as a usize: a JSON integer written without a minus sign, below 2^64."""
    kind = type(value)
    if kind is int:
        return 0 <= value < _U64
    return kind is _Int and not value.raw.startswith("-") and value < _U64


_FIELDS = frozenset(("dtype", "shape", "data_offsets"))
_INT_ONLY = {int}


def _all_usize(values: list[Any]) -> bool:
    if set(map(type, values)) == _INT_ONLY:  # the common case, checked in C
        return min(values) >= 0 and max(values) < _U64
    return all(_usize(v) for v in values)


def _tensor(name: str, entry: Any) -> TensorInfo:
    if type(entry) is not dict:
        raise HeaderError(f"tensor {name!r}: entry is not an object")
    try:
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    except KeyError:
        raise HeaderError(f"tensor {name!r}: missing {sorted(_FIELDS - set(entry))}") from None
    if len(entry) > 3:  # extra fields are ignored by the reference, but parsed: serde's nesting limit holds
        for key, value in entry.items():
            if key not in _FIELDS and 2 + _depth(value) > MAX_JSON_DEPTH:
                raise HeaderError(f"header is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
    bits_per = DTYPE_BITS.get(dtype) if type(dtype) is str else None
    if bits_per is None:
        raise HeaderError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if type(shape) is not list or (shape and not _all_usize(shape)):
        raise HeaderError(f"tensor {name!r}: shape must be a list of integers from 0 to 2^64-1")
    if type(offsets) is not list or len(offsets) != 2 or not _all_usize(offsets):
        raise HeaderError(f"tensor {name!r}: data_offsets must be two integers from 0 to 2^64-1")
    begin, end = int(offsets[0]), int(offsets[1])
    if end < begin:
        raise HeaderError(f"tensor {name!r}: data_offsets end {end} is before begin {begin}")
    numel = prod(shape)
    if numel == 0 and len(shape) > 1:
        # The reference multiplies left to right with overflow checks: [2^32, 2^32, 0] overflows.
        running = 1
        for dim in shape:
            running *= dim
            if running >= _U64:
                break
        numel = running if running >= _U64 else 0
    if numel >= _U64:
        raise HeaderError(f"tensor {name!r}: the element count of shape {shape} overflows 64 bits")
    bits = numel * bits_per
    if bits >= _U64:
        raise HeaderError(f"tensor {name!r}: the size of {dtype} x {shape} overflows 64 bits")
    if bits % 8:
        raise HeaderError(f"tensor {name!r}: {dtype} x {shape} is not a whole number of bytes")
    if bits // 8 != end - begin:
        raise HeaderError(f"tensor {name!r}: {dtype} x {shape} needs {bits // 8} bytes but spans {end - begin}")
    return TensorInfo(
        name, dtype, tuple(map(int, shape)) if type(shape[0] if shape else 0) is _Int else tuple(shape), begin, end
    )
