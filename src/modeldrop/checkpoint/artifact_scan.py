"""Read what validation needs from an artifact without extracting it.

Three shapes, one result (ArtifactScan): a local directory, a tar / tar.gz stream (local file or an
S3 body, read once, tensor bytes skipped), and an S3 prefix of uncompressed shards (only each
shard's header, by ranged GETs). Small metadata files (config.json, index, tokenizer files) are
kept in memory, bounded in size.
"""

from __future__ import annotations

import gzip
import math
import os
import posixpath
import tarfile
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from modeldrop.checkpoint.safetensors_header import (
    HeaderError,
    SafetensorsHeader,
    parse_header,
    read_header_length,
)
from modeldrop.contracts import progress
from modeldrop.contracts.artifact import is_compressed
from modeldrop.contracts.errors import CheckpointUnreadable
from modeldrop.contracts.s3uri import S3Uri
from modeldrop.contracts.text import printable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# The only files validation reads (at the artifact's root); every other file counts by size alone,
# so memory stays bounded whatever an archive holds.
READ_FILES = frozenset(("config.json", "model.safetensors.index.json", "tokenizer_config.json"))
MAX_READ_FILE_BYTES = 16 * 1024 * 1024
MAX_MEMBERS = 4096  # a 600B model in 163 shards has under 200 files; refusing fast matters more
MAX_DECLARED_BYTES = 2 * 1024**4  # 2 TiB: past any real checkpoint, short of a hostile header
FIRST_RANGE_BYTES = 1024 * 1024
# tarfile's stream mode copies what is left of its buffer on every read, 512-byte headers included:
# with a 4 MiB buffer 10^6 empty members took 60 s. 256 KiB keeps that small and skips stay cheap.
TAR_BUFSIZE = 256 * 1024
# Weights-like data: gzip saves 0-40 %, so the inflated size is 0.9-1.6x the file.
RAPIDGZIP_MIN_RATIO = 0.9
RAPIDGZIP_MAX_RATIO = 1.6


@dataclass
class ArtifactScan:
    source: str
    format: str
    files: dict[str, int] = field(default_factory=dict)
    small_files: dict[str, bytes] = field(default_factory=dict)
    headers: dict[str, SafetensorsHeader] = field(default_factory=dict)
    header_errors: dict[str, str] = field(default_factory=dict)
    # The finding code of each header error (HEADER_INVALID, or a documented stricter rule's code).
    header_error_codes: dict[str, str] = field(default_factory=dict)
    requests: int = 0


def normalize_member(name: str) -> str:
    name = printable(name)
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise CheckpointUnreadable(
            f"archive member {name!r} has an absolute path", "rebuild the archive with relative paths"
        )
    norm = posixpath.normpath(name)
    if norm == ".." or norm.startswith("../") or "/../" in f"/{name}/":
        raise CheckpointUnreadable(
            f"archive member {name!r} escapes the model directory", "rebuild the archive without '..' paths"
        )
    return "" if norm == "." else norm


def _read_exact(stream: IO[bytes], n: int) -> bytes:
    chunks = []
    remaining = n
    while remaining:
        chunk = stream.read(remaining)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _scan_member(scan: ArtifactScan, rel: str, size: int, stream: IO[bytes]) -> None:
    scan.files[rel] = size
    base = posixpath.basename(rel)
    if base.endswith(".safetensors"):

        def header() -> bytes:
            n = read_header_length(_read_exact(stream, 8), size)
            raw = _read_exact(stream, n)
            if len(raw) != n:
                raise HeaderError("file ends inside the header")
            return raw

        _add_header(scan, rel, size, header)
    elif rel in READ_FILES:
        _check_read_size(rel, size)
        data = _read_exact(stream, size)
        if len(data) != size:
            raise CheckpointUnreadable(f"{rel}: file is truncated ({len(data)} of {size} bytes)")
        scan.small_files[rel] = data


def _add_header(scan: ArtifactScan, rel: str, size: int, read: Callable[[], bytes]) -> None:
    """Parse one shard's header into the scan, or record why it is refused (with its finding code)."""
    try:
        scan.headers[rel] = parse_header(read(), size)
    except HeaderError as exc:
        scan.header_errors[rel] = str(exc)
        scan.header_error_codes[rel] = exc.code


def _check_read_size(rel: str, size: int) -> None:
    if size > MAX_READ_FILE_BYTES:
        raise CheckpointUnreadable(
            f"{rel} is {size} bytes, over the {MAX_READ_FILE_BYTES} modeldrop reads (real ones are kilobytes)",
            f"re-save {rel}",
        )


class _Paths:
    """Every path an archive has put down so far, to refuse a second member where extraction would
    replace the first: the same path twice, or a path that is a file in one member and a directory
    (or a directory's parent) in another. GNU tar keeps the last; validation must judge what stays."""

    def __init__(self) -> None:
        self.files: set[str] = set()
        self.dirs: set[str] = set()

    def add(self, rel: str, is_dir: bool) -> None:
        parents = []
        head = posixpath.dirname(rel)
        while head:
            parents.append(head)
            head = posixpath.dirname(head)
        clash = rel in self.files or (not is_dir and rel in self.dirs) or any(p in self.files for p in parents)
        if clash:
            raise CheckpointUnreadable(
                f"archive has more than one member at {rel!r} (extraction would keep only the last)",
                "rebuild the archive from one model directory (tar -czf model.tar.gz -C DIR .)",
            )
        (self.dirs if is_dir else self.files).add(rel)
        self.dirs.update(parents)


def _link_roots(path: Path) -> list[Path]:
    """Where a directory's symlinks may point: inside itself, and, for a Hugging Face cache snapshot
    (`models--org--name/snapshots/<rev>/`, a tree of links into `../../blobs/`), inside that repo's cache."""
    root = path.resolve()
    roots = [root]
    if root.parent.name == "snapshots" and (root.parent.parent / "blobs").is_dir():
        roots.append(root.parent.parent)
    return roots


def scan_directory(path: Path) -> ArtifactScan:
    scan = ArtifactScan(source=str(path), format="directory")
    roots = _link_roots(path)
    for file in sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink()):
        rel = printable(file.relative_to(path).as_posix())
        real = file
        if file.is_symlink():
            real = file.resolve()
            if not real.is_file() or not any(real.is_relative_to(r) for r in roots):
                raise CheckpointUnreadable(
                    f"{rel} is a symlink to {printable(str(real))}, outside the model directory (and not a "
                    "Hugging Face cache blob)",
                    "copy the real file into the model directory",
                )
        with real.open("rb") as fh:
            _scan_member(scan, rel, real.stat().st_size, fh)
    return scan


def extract_archive(archive: Path, target: Path) -> None:
    """Extract a tar(.gz) by the validator's own member rules, never by tarfile's filters: regular
    files and directories only, normalized relative paths, no path twice, no file created through a
    link (none exists to go through). Used where the local hosting emulator lays out /opt/ml/model."""
    target.mkdir(parents=True, exist_ok=True)
    with archive.open("rb") as raw:
        # By name, as validation reads it: SageMaker inflates a ModelDataUrl whatever its bytes are.
        compressed = is_compressed(archive.name)
        # tarfile's own "r|gz" re-slices its whole inflated buffer on every 512-byte read: 4096
        # empty members of a highly compressible archive took 10 s. The validator's inflater does not.
        try:
            _extract_members(decompressor(raw, compressed), target)
        except _EXTRACT_ERRORS as exc:
            if isinstance(exc, CheckpointUnreadable):
                raise
            raise CheckpointUnreadable(f"cannot extract the archive: {exc}") from None


def _extract_members(stream: IO[bytes], target: Path) -> None:
    paths = _Paths()
    with tarfile.open(fileobj=stream, mode="r|", bufsize=TAR_BUFSIZE) as tar:
        for count, member in enumerate(tar, start=1):
            if count > MAX_MEMBERS:
                raise CheckpointUnreadable(f"archive has more than {MAX_MEMBERS} members")
            rel = normalize_member(member.name)
            if not rel:
                continue
            if not (member.isdir() or member.isreg()):
                raise CheckpointUnreadable(f"archive member {member.name!r} is not a regular file or directory")
            paths.add(rel, is_dir=member.isdir())
            dest = target.joinpath(*rel.split("/"))
            if member.isdir():
                dest.mkdir(parents=True, exist_ok=True)
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            source = tar.extractfile(member)
            assert source is not None
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                while chunk := source.read(1024 * 1024):
                    out.write(chunk)


def decompressor(raw: IO[bytes], compressed: bool) -> IO[bytes]:
    if not compressed:
        return raw
    try:
        from isal import igzip  # a 2-4x faster inflate; stdlib gzip is the fallback

        return cast(IO[bytes], igzip.IGzipFile(fileobj=raw, mode="rb"))
    except ImportError:  # pragma: no cover - exercised where isal is absent
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))


def _inflate_errors() -> tuple[type[BaseException], ...]:
    try:
        from isal.isal_zlib import IsalError  # not an OSError or zlib.error: a corrupt block raises it raw
    except ImportError:  # pragma: no cover - where isal is absent
        return ()
    return (cast(type[BaseException], IsalError),)


_INFLATE_ERRORS: tuple[type[BaseException], ...] = (
    gzip.BadGzipFile,
    zlib.error,
    OSError,
    ValueError,
    RuntimeError,
    *_inflate_errors(),
)
_EXTRACT_ERRORS: tuple[type[BaseException], ...] = (tarfile.TarError, EOFError, *_INFLATE_ERRORS)


def _stream_fault(message: str, hint: str | None = None) -> CheckpointUnreadable:
    """The bytes could not be read as a tar(.gz) - as opposed to a member refused on its merits,
    which is final: only a stream fault sends rapidgzip's verdict to the sequential inflater."""
    exc = CheckpointUnreadable(message, hint)
    exc.stream_fault = True  # type: ignore[attr-defined]
    return exc


def scan_tar_stream(raw: IO[bytes], source: str, compressed: bool) -> ArtifactScan:
    """Validate-read a tar(.gz) stream once. Only regular files and directories are accepted."""
    return _scan_tar(decompressor(raw, compressed), source, "tar.gz" if compressed else "tar", seekable=False)


def _scan_tar(
    stream: IO[bytes], source: str, fmt: str, seekable: bool, compressed_size: int | None = None
) -> ArtifactScan:
    scan = ArtifactScan(source=source, format=fmt)
    paths = _Paths()
    declared = 0
    members = 0
    try:
        # Seekable (rapidgzip): skipping a member is a seek done in C. A stream: large reads.
        with tarfile.open(fileobj=stream, mode="r:" if seekable else "r|", bufsize=TAR_BUFSIZE) as tar:
            for member in tar:
                members += 1
                if members > MAX_MEMBERS:
                    raise CheckpointUnreadable(
                        f"archive has more than {MAX_MEMBERS} members",
                        "a model directory has far fewer files; rebuild the archive",
                    )
                rel = normalize_member(member.name)
                if member.isdir():
                    if rel:
                        paths.add(rel, is_dir=True)
                    continue
                if not member.isreg():
                    kind = "symlink" if member.issym() else "hardlink" if member.islnk() else "device or special file"
                    raise CheckpointUnreadable(
                        f"archive member {member.name!r} is a {kind}", "archive only regular files (tar --dereference)"
                    )
                declared += member.size
                if declared > MAX_DECLARED_BYTES:
                    raise CheckpointUnreadable(
                        "archive declares more than 2 TiB of content", "this is not a model archive"
                    )
                if not rel:
                    continue
                paths.add(rel, is_dir=False)
                fh = tar.extractfile(member)
                if fh is None:  # pragma: no cover - regular files always have a body
                    continue
                _scan_member(scan, rel, member.size, fh)
                if seekable:
                    _skip_reporting(stream, member.offset_data + member.size, compressed_size)
    except CheckpointUnreadable:
        raise
    except EOFError:
        raise _stream_fault(
            "archive is truncated: the stream ended inside a member", "upload the complete model.tar.gz again"
        ) from None
    except tarfile.ReadError as exc:
        raise _stream_fault(
            f"not a tar archive: {exc}", "package the model directory with tar -czf model.tar.gz -C DIR ."
        ) from None
    except tarfile.TarError as exc:
        raise _stream_fault(f"unreadable archive: {exc}") from None
    except _INFLATE_ERRORS as exc:
        raise _stream_fault(
            f"corrupt gzip stream: {exc}", "re-create model.tar.gz (tar -czf) and upload it again"
        ) from None
    if members == 0:
        raise CheckpointUnreadable("archive is empty")
    return scan


# A long member is skipped in steps of this many bytes, so that progress moves while it inflates.
SKIP_STEP = 16 * 1024 * 1024


def _skip_reporting(stream: IO[bytes], end: int, total: int | None) -> None:
    """Seek (inflate) to END in steps, reporting the compressed bytes read; tarfile's own seek to the
    next header is then a no-op. Only a parallel (seekable) stream gets here."""
    position = stream.tell()
    if end - position <= SKIP_STEP:
        return
    while position < end:
        reached = stream.seek(min(position + SKIP_STEP, end))
        if reached == position:  # the stream ended: tarfile's own read then names the truncation
            return
        position = reached
        compressed = getattr(stream, "compressed_position", None)
        progress.report(compressed() if compressed else position, total)


class _Counted:
    """A raw file whose reads report progress (bytes read of the file's size)."""

    def __init__(self, raw: IO[bytes], total: int | None) -> None:
        self.raw, self.total, self.done, self.reported = raw, total, 0, 0

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self._count(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        n = int(self.raw.readinto(buffer) or 0)  # type: ignore[attr-defined]
        self._count(n)
        return n

    def _count(self, n: int) -> None:
        self.done += n
        if self.done - self.reported >= 8 * 1024 * 1024 or not n:
            self.reported = self.done
            progress.report(self.done, self.total)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def scan_local(path: str) -> ArtifactScan:
    p = Path(path)
    if p.is_dir():
        return scan_directory(p)
    if not p.exists():
        raise CheckpointUnreadable(
            f"{path}: no such file or directory", "pass a model directory, .tar, .tar.gz or s3:// URI"
        )
    compressed = is_compressed(path)
    if compressed:
        fast = _scan_with_rapidgzip(p)
        if fast is not None:
            return fast
    with p.open("rb") as fh:
        return scan_tar_stream(cast(IO[bytes], _Counted(fh, p.stat().st_size)), path, compressed)


def _scan_with_rapidgzip(path: Path) -> ArtifactScan | None:
    """Parallel inflate for a local .tar.gz; None when rapidgzip is absent or cannot vouch for the file.

    rapidgzip stops quietly at a stream cut inside a deflate block, so the result counts only if
    the gzip trailer's size is the size inflated. A multi-member gzip fails that test too (the
    trailer describes its last member only); the sequential inflater, which checks every member's
    trailer, then decides. Such a file reaches this path only when its last member holds nearly
    all the data, since the trailer gate below sends any other one straight to the sequential path.
    """
    from modeldrop.checkpoint import parallel_inflate

    size = path.stat().st_size
    if size < 8 or not parallel_inflate.available():
        return None
    with path.open("rb") as fh:
        fh.seek(-4, os.SEEK_END)
        isize = int.from_bytes(fh.read(4), "little")
    # Only weights-like data goes parallel: a bomb's ratio is far past it, and a multi-member
    # file's last member is usually small. The trailer holds the size modulo 2^32: the smallest
    # size it can stand for at or above the weights-like minimum is the one to gate on.
    wraps = max(0, math.ceil((size * RAPIDGZIP_MIN_RATIO - isize) / 2**32))
    expected = isize + wraps * 2**32
    if expected > size * RAPIDGZIP_MAX_RATIO:
        return None
    try:
        with parallel_inflate.ParallelInflate(path, size, expected) as stream:
            scan = _scan_tar(cast(IO[bytes], stream), str(path), "tar.gz", seekable=True, compressed_size=size)
            complete = stream.finished() and stream.tell() % 2**32 == isize
    except CheckpointUnreadable as exc:
        if getattr(exc, "stream_fault", False):
            return None  # the sequential inflater, which checks every trailer, decides
        raise  # a hostile member is refused once, not scanned again
    except OSError:  # the decoder could not start or the pipe failed: the sequential path judges
        return None
    if not complete:
        return None
    progress.report(size, size)
    return scan


def scan_s3_object(s3: S3Client, uri: S3Uri) -> ArtifactScan:
    try:
        body = cast(IO[bytes], s3.get_object(Bucket=uri.bucket, Key=uri.key)["Body"])
    except s3.exceptions.NoSuchKey:
        raise CheckpointUnreadable(f"{uri}: no such object") from None
    scan = scan_tar_stream(body, str(uri), is_compressed(uri.key))
    scan.requests = 1
    return scan


def _list_prefix(s3: S3Client, uri: S3Uri) -> Iterable[tuple[str, int]]:
    paginator = s3.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=uri.bucket, Prefix=uri.key):
        for obj in page.get("Contents", []):
            yield obj["Key"], obj["Size"]


def scan_s3_prefix(s3: S3Client, uri: S3Uri) -> ArtifactScan:
    """Headers only: at most two ranged GETs per shard (length + header)."""
    scan = ArtifactScan(source=str(uri), format="s3-prefix")
    for key, size in _list_prefix(s3, uri):
        rel = printable(key[len(uri.key) :])
        if not rel or rel.endswith("/"):
            continue
        scan.files[rel] = size
        base = posixpath.basename(rel)
        if base.endswith(".safetensors"):

            def header(key: str = key, size: int = size) -> bytes:
                first = _ranged_get(s3, uri.bucket, key, 0, min(size, FIRST_RANGE_BYTES) - 1, scan)
                n = read_header_length(first, size)
                raw = first[8 : 8 + n]
                if len(raw) < n:
                    raw += _ranged_get(s3, uri.bucket, key, 8 + len(raw), 8 + n - 1, scan)
                return raw

            _add_header(scan, rel, size, header)
        elif rel in READ_FILES:
            _check_read_size(rel, size)
            scan.requests += 1
            scan.small_files[rel] = s3.get_object(Bucket=uri.bucket, Key=key)["Body"].read()
    if not scan.files:
        raise CheckpointUnreadable(f"{uri}: no objects under this prefix")
    return scan


def _ranged_get(s3: S3Client, bucket: str, key: str, start: int, end: int, scan: ArtifactScan) -> bytes:
    if end < start:
        return b""
    scan.requests += 1
    body: bytes = s3.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end}")["Body"].read()
    return body


def scan_source(source: str, s3: S3Client | None = None) -> ArtifactScan:
    """Scan a local path or s3:// URI."""
    scan = _scan_source(source, s3)
    scan.source = printable(scan.source)
    return scan


def _scan_source(source: str, s3: S3Client | None) -> ArtifactScan:
    if source.startswith("s3://"):
        from modeldrop.contracts.s3uri import parse_s3_uri

        if s3 is None:
            import boto3

            s3 = boto3.client("s3")
        uri = parse_s3_uri(source)
        try:
            return scan_s3_prefix(s3, uri) if uri.is_prefix else scan_s3_object(s3, uri)
        except ClientError as exc:
            # AccessDenied, NoSuchBucket, a wrong region: the artifact cannot be read, say which way.
            err = exc.response.get("Error", {})
            raise CheckpointUnreadable(
                f"cannot read {source}: {err.get('Code')}: {err.get('Message')}",
                "check the URI, the bucket's region and read permission (s3:GetObject, s3:ListBucket)",
            ) from None
    return scan_local(os.fspath(source))
