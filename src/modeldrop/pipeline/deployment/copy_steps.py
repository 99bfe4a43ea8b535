"""CopyShard: one iteration of the state machine's Map that copies a prefix to its served copy (a
batch of its objects: the Map's iterations are bounded by the execution's history).

The Map runs many of these at once (S3 copies each part itself), so no single Lambda holds the
whole copy, and a 140 GB prefix copies in the time of its largest object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.s3.served_copy import copy_pinned, delete_served, served_key, served_location
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import CheckpointUnreadable
from modeldrop.contracts.served import CopyBatchResult, CopyItem, CopyResult
from modeldrop.pipeline.deployment.ownership import released_if_ended

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def copy_batch(
    s3: S3Client, registry: Registry, deployment_id: str, owner: str, artifact: Artifact, items: list[CopyItem]
) -> CopyBatchResult:
    """Copy ITEMS (one Map iteration's batch) of the prefix ARTIFACT as it was listed at registration,
    one after the other: the deployment must still be live before each (a stopped execution's
    iteration stops there) and after the last (ended while it copied: the copy goes again)."""
    registry.live(deployment_id, owner)
    target = served_location(artifact, deployment_id)
    results = []
    with released_if_ended(registry, deployment_id, lambda: delete_served(s3, target.bucket, deployment_id)):
        for number, item in enumerate(items):
            if number:
                registry.live(deployment_id, owner)
            results.append(CopyResult(key=item.key, parts=_copy_one(s3, artifact, target, item)))
        registry.live(deployment_id, owner)
    return CopyBatchResult(results=results)


def _copy_one(s3: S3Client, artifact: Artifact, target: Artifact, item: CopyItem) -> int:
    """ITEM copied server-side, pinned by its listed ETag (a changed or deleted object is refused)."""
    try:
        return copy_pinned(
            s3, artifact.bucket, artifact.key + item.key, item.etag, served_key(target, item.key), item.size
        )
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        if code in ("PreconditionFailed", "412"):
            raise CheckpointUnreadable(
                f"{artifact}{item.key} changed while it was being deployed",
                "upload the prefix completely, then start again",
            ) from None
        if code in ("NoSuchKey", "404"):
            raise CheckpointUnreadable(
                f"{artifact}{item.key} was deleted while it was being deployed",
                "upload the prefix completely, then start again",
            ) from None
        raise
