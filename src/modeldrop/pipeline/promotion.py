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

import contextlib
import json
from datetime import timedelta

from botocore.exceptions import ClientError

from modeldrop.aws.channel_alarms import delete_alarms, put_channel_alarms
from modeldrop.aws.sagemaker_resources import DEPLOYMENT_TAG, MANAGED_BY_TAG, delete_all, describe_endpoint
from modeldrop.checkpoint.chat_contract import ChatContract, drift
from modeldrop.contracts import clock
from modeldrop.contracts.channel import (
    ChannelEvent,
    ChannelRecord,
    ChannelVersion,
    PendingPromotion,
    channel_endpoint_name,
    channel_problem,
)
from modeldrop.contracts.errors import (
    ChannelInvalid,
    LimitExceeded,
    PromotionBlocked,
    PromotionFailed,
    TeardownIncomplete,
)
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
from modeldrop.pipeline.channel_context import (
    CHANNEL_TAG,
    DEFAULT_GRACE,
    FIRST_POLL_SECONDS,
    POLL_SECONDS,
    SETTLE_BUDGET_SECONDS,
    TRANSITIONAL,
    ChannelContext,
    delete_channel_endpoint,
    not_taken,
    retire,
    start_update,
)
from modeldrop.pipeline.channel_context import now_iso as _now
from modeldrop.pipeline.teardown import held_by
from modeldrop.pipeline.teardown import teardown as teardown_now

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


def _since(iso: str | None) -> float | None:
    return round((clock.utcnow() - clock.parse_iso(iso)).total_seconds(), 1) if iso else None


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
) -> ChannelRecord:
    """Begin putting DEPLOYMENT_ID behind CHANNEL_NAME: the first deployment creates the channel; a later
    one is gated, and the channel claimed and its endpoint updated. The channel comes back with a
    `candidate` while its endpoint works (then check_promotion), or without one when it is done."""
    record, adapter, version = _load(ctx, deployment_id, channel_name)
    channel = ctx.channels.get(channel_name)
    if channel is None:
        return (_create_adapter_channel if adapter else _create_channel)(ctx, channel_name, version, record, grace)
    check_candidate(channel, record, adapter)
    if channel.candidate is not None:
        channel = _settle_stale(ctx, channel)
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
    pending = PendingPromotion(version=version, event=event, phase="updating", started_at=_now(),
                               grace_seconds=grace.total_seconds(), instances=record.instance_count)  # fmt: skip
    # The channel is claimed before its endpoint is touched: a twin that read it first fails here.
    channel = ctx.channels.save(channel.model_copy(update={"candidate": pending}))
    try:
        if adapter:  # no endpoint update: clients switch to the candidate's component by name
            verify_component(ctx.sm, channel, version)
            return _complete(ctx, channel, record)
        start_update(ctx, channel, version, record.instance_count)
    except PromotionFailed as exc:
        _fail(ctx, channel, record, exc.message)
        raise
    return channel


def check_promotion(ctx: ChannelContext, channel_name: str, deployment_id: str) -> ChannelRecord:
    """One look at CHANNEL_NAME's pending promotion of DEPLOYMENT_ID: still under way (the channel with
    its candidate), completed (without), or PromotionFailed -- the update rolled back, silently or on
    an alarm, or the endpoint never settled within the budget."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        raise PromotionFailed(f"channel {channel_name} is gone: {deployment_id} was not promoted")
    pending = channel.candidate
    if pending is None or pending.version.deployment_id != deployment_id:
        if channel.live and channel.live.deployment_id == deployment_id:
            return channel  # completed by an earlier check
        raise PromotionFailed(f"no promotion of {deployment_id} is pending on channel {channel_name}")
    record = ctx.registry.get(deployment_id)
    if record is None:
        raise PromotionFailed(f"deployment {deployment_id}'s record is gone")
    desc = describe_endpoint(ctx.sm, channel.endpoint_name)
    status = desc["EndpointStatus"] if desc else "gone"
    waited = (clock.utcnow() - clock.parse_iso(pending.started_at)).total_seconds()
    if status in TRANSITIONAL and waited <= SETTLE_BUDGET_SECONDS:
        return channel
    if desc is None:
        problem: str | None = f"channel {channel_name}'s endpoint {channel.endpoint_name} is gone"
    elif status in TRANSITIONAL:
        problem = f"endpoint {channel.endpoint_name} is still {status} after {waited:.0f} s"
    else:
        problem = not_taken(ctx, channel, pending.version, dict(desc))
    if problem:
        _fail(ctx, channel, record, problem)
        raise PromotionFailed(problem)
    return _complete(ctx, channel, record)


def _settle_stale(ctx: ChannelContext, channel: ChannelRecord) -> ChannelRecord:
    """CHANNEL's promotion under way, completed or failed if nobody checked it within the budget (its
    execution stopped mid-way): a stale one does not hold the channel. A live one makes it busy."""
    pending = channel.candidate
    assert pending is not None
    waited = (clock.utcnow() - clock.parse_iso(pending.started_at)).total_seconds()
    if waited <= SETTLE_BUDGET_SECONDS:
        raise ChannelInvalid(
            f"channel {channel.name} is busy: {pending.version.deployment_id} is being promoted",
            f"wait for it (`modeldrop status {channel.name}`), then promote again",
        )
    with contextlib.suppress(PromotionFailed):  # recorded in the channel's history; the champion serves
        check_promotion(ctx, channel.name, pending.version.deployment_id)
    fresh = ctx.channels.get(channel.name)
    if fresh is None:
        raise ChannelInvalid(f"channel {channel.name} is gone")
    return fresh


def promote(
    ctx: ChannelContext,
    deployment_id: str,
    channel_name: str,
    cases: list[EvalCase],
    thresholds: GateThresholds,
    grace: timedelta = DEFAULT_GRACE,
) -> ChannelRecord:
    """Put DEPLOYMENT_ID behind CHANNEL_NAME's stable endpoint, waiting here until it serves or fails."""
    channel = start_promotion(ctx, deployment_id, channel_name, cases, thresholds, grace)
    pause = FIRST_POLL_SECONDS
    while channel.candidate is not None:
        clock.sleep(pause)
        pause = min(pause * 2, POLL_SECONDS)
        channel = check_promotion(ctx, channel_name, deployment_id)
    return channel


def _create_channel(
    ctx: ChannelContext, name: str, version: ChannelVersion, record: DeploymentRecord, grace: timedelta
) -> ChannelRecord:
    """The channel claimed (its record, with this version pending), then its alarms and endpoint."""
    if len(ctx.channels.all()) >= ctx.max_channels:
        raise LimitExceeded(
            f"the stack holds {ctx.max_channels} channels already: channel {name} is not created",
            "close one (`modeldrop teardown CHANNEL`), or promote into an existing channel",
        )
    endpoint = channel_endpoint_name(ctx.resource_prefix, name)
    event = ChannelEvent(at=_now(), kind="created", deployment_id=record.deployment_id)
    pending = PendingPromotion(version=version, event=event, phase="creating", started_at=_now(),
                               grace_seconds=grace.total_seconds(), instances=record.instance_count)  # fmt: skip
    channel = ctx.channels.save(ChannelRecord(name=name, endpoint_name=endpoint, candidate=pending))
    try:
        alarms = put_channel_alarms(ctx.cloudwatch, endpoint)
        channel = ctx.channels.save(channel.model_copy(update={"alarms": alarms}))
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
        _fail(ctx, channel, record, f"channel {name}'s endpoint could not be created: {exc}")
        raise PromotionFailed(f"channel {name}'s endpoint could not be created: {exc}") from None
    return channel


def _create_adapter_channel(
    ctx: ChannelContext, name: str, version: ChannelVersion, record: DeploymentRecord, grace: timedelta
) -> ChannelRecord:
    """An adapter channel on RECORD's running base: no endpoint of its own, no alarms (no UpdateEndpoint
    to roll back; the switch is the clients', by component name)."""
    del grace  # nothing is replaced
    version.served_at = _now()
    channel = ChannelRecord(name=name, endpoint_name=str(record.endpoint_name), base_deployment=base_of(record),
                            live=version)  # fmt: skip
    seconds, origin = seconds_from_upload(ctx.s3, record)
    channel.history.append(ChannelEvent(at=_now(), kind="created", deployment_id=record.deployment_id,
                                        seconds=seconds, reason=f"timed from its {origin}"))  # fmt: skip
    saved = ctx.channels.save(channel)
    _record_promoted(ctx, record, saved)
    return saved


def _complete(ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord) -> ChannelRecord:
    """The pending version serves: it goes live, the one it replaces is kept for the grace, and the
    promoted deployment's preview endpoint goes (an adapter's endpoint is the channel's base: it stays)."""
    pending = channel.candidate
    assert pending is not None
    version = pending.version.model_copy(update={"served_at": _now()})
    adapter = version.component is not None
    seconds, origin = seconds_from_upload(ctx.s3, record)
    event = pending.event.model_copy(update={"at": _now(), "seconds": seconds, "reason": f"timed from its {origin}"})
    done = retire(channel.model_copy(update={"candidate": None}), version, timedelta(seconds=pending.grace_seconds))
    done.history.append(event)
    saved = ctx.channels.save(done)
    if not adapter:
        _drop_preview(ctx, record)
    _record_promoted(ctx, record, saved)
    return saved


def _record_promoted(ctx: ChannelContext, record: DeploymentRecord, channel: ChannelRecord) -> None:
    served = channel.history[-1].seconds if channel.history else None
    ctx.registry.record(record.deployment_id, "promoted", {"channel": channel.name, "at": _now(), "seconds": served,
                        "invoke": channel.invoke_target()}, status="succeeded")  # fmt: skip


def _fail(ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord, reason: str) -> None:
    """The pending promotion did not take: a channel being created is undone (its endpoint, alarms and
    record; the deployment keeps its preview); an update's candidate is deleted, the champion serves."""
    pending = channel.candidate
    if pending is not None and pending.phase == "creating":
        # Only an endpoint tagged as this stack's channel of that name: CreateEndpoint may have failed
        # because the name is someone else's, and that one is not ours to delete.
        with contextlib.suppress(ChannelInvalid):
            delete_channel_endpoint(ctx, channel)
        delete_alarms(ctx.cloudwatch, channel.alarms)
        ctx.channels.delete(channel)
        return
    event = pending.event if pending else ChannelEvent(at=_now(), kind="promoted")
    failed = event.model_copy(update={"kind": "promotion_failed", "reason": reason, "at": _now()})
    _refuse(ctx, channel.model_copy(update={"candidate": None}), record, failed)


def _discard(ctx: ChannelContext, record: DeploymentRecord, error: str, reason: str) -> list[str]:
    """A candidate that will not serve: its endpoint, config, model and served copy go now, and its
    record says why (ERROR, REASON) -- `status` of the deployment, not only the channel's history."""
    failure_reason = reason[:2000]
    try:
        done = teardown_now(ctx.sm, ctx.registry, record.deployment_id, held_by(record), s3=ctx.s3,
                            artifact_uri=record.artifact_uri)  # fmt: skip
    except TeardownIncomplete as exc:
        ctx.registry.record(record.deployment_id, "not_promoted", {"reason": reason}, error=error,
                            failure_reason=failure_reason)  # fmt: skip
        return [f"left for the reaper: {exc.message}"]
    ctx.registry.record(record.deployment_id, "torn_down", {"reason": f"not promoted: {reason}"}, status="torn_down",
                        ended_at=_now(), error=error, failure_reason=failure_reason)  # fmt: skip
    return list(done.deleted)


def _drop_preview(ctx: ChannelContext, record: DeploymentRecord) -> None:
    """The promoted deployment's own endpoint (if tagged for it): its config now serves the channel.
    One left (a throttle) keeps its TTL: the reaper deletes it then."""
    delete_all(ctx.sm, str(record.endpoint_name), None, None, owner=record.deployment_id)


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


def _refuse(ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord, event: ChannelEvent) -> None:
    """The champion still serves; the candidate's resources go, and the history says why."""
    error = "PromotionBlocked" if event.kind == "blocked" else "PromotionFailed"
    deleted = _discard(ctx, record, error, event.reason)
    event = event.model_copy(update={"seconds": _since(record.created_at), "reason": f"{event.reason}; deleted "
                                     f"{', '.join(deleted) or 'nothing'}"})  # fmt: skip
    channel.history.append(event)
    ctx.channels.save(channel)
