"""Teardown across the stack: every managed endpoint before `sam delete`, and one adapter component
of a shared deployment."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.sagemaker.sagemaker_resources import (
    MANAGED_BY_TAG,
    list_endpoints,
    list_tags,
)
from modeldrop.contracts.errors import ModeldropError

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_stepfunctions import SFNClient

from modeldrop.operate.deployments import OperateError, StackInfo, find_deployment, refuse_if_channel_holds, teardown


def live_endpoints(sm: SageMakerClient, stack_tag: str, resource_prefix: str, deleting: bool = False) -> list[str]:
    """Every endpoint this stack manages that still exists (whatever its record says) and is not being
    deleted already; with DELETING, only those that are."""
    names = []
    for endpoint in list_endpoints(sm):
        name = str(endpoint["EndpointName"])
        if (endpoint.get("EndpointStatus") == "Deleting") != deleting:
            continue
        if name.startswith(f"{resource_prefix}-") and list_tags(sm, endpoint["EndpointArn"]).get(MANAGED_BY_TAG) == (
            stack_tag
        ):
            names.append(name)
    return sorted(names)


def teardown_adapter_now(sm: SageMakerClient, registry: Registry, id_or_endpoint: str, adapter: str) -> dict[str, Any]:
    """adapter_mode shared: delete one adapter's inference component now; the base endpoint and the
    other adapters serve on (the whole deployment still goes at its TTL, or with `teardown`)."""
    from modeldrop.pipeline.adapters.component_steps import adapter_components, teardown_adapter

    item = find_deployment(registry, id_or_endpoint, sm, acting=True)
    if item.ended_at is not None:
        raise OperateError(f"deployment {item.deployment_id} already ended ({item.status}): nothing is left to delete")
    if not adapter_components(item):
        raise OperateError(
            f"deployment {item.deployment_id} serves no adapter inference components (not adapter_mode shared)",
            f"tear the whole deployment down: modeldrop teardown {item.deployment_id}",
        )
    refuse_if_channel_holds(registry, item.deployment_id, adapter)  # by the adapter's name or its component's
    deleted = teardown_adapter(sm, registry, item, adapter)
    removed = {
        str(e.get("component")) for e in (registry.get(item.deployment_id) or item).step("adapters_removed") or []
    }
    serving = [str(a["adapter"]) for a in adapter_components(item) if str(a["component"]) not in removed]
    return {"deployment_id": item.deployment_id, "deleted": deleted, "serving": serving}


def teardown_all(
    sm: SageMakerClient,
    registry: Registry,
    events: EventBridgeClient,
    info: StackInfo,
    s3: S3Client | None = None,
    sfn: SFNClient | None = None,
) -> list[dict[str, Any]]:
    """Tear down every endpoint the stack manages (before `sam delete`, which removes the reaper and
    the alarms but leaves endpoints billing). Running executions are stopped first, so that none
    creates an endpoint after the sweep. Each result, or its error, per endpoint."""
    results: list[dict[str, Any]] = []
    if sfn is not None:
        pages = sfn.get_paginator("list_executions").paginate(
            stateMachineArn=info.state_machine_arn, statusFilter="RUNNING"
        )
        for page in pages:
            for execution in page["executions"]:
                sfn.stop_execution(executionArn=execution["executionArn"], cause="modeldrop teardown --all")
                results.append({"execution": execution["name"], "stopped": True})
    # Adapters attached to another deployment's endpoint first: that endpoint's base waits for them.
    for record in registry.deployments():
        if record.ended_at is None and record.step_dict("create_endpoint").get("attached_to"):
            try:
                done = teardown(sm, registry, events, info, record.deployment_id, s3=s3)
                results.append({"deployment_id": record.deployment_id, "deleted": done["deleted"]})
            except ModeldropError as exc:
                results.append({"deployment_id": record.deployment_id, "error": exc.message})
    for name in live_endpoints(sm, info.stack_tag, info.resource_prefix):
        try:
            done = teardown(sm, registry, events, info, name, s3=s3)
            results.append({"endpoint": name, "deleted": done["deleted"]})
        except ModeldropError as exc:
            results.append({"endpoint": name, "error": exc.message})
    # Already going (a channel just closed, a teardown moments ago): nothing to do but say so.
    handled = {r.get("endpoint") for r in results}
    going = [n for n in live_endpoints(sm, info.stack_tag, info.resource_prefix, deleting=True) if n not in handled]
    results += [{"endpoint": name, "deleting": True} for name in going]
    return results
