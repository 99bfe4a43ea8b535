"""Channels: a stable endpoint per model line, a candidate promoted onto it only when the
champion/challenger gate finds nothing regressed, by a blue/green UpdateEndpoint with automatic
rollback on the channel's CloudWatch alarms, and verified by reading the endpoint back (a silent
rollback reports InService on the old config: that is a failed promotion, never a success). An
adapter on an adapter channel's base is switched to by name instead (adapter_promotion).

A promotion is two calls: `start_promotion` (gate, claim, and the endpoint created or updated) and
`check_promotion` until the endpoint settles (the CLI waits in `promote`; the state machine waits
between its checks). The pending promotion lives in the channel record, so any check completes it.

The superseded version's endpoint config and model stay for a rollback until its grace period
ends; the reaper then deletes them (`retire_due`). A promoted deployment's own preview endpoint is
deleted once the channel serves its config: the channel's endpoint is the one its clients call.
"""

from __future__ import annotations

import json
from datetime import timedelta

from botocore.exceptions import ClientError

from modeldrop.aws.autoscaling.channel_alarms import put_channel_alarms
from modeldrop.aws.sagemaker.sagemaker_resources import DEPLOYMENT_TAG, MANAGED_BY_TAG
from modeldrop.checkpoint.chat.chat_contract import ChatContract, drift
from modeldrop.contracts import clock
from modeldrop.contracts.channel import (
    ChannelEvent,
    ChannelRecord,
    ChannelVersion,
    EvalSetPin,
    PendingPromotion,
    channel_endpoint_name,
    channel_problem,
)
from modeldrop.contracts.errors import (
    ChannelInvalid,
    LimitExceeded,
    PromotionBlocked,
    PromotionFailed,
)
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.evaluation.gate import GateThresholds
from modeldrop.evaluation.runner import compare_endpoints
from modeldrop.evaluation.smoke_eval import EvalCase
from modeldrop.pipeline.channels import idle_channel
from modeldrop.pipeline.channels.adapter_promotion import (
    adapter_version,
    base_of,
    check_candidate,
    is_adapter_deployment,
    verify_component,
)
from modeldrop.pipeline.channels.channel_context import (
    CHANNEL_TAG,
    DEFAULT_GRACE,
    FIRST_POLL_SECONDS,
    POLL_SECONDS,
    ChannelContext,
    promotion_timeouts,
    start_update,
)
from modeldrop.pipeline.channels.channel_context import now_iso as _now
from modeldrop.pipeline.channels.promotion_settle import (
    check_promotion,
    complete,
    drop_preview,
    fail,
    record_promoted,
    refuse,
    seconds_from_upload,
    settle_stale,
)

__all__ = ["ChannelContext", "check_promotion", "promote", "start_promotion"]


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


def _load(ctx: ChannelContext, deployment_id: str, channel_name: str) -> tuple[DeploymentRecord, bool, ChannelVersion]:
    problem = channel_problem(channel_name)
    if problem:
        raise ChannelInvalid(problem)
    record = ctx.registry.get(deployment_id)
    if record is None:
        raise ChannelInvalid(f"no deployment {deployment_id}")
    adapter = is_adapter_deployment(record)
    return record, adapter, adapter_version(ctx.sm, record) if adapter else _version_of(ctx, record)


def start_promotion(
    ctx: ChannelContext,
    deployment_id: str,
    channel_name: str,
    cases: list[EvalCase],
    thresholds: GateThresholds,
    grace: timedelta = DEFAULT_GRACE,
    pin: EvalSetPin | None = None,
    idle_after: int | None = None,
) -> ChannelRecord:
    """Begin putting DEPLOYMENT_ID behind CHANNEL_NAME: the first deployment creates the channel (scaled to
    zero after IDLE_AFTER seconds without an invocation, where that can be had); a later one is gated on
    CASES (the channel's pinned set: gate_cases), and the channel claimed and its endpoint (or its one
    component) updated. PIN, when given, becomes the channel's eval set. The channel comes back with a
    `candidate` while its endpoint works (then check_promotion), or without one when it is done."""
    record, adapter, version = _load(ctx, deployment_id, channel_name)
    channel = ctx.channels.get(channel_name)
    if channel is None:
        if adapter:
            return _create_adapter_channel(ctx, channel_name, version, record, grace, pin)
        return _create_channel(ctx, channel_name, version, record, grace, pin, idle_after)
    check_candidate(channel, record, adapter)
    if channel.candidate is not None:
        channel = settle_stale(ctx, channel)
    if channel.live and channel.live.deployment_id == deployment_id:
        raise ChannelInvalid(f"deployment {deployment_id} already serves channel {channel_name}")
    if pin is not None:  # the operator's new set holds from this gate on, whatever its verdict
        channel = channel.model_copy(update={"eval_set": pin})
    champion = channel.live.component if channel.live else None
    if ctx.runtime is None:
        raise ChannelInvalid("no sagemaker-runtime client: the gate cannot run here")
    if channel.scales_to_zero and channel.idle:
        champion = channel.idle.component
        if not idle_channel.knock(ctx, channel):  # the champion answers the gate's cases live: woken first
            raise idle_channel.Waking(channel)
    gate = compare_endpoints(ctx.sm, ctx.runtime, channel.endpoint_name, str(record.endpoint_name), cases,
                             thresholds, components=(champion, version.component))  # fmt: skip
    event = ChannelEvent(at=_now(), kind="promoted", deployment_id=deployment_id,
                         previous=channel.live.deployment_id if channel.live else None,
                         gate=gate.model_dump(mode="json"), drift=_chat_drift(ctx, channel, record))  # fmt: skip
    if not gate.promote:
        refuse(ctx, channel, record, event.model_copy(update={"kind": "blocked", "reason": gate.summary}))
        raise PromotionBlocked(f"{deployment_id} not promoted to {channel_name}: {gate.summary}")
    timeout, budget = promotion_timeouts(record)
    pending = PendingPromotion(version=version, event=event, phase="updating", started_at=_now(),
                               grace_seconds=grace.total_seconds(), instances=record.instance_count,
                               budget_seconds=budget, update_timeout_seconds=timeout)  # fmt: skip
    # The channel is claimed before its endpoint is touched: a twin that read it first fails here.
    channel = ctx.channels.save(channel.model_copy(update={"candidate": pending}))
    try:
        if adapter:  # no endpoint update: clients switch to the candidate's component by name
            verify_component(ctx.sm, channel, version)
            return complete(ctx, channel, record)
        # The gate has passed: the preview goes (its config and model stay for the channel) before the
        # update starts its green fleet beside the channel's own -- two fleets at once, never three.
        drop_preview(ctx, record)
        if channel.scales_to_zero:
            idle_channel.start_update(ctx, channel, version)
        else:
            start_update(ctx, channel, version, record.instance_count, timeout)
    except PromotionFailed as exc:
        fail(ctx, channel, record, exc.message)
        raise
    return channel


def promote(
    ctx: ChannelContext,
    deployment_id: str,
    channel_name: str,
    cases: list[EvalCase],
    thresholds: GateThresholds,
    grace: timedelta = DEFAULT_GRACE,
    pin: EvalSetPin | None = None,
) -> ChannelRecord:
    """Put DEPLOYMENT_ID behind CHANNEL_NAME's stable endpoint, waiting here until it serves or fails (a
    channel asleep woken for the gate first, for at most its wake time)."""
    first = clock.utcnow()
    while True:
        try:
            channel = start_promotion(ctx, deployment_id, channel_name, cases, thresholds, grace, pin)
            break
        except idle_channel.Waking as waking:
            if (clock.utcnow() - first).total_seconds() > waking.wake_seconds:
                raise PromotionFailed(
                    f"channel {channel_name} did not wake within {waking.wake_seconds} s for the gate",
                    "the champion still serves; promote again once it answers",
                ) from None
            clock.sleep(POLL_SECONDS)
    pause = FIRST_POLL_SECONDS
    while channel.candidate is not None:
        clock.sleep(pause)
        pause = min(pause * 2, POLL_SECONDS)
        channel = check_promotion(ctx, channel_name, deployment_id)
    return channel


def _create_channel(
    ctx: ChannelContext,
    name: str,
    version: ChannelVersion,
    record: DeploymentRecord,
    grace: timedelta,
    pin: EvalSetPin | None,
    idle_after: int | None = None,
) -> ChannelRecord:
    """The channel claimed (its record, with this version pending), then its alarms and endpoint: with
    IDLE_AFTER, an endpoint of components that scales to zero, or always-on where the region refuses it."""
    if len(ctx.channels.all()) >= ctx.max_channels:
        raise LimitExceeded(
            f"the stack holds {ctx.max_channels} channels already: channel {name} is not created",
            "close one (`modeldrop teardown CHANNEL`), or promote into an existing channel",
        )
    endpoint = channel_endpoint_name(ctx.resource_prefix, name)
    event = ChannelEvent(at=_now(), kind="created", deployment_id=record.deployment_id)
    _timeout, budget = promotion_timeouts(record)
    pending = PendingPromotion(version=version, event=event, phase="creating", started_at=_now(),
                               grace_seconds=grace.total_seconds(), instances=record.instance_count,
                               budget_seconds=budget)  # fmt: skip
    decision = idle_channel.decide_for(ctx, version, record, idle_after) if idle_after else None
    known = idle_channel.as_record(decision) if decision and not decision.scales_to_zero else None
    channel = ctx.channels.save(ChannelRecord(name=name, endpoint_name=endpoint, candidate=pending, eval_set=pin,
                                              idle=known))  # fmt: skip
    try:
        alarms = put_channel_alarms(ctx.cloudwatch, endpoint)
        channel = ctx.channels.save(channel.model_copy(update={"alarms": alarms}))
        if decision is not None and decision.scales_to_zero:
            idle = idle_channel.create_endpoint(ctx, channel, version, record, decision)
            channel = ctx.channels.save(channel.model_copy(update={"idle": idle}))
            if channel.scales_to_zero:
                return channel
        ctx.sm.create_endpoint(
            EndpointName=endpoint,
            EndpointConfigName=version.endpoint_config,
            Tags=[
                {"Key": MANAGED_BY_TAG, "Value": ctx.stack_tag},
                {"Key": CHANNEL_TAG, "Value": name},
                {"Key": DEPLOYMENT_TAG, "Value": record.deployment_id},
            ],
        )
    except ClientError as exc:
        fail(ctx, channel, record, f"channel {name}'s endpoint could not be created: {exc}")
        raise PromotionFailed(f"channel {name}'s endpoint could not be created: {exc}") from None
    return channel


def _create_adapter_channel(
    ctx: ChannelContext,
    name: str,
    version: ChannelVersion,
    record: DeploymentRecord,
    grace: timedelta,
    pin: EvalSetPin | None,
) -> ChannelRecord:
    """An adapter channel on RECORD's running base: no endpoint of its own, no alarms (no UpdateEndpoint
    to roll back; the switch is the clients', by component name)."""
    del grace  # nothing is replaced
    version.served_at = _now()
    channel = ChannelRecord(name=name, endpoint_name=str(record.endpoint_name), base_deployment=base_of(record),
                            live=version, eval_set=pin)  # fmt: skip
    seconds, origin = seconds_from_upload(ctx.s3, record)
    channel.history.append(ChannelEvent(at=_now(), kind="created", deployment_id=record.deployment_id,
                                        seconds=seconds, reason=f"timed from its {origin}"))  # fmt: skip
    saved = ctx.channels.save(channel)
    record_promoted(ctx, record, saved)
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
