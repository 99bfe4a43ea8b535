"""Strict parsing of a safetensors header, as strict as the reference implementation.

Layout: 8-byte little-endian header length N, N bytes of JSON, then the data section. Every
tensor's [begin, end) must be in bounds, non-overlapping, contiguous from 0 and together cover
the data section exactly; shape x dtype size must equal the byte span.
"""

from __future__ import annotations

import gc
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from itertools import chain, repeat
from math import prod
from operator import itemgetter, mul, sub
from typing import Any, NamedTuple, TypeVar

from modeldrop.checkpoint.headers.header_json import (  # re-exported: the header's limits and its error
    _F64_MAX,
    _LONE_SURROGATE,
    _SURROGATE_ESCAPE,
    _U64,
    DTYPE_BITS,
    MAX_HEADER_BYTES,
    MAX_HEADER_VALUES,
    MAX_JSON_DEPTH,
    MAX_MODELDROP_HEADER_BYTES,
    MAX_TENSORS_PER_SHARD,
    HeaderError,
    _deep_keys,
    _depth,
    _Int,
    _loads,
    _parse_json,
    _strings,
)


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


_V = TypeVar("_V")


class TensorView(Mapping[str, _V]):
    """PICK(tensor) for each tensor, read through the shards' own headers: WHERE maps a tensor to its
    shard. A view, not a table: a copy costs about 120 bytes a tensor (18 MB at 150,000)."""

    def __init__(
        self, headers: Mapping[str, SafetensorsHeader], where: Mapping[str, str], pick: Callable[[TensorInfo], _V]
    ) -> None:
        self._headers, self._where, self._pick = headers, where, pick

    def __getitem__(self, name: str) -> _V:
        return self._pick(self._headers[self._where[name]].tensors[name])

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


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


def _decode(header_bytes: bytes) -> str:
    try:
        return header_bytes.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header is not UTF-8: {exc.reason}") from None


def _check_size(header_len: int, data_len: int, header_bytes: bytes) -> None:
    if data_len < 0:
        raise HeaderError("header runs past the end of the file")
    if header_len > MAX_MODELDROP_HEADER_BYTES:
        raise HeaderError(f"header of {header_len} bytes is over modeldrop's limit", code="HEADER_TOO_LARGE")
    # Counted in C before any parse: the JSON values (and keys) the text can hold are at most its
    # `[`, `{`, `,` and `:` bytes, so no header makes the parse build more objects than this bound.
    values = header_bytes.count(b"[") + header_bytes.count(b"{") + header_bytes.count(b",") + header_bytes.count(b":")
    if values > MAX_HEADER_VALUES:
        raise HeaderError(
            f"header may hold {values:,} JSON values, over modeldrop's {MAX_HEADER_VALUES:,} (about "
            f"{MAX_TENSORS_PER_SHARD:,} tensors)",
            code="HEADER_TOO_LARGE",
        )


def _check_count(tensors: int) -> None:
    if tensors > MAX_TENSORS_PER_SHARD:
        raise HeaderError(
            f"header has {tensors} tensor entries, over modeldrop's {MAX_TENSORS_PER_SHARD} per shard",
            code="HEADER_TOO_LARGE",
        )


def _refuse_lone_surrogates(raw: dict[str, Any], header_bytes: bytes) -> None:
    if (
        b"\\u" in header_bytes
        and _SURROGATE_ESCAPE.search(header_bytes)
        and any(_LONE_SURROGATE.search(s) for s in _strings(raw))
    ):
        raise HeaderError("header is not valid JSON: a string holds an unpaired surrogate escape")


def parse_header(header_bytes: bytes, file_size: int) -> SafetensorsHeader:
    """Parse and check a header; ``file_size`` is the whole file's size in bytes.

    Accepts exactly what the reference (`safetensors`, serde_json) accepts, except two documented
    stricter rules: duplicate keys (HEADER_DUPLICATE_KEY) and headers over modeldrop's size or
    tensor-count limits (HEADER_TOO_LARGE). Raises only HeaderError.
    """
    # The parse builds hundreds of thousands of acyclic containers; the cycle collector would walk
    # them again and again as they are made (measured: a third of the time on a 9 MB header).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _parse_header(header_bytes, file_size)
    finally:
        if collecting:
            gc.enable()


def _parse_header(header_bytes: bytes, file_size: int) -> SafetensorsHeader:
    header_len = len(header_bytes)
    data_len = file_size - 8 - header_len
    _check_size(header_len, data_len, header_bytes)
    raw, key_tokens = _parse_json(_decode(header_bytes), header_bytes)
    if not isinstance(raw, dict):
        raise HeaderError("header is not a JSON object")
    _check_count(len(raw) - ("__metadata__" in raw))
    metadata, tensors, keys = _entries(raw)
    if key_tokens is not None and keys != key_tokens:
        # Fewer keys than were written: one may be a duplicate (or merely spelled with an escape).
        raw = _loads(_decode(header_bytes), exact=True)
        metadata, tensors, keys = _entries(raw)
    _refuse_lone_surrogates(raw, header_bytes)
    _check_coverage(tensors, data_len)
    return SafetensorsHeader(tensors, metadata, header_len, data_len)


def _entries(raw: dict[str, Any]) -> tuple[dict[str, str], dict[str, TensorInfo], int]:
    """The metadata, the tensors, and how many keys the objects held (for the duplicate check)."""
    entries = dict(raw)
    metadata = _metadata(entries.pop("__metadata__", None))
    keys = len(raw) + len(metadata)
    tensors = _plain_tensors(entries)
    if tensors is not None:
        return metadata, tensors, keys + 3 * len(tensors)
    # Some entry is not plain: each is checked on its own, by the checks that name what is wrong.
    tensors = {name: _tensor(name, entry) for name, entry in entries.items()}
    return metadata, tensors, keys + sum(_deep_keys(entry) for entry in entries.values())


_DTYPE, _SHAPE, _OFFSETS = itemgetter("dtype"), itemgetter("shape"), itemgetter("data_offsets")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def _usizes(values: list[Any]) -> bool:
    """All plain ints in [0, 2^64) (an empty list too), checked in C."""
    return not values or (set(map(type, values)) == _INT_ONLY and min(values) >= 0 and max(values) < _U64)


def _plain_tensors(entries: dict[str, Any]) -> dict[str, TensorInfo] | None:
    """Every entry checked at once in C (map, set, min, max), as most of the time on big headers
    goes here; None when any entry is not the plain kind (three fields, a known dtype, int dims,
    two int offsets spanning exactly its bytes), so the per-entry checks say which and why."""
    values = entries.values()
    try:
        if not values or set(map(type, values)) != _DICT_ONLY or set(map(len, values)) != _THREE:
            return None if values else {}
        dtypes, shapes, offsets = list(map(_DTYPE, values)), list(map(_SHAPE, values)), list(map(_OFFSETS, values))
        bits = list(map(DTYPE_BITS.__getitem__, dtypes))
        if (
            set(map(type, shapes)) != _LIST_ONLY
            or set(map(type, offsets)) != _LIST_ONLY
            or set(map(len, offsets)) != _TWO
        ):
            return None
        begins, ends = list(map(_FIRST, offsets)), list(map(_SECOND, offsets))
        if not (_usizes(list(chain.from_iterable(shapes))) and _usizes(begins) and _usizes(ends)):
            return None
        numels = list(map(prod, shapes))
        if 0 in numels and any(_element_count(s) >= _U64 for s in shapes if len(s) > 1 and 0 in s):
            return None
        sizes = list(map(mul, numels, bits))
        if max(sizes) >= _U64 or sizes != list(map(mul, map(sub, ends, begins), repeat(8))):
            return None
    except (KeyError, TypeError, ValueError):
        return None
    # One tuple per distinct shape and one string per dtype: a checkpoint's tensors share a few dozen
    # shapes (every expert's alike), and a shape tuple with its dims is most of a TensorInfo's memory.
    shared: dict[tuple[int, ...], tuple[int, ...]] = {}
    tuples = [shared.setdefault(t, t) for t in map(tuple, shapes)]
    rows = zip(entries, map(_DTYPES.__getitem__, dtypes), tuples, begins, ends, strict=True)
    return dict(zip(entries, map(_NEW_TENSOR, repeat(TensorInfo), rows), strict=True))


def _metadata(entry: Any) -> dict[str, str]:
    if entry is None:
        return {}
    if not isinstance(entry, dict) or not all(isinstance(v, str) for v in entry.values()):
        raise HeaderError("__metadata__ must map strings to strings")
    return dict(entry)


def _check_coverage(tensors: dict[str, TensorInfo], data_len: int) -> None:
    """Contiguous from 0, no overlap, ending at the data's end - in the reference's (begin, end) order.

    Sorting by begin alone (no key tuples) is tried first: when that order tiles the data, so does
    (begin, end), as ties can only be empty tensors ahead of one that is not."""
    if _tiles(sorted(tensors.values(), key=_BEGIN), data_len):
        return
    cursor = 0
    for t in sorted(tensors.values(), key=_BEGIN_END):
        if t.begin != cursor:
            kind = "overlaps the previous tensor" if t.begin < cursor else "leaves a gap"
            raise HeaderError(f"tensor {t.name!r} at offset {t.begin} {kind} (expected {cursor})")
        cursor = t.end
    if cursor != data_len:
        raise HeaderError(f"tensors cover {cursor} bytes but the data section is {data_len} bytes")


_BEGIN, _BEGIN_END = itemgetter(3), itemgetter(3, 4)


def _tiles(spans: list[TensorInfo], data_len: int) -> bool:
    begins = list(map(_BEGIN, spans))
    ends = list(map(itemgetter(4), spans))
    return begins[:1] in ([], [0]) and begins[1:] == ends[:-1] and (ends[-1] if ends else 0) == data_len


_NEW_TENSOR = tuple.__new__
_DTYPES = {dtype: dtype for dtype in DTYPE_BITS}  # the module's own copy of each dtype name
_INT_ONLY = {int}
_DICT_ONLY = {dict}
_LIST_ONLY = {list}
_TWO = {2}
_THREE = {3}


def _usize(value: Any) -> bool:
    """What serde reads as a usize: a JSON integer written without a minus sign, below 2^64."""
    kind = type(value)
    if kind is int:
        return 0 <= value < _U64
    return kind is _Int and not value.raw.startswith("-") and value < _U64


_FIELDS = frozenset(("dtype", "shape", "data_offsets"))


def _all_usize(values: list[Any]) -> bool:
    if set(map(type, values)) == _INT_ONLY:  # the common case, checked in C
        return min(values) >= 0 and max(values) < _U64
    return all(_usize(v) for v in values)


def _huge_number(value: Any) -> bool:
    """An integer past f64's range anywhere in the value: serde refuses the whole header."""
    if type(value) is int:
        return abs(value) > _F64_MAX
    if type(value) is float:
        return value != value or value in (float("inf"), float("-inf"))
    if type(value) is dict:
        return any(_huge_number(v) for v in value.values())
    if type(value) is list:
        return any(_huge_number(v) for v in value)
    return False


def _check_extra_fields(entry: dict[str, Any]) -> None:
    """Extra fields are ignored by the reference, but parsed: serde's number range and nesting limit hold."""
    for key, value in entry.items():
        if key in _FIELDS:
            continue
        if 2 + _depth(value) > MAX_JSON_DEPTH:
            raise HeaderError(f"header is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels")
        if _huge_number(value):
            raise HeaderError("header is not valid JSON: a number is out of range")


def _element_count(shape: list[int]) -> int:
    """The reference multiplies left to right with overflow checks: [2^32, 2^32, 0] overflows."""
    numel = prod(shape)
    if numel == 0 and len(shape) > 1:
        running = 1
        for dim in shape:
            running *= dim
            if running >= _U64:
                return running
    return numel


def _tensor(name: str, entry: Any) -> TensorInfo:
    if type(entry) is not dict:
        raise HeaderError(f"tensor {name!r}: entry is not an object")
    try:
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    except KeyError:
        raise HeaderError(f"tensor {name!r}: missing {sorted(_FIELDS - set(entry))}") from None
    if len(entry) > 3:
        _check_extra_fields(entry)
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
    numel = _element_count(shape)
    if numel >= _U64:
        raise HeaderError(f"tensor {name!r}: the element count of shape {shape} overflows 64 bits")
    bits = numel * bits_per
    if bits >= _U64:
        raise HeaderError(f"tensor {name!r}: the size of {dtype} x {shape} overflows 64 bits")
    if bits % 8:
        raise HeaderError(f"tensor {name!r}: {dtype} x {shape} is not a whole number of bytes")
    if bits // 8 != end - begin:
        raise HeaderError(f"tensor {name!r}: {dtype} x {shape} needs {bits // 8} bytes but spans {end - begin}")
    return TensorInfo(name, dtype, tuple(map(int, shape)), begin, end)
