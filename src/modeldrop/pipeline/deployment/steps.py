"""The state machine's preparing steps as plain functions over clients (the handlers only wire them):
normalize, register, validate, resolve the image, plan. endpoint_steps and closing_steps hold the rest."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.s3.served_copy import delete_served, served_digest, served_location, served_matches
from modeldrop.aws.s3.served_writer import ServedPrefixWriter, open_pinned
from modeldrop.aws.secret_refs import check_refs, for_container, parse_refs, refuse_collisions
from modeldrop.checkpoint.archive.artifact_scan import scan_s3_prefix
from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.validation import judge_source, validate_archive_stream, validate_scan
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.contracts.errors import (
    CheckpointRefused,
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
    instance_type_problems,
    parse_request,
    resource_name_for,
)
from modeldrop.contracts.s3uri import parse_s3_uri
from modeldrop.contracts.served import CopyItem
from modeldrop.contracts.step_payloads import AttachedBase, Engine, EnginePlan, ImageChoice
from modeldrop.evaluation.report import MetricSink
from modeldrop.pipeline.adapters.adapter_steps import SHARED_DIR, AdapterSource, adapter_fields, judge_adapter
from modeldrop.pipeline.adapters.attach_steps import attached_plan
from modeldrop.pipeline.config import DefaultsSettings
from modeldrop.pipeline.deployment.ownership import released_if_ended
from modeldrop.pipeline.reports import put_json, report_prefix
from modeldrop.serving.engine_options import first_problem, resolved_version
from modeldrop.serving.image import resolve_image
from modeldrop.serving.instance_choice import AUTO, candidates, usable
from modeldrop.serving.plan import plan_checkpoint

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

    from modeldrop.checkpoint.validation import ValidationReport


def normalize(
    raw: Any,
    execution_name: str,
    defaults: DefaultsSettings,
    execution_arn: str,
    started: str | int,
    channel_base: Callable[[str], str | None] | None = None,
) -> NormalizedRequest:
    """The request checked and defaulted; its deployment id is unique to this execution (its name
    and start time), so no two executions ever share a record, a served copy or a resource name.
    A request for an adapter channel that names no base is an adapter on the channel's base
    (CHANNEL_BASE resolves it): the daily adapter needs only its upload and the channel's name."""
    try:
        request = parse_request(raw)
    except ValidationError as exc:
        raise RequestInvalid(f"invalid deployment request: {describe_validation(exc, limit=5)}") from None
    unhosted = instance_type_problems(request)
    if unhosted:
        raise RequestInvalid(f"invalid deployment request: {unhosted[0]}")
    if request.channel and channel_base and request.base is None and request.base_endpoint is None:
        base = channel_base(request.channel)
        if base:
            request = request.model_copy(update={"base_endpoint": base})
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
    request = _adapter_route(request, defaults)
    defaulted = {
        **adapter_fields(request),
        "deployment_id": deployment_id,
        "execution_name": execution_name,
        "execution_arn": execution_arn,
        # Adapter inference components need a container with SageMaker's adapter API (LMI).
        "engine": _engine(request, defaults),
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
    _check_engine_keys(defaulted["engine"], defaults.aws_region, request.engine_env)
    return NormalizedRequest.model_validate({**dict(request), **defaulted})


def _target(engine: Engine | None) -> EngineVersion | None:
    """The engine version of the image ResolveImage will choose (the same env, the Lambda's region)."""
    if engine is None:
        return None
    return resolved_version(
        engine, os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "", os.environ
    )


def _adapter_route(request: DeploymentRequest, defaults: DefaultsSettings) -> DeploymentRequest:
    """An adapter on vLLM's container is served as an adapter inference component, so that it answers:
    the DLC's /invocations replaces the body's `model` with X-Amzn-SageMaker-Adapter-Identifier, which
    SageMaker sets only for adapter components, so a dedicated adapter (base and adapter on one plain
    endpoint) would be answered by the base whatever the request names. Unset, adapter_mode becomes
    shared; dedicated is refused before anything is created."""
    if request.base is None or request.base_endpoint is not None:
        return request
    if (request.engine or defaults.default_engine) != "vllm":
        return request
    if request.adapter_mode == "dedicated":
        raise RequestInvalid(
            "adapter_mode dedicated on vLLM's container would be answered by the base: its /invocations takes the "
            "adapter only from the X-Amzn-SageMaker-Adapter-Identifier header, which SageMaker sets for adapter "
            "inference components alone (a body naming the adapter in `model` is replaced)",
            "drop adapter_mode (vLLM adapters are served as adapter inference components, adapter_mode shared), "
            "or deploy on engine lmi or sglang, which route by the body",
        )
    if request.adapter_mode is None:
        return request.model_copy(update={"adapter_mode": "shared", "engine": "vllm"})
    return request


def _engine(request: DeploymentRequest, defaults: DefaultsSettings) -> Engine:
    """Adapter inference components need a server with SageMaker's adapter API: LMI unless the request
    names vLLM (whose SageMaker router loads adapters by POST /adapters and routes them by header)."""
    if request.adapter_mode == "shared" or request.base_endpoint:
        return "vllm" if request.engine == "vllm" and not request.base_endpoint else "lmi"
    return request.engine or defaults.default_engine


def _check_engine_keys(engine: Engine, region: str, engine_env: dict[str, str]) -> None:
    """Raw engine keys judged by the stack's image for ENGINE before anything is created (the plan
    judges them again for the image it resolves)."""
    if not engine_env:
        return
    problem = first_problem(engine, engine_env, resolved_version(engine, region, os.environ))
    if problem is not None:
        raise RequestInvalid(f"engine_env: {problem[0]}", problem[1])


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
    attached: AttachedBase | None = None,
    engine: Engine | None = None,
) -> ValidationSummary:
    """Judge exactly what SageMaker will be given, whatever happens to the upload's key since:
    - an archive is read once from its pinned version, and each member it holds is written to the
      deployment's served prefix by the same pass (what is served is what was validated);
    - a prefix was copied by the state machine's Map (ITEMS, each pinned by ETag): the copy is
      checked complete and the source unchanged, then its headers are read.

    A deployment that ended while this ran (a stopped execution whose Lambda runs on) keeps no copy:
    the step deletes what it wrote and fails with DeploymentEnded."""
    started = time.monotonic()
    target = _target(engine)
    registry.live(deployment_id, owner)
    served = served_location(artifact, deployment_id)
    with released_if_ended(registry, deployment_id, lambda: delete_served(s3, served.bucket, deployment_id)):
        scan: ArtifactScan | None
        if attached is not None:  # the other deployment's validated, immutable copy of the base
            scan = scan_s3_prefix(s3, parse_s3_uri(attached.served_uri), skip=f"{SHARED_DIR}/")
            report = validate_scan(scan, target=target)
        elif artifact.is_prefix:
            served_matches(s3, artifact, artifact_version, served, items or [])
            scan, report = judge_source(str(served), s3, target)
        else:
            with ServedPrefixWriter(s3, served) as writer:
                body = open_pinned(s3, artifact, artifact_version)
                scan, report = validate_archive_stream(body, str(artifact), writer, target)
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
        return summary.model_copy(update={"served_digest": digest, "attached": attached})


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
    if validation.attached is not None:
        return attached_plan(registry, req, validation.attached, validation.adapters)
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
