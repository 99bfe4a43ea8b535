"""A gzip reader as strict as GNU gzip about every member's header, with every member's CRC-32 and
length checked.

Python's gzip (and isal's igzip, built on it) ignores the reserved FLG bits and never checks the
header CRC (FHCRC); GNU gzip refuses both, so `tar -xzf` extracts nothing from such a file while a
lenient reader would validate a whole tree. Every member's header is read here, the deflate data
goes to isal's (or zlib's) raw inflater, and the trailer is compared with what was inflated.
"""

from __future__ import annotations

import zlib
from types import ModuleType
from typing import Any, Protocol, cast

from modeldrop.checkpoint.archive.archive_rules import archive_refused
from modeldrop.contracts.errors import CheckpointUnreadable

FHCRC, FEXTRA, FNAME, FCOMMENT = 0x02, 0x04, 0x08, 0x10
RESERVED_FLAGS = 0xE0
# A name or comment is a few bytes; a header past this is not a model archive's.
MAX_HEADER_BYTES = 64 * 1024
_IN_STEP = 64 * 1024  # input fed per inflate call: the tail re-copied per call stays small
_RAW_STEP = 1024 * 1024  # read from the source per call: an S3 body's per-read cost is paid per MiB
_OUT_STEP = 256 * 1024

_zlib: ModuleType
try:  # 2-4x faster than zlib on the same raw deflate data
    from isal import isal_zlib

    _zlib = isal_zlib
    _INFLATE_ERRORS: tuple[type[BaseException], ...] = (zlib.error, cast(type[BaseException], isal_zlib.IsalError))
except ImportError:  # pragma: no cover - where isal is absent
    _zlib = zlib
    _INFLATE_ERRORS = (zlib.error,)


def corrupt(message: str) -> CheckpointUnreadable:
    return CheckpointUnreadable(
        f"corrupt gzip stream: {message}", "re-create model.tar.gz (tar -czf) and upload it again"
    )


def header_end(buf: bytes, pos: int = 0) -> int | None:
    """Where the gzip member header starting at POS ends, or None if BUF is too short to tell.
    Refuses what GNU gzip refuses: another magic or method, reserved flags, a wrong header CRC."""
    if len(buf) - pos < 10:
        return None
    if buf[pos : pos + 2] != b"\x1f\x8b":
        raise CheckpointUnreadable("not a gzip file", "compress with gzip (tar -czf), or name the file .tar")
    if buf[pos + 2] != 8:
        raise corrupt(f"compression method {buf[pos + 2]} is not deflate")
    flags = buf[pos + 3]
    if flags & RESERVED_FLAGS:
        raise archive_refused(
            "GZIP_RESERVED_FLAGS",
            f"the gzip header sets reserved flag bits (0x{flags & RESERVED_FLAGS:02x}); GNU gzip refuses the file",
        )
    end = pos + 10
    if flags & FEXTRA:
        if len(buf) < end + 2:
            return None
        end += 2 + int.from_bytes(buf[end : end + 2], "little")
    for flag in (FNAME, FCOMMENT):
        if flags & flag:
            nul = buf.find(b"\0", end)
            if nul < 0:
                _check_length(buf, pos)
                return None
            end = nul + 1
    if flags & FHCRC:
        if len(buf) < end + 2:
            return None
        if zlib.crc32(buf[pos:end]) & 0xFFFF != int.from_bytes(buf[end : end + 2], "little"):
            raise archive_refused("GZIP_HEADER_CRC", "the gzip header's CRC (FHCRC) does not match the header")
        end += 2
    if end > len(buf):
        _check_length(buf, pos)
        return None
    if end - pos > MAX_HEADER_BYTES:  # whole in BUF, and still too long
        _check_length(buf[:end], pos)
    return end


def _check_length(buf: bytes, pos: int) -> None:
    if len(buf) - pos > MAX_HEADER_BYTES:
        raise archive_refused("GZIP_HEADER_TOO_LONG", f"a gzip header is longer than {MAX_HEADER_BYTES} bytes")


class _Readable(Protocol):
    def read(self, n: int) -> bytes: ...


class StrictGzip:
    """The inflated bytes of every member of a gzip stream, read forward. Errors: CheckpointUnreadable
    for a stream that cannot be read (corrupt, truncated), a refusal with a finding code for a rule."""

    def __init__(self, raw: _Readable) -> None:
        self._raw = raw
        # Unread input is self._in[self._pos:]: advancing an offset, not re-slicing a MiB per inflate call.
        self._in = b""
        self._pos = 0
        self._raw_done = False
        self._out = b""
        self._at = 0
        self._inflater: Any = None
        self._crc = 0
        self._size = 0
        self._done = False
        self.members = 0

    def _fill(self, want: int) -> bool:
        """At least WANT input bytes buffered, or False at the stream's end."""
        while len(self._in) - self._pos < want and not self._raw_done:
            chunk = self._raw.read(max(_RAW_STEP, want - (len(self._in) - self._pos)))
            if not chunk:
                self._raw_done = True
            self._in = self._in[self._pos :] + chunk
            self._pos = 0
        return len(self._in) - self._pos >= want

    def _compact(self) -> None:
        """The unread input from offset 0 (header and trailer parsing index self._in directly)."""
        if self._pos:
            self._in, self._pos = self._in[self._pos :], 0

    def _next_member(self) -> bool:
        """Start the next member; False at a clean end (nothing, or only zero bytes, follows)."""
        self._fill(1)
        self._compact()
        if not self._in:
            if self.members == 0:
                raise CheckpointUnreadable("the file is empty")
            return False
        if self.members and self._in[:2] != b"\x1f\x8b":
            # GNU gzip ignores zero padding after a member (and warns); anything else is another file's bytes.
            while self._in.count(0) == len(self._in):
                self._in = b""
                if not self._fill(1):
                    return False
            raise archive_refused("GZIP_TRAILING_DATA", "the gzip stream has data after its last member")
        size = 10
        while (end := header_end(self._in)) is None:
            size *= 2
            if not self._fill(size) and header_end(self._in) is None:
                raise corrupt("the file ends inside a gzip header")
        self._pos = end
        self._inflater = _zlib.decompressobj(-15)
        self._crc = self._size = 0
        self.members += 1
        return True

    def _inflate(self, limit: int) -> bytes:
        if self._inflater is None and not self._next_member():
            self._done = True
            return b""
        if self._pos >= len(self._in) and not self._fill(1):
            raise corrupt("the file is truncated (it ends inside compressed data)")
        feed = self._in[self._pos : self._pos + _IN_STEP]
        try:
            out = self._inflater.decompress(feed, limit)
        except _INFLATE_ERRORS as exc:
            raise corrupt(str(exc)) from None
        self._crc = _zlib.crc32(out, self._crc)
        self._size += len(out)
        if self._inflater.eof:
            self._pos += len(feed) - len(self._inflater.unused_data)
            self._end_member()
        else:
            self._pos += len(feed) - len(self._inflater.unconsumed_tail)
        return bytes(out)

    def _end_member(self) -> None:
        if not self._fill(8):
            raise corrupt("the file is truncated (it ends inside a gzip trailer)")
        self._compact()
        crc, size = int.from_bytes(self._in[:4], "little"), int.from_bytes(self._in[4:8], "little")
        self._pos = 8
        if crc != self._crc:
            raise corrupt("CRC-32 mismatch: the data is damaged")
        if size != self._size & 0xFFFFFFFF:
            raise corrupt("length mismatch: the data is damaged")
        self._inflater = None

    def read(self, n: int = -1) -> bytes:
        """Up to N bytes (all that is left for N < 0); b"" only at the end."""
        if n < 0:
            return b"".join(iter(lambda: self.read(_OUT_STEP), b""))
        while self._at >= len(self._out):
            if self._done:
                return b""
            self._out, self._at = self._inflate(_OUT_STEP), 0
        piece = self._out[self._at : self._at + n]
        self._at += len(piece)
        return piece

    def skip(self, n: int) -> int:
        """Inflate and drop N bytes (CRC still checked); returns how many there were."""
        left = n
        while left > 0:
            if self._at >= len(self._out):
                if self._done:
                    break
                self._out, self._at = self._inflate(_OUT_STEP), 0
                continue
            take = min(left, len(self._out) - self._at)  # dropped by moving the offset: no copy
            self._at += take
            left -= take
        return n - left
