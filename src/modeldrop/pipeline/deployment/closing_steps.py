"""The state machine's closing steps: record what failed (before anything is deleted), mark the outcome."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from modeldrop.aws import endpoint_logs
from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.events_bus import lifecycle_detail, publish
from modeldrop.aws.sagemaker.sagemaker_resources import (
    describe_endpoint,
)
from modeldrop.contracts import clock
from modeldrop.contracts.env_safety import redact
from modeldrop.contracts.errors import (
    DeploymentEnded,
    cause_message,
    classify,
)
from modeldrop.contracts.step_payloads import FailureRecord

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_logs import CloudWatchLogsClient
    from mypy_boto3_sagemaker import SageMakerClient


def record_failure(
    sm: SageMakerClient,
    logs: CloudWatchLogsClient,
    registry: Registry,
    deployment_id: str,
    resource_name: str,
    failure: Mapping[str, Any],
    phase: str = "endpoint",
    owner: str = "",
) -> FailureRecord:
    """Record what failed. Before any SageMaker resource exists (phase "prepare") nothing is described."""
    error = str(failure.get("Error") or "States.Runtime")
    cause = redact(cause_message(str(failure.get("Cause") or "")) or "")
    desc = describe_endpoint(sm, resource_name) if phase == "endpoint" else None
    endpoint_reason = desc.get("FailureReason") if desc else None
    diagnosis, component_lines, component_group = None, None, ""
    if desc is not None:
        # Read before teardown: the log group outlives the endpoint, but the cause belongs in the record.
        lines = endpoint_logs.read_recent(logs, resource_name)
        # Shared: the engine runs in the base inference component (named as the endpoint), which logs apart.
        component_group = endpoint_logs.component_log_group_for(resource_name)
        component_lines = endpoint_logs.read_recent(logs, resource_name, group=component_group)
        if component_lines:
            lines = [*(lines or []), *component_lines]
        diagnosis = endpoint_logs.diagnose(lines) if lines else None
    record = FailureRecord(
        error=error,
        cause=cause[:4000],
        failure_class=classify(error),
        state=failure.get("State"),
        endpoint_failure_reason=endpoint_reason,
        log_group=(component_group if component_lines else endpoint_logs.log_group_for(resource_name))
        if desc is not None
        else None,
        log_excerpt=diagnosis.excerpt if diagnosis else [],
        diagnosis=diagnosis.diagnosis if diagnosis else None,
        hint=diagnosis.hint if diagnosis and diagnosis.hint else None,
        phase=phase,
    )
    try:
        registry.record(
            deployment_id,
            "failure",
            record.model_dump(mode="json"),
            status="failing",
            owner=owner,
            live=True,
            error=error,
            failure_class=record.failure_class,
            failure_reason=(endpoint_reason or cause)[:4000],
        )
    except DeploymentEnded:
        # Ended under us (stopped, torn down): the cause is still worth keeping; the status stays.
        registry.record(deployment_id, "failure", record.model_dump(mode="json"), owner=owner)
    return record


def finalize(
    registry: Registry,
    events: EventBridgeClient,
    bus: str,
    deployment_id: str,
    outcome: str,
    summary: Mapping[str, Any],
    owner: str = "",
) -> dict[str, Any]:
    now = clock.iso(clock.utcnow())
    if outcome == "succeeded":
        item = registry.record(
            deployment_id, "result", dict(summary), status="succeeded", owner=owner, live=True, succeeded_at=now
        )
    else:
        try:
            item = registry.record(
                deployment_id, "result", dict(summary), status="failed", owner=owner, live=True, ended_at=now
            )
        except DeploymentEnded:
            # Whatever ended it (the execution-ended rule, a teardown) marked and announced it already.
            item = registry.record(deployment_id, "result", dict(summary), owner=owner)
            return lifecycle_detail(item, item.status)
    detail = lifecycle_detail(item, outcome)
    publish(events, bus, "Deployment Succeeded" if outcome == "succeeded" else "Deployment Failed", detail)
    return detail
