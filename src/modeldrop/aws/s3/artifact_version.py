"""Which version of an artifact a deployment is for, read from S3 (the adapter behind the claim)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, NamedTuple

from botocore.exceptions import ClientError

from modeldrop.checkpoint.archive.archive_rules import check_prefix_keys
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import CheckpointUnreadable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import ObjectTypeDef


class ArtifactFacts(NamedTuple):
    identity: str  # the URI at its content (an archive's ETag, a prefix's listing digest): what a deployment claims
    version: str
    size_bytes: int  # the archive's size, or the sum of the prefix's objects
    objects: list[ObjectTypeDef]  # a prefix's listing (empty for an archive)


def artifact_facts(s3: S3Client, uri: Artifact) -> ArtifactFacts:
    """The artifact as it is now: its version and size, from one HEAD or one listing.

    An archive's version is its S3 VersionId (its ETag in an unversioned bucket); a prefix's is a
    digest of every object's key and ETag under it, so any change to the prefix is a new version.
    """
    objects: list[ObjectTypeDef] = []
    try:
        if not uri.is_prefix:
            head = s3.head_object(Bucket=uri.bucket, Key=uri.key)
            version = str(head.get("VersionId") or "null")
            if version == "null":
                version = "etag:" + str(head.get("ETag", "")).strip('"')
            size = int(head.get("ContentLength", 0))
        else:
            objects = prefix_objects(s3, uri.bucket, uri.key)
            if not objects:
                raise CheckpointUnreadable(f"{uri} holds no objects", "upload the checkpoint first")
            check_prefix_keys(uri.key, [o["Key"] for o in objects])
            version = prefix_version(objects)
            size = sum(int(o.get("Size", 0)) for o in objects)
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        raise CheckpointUnreadable(
            f"cannot read {uri}: {code or exc}", "check the URI and that the artifact was uploaded"
        ) from None
    # What a deployment claims is the content: the same bytes uploaded again (a new VersionId each time
    # in a versioned bucket, a burst of retries) are the same deployment, not another endpoint.
    content = version if uri.is_prefix else "etag:" + str(head.get("ETag", "")).strip('"')
    return ArtifactFacts(f"{uri}@{content}", version, size, objects)


def prefix_objects(s3: S3Client, bucket: str, prefix: str) -> list[ObjectTypeDef]:
    """Every object under PREFIX, as ListObjectsV2 gives them."""
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    return [obj for page in pages for obj in page.get("Contents", [])]


def prefix_version(objects: list[ObjectTypeDef]) -> str:
    """A prefix's version: a digest of every object's key and ETag, so any change is a new version."""
    digest = hashlib.sha256()
    for obj in objects:
        digest.update(f"{obj['Key']}\0{obj.get('ETag', '')}\n".encode())
    return f"objects:{len(objects)}:{digest.hexdigest()[:32]}"
