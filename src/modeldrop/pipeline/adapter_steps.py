"""ValidateCheckpoint's second half for an adapter deployment: the adapter written beside its base's
served copy (`adapters/<name>/`, where LMI looks and the vLLM/SGLang env points) and judged against it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.aws.artifact_version import prefix_objects, prefix_version
from modeldrop.aws.served_copy import copy_items, copy_pinned, served_key
from modeldrop.aws.served_writer import ServedPrefixWriter, open_pinned
from modeldrop.checkpoint.adapter_validation import validate_adapter
from modeldrop.checkpoint.artifact_scan import scan_s3_prefix
from modeldrop.checkpoint.tar_scan import scan_tar_stream
from modeldrop.checkpoint.validation import refused_report
from modeldrop.checkpoint.validation_report import ValidationReport
from modeldrop.contracts.artifact import Artifact, is_compressed
from modeldrop.contracts.errors import CheckpointRefused, CheckpointUnreadable

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

from modeldrop.checkpoint.adapter_validation import ADAPTERS_DIR


def adapter_location(served: Artifact, name: str) -> Artifact:
    return Artifact(served.bucket, f"{served.key}{ADAPTERS_DIR}/{name}/")


def serve_adapter(
    s3: S3Client, adapter: Artifact, version: str | None, served: Artifact, name: str, base_report: ValidationReport
) -> ValidationReport:
    """Write the pinned adapter under the served base's `adapters/NAME/` and judge it against the base."""
    target = adapter_location(served, name)
    try:
        if adapter.is_prefix:
            objects = prefix_objects(s3, adapter.bucket, adapter.key)
            if version and prefix_version(objects) != version:
                raise CheckpointUnreadable(
                    f"{adapter} changed while it was being deployed", "upload the adapter completely, then start again"
                )
            for item in copy_items(objects, adapter):
                copy_pinned(
                    s3, adapter.bucket, adapter.key + item.key, item.etag, served_key(target, item.key), item.size
                )
            scan = scan_s3_prefix(s3, target)
        else:
            with ServedPrefixWriter(s3, target) as writer:
                scan = scan_tar_stream(
                    open_pinned(s3, adapter, version), str(adapter), is_compressed(adapter.key), writer
                )
    except CheckpointRefused as exc:
        if exc.code is None:
            raise
        return refused_report(str(adapter), adapter.kind, exc)
    except ClientError as exc:
        raise CheckpointUnreadable(
            f"cannot read the adapter {adapter}: {exc.response.get('Error', {}).get('Code')}",
            "check that the adapter still exists, unchanged since the deployment started",
        ) from None
    scan.source = str(adapter)
    return validate_adapter(scan, scan_s3_prefix(s3, served), base_report)
