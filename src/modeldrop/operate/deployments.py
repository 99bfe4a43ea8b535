"""Driving a deployed stack: find it, start deployments, read the registry, extend, tear down.

Every function takes the clients it calls; the CLI builds them from the standard AWS SDK
configuration. Refusals are OperateError with one line for the user.
"""

from __future__ import annotations

import re
import uuid
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from botocore.exceptions import ClientError
from pydantic import BaseModel

from modeldrop.aws.events_bus import lifecycle_detail, publish
from modeldrop.aws.registry import Registry
from modeldrop.aws.sagemaker_resources import (
    DEPLOYMENT_TAG,
    EXPIRES_TAG,
    MANAGED_BY_TAG,
    describe_endpoint,
    list_tags,
)
from modeldrop.contracts import clock
from modeldrop.contracts.errors import ModeldropError, TeardownIncomplete
from modeldrop.contracts.models import DeploymentRequest
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.pipeline.teardown import teardown as teardown_now

if TYPE_CHECKING:
    from mypy_boto3_cloudformation import CloudFormationClient
    from mypy_boto3_events import EventBridgeClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker.type_defs import DescribeEndpointOutputTypeDef
    from mypy_boto3_stepfunctions import SFNClient

_TTL = re.compile(r"^(\d+(?:\.\d+)?)\s*([mhd])$")
LIVE = {"succeeded"}


class OperateError(ModeldropError):
    failure_class = "request"


class StackInfo(BaseModel):
    stack_name: str
    region: str
    state_machine_arn: str
    table_name: str
    bucket: str | None = None
    event_bus: str | None = None

    @property
    def stack_tag(self) -> str:
        # The value of every managed resource's modeldrop:managed-by tag (the template's AWS::StackName).
        return self.stack_name


def parse_ttl(text: str) -> float:
    """'90m', '4h', '1.5h', '2d' -> hours."""
    m = _TTL.match(text.strip())
    if m is None:
        raise OperateError(f"--ttl {text!r} is not a duration", "use e.g. 90m, 4h or 2d")
    value = float(m[1]) * {"m": 1 / 60, "h": 1.0, "d": 24.0}[m[2]]
    if not 0 < value <= 24 * 14:
        raise OperateError(f"--ttl {text} is outside (0, 14 days]")
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
    return StackInfo(
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


def _hours_between(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() / 3600


class DeploymentRow(BaseModel):
    deployment_id: str
    status: str
    endpoint_name: str | None
    engine: str | None
    instance_type: str | None
    age_hours: float | None
    expires_in_hours: float | None
    cost_usd: float | None
    cost_is_final: bool


def row_for(record: DeploymentRecord, now: datetime | None = None) -> DeploymentRow:
    now = now or clock.utcnow()
    created, expires = record.created_at, record.expires_at
    live = record.status in LIVE
    return DeploymentRow(
        deployment_id=record.deployment_id,
        status=record.status,
        endpoint_name=record.endpoint_name,
        engine=record.engine,
        instance_type=record.instance_type,
        age_hours=round(_hours_between(clock.parse_iso(created), now), 2) if created else None,
        expires_in_hours=round(_hours_between(now, clock.parse_iso(expires)), 2) if expires and live else None,
        cost_usd=record.cost_so_far(),
        cost_is_final=bool(record.ended_at),
    )


def deployment_status(info: StackInfo, record: DeploymentRecord) -> dict[str, Any]:
    """One record in full, decoded, with its cost, its failure (if any) and console links."""
    row = row_for(record)
    status = record.to_json()
    status.update(
        cost_usd=row.cost_usd,
        cost_is_final=row.cost_is_final,
        failure=record.step("failure"),
        links=console_links(info, record),
    )
    return status


def find_deployment(registry: Registry, id_or_endpoint: str) -> DeploymentRecord:
    record = registry.get(id_or_endpoint)
    if record is not None:
        return record
    for candidate in registry.deployments():
        if candidate.endpoint_name == id_or_endpoint:
            return candidate
    raise OperateError(f"no deployment or endpoint {id_or_endpoint!r} in this stack's registry", "see `modeldrop list`")


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
    item = find_deployment(registry, id_or_endpoint)
    if item.status not in LIVE:
        raise OperateError(f"deployment {item.deployment_id} is {item.status}: there is nothing to extend")
    name = str(item.endpoint_name)
    desc = _managed_endpoint(sm, info, name)
    if desc is None:
        raise OperateError(f"endpoint {name} no longer exists", "the deployment ended; redeploy to get a new one")
    expires_at = clock.iso(clock.utcnow() + timedelta(hours=ttl_hours))
    sm.add_tags(ResourceArn=desc["EndpointArn"], Tags=[{"Key": EXPIRES_TAG, "Value": expires_at}])
    previous = item.expires_at
    return registry.record(item.deployment_id, "extended", {"from": previous, "to": expires_at}, expires_at=expires_at)


def teardown(
    sm: SageMakerClient,
    registry: Registry,
    events: EventBridgeClient,
    info: StackInfo,
    id_or_endpoint: str,
    s3: S3Client | None = None,
) -> dict[str, Any]:
    """Delete a managed deployment now, with the state machine's own teardown order, and announce it."""
    try:
        item: DeploymentRecord | None = find_deployment(registry, id_or_endpoint)
    except OperateError:
        item = None
    name = str(item.endpoint_name) if item else id_or_endpoint
    desc = _managed_endpoint(sm, info, name)
    if item is None and desc is None:
        raise OperateError(f"no deployment or endpoint {id_or_endpoint!r}", "see `modeldrop list`")
    if item is not None and item.terminal and desc is None:
        raise OperateError(f"deployment {item.deployment_id} already ended ({item.status})")
    try:
        # The state machine's own Teardown step: endpoint -> endpoint config -> model, recorded.
        if item is not None:
            owner = item.deployment_id
        else:
            assert desc is not None  # checked above: an endpoint or a record exists
            owner = list_tags(sm, desc["EndpointArn"]).get(DEPLOYMENT_TAG, "")
        artifact = item.artifact_uri if item else None
        created = item.step_dict("create_endpoint") if item else {}
        done = teardown_now(
            sm,
            registry if item else None,
            owner,
            name,
            s3=s3,
            artifact_uri=artifact,
            attempt=int(created.get("attempt") or 0),
        )
    except TeardownIncomplete as exc:
        raise OperateError(exc.message, "retry; the reaper also removes leftovers") from None
    result: dict[str, Any] = {"deleted": done.deleted, "already_gone": done.already_gone}
    if item is not None:
        item = registry.record(
            item.deployment_id,
            "torn_down",
            result,
            status="torn_down",
            ended_at=clock.iso(clock.utcnow()),
        )
        if info.event_bus:
            publish(events, info.event_bus, "Deployment Torn Down", {**lifecycle_detail(item, "torn_down"), **result})
        result["record"] = item.to_json()
    return result
