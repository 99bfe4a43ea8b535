"""Driving a deployed stack: find it, start deployments, read the registry, extend, tear down.

Every function takes the clients it calls; the CLI builds them from the standard AWS SDK
configuration. Refusals are OperateError with one line for the user.
"""

from __future__ import annotations

import re
import uuid
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from botocore.exceptions import ClientError
from pydantic import BaseModel

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.events_bus import lifecycle_detail, publish
from modeldrop.aws.sagemaker.sagemaker_resources import (
    DEPLOYMENT_TAG,
    EXPIRES_TAG,
    MANAGED_BY_TAG,
    describe_endpoint,
    list_tags,
)
from modeldrop.contracts import clock
from modeldrop.contracts.errors import ModeldropError, TeardownIncomplete
from modeldrop.contracts.models import DeploymentRequest
from modeldrop.contracts.record import TRANSITIONS, DeploymentRecord
from modeldrop.operate.deployment_rows import LIVE, ChannelHold, channel_holds, row_for
from modeldrop.pipeline.deployment.teardown import Held, held_by
from modeldrop.pipeline.deployment.teardown import teardown as teardown_now

if TYPE_CHECKING:
    from mypy_boto3_cloudformation import CloudFormationClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker.type_defs import DescribeEndpointOutputTypeDef
    from mypy_boto3_stepfunctions import SFNClient

_TTL = re.compile(r"^(\d+(?:\.\d+)?)\s*([mhd])$")


class OperateError(ModeldropError):
    failure_class = "request"


class StackInfo(BaseModel):
    stack_name: str
    region: str
    state_machine_arn: str
    table_name: str
    bucket: str | None = None
    event_bus: str | None = None
    max_ttl_hours: float = 24 * 14  # the stack's MaxTtlHours: `extend` cannot pass it either
    resource_prefix: str = "modeldrop"
    max_channels: int = 20  # the stack's MaxChannels: `promote` creates no channel past it either

    @property
    def stack_tag(self) -> str:
        # The value of every managed resource's modeldrop:managed-by tag (the template's AWS::StackName).
        return self.stack_name


def parse_ttl(text: str, max_hours: float = 24 * 14, limit: str = "a request's 14 days") -> float:
    """'90m', '4h', '1.5h', '2d' -> hours, at most MAX_HOURS (LIMIT names that bound)."""
    m = _TTL.match(text.strip())
    if m is None:
        raise OperateError(f"--ttl {text!r} is not a duration", "use e.g. 90m, 4h or 2d")
    value = float(m[1]) * {"m": 1 / 60, "h": 1.0, "d": 24.0}[m[2]]
    if value <= 0:
        raise OperateError(f"--ttl {text} is not a positive duration", "use e.g. 90m, 4h or 2d")
    if value > max_hours:
        raise OperateError(f"--ttl {text} ({value:g} h) is over {limit} ({max_hours:g} h)", "ask for less")
    return value


def stack_info(cfn: CloudFormationClient, stack_name: str, region: str) -> StackInfo:
    try:
        stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as exc:
        if "does not exist" in str(exc):
            raise OperateError(
                f"no stack named {stack_name} in {region}",
                "pass --stack NAME / --region, or set MODELDROP_STACK; `sam deploy` prints the name",
            ) from None
        raise
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", [])}
    missing = [k for k in ("StateMachineArn", "DeploymentsTableName") if k not in outputs]
    if missing:
        raise OperateError(f"stack {stack_name} has no {', '.join(missing)} output: is it a modeldrop stack?")
    parameters = {p["ParameterKey"]: p.get("ParameterValue", "") for p in stacks[0].get("Parameters", [])}
    return StackInfo(
        max_ttl_hours=float(parameters.get("MaxTtlHours") or 24 * 14),
        max_channels=int(parameters.get("MaxChannels") or 20),
        resource_prefix=outputs.get("ResourcePrefix") or parameters.get("ResourcePrefix") or "modeldrop",
        stack_name=stack_name,
        region=region,
        state_machine_arn=outputs["StateMachineArn"],
        table_name=outputs["DeploymentsTableName"],
        bucket=outputs.get("ArtifactBucketName"),
        event_bus=outputs.get("EventBusName"),
    )


def start_deployment(sfn: SFNClient, info: StackInfo, request: DeploymentRequest, name: str | None = None) -> str:
    name = name or f"cli-{clock.utcnow().strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    arn: str = sfn.start_execution(
        stateMachineArn=info.state_machine_arn, name=name, input=request.model_dump_json(exclude_none=True)
    )["executionArn"]
    return arn


def execution_arn(info: StackInfo, execution_name: str) -> str:
    return info.state_machine_arn.replace(":stateMachine:", ":execution:") + f":{execution_name}"


def console_links(info: StackInfo, record: DeploymentRecord) -> dict[str, str]:
    region = info.region
    links = {}
    if record.endpoint_name:
        group = quote(quote(f"/aws/sagemaker/Endpoints/{record.endpoint_name}", safe=""), safe="")
        links["endpoint_logs"] = (
            f"https://{region}.console.aws.amazon.com/cloudwatch/home?region={region}#logsV2:log-groups/log-group/"
            + group.replace("%", "$")
        )
    if record.execution_name:
        links["execution"] = (
            f"https://{region}.console.aws.amazon.com/states/home?region={region}#/v2/executions/details/"
            + execution_arn(info, record.execution_name)
        )
    return links


def deployment_status(
    info: StackInfo, record: DeploymentRecord, sm: SageMakerClient | None = None, hold: ChannelHold | None = None
) -> dict[str, Any]:
    """One record in full, decoded, with its cost, its failure (if any) and console links; given SM,
    each adapter component said to serve is looked up (one deleted outside modeldrop does not). HOLD:
    the channel serving it -- its endpoint is the channel's, with no expiry of its own."""
    row = row_for(record, hold=hold)
    status = record.to_json()
    status.update(
        cost_usd=row.cost_usd,
        cost_is_final=row.cost_is_final,
        failure=record.step("failure"),
        links=console_links(info, record),
        channel=hold.model_dump() if hold else None,
    )
    if hold is not None and hold.role != "base":
        status.update(preview_endpoint_name=record.endpoint_name, endpoint_name=hold.endpoint_name, expires_at=None)
    from modeldrop.pipeline.adapters.component_steps import adapter_shares

    if shares := adapter_shares(record):
        for share in shares:
            if sm is not None and share["serving"] and not _component_exists(sm, str(share["component"])):
                share.update(serving=False, gone="deleted outside modeldrop")
        status["adapter_components"] = shares
    return status


def _component_exists(sm: SageMakerClient, name: str) -> bool:
    try:
        found = sm.describe_inference_component(InferenceComponentName=name)
    except ClientError as exc:
        if "Could not find" in str(exc) or exc.response.get("Error", {}).get("Code") == "ValidationException":
            return False
        raise
    return found.get("InferenceComponentStatus") != "Deleting"


def attached_to(registry: Registry, deployment_id: str) -> list[dict[str, Any]]:
    """The live deployments whose adapters sit on DEPLOYMENT_ID's base endpoint (base_endpoint)."""
    from modeldrop.pipeline.adapters.component_steps import adapter_shares

    return [
        {
            "deployment_id": other.deployment_id,
            "adapters": [str(s["adapter"]) for s in adapter_shares(other) if s["serving"]],
        }
        for other in registry.deployments()
        if other.ended_at is None and other.step_dict("create_endpoint").get("attached_to") == deployment_id
    ]


def find_deployment(
    registry: Registry, id_or_endpoint: str, sm: SageMakerClient | None = None, acting: bool = False
) -> DeploymentRecord:
    """The deployment an id, an endpoint name, or its execution's name or ARN means.

    By endpoint name it is the deployment that owns the endpoint (its modeldrop:deployment-id tag),
    never another deployment that merely asked for the same name and failed. With no endpoint of
    that name, a deployment still in flight under it counts; ACTING (teardown, extend) refuses an
    ended one, while `status` shows the newest."""
    record = registry.get(id_or_endpoint)
    if record is not None:
        return record
    if sm is not None:
        desc = describe_endpoint(sm, id_or_endpoint)
        if desc is not None:
            owner = list_tags(sm, desc["EndpointArn"]).get(DEPLOYMENT_TAG)
            owned = registry.get(owner) if owner else None
            if owned is not None and owned.endpoint_name == id_or_endpoint:
                return owned
            raise OperateError(
                f"endpoint {id_or_endpoint} belongs to deployment {owner or '(no modeldrop:deployment-id tag)'}, "
                + ("whose record does not name it" if owned else "which has no record in this registry"),
                f"`modeldrop teardown {id_or_endpoint}` deletes it by its tags; `modeldrop list` shows the deployments",
            )
    naming = [c for c in registry.deployments() if c.endpoint_name == id_or_endpoint]
    in_flight = [c for c in naming if not c.terminal]
    if in_flight:
        return in_flight[0]
    if naming and not acting:
        return naming[0]
    if naming:
        ended = ", ".join(f"{c.deployment_id} ({c.status})" for c in naming[:3])
        raise OperateError(
            f"no endpoint named {id_or_endpoint} exists; the deployments that asked for it have ended: {ended}",
            "nothing to do; `modeldrop status ID` shows each",
        )
    by_execution = _by_execution(registry, id_or_endpoint)
    if by_execution is not None:  # the execution's name or ARN, as `deploy` prints it when it starts
        return by_execution
    raise OperateError(f"no deployment or endpoint {id_or_endpoint!r} in this stack's registry", "see `modeldrop list`")


def _by_execution(registry: Registry, name_or_arn: str) -> DeploymentRecord | None:
    return next((c for c in registry.deployments() if c.execution_arn
                 and name_or_arn in (c.execution_arn, c.execution_arn.rsplit(":", 1)[-1])), None)  # fmt: skip


def _managed_endpoint(sm: SageMakerClient, info: StackInfo, name: str) -> DescribeEndpointOutputTypeDef | None:
    """The endpoint if it exists; refuses one this stack does not manage."""
    desc = describe_endpoint(sm, name)
    if desc is None:
        return None
    tags = list_tags(sm, desc["EndpointArn"])
    if tags.get(MANAGED_BY_TAG) != info.stack_tag:
        owner = tags.get(MANAGED_BY_TAG)
        raise OperateError(
            f"endpoint {name} is not managed by stack {info.stack_name}"
            + (f" (managed-by: {owner})" if owner else " (no modeldrop:managed-by tag)"),
            "modeldrop only touches endpoints it created",
        )
    return desc


def extend(
    sm: SageMakerClient, registry: Registry, info: StackInfo, id_or_endpoint: str, ttl_hours: float
) -> DeploymentRecord:
    """Move the expiry to now + ttl, on the endpoint's tag and in the record together."""
    if ttl_hours > info.max_ttl_hours:
        raise OperateError(
            f"--ttl of {ttl_hours:g} h is over the stack's MaxTtlHours of {info.max_ttl_hours:g}",
            "ask for less, or have the stack's owner raise MaxTtlHours",
        )
    item = find_deployment(registry, id_or_endpoint, sm, acting=True)
    if hold := channel_holds(registry).get(item.deployment_id):
        raise OperateError(
            f"deployment {item.deployment_id} {hold.words} channel {hold.channel}: it serves on "
            f"{hold.endpoint_name} until another version replaces it, with no expiry to extend",
            f"`modeldrop rollback {hold.channel}` returns the channel to the version before; "
            f"`modeldrop teardown {hold.channel}` closes the channel",
        )
    if item.status not in LIVE:
        raise OperateError(f"deployment {item.deployment_id} is {item.status}: there is nothing to extend")
    name = str(item.endpoint_name)
    desc = _managed_endpoint(sm, info, name)
    if desc is None:
        raise OperateError(f"endpoint {name} no longer exists", "the deployment ended; redeploy to get a new one")
    expires_at = clock.iso(clock.utcnow() + timedelta(hours=ttl_hours))
    # What the deployment owns carries its expiry: on another deployment's base endpoint, its own adapter
    # components only (the endpoint's expiry is its owner's, and moving it would keep the base alive).
    for arn in _owned_arns(sm, item, desc):
        sm.add_tags(ResourceArn=arn, Tags=[{"Key": EXPIRES_TAG, "Value": expires_at}])
    previous = item.expires_at
    return registry.record(item.deployment_id, "extended", {"from": previous, "to": expires_at}, expires_at=expires_at)


def _owned_arns(sm: SageMakerClient, item: DeploymentRecord, desc: DescribeEndpointOutputTypeDef) -> list[str]:
    from modeldrop.pipeline.adapters.component_steps import adapter_components

    if not item.step_dict("create_endpoint").get("attached_to"):
        return [desc["EndpointArn"]]
    arns = []
    for component in adapter_components(item):
        try:
            found = sm.describe_inference_component(InferenceComponentName=str(component["component"]))
        except ClientError:
            continue  # torn down already: nothing to extend
        arn = found["InferenceComponentArn"]
        if list_tags(sm, arn).get(DEPLOYMENT_TAG) == item.deployment_id:  # its own, never another's
            arns.append(arn)
    if not arns:
        raise OperateError(f"deployment {item.deployment_id} has no adapter component left to extend")
    return arns


def teardown(
    sm: SageMakerClient,
    registry: Registry,
    events: EventBridgeClient,
    info: StackInfo,
    id_or_endpoint: str,
    s3: S3Client | None = None,
) -> dict[str, Any]:
    """Delete a managed deployment now, with the state machine's own teardown order, and announce it.

    An endpoint name means the deployment its tags name; a managed endpoint whose deployment left no
    record is deleted by its tags alone. Having deleted nothing is never a success."""
    item = _record_to_tear_down(sm, registry, info, id_or_endpoint)
    name = str(item.endpoint_name) if item else id_or_endpoint
    desc = _managed_endpoint(sm, info, name)
    going = desc is not None and desc.get("EndpointStatus") == "Deleting"
    if item is not None and item.terminal and (desc is None or going):
        # Torn down already (a second teardown, the state machine's, the reaper's): nothing to do is the
        # outcome asked for, said as such.
        gone = [f"endpoint/{name} (deleting)"] if going else []
        return {"deleted": [], "already_gone": gone, "already_ended": item.status, "record": item.to_json()}
    owner = item.deployment_id if item is not None else _tagged_owner(sm, desc)
    try:
        # The state machine's own Teardown step: endpoint -> endpoint config -> model, recorded.
        done = teardown_now(
            sm,
            registry if item else None,
            owner,
            held_by(item) if item else Held(name, name, name),
            s3=s3,
            artifact_uri=item.artifact_uri if item else None,
        )
    except TeardownIncomplete as exc:
        raise OperateError(exc.message, "retry; the reaper also removes leftovers") from None
    attached = item is not None and item.step_dict("create_endpoint").get("attached_to")
    if desc is not None and f"endpoint/{name}" not in done.deleted and not attached and not going:
        raise OperateError(
            f"endpoint {name} was not deleted: {', '.join(done.not_ours) or 'it belongs to another deployment'}",
            "`modeldrop status NAME` names its owner",
        )
    result: dict[str, Any] = {"deleted": done.deleted, "already_gone": done.already_gone}
    if item is not None:
        result["record"] = _record_torn_down(registry, events, info, item, result).to_json()
    return result


def _record_to_tear_down(
    sm: SageMakerClient, registry: Registry, info: StackInfo, id_or_endpoint: str
) -> DeploymentRecord | None:
    """The deployment ID_OR_ENDPOINT names (None: a managed endpoint whose deployment left no record, to
    be deleted by its tags alone); refused if a channel holds it."""
    try:
        item = find_deployment(registry, id_or_endpoint, sm, acting=True)
    except OperateError:
        if registry.get(id_or_endpoint) is not None or _managed_endpoint(sm, info, id_or_endpoint) is None:
            raise
        return None
    refuse_if_channel_holds(registry, item.deployment_id)
    return item


def refuse_if_channel_holds(registry: Registry, deployment_id: str, component: str | None = None) -> None:
    """A deployment a channel serves or keeps (COMPONENT: that adapter component of it): its config and
    model, or its component, are the channel's now."""
    from modeldrop.aws.dynamodb.channel_store import ChannelStore
    from modeldrop.contracts.channel import ChannelVersion

    def held_in(version: ChannelVersion) -> bool:
        return version.deployment_id == deployment_id and component in (None, version.component, version.adapter)

    for channel in ChannelStore(registry.table).all():
        if component is None and channel.base_deployment == deployment_id:
            held = "runs the base of adapter"
        elif channel.live and held_in(channel.live):
            held = "serves"
        elif any(held_in(v) for v in channel.kept):
            held = "is kept for a rollback by"
        else:
            continue
        raise OperateError(
            f"deployment {deployment_id} {held} channel {channel.name}",
            f"`modeldrop teardown {channel.name}` closes the channel (its endpoint and every version it holds)",
        )


def _record_torn_down(
    registry: Registry, events: EventBridgeClient, info: StackInfo, item: DeploymentRecord, result: dict[str, Any]
) -> DeploymentRecord:
    item = registry.record(
        item.deployment_id,
        "torn_down",
        result,
        status="torn_down" if item.status in TRANSITIONS["torn_down"] else None,
        ended_at=clock.iso(clock.utcnow()),
    )
    if info.event_bus:
        publish(events, info.event_bus, "Deployment Torn Down", {**lifecycle_detail(item, "torn_down"), **result})
    return item


def _tagged_owner(sm: SageMakerClient, desc: DescribeEndpointOutputTypeDef | None) -> str:
    """The deployment id on a managed endpoint that no record names."""
    tags = list_tags(sm, desc["EndpointArn"]) if desc else {}
    owner = tags.get(DEPLOYMENT_TAG)
    if not owner:
        raise OperateError("the endpoint has no modeldrop:deployment-id tag: modeldrop will not delete it")
    return owner
