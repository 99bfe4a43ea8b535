"""RegisterDeployment: the record, the artifact claim (one version, or one adapter set on one base,
is one deployment), the attached base (base_endpoint), and the door's size and preflight checks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.s3.artifact_version import artifact_facts
from modeldrop.aws.s3.served_copy import copy_batches, copy_items
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import (
    ArchiveTooLarge,
    CheckpointUnreadable,
    DuplicateDeployment,
)
from modeldrop.contracts.models import (
    NormalizedRequest,
)
from modeldrop.pipeline.adapters.attach_steps import resolve_base
from modeldrop.pipeline.deployment.preflight import preflight
from modeldrop.serving.memory_plan import hourly_price, instance_catalog

if TYPE_CHECKING:
    from mypy_boto3_iam import IAMClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_service_quotas import ServiceQuotasClient


# A prefix's objects each become one Map iteration; the list travels in the execution's state
# (256 KiB at most), so a prefix of more files than this is refused at the door.
MAX_COPY_ITEMS = 1000
MAX_COPY_LIST_BYTES = 160_000  # keys may be 1 KiB each: the count alone does not bound the list


def register(
    registry: Registry, s3: S3Client, req: NormalizedRequest, region: str, sm: SageMakerClient | None = None
) -> dict[str, Any]:
    """Create the record, then claim the artifact version: a second deployment of it fails here."""
    try:
        facts, identity, adapter_version, more = _artifact_claim(s3, req)
    except CheckpointUnreadable:
        # The record first even so: the failure path writes to it, and `status` / `list` find it.
        _record(registry, req, region, None)
        raise
    created = _record(registry, req, region, facts.version)
    # After the record exists, so that a refusal shows in `modeldrop status`.
    attached = resolve_base(registry, sm, req.base_endpoint) if req.base_endpoint else None
    if attached is not None:
        identity = f"{identity} on {attached.endpoint_name}"
    holder = registry.claim_artifact(identity, req.deployment_id)
    if holder is not None:
        raise DuplicateDeployment(
            f"{identity} is already deployed by {holder.deployment_id} "
            f"(status {holder.status}, endpoint {holder.endpoint_name}); nothing was created"
        )
    items = copy_items(facts.objects, req.artifact_uri) if req.artifact_uri.is_prefix and not attached else []
    items, batches = copy_batches(items)
    return {
        "deployment_id": req.deployment_id,
        "created": created,
        "artifact_version": facts.version,
        "adapter_version": adapter_version,
        "more_adapters": more,
        "attach": attached.model_dump() if attached else None,
        "size_bytes": facts.size_bytes,
        "copy_items": [item.model_dump() for item in items],
        "copy_batches": [list(b) for b in batches],  # [start, end) of copy_items: one Map iteration each
    }


def _artifact_claim(s3: S3Client, req: NormalizedRequest) -> tuple[Any, str, str | None, list[dict[str, Any]]]:
    """The artifact's facts and the identity a deployment claims: its version, and its adapters'."""
    facts = artifact_facts(s3, req.artifact_uri)
    identity, version = facts.identity, facts.version
    adapter_version = None
    if req.base_endpoint:  # artifact_uri is the first adapter; the base is another deployment's copy
        adapter_version = version
    elif req.adapter_uri is not None:  # one adapter version on one base version is one deployment
        adapter = artifact_facts(s3, req.adapter_uri)
        identity, adapter_version = f"{adapter.identity} on {identity}", adapter.version
    more = []
    for named in req.more_adapters:  # shared mode: every adapter's version is pinned, and part of the claim
        facts_of = artifact_facts(s3, named.uri)
        identity = f"{facts_of.identity} + {identity}"
        more.append({**named.model_dump(mode="json"), "version": facts_of.version})
    return facts, identity, adapter_version, more


def _record(registry: Registry, req: NormalizedRequest, region: str, version: str | None) -> bool:
    # On another deployment's endpoint, the instance (and its price) is that deployment's.
    price = None if req.base_endpoint else hourly_price(req.instance_type, region)
    return registry.register(
        req.deployment_id,
        req.execution_name,
        req.model_dump(mode="json"),
        {
            "artifact_uri": str(req.artifact_uri),
            "engine": req.engine,
            "instance_type": req.instance_type,
            "instance_count": req.instance_count,
            "endpoint_name": req.resource_name,
            "hourly_price": str(price) if price is not None else None,
            "price_read_on": instance_catalog()["price_read_on"] if price is not None else None,
            "region": region,
            "artifact_version": version,
        },
        execution_arn=req.execution_arn,
    )


@dataclass
class RegisterClients:
    s3: S3Client
    iam: IAMClient
    quotas: ServiceQuotasClient
    sagemaker: SageMakerClient | None = None  # resolves a base_endpoint given as an endpoint name


def register_and_check(
    registry: Registry,
    aws: RegisterClients,
    req: NormalizedRequest,
    region: str,
    role_arn: str,
    max_archive_gb: float,
    ceiling: StackCeiling | None = None,
) -> dict[str, Any]:
    """RegisterDeployment: the record and the artifact claim, then the preflight -- after the record
    exists, so that a refusal there is recorded (and shown by `modeldrop status`)."""
    registered = register(registry, aws.s3, req, region, aws.sagemaker)
    if registered["attach"]:  # nothing to copy, and no endpoint of its own to check the role or quota for
        return registered
    check_size(req.artifact_uri, registered["size_bytes"], registered["copy_items"], max_archive_gb)
    if ceiling is not None:  # before anything is copied or created
        registry.reserve_budget(
            req.deployment_id, worst_hourly(req, region), req.instance_count, ceiling.hourly, ceiling.instances
        )
    preflight(registry, aws.iam, aws.quotas, req, role_arn)
    return registered


@dataclass(frozen=True)
class StackCeiling:
    hourly: float  # USD/h for everything live (MaxStackHourlyPrice)
    instances: int  # instances live at once (MaxStackInstances)


def worst_hourly(req: NormalizedRequest, region: str) -> float:
    """The most the deployment may bill per hour: its dearest named type (the ceiling for `auto`)
    times its instances."""
    named = [req.instance_type, *[t for t in req.instance_types or [] if t != "auto"]]
    prices = [p for t in named if (p := hourly_price(t, region)) is not None]
    if "auto" in (req.instance_types or []) or not prices:
        prices.append(req.max_hourly_price or 0.0)
    return max(prices) * req.instance_count


def check_size(artifact: Artifact, size_bytes: int, items: list[dict[str, Any]], max_archive_gb: float) -> None:
    """Refuse at the door what ValidateCheckpoint could not finish within its 15 minutes: an archive
    is read whole by one Lambda; a prefix is copied by a Map (any size), one iteration per object."""
    upload = f"modeldrop upload MODEL_DIR s3://{artifact.bucket}/{artifact.folder}model/"
    if not artifact.is_prefix and size_bytes > max_archive_gb * 1e9:
        raise ArchiveTooLarge(
            f"{artifact} is {size_bytes / 1e9:.1f} GB: one validating pass reads and writes back at most "
            f"{max_archive_gb:g} GB within a Lambda's 15 minutes (the stack's MaxArchiveGB); nothing was copied or "
            "created",
            f"deploy the checkpoint as an uncompressed prefix (s3://bucket/prefix/, as SageMaker advises for large "
            f"models): {upload}",
        )
    listed = len(json.dumps(items))
    if len(items) > MAX_COPY_ITEMS or listed > MAX_COPY_LIST_BYTES:
        raise ArchiveTooLarge(
            f"{artifact} holds {len(items)} files whose list takes {listed / 1000:.0f} kB; a deployment serves at "
            f"most {MAX_COPY_ITEMS} files, listed in {MAX_COPY_LIST_BYTES // 1000} kB of the execution's 256 KiB state",
            "keep only the model's files under the prefix (config, tokenizer, safetensors shards and index)",
        )
    if artifact.is_prefix and not items:  # only the marker (or report folders): nothing to serve
        raise CheckpointUnreadable(
            f"{artifact} holds no model files, only its marker", f"upload the checkpoint's files first: {upload}"
        )
