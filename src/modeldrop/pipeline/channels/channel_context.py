"""What promotion, rollback and closing a channel share: the clients they act with, and the
endpoint mechanics of a channel -- the blue/green deployment config, waiting for an endpoint to
settle, and why an update did not take (an alarm's rollback, a failure, or a silent rollback)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.autoscaling.channel_alarms import alarms_in_alarm
from modeldrop.aws.dynamodb.channel_store import ChannelStore
from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.sagemaker.sagemaker_resources import MANAGED_BY_TAG, describe_endpoint, list_tags
from modeldrop.contracts import clock
from modeldrop.contracts.channel import ChannelRecord, ChannelVersion
from modeldrop.contracts.errors import ChannelInvalid, PromotionFailed
from modeldrop.contracts.record import DeploymentRecord

if TYPE_CHECKING:
    from mypy_boto3_application_autoscaling import ApplicationAutoScalingClient
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker_runtime import SageMakerRuntimeClient

CHANNEL_TAG = "modeldrop:channel"
DEFAULT_GRACE = timedelta(hours=1)
# The blue/green bake: the new fleet takes the traffic, then the old one is kept this long before it goes.
WAIT_INTERVAL_SECONDS = 300
TERMINATION_WAIT_SECONDS = 300
SETTLE_BUDGET_SECONDS = 3600
# UpdateEndpoint's MaximumExecutionTimeoutInSeconds (the API's range): past it SageMaker rolls back.
MIN_UPDATE_TIMEOUT_SECONDS = 600
MAX_UPDATE_TIMEOUT_SECONDS = 28_800
# A check gives up this long after the update's own timeout: SageMaker has rolled it back by then.
CHECK_MARGIN_SECONDS = 600
POLL_SECONDS = 30
FIRST_POLL_SECONDS = 2  # then doubling up to POLL_SECONDS: a quick update is seen quickly
TRANSITIONAL = ("Creating", "Updating", "RollingBack", "SystemUpdating")
DEFAULT_MAX_CHANNELS = 20


@dataclass
class ChannelContext:
    sm: SageMakerClient
    runtime: SageMakerRuntimeClient | None  # the gate's invocations (the reaper, settling claims, has none)
    cloudwatch: CloudWatchClient
    registry: Registry
    channels: ChannelStore
    resource_prefix: str
    stack_tag: str
    s3: S3Client | None = None
    max_channels: int = DEFAULT_MAX_CHANNELS
    autoscaling: ApplicationAutoScalingClient | None = None  # a channel that scales to zero (idle_channel)
    refusing_regions: tuple[str, ...] = ()  # the stack's NoScaleToZeroRegions


def now_iso() -> str:
    return clock.iso(clock.utcnow())


def settle(ctx: ChannelContext, name: str, timeout: int | None = None) -> dict[str, Any]:
    """The endpoint once it is no longer Creating, Updating or RollingBack (virtual time in the emulator),
    waiting past an update's own TIMEOUT by the check margin."""
    budget = (timeout or SETTLE_BUDGET_SECONDS) + CHECK_MARGIN_SECONDS
    deadline = time.monotonic() + budget
    waited, pause = 0.0, FIRST_POLL_SECONDS
    while True:
        desc: dict[str, Any] = dict(ctx.sm.describe_endpoint(EndpointName=name))
        if desc["EndpointStatus"] not in TRANSITIONAL:
            return desc
        if time.monotonic() > deadline or waited > budget:
            raise PromotionFailed(f"endpoint {name} is still {desc['EndpointStatus']} after {waited:.0f} s")
        clock.sleep(pause)
        waited, pause = waited + pause, min(pause * 2, POLL_SECONDS)


def promotion_timeouts(record: DeploymentRecord | None) -> tuple[int, float]:
    """(MaximumExecutionTimeoutInSeconds, the checks' budget) for promoting RECORD: the green fleet
    provisions, downloads and starts the candidate as its first deployment did (the planned deadline
    its create step recorded), then bakes; the checks wait past that for SageMaker's own rollback."""
    planned = [
        int((step.get("deadline") or {}).get("planned_seconds") or 0)
        for key, step in (record.steps if record else {}).items()
        if key.startswith("create_endpoint") and isinstance(step, dict)
    ]
    planned_load = max(planned, default=0) or SETTLE_BUDGET_SECONDS
    needed = planned_load + WAIT_INTERVAL_SECONDS + TERMINATION_WAIT_SECONDS
    timeout = min(MAX_UPDATE_TIMEOUT_SECONDS, max(MIN_UPDATE_TIMEOUT_SECONDS, needed))
    return timeout, float(timeout + CHECK_MARGIN_SECONDS)


def blue_green(alarms: list[str], instances: int, timeout: int = SETTLE_BUDGET_SECONDS) -> dict[str, Any]:
    routing: dict[str, Any] = {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": WAIT_INTERVAL_SECONDS}
    if instances > 1:  # a canary needs an instance of its own
        routing = {**routing, "Type": "CANARY", "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1}}
    policy = {
        "TrafficRoutingConfiguration": routing,
        "TerminationWaitInSeconds": TERMINATION_WAIT_SECONDS,
        "MaximumExecutionTimeoutInSeconds": timeout,
    }
    config: dict[str, Any] = {"BlueGreenUpdatePolicy": policy}
    if alarms:
        config["AutoRollbackConfiguration"] = {"Alarms": [{"AlarmName": a} for a in alarms]}
    return config


def start_update(
    ctx: ChannelContext, channel: ChannelRecord, version: ChannelVersion, instances: int, timeout: int | None = None
) -> None:
    """UpdateEndpoint the channel onto VERSION (blue/green, rolled back on its alarms); it must be InService.
    A refusal (ResourceLimitExceeded for the green fleet's instances, a throttle) is PromotionFailed."""
    desc = ctx.sm.describe_endpoint(EndpointName=channel.endpoint_name)
    if desc["EndpointStatus"] != "InService":
        raise PromotionFailed(f"channel {channel.name}'s endpoint is {desc['EndpointStatus']}, not InService")
    try:
        ctx.sm.update_endpoint(
            EndpointName=channel.endpoint_name,
            EndpointConfigName=version.endpoint_config,
            DeploymentConfig=blue_green(channel.alarms, instances, timeout or SETTLE_BUDGET_SECONDS),  # type: ignore[arg-type]
        )
    except ClientError as exc:
        error = exc.response.get("Error", {})
        hint = (
            "the green fleet runs beside the serving one: raise the account's endpoint quota for the type to "
            "twice the channel's instances (Service Quotas), or promote onto a type with room"
            if error.get("Code") == "ResourceLimitExceeded"
            else "see the reason; the channel still serves its previous version"
        )
        raise PromotionFailed(
            f"SageMaker refused to update channel {channel.name}'s endpoint: "
            f"{error.get('Code')}: {error.get('Message')}",
            hint,
        ) from None


def not_taken(ctx: ChannelContext, channel: ChannelRecord, version: ChannelVersion, desc: dict[str, Any]) -> str | None:
    """Why the settled endpoint DESC does not serve VERSION (None: it does), as read back."""
    if desc["EndpointStatus"] == "InService" and desc.get("EndpointConfigName") == version.endpoint_config:
        return None
    fired = alarms_in_alarm(ctx.cloudwatch, channel.alarms)
    if fired:
        reason = f"rolled back automatically: alarm {', '.join(fired)} went into ALARM during the bake"
    elif desc.get("FailureReason"):
        reason = f"the update failed: {desc['FailureReason']}"
    else:
        reason = (
            f"the endpoint reports {desc['EndpointStatus']} on config {desc.get('EndpointConfigName')}, not "
            f"{version.endpoint_config}: the update was rolled back silently"
        )
    return f"channel {channel.name} still serves {desc.get('EndpointConfigName')}: {reason}"


def switch(
    ctx: ChannelContext, channel: ChannelRecord, version: ChannelVersion, instances: int, timeout: int | None = None
) -> None:
    """UpdateEndpoint the channel onto VERSION, then read it back (waiting here): anything but
    InService on VERSION's config is a failed switch, with the reason the endpoint or its alarms give."""
    settle(ctx, channel.endpoint_name, timeout)
    start_update(ctx, channel, version, instances, timeout)
    problem = not_taken(ctx, channel, version, settle(ctx, channel.endpoint_name, timeout))
    if problem:
        raise PromotionFailed(problem)


def retire(channel: ChannelRecord, incoming: ChannelVersion, grace: timedelta) -> ChannelRecord:
    """CHANNEL with INCOMING live and the version it replaces kept for GRACE."""
    kept = [v for v in channel.kept if v.deployment_id != incoming.deployment_id]
    if channel.live is not None:
        now = clock.utcnow()
        outgoing = channel.live.model_copy(
            update={"retired_at": clock.iso(now), "remove_after": clock.iso(now + grace)}
        )
        kept = [outgoing, *kept]
    return channel.model_copy(update={"live": incoming, "kept": kept})


def delete_channel_endpoint(ctx: ChannelContext, channel: ChannelRecord) -> list[str]:
    """The channel's endpoint, only if its tags say it is this stack's channel of that name."""
    desc = describe_endpoint(ctx.sm, channel.endpoint_name)
    if desc is None:
        return []
    tags = list_tags(ctx.sm, desc["EndpointArn"])
    if tags.get(CHANNEL_TAG) != channel.name or tags.get(MANAGED_BY_TAG) != ctx.stack_tag:
        raise ChannelInvalid(
            f"endpoint {channel.endpoint_name} is not channel {channel.name}'s (tagged {tags.get(CHANNEL_TAG)!r} by "
            f"{tags.get(MANAGED_BY_TAG)!r}): left alone",
            "delete it by hand if it is stale, then close the channel again",
        )
    ctx.sm.delete_endpoint(EndpointName=channel.endpoint_name)
    return [f"endpoint/{channel.endpoint_name}"]
