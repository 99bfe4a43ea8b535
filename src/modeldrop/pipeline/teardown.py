"""Teardown: the state machine's loop (endpoint first, then, once it is gone, its config, model and
served copy), the CLI's immediate teardown, and the rule on the state machine's own status changes
that deletes what a stopped, timed-out or failed execution still owns."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.events_bus import lifecycle_detail, publish
from modeldrop.aws.registry import Registry
from modeldrop.aws.sagemaker_resources import DEPLOYMENT_TAG, delete_all, describe_endpoint, list_tags
from modeldrop.aws.served_copy import delete_served_for
from modeldrop.contracts import clock
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import SageMakerThrottled, TeardownIncomplete
from modeldrop.contracts.models import TeardownProgress, TeardownResult, deployment_id_for, resource_name_for
from modeldrop.pipeline.attempts import attempt_name

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient


def teardown(
    sm: SageMakerClient,
    registry: Registry | None,
    deployment_id: str,
    resource_name: str,
    owner: str | None = None,
    s3: S3Client | None = None,
    artifact_uri: Artifact | None = None,
    attempt: int = 0,
) -> TeardownResult:
    """Delete at once what the deployment OWNER (default: DEPLOYMENT_ID) created under RESOURCE_NAME,
    nothing else, and (given S3) the served copy once the endpoint is gone (the CLI and the local run;
    the state machine uses teardown_pass in a wait loop)."""
    owner = owner if owner is not None else deployment_id
    deleted, gone, failed, not_ours = delete_now(sm, s3, resource_name, attempt, owner, artifact_uri)
    result = TeardownResult(deleted=deleted, already_gone=gone, left_behind=failed, not_ours=not_ours)
    if registry is not None:
        registry.record(deployment_id, "teardown", result.model_dump(mode="json"), ended_at=clock.iso(clock.utcnow()))
    if failed:
        raise TeardownIncomplete(f"could not delete: {'; '.join(failed)}")
    return result


def delete_now(
    sm: SageMakerClient,
    s3: S3Client | None,
    resource_name: str,
    attempt: int,
    owner: str,
    artifact_uri: Artifact | None,
) -> tuple[list[str], list[str], list[str], list[str]]:
    """Endpoint, then its config and model (named by the live endpoint, else by ATTEMPT: a fallback
    attempt's are named apart from the endpoint), then the served copy unless something was left.
    Returns delete_all's (deleted, already_gone, failed, not_ours). A Deleting endpoint no longer
    needs its config and model, so nothing waits here."""
    config = model = attempt_name(resource_name, attempt)
    try:
        desc = describe_endpoint(sm, resource_name)
        if desc is not None:
            config = str(desc.get("EndpointConfigName") or config)
            variants = sm.describe_endpoint_config(EndpointConfigName=config).get("ProductionVariants") or []
            model = str(variants[0].get("ModelName") or model) if variants else model
    except (ClientError, SageMakerThrottled):
        pass  # the names stay the attempt's, and the deletes below say what is wrong
    deleted, gone, failed, not_ours = delete_all(sm, resource_name, config, model, owner=owner)
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
) -> TeardownProgress:
    """One pass of the state machine's teardown loop. The endpoint goes first; its config and model
    (and, when FINAL, the served copy) only once it is gone -- a live endpoint is never stranded
    without them. A refused or throttled DeleteEndpoint is retried on the next pass; past the
    deadline the deployment is left to the reaper, which retries on its next run."""
    now = clock.utcnow()
    deadline = deadline_at or clock.iso(now + timedelta(seconds=TEARDOWN_DEADLINE_SECONDS))
    progress = TeardownProgress(done=False, deadline_at=deadline, wait_seconds=TEARDOWN_RECHECK_SECONDS)
    part = attempt_name(resource_name, attempt)
    endpoint_gone = True
    if sagemaker:
        endpoint_gone = _endpoint_pass(sm, deployment_id, resource_name, progress)
    if endpoint_gone:
        if sagemaker:
            deleted, gone, failed, not_ours = delete_all(sm, None, part, part, owner=deployment_id)
            progress.deleted += deleted
            progress.already_gone += gone
            progress.left_behind += failed
            progress.not_ours += not_ours
        if final and s3 is not None and not progress.left_behind:
            progress.deleted += delete_served_for(s3, artifact_uri, deployment_id)
        progress.done = not progress.left_behind
    if not progress.done and now >= clock.parse_iso(deadline):
        progress.gave_up = True
    if registry is not None and final:
        _record_teardown(registry, deployment_id, progress, now)
    return progress


def _record_teardown(registry: Registry, deployment_id: str, progress: TeardownProgress, now: datetime) -> None:
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
    registry.record(deployment_id, "teardown", progress.model_dump(mode="json"), **fields)


def _endpoint_pass(sm: SageMakerClient, deployment_id: str, name: str, progress: TeardownProgress) -> bool:
    """Ask for the endpoint's deletion (again) unless it is already Deleting; True once it is gone."""
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
    if list_tags(sm, desc["EndpointArn"]).get(DEPLOYMENT_TAG) != deployment_id:
        progress.not_ours.append(f"endpoint/{name}")
        return True  # someone else's endpoint under our name: never deleted, and it holds nothing of ours
    if status == "Deleting":
        return False
    try:
        sm.delete_endpoint(EndpointName=name)
        progress.deleted.append(f"endpoint/{name}")
    except ClientError as exc:
        message = exc.response.get("Error", {}).get("Message", str(exc))
        progress.left_behind.append(f"endpoint/{name} ({status}): {message}")
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
    if status not in ENDED_STATUSES or not name:
        return {"status": "ignored", "reason": f"execution {name or '?'} is {status or 'of unknown status'}"}
    deployment_id = deployment_id_for(name)
    record = registry.get(deployment_id)
    if record is None:
        return {"status": "ignored", "reason": f"no record of {deployment_id}: nothing was created"}
    if record.step_dict("smoke_eval").get("passed") and status == "FAILED":
        # Only its bookkeeping failed (DeploymentUnrecorded): a healthy endpoint is kept until its TTL.
        return {"status": "kept", "reason": f"{deployment_id} passed its smoke eval; its TTL applies"}
    resource_name = record.endpoint_name or resource_name_for(resource_prefix, deployment_id)
    attempt = int(record.step_dict("create_endpoint").get("attempt") or 0)
    deleted, gone, failed, _not_ours = delete_now(sm, s3, resource_name, attempt, deployment_id, record.artifact_uri)
    outcome = ENDED_STATUSES[status]
    fields: dict[str, Any] = {"ended_at": clock.iso(clock.utcnow())}
    if failed:
        fields["reaper_retry"] = True
    marked = not record.terminal
    item = registry.record(
        deployment_id,
        "execution_ended",
        {"status": status, "deleted": deleted, "already_gone": gone, "left_behind": failed},
        status=outcome if marked else None,
        **fields,
    )
    if marked:
        publish(
            events,
            bus,
            "Deployment Failed",
            {**lifecycle_detail(item, outcome), "executionStatus": status, "deleted": deleted},
        )
    return {"status": outcome, "deleted": deleted, "left_behind": failed, "marked": marked}
