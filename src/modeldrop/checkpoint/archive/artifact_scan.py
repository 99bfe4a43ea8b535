"""Read what validation needs from an artifact without extracting it.

Three shapes, one result (ArtifactScan): a local directory, a tar / tar.gz stream (local file or an
S3 body, read once, tensor bytes skipped; tar_scan.py), and an S3 prefix of uncompressed shards
(only each shard's header, by ranged GETs).
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from modeldrop.checkpoint.archive.archive_rules import archive_refused, check_prefix_keys
from modeldrop.checkpoint.archive.scan_result import (
    ArtifactScan,
    add_header,
    is_read,
    scan_member,
)
from modeldrop.checkpoint.archive.tar_scan import extract_archive, scan_archive_file, scan_tar_stream
from modeldrop.checkpoint.headers.header_json import MAX_TOTAL_HEADER_BYTES
from modeldrop.checkpoint.headers.safetensors_header import read_header_length
from modeldrop.contracts.artifact import is_compressed
from modeldrop.contracts.errors import CheckpointUnreadable
from modeldrop.contracts.s3uri import S3Uri
from modeldrop.contracts.text import printable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

__all__ = ["ArtifactScan", "extract_archive", "scan_local", "scan_source", "scan_tar_stream"]

FIRST_RANGE_BYTES = 1024 * 1024


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
    for folder in path.rglob("*"):
        if folder.is_dir() and not folder.is_symlink():
            scan.dirs.add(folder.relative_to(path).as_posix())
    scan.header_bytes = _declared_header_bytes(path)
    for file in sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink()):
        rel = file.relative_to(path).as_posix()
        real = file
        if file.is_symlink():
            real = file.resolve()
            if not real.is_file() or not any(real.is_relative_to(r) for r in roots):
                raise archive_refused(
                    "DIRECTORY_LINK_OUTSIDE",
                    f"{printable(rel)} is a symlink to {printable(str(real))}, outside the model directory (and not a "
                    "Hugging Face cache blob)",
                )
        with real.open("rb") as fh:
            scan_member(scan, rel, real.stat().st_size, fh)
    return scan


def _declared_header_bytes(path: Path) -> int:
    """The root shards' header lengths summed, when past MAX_TOTAL_HEADER_BYTES (else 0): eight bytes a
    shard, so that an oversized checkpoint is refused before any header of it is parsed."""
    total = 0
    for shard in path.glob("*.safetensors"):
        if shard.name.startswith(".") or shard.is_symlink() or not shard.is_file():
            continue  # a link is the scan's to judge (inside the directory, or a cache blob); its total still bounds
        with shard.open("rb") as fh:
            prefix = fh.read(8)
        total += int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
    return total if total > MAX_TOTAL_HEADER_BYTES else 0


def scan_local(path: str) -> ArtifactScan:
    p = Path(path)
    if p.is_dir():
        return scan_directory(p)
    if not p.exists():
        raise CheckpointUnreadable(
            f"{printable(path)}: no such file or directory", "pass a model directory, .tar, .tar.gz or s3:// URI"
        )
    if not p.is_file():  # a FIFO or device named .tar.gz would block the read forever
        raise CheckpointUnreadable(
            f"{printable(path)} is not a regular file (a FIFO, socket or device)", "pass the archive file itself"
        )
    return scan_archive_file(p)


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


def scan_s3_prefix(s3: S3Client, uri: S3Uri, skip: str | None = None) -> ArtifactScan:
    """Headers only: at most two ranged GETs per shard (length + header). Paths under SKIP are not
    the checkpoint's (a shared deployment's adapters, beside its served base)."""
    scan = ArtifactScan(source=str(uri), format="s3-prefix")
    listed = list(_list_prefix(s3, uri))
    check_prefix_keys(uri.key, [key for key, _size in listed])
    for key, size in listed:
        rel = key[len(uri.key) :]
        if rel.endswith("/") and not (skip and rel.startswith(skip)):
            scan.dirs.add(rel.rstrip("/"))
        if not rel or rel.endswith("/") or (skip and rel.startswith(skip)):
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

            add_header(scan, rel, size, header)
        elif is_read(rel, size):
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
        from botocore.exceptions import ClientError  # here: a local validate need not load botocore (~6 MB)

        try:
            uri = parse_s3_uri(source)
        except ValueError as exc:
            raise CheckpointUnreadable(
                printable(str(exc)[:300]), "an S3 source is s3://BUCKET/KEY.tar.gz or a prefix s3://BUCKET/PREFIX/"
            ) from None
        try:
            return scan_s3_prefix(s3, uri) if uri.is_prefix else scan_s3_object(s3, uri)
        except ClientError as exc:
            # AccessDenied, NoSuchBucket, a wrong region: the artifact cannot be read, say which way.
            err = exc.response.get("Error", {})
            raise CheckpointUnreadable(
                f"cannot read {source}: {err.get('Code')}: {err.get('Message')}",
                "check the URI, the bucket's region and read permission (s3:GetObject, s3:ListBucket)",
            ) from None
    try:
        return scan_local(os.fspath(source))
    except OSError as exc:  # a name too long, a permission, a loop: the path cannot be read
        raise CheckpointUnreadable(
            f"cannot read {printable(source[:200])}: {exc.strerror or exc}", "pass a readable directory or archive"
        ) from None
