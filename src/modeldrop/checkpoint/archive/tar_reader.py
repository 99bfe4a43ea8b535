"""A tar reader that reads each 512-byte header itself and refuses every one that GNU tar and
Python's tarfile (or any other reader) could turn into different trees.

The rules are in archive_rules.py. What GNU tar does that a lenient reader does not, and so is
refused here rather than guessed at: it ignores the ustar prefix unless the magic is POSIX's;
cuts a PAX path at a NUL; extracts a file member whose name ends in '/' as a directory and reads
its data as more headers; skips a block with a bad checksum and reads on; applies PAX global
names to every later member. tarfile, for its part, ends quietly at the first malformed header.
Names are compared as raw bytes; they are decoded (surrogate-escaped, so two raw names stay two
strings) only for the ArtifactScan's keys, and escaped only for display.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

from modeldrop.checkpoint.archive.archive_rules import archive_refused
from modeldrop.checkpoint.archive.tar_pax import parse_pax, show
from modeldrop.contracts.errors import CheckpointRefused, CheckpointUnreadable
from modeldrop.contracts.text import printable

BLOCK = 512
_ZERO = bytes(BLOCK)
MAX_MEMBERS = 4096  # a 600B model in 163 shards has under 200 files; refusing fast matters more
MAX_RECORDS = 4 * MAX_MEMBERS  # long-name and PAX records count too
MAX_DECLARED_BYTES = 2 * 1024**4  # 2 TiB: past any real checkpoint, short of a hostile header
MAX_LONG_NAME = 64 * 1024
MAX_PAX_BYTES = 64 * 1024  # a path of PATH_MAX, a link path and xattrs fit many times over
MAX_PAX_TOTAL = 8 * 1024 * 1024  # all PAX and long-name records of one archive: 2 KiB a member at the cap
PATH_MAX = 4096  # bytes, with its NUL: past it extraction fails with ENAMETOOLONG ("File name too long")
NAME_MAX = 255
_SKIP_STEP = 1024 * 1024

_POSIX_MAGIC = b"ustar\x00"
_GNU_MAGIC = b"ustar  \x00"
# name, start, end, base-256 allowed (where a large value is legitimate)
_NUMERIC = (
    ("mode", 100, 108, False),
    ("uid", 108, 116, True),
    ("gid", 116, 124, True),
    ("size", 124, 136, True),
    ("mtime", 136, 148, True),
    ("chksum", 148, 156, False),
    ("devmajor", 329, 337, False),
    ("devminor", 337, 345, False),
)
# Plain octal as both readers parse it alike: optional leading spaces, digits, then only NULs or
# spaces; or an empty (all-NUL) field. `12 34`, a NUL before the digits, `+12` or `1_2` are refused.
_BASE256_BOUNDS = {"uid": 2**32, "gid": 2**32, "mtime": 2**63, "size": 2**63}
_OCTAL = re.compile(rb" *[0-7]+[ \x00]*|\x00*")
# A record's start as GNU tar reads it: blanks, the length (tarfile takes at most 20 digits), blanks.
_FILE_TYPES = (b"0", b"\x00", b"7")  # regular, old regular, contiguous (read as regular by all)
# PAX keys a global header may set: none of them changes a path or a member's bytes.
_GLOBAL_KEYS = frozenset(
    (b"comment", b"mtime", b"atime", b"ctime", b"uid", b"gid", b"uname", b"gname", b"charset", b"hdrcharset")
)
_LOW_BYTES = bytes(range(128))


class ByteSource(Protocol):
    def read(self, n: int) -> bytes: ...

    def skip(self, n: int) -> int: ...


@dataclass(frozen=True)
class TarMember:
    path: str  # normalized relative path (surrogate-escaped raw bytes); never empty
    raw: bytes
    is_dir: bool
    size: int


def truncated(where: str) -> CheckpointUnreadable:
    return CheckpointUnreadable(f"archive is truncated: the stream ends {where}", "upload the complete archive again")


@dataclass(frozen=True)
class _Header:
    block: bytes
    typeflag: bytes
    size: int
    name: bytes  # the name field, joined to the prefix where the magic is POSIX's
    name_field: bytes


def _numeric(block: bytes, field: str, start: int, end: int, big: bool, at: int) -> int:
    raw = block[start:end]
    if big and raw[:1] in (b"\x80", b"\xff"):
        # Base-256, as GNU tar writes what octal cannot hold: negative (0xff) only for dates before
        # 1970; ids past their type's range are errors in GNU tar's extraction (exit 2).
        value = int.from_bytes(raw, "big", signed=True) if raw[:1] == b"\xff" else int.from_bytes(raw[1:], "big")
        bound = _BASE256_BOUNDS.get(field)
        if (value < 0 and field != "mtime") or (bound is not None and not -bound <= value < bound):
            raise archive_refused(
                "TAR_NUMERIC_FIELD", f"the header at byte {at} has a base-256 {field} out of range ({value})"
            )
        return value
    if _OCTAL.fullmatch(raw) is None:
        raise archive_refused(
            "TAR_NUMERIC_FIELD", f"the header at byte {at} has a malformed {field} field {printable(repr(raw))}"
        )
    digits = raw.strip(b" \x00")
    return int(digits, 8) if digits else 0


def _checksums(block: bytes) -> tuple[int, int]:
    """Unsigned and signed sums with the checksum field read as spaces (both readers accept either)."""
    unsigned = sum(block) - sum(block[148:156]) + 8 * 32
    high = len(block[:148].translate(None, _LOW_BYTES)) + len(block[156:].translate(None, _LOW_BYTES))
    return unsigned, unsigned - 256 * high


def parse_header(block: bytes, at: int) -> _Header:
    """One member header, or a refusal. The first header's faults mean the bytes are not a tar at all."""
    try:
        chksum = _numeric(block, "chksum", 148, 156, False, at)
    except CheckpointRefused:
        if at == 0:
            raise _not_tar(block) from None
        raise
    if chksum not in _checksums(block):
        if at == 0:
            raise _not_tar(block)
        raise archive_refused("TAR_CHECKSUM", f"the header at byte {at} has a wrong checksum")
    values = {name: _numeric(block, name, s, e, big, at) for name, s, e, big in _NUMERIC}
    magic = block[257:265]
    posix = magic[:6] == _POSIX_MAGIC
    if posix and magic[6:] != b"00":
        raise archive_refused("TAR_MAGIC", f"the header at byte {at} has ustar version {printable(repr(magic[6:]))}")
    if not posix and magic not in (_GNU_MAGIC, bytes(8)):
        raise archive_refused("TAR_MAGIC", f"the header at byte {at} has an unknown magic {printable(repr(magic))}")
    if not posix and any(block[345:500]):
        raise archive_refused(
            "TAR_GNU_PREFIX", f"the header at byte {at} is old-GNU or v7 but has bytes in the ustar prefix field"
        )
    name_field = block[:100].split(b"\x00", 1)[0]
    prefix = block[345:500].split(b"\x00", 1)[0] if posix else b""
    name = prefix + b"/" + name_field if prefix else name_field
    return _Header(block, block[156:157], values["size"], name, name_field)


def _not_tar(block: bytes = b"") -> CheckpointUnreadable:
    if block.startswith(b"\x1f\x8b"):
        return CheckpointUnreadable(
            "not a tar archive: the file is gzip-compressed", "name it .tar.gz (validation reads it by its name)"
        )
    return CheckpointUnreadable(
        "not a tar archive (the first header is not a valid tar header)",
        "package the model directory with tar -czf model.tar.gz -C DIR .",
    )


def _check_name_length(name: bytes, at: int) -> None:
    """GNU tar's extraction fails with "File name too long" past PATH_MAX or NAME_MAX; checked before
    any per-component work, which is quadratic in the depth."""
    if len(name) >= PATH_MAX or max(map(len, name.split(b"/", PATH_MAX))) > NAME_MAX:
        raise archive_refused(
            "TAR_NAME_TOO_LONG",
            f"the member at byte {at} is named {show(name[:80])}... ({len(name)} bytes): past the {PATH_MAX - 1}-byte "
            f"path or {NAME_MAX}-byte part that extraction can create",
        )


def normalize(raw: bytes, is_dir: bool) -> bytes:
    """The relative path extraction creates, or a refusal: absolute, '..', or a file named like a directory."""
    if raw.startswith(b"/"):
        raise archive_refused("ARCHIVE_ABSOLUTE_PATH", f"archive member {show(raw)} has an absolute path")
    parts = raw.split(b"/")
    if b".." in parts:
        raise archive_refused("ARCHIVE_PATH_ESCAPE", f"archive member {show(raw)} escapes the model directory")
    kept = [p for p in parts if p not in (b"", b".")]
    if not is_dir and parts[-1] in (b"", b".") and kept:
        raise archive_refused(
            "TAR_SLASH_NAME", f"file member {show(raw)} is named like a directory (GNU tar extracts it as one)"
        )
    if not is_dir and not kept:
        raise archive_refused("ARCHIVE_EMPTY_NAME", f"a file member has no name ({show(raw)!r})")
    return b"/".join(kept)


class _Paths:
    """Every path the archive has put down, to refuse a second member where extraction would replace
    the first: the same path twice, or a file in one member and a directory (or parent) in another."""

    def __init__(self) -> None:
        self.files: set[bytes] = set()
        self.dirs: set[bytes] = set()

    def add(self, rel: bytes, is_dir: bool) -> None:
        parents = []
        head = posixpath.dirname(rel)
        while head:
            parents.append(head)
            head = posixpath.dirname(head)
        if rel in self.files or (not is_dir and rel in self.dirs) or any(p in self.files for p in parents):
            raise archive_refused(
                "ARCHIVE_DUPLICATE_PATH", f"archive has more than one member at {show(rel)} (extraction keeps the last)"
            )
        (self.dirs if is_dir else self.files).add(rel)
        self.dirs.update(parents)


_MEMBER_TYPES = {
    b"1": ("ARCHIVE_LINK", "a hard link"),
    b"2": ("ARCHIVE_LINK", "a symlink"),
    b"K": ("ARCHIVE_LINK", "a GNU long link name"),
    b"3": ("ARCHIVE_SPECIAL_FILE", "a character device"),
    b"4": ("ARCHIVE_SPECIAL_FILE", "a block device"),
    b"6": ("ARCHIVE_SPECIAL_FILE", "a FIFO"),
    b"S": ("TAR_SPARSE", "an old-GNU sparse file"),
}


class TarReader:
    """Members of a tar stream in order; `read` reads the current member's data. The stream is read
    to its end (so a gzip trailer is always checked), and past the end-of-archive block only zeros may follow."""

    def __init__(self, source: ByteSource) -> None:
        self._src = source
        self.offset = 0
        self._left = 0  # of the current member's data
        self._pad = 0
        self.declared = 0
        self._record_bytes = 0

    def _read(self, n: int) -> bytes:
        parts = []
        want = n
        while want:
            chunk = self._src.read(want)
            if not chunk:
                break
            parts.append(chunk)
            want -= len(chunk)
        data = b"".join(parts)
        self.offset += len(data)
        return data

    def read(self, n: int) -> bytes:
        data = self._read(min(n, self._left))
        self._left -= len(data)
        return data

    def _skip(self, n: int) -> None:
        done = self._src.skip(n) if n else 0
        self.offset += done
        if done != n:
            raise truncated("inside a member")

    def _finish(self) -> None:
        self._skip(self._left + self._pad)
        self._left = self._pad = 0

    def _record(self, header: _Header, cap: int, at: int) -> bytes:
        if header.size > cap:
            raise archive_refused("TAR_LONG_RECORD", f"the record at byte {at} is {header.size} bytes")
        self._record_bytes += header.size
        if self._record_bytes > MAX_PAX_TOTAL:
            raise archive_refused(
                "TAR_LONG_RECORD", f"the archive's PAX and long-name records pass {MAX_PAX_TOTAL} bytes at byte {at}"
            )
        data = self._read(header.size)
        if len(data) != header.size:
            raise truncated("inside a header record")
        self._skip(-header.size % BLOCK)
        return data

    def members(self) -> Iterator[TarMember]:
        paths = _Paths()
        pax: dict[bytes, bytes] | None = None
        long_name: bytes | None = None
        records = members = 0
        while True:
            self._finish()
            at = self.offset
            block = self._read(BLOCK)
            if len(block) < BLOCK or block == _ZERO:
                _check_end(block, at, pending=pax is not None or long_name is not None)
                if block:
                    self._trailing()
                return
            header = parse_header(block, at)
            records += 1
            if records > MAX_RECORDS:
                raise archive_refused("ARCHIVE_TOO_MANY_MEMBERS", f"archive has more than {MAX_RECORDS} headers")
            kind = header.typeflag
            if kind == b"g":
                if pax is not None or long_name is not None:
                    raise archive_refused("TAR_PAX_INVALID", f"a global header at byte {at} follows a name record")
                _check_global(parse_pax(self._record(header, MAX_PAX_BYTES, at), at), at)
                continue
            if kind == b"x":
                if pax is not None:
                    raise archive_refused("TAR_NAME_CONFLICT", f"a second PAX header for one member at byte {at}")
                pax = parse_pax(self._record(header, MAX_PAX_BYTES, at), at)
                continue
            if kind == b"L":
                if long_name is not None:
                    raise archive_refused("TAR_NAME_CONFLICT", f"a second GNU long name for one member at byte {at}")
                long_name = self._record(header, MAX_LONG_NAME, at).split(b"\x00", 1)[0]
                continue
            member = self._member(header, pax or {}, long_name, at)
            pax = long_name = None
            members += 1
            if members > MAX_MEMBERS:
                raise archive_refused("ARCHIVE_TOO_MANY_MEMBERS", f"archive has more than {MAX_MEMBERS} members")
            if member.raw:  # the root itself (`./`) puts nothing down
                paths.add(member.raw, member.is_dir)
                yield member

    def _member(self, header: _Header, pax: dict[bytes, bytes], long_name: bytes | None, at: int) -> TarMember:
        kind = header.typeflag
        if kind in _MEMBER_TYPES:
            code, what = _MEMBER_TYPES[kind]
            raise archive_refused(code, f"archive member {show(header.name)} is {what}")
        if kind not in (*_FILE_TYPES, b"5"):
            raise archive_refused("ARCHIVE_MEMBER_TYPE", f"archive member {show(header.name)} has type {show(kind)}")
        name = header.name if long_name is None else long_name
        if b"path" in pax:
            if long_name is not None and pax[b"path"] != long_name:
                raise archive_refused(
                    "TAR_NAME_CONFLICT",
                    f"member at byte {at} is named {show(long_name)} by a GNU long name and "
                    f"{show(pax[b'path'])} by PAX",
                )
            name = pax[b"path"]
        _check_name_length(name, at)
        size = int(pax[b"size"]) if b"size" in pax else header.size
        is_dir = kind == b"5"
        if kind == b"\x00" and header.name_field.endswith(b"/"):
            if b"path" in pax or long_name is not None:
                # tarfile turns an old regular member named `x/` into a directory before any PAX name applies.
                raise archive_refused(
                    "TAR_SLASH_NAME", f"file member {show(header.name_field)} is named like a directory"
                )
            is_dir = True  # how v7 archives (bsdtar --format v7) store directories; GNU tar and tarfile agree
        if is_dir and size:
            raise archive_refused("TAR_DIRECTORY_DATA", f"directory member {show(name)} carries {size} bytes")
        rel = normalize(name, is_dir)
        self.declared += size
        if self.declared > MAX_DECLARED_BYTES:
            raise archive_refused("ARCHIVE_TOO_LARGE", "archive declares more than 2 TiB of content")
        self._left, self._pad = size, -size % BLOCK
        return TarMember(rel.decode("utf-8", "surrogateescape"), rel, is_dir, size)

    def _trailing(self) -> None:
        """GNU tar and tarfile both stop at the first zero block; anything but zeros after it is
        what some other reader (tar -i, a concatenating tool) would extract, so it is refused."""
        while chunk := self._read(_SKIP_STEP):
            if chunk.count(0) != len(chunk):
                raise archive_refused("TAR_TRAILING_DATA", "the archive has data after its end-of-archive block")


def _check_end(block: bytes, at: int, pending: bool) -> None:
    """The archive ends at AT (BLOCK is short, or its zero end-of-archive block): refused when that
    is inside a header, when nothing came before it, or when a name record (PENDING) has no member."""
    if 0 < len(block) < BLOCK:
        raise _not_tar(block) if at == 0 else truncated("inside a header")
    if at == 0:
        raise CheckpointUnreadable("archive is empty")
    if pending:
        raise archive_refused("TAR_PAX_INVALID", "the archive ends after a name record, with no member")


def _check_global(records: dict[bytes, bytes], at: int) -> None:
    for key in records:
        if key not in _GLOBAL_KEYS and not key.startswith((b"SCHILY.", b"LIBARCHIVE.")):
            raise archive_refused("TAR_PAX_GLOBAL", f"the PAX global header at byte {at} sets {show(key)}")
