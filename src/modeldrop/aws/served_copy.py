"""What SageMaker serves is an immutable copy of exactly the version that was validated.

The artifact's key can be overwritten at any time; the copy under `modeldrop-served/<deployment>/`
is written once by this stack (server-side, from the pinned version) and deleted with the
deployment. Keys under this prefix never start a deployment from their upload event.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.aws.artifact_version import prefix_objects, prefix_version
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import CheckpointUnreadable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, CopySourceTypeDef, ObjectTypeDef

SERVED_PREFIX = "modeldrop-served/"


def served_location(artifact: Artifact, deployment_id: str) -> Artifact:
    """Where the served copy of ARTIFACT lives: the same shape, under the deployment's own prefix."""
    base = f"{SERVED_PREFIX}{deployment_id}/"
    return Artifact(artifact.bucket, base if artifact.is_prefix else base + "model.tar.gz")


MARKER = "modeldrop.json"
REPORTS_DIR = "modeldrop-reports"
MAX_KEY_BYTES = 1024


def served_from_prefix(relative: str) -> bool:
    """Whether a prefix's object belongs to the model: not its marker, not a report folder (reports
    that an older modeldrop wrote inside a prefix), not a folder placeholder."""
    parts = relative.split("/")
    return bool(relative) and not relative.endswith("/") and relative != MARKER and REPORTS_DIR not in parts[:-1]


def served_key(target: Artifact, relative: str) -> str:
    key = target.key + relative
    if len(key.encode()) > MAX_KEY_BYTES:
        raise CheckpointUnreadable(
            f"{relative[:80]}... is too long to copy under {target.key}: the copy's key would pass S3's "
            f"{MAX_KEY_BYTES} bytes",
            "shorten the file's path inside the prefix",
        )
    return key


def version_id(version: str | None) -> str | None:
    """The VersionId to pin reads to (an unversioned bucket's 'etag:' version has none)."""
    return version if version and not version.startswith(("etag:", "objects:")) else None


def copy_pinned(s3: S3Client, source: Artifact, version: str | None, deployment_id: str) -> Artifact:
    """Server-side copy of the pinned version (every object of a prefix); returns the served copy."""
    target = served_location(source, deployment_id)
    try:
        if not source.is_prefix:
            pinned: CopySourceTypeDef = {"Bucket": source.bucket, "Key": source.key}
            if (pinned_id := version_id(version)) is not None:
                pinned["VersionId"] = pinned_id
            _copy(s3, pinned, target.bucket, target.key)
            return target
        objects = prefix_objects(s3, source.bucket, source.key)
        for obj in objects:
            relative = obj["Key"][len(source.key) :]
            if served_from_prefix(relative):
                _copy(s3, {"Bucket": source.bucket, "Key": obj["Key"]}, target.bucket, served_key(target, relative))
    except ClientError as exc:
        raise CheckpointUnreadable(
            f"cannot copy {source} for serving: {exc.response.get('Error', {}).get('Code')}",
            "check that the artifact still exists",
        ) from None
    # Listed again once copied: an object added, changed or removed while the copy ran is caught too.
    if version and (prefix_version(objects) != version or prefix_version(_listing(s3, source)) != version):
        delete_served(s3, target.bucket, deployment_id)
        raise CheckpointUnreadable(
            f"{source} changed while it was being deployed", "upload the prefix completely, then start again"
        )
    return target


def _listing(s3: S3Client, source: Artifact) -> list[ObjectTypeDef]:
    try:
        return prefix_objects(s3, source.bucket, source.key)
    except ClientError as exc:
        raise CheckpointUnreadable(f"cannot list {source}: {exc.response.get('Error', {}).get('Code')}") from None


MAX_SINGLE_COPY = 5 * 1024**3  # CopyObject's own limit
PART_BYTES = 512 * 1024**2
COPY_THREADS = 8


def _copy(s3: S3Client, source: CopySourceTypeDef, bucket: str, key: str) -> None:
    """A server-side copy in the calling thread: one CopyObject up to 5 GiB, else a multipart copy."""
    if "VersionId" in source:
        head = s3.head_object(Bucket=source["Bucket"], Key=source["Key"], VersionId=source["VersionId"])
    else:
        head = s3.head_object(Bucket=source["Bucket"], Key=source["Key"])
    size = int(head["ContentLength"])
    if size <= MAX_SINGLE_COPY:
        s3.copy_object(CopySource=source, Bucket=bucket, Key=key)
        return
    upload = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]

    def part(number: int, start: int) -> CompletedPartTypeDef:
        end = min(start + PART_BYTES, size) - 1
        etag = s3.upload_part_copy(
            Bucket=bucket, Key=key, UploadId=upload, PartNumber=number, CopySource=source,
            CopySourceRange=f"bytes={start}-{end}",
        )["CopyPartResult"]["ETag"]  # fmt: skip
        return {"PartNumber": number, "ETag": etag}

    try:
        # Parts copy in parallel (S3 does the work); only completing the upload creates the object.
        with ThreadPoolExecutor(max_workers=COPY_THREADS) as pool:
            parts = list(pool.map(lambda args: part(*args), enumerate(range(0, size, PART_BYTES), start=1)))
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts})
    except BaseException:
        s3.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload)
        raise


def served_digest(s3: S3Client, served: Artifact) -> str:
    """A digest of the served copy as it is now: every current object's key, version and ETag. Taken
    at validation and again before CreateModel: any write since (which the bucket policy refuses to
    all but the pipeline) shows as a different digest."""
    prefix = f"{SERVED_PREFIX}{served.key[len(SERVED_PREFIX) :].split('/', 1)[0]}/"
    digest = hashlib.sha256()
    count = 0
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=served.bucket, Prefix=prefix):
        latest = [v for v in page.get("Versions", []) if v.get("IsLatest")]
        deleted = [m for m in page.get("DeleteMarkers", []) if m.get("IsLatest")]
        for entry in sorted(latest, key=lambda v: v["Key"]):
            digest.update(f"{entry['Key']}\0{entry.get('VersionId')}\0{entry.get('ETag')}\n".encode())
            count += 1
        for marker in deleted:
            digest.update(f"{marker['Key']}\0deleted\n".encode())
    return f"served:{count}:{digest.hexdigest()[:32]}"


def verify_served(s3: S3Client, served: Artifact, expected: str | None) -> None:
    """Refuse to serve a copy that is no longer the one validated."""
    if expected is None:
        return
    now = served_digest(s3, served)
    if now != expected:
        raise CheckpointUnreadable(
            f"the served copy {served} changed after it was validated ({expected} then, {now} now): "
            "something other than this pipeline wrote to it",
            "check the artifact bucket's policy (only the pipeline may write modeldrop-served/) and deploy again",
        )


def delete_served_for(s3: S3Client, artifact: Artifact | None, deployment_id: str) -> list[str]:
    """delete_served in the bucket the served copy of ARTIFACT lives in (none: nothing to delete)."""
    if artifact is None:
        return []
    return delete_served(s3, artifact.bucket, deployment_id)


def delete_served(s3: S3Client, bucket: str, deployment_id: str) -> list[str]:
    """Delete every version of the deployment's served copy; returns what was deleted."""
    prefix = f"{SERVED_PREFIX}{deployment_id}/"
    deleted: list[str] = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        entries = [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
        if not entries:
            continue
        s3.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": e["Key"], "VersionId": e["VersionId"]} for e in entries], "Quiet": True},
        )
        deleted.extend(sorted({f"s3://{bucket}/{e['Key']}" for e in entries}))
    return deleted
