"""Read a tar / tar.gz artifact once, through the strict TarReader, without extracting it; and
extract one the same way where the local hosting emulator lays out /opt/ml/model.

The bytes come from one of three sources: a plain stream (an S3 body, a local .tar), the strict
gzip reader over one, or, for a local .tar.gz of weights-like data, rapidgzip's parallel decoder
(whose verdict counts only when the whole stream was inflated and matched its trailer; anything
else, a refusal included, is judged again by the sequential reader, which checks every member).
"""

from __future__ import annotations

import math
import os
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from modeldrop.checkpoint.archive.gzip_stream import StrictGzip, header_end
from modeldrop.checkpoint.archive.scan_result import ArtifactScan, scan_member
from modeldrop.checkpoint.archive.tar_reader import ByteSource, TarMember, TarReader
from modeldrop.contracts import progress
from modeldrop.contracts.artifact import is_compressed
from modeldrop.contracts.errors import CheckpointRefused, ModeldropError

if TYPE_CHECKING:
    from modeldrop.checkpoint.archive.parallel_inflate import ParallelInflate

_STEP = 16 * 1024 * 1024  # skips go in steps of this, so that progress moves on long members
_DISCARD = 1024 * 1024
# Weights-like data: gzip saves 0-40 %, so the inflated size is 0.9-1.6x the file.
RAPIDGZIP_MIN_RATIO = 0.9
RAPIDGZIP_MAX_RATIO = 1.6
_PROBE_BYTES = 64 * 1024
# The header rules that random bytes trip; and how much more is inflated to look for the CRC error.
GARBAGE_RULES = frozenset(("TAR_CHECKSUM", "TAR_NUMERIC_FIELD", "TAR_MAGIC", "TAR_GNU_PREFIX", "TAR_PAX_INVALID"))
MAX_DAMAGE_CHECK = 8 * 1024**3


class FileSource:
    """A raw stream read forward, reporting progress by the bytes read of TOTAL; skips seek where
    the stream can (a local file), else read and drop."""

    def __init__(self, raw: IO[bytes], total: int | None = None) -> None:
        self._raw, self._total = raw, total
        self._seekable = total is not None and raw.seekable()
        self._done = self._reported = 0

    def read(self, n: int) -> bytes:
        data = self._raw.read(n)
        self._count(len(data))
        return data

    def _count(self, n: int) -> None:
        self._done += n
        if self._done - self._reported >= 8 * 1024 * 1024 or not n:
            self._reported = self._done
            progress.report(self._done, self._total)

    def skip(self, n: int) -> int:
        if self._seekable:
            assert self._total is not None
            moved = max(0, min(n, self._total - self._raw.tell()))
            self._raw.seek(moved, os.SEEK_CUR)
            self._count(moved)
            return moved
        left = n
        while left and (chunk := self.read(min(left, _DISCARD))):
            left -= len(chunk)
        return n - left


class _Parallel:
    """rapidgzip's output: skipped bytes are spliced away in the kernel, in steps for progress."""

    def __init__(self, stream: ParallelInflate, compressed_size: int) -> None:
        self._stream = stream
        self._total = compressed_size

    def read(self, n: int) -> bytes:
        return self._stream.read(n)

    def skip(self, n: int) -> int:
        start = position = self._stream.tell()
        end = start + n
        while position < end:
            reached = self._stream.seek(min(position + _STEP, end))
            if reached == position:
                break
            position = reached
            progress.report(self._stream.compressed_position(), self._total)
        return position - start


def open_stream(raw: IO[bytes], compressed: bool, total: int | None = None) -> ByteSource:
    source = FileSource(raw, total)
    return StrictGzip(source) if compressed else source


class MemberWriter(Protocol):
    def write(self, data: bytes) -> None: ...
    def close(self) -> None: ...


class MemberSink(Protocol):
    """Where a validating pass writes the members it reads (the served prefix): each byte the
    validator reads is the byte written."""

    def wants(self, relative: str) -> bool: ...
    def open(self, relative: str, size: int) -> MemberWriter: ...


class _Tee:
    """The current member's data, read for the validator and written to the sink as it goes."""

    def __init__(self, reader: TarReader, out: MemberWriter) -> None:
        self._reader, self._out = reader, out

    def read(self, n: int) -> bytes:
        data = self._reader.read(n)
        if data:
            self._out.write(data)
        return data

    def drain(self) -> None:
        while self.read(_DISCARD):
            pass
        self._out.close()


def scan_tar(source: ByteSource, name: str, fmt: str, sink: MemberSink | None = None) -> ArtifactScan:
    """Read the archive once; with SINK, every served member is also written there as it streams."""
    scan = ArtifactScan(source=name, format=fmt)
    reader = TarReader(source)
    try:
        for member in reader.members():
            if member.is_dir:
                scan.dirs.add(member.path)
                continue
            if sink is not None and sink.wants(member.path):
                tee = _Tee(reader, sink.open(member.path, member.size))
                scan_member(scan, member.path, member.size, tee)
                tee.drain()
            else:
                scan_member(scan, member.path, member.size, reader)
    except CheckpointRefused as exc:
        _damage_first(source, exc)
        raise
    return scan


def _damage_first(source: ByteSource, exc: CheckpointRefused) -> None:
    """A damaged gzip stream inflates to garbage that a header rule refuses before the CRC shows the
    damage: for the rules garbage can trip, the rest is inflated (up to a bound) so that a damaged
    stream is called unreadable (exit 2), not refused (exit 1)."""
    if isinstance(source, StrictGzip) and exc.code in GARBAGE_RULES:
        source.skip(MAX_DAMAGE_CHECK)


def scan_tar_stream(raw: IO[bytes], source: str, compressed: bool, sink: MemberSink | None = None) -> ArtifactScan:
    """Validate-read a tar(.gz) stream once (to its end, so every gzip trailer is checked)."""
    return scan_tar(open_stream(raw, compressed), source, "tar.gz" if compressed else "tar", sink)


def scan_archive_file(path: Path) -> ArtifactScan:
    compressed = is_compressed(path.name)
    if compressed:
        fast = _scan_with_rapidgzip(path)
        if fast is not None:
            return fast
    with path.open("rb") as fh:
        return scan_tar(open_stream(fh, compressed, path.stat().st_size), str(path), "tar.gz" if compressed else "tar")


def _single_member_start(path: Path) -> bool:
    """The first gzip member's header passes the strict rules (a refusal is raised, and is final) and
    its data does not end within the first 64 KiB: a file of several members (the trailer the
    parallel path is gated on describes only the last) goes to the sequential reader."""
    with path.open("rb") as fh:
        head = fh.read(_PROBE_BYTES)
    end = header_end(head)
    if end is None:
        return False
    inflater = zlib.decompressobj(-15)
    data = head[end:]
    try:
        while data and not inflater.eof:
            inflater.decompress(data, _DISCARD)
            data = inflater.unconsumed_tail
    except zlib.error:
        return False
    return not inflater.eof


def _scan_with_rapidgzip(path: Path) -> ArtifactScan | None:
    """Parallel inflate for a local .tar.gz; None when rapidgzip is absent or cannot vouch for the file.

    rapidgzip stops quietly at a stream cut inside a deflate block, so the result counts only if
    the gzip trailer's size is the size inflated.
    """
    from modeldrop.checkpoint.archive import parallel_inflate

    size = path.stat().st_size
    if size < 8 or not parallel_inflate.available() or not _single_member_start(path):
        return None
    with path.open("rb") as fh:
        fh.seek(-4, os.SEEK_END)
        isize = int.from_bytes(fh.read(4), "little")
    # Only weights-like data goes parallel: a bomb's ratio is far past it. The trailer holds the
    # size modulo 2^32: the smallest size it can stand for at or above the weights-like minimum is
    # the one to gate on.
    wraps = max(0, math.ceil((size * RAPIDGZIP_MIN_RATIO - isize) / 2**32))
    expected = isize + wraps * 2**32
    if expected > size * RAPIDGZIP_MAX_RATIO:
        return None
    try:
        with parallel_inflate.ParallelInflate(path, size, expected) as stream:
            scan = scan_tar(_Parallel(stream, size), str(path), "tar.gz")
            complete = stream.finished() and stream.tell() % 2**32 == isize
    except (ModeldropError, OSError):
        # A cut stream can look like a hostile header: the sequential reader, which checks every
        # member and trailer, gives the verdict. OSError: the decoder could not start, or its pipe failed.
        return None
    if not complete:
        return None
    progress.report(size, size)
    return scan


def iter_archive(raw: IO[bytes], compressed: bool) -> Iterator[tuple[TarMember, TarReader]]:
    """Each member with the reader positioned at its data (repair reads the base's tensors so)."""
    reader = TarReader(open_stream(raw, compressed))
    for member in reader.members():
        yield member, reader


def extract_archive(archive: Path, target: Path) -> None:
    """Extract a tar(.gz) by the validator's own reader and rules: regular files and directories
    only, normalized relative paths, no path twice, no file created through a link (none exists to
    go through)."""
    target.mkdir(parents=True, exist_ok=True)
    with archive.open("rb") as raw:
        # By name, as validation reads it: SageMaker inflates a ModelDataUrl whatever its bytes are.
        for member, reader in iter_archive(raw, is_compressed(archive.name)):
            dest = target.joinpath(*member.path.split("/"))
            if member.is_dir:
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                while chunk := reader.read(1024 * 1024):
                    out.write(chunk)
