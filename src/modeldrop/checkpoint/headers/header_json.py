"""A safetensors header's JSON, read as serde_json reads it (the reference parser's): exact integers,
no duplicate keys, no NaN or Infinity, no lone surrogates, a nesting limit; a fast path when
msgspec can prove the text is plain. Also the header's limits and its error."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

MAX_HEADER_BYTES = 100_000_000  # the reference's own limit
# Stricter than the reference, to bound the validator's memory on any input (the reference itself
# needs ~770 MB for an 81 MB header of 880k tensors): no real shard comes near either number.
MAX_MODELDROP_HEADER_BYTES = 32 * 1024 * 1024
MAX_TENSORS_PER_SHARD = 100_000
# All of a checkpoint's headers together: DeepSeek-V3's 92k tensors take 13 MB of header text, a GPTQ
# 671B about 180k tensors and 25 MB. Past it nothing more is parsed: a checkpoint of 40 shards x 100k
# tensors is refused before the scan holds millions of tensors (the review saw 2 GB and 82 s).
MAX_TOTAL_HEADER_BYTES = 40 * 1024 * 1024
# A plain tensor entry is 12 JSON values and keys; the rest is room for metadata and extra fields.
MAX_HEADER_VALUES = 16 * MAX_TENSORS_PER_SHARD
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


_WHITESPACE = b" \t\n\r"


def _key_tokens(header_bytes: bytes) -> int:
    """An upper bound on the keys written in the header: every key is a string followed (after JSON
    whitespace) by a colon, and a `":` inside a string only raises the count."""
    return header_bytes.translate(None, _WHITESPACE).count(b'":')


def _parse_json(text: str, header_bytes: bytes) -> tuple[Any, int | None]:
    """The header as serde_json would read it, or HeaderError; with the count of written keys when
    the fast path read it.

    Fast path: a C parser (msgspec, else the standard library's) into plain dicts and ints. It
    cannot see duplicate keys, so the caller compares the keys it found with `_key_tokens` and, on
    a shortfall, reads the header again the exact way (every object's pairs checked, every integer
    kept with its text). A `-0` (which serde reads as a float) always takes the exact path.
    """
    if not ("-0" in text and _NEGATIVE_ZERO.search(text)):
        try:
            return _fast_loads(text, header_bytes), _key_tokens(header_bytes)
        except _Unsure:
            pass
    return _loads(text, exact=True), None


class _Unsure(Exception):
    """The fast parser cannot say: the exact path decides."""


def _fast_loads(text: str, header_bytes: bytes) -> Any:
    if _msgspec_decode is not None:
        try:
            return _msgspec_decode(header_bytes)
        except ValueError:
            pass  # msgspec refuses a few things serde reads (a lone surrogate escape): the stdlib judges
    try:
        return json.loads(text, parse_float=_parse_float, parse_constant=_refuse_constant)
    except RecursionError:
        raise HeaderError(f"header is not valid JSON: nested deeper than {MAX_JSON_DEPTH} levels") from None
    except HeaderError:
        raise
    except ValueError:
        raise _Unsure from None  # e.g. an integer too long for int()


def _msgspec() -> Callable[[bytes], Any] | None:
    try:
        from msgspec.json import Decoder
    except ImportError:  # pragma: no cover - a dependency; the standard library parses alone
        return None
    return Decoder().decode


# About twice as fast as the standard library's parser on big headers (benchmarked in make bench).
_msgspec_decode = _msgspec()


def _deep_keys(value: Any) -> int:
    if type(value) is dict:
        return len(value) + sum(_deep_keys(v) for v in value.values())
    if type(value) is list:
        return sum(_deep_keys(v) for v in value)
    return 0
