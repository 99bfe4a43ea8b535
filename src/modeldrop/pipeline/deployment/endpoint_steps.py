"""The state machine's endpoint steps: create (with the quota answer), poll against the deadline, smoke eval."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from modeldrop.aws import endpoint_logs
from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.s3.served_copy import verify_served
from modeldrop.aws.sagemaker.endpoint_quota import check_endpoint_quota
from modeldrop.aws.sagemaker.inference_components import attach
from modeldrop.aws.sagemaker.inference_components import release as release_components
from modeldrop.aws.sagemaker.sagemaker_resources import (
    DEPLOYMENT_TAG,
    create_all,
    describe_endpoint,
    model_data_source,
    tags_for,
)
from modeldrop.aws.secret_refs import for_container, parse_refs
from modeldrop.aws.secret_refs import resolve as resolve_secrets
from modeldrop.contracts import clock
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import (
    DeployDeadlineExceeded,
    EndpointFailed,
    InsufficientCapacity,
    QuotaExceeded,
    StepContractViolated,
)
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.step_payloads import CreateOutcome, EndpointPoll, EndpointRef, EnginePlan, ImageChoice
from modeldrop.pipeline.adapters.component_steps import component_plan
from modeldrop.pipeline.deployment.attempts import attempt_name, capacity_wait_stuck, is_capacity_failure, quota_busy
from modeldrop.pipeline.deployment.ownership import released_if_ended
from modeldrop.pipeline.deployment.teardown import Held, delete_now
from modeldrop.serving.memory_plan import hourly_price

if TYPE_CHECKING:
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_secretsmanager import SecretsManagerClient
    from mypy_boto3_service_quotas import ServiceQuotasClient
    from mypy_boto3_ssm import SSMClient


@dataclass
class CreateClients:
    sagemaker: SageMakerClient
    quotas: ServiceQuotasClient
    secretsmanager: SecretsManagerClient
    ssm: SSMClient
    s3: S3Client | None = None  # reads the served copy's versions before CreateModel


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
    served_digest: str | None = None,
) -> CreateOutcome:
    """Create this attempt's model, config and endpoint -- or, when its type is at the account's
    quota, say so: the state machine waits (quota_wait_seconds) or moves on to the next type.
    SageMaker's own ResourceLimitExceeded on create is the same answer, so waiters need no lock.

    A deployment that ended while this ran keeps nothing: what this step created is deleted and
    the step fails with DeploymentEnded."""
    registry.live(req.deployment_id, req.execution_arn)
    if plan.attached is not None:  # base_endpoint: nothing to create, the components attach at the poll
        if served_uri is not None and clients.s3 is not None:
            verify_served(clients.s3, served_uri, served_digest)
        return attached_outcome(registry, req, plan, served_uri, stack_tag)
    name = attempt_endpoint_name(clients.sagemaker, req, plan.attempt)

    def release() -> None:  # the endpoint, config and model this attempt made
        part = attempt_name(req.resource_name, plan.attempt)
        delete_now(clients.sagemaker, None, Held(name, part, part), req.deployment_id, None)

    if served_uri is not None and clients.s3 is not None:
        verify_served(clients.s3, served_uri, served_digest)  # what SageMaker downloads is what was validated
    with released_if_ended(registry, req.deployment_id, release):
        return _create(
            clients, registry, req, image, plan, role_arn, stack_tag, served_uri, quota_waits, quota_wait_until, name
        )


def attached_outcome(
    registry: Registry, req: NormalizedRequest, plan: EnginePlan, served_uri: Artifact | None, stack_tag: str
) -> CreateOutcome:
    """base_endpoint: this deployment's adapter components on the other deployment's endpoint, recorded
    as its own (its expiry on their tags); the endpoint, its base and its bill stay that deployment's."""
    attached = plan.attached
    assert attached is not None
    now = clock.utcnow()
    expires_at = clock.iso(now + timedelta(hours=req.ttl_hours))
    tags = tags_for(stack_tag, req.deployment_id, expires_at)
    components = component_plan(req, plan, attached.endpoint_name, attached.model_name, served_uri, tags, own=True)
    assert components is not None
    deadline = deploy_deadline(plan, req.deploy_deadline_seconds)
    ref = EndpointRef(
        endpoint_name=attached.endpoint_name,
        endpoint_config_name=attempt_name(req.resource_name, 0),
        model_name=attempt_name(req.resource_name, 0),
        deadline_at=clock.iso(now + timedelta(seconds=deadline["seconds"])),
        instance_type=plan.instance_type,
        created_at=clock.iso(now),
        min_poll_seconds=max(5, math.ceil(deadline["seconds"] / MAX_POLLS)),
        components=components.model_copy(update={"base": attached.base_component}),
    )
    registry.record(
        req.deployment_id,
        "create_endpoint",
        {**ref.model_dump(mode="json"), "attached_to": attached.deployment_id, "deadline": deadline},
        status="creating",
        owner=req.execution_arn,
        live=True,
        endpoint_name=attached.endpoint_name,
        expires_at=expires_at,
        started_at=clock.iso(now),
        instance_type=plan.instance_type,
    )
    return CreateOutcome(status="created", endpoint=ref)


def attempt_endpoint_name(sm: SageMakerClient, req: NormalizedRequest, attempt: int) -> str:
    """The endpoint keeps its name across attempts, unless an earlier attempt's endpoint still holds
    it (SageMaker would not delete it while Creating): then this attempt's own name, <name>-aN."""
    name = req.resource_name
    if attempt == 0:
        return name
    desc = describe_endpoint(sm, name)
    if desc is None or str(desc.get("EndpointConfigName")) == attempt_name(name, attempt):
        return name  # free, or this very attempt's (a retried step)
    return attempt_name(name, attempt)


def _create(
    clients: CreateClients,
    registry: Registry,
    req: NormalizedRequest,
    image: ImageChoice,
    plan: EnginePlan,
    role_arn: str,
    stack_tag: str,
    served_uri: Artifact | None,
    quota_waits: int,
    quota_wait_until: str | None,
    name: str,
) -> CreateOutcome:
    now = clock.utcnow()
    expires_at = clock.iso(now + timedelta(hours=req.ttl_hours))
    part = attempt_name(req.resource_name, plan.attempt)
    if served_uri is None or not served_uri.is_prefix:
        raise StepContractViolated(f"internal error: no served prefix to create {name} from (got {served_uri})")
    model_data = served_uri  # the immutable, uncompressed copy of the validated version
    sm = clients.sagemaker
    tags = tags_for(stack_tag, req.deployment_id, expires_at)
    # A retried step whose endpoint already exists must not count that endpoint against the quota.
    retried = describe_endpoint(sm, name) is not None
    try:
        quota = None if retried else check_endpoint_quota(clients.quotas, sm, plan.instance_type, req.instance_count)
        # Secret values exist only in this call and the model's container env.
        refs = for_container(parse_refs(req.secrets), plan.hub_download)
        env = {**plan.env, **resolve_secrets(clients.secretsmanager, clients.ssm, refs)}
        adopted = create_all(
            sm,
            name,
            image.image_uri,
            str(model_data),
            env=env,
            role_arn=role_arn,
            instance_type=plan.instance_type,
            instance_count=req.instance_count,
            startup_timeout=plan.startup_timeout_seconds,
            download_timeout=plan.download_timeout_seconds,
            tags=tags,
            config_name=part,
            model_name=part,
            inference_ami_version=plan.inference_ami_version,
            for_components=req.adapter_mode == "shared",
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
        min_poll_seconds=max(5, math.ceil(deadline["seconds"] / MAX_POLLS)),
        components=component_plan(
            req, plan, name, part, served_uri, tags_for(stack_tag, req.deployment_id, expires_at)
        ),
    )
    price = hourly_price(plan.instance_type, image.region)
    registry.record(
        req.deployment_id,
        "create_endpoint",
        {
            **ref.model_dump(mode="json"),
            "quota": asdict(quota) if quota else None,
            "adopted": adopted,
            "model_data_source": model_data_source(str(model_data)),
            "deadline": deadline,
            "quota_waits": quota_waits,
        },
        status="creating",
        owner=req.execution_arn,
        live=True,
        endpoint_name=name,
        expires_at=expires_at,
        started_at=clock.iso(now),
        instance_type=plan.instance_type,
        hourly_price=str(price) if price is not None else None,
    )
    return CreateOutcome(status="created", endpoint=ref, quota_waits=quota_waits)


# Polls of one attempt's endpoint at most: the poll loop stretches its interval to fit the deadline, so
# that an execution's history stays within Step Functions' 25,000 events (a contract test adds it up).
MAX_POLLS = 240

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
    registry: Registry | None = None,
    owner: str = "",
) -> EndpointPoll:
    desc = describe_endpoint(sm, ref.endpoint_name)
    if desc is None:
        raise EndpointFailed(
            f"endpoint {ref.endpoint_name} disappeared while being created",
            "check whether someone deleted it; redeploy",
        )
    status = str(desc.get("EndpointStatus"))
    where = f"endpoint {ref.endpoint_name} on {ref.instance_type or 'its instance type'}"
    created = desc.get("CreationTime")
    since = created if isinstance(created, datetime) else None

    def never_ran() -> bool:  # this endpoint's own evidence: no container stream since it was created
        return logs is not None and not endpoint_logs.ran_since(logs, ref.endpoint_name, since)

    if status == "Failed":
        reason = desc.get("FailureReason") or "(no FailureReason given)"
        if is_capacity_failure(reason, never_ran):
            raise InsufficientCapacity(f"{where} Failed: {reason}")
        raise EndpointFailed(f"endpoint {ref.endpoint_name} Failed: {reason}", hint_for_failure(reason))
    if status == "Creating" and logs is not None:
        stuck = capacity_wait_stuck(desc, capacity_wait_seconds)
        if stuck is not None and never_ran():
            raise InsufficientCapacity(
                f"{where} has had no instance for {stuck / 60:.0f} min (never modified since it was created, no "
                f"container log stream in {endpoint_logs.log_group_for(ref.endpoint_name)} since): a capacity wait "
                "that will not end"
            )
    if status == "InService" and ref.components is not None:
        status = _attach_components(sm, ref, registry, owner)
    if status != "InService" and clock.utcnow() >= clock.parse_iso(ref.deadline_at):
        raise DeployDeadlineExceeded(
            f"endpoint {ref.endpoint_name} still {status} at the deadline {ref.deadline_at} after {polls + 1} polls"
        )
    return EndpointPoll(status=status, polls=polls + 1)


def _attach_components(sm: SageMakerClient, ref: EndpointRef, registry: Registry | None, owner: str) -> str:
    """Shared: InService once the base component and every adapter component on it are. Only for a
    deployment still in flight: a Lambda running on after its execution ended releases what it made."""
    assert ref.components is not None
    deployment_id = next(t["Value"] for t in ref.components.tags if t["Key"] == DEPLOYMENT_TAG)
    if registry is None:
        return attach(sm, ref.endpoint_name, ref.components, deployment_id).status
    registry.live(deployment_id, owner)

    def release() -> None:
        release_components(sm, ref.endpoint_name, deployment_id)

    with released_if_ended(registry, deployment_id, release):
        status = attach(sm, ref.endpoint_name, ref.components, deployment_id).status
        registry.live(deployment_id, owner)  # ended meanwhile: what this pass created goes
    return status


def hint_for_failure(reason: str) -> str:
    lowered = reason.lower()
    if "cannotstartcontainererror" in lowered:
        return (
            "the host's NVIDIA driver may be older than the image's CUDA: the endpoint config needs an "
            "InferenceAmiVersion whose driver covers it (the plan sets one for the DLC images; check a custom "
            "image's tag), otherwise the image's own entrypoint failed"
        )
    if "ping health check" in lowered:
        return (
            "either the engine died (CUDA OOM: lower max_num_seqs / max_model_len or use a larger instance; raising "
            "the timeout will not help) or weights load slowly (raise ContainerStartupHealthCheckTimeoutInSeconds) "
            "-- the endpoint's CloudWatch logs tell which"
        )
    if "resourcelimitexceeded" in lowered or "quota" in lowered:
        return "raise the 'ml.<type> for endpoint usage' Service Quota"
    return EndpointFailed.default_hint
