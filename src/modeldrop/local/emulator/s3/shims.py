"""S3 as strict as the service, where moto 5.2.5 is not.

- CopyObject keeps a multipart object's composite checksum value but drops its type and part
  count, so every GET of the copy fails the SDK's checksum validation; keep all three, as S3 does.
- CopyObject and UploadPartCopy ignore `x-amz-copy-source-if-match`: S3 answers 412
  PreconditionFailed when the source's ETag differs (how a copy is pinned to the listed object).
- ListMultipartUploads reports every upload as initiated on 2010-11-10: report when it was (the
  reaper judges an orphan upload by its age).
- PutObject and UploadPart accept an x-amz-checksum-<crc32|sha1|sha256> header that does not match
  the body, and CompleteMultipartUpload of an upload created for a checksum accepts parts without
  theirs: S3 answers BadDigest, and InvalidRequest naming the part, instead.
- moto judges GetObject/PutObject by the bucket policy while ignoring the conditions it does not
  know (a Bool on aws:SecureTransport denies every request); local.iam_enforcement evaluates bucket
  policies with their conditions instead, for every S3 call a function makes.
"""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="method-assign,assignment,unused-ignore,attr-defined"
from __future__ import annotations

from typing import Any

_installed = False


def install() -> None:
    """Apply the patches once per process."""
    global _installed
    if _installed:
        return
    _patch_s3_copy_checksums()
    _patch_s3_copy_preconditions()
    _patch_s3_upload_times()
    _patch_s3_object_times()
    _patch_s3_bucket_policy()
    _patch_s3_checksum_digests()
    _installed = True


MOTO_INITIATED = "2010-11-10T20:48:33.000Z"


def _patch_s3_upload_times() -> None:
    from datetime import UTC, datetime

    from moto.s3.models import FakeMultipart
    from moto.s3.responses import S3Response

    original_init = FakeMultipart.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.initiated = datetime.now(UTC)

    original_list = S3Response.list_multipart_uploads

    def list_multipart_uploads(self: Any) -> Any:
        status, headers, body = original_list(self)
        prefix = self.querystring.get("prefix", [""])[0] or ""
        uploads = [
            u for u in self.backend.list_multipart_uploads(self.bucket_name).values() if u.key_name.startswith(prefix)
        ]
        text = body.decode() if isinstance(body, bytes) else body
        for upload in uploads:  # the response lists them in this order, each with moto's fixed date
            stamp = getattr(upload, "initiated", None)
            if stamp is not None:
                text = text.replace(
                    MOTO_INITIATED, stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z", 1
                )
        return status, headers, text.encode() if isinstance(body, bytes) else text

    FakeMultipart.__init__ = init
    S3Response.list_multipart_uploads = list_multipart_uploads


def _patch_s3_object_times() -> None:
    """An object's LastModified on the emulator's clock, as every other service's times are: a run that
    advances it (a TTL, a grace period) times an upload against the same clock that times its serving."""
    import moto.s3.models as s3_models

    from modeldrop.contracts import clock

    s3_models.utcnow = lambda: clock.utcnow().replace(tzinfo=None)  # type: ignore[attr-defined]


def _patch_s3_copy_preconditions() -> None:
    from urllib.parse import parse_qs, unquote, urlparse

    from moto.s3.exceptions import PreconditionFailed
    from moto.s3.responses import S3Response

    def guarded(original: Any) -> Any:
        def call(self: Any) -> Any:
            expected = self.headers.get("x-amz-copy-source-if-match")
            if expected is not None:
                source = self.headers.get("x-amz-copy-source")
                if isinstance(source, bytes):
                    source = source.decode("utf-8")
                parsed = urlparse(source)
                bucket, key = unquote(parsed.path).lstrip("/").split("/", 1)
                version = parse_qs(parsed.query).get("versionId", [None])[0]
                current = self.backend.get_object(bucket, key, version_id=version)
                if current is not None and expected.strip('"') != current.etag.strip('"'):
                    raise PreconditionFailed(failed_condition="x-amz-copy-source-If-Match")
            return original(self)

        return call

    S3Response.copy_object = guarded(S3Response.copy_object)
    S3Response.upload_part_copy = guarded(S3Response.upload_part_copy)


def _patch_s3_copy_checksums() -> None:
    from moto.s3.models import S3Backend

    original = S3Backend.copy_object

    def copy_object(self: Any, src_key: Any, dest_bucket_name: str, dest_key_name: str, *a: Any, **kw: Any) -> Any:
        result = original(self, src_key, dest_bucket_name, dest_key_name, *a, **kw)
        if getattr(src_key, "checksum_type", None):
            copied = self.get_bucket(dest_bucket_name).keys.get(dest_key_name)
            if copied is not None and copied.checksum_value == src_key.checksum_value:
                copied.checksum_type = src_key.checksum_type
                copied.checksum_parts = src_key.checksum_parts
        return result

    S3Backend.copy_object = copy_object


def _patch_s3_bucket_policy() -> None:
    from moto.iam.access_control import PermissionResult
    from moto.s3.models import FakeBucket

    def get_permission(self: Any, action: str, resource: str) -> Any:
        return PermissionResult.NEUTRAL  # judged by local.iam_enforcement, conditions included

    FakeBucket.get_permission = get_permission


# The checksums verified exactly here (moto's helper falls back to CRC32 for CRC32C without its library).
_VERIFIED = ("CRC32", "SHA1", "SHA256")


def _patch_s3_checksum_digests() -> None:
    from xml.dom import minidom

    from moto.s3.exceptions import S3ClientError
    from moto.s3.responses import S3Response
    from moto.s3.utils import compute_checksum

    class BadDigest(S3ClientError):
        def __init__(self, algorithm: str) -> None:
            super().__init__("BadDigest", f"The {algorithm} you specified did not match the calculated checksum.")

    class ChecksumRequired(S3ClientError):
        def __init__(self, algorithm: str, part: int) -> None:
            super().__init__(
                "InvalidRequest",
                f"The upload was created using a {algorithm.lower()} checksum. The complete request must include "
                f"the checksum for each part. It was missing for part {part} in the request.",
            )

    def verified(original: Any) -> Any:
        def call(self: Any) -> Any:
            chunked = "aws-chunked" in str(self.headers.get("content-encoding", ""))
            for algorithm in _VERIFIED if not chunked else ():
                given = self.headers.get(f"x-amz-checksum-{algorithm.lower()}")
                body = self.body if isinstance(self.body, bytes) else bytes(self.body or b"")
                if given and compute_checksum(body, algorithm).decode() != given:
                    raise BadDigest(algorithm)
            return original(self)

        return call

    original_body = S3Response._complete_multipart_body

    def complete_body(self: Any, body: bytes) -> Any:
        upload = self.backend.get_bucket(self.bucket_name).multiparts.get(self._get_param("uploadId"))
        algorithm = str((upload.metadata.get("x-amz-checksum-algorithm") if upload else None) or "").upper()
        if algorithm:
            for part in minidom.parseString(body).getElementsByTagName("Part"):
                number = int(part.getElementsByTagName("PartNumber")[0].firstChild.wholeText)  # type: ignore[union-attr]
                if not part.getElementsByTagName(f"Checksum{algorithm}"):
                    raise ChecksumRequired(algorithm, number)
        return original_body(self, body)

    S3Response.put_object = verified(S3Response.put_object)
    S3Response.upload_part = verified(S3Response.upload_part)
    S3Response._complete_multipart_body = complete_body
