"""Put a checkpoint directory into the bucket as an S3 prefix, the way large models deploy.

Shards go up in parallel (s3transfer's multipart uploads), each part checksummed by S3 in transit
(SHA-256) and each whole file's SHA-256 kept in its metadata, so that a second run skips every
object already there with the same size and digest (resume). The `modeldrop.json` marker goes
last: the S3 starter starts the deployment from it, so a deployment never sees half a prefix.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from s3transfer.subscribers import BaseSubscriber

from modeldrop.aws.served_copy import MARKER, served_from_prefix
from modeldrop.contracts import progress
from modeldrop.contracts.errors import RequestInvalid

if TYPE_CHECKING:
    from boto3.s3.transfer import TransferConfig
    from mypy_boto3_s3 import S3Client

DIGEST_KEY = "modeldrop-sha256"  # x-amz-meta-modeldrop-sha256: the whole file's SHA-256, hex


@dataclass
class UploadSummary:
    uri: str
    uploaded: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    bytes_uploaded: int = 0
    marker: str | None = None  # the marker's key, when this run wrote it
    marker_version: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "uri": self.uri,
            "uploaded": self.uploaded,
            "skipped": self.skipped,
            "bytes_uploaded": self.bytes_uploaded,
            "marker": self.marker,
            "marker_version": self.marker_version,
        }


def model_files(directory: Path) -> list[tuple[str, Path]]:
    """(relative key, path) of every file the prefix serves, in a stable order; links are refused
    (S3 has none, and a link could point out of the model)."""
    files = []
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory).as_posix()
        if path.is_symlink():
            raise RequestInvalid(f"{path} is a symbolic link", "upload a directory of regular files (cp -L)")
        if path.is_file() and served_from_prefix(relative):
            files.append((relative, path))
    if not files:
        raise RequestInvalid(f"{directory} holds no files to upload")
    return files


def file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _already_there(s3: S3Client, bucket: str, key: str, size: int, digest: str) -> bool:
    try:
        head = s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return int(head.get("ContentLength", -1)) == size and head.get("Metadata", {}).get(DIGEST_KEY) == digest


def _held(s3: S3Client, bucket: str, prefix: str) -> dict[str, int]:
    """What the prefix holds now: relative key -> size (one listing, for the strays and the resume)."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return {o["Key"][len(prefix) :]: int(o.get("Size", 0)) for page in pages for o in page.get("Contents", [])}


def upload_directory(
    s3: S3Client,
    directory: Path,
    bucket: str,
    prefix: str,
    *,
    marker: bool = True,
    overrides: dict[str, Any] | None = None,
    config: TransferConfig | None = None,
) -> UploadSummary:
    """Upload DIRECTORY's files under s3://BUCKET/PREFIX (ending in '/'), then the marker."""
    from boto3.s3.transfer import TransferConfig, create_transfer_manager

    if not prefix.endswith("/"):
        raise RequestInvalid(f"s3://{bucket}/{prefix} is not a prefix", f"end it with a slash: s3://{bucket}/{prefix}/")
    files = model_files(directory)
    held = _held(s3, bucket, prefix)
    local = {k for k, _ in files}
    strays = sorted(k for k in held if served_from_prefix(k) and k not in local)
    if strays:
        raise RequestInvalid(
            f"s3://{bucket}/{prefix} already holds {len(strays)} file(s) that are not in {directory}, e.g. "
            f"{', '.join(strays[:3])}: they would be served with the model",
            "upload to a new prefix, or delete them first",
        )
    summary = UploadSummary(uri=f"s3://{bucket}/{prefix}")
    pending = []
    for relative, path in files:
        size, digest = path.stat().st_size, file_digest(path)
        # Only an object listed at this size can be the same file: its digest is in its metadata (a HEAD).
        if held.get(relative) == size and _already_there(s3, bucket, prefix + relative, size, digest):
            summary.skipped.append(relative)
        else:
            pending.append((relative, path, size, digest))
    total = sum(size for *_, size, _ in pending)
    add = progress.counter(total)
    config = config or TransferConfig(max_concurrency=8, multipart_chunksize=64 * 1024**2)
    with create_transfer_manager(s3, config) as manager:
        futures = [
            manager.upload(
                str(path),
                bucket,
                prefix + relative,
                extra_args={"ChecksumAlgorithm": "SHA256", "Metadata": {DIGEST_KEY: digest}},
                subscribers=[_Progress(add)],
            )
            for relative, path, _size, digest in pending
        ]
        for future in futures:
            future.result()  # the first failure is raised; the marker is never written after one
    summary.uploaded = [relative for relative, *_ in pending]
    summary.bytes_uploaded = total
    if marker:
        _write_marker(s3, bucket, prefix, overrides or {}, summary, held.get(MARKER))
    return summary


def _write_marker(
    s3: S3Client, bucket: str, prefix: str, overrides: dict[str, Any], summary: UploadSummary, held: int | None
) -> None:
    """The marker, unless the same one is already there (a second run starts no second deployment)."""
    body = json.dumps(overrides, sort_keys=True).encode()
    digest = hashlib.sha256(body).hexdigest()
    key = prefix + MARKER
    if held == len(body) and _already_there(s3, bucket, key, len(body), digest):
        summary.skipped.append(MARKER)
        return
    put = s3.put_object(
        Bucket=bucket,
        Key=key,
        Body=body,
        ContentType="application/json",
        ChecksumAlgorithm="SHA256",
        Metadata={DIGEST_KEY: digest},
    )
    summary.marker, summary.marker_version = key, put.get("VersionId")


class _Progress(BaseSubscriber):
    """An s3transfer subscriber that adds the bytes sent to the caller's progress counter."""

    def __init__(self, add: Any) -> None:
        self._add = add

    def on_progress(self, future: Any, bytes_transferred: int, **kwargs: Any) -> None:
        self._add(bytes_transferred)
