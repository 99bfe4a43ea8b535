"""The state machine's steps as plain functions over clients: the handlers only wire them."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from modeldrop.aws import endpoint_logs
from modeldrop.aws.artifact_version import artifact_identity
from modeldrop.aws.endpoint_quota import check_endpoint_quota
from modeldrop.aws.events_bus import lifecycle_detail, publish
from modeldrop.aws.registry import Registry
from modeldrop.aws.sagemaker_resources import (
    create_all,
    describe_endpoint,
    tags_for,
)
from modeldrop.aws.secret_refs import check_refs, parse_refs, refuse_collisions
from modeldrop.aws.secret_refs import resolve as resolve_secrets
from modeldrop.aws.served_copy import copy_pinned
from modeldrop.checkpoint.artifact_scan import scan_source
from modeldrop.checkpoint.validation import validate_scan
from modeldrop.contracts import clock
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import (
    CheckpointRefused,
    DeployDeadlineExceeded,
    DuplicateDeployment,
    EndpointFailed,
    EvalFailed,
    InsufficientCapacity,
    PlanRefused,
    QuotaExceeded,
    RequestInvalid,
    StepContractViolated,
    cause_message,
    classify,
    describe_validation,
)
from modeldrop.contracts.instance_types import instance_type_problem
from modeldrop.contracts.models import (
    CreateOutcome,
    DeploymentRequest,
    EndpointPoll,
    EndpointRef,
    EnginePlan,
    EvalVerdict,
    FailureRecord,
    ImageChoice,
    NormalizedRequest,
    ValidationSummary,
    deployment_id_for,
    resource_name_for,
)
from modeldrop.evaluation.report import MetricSink, emit_metrics, to_markdown
from modeldrop.evaluation.runner import EvalTarget, RetryPolicy, run_eval
from modeldrop.evaluation.smoke_eval import error_count, load_eval_set
from modeldrop.pipeline.attempts import attempt_name, capacity_wait_stuck, is_capacity_failure, quota_busy
from modeldrop.pipeline.config import DefaultsSettings
from modeldrop.pipeline.preflight import preflight
from modeldrop.serving.image import resolve_image
from modeldrop.serving.instance_choice import AUTO, candidates, usable
from modeldrop.serving.memory_plan import hourly_price, instance_catalog
from modeldrop.serving.plan import max_tokens_ceiling, plan_checkpoint

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_iam import IAMClient
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker_runtime import SageMakerRuntimeClient
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_service_quotas import ServiceQuotasClient
    from mypy_boto3_ssm import SSMClient


def normalize(raw: Any, execution_name: str, defaults: DefaultsSettings) -> NormalizedRequest:
    try:
        request = DeploymentRequest.model_validate(raw)
    except ValidationError as exc:
        raise RequestInvalid(f"invalid deployment request: {describe_validation(exc, limit=5)}") from None
    deployment_id = deployment_id_for(execution_name)
    check_refs(request.secrets, defaults.secrets_prefix, engine_keys=set(request.engine_env))
    types = _requested_types(request)
    first = request.instance_type or (types[0] if types and types != [AUTO] else defaults.default_instance_type)
    problem = instance_type_problem(first)
    if problem:  # the stack's default is checked too: nothing may be created for a type that cannot serve
        raise RequestInvalid(*problem)
    # The stack's defaults, in this one place; every other field passes through as the request gave it.
    defaulted = {
        "deployment_id": deployment_id,
        "execution_name": execution_name,
        "engine": request.engine or defaults.default_engine,
        "instance_type": first,
        "instance_types": types,
        "ttl_hours": request.ttl_hours or defaults.default_ttl_hours,
        "resource_name": _endpoint_name(request, defaults.resource_prefix, deployment_id),
        "deploy_deadline_seconds": defaults.deploy_deadline_seconds,
        "quota_wait_seconds": round(request.quota_wait_minutes * 60),
        "capacity_wait_seconds": round(request.capacity_wait_minutes * 60),
    }
    return NormalizedRequest.model_validate({**dict(request), **defaulted})


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


def register(registry: Registry, s3: S3Client, req: NormalizedRequest, region: str) -> dict[str, Any]:
    """Create the record, then claim the artifact version: a second deployment of it fails here."""
    identity, version = artifact_identity(s3, req.artifact_uri)
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
    )
    holder = registry.claim_artifact(identity, req.deployment_id)
    if holder is not None:
        raise DuplicateDeployment(
            f"{req.artifact_uri} (version {version}) is already deployed by {holder.deployment_id} "
            f"(status {holder.status}, endpoint {holder.endpoint_name}); nothing was created"
        )
    return {"deployment_id": req.deployment_id, "created": created, "artifact_version": version}


@dataclass
class RegisterClients:
    s3: S3Client
    iam: IAMClient
    quotas: ServiceQuotasClient


def register_and_check(
    registry: Registry, aws: RegisterClients, req: NormalizedRequest, region: str, role_arn: str
) -> dict[str, Any]:
    """RegisterDeployment: the record and the artifact claim, then the preflight -- after the record
    exists, so that a refusal there is recorded (and shown by `modeldrop status`)."""
    registered = register(registry, aws.s3, req, region)
    preflight(registry, aws.iam, aws.quotas, req, role_arn)
    return registered


def report_prefix(artifact: Artifact, deployment_id: str) -> tuple[str, str]:
    """(bucket, key prefix) for reports next to the artifact."""
    return artifact.bucket, f"{artifact.folder}modeldrop-reports/{deployment_id}/"


def _put_json(s3: S3Client, bucket: str, key: str, body: BaseModel | dict[str, Any]) -> str:
    data = body.model_dump_json(indent=2) if isinstance(body, BaseModel) else json.dumps(body, indent=2, default=str)
    s3.put_object(Bucket=bucket, Key=key, Body=data.encode(), ContentType="application/json")
    return f"s3://{bucket}/{key}"


def validate(
    s3: S3Client,
    registry: Registry,
    deployment_id: str,
    artifact: Artifact,
    metrics: MetricSink | None = None,
    artifact_version: str | None = None,
) -> ValidationSummary:
    """Copy the pinned version server-side into the deployment's own prefix, then validate that copy:
    what was validated is exactly what SageMaker is given, whatever happens to the upload's key."""
    started = time.monotonic()
    served = copy_pinned(s3, artifact, artifact_version, deployment_id)
    report = validate_scan(scan_source(str(served), s3))
    seconds = max(time.monotonic() - started, 1e-6)
    if metrics is not None:
        metrics.add_metric(name="ValidationSeconds", unit="Seconds", value=round(seconds, 3))
        metrics.add_metric(
            name="ValidationMBps", unit="Megabytes/Second", value=round(report.total_bytes / 1e6 / seconds, 2)
        )
    bucket, prefix = report_prefix(artifact, deployment_id)
    uri = _put_json(s3, bucket, prefix + "validation.json", report)
    summary = report.summary(uri)
    summary.served_uri, summary.artifact_version = served, artifact_version
    registry.record(
        deployment_id,
        "validate",
        summary.model_dump(mode="json"),
        status="validated" if report.deployable else "refused",
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
    registry: Registry, deployment_id: str, engine: Any, region: str, env: Mapping[str, str], model_type: str | None
) -> ImageChoice:
    choice = resolve_image(engine, region, env, model_type)
    registry.record(deployment_id, "resolve_image", choice.model_dump(mode="json"), image_uri=choice.image_uri)
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
    registry.record(
        req.deployment_id,
        "build_env",
        plan.model_dump(mode="json"),
        attempt=attempt,
        status="planned",
        instance_type=plan.instance_type,
    )
    return plan


@dataclass
class CreateClients:
    sagemaker: SageMakerClient
    quotas: ServiceQuotasClient
    secretsmanager: SecretsManagerClient
    ssm: SSMClient


def create(
    clients: CreateClients,
    registry: Registry,
    req: NormalizedRequest,
    image: ImageChoice,
    plan: EnginePlan,
    role_arn: str,
    stack_tag: str,
    served_uri: Artifact | None = None,
    quota_waits: int = 0,
    quota_wait_until: str | None = None,
) -> CreateOutcome:
    """Create this attempt's model, config and endpoint -- or, when its type is at the account's
    quota, say so: the state machine waits (quota_wait_seconds) or moves on to the next type.
    SageMaker's own ResourceLimitExceeded on create is the same answer, so waiters need no lock."""
    now = clock.utcnow()
    expires_at = clock.iso(now + timedelta(hours=req.ttl_hours))
    name = req.resource_name
    part = attempt_name(name, plan.attempt)
    model_data = served_uri or req.artifact_uri  # the immutable copy of the validated version
    sm = clients.sagemaker
    # A retried step whose endpoint already exists must not count that endpoint against the quota.
    retried = describe_endpoint(sm, name) is not None
    try:
        quota = None if retried else check_endpoint_quota(clients.quotas, sm, plan.instance_type, req.instance_count)
        # Secret values exist only in this call and the model's container env.
        env = {**plan.env, **resolve_secrets(clients.secretsmanager, clients.ssm, parse_refs(req.secrets))}
        adopted = create_all(
            sm,
            name,
            image.image_uri,
            str(model_data),
            compressed=model_data.compressed,
            env=env,
            role_arn=role_arn,
            instance_type=plan.instance_type,
            instance_count=req.instance_count,
            startup_timeout=plan.startup_timeout_seconds,
            download_timeout=plan.download_timeout_seconds,
            tags=tags_for(stack_tag, req.deployment_id, expires_at),
            config_name=part,
            model_name=part,
        )
    except QuotaExceeded as exc:
        return quota_busy(registry, req, plan, exc, quota_waits, quota_wait_until, now)
    deadline = deploy_deadline(plan, req.deploy_deadline_seconds)
    ref = EndpointRef(
        endpoint_name=name,
        endpoint_config_name=part,
        model_name=part,
        deadline_at=clock.iso(now + timedelta(seconds=deadline["seconds"])),
        instance_type=plan.instance_type,
        attempt=plan.attempt,
        created_at=clock.iso(now),
    )
    price = hourly_price(plan.instance_type, image.region)
    registry.record(
        req.deployment_id,
        "create_endpoint",
        {
            **ref.model_dump(mode="json"),
            "quota": asdict(quota) if quota else None,
            "adopted": adopted,
            "deadline": deadline,
            "quota_waits": quota_waits,
        },
        status="creating",
        expires_at=expires_at,
        started_at=clock.iso(now),
        instance_type=plan.instance_type,
        hourly_price=str(price) if price is not None else None,
    )
    return CreateOutcome(status="created", endpoint=ref, quota_waits=quota_waits)


# Instance provisioning before the container's own clocks start (the source lab saw 4.6-38 min of
# capacity waits; a healthy start spends a few minutes here).
PROVISIONING_MARGIN_SECONDS = 900


def deploy_deadline(plan: EnginePlan, cap_seconds: int) -> dict[str, Any]:
    """The deployment's deadline from its own plan (download + startup + provisioning), capped by the
    stack's DeployDeadlineSeconds: a slow but healthy load is not killed before SageMaker's timeouts."""
    needed = plan.download_timeout_seconds + plan.startup_timeout_seconds + PROVISIONING_MARGIN_SECONDS
    return {
        "seconds": min(needed, cap_seconds),
        "planned_seconds": needed,
        "cap_seconds": cap_seconds,
        "capped": needed > cap_seconds,
    }


def poll(
    sm: SageMakerClient,
    ref: EndpointRef,
    polls: int,
    logs: CloudWatchLogsClient | None = None,
    capacity_wait_seconds: int = 1800,
) -> EndpointPoll:
    desc = describe_endpoint(sm, ref.endpoint_name)
    if desc is None:
        raise EndpointFailed(
            f"endpoint {ref.endpoint_name} disappeared while being created",
            "check whether someone deleted it; redeploy",
        )
    status = str(desc.get("EndpointStatus"))
    where = f"endpoint {ref.endpoint_name} on {ref.instance_type or 'its instance type'}"
    if status == "Failed":
        reason = desc.get("FailureReason") or "(no FailureReason given)"
        if is_capacity_failure(
            reason, lambda: logs is not None and not endpoint_logs.group_exists(logs, ref.endpoint_name)
        ):
            raise InsufficientCapacity(f"{where} Failed: {reason}")
        raise EndpointFailed(f"endpoint {ref.endpoint_name} Failed: {reason}", hint_for_failure(reason))
    if status == "Creating" and logs is not None:
        stuck = capacity_wait_stuck(desc, capacity_wait_seconds)
        if stuck is not None and not endpoint_logs.group_exists(logs, ref.endpoint_name):
            raise InsufficientCapacity(
                f"{where} has had no instance for {stuck / 60:.0f} min (never modified since it was created, "
                f"no log group {endpoint_logs.log_group_for(ref.endpoint_name)}): a capacity wait that will not end"
            )
    if status != "InService" and clock.utcnow() >= clock.parse_iso(ref.deadline_at):
        raise DeployDeadlineExceeded(
            f"endpoint {ref.endpoint_name} still {status} at the deadline {ref.deadline_at} after {polls + 1} polls"
        )
    return EndpointPoll(status=status, polls=polls + 1)


def hint_for_failure(reason: str) -> str:
    lowered = reason.lower()
    if "ping health check" in lowered:
        return (
            "either the engine died (CUDA OOM: lower max_num_seqs / max_model_len or use a larger instance; raising "
            "the timeout will not help) or weights load slowly (raise ContainerStartupHealthCheckTimeoutInSeconds) "
            "-- the endpoint's CloudWatch logs tell which"
        )
    if "resourcelimitexceeded" in lowered or "quota" in lowered:
        return "raise the 'ml.<type> for endpoint usage' Service Quota"
    return EndpointFailed.default_hint


def smoke_eval(
    runtime: SageMakerRuntimeClient,
    s3: S3Client,
    registry: Registry,
    req: NormalizedRequest,
    ref: EndpointRef,
    plan: EnginePlan,
    metrics: MetricSink | None = None,
    retry: RetryPolicy | None = None,
) -> EvalVerdict:
    cases = load_eval_set(req.eval_set_uri, s3)
    target = EvalTarget(ref.endpoint_name, plan.max_model_len, schema="chat", stream=True)
    ceiling = plan.eval_max_tokens_ceiling or max_tokens_ceiling(req.engine)
    report = run_eval(runtime, target, cases, req.eval_thresholds, ceiling, retry)
    bucket, prefix = report_prefix(req.artifact_uri, req.deployment_id)
    report_uri = _put_json(s3, bucket, prefix + "eval.json", report)
    markdown_key = prefix + "eval.md"
    s3.put_object(
        Bucket=bucket,
        Key=markdown_key,
        Body=to_markdown(report, f"Smoke eval of {req.deployment_id}").encode(),
        ContentType="text/markdown",
    )
    if metrics is not None:
        emit_metrics(metrics, report)
    counts = report.counts
    verdict = EvalVerdict(
        passed=report.passed,
        cases=len(report.cases),
        truncated=counts["truncated"],
        errors=error_count(counts),
        check_failures=counts["check_failed"],
        summary=report.summary,
        report_uri=report_uri,
        report_markdown_uri=f"s3://{bucket}/{markdown_key}",
        ttft_p50_s=report.ttft_s.p50,
        tokens_per_s_p50=report.tokens_per_s.p50,
    )
    registry.record(req.deployment_id, "smoke_eval", verdict.model_dump(mode="json"), eval_report_uri=report_uri)
    if not report.passed:
        raise EvalFailed(
            f"smoke eval failed on {ref.endpoint_name}: {report.summary}; report: {verdict.report_markdown_uri}",
            "; ".join(report.fixes) or EvalFailed.default_hint,
        )
    return verdict


def record_failure(
    sm: SageMakerClient,
    logs: CloudWatchLogsClient,
    registry: Registry,
    deployment_id: str,
    resource_name: str,
    failure: Mapping[str, Any],
    phase: str = "endpoint",
) -> FailureRecord:
    """Record what failed. Before any SageMaker resource exists (phase "prepare") nothing is described."""
    error = str(failure.get("Error") or "States.Runtime")
    cause = cause_message(str(failure.get("Cause") or "")) or ""
    desc = describe_endpoint(sm, resource_name) if phase == "endpoint" else None
    endpoint_reason = desc.get("FailureReason") if desc else None
    diagnosis = None
    if desc is not None:
        # Read before teardown: the log group outlives the endpoint, but the cause belongs in the record.
        lines = endpoint_logs.read_recent(logs, resource_name)
        diagnosis = endpoint_logs.diagnose(lines) if lines else None
    record = FailureRecord(
        error=error,
        cause=cause[:4000],
        failure_class=classify(error),
        state=failure.get("State"),
        endpoint_failure_reason=endpoint_reason,
        log_group=endpoint_logs.log_group_for(resource_name) if desc is not None else None,
        log_excerpt=diagnosis.excerpt if diagnosis else [],
        diagnosis=diagnosis.diagnosis if diagnosis else None,
        hint=diagnosis.hint if diagnosis and diagnosis.hint else None,
        phase=phase,
    )
    registry.record(
        deployment_id,
        "failure",
        record.model_dump(mode="json"),
        status="failing",
        error=error,
        failure_class=record.failure_class,
        failure_reason=(endpoint_reason or cause)[:4000],
    )
    return record


def finalize(
    registry: Registry,
    events: EventBridgeClient,
    bus: str,
    deployment_id: str,
    outcome: str,
    summary: Mapping[str, Any],
) -> dict[str, Any]:
    now = clock.iso(clock.utcnow())
    if outcome == "succeeded":
        item = registry.record(deployment_id, "result", dict(summary), status="succeeded", succeeded_at=now)
    else:
        item = registry.record(deployment_id, "result", dict(summary), status="failed", ended_at=now)
    detail = lifecycle_detail(item, outcome)
    publish(events, bus, "Deployment Succeeded" if outcome == "succeeded" else "Deployment Failed", detail)
    return detail
