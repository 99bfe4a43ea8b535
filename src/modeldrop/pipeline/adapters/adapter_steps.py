"""ValidateCheckpoint's second half for an adapter deployment: the adapter written beside its base's
served copy (`adapters/<name>/`, where LMI looks and the vLLM/SGLang env points) and judged against it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.s3.adapter_archive import pack_prefix
from modeldrop.aws.s3.artifact_version import prefix_objects, prefix_version
from modeldrop.aws.s3.served_copy import copy_items, copy_pinned, delete_versions, served_key
from modeldrop.aws.s3.served_writer import ServedPrefixWriter, open_pinned
from modeldrop.checkpoint.adapter_validation import adapter_info, validate_adapter
from modeldrop.checkpoint.archive.artifact_scan import scan_s3_prefix
from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.archive.tar_scan import scan_tar_stream
from modeldrop.checkpoint.validation import refused_report
from modeldrop.checkpoint.validation_report import ValidationReport
from modeldrop.contracts.artifact import Artifact, is_compressed
from modeldrop.contracts.errors import CheckpointRefused, CheckpointUnreadable, RequestInvalid, StepContractViolated
from modeldrop.contracts.models import AdapterInfo, DeploymentRequest
from modeldrop.contracts.served import adapter_name
from modeldrop.pipeline.reports import put_json, report_prefix

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

from modeldrop.checkpoint.adapter_validation import ADAPTERS_DIR

# Shared mode keeps its adapters out of LMI's adapters/ folder (which the base would load at start):
# each reaches the engine through its own adapter inference component instead.
SHARED_DIR = "lora"


def adapter_location(served: Artifact, name: str, folder: str = ADAPTERS_DIR) -> Artifact:
    return Artifact(served.bucket, f"{served.key}{folder}/{name}/")


def serve_adapter(
    s3: S3Client,
    adapter: Artifact,
    version: str | None,
    served: Artifact,
    name: str,
    base: tuple[ArtifactScan | None, ValidationReport],
    folder: str = ADAPTERS_DIR,
) -> ValidationReport:
    """Write the pinned adapter under the served base's `FOLDER/NAME/` and judge it against the
    base, as its validating pass scanned and judged it (the base is not read again)."""
    target = adapter_location(served, name, folder)
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
    return validate_adapter(scan, *base)


def adapter_fields(request: DeploymentRequest) -> dict[str, Any]:
    """An adapter deployment serves (and plans, copies, names) its base; the adapter rides along,
    validated against it. A request without a base has no adapter. In shared mode every adapter
    (artifact_uri, then `adapters`) becomes an adapter inference component on the base's endpoint."""
    if request.base_endpoint is not None:
        return _attached_fields(request)
    if request.base is None:
        if request.adapter_mode is not None or request.adapters:
            raise RequestInvalid(
                "adapter_mode or adapters is set but no base is named",
                "name the base checkpoint: base=s3://bucket/prefix/",
            )
        return {}
    shared = request.adapter_mode == "shared"
    if request.adapters and not shared:
        raise RequestInvalid(
            "several adapters are served on one base only in adapter_mode shared",
            "set adapter_mode shared, or deploy each adapter on its own",
        )
    if shared and request.engine not in (None, "lmi", "vllm"):
        raise RequestInvalid(
            f"adapter_mode shared serves adapters as adapter inference components, which the {request.engine} "
            "container does not take",
            "deploy with engine lmi or vllm (their servers implement SageMaker's adapter API: POST /adapters, and "
            "X-Amzn-SageMaker-Adapter-Identifier routing), or adapter_mode dedicated",
        )
    uris = [request.artifact_uri, *(request.adapters or [])]
    if request.base in uris:
        raise RequestInvalid("base and artifact_uri are the same artifact", "artifact_uri is the adapter")
    names = [adapter_name(uri.key) for uri in uris]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash or len(set(map(str, uris))) != len(uris):
        raise RequestInvalid(
            f"two adapters would share the name {clash[0] if clash else names[0]!r} (an adapter is named by its "
            "folder, or its archive)",
            "give each adapter its own folder name",
        )
    return {
        "artifact_uri": request.base,
        "adapter_uri": request.artifact_uri,
        "adapter_name": names[0],
        "adapter_mode": "shared" if shared else "dedicated",
        "more_adapters": [{"uri": uri, "name": name} for uri, name in zip(uris[1:], names[1:], strict=True)],
    }


def _attached_fields(request: DeploymentRequest) -> dict[str, Any]:
    """base_endpoint: the adapters join a live shared deployment's endpoint as further components."""
    if request.base is not None:
        raise RequestInvalid(
            "both base and base_endpoint are set",
            "name the base once: base (a checkpoint, for a new endpoint) or base_endpoint (a live shared deployment)",
        )
    if request.adapter_mode not in (None, "shared") or request.engine not in (None, "lmi"):
        raise RequestInvalid(
            "base_endpoint adds adapter inference components: adapter_mode shared, on the LMI container",
            "drop adapter_mode and engine, or set them to shared and lmi",
        )
    uris = [request.artifact_uri, *(request.adapters or [])]
    names = [adapter_name(uri.key) for uri in uris]
    clash = sorted({n for n in names if names.count(n) > 1})
    if clash:
        raise RequestInvalid(f"two adapters would share the name {clash[0]!r}", "give each adapter its own folder name")
    return {
        "adapter_uri": request.artifact_uri,
        "adapter_name": names[0],
        "adapter_mode": "shared",
        "more_adapters": [{"uri": uri, "name": name} for uri, name in zip(uris[1:], names[1:], strict=True)],
    }


@dataclass(frozen=True)
class AdapterSource:
    uri: Artifact
    name: str
    version: str | None = None

    @classmethod
    def of(cls, uri: Artifact | None, name: str | None, version: str | None) -> AdapterSource | None:
        """The adapter a Validate event names (NormalizeRequest names every adapter), or None."""
        if uri is None:
            return None
        if not name:
            raise StepContractViolated(f"internal error: the adapter {uri} reached validation with no name")
        return cls(uri, name, version)


def judge_adapter(
    s3: S3Client,
    deployment_id: str,
    artifact: Artifact,
    served: Artifact,
    base: tuple[ArtifactScan | None, ValidationReport],
    adapter: AdapterSource,
    shared: bool = False,
) -> AdapterInfo:
    """The adapter beside the base's served copy, judged against the base's scan and report. Shared,
    it is then packed as the .tar.gz its adapter inference component is given, and only that stays."""
    folder = SHARED_DIR if shared else ADAPTERS_DIR
    report = serve_adapter(s3, adapter.uri, adapter.version, served, adapter.name, base, folder)
    bucket, prefix = report_prefix(artifact, deployment_id)
    report_name = f"adapter-validation-{adapter.name}.json" if shared else "adapter-validation.json"
    uri = put_json(s3, bucket, prefix + report_name, report)
    if not report.deployable:
        errors = [f for f in report.findings if f.severity == "error"]
        more = f" (+{len(errors) - 1} more findings)" if len(errors) > 1 else ""
        raise CheckpointRefused(
            f"{errors[0].code}: {errors[0].message}{more}; the adapter {adapter.name!r}'s report: {uri}",
            errors[0].hint,
        )
    info = adapter_info(report, adapter.name, adapter.version, uri)
    if shared:
        location = adapter_location(served, adapter.name, folder)
        info.artifact_url = pack_prefix(s3, location, f"{served.key}{folder}/{adapter.name}.tar.gz")
        # Stored once: the component loads the archive, and the base (which downloads its whole
        # prefix) would download the unpacked folder a second time for nothing.
        delete_versions(s3, location.bucket, location.key)
    return info
