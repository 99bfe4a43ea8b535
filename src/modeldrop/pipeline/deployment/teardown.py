"""Teardown: the state machine's loop (endpoint first, then, once it is gone, its config, model and
served copy), the CLI's immediate teardown, and the rule on the state machine's own status changes
that deletes what a stopped, timed-out or failed execution still owns."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.events_bus import lifecycle_detail, publish
from modeldrop.aws.s3.served_copy import delete_served_for
from modeldrop.aws.sagemaker import inference_components as components_mod
from modeldrop.aws.sagemaker.sagemaker_resources import DEPLOYMENT_TAG, delete_all, describe_endpoint, list_tags
from modeldrop.contracts import clock
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import SageMakerThrottled, StepContractViolated, TeardownIncomplete
from modeldrop.contracts.models import deployment_id_for, epoch_ms, resource_name_for
from modeldrop.contracts.record import TRANSITIONS, DeploymentRecord
from modeldrop.contracts.step_payloads import TeardownProgress, TeardownResult
from modeldrop.pipeline.deployment.attempts import attempt_name

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient


@dataclass(frozen=True)
class Held:
    """One attempt's endpoint, endpoint config and model."""

    endpoint: str
    config: str
    model: str


def stranded_of(record: DeploymentRecord | None) -> list[Held]:
    """The earlier attempts' endpoints the deployment could not delete while they were Creating."""
    entries = record.step("stranded") if record else None
    return [Held(e["endpoint"], e["config"], e["model"]) for e in entries or [] if isinstance(e, dict)]


def held_by(record: DeploymentRecord, resource_prefix: str | None = None) -> Held:
    """The endpoint, config and model the record's current attempt holds (from its create step)."""
    create = record.step_dict("create_endpoint")
    endpoint = str(record.endpoint_name or resource_name_for(resource_prefix or "modeldrop", record.deployment_id))
    return Held(
        endpoint,
        str(create.get("endpoint_config_name") or endpoint),
        str(create.get("model_name") or endpoint),
    )


def teardown(
    sm: SageMakerClient,
    registry: Registry | None,
    deployment_id: str,
    held: Held,
    owner: str | None = None,
    s3: S3Client | None = None,
    artifact_uri: Artifact | None = None,
) -> TeardownResult:
    """Delete at once what the deployment OWNER (default: DEPLOYMENT_ID) holds -- HELD, and any
    stranded earlier attempt -- nothing else, and (given S3) the served copy once the endpoint is gone
    (the CLI and the local run; the state machine uses teardown_pass in a wait loop)."""
    owner = owner if owner is not None else deployment_id
    stranded = stranded_of(registry.get(deployment_id)) if registry is not None else []
    deleted, gone, failed, not_ours = delete_now(sm, s3, held, owner, artifact_uri, stranded)
    result = TeardownResult(deleted=deleted, already_gone=gone, left_behind=failed, not_ours=not_ours)
    if registry is not None:  # ended only when nothing is left: a base that still serves stays live
        ended = None if failed else clock.iso(clock.utcnow())
        registry.record(deployment_id, "teardown", result.model_dump(mode="json"), ended_at=ended)
    if failed:
        raise TeardownIncomplete(f"could not delete: {'; '.join(failed)}")
    return result


def delete_now(
    sm: SageMakerClient,
    s3: S3Client | None,
    held: Held,
    owner: str,
    artifact_uri: Artifact | None,
    also: list[Held] | None = None,
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Endpoint, then its config and model (as the live endpoint names them, else as HELD does), then
    ALSO (earlier attempts' stranded endpoints), then the served copy unless something was left.
    Returns delete_all's (deleted, already_gone, failed, not_ours). A Deleting endpoint no longer
    needs its config and model, so nothing waits."""
    resource_name, config, model = held.endpoint, held.config, held.model
    components = components_mod.Released()
    try:
        desc = describe_endpoint(sm, resource_name)
        if desc is not None:
            config = str(desc.get("EndpointConfigName") or config)
            variants = sm.describe_endpoint_config(EndpointConfigName=config).get("ProductionVariants") or []
            model = str(variants[0].get("ModelName") or model) if variants else model
            if variants and not variants[0].get("ModelName"):  # shared: its components go first
                components = components_mod.release_all(sm, resource_name, owner)
    except (ClientError, SageMakerThrottled):
        pass  # the names stay the attempt's, and the deletes below say what is wrong
    if components.waiting:
        # Still deleting past this Lambda's time: the endpoint (and its config and model) wait for
        # them, and the reaper's next run finishes what this one started.
        waiting = ", ".join(components.waiting)
        deleted: list[str] = []
        gone: list[str] = []
        failed = [f"endpoint/{resource_name}: waiting for {waiting} to delete"]
        not_ours: list[str] = []
    else:
        deleted, gone, failed, not_ours = delete_all(sm, resource_name, config, model, owner=owner)
    # A base still holding another deployment's adapters is not deleted: that is left behind, not done.
    deleted[:0], failed[:0] = components.deleted, components.failed + components.blocked
    for held in also or []:
        more = delete_all(sm, held.endpoint, held.config, held.model, owner=owner)
        for into, items in zip((deleted, gone, failed, not_ours), more, strict=True):
            into += items
    if s3 is not None and not failed:
        deleted += delete_served_for(s3, artifact_uri, owner)
    return deleted, gone, failed, not_ours


# The teardown loop's own deadline, and how often it looks again.
TEARDOWN_DEADLINE_SECONDS = 1800
TEARDOWN_RECHECK_SECONDS = 15


def teardown_pass(
    sm: SageMakerClient,
    s3: S3Client | None,
    registry: Registry | None,
    deployment_id: str,
    resource_name: str,
    attempt: int = 0,
    deadline_at: str | None = None,
    artifact_uri: Artifact | None = None,
    final: bool = True,
    sagemaker: bool = True,
    owner: str | None = None,
    endpoint_name: str | None = None,
) -> TeardownProgress:
    """One pass of the state machine's teardown loop. The endpoint goes first; its config and model
    (and, when FINAL, the served copy) only once it is gone -- a live endpoint is never stranded
    without them. A refused or throttled DeleteEndpoint is retried on the next pass; past the
    deadline the deployment is left to the reaper, which retries on its next run.

    ENDPOINT_NAME is the attempt's endpoint (the resource name unless an earlier attempt's endpoint
    still held it). Releasing a failed attempt (not FINAL), an endpoint SageMaker refuses to delete
    while it is Creating (it has no instance, and bills nothing) is recorded as stranded and the
    loop moves on: the next type need not wait for SageMaker to give up on it. The FINAL teardown
    deletes the stranded ones too."""
    now = clock.utcnow()
    deadline = deadline_at or clock.iso(now + timedelta(seconds=TEARDOWN_DEADLINE_SECONDS))
    progress = TeardownProgress(done=False, deadline_at=deadline, wait_seconds=TEARDOWN_RECHECK_SECONDS)
    part = attempt_name(resource_name, attempt)
    held = [Held(endpoint_name or resource_name, part, part)]
    if final and sagemaker:
        held += _stranded_too(registry, deployment_id, held[0].endpoint)
    released = [_release(sm, deployment_id, h, progress, strand=not final) for h in held] if sagemaker else []
    if all(released) and not progress.left_behind:
        if final and s3 is not None:
            progress.deleted += delete_served_for(s3, artifact_uri, deployment_id)
        progress.done = True
    if progress.stranded and registry is not None:
        _record_stranded(registry, deployment_id, [h for h in held if h.endpoint in progress.stranded], owner)
    if not progress.done and now >= clock.parse_iso(deadline):
        progress.gave_up = True
    if registry is not None and final:
        _record_teardown(registry, deployment_id, progress, now, owner)
    return progress


def _stranded_too(registry: Registry | None, deployment_id: str, endpoint: str) -> list[Held]:
    """Earlier attempts' stranded endpoints, which the final teardown deletes as well."""
    if registry is None:
        return []
    return [h for h in stranded_of(registry.get(deployment_id)) if h.endpoint != endpoint]


def _release(sm: SageMakerClient, deployment_id: str, held: Held, progress: TeardownProgress, strand: bool) -> bool:
    """The endpoint, then (once it is gone) its config and model; True once all three are released. A
    STRAND-able endpoint refused while Creating is stranded (released, with its config and model
    kept for it) instead of waited for."""
    endpoint_gone = _endpoint_pass(sm, deployment_id, held.endpoint, progress, strand)
    if held.endpoint in progress.stranded:
        return True
    if not endpoint_gone:
        return False
    deleted, gone, failed, not_ours = delete_all(sm, None, held.config, held.model, owner=deployment_id)
    progress.deleted += deleted
    progress.already_gone += gone
    progress.left_behind += failed
    progress.not_ours += not_ours
    return not failed


def _record_stranded(registry: Registry, deployment_id: str, stranded: list[Held], owner: str | None) -> None:
    known = stranded_of(registry.get(deployment_id))
    added = [h for h in stranded if h.endpoint not in {k.endpoint for k in known}]
    if added:
        entries = [{"endpoint": h.endpoint, "config": h.config, "model": h.model} for h in [*known, *added]]
        registry.record(deployment_id, "stranded", entries, owner=owner)


def _record_teardown(
    registry: Registry, deployment_id: str, progress: TeardownProgress, now: datetime, owner: str | None
) -> None:
    """The loop's passes as one teardown step: what every pass so far deleted, in order."""
    record = registry.get(deployment_id)
    earlier = record.step_dict("teardown") if record else {}
    if earlier.get("deadline_at") == progress.deadline_at:
        progress.deleted = [*earlier.get("deleted", []), *progress.deleted]
        progress.already_gone = [g for g in progress.already_gone if g not in progress.deleted]
    fields: dict[str, Any] = {}
    if progress.done or progress.gave_up:
        fields["ended_at"] = clock.iso(now)
    if progress.gave_up:
        fields["reaper_retry"] = True  # left to the reaper, which retries on its next run
    registry.record(deployment_id, "teardown", progress.model_dump(mode="json"), owner=owner, **fields)


def _endpoint_pass(
    sm: SageMakerClient, deployment_id: str, name: str, progress: TeardownProgress, strand: bool = False
) -> bool:
    """Ask for the endpoint's deletion (again) unless it is already Deleting; True once it is gone. With
    STRAND, an endpoint SageMaker refuses to delete while it is Creating is stranded (and counts as
    released) instead of retried."""
    try:
        desc = describe_endpoint(sm, name)
    except SageMakerThrottled as exc:
        progress.left_behind.append(f"endpoint/{name}: {exc.message}")
        return False
    if desc is None:
        progress.already_gone.append(f"endpoint/{name}")
        return True
    status = str(desc.get("EndpointStatus"))
    progress.endpoint_status = status
    if status != "Deleting" and _for_components(sm, str(desc.get("EndpointConfigName"))):
        # Its own components first, adapters then base, one pass at a time (on another deployment's
        # endpoint, those are all it holds there).
        released = components_mod.release(sm, name, deployment_id)
        progress.deleted += released.deleted
        progress.left_behind += released.failed + released.blocked
        if components_mod.pending(sm, name, deployment_id):
            return False
    if list_tags(sm, desc["EndpointArn"]).get(DEPLOYMENT_TAG) != deployment_id:
        progress.not_ours.append(f"endpoint/{name}")
        return True  # someone else's endpoint: never deleted (its own components of ours are gone)
    if status == "Deleting":
        return False
    try:
        sm.delete_endpoint(EndpointName=name)
        progress.deleted.append(f"endpoint/{name}")
    except ClientError as exc:
        message = exc.response.get("Error", {}).get("Message", str(exc))
        if strand and status == "Creating":
            progress.stranded.append(name)
            return False
        progress.left_behind.append(f"endpoint/{name} ({status}): {message}")
    return False


def _for_components(sm: SageMakerClient, config: str) -> bool:
    """Whether the endpoint hosts components; a config this role may not read is not ours to release."""
    try:
        return components_mod.for_components(sm, config)
    except ClientError:
        return False


ENDED_STATUSES = {"ABORTED": "aborted", "TIMED_OUT": "timed_out", "FAILED": "failed"}


def on_execution_ended(
    sm: SageMakerClient,
    s3: S3Client | None,
    registry: Registry,
    events: EventBridgeClient,
    bus: str,
    detail: Mapping[str, Any],
    resource_prefix: str,
) -> dict[str, Any]:
    """The state machine's own status change (EventBridge): an execution that was stopped, timed out
    or failed without its teardown still owns an endpoint -- delete it now, not at its TTL, and mark
    the record. Idempotent: an execution that tore down its own resources costs three describes."""
    status = str(detail.get("status", ""))
    name = str(detail.get("name", ""))
    if status not in ENDED_STATUSES or not name or detail.get("startDate") is None:
        return {"status": "ignored", "reason": f"execution {name or '?'} is {status or 'of unknown status'}"}
    deployment_id = deployment_id_for(name, epoch_ms(detail["startDate"]))
    execution_arn = str(detail.get("executionArn") or "")
    record = registry.get(deployment_id)
    if record is None:
        if status != "FAILED" and execution_arn:
            # Stopped before it registered: a closed record in its place, so that a RegisterDeployment
            # still running finds the deployment ended and creates nothing.
            registry.tombstone(deployment_id, name, execution_arn, ENDED_STATUSES[status])
        return {"status": "ignored", "reason": f"no record of {deployment_id}: nothing was created"}
    if execution_arn and record.execution_arn and record.execution_arn != execution_arn:
        return {"status": "ignored", "reason": f"{deployment_id} belongs to {record.execution_arn}: not touched"}
    if record.step_dict("smoke_eval").get("passed") and status == "FAILED":
        # Only its bookkeeping failed (DeploymentUnrecorded): a healthy endpoint is kept until its TTL.
        return {"status": "kept", "reason": f"{deployment_id} passed its smoke eval; its TTL applies"}
    if record.status == "succeeded":
        # Stopped while MarkSucceeded ran (or just after): the deployment is complete and recorded, so it
        # is kept as any succeeded one is -- deleting its endpoint would leave a record that says
        # succeeded, a version claimed and nothing serving.
        return {"status": "kept", "reason": f"{deployment_id} had succeeded when its execution ended ({status})"}
    deleted, gone, failed, _not_ours = delete_now(
        sm, s3, held_by(record, resource_prefix), deployment_id, record.artifact_uri, stranded_of(record)
    )
    outcome = ENDED_STATUSES[status]
    fields: dict[str, Any] = {"ended_at": clock.iso(clock.utcnow())}
    if failed:
        fields["reaper_retry"] = True
    result = {"status": status, "deleted": deleted, "already_gone": gone, "left_behind": failed}
    marked = record.status in TRANSITIONS[outcome]
    try:
        item = registry.record(deployment_id, "execution_ended", result, status=outcome if marked else None, **fields)
    except StepContractViolated:  # it ended some other way while this ran: keep that status
        marked = False
        item = registry.record(deployment_id, "execution_ended", result, **fields)
    if marked:
        publish(
            events,
            bus,
            "Deployment Failed",
            {**lifecycle_detail(item, outcome), "executionStatus": status, "deleted": deleted},
        )
    return {"status": outcome, "deleted": deleted, "left_behind": failed, "marked": marked}
