"""Channels: a stable endpoint per model line, a candidate promoted onto it only when the
champion/challenger gate finds nothing regressed, by a blue/green UpdateEndpoint with automatic
rollback on the channel's CloudWatch alarms, and verified by reading the endpoint back (a silent
rollback reports InService on the old config: that is a failed promotion, never a success).

The superseded version's endpoint config and model stay for a rollback until its grace period
ends; the reaper then deletes them (`retire_due`). A promoted deployment's own preview endpoint is
deleted once the channel serves its config: the channel's endpoint is the one its clients call.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.channel_alarms import alarms_in_alarm, delete_alarms, put_channel_alarms
from modeldrop.aws.channel_store import ChannelStore
from modeldrop.aws.registry import Registry
from modeldrop.aws.sagemaker_resources import DEPLOYMENT_TAG, MANAGED_BY_TAG, delete_all, describe_endpoint, list_tags
from modeldrop.checkpoint.chat_contract import ChatContract, drift
from modeldrop.contracts import clock
from modeldrop.contracts.channel import (
    ChannelEvent,
    ChannelRecord,
    ChannelVersion,
    channel_endpoint_name,
    channel_problem,
)
from modeldrop.contracts.errors import ChannelInvalid, PromotionBlocked, PromotionFailed, TeardownIncomplete
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.evaluation.gate import GateThresholds
from modeldrop.evaluation.runner import compare_endpoints
from modeldrop.evaluation.smoke_eval import EvalCase
from modeldrop.pipeline.adapter_promotion import (
    adapter_version,
    base_of,
    check_candidate,
    is_adapter_deployment,
    seconds_from_upload,
    verify_component,
)
from modeldrop.pipeline.channel_upkeep import delete_version
from modeldrop.pipeline.teardown import held_by
from modeldrop.pipeline.teardown import teardown as teardown_now

if TYPE_CHECKING:
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
POLL_SECONDS = 30
FIRST_POLL_SECONDS = 2  # then doubling up to POLL_SECONDS: a quick update is seen quickly


@dataclass
class ChannelContext:
    sm: SageMakerClient
    runtime: SageMakerRuntimeClient
    cloudwatch: CloudWatchClient
    registry: Registry
    channels: ChannelStore
    resource_prefix: str
    stack_tag: str
    s3: S3Client | None = None


def _now() -> str:
    return clock.iso(clock.utcnow())


def _version_of(ctx: ChannelContext, record: DeploymentRecord) -> ChannelVersion:
    """The endpoint config and models RECORD's endpoint serves (a single-model endpoint)."""
    if record.status != "succeeded" or not record.endpoint_name:
        raise ChannelInvalid(f"deployment {record.deployment_id} is {record.status}: only a succeeded one is promoted")
    try:
        config = ctx.sm.describe_endpoint(EndpointName=record.endpoint_name)["EndpointConfigName"]
        variants = ctx.sm.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"]
    except ClientError:
        raise ChannelInvalid(f"deployment {record.deployment_id}'s endpoint {record.endpoint_name} is gone") from None
    models = [str(v["ModelName"]) for v in variants if v.get("ModelName")]
    if not models:
        raise ChannelInvalid(
            f"deployment {record.deployment_id} serves inference components: channels take single-model endpoints",
            "deploy the merged checkpoint (or a dedicated adapter) to promote it",
        )
    return ChannelVersion(
        deployment_id=record.deployment_id,
        endpoint_config=config,
        models=models,
        artifact_uri=str(record.artifact_uri) if record.artifact_uri else None,
    )


def _settle(ctx: ChannelContext, name: str) -> dict[str, Any]:
    """The endpoint once it is no longer Creating, Updating or RollingBack (virtual time in the emulator)."""
    deadline = time.monotonic() + SETTLE_BUDGET_SECONDS
    waited, pause = 0.0, FIRST_POLL_SECONDS
    while True:
        desc: dict[str, Any] = dict(ctx.sm.describe_endpoint(EndpointName=name))
        if desc["EndpointStatus"] not in ("Creating", "Updating", "RollingBack", "SystemUpdating"):
            return desc
        if time.monotonic() > deadline or waited > SETTLE_BUDGET_SECONDS:
            raise PromotionFailed(f"endpoint {name} is still {desc['EndpointStatus']} after {waited:.0f} s")
        clock.sleep(pause)
        waited, pause = waited + pause, min(pause * 2, POLL_SECONDS)


def _blue_green(alarms: list[str], instances: int) -> dict[str, Any]:
    routing: dict[str, Any] = {"Type": "ALL_AT_ONCE", "WaitIntervalInSeconds": WAIT_INTERVAL_SECONDS}
    if instances > 1:  # a canary needs an instance of its own
        routing = {**routing, "Type": "CANARY", "CanarySize": {"Type": "INSTANCE_COUNT", "Value": 1}}
    policy = {
        "TrafficRoutingConfiguration": routing,
        "TerminationWaitInSeconds": TERMINATION_WAIT_SECONDS,
        "MaximumExecutionTimeoutInSeconds": SETTLE_BUDGET_SECONDS,
    }
    config: dict[str, Any] = {"BlueGreenUpdatePolicy": policy}
    if alarms:
        config["AutoRollbackConfiguration"] = {"Alarms": [{"AlarmName": a} for a in alarms]}
    return config


def _switch(ctx: ChannelContext, channel: ChannelRecord, version: ChannelVersion, instances: int) -> None:
    """UpdateEndpoint the channel onto VERSION, then read it back: anything but InService on VERSION's
    config is a failed promotion, with the reason the endpoint or its alarms give."""
    before = _settle(ctx, channel.endpoint_name)
    if before["EndpointStatus"] != "InService":
        raise PromotionFailed(f"channel {channel.name}'s endpoint is {before['EndpointStatus']}, not InService")
    ctx.sm.update_endpoint(
        EndpointName=channel.endpoint_name,
        EndpointConfigName=version.endpoint_config,
        DeploymentConfig=_blue_green(channel.alarms, instances),  # type: ignore[arg-type]
    )
    after = _settle(ctx, channel.endpoint_name)
    if after["EndpointStatus"] == "InService" and after["EndpointConfigName"] == version.endpoint_config:
        return
    fired = alarms_in_alarm(ctx.cloudwatch, channel.alarms)
    if fired:
        reason = f"rolled back automatically: alarm {', '.join(fired)} went into ALARM during the bake"
    elif after.get("FailureReason"):
        reason = f"the update failed: {after['FailureReason']}"
    else:
        reason = (
            f"the endpoint reports {after['EndpointStatus']} on config {after['EndpointConfigName']}, not "
            f"{version.endpoint_config}: the update was rolled back silently"
        )
    raise PromotionFailed(f"channel {channel.name} still serves {after['EndpointConfigName']}: {reason}")


def _discard(ctx: ChannelContext, record: DeploymentRecord) -> list[str]:
    """A candidate that will not serve: its endpoint, config, model and served copy go now."""
    try:
        done = teardown_now(ctx.sm, ctx.registry, record.deployment_id, held_by(record), s3=ctx.s3,
                            artifact_uri=record.artifact_uri)  # fmt: skip
    except TeardownIncomplete as exc:
        return [f"left for the reaper: {exc.message}"]
    ctx.registry.record(record.deployment_id, "torn_down", {"reason": "not promoted"}, status="torn_down",
                        ended_at=_now())  # fmt: skip
    return list(done.deleted)


def _drop_preview(ctx: ChannelContext, record: DeploymentRecord) -> None:
    """The promoted deployment's own endpoint (if tagged for it): its config now serves the channel.
    One left (a throttle) keeps its TTL: the reaper deletes it then."""
    delete_all(ctx.sm, str(record.endpoint_name), None, None, owner=record.deployment_id)


def _create_channel(ctx: ChannelContext, name: str, version: ChannelVersion, record: DeploymentRecord) -> None:
    endpoint = channel_endpoint_name(ctx.resource_prefix, name)
    alarms = put_channel_alarms(ctx.cloudwatch, endpoint)
    ctx.sm.create_endpoint(
        EndpointName=endpoint,
        EndpointConfigName=version.endpoint_config,
        Tags=[
            {"Key": MANAGED_BY_TAG, "Value": ctx.stack_tag},
            {"Key": CHANNEL_TAG, "Value": name},
            {"Key": DEPLOYMENT_TAG, "Value": record.deployment_id},
        ],
    )
    desc = _settle(ctx, endpoint)
    if desc["EndpointStatus"] != "InService" or desc["EndpointConfigName"] != version.endpoint_config:
        ctx.sm.delete_endpoint(EndpointName=endpoint)
        delete_alarms(ctx.cloudwatch, alarms)
        raise PromotionFailed(f"channel {name}'s endpoint went {desc['EndpointStatus']}: {desc.get('FailureReason')}")
    version.served_at = _now()
    channel = ChannelRecord(name=name, endpoint_name=endpoint, alarms=alarms, live=version)
    channel.history.append(ChannelEvent(at=_now(), kind="created", deployment_id=record.deployment_id,
                                        seconds=_since(record.created_at)))  # fmt: skip
    ctx.channels.save(channel)


def _create_adapter_channel(ctx: ChannelContext, name: str, version: ChannelVersion, record: DeploymentRecord) -> None:
    """An adapter channel on RECORD's running base: no endpoint of its own, no alarms (no UpdateEndpoint
    to roll back; the switch is the clients', by component name)."""
    version.served_at = _now()
    channel = ChannelRecord(name=name, endpoint_name=str(record.endpoint_name), base_deployment=base_of(record),
                            live=version)  # fmt: skip
    seconds, origin = seconds_from_upload(ctx.s3, record)
    channel.history.append(ChannelEvent(at=_now(), kind="created", deployment_id=record.deployment_id,
                                        seconds=seconds, reason=f"timed from its {origin}"))  # fmt: skip
    ctx.channels.save(channel)


def _since(iso: str | None) -> float | None:
    return round((clock.utcnow() - clock.parse_iso(iso)).total_seconds(), 1) if iso else None


def promote(
    ctx: ChannelContext,
    deployment_id: str,
    channel_name: str,
    cases: list[EvalCase],
    thresholds: GateThresholds,
    grace: timedelta = DEFAULT_GRACE,
) -> ChannelRecord:
    """Put DEPLOYMENT_ID behind CHANNEL_NAME's stable endpoint (creating the channel the first time)."""
    problem = channel_problem(channel_name)
    if problem:
        raise ChannelInvalid(problem)
    record = ctx.registry.get(deployment_id)
    if record is None:
        raise ChannelInvalid(f"no deployment {deployment_id}")
    adapter = is_adapter_deployment(record)
    version = adapter_version(ctx.sm, record) if adapter else _version_of(ctx, record)
    channel = ctx.channels.get(channel_name)
    if channel is None:
        (_create_adapter_channel if adapter else _create_channel)(ctx, channel_name, version, record)
    else:
        check_candidate(channel, record, adapter)
        if channel.live and channel.live.deployment_id == deployment_id:
            raise ChannelInvalid(f"deployment {deployment_id} already serves channel {channel_name}")
        champion = channel.live.component if channel.live else None
        gate = compare_endpoints(ctx.sm, ctx.runtime, channel.endpoint_name, str(record.endpoint_name), cases,
                                 thresholds, components=(champion, version.component))  # fmt: skip
        event = ChannelEvent(at=_now(), kind="promoted", deployment_id=deployment_id,
                             previous=channel.live.deployment_id if channel.live else None,
                             gate=gate.model_dump(mode="json"), drift=_chat_drift(ctx, channel, record))  # fmt: skip
        if not gate.promote:
            _refuse(ctx, channel, record, event.model_copy(update={"kind": "blocked", "reason": gate.summary}))
            raise PromotionBlocked(f"{deployment_id} not promoted to {channel_name}: {gate.summary}")
        # The channel is claimed before its endpoint is touched: a twin that read it first fails here.
        channel = ctx.channels.save(channel)
        try:
            if adapter:  # no endpoint update: clients switch to the candidate's component by name
                verify_component(ctx.sm, channel, version)
            else:
                _switch(ctx, channel, version, record.instance_count)
        except PromotionFailed as exc:
            failed = event.model_copy(update={"kind": "promotion_failed", "reason": exc.message})
            _refuse(ctx, channel, record, failed)
            raise
        version.served_at = _now()
        channel = _retire(channel, version, grace)
        seconds, origin = seconds_from_upload(ctx.s3, record) if adapter else (_since(record.created_at), "request")
        channel.history.append(event.model_copy(update={"seconds": seconds, "reason": f"timed from its {origin}"}))
        ctx.channels.save(channel)
    if not adapter:  # an adapter's endpoint is the channel's base: it stays
        _drop_preview(ctx, record)
    saved = ctx.channels.get(channel_name)
    assert saved is not None
    served = saved.history[-1].seconds if saved.history else None
    ctx.registry.record(deployment_id, "promoted", {"channel": channel_name, "at": _now(), "seconds": served,
                                                    "invoke": saved.invoke_target()}, status="succeeded")  # fmt: skip
    return saved


def _chat_contract(ctx: ChannelContext, record: DeploymentRecord | None) -> ChatContract | None:
    """The chat contract validation recorded for RECORD (its report in S3), if it can be read."""
    uri = record.validation_report_uri if record else None
    if ctx.s3 is None or not uri or not uri.startswith("s3://"):
        return None
    bucket, _, key = uri[5:].partition("/")
    try:
        report = json.loads(ctx.s3.get_object(Bucket=bucket, Key=key)["Body"].read())
        found = report.get("chat_contract") if isinstance(report, dict) else None
        return ChatContract.model_validate(found) if found else None
    except (ClientError, ValueError):
        return None


def _chat_drift(ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord) -> list[str]:
    """What changed in the chat contract since the serving version (template, EOS, generation config, tokenizer)."""
    serving = ctx.registry.get(channel.live.deployment_id) if channel.live else None
    old, new = _chat_contract(ctx, serving), _chat_contract(ctx, record)
    return drift(old, new) if old and new else []


def _retire(channel: ChannelRecord, incoming: ChannelVersion, grace: timedelta) -> ChannelRecord:
    """CHANNEL with INCOMING live and the version it replaces kept for GRACE."""
    kept = list(channel.kept)
    if channel.live is not None:
        now = clock.utcnow()
        outgoing = channel.live.model_copy(
            update={"retired_at": clock.iso(now), "remove_after": clock.iso(now + grace)}
        )
        kept = [outgoing, *[v for v in kept if v.deployment_id != incoming.deployment_id]]
    else:
        kept = [v for v in kept if v.deployment_id != incoming.deployment_id]
    return channel.model_copy(update={"live": incoming, "kept": kept})


def _refuse(ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord, event: ChannelEvent) -> None:
    """The champion still serves; the candidate's resources go, and the history says why."""
    deleted = _discard(ctx, record)
    event = event.model_copy(update={"seconds": _since(record.created_at), "reason": f"{event.reason}; deleted "
                                     f"{', '.join(deleted) or 'nothing'}"})  # fmt: skip
    channel.history.append(event)
    ctx.channels.save(channel)


def rollback(ctx: ChannelContext, channel_name: str, grace: timedelta = DEFAULT_GRACE) -> ChannelRecord:
    """CHANNEL_NAME back to its last known-good version in one step (no gate: it served before)."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        raise ChannelInvalid(f"no channel {channel_name}")
    target = channel.last_known_good()
    if target is None:
        raise ChannelInvalid(f"channel {channel_name} keeps no earlier version to roll back to",
                             "a superseded version is kept for the grace period of its promotion")  # fmt: skip
    record = ctx.registry.get(target.deployment_id)
    channel = ctx.channels.save(channel)  # claimed first, as promote does: a twin that read it is refused
    if channel.adapter_only:
        verify_component(ctx.sm, channel, target)
    else:
        _switch(ctx, channel, target, record.instance_count if record else 1)
    previous = channel.live.deployment_id if channel.live else None
    channel = _retire(channel, target.model_copy(update={"served_at": _now(), "retired_at": None,
                                                         "remove_after": None}), grace)  # fmt: skip
    channel.history.append(ChannelEvent(at=_now(), kind="rolled_back", deployment_id=target.deployment_id,
                                        previous=previous, reason="modeldrop rollback"))  # fmt: skip
    return ctx.channels.save(channel)


def _delete_channel_endpoint(ctx: ChannelContext, channel: ChannelRecord) -> list[str]:
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


def close_channel(ctx: ChannelContext, channel_name: str) -> list[str]:
    """The whole channel deleted: its endpoint, every version it holds, its alarms and its record."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        raise ChannelInvalid(f"no channel {channel_name}")
    deleted = [] if channel.adapter_only else _delete_channel_endpoint(ctx, channel)
    for version in ([channel.live] if channel.live else []) + channel.kept:
        deleted += delete_version(ctx.sm, ctx.registry, ctx.s3, version, channel.base_deployment)
    if channel.base_deployment:
        deleted += _release_base(ctx, channel)
    delete_alarms(ctx.cloudwatch, channel.alarms)
    ctx.channels.delete(channel)
    return deleted


def _release_base(ctx: ChannelContext, channel: ChannelRecord) -> list[str]:
    """An adapter channel's base, torn down with the channel unless another channel runs on it; one
    that still carries other deployments' adapters stays (its TTL rules again)."""
    base = str(channel.base_deployment)
    if any(c.base_deployment == base for c in ctx.channels.all() if c.name != channel.name):
        return []
    record = ctx.registry.get(base)
    if record is None or record.ended_at is not None:
        return []
    try:
        done = teardown_now(ctx.sm, ctx.registry, base, held_by(record), s3=ctx.s3, artifact_uri=record.artifact_uri)
    except TeardownIncomplete as exc:
        return [f"left to its TTL: {exc.message}"]
    ctx.registry.record(base, "torn_down", {"reason": f"channel {channel.name} closed"}, status="torn_down",
                        ended_at=_now())  # fmt: skip
    return list(done.deleted)
