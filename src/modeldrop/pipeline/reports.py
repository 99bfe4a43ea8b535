"""Where a deployment's reports go, and how one is written: next to an archive, or at the bucket's
root for a prefix (everything inside a prefix is the model the next deployment serves)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from modeldrop.contracts.artifact import Artifact

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def report_prefix(artifact: Artifact, deployment_id: str) -> tuple[str, str]:
    """(bucket, key prefix) for the reports: next to an archive; for a prefix, outside it (at the
    bucket's root), since everything inside a prefix is the model the next deployment serves."""
    folder = "" if artifact.is_prefix else artifact.folder
    return artifact.bucket, f"{folder}modeldrop-reports/{deployment_id}/"


def put_json(s3: S3Client, bucket: str, key: str, body: BaseModel | dict[str, Any]) -> str:
    data = body.model_dump_json(indent=2) if isinstance(body, BaseModel) else json.dumps(body, indent=2, default=str)
    s3.put_object(Bucket=bucket, Key=key, Body=data.encode(), ContentType="application/json")
    return f"s3://{bucket}/{key}"
