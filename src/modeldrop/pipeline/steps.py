"""The state machine's preparing steps as plain functions over clients (the handlers only wire them):
normalize, register, validate, resolve the image, plan. endpoint_steps and closing_steps hold the rest."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from modeldrop.aws.artifact_version import artifact_facts
from modeldrop.aws.registry import Registry
from modeldrop.aws.secret_refs import check_refs, for_container, parse_refs, refuse_collisions
from modeldrop.aws.served_copy import copy_items, delete_served, served_digest, served_location, served_matches
from modeldrop.aws.served_writer import ServedPrefixWriter, open_pinned
from modeldrop.checkpoint.validation import judge_source, validate_archive_stream
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import (
    ArchiveTooLarge,
    CheckpointRefused,
    CheckpointUnreadable,
    DuplicateDeployment,
    PlanRefused,
    RequestInvalid,
    StepContractViolated,
    describe_validation,
)
from modeldrop.contracts.instance_types import instance_type_problem
from modeldrop.contracts.models import (
    AdapterInfo,
    DeploymentRequest,
    NormalizedRequest,
    ValidationSummary,
    deployment_id_for,
    epoch_ms,
    resource_name_for,
)
from modeldrop.contracts.s3uri import parse_s3_uri
from modeldrop.contracts.served import CopyItem
from modeldrop.contracts.step_payloads import EnginePlan, ImageChoice
from modeldrop.evaluation.report import MetricSink
from modeldrop.pipeline.adapter_steps import AdapterSource, adapter_fields, judge_adapter
from modeldrop.pipeline.config import DefaultsSettings
from modeldrop.pipeline.ownership import released_if_ended
from modeldrop.pipeline.preflight import preflight
from modeldrop.pipeline.reports import put_json, report_prefix
from modeldrop.serving.image import resolve_image
from modeldrop.serving.instance_choice import AUTO, candidates, usable
from modeldrop.serving.memory_plan import hourly_price, instance_catalog
from modeldrop.serving.plan import plan_checkpoint

if TYPE_CHECKING:
    from mypy_boto3_iam import IAMClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_service_quotas import ServiceQuotasClient

    from modeldrop.checkpoint.validation import ValidationReport


def normalize(
    raw: Any, execution_name: str, defaults: DefaultsSettings, execution_arn: str, started: str | int
) -> NormalizedRequest:
    """The request checked and defaulted; its deployment id is unique to this execution (its name
    and start time), so no two executions ever share a record, a served copy or a resource name."""
    try:
        request = DeploymentRequest.model_validate(raw)
    except ValidationError as exc:
        raise RequestInvalid(f"invalid deployment request: {describe_validation(exc, limit=5)}") from None
    deployment_id = deployment_id_for(execution_name, epoch_ms(started))
    check_refs(request.secrets, defaults.secrets_prefix, engine_keys=set(request.engine_env))
    types = _requested_types(request)
    first = request.instance_type or (types[0] if types and types != [AUTO] else defaults.default_instance_type)
    problem = instance_type_problem(first)
    if problem:  # the stack's default is checked too: nothing may be created for a type that cannot serve
        raise RequestInvalid(*problem)
    ttl_hours = request.ttl_hours or defaults.default_ttl_hours
    limits = defaults.limits()
    named = [first, *[t for t in types or [] if t not in (AUTO, first)]]
    limits.check(request, named, defaults.aws_region, ttl_hours)
    _check_locations(request, defaults.artifact_bucket, deployment_id)
    # The stack's defaults, in this one place; every other field passes through as the request gave it.
    defaulted = {
        **adapter_fields(request),
        "deployment_id": deployment_id,
        "execution_name": execution_name,
        "execution_arn": execution_arn,
        # Adapter inference components need a container with SageMaker's adapter API (LMI).
        "engine": "lmi" if request.adapter_mode == "shared" else request.engine or defaults.default_engine,
        "instance_type": first,
        "instance_types": types,
        "ttl_hours": ttl_hours,
        "max_hourly_price": limits.price_ceiling(request.instance_count, request.max_hourly_price),
        "allowed_instance_types": list(limits.allowed_instance_types),
        "resource_name": _endpoint_name(request, defaults.resource_prefix, deployment_id),
        "deploy_deadline_seconds": defaults.deploy_deadline_seconds,
        "quota_wait_seconds": round(request.quota_wait_minutes * 60),
        "capacity_wait_seconds": round(request.capacity_wait_minutes * 60),
    }
    return NormalizedRequest.model_validate({**dict(request), **defaulted})


# S3's longest key; a report key adds this much to the artifact's folder.
MAX_KEY_BYTES = 1024
REPORT_KEY_EXTRA = len("modeldrop-reports/") + 64 + len("/validation.json")


def _check_locations(request: DeploymentRequest, artifact_bucket: str | None, deployment_id: str) -> None:
    """Everything the deployment reads is in the stack's bucket (its functions may read nothing
    else), and every key it will write next to the artifact fits S3's limit."""
    if artifact_bucket:
        located = {"artifact_uri": request.artifact_uri.bucket}
        if request.base is not None:
            located["base"] = request.base.bucket
        for i, uri in enumerate(request.adapters or []):
            located[f"adapters[{i}]"] = uri.bucket
        if request.eval_set_uri is not None:
            located["eval_set_uri"] = parse_s3_uri(request.eval_set_uri).bucket
        for field, bucket in located.items():
            if bucket != artifact_bucket:
                raise RequestInvalid(
                    f"{field} is in bucket {bucket}, but this stack reads only its artifact bucket {artifact_bucket}",
                    f"copy it into s3://{artifact_bucket}/ (the functions' roles can read nothing else)",
                )
    folder = request.artifact_uri.folder
    if len(folder.encode()) + REPORT_KEY_EXTRA > MAX_KEY_BYTES:
        raise RequestInvalid(
            f"the artifact's key is {len(folder.encode())} bytes long: the reports written next to it would pass "
            f"S3's {MAX_KEY_BYTES}-byte key limit",
            "use a shorter key",
        )


def _endpoint_name(request: DeploymentRequest, prefix: str, deployment_id: str) -> str:
    """The request's own endpoint name, inside the stack's prefix, or <prefix>-<deployment id>."""
    name = request.endpoint_name
    if name is None:
        return resource_name_for(prefix, deployment_id)
    if not name.startswith(f"{prefix}-") or name == f"{prefix}-":
        raise RequestInvalid(
            f"endpoint_name {name!r} is outside the stack's resource prefix {prefix!r}",
            f"the stack's roles create and delete only endpoints named {prefix}-*; e.g. {prefix}-{name}"[:200],
        )
    return name


def _requested_types(request: DeploymentRequest) -> list[str] | None:
    """instance_types as a list (["auto"] kept for after validation); instance_type alone is None.
    An instance_type given with a list is tried first."""
    if request.instance_types is None:
        return None
    if request.instance_types == AUTO:
        return [AUTO]
    types = list(request.instance_types)
    if request.instance_type and request.instance_type not in types:
        types.insert(0, request.instance_type)
    elif request.instance_type:
        types.remove(request.instance_type)
        types.insert(0, request.instance_type)
    return types


# A prefix's objects each become one Map iteration; the list travels in the execution's state
# (256 KiB at most), so a prefix of more files than this is refused at the door.
MAX_COPY_ITEMS = 1000
MAX_COPY_LIST_BYTES = 160_000  # keys may be 1 KiB each: the count alone does not bound the list


def register(registry: Registry, s3: S3Client, req: NormalizedRequest, region: str) -> dict[str, Any]:
    """Create the record, then claim the artifact version: a second deployment of it fails here."""
    facts = artifact_facts(s3, req.artifact_uri)
    identity, version = facts.identity, facts.version
    adapter_version = None
    if req.adapter_uri is not None:  # one adapter version on one base version is one deployment
        adapter = artifact_facts(s3, req.adapter_uri)
        identity, adapter_version = f"{adapter.identity} on {identity}", adapter.version
    more = []
    for named in req.more_adapters:  # shared mode: every adapter's version is pinned, and part of the claim
        facts_of = artifact_facts(s3, named.uri)
        identity = f"{facts_of.identity} + {identity}"
        more.append({**named.model_dump(mode="json"), "version": facts_of.version})
    price = hourly_price(req.instance_type, region)
    created = registry.register(
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
    holder = registry.claim_artifact(identity, req.deployment_id)
    if holder is not None:
        raise DuplicateDeployment(
            f"{identity} is already deployed by {holder.deployment_id} "
            f"(status {holder.status}, endpoint {holder.endpoint_name}); nothing was created"
        )
    items = copy_items(facts.objects, req.artifact_uri) if req.artifact_uri.is_prefix else []
    return {
        "deployment_id": req.deployment_id,
        "created": created,
        "artifact_version": version,
        "adapter_version": adapter_version,
        "more_adapters": more,
        "size_bytes": facts.size_bytes,
        "copy_items": [item.model_dump() for item in items],
    }


@dataclass
class RegisterClients:
    s3: S3Client
    iam: IAMClient
    quotas: ServiceQuotasClient


def register_and_check(
    registry: Registry,
    aws: RegisterClients,
    req: NormalizedRequest,
    region: str,
    role_arn: str,
    max_archive_gb: float,
) -> dict[str, Any]:
    """RegisterDeployment: the record and the artifact claim, then the preflight -- after the record
    exists, so that a refusal there is recorded (and shown by `modeldrop status`)."""
    registered = register(registry, aws.s3, req, region)
    check_size(req.artifact_uri, registered["size_bytes"], registered["copy_items"], max_archive_gb)
    preflight(registry, aws.iam, aws.quotas, req, role_arn)
    return registered


def check_size(artifact: Artifact, size_bytes: int, items: list[dict[str, Any]], max_archive_gb: float) -> None:
    """Refuse at the door what ValidateCheckpoint could not finish within its 15 minutes: an archive
    is read whole by one Lambda; a prefix is copied by a Map (any size), one iteration per object."""
    upload = f"modeldrop upload MODEL_DIR s3://{artifact.bucket}/{artifact.folder}model/"
    if not artifact.is_prefix and size_bytes > max_archive_gb * 1e9:
        raise ArchiveTooLarge(
            f"{artifact} is {size_bytes / 1e9:.1f} GB: one validating pass reads at most {max_archive_gb:g} GB "
            "within a Lambda's 15 minutes (the stack's MaxArchiveGB); nothing was copied or created",
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


def validate(
    s3: S3Client,
    registry: Registry,
    deployment_id: str,
    artifact: Artifact,
    metrics: MetricSink | None = None,
    artifact_version: str | None = None,
    owner: str = "",
    items: list[CopyItem] | None = None,
    adapter: AdapterSource | None = None,
    more_adapters: list[AdapterSource] | None = None,
    shared: bool = False,
) -> ValidationSummary:
    """Judge exactly what SageMaker will be given, whatever happens to the upload's key since:
    - an archive is read once from its pinned version, and each member it holds is written to the
      deployment's served prefix by the same pass (what is served is what was validated);
    - a prefix was copied by the state machine's Map (ITEMS, each pinned by ETag): the copy is
      checked complete and the source unchanged, then its headers are read.

    A deployment that ended while this ran (a stopped execution whose Lambda runs on) keeps no copy:
    the step deletes what it wrote and fails with DeploymentEnded."""
    started = time.monotonic()
    registry.live(deployment_id, owner)
    served = served_location(artifact, deployment_id)
    with released_if_ended(registry, deployment_id, lambda: delete_served(s3, served.bucket, deployment_id)):
        if artifact.is_prefix:
            served_matches(s3, artifact, artifact_version, served, items or [])
            scan, report = judge_source(str(served), s3)
        else:
            with ServedPrefixWriter(s3, served) as writer:
                body = open_pinned(s3, artifact, artifact_version)
                scan, report = validate_archive_stream(body, str(artifact), writer)
        # The adapter only once its base passed (a refused base is the finding to fix first).
        judged = [
            judge_adapter(s3, deployment_id, artifact, served, (scan, report), one, shared)
            for one in ([adapter, *(more_adapters or [])] if adapter and report.deployable else [])
        ]
        # Taken before the copy is used: a write to it from here on shows before CreateModel.
        digest = served_digest(s3, served)
        summary = _judge(
            s3, registry, deployment_id, artifact, served, report, artifact_version, owner, metrics, started, judged
        )
        return summary.model_copy(update={"served_digest": digest})


def _judge(
    s3: S3Client,
    registry: Registry,
    deployment_id: str,
    artifact: Artifact,
    served: Artifact,
    report: ValidationReport,
    artifact_version: str | None,
    owner: str,
    metrics: MetricSink | None,
    started: float,
    adapters: list[AdapterInfo] | None = None,
) -> ValidationSummary:
    seconds = max(time.monotonic() - started, 1e-6)
    if metrics is not None:
        metrics.add_metric(name="ValidationSeconds", unit="Seconds", value=round(seconds, 3))
        metrics.add_metric(
            name="ValidationMBps", unit="Megabytes/Second", value=round(report.total_bytes / 1e6 / seconds, 2)
        )
    bucket, prefix = report_prefix(artifact, deployment_id)
    uri = put_json(s3, bucket, prefix + "validation.json", report)
    summary = report.summary(uri)
    summary.served_uri, summary.artifact_version = served, artifact_version
    if adapters:
        summary.adapter, summary.more_adapters = adapters[0], adapters[1:]
    registry.record(
        deployment_id,
        "validate",
        summary.model_dump(mode="json"),
        status="validated" if report.deployable else "refused",
        owner=owner,
        live=True,
        validation_report_uri=uri,
        served_uri=str(served),
    )
    if not report.deployable:
        errors = [f for f in report.findings if f.severity == "error"]
        first = errors[0]
        more = f" (+{len(errors) - 1} more findings)" if len(errors) > 1 else ""
        raise CheckpointRefused(f"{first.code}: {first.message}{more}; report: {uri}", first.hint)
    return summary


def resolve(
    registry: Registry,
    deployment_id: str,
    engine: Any,
    region: str,
    env: Mapping[str, str],
    model_type: str | None,
    owner: str = "",
) -> ImageChoice:
    choice = resolve_image(engine, region, env, model_type)
    registry.record(
        deployment_id,
        "resolve_image",
        choice.model_dump(mode="json"),
        owner=owner,
        live=True,
        image_uri=choice.image_uri,
    )
    return choice


def plan_for_type(
    req: NormalizedRequest, validation: ValidationSummary, image: ImageChoice, instance_type: str
) -> EnginePlan:
    return plan_checkpoint(
        image.engine,
        validation,
        instance_type,
        image.region,
        req.max_num_seqs,
        req.max_model_len,
        req.engine_env,
        req.force_plan,
        req.engine_settings,
        image,
    )


def build_plan(
    registry: Registry, req: NormalizedRequest, validation: ValidationSummary, image: ImageChoice, attempt: int = 0
) -> EnginePlan:
    """The plan for the ATTEMPT-th usable type of the preference list, re-planned for that type (its
    GPU count sets tensor parallelism, its memory the KV budget)."""
    listed = candidates(
        req.instance_type,
        req.instance_types,
        lambda t: plan_for_type(req, validation, image, t),
        image.region,
        req.max_hourly_price,
        force=req.force_plan,
        allowed=req.allowed_instance_types,
    )
    tried = usable(listed)
    if not tried:
        first = listed[0]
        if first.verdict == "oom":
            plan_for_type(req, validation, image, first.instance_type)  # raises its PlanRefused, alternatives included
        raise PlanRefused(
            "no instance type of the request can be tried: "
            + "; ".join(f"{c.instance_type}: {c.reason or c.verdict}" for c in listed),
            "raise max_hourly_price, add types to instance_types, or lower max_num_seqs / max_model_len",
        )
    if attempt >= len(tried):
        raise StepContractViolated(f"internal error: attempt {attempt} but only {len(tried)} usable instance types")
    plan = plan_for_type(req, validation, image, tried[attempt].instance_type)
    plan.attempt, plan.candidates, plan.instance_count = attempt, listed, req.instance_count
    # The references were checked at the door; only now are the engine's own keys known.
    refuse_collisions(req.secrets, plan.env)
    held_back = sorted(set(req.secrets) - set(for_container(parse_refs(req.secrets), plan.hub_download)))
    if held_back:
        plan.warnings.append(
            f"{', '.join(held_back)} not passed to the container: the weights are served from S3 and nothing is "
            "downloaded from the Hugging Face Hub, and DescribeModel would show the token in plain text"
        )
    registry.record(
        req.deployment_id,
        "build_env",
        plan.model_dump(mode="json"),
        attempt=attempt,
        status="planned",
        owner=req.execution_arn,
        live=True,
        instance_type=plan.instance_type,
    )
    return plan
