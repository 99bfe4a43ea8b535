"""Put a checkpoint directory into the bucket as an S3 prefix, the way large models deploy.

Shards go up in parallel (s3transfer's multipart uploads), each part checksummed by S3 in transit
(SHA-256), so that a second run skips every object whose checksum S3 itself computed matches the
local file (resume); metadata anyone can write is never trusted for that. The `modeldrop.json`
marker goes last: the S3 starter starts the deployment from it, so a deployment never sees half a
prefix; when any file changed, the marker is written again, so the new version deploys.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError
from s3transfer.subscribers import BaseSubscriber

from modeldrop.aws.s3.served_copy import MARKER, served_from_prefix
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


CHUNK = 64 * 1024**2  # the multipart part size uploads use: S3's composite checksum is over parts of it


def file_digest(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def s3_checksums(path: Path, chunk: int = CHUNK) -> set[str]:
    """The SHA-256 checksums S3 may report for PATH uploaded by this module: of the whole object
    (single part), and composite over CHUNK-sized parts (multipart), with and without its -N suffix."""
    whole, parts = hashlib.sha256(), []
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            whole.update(block)
            parts.append(hashlib.sha256(block).digest())
    composite = base64.b64encode(hashlib.sha256(b"".join(parts)).digest()).decode()
    return {base64.b64encode(whole.digest()).decode(), composite, f"{composite}-{len(parts)}"}


def _already_there(s3: S3Client, bucket: str, key: str, size: int, path: Path | None, body: bytes = b"") -> bool:
    """The object at KEY holds exactly PATH's bytes (or BODY), by the checksum S3 computed on upload."""
    try:
        head = s3.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    reported = head.get("ChecksumSHA256")
    if int(head.get("ContentLength", -1)) != size or not reported:
        return False
    expected = s3_checksums(path) if path is not None else {base64.b64encode(hashlib.sha256(body).digest()).decode()}
    return reported in expected


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
        size = path.stat().st_size
        # Only an object listed at this size can be the same file; S3's own checksum says whether it is.
        if held.get(relative) == size and _already_there(s3, bucket, prefix + relative, size, path):
            summary.skipped.append(relative)
        else:
            pending.append((relative, path, size, file_digest(path)))
    total = sum(size for *_, size, _ in pending)
    add = progress.counter(total)
    config = config or TransferConfig(max_concurrency=8, multipart_chunksize=CHUNK)
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
    if marker:  # a changed file under an unchanged marker: the marker again, so that version deploys
        _write_marker(s3, bucket, prefix, overrides or {}, summary, None if pending else held.get(MARKER))
    return summary


def _write_marker(
    s3: S3Client, bucket: str, prefix: str, overrides: dict[str, Any], summary: UploadSummary, held: int | None
) -> None:
    """The marker, unless the same one is already there (a second run starts no second deployment)."""
    body = json.dumps(overrides, sort_keys=True).encode()
    digest = hashlib.sha256(body).hexdigest()
    key = prefix + MARKER
    if held == len(body) and _already_there(s3, bucket, key, len(body), None, body):
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
