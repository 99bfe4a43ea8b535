"""Write an archive's validated members to the served prefix as the validating pass streams them.

SageMaker then loads uncompressed files (S3Prefix, CompressionType None): it starts without
extracting anything, and what it loads is, byte for byte, what the validator read -- the same
reader handed the same chunks to both. Memory is bounded: one part being filled and at most
`MAX_INFLIGHT` parts uploading, whatever the member's size.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from modeldrop.aws.s3.served_copy import served_from_prefix, served_key, version_id
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import CheckpointUnreadable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef


def open_pinned(s3: S3Client, artifact: Artifact, version: str | None) -> IO[bytes]:
    """The archive's body at the version the deployment claimed: its VersionId, or (unversioned) its
    ETag, so that an overwrite since registration is refused, never read."""
    pinned = version_id(version)
    try:
        if pinned is not None:
            body = s3.get_object(Bucket=artifact.bucket, Key=artifact.key, VersionId=pinned)["Body"]
        elif version and version.startswith("etag:"):
            body = s3.get_object(Bucket=artifact.bucket, Key=artifact.key, IfMatch=version[len("etag:") :])["Body"]
        else:
            body = s3.get_object(Bucket=artifact.bucket, Key=artifact.key)["Body"]
    except ClientError as exc:
        raise CheckpointUnreadable(
            f"cannot read {artifact} (version {version}): {exc.response.get('Error', {}).get('Code')}",
            "check that the artifact still exists; an overwritten unversioned archive must be deployed again",
        ) from None
    return cast(IO[bytes], body)


try:  # isal's CRC-32 is several times zlib's
    from isal.isal_zlib import crc32 as _crc
except ImportError:  # pragma: no cover - the layer ships isal
    _crc = zlib.crc32


def crc32_checksum(data: bytes) -> str:
    """S3's ChecksumCRC32 of DATA: base64 of the big-endian CRC-32."""
    return base64.b64encode((_crc(data) & 0xFFFFFFFF).to_bytes(4, "big")).decode()


def _checksum_in_header(request: Any, **_kwargs: Any) -> None:
    """Tell botocore's S3 signer where the caller's checksum is (it only looks for its own): with TLS
    and an x-amz-checksum-crc32 header S3 verifies, botocore signs UNSIGNED-PAYLOAD instead of
    hashing every byte with SHA-256, as it does for checksums it computes itself."""
    if "x-amz-checksum-crc32" in request.headers:
        request.context.setdefault("checksum", {})["request_algorithm"] = {
            "in": "header",
            "name": "x-amz-checksum-crc32",
            "algorithm": "crc32",
        }


def _sign_headers_only(s3: S3Client) -> None:
    for operation in ("UploadPart", "PutObject"):
        s3.meta.events.register(
            f"before-sign.s3.{operation}", _checksum_in_header, unique_id=f"modeldrop-checksum-{operation}"
        )


PART_BYTES = 64 * 1024**2
MAX_PARTS = 10_000  # S3's limit per upload: a larger member gets larger parts
MAX_INFLIGHT = 2


def part_size(size: int) -> int:
    """The part size for a member of SIZE bytes: 64 MiB, or larger so that it fits in S3's 10,000 parts."""
    needed = -(-size // MAX_PARTS)
    return max(PART_BYTES, -(-needed // (1024 * 1024)) * 1024 * 1024)


class _Member:
    """One member's upload: a single PutObject when it fits in a part, else a multipart upload whose
    parts go up on the writer's pool while the stream goes on.

    Each byte is copied once into its part (the chunks are joined exactly at the part's size). Each
    part carries its CRC-32 in a header, which S3 verifies (and checks again for the parts it
    assembles: the upload is created for CRC-32), so that the body is neither re-encoded as
    aws-chunked for a trailing checksum nor, over TLS, hashed for the signature."""

    def __init__(self, writer: ServedPrefixWriter, key: str, size: int) -> None:
        self._w, self._key, self._size = writer, key, size
        self._part = part_size(size)
        self._chunks: list[bytes] = []
        self._held = 0
        self._upload: str | None = None
        self._futures: list[Future[CompletedPartTypeDef]] = []
        self._written = 0

    def write(self, data: bytes) -> None:
        self._written += len(data)
        while data:
            room = self._part - self._held
            take, data = (data, b"") if len(data) <= room else (data[:room], data[room:])
            self._chunks.append(take)
            self._held += len(take)
            # The last part is sent by close(): a member that fits in one part is one PutObject.
            if self._held == self._part and (data or self._written < self._size):
                self._flush(b"".join(self._chunks))
                self._chunks, self._held = [], 0

    def _flush(self, part: bytes) -> None:
        w = self._w
        if self._upload is None:
            created = w.s3.create_multipart_upload(Bucket=w.bucket, Key=self._key, ChecksumAlgorithm="CRC32")
            self._upload = created["UploadId"]
            w.open_uploads[self._key] = self._upload
        number = len(self._futures) + 1
        w.slots.acquire()  # at most MAX_INFLIGHT parts held in memory while they upload
        self._futures.append(w.pool.submit(w.upload_part, self._key, self._upload, number, part))

    def close(self) -> None:
        w = self._w
        if self._written != self._size:
            raise CheckpointUnreadable(f"the archive ends inside {self._key} ({self._written} of {self._size} bytes)")
        rest = b"".join(self._chunks)
        self._chunks, self._held = [], 0
        if self._upload is None:
            w.s3.put_object(Bucket=w.bucket, Key=self._key, Body=rest, ChecksumCRC32=crc32_checksum(rest))
            return
        if rest:
            self._flush(rest)
        parts = [f.result() for f in self._futures]
        w.s3.complete_multipart_upload(
            Bucket=w.bucket, Key=self._key, UploadId=self._upload, MultipartUpload={"Parts": parts}
        )
        del w.open_uploads[self._key]


class ServedPrefixWriter:
    """The sink the archive scan tees each member into: `open(path, size)` then `write`s and `close()`.

    Used as a context manager: leaving it with an error aborts every upload still open, so an
    interrupted pass leaves no billed parts (a killed Lambda cannot: the served prefix's cleanup and
    the bucket's lifecycle rule for incomplete uploads do)."""

    def __init__(self, s3: S3Client, target: Artifact) -> None:
        if not target.is_prefix:
            raise ValueError(f"the served copy must be a prefix, not {target}")
        self.s3, self.bucket, self.target = s3, target.bucket, target
        _sign_headers_only(s3)
        self.pool = ThreadPoolExecutor(max_workers=MAX_INFLIGHT)
        self.slots = threading.BoundedSemaphore(MAX_INFLIGHT)
        self.open_uploads: dict[str, str] = {}

    def wants(self, relative: str) -> bool:
        """Whether the member at RELATIVE is served (the marker and report folders are not)."""
        return served_from_prefix(relative)

    def open(self, relative: str, size: int) -> _Member:
        return _Member(self, served_key(self.target, relative), size)

    def upload_part(self, key: str, upload: str, number: int, data: bytes) -> CompletedPartTypeDef:
        try:
            checksum = crc32_checksum(data)
            sent = self.s3.upload_part(
                Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=data, ChecksumCRC32=checksum
            )
            return {"PartNumber": number, "ETag": sent["ETag"], "ChecksumCRC32": checksum}
        finally:
            self.slots.release()

    def __enter__(self) -> ServedPrefixWriter:
        return self

    def __exit__(self, kind: object, exc: object, tb: object) -> None:
        self.pool.shutdown(wait=True)
        if exc is None:
            return
        for key, upload in list(self.open_uploads.items()):
            # Best effort: the served prefix's cleanup lists and aborts what is left.
            with contextlib.suppress(ClientError):
                self.s3.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
        self.open_uploads.clear()
