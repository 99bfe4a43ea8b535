"""What SageMaker serves is an immutable copy of exactly the version that was validated.

The artifact's key can be overwritten at any time; the copy under `modeldrop-served/<deployment>/`
is written once by this stack and deleted with the deployment: a prefix's objects copied
server-side (one Map iteration each, pinned by ETag), an archive's members written by the pass
that validates them (served_writer). Keys under this prefix never start a deployment.
"""

from __future__ import annotations

import hashlib
import heapq
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.aws.s3.artifact_version import prefix_objects, prefix_version
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import CheckpointUnreadable, TeardownIncomplete
from modeldrop.contracts.served import CopyItem

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, CopySourceTypeDef, ObjectTypeDef

SERVED_PREFIX = "modeldrop-served/"


def served_location(artifact: Artifact, deployment_id: str) -> Artifact:
    """Where the served copy of ARTIFACT lives: always a prefix (an archive is served as the files
    it holds), under the deployment's own prefix."""
    return Artifact(artifact.bucket, f"{SERVED_PREFIX}{deployment_id}/")


MARKER = "modeldrop.json"
REPORTS_DIR = "modeldrop-reports"
MAX_KEY_BYTES = 1024


# LMI loads every adapter under /opt/ml/model/adapters/ at start: only adapters modeldrop validated
# go there (a deployment's own, written by its validation), never a folder the base brought along.
UNSERVED_DIRS = ("adapters",)


def served_from_prefix(relative: str) -> bool:
    """Whether a prefix's object belongs to the model: not its marker, not a report folder (reports
    that an older modeldrop wrote inside a prefix), not a folder placeholder, not the base's own
    adapters/ folder (served unvalidated, LMI would load it)."""
    parts = relative.split("/")
    return (
        bool(relative)
        and not relative.endswith("/")
        and relative != MARKER
        and REPORTS_DIR not in parts[:-1]
        and not (len(parts) > 1 and parts[0] in UNSERVED_DIRS)
    )


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


def copy_items(objects: list[ObjectTypeDef], source: Artifact) -> list[CopyItem]:
    """What the served copy of a prefix is made of: each object an engine loads, pinned by its ETag."""
    items = []
    for obj in objects:
        relative = obj["Key"][len(source.key) :]
        if served_from_prefix(relative):
            items.append(CopyItem(key=relative, size=int(obj.get("Size", 0)), etag=str(obj.get("ETag", ""))))
    return items


# The copy Map's iterations at most: each costs the execution's history 7 events, which its 25,000
# must hold beside every other loop (a 1,000-file prefix is 100 batches, not 1,000 iterations).
MAX_COPY_BATCHES = 100


def copy_batches(items: list[CopyItem]) -> tuple[list[CopyItem], list[tuple[int, int]]]:
    """ITEMS in at most MAX_COPY_BATCHES batches of about equal bytes (the largest first into the
    lightest batch), reordered so that each batch is a contiguous range [start, end) of the list the
    Map slices from."""
    count = min(len(items), MAX_COPY_BATCHES)
    bins: list[list[CopyItem]] = [[] for _ in range(count)]
    loads = [(0, i) for i in range(count)]
    heapq.heapify(loads)
    for item in sorted(items, key=lambda it: (-it.size, it.key)):
        load, index = heapq.heappop(loads)
        bins[index].append(item)
        heapq.heappush(loads, (load + item.size, index))
    ordered: list[CopyItem] = []
    ranges: list[tuple[int, int]] = []
    for batch in bins:
        ranges.append((len(ordered), len(ordered) + len(batch)))
        ordered += sorted(batch, key=lambda it: it.key)
    return ordered, ranges


def served_matches(
    s3: S3Client, source: Artifact, version: str | None, served: Artifact, items: list[CopyItem]
) -> None:
    """The served copy holds exactly ITEMS (every path, every size), and the source is still at VERSION:
    a prefix changed while its shards were copied is refused (each copy was pinned by ETag as well)."""
    if version and prefix_version(_listing(s3, source)) != version:
        raise CheckpointUnreadable(
            f"{source} changed while it was being deployed", "upload the prefix completely, then start again"
        )
    held = {o["Key"][len(served.key) :]: int(o.get("Size", 0)) for o in _listing(s3, served)}
    wanted = {item.key: item.size for item in items}
    if held != wanted:
        missing = sorted(set(wanted) - set(held))[:3]
        extra = sorted(set(held) - set(wanted))[:3]
        raise CheckpointUnreadable(
            f"the served copy of {source} is not the prefix that was listed (missing {missing}, unexpected {extra}, "
            f"{sum(1 for k in wanted if k in held and held[k] != wanted[k])} of another size)",
            "deploy again: a copy was interrupted",
        )


def _listing(s3: S3Client, source: Artifact) -> list[ObjectTypeDef]:
    try:
        return prefix_objects(s3, source.bucket, source.key)
    except ClientError as exc:
        raise CheckpointUnreadable(f"cannot list {source}: {exc.response.get('Error', {}).get('Code')}") from None


MIN_PART = 8 * 1024**2  # S3's least part is 5 MiB
MAX_PART = 512 * 1024**2
MULTIPART_FROM = 64 * 1024**2  # larger objects copy as parallel parts (S3 copies each part itself)
COPY_THREADS = 8


def copy_part_size(size: int) -> int:
    """Parts for an object of SIZE: about 16 (so a few threads keep S3 busy), within S3's bounds
    (5 MiB to 5 GiB, at most 10,000 parts)."""
    return max(MIN_PART, min(MAX_PART, -(-size // 16)), -(-size // 10_000))


def copy_pinned(s3: S3Client, bucket: str, source_key: str, etag: str, target_key: str, size: int) -> int:
    """Server-side copy of SOURCE_KEY as it was listed (CopySourceIfMatch: a changed object is
    PreconditionFailed); returns the number of parts (1: a single CopyObject)."""
    source: CopySourceTypeDef = {"Bucket": bucket, "Key": source_key}
    if size <= MULTIPART_FROM:
        s3.copy_object(CopySource=source, CopySourceIfMatch=etag, Bucket=bucket, Key=target_key)
        return 1
    part_bytes = copy_part_size(size)
    upload = s3.create_multipart_upload(Bucket=bucket, Key=target_key)["UploadId"]

    def part(number: int, start: int) -> CompletedPartTypeDef:
        end = min(start + part_bytes, size) - 1
        etag_out = s3.upload_part_copy(
            Bucket=bucket, Key=target_key, UploadId=upload, PartNumber=number, CopySource=source,
            CopySourceIfMatch=etag, CopySourceRange=f"bytes={start}-{end}",
        )["CopyPartResult"]["ETag"]  # fmt: skip
        return {"PartNumber": number, "ETag": etag_out}

    try:
        # Parts copy in parallel (S3 does the work); only completing the upload creates the object.
        with ThreadPoolExecutor(max_workers=COPY_THREADS) as pool:
            parts = list(pool.map(lambda args: part(*args), enumerate(range(0, size, part_bytes), start=1)))
        s3.complete_multipart_upload(Bucket=bucket, Key=target_key, UploadId=upload, MultipartUpload={"Parts": parts})
    except BaseException:
        s3.abort_multipart_upload(Bucket=bucket, Key=target_key, UploadId=upload)
        raise
    return len(parts)


def abort_incomplete(s3: S3Client, bucket: str, deployment_id: str) -> list[str]:
    """Abort every multipart upload left open under the deployment's served prefix (a Lambda killed
    mid-copy never runs its own abort); returns what was aborted."""
    prefix = f"{SERVED_PREFIX}{deployment_id}/"
    aborted = []
    for page in s3.get_paginator("list_multipart_uploads").paginate(Bucket=bucket, Prefix=prefix):
        for upload in page.get("Uploads", []):
            s3.abort_multipart_upload(Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            aborted.append(f"s3://{bucket}/{upload['Key']} (upload {upload['UploadId'][:12]})")
    return aborted


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
    """Delete every version of the deployment's served copy, and abort its incomplete uploads;
    returns what was deleted."""
    deleted: list[str] = abort_incomplete(s3, bucket, deployment_id)
    return deleted + delete_versions(s3, bucket, f"{SERVED_PREFIX}{deployment_id}/")


def delete_versions(s3: S3Client, bucket: str, prefix: str) -> list[str]:
    """Delete every version (and delete marker) under PREFIX of the served copies; returns the keys."""
    if not prefix.startswith(SERVED_PREFIX) or not prefix.endswith("/"):
        raise ValueError(f"not a folder of the served copies: {prefix}")
    deleted: list[str] = []
    for page in s3.get_paginator("list_object_versions").paginate(Bucket=bucket, Prefix=prefix):
        entries = [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
        if not entries:
            continue
        answer = s3.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": e["Key"], "VersionId": e["VersionId"]} for e in entries], "Quiet": True},
        )
        # S3 answers 200 with the keys it could not delete in Errors (AccessDenied, ...): those stay.
        failed = answer.get("Errors") or []
        if failed:
            first = failed[0]
            raise TeardownIncomplete(
                f"could not delete {len(failed)} object(s) of the served copy s3://{bucket}/{prefix}, e.g. "
                f"{first.get('Key')}: {first.get('Code')} {first.get('Message', '')}".rstrip(),
                "the bucket policy lets only the pipeline's roles delete served copies; the reaper retries",
            )
        deleted.extend(sorted({f"s3://{bucket}/{e['Key']}" for e in entries}))
    return deleted
