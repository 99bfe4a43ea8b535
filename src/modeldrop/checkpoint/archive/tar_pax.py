"""PAX extended headers as GNU tar's decode_record reads them: lengths, whitespace, the caps on
their size and count, and each value's own syntax."""

from __future__ import annotations

import re
from collections.abc import Callable

from modeldrop.checkpoint.archive.archive_rules import archive_refused
from modeldrop.contracts.text import printable

MAX_PAX_RECORDS = 256  # bsdtar's richest headers (times, ids, xattrs) hold a few dozen
_PAX_RECORD = re.compile(rb"(?P<lead>[ \t]*)(?P<length>[0-9]{1,20})(?P<gap>[ \t]*)")
_PAX_TIME = re.compile(rb"(-?[0-9]{1,19})(\.[0-9]*)?")
_DECIMAL = re.compile(rb"[0-9]{1,20}")


def show(raw: bytes) -> str:
    return printable(raw.decode("utf-8", "surrogateescape"))


def parse_pax(data: bytes, at: int) -> dict[bytes, bytes]:
    """The records of one PAX header, read as GNU tar 1.34's decode_record reads them (xheader.c):
    `<length><blanks><keyword>=<value>\n`, records ending at a NUL or at the end. Where GNU tar and
    tarfile would read a record differently (blanks or tabs around the length, which GNU skips and
    tarfile makes part of the keyword or refuses; a NUL in a keyword), it is refused with its own
    code; what GNU tar reports as an error (a value out of range) is refused as malformed."""
    records: dict[bytes, bytes] = {}
    pos = count = 0
    while pos < len(data) and data[pos] != 0:  # both readers stop quietly at a NUL where a record starts
        count += 1
        if count > MAX_PAX_RECORDS:
            raise archive_refused("TAR_LONG_RECORD", f"the PAX header at byte {at} has over {MAX_PAX_RECORDS} records")
        match = _PAX_RECORD.match(data, pos)
        if match is None:
            raise archive_refused("TAR_PAX_INVALID", f"the PAX header at byte {at} has a malformed record")
        if not match["gap"]:
            raise archive_refused(
                "TAR_PAX_INVALID", f"the PAX header at byte {at} has a record with no blank after its length"
            )
        if match["lead"] or match["gap"] != b" ":
            raise archive_refused(
                "TAR_PAX_WHITESPACE",
                f"a PAX record at byte {at} has blanks or tabs around its length (GNU tar skips them; tarfile reads "
                "them into the keyword): the readers name different fields",
            )
        length = int(match["length"])
        end = pos + length
        eq = data.find(b"=", match.end(), end)
        if length < 5 or end > len(data) or eq < 0 or data[end - 1] != 0x0A:
            raise archive_refused("TAR_PAX_INVALID", f"the PAX header at byte {at} has a malformed record")
        key, value = data[match.end() : eq], data[eq + 1 : end - 1]
        if not key or b"\x00" in key:
            raise archive_refused("TAR_PAX_INVALID", f"the PAX header at byte {at} has a record with no usable key")
        _check_pax_value(key, value, records, at)
        records[key] = value
        pos = end
    return records


def _check_pax_value(key: bytes, value: bytes, records: dict[bytes, bytes], at: int) -> None:
    if key in records and key in (b"path", b"size", b"linkpath"):
        raise archive_refused("TAR_NAME_CONFLICT", f"the PAX header at byte {at} sets {show(key)} twice")
    if key.startswith(b"GNU.sparse."):
        raise archive_refused("TAR_SPARSE", f"the PAX header at byte {at} describes a sparse file")
    if key in (b"path", b"linkpath") and b"\x00" in value:
        raise archive_refused("TAR_NAME_NUL", f"the PAX {show(key)} {show(value[:200])} at byte {at} holds a NUL byte")
    checker = _PAX_NUMBERS.get(key)
    if checker is not None and not checker(value):
        raise archive_refused(
            "TAR_PAX_INVALID", f"the PAX {show(key)} {show(value[:40])} at byte {at} is not one GNU tar accepts"
        )


def _pax_time(value: bytes) -> bool:
    """GNU tar's _decode_time: an optional '-', digits, an optional fraction; within a 64-bit time_t."""
    match = _PAX_TIME.fullmatch(value)
    return match is not None and -(2**63) <= int(match[1]) < 2**63


def _pax_unsigned(bound: int) -> Callable[[bytes], bool]:
    return lambda value: _DECIMAL.fullmatch(value) is not None and int(value) <= bound


# What GNU tar's decoders accept for the numeric keys; past this it reports an error and exits 2.
_PAX_NUMBERS: dict[bytes, Callable[[bytes], bool]] = {
    b"size": _pax_unsigned(2**63 - 1),
    b"uid": _pax_unsigned(2**32 - 1),
    b"gid": _pax_unsigned(2**32 - 1),
    b"mtime": _pax_time,
    b"atime": _pax_time,
    b"ctime": _pax_time,
}
