"""The second half of a promotion: reading the channel's endpoint back until the change it was claimed
for settles, then completing it (the candidate live, the replaced version kept for its grace) or
refusing it (the candidate's resources go, the champion serves). Also a rollback's claim, and settling
a claim nobody completed within its budget -- by the next promotion, or by the reaper on its schedule.

Imports no eval or template code: the reaper runs it (tests/contracts/test_layout.py).

Nothing an update may still move onto is deleted: while the channel's endpoint is Creating, Updating or
RollingBack the claim stands (the channel busy), however long past its budget; SageMaker's own
deployment timeout (MaximumExecutionTimeoutInSeconds, from the candidate's plan) rolls it back first.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.aws.autoscaling.channel_alarms import delete_alarms
from modeldrop.aws.s3.served_copy import MARKER as MARKER_NAME
from modeldrop.aws.sagemaker.sagemaker_resources import delete_all, describe_endpoint
from modeldrop.contracts import clock
from modeldrop.contracts.channel import ChannelEvent, ChannelRecord, ChannelVersion, PendingPromotion
from modeldrop.contracts.errors import ChannelInvalid, PromotionFailed, TeardownIncomplete
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.contracts.s3uri import parse_s3_uri
from modeldrop.pipeline.channels.channel_context import (
    TRANSITIONAL,
    ChannelContext,
    delete_channel_endpoint,
    not_taken,
    retire,
)
from modeldrop.pipeline.channels.channel_context import now_iso as _now
from modeldrop.pipeline.deployment.teardown import held_by
from modeldrop.pipeline.deployment.teardown import teardown as teardown_now

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client


def waited(pending: PendingPromotion) -> float:
    return (clock.utcnow() - clock.parse_iso(pending.started_at)).total_seconds()


def check_promotion(ctx: ChannelContext, channel_name: str, deployment_id: str) -> ChannelRecord:
    """One look at CHANNEL_NAME's pending promotion of DEPLOYMENT_ID: still under way (the channel with
    its candidate), completed (without), or PromotionFailed -- the update rolled back, silently or on
    an alarm, or the endpoint still moving past the budget (the claim then stands for the reaper)."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        raise PromotionFailed(f"channel {channel_name} is gone: {deployment_id} was not promoted")
    pending = channel.candidate
    if pending is None or pending.phase == "rolling_back" or pending.version.deployment_id != deployment_id:
        if channel.live and channel.live.deployment_id == deployment_id:
            return channel  # completed by an earlier check
        raise PromotionFailed(f"no promotion of {deployment_id} is pending on channel {channel_name}")
    record = ctx.registry.get(deployment_id)
    if record is None:
        raise PromotionFailed(f"deployment {deployment_id}'s record is gone")
    if channel.scales_to_zero:
        return _check_component(ctx, channel, record, pending)
    desc = describe_endpoint(ctx.sm, channel.endpoint_name)
    status = desc["EndpointStatus"] if desc else "gone"
    if status in TRANSITIONAL:
        if waited(pending) <= pending.budget_seconds:
            return channel
        raise PromotionFailed(
            f"endpoint {channel.endpoint_name} is still {status} {waited(pending):.0f} s into the promotion of "
            f"{deployment_id} (budget {pending.budget_seconds:.0f} s): the channel stays claimed until it settles",
            "nothing it may still move onto is deleted; the reaper completes or refuses it once it settles",
        )
    if desc is None:
        problem: str | None = f"channel {channel_name}'s endpoint {channel.endpoint_name} is gone"
    else:
        problem = not_taken(ctx, channel, pending.version, dict(desc))
    if problem:
        fail(ctx, channel, record, problem)
        raise PromotionFailed(problem)
    return complete(ctx, channel, record)


def _check_component(
    ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord, pending: PendingPromotion
) -> ChannelRecord:
    """check_promotion for a channel that scales to zero: its one component, created or updated."""
    from modeldrop.pipeline.channels import idle_channel

    state, problem = idle_channel.check(ctx, channel)
    if state == "moving":
        if waited(pending) <= pending.budget_seconds:
            return ctx.channels.get(channel.name) or channel
        raise PromotionFailed(
            f"channel {channel.name}'s component is still changing {waited(pending):.0f} s into the promotion of "
            f"{record.deployment_id} (budget {pending.budget_seconds:.0f} s): the channel stays claimed",
            "nothing it may still move onto is deleted; the reaper completes or refuses it once it settles",
        )
    if state == "failed":
        fail(ctx, channel, record, str(problem))
        raise PromotionFailed(str(problem))
    return complete(ctx, channel, record)


def settle_stale(ctx: ChannelContext, channel: ChannelRecord) -> ChannelRecord:
    """CHANNEL's claim (a promotion or a rollback), completed or refused if nobody did within its budget
    (its execution stopped, its CLI was killed): a stale claim does not hold the channel. One within its
    budget, or whose endpoint still moves, makes the channel busy (ChannelInvalid)."""
    pending = channel.candidate
    assert pending is not None
    who = pending.version.deployment_id
    what = {"rolling_back": f"{who} is being rolled back to", "closing": "it is being closed"}
    fix = f"wait for it (`modeldrop status {channel.name}`), then try again"
    if pending.phase == "closing":
        fix = f"a close that stopped midway: `modeldrop teardown {channel.name}` again"
    busy = ChannelInvalid(f"channel {channel.name} is busy: {what.get(pending.phase, f'{who} is being promoted')}", fix)
    if pending.phase == "closing" or waited(pending) <= pending.budget_seconds:
        raise busy
    if pending.phase == "rolling_back":
        settle_rollback(ctx, channel)
    else:
        with contextlib.suppress(PromotionFailed):  # recorded in the channel's history; the champion serves
            check_promotion(ctx, channel.name, pending.version.deployment_id)
    fresh = ctx.channels.get(channel.name)
    if fresh is None:
        raise ChannelInvalid(f"channel {channel.name} is gone")
    if fresh.candidate is not None:
        raise busy
    return fresh


def settle_all(ctx: ChannelContext, channels: list[ChannelRecord]) -> list[str]:
    """The reaper's pass: each promotion or rollback claim past its budget, settled; what happened to each,
    as lines. One whose endpoint still moves is left for a later run (nothing it may move onto is
    deleted); a close that stopped midway is channel_close.close_stale's."""
    done: list[str] = []
    for channel in channels:
        pending = channel.candidate
        if pending is None or pending.phase == "closing" or waited(pending) <= pending.budget_seconds:
            continue
        try:
            fresh = settle_stale(ctx, channel)
        except ChannelInvalid:
            continue  # still moving, or gone meanwhile: the next run looks again
        live = fresh.live.deployment_id if fresh.live else None
        done.append(f"channel {channel.name}: settled {pending.version.deployment_id} ({pending.phase}); {live} serves")
    return done


def claim_rollback(ctx: ChannelContext, channel: ChannelRecord, target: ChannelVersion, grace: timedelta,
                   budget_seconds: float) -> ChannelRecord:  # fmt: skip
    """CHANNEL claimed for a rollback onto TARGET, in one conditional write, before its endpoint is
    touched: a promotion (or a twin rollback) that read it before fails its own claim, one after sees busy."""
    previous = channel.live.deployment_id if channel.live else None
    event = ChannelEvent(at=_now(), kind="rolled_back", deployment_id=target.deployment_id, previous=previous,
                         reason="modeldrop rollback")  # fmt: skip
    pending = PendingPromotion(version=target, event=event, phase="rolling_back", started_at=_now(),
                               grace_seconds=grace.total_seconds(), budget_seconds=budget_seconds)  # fmt: skip
    return ctx.channels.save(channel.model_copy(update={"candidate": pending}))


def finish_rollback(ctx: ChannelContext, channel: ChannelRecord) -> ChannelRecord:
    """The rollback's target serves: it goes live, the version it replaces is kept for the grace."""
    pending = channel.candidate
    assert pending is not None and pending.phase == "rolling_back"
    target = pending.version.model_copy(update={"served_at": _now(), "retired_at": None, "remove_after": None})
    done = retire(channel.model_copy(update={"candidate": None}), target, timedelta(seconds=pending.grace_seconds))
    took = round(waited(pending), 1)
    done.history.append(pending.event.model_copy(update={"at": _now(), "seconds": took, "change_seconds": took}))
    return ctx.channels.save(done)


def release_rollback(ctx: ChannelContext, channel: ChannelRecord, reason: str) -> ChannelRecord:
    """The rollback did not take: the claim goes, the history says why; the live version is unchanged."""
    pending = channel.candidate
    assert pending is not None
    failed = pending.event.model_copy(update={"kind": "promotion_failed", "at": _now(), "reason": reason})
    done = channel.model_copy(update={"candidate": None})
    done.history.append(failed)
    return ctx.channels.save(done)


def settle_rollback(ctx: ChannelContext, channel: ChannelRecord) -> ChannelRecord:
    """A stale rollback: finished if the endpoint serves its target, else released; busy while it moves."""
    pending = channel.candidate
    assert pending is not None
    if channel.adapter_only:  # a switch by name: the claim's own write was the rollback's last step
        return finish_rollback(ctx, channel)
    if channel.scales_to_zero:
        from modeldrop.pipeline.channels import idle_channel

        state, problem = idle_channel.check(ctx, channel)
        if state == "moving":
            return channel
        return (
            release_rollback(ctx, channel, f"rollback not completed: {problem}")
            if problem
            else finish_rollback(ctx, channel)
        )
    desc = describe_endpoint(ctx.sm, channel.endpoint_name)
    if desc is not None and desc["EndpointStatus"] in TRANSITIONAL:
        return channel
    problem = not_taken(ctx, channel, pending.version, dict(desc)) if desc else "the channel's endpoint is gone"
    return (
        release_rollback(ctx, channel, f"rollback not completed: {problem}")
        if problem
        else finish_rollback(ctx, channel)
    )


def complete(ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord) -> ChannelRecord:
    """The pending version serves: it goes live, the one it replaces is kept for the grace, and the
    promoted deployment's preview endpoint goes (an adapter's endpoint is the channel's base: it stays)."""
    pending = channel.candidate
    assert pending is not None
    version = pending.version.model_copy(update={"served_at": _now()})
    adapter = version.component is not None
    seconds, origin = seconds_from_upload(ctx.s3, record)
    event = pending.event.model_copy(update={"at": _now(), "seconds": seconds, "reason": f"timed from its {origin}",
                                             "change_seconds": round(waited(pending), 1)})  # fmt: skip
    done = retire(channel.model_copy(update={"candidate": None}), version, timedelta(seconds=pending.grace_seconds))
    done.history.append(event)
    saved = ctx.channels.save(done)
    if not adapter:
        drop_preview(ctx, record)
    record_promoted(ctx, record, saved)
    return saved


def record_promoted(ctx: ChannelContext, record: DeploymentRecord, channel: ChannelRecord) -> None:
    served = channel.history[-1].seconds if channel.history else None
    ctx.registry.record(record.deployment_id, "promoted", {"channel": channel.name, "at": _now(), "seconds": served,
                        "invoke": channel.invoke_target()}, status="succeeded")  # fmt: skip


def fail(ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord, reason: str) -> None:
    """The pending promotion did not take: a channel being created is undone (its endpoint, alarms and
    record; the deployment keeps its preview); an update's candidate is deleted, the champion serves."""
    pending = channel.candidate
    if pending is not None and pending.phase == "creating":
        # Only an endpoint tagged as this stack's channel of that name: CreateEndpoint may have failed
        # because the name is someone else's, and that one is not ours to delete.
        from modeldrop.pipeline.channels import idle_channel

        with contextlib.suppress(ChannelInvalid, ClientError):
            idle_channel.close(ctx, channel)
        with contextlib.suppress(ChannelInvalid):
            delete_channel_endpoint(ctx, channel)
        idle_channel.delete_config(ctx, channel)
        delete_alarms(ctx.cloudwatch, channel.alarms)
        ctx.channels.delete(channel)
        return
    event = pending.event if pending else ChannelEvent(at=_now(), kind="promoted")
    failed = event.model_copy(update={"kind": "promotion_failed", "reason": reason, "at": _now()})
    refuse(ctx, channel.model_copy(update={"candidate": None}), record, failed)


def refuse(ctx: ChannelContext, channel: ChannelRecord, record: DeploymentRecord, event: ChannelEvent) -> None:
    """The champion still serves; the candidate's resources go, and the history says why."""
    error = "PromotionBlocked" if event.kind == "blocked" else "PromotionFailed"
    deleted = _discard(ctx, record, error, event.reason)
    event = event.model_copy(update={"seconds": _since(record.created_at), "reason": f"{event.reason}; deleted "
                                     f"{', '.join(deleted) or 'nothing'}"})  # fmt: skip
    channel.history.append(event)
    ctx.channels.save(channel)


def _since(iso: str | None) -> float | None:
    return round((clock.utcnow() - clock.parse_iso(iso)).total_seconds(), 1) if iso else None


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


def drop_preview(ctx: ChannelContext, record: DeploymentRecord) -> None:
    """The promoted deployment's own endpoint (if tagged for it), its config and model kept: the channel
    is to serve them. Dropped before the update, so that the green fleet never needs a third fleet's quota;
    one left (a throttle) keeps its TTL: the reaper deletes it then."""
    delete_all(ctx.sm, str(record.endpoint_name), None, None, owner=record.deployment_id)


def seconds_from_upload(s3: S3Client | None, record: DeploymentRecord) -> tuple[float | None, str]:
    """Seconds from the upload that started RECORD (its marker for a prefix, else its archive) to now,
    and what they count from; the record's creation when the object cannot be read."""
    started: datetime | None = None
    origin = "request"
    uri = str(record.artifact_uri) if record.artifact_uri else ""
    if s3 is not None and uri.startswith("s3://"):
        location = parse_s3_uri(uri)
        key = location.key + MARKER_NAME if location.key.endswith("/") or not location.key else location.key
        try:
            started = s3.head_object(Bucket=location.bucket, Key=key)["LastModified"]
            origin = "marker" if key.endswith(MARKER_NAME) else "upload"
        except ClientError:
            started = None
    if started is None and record.created_at:
        started, origin = clock.parse_iso(record.created_at), "request"
    if started is None:
        return None, origin
    return round(max(0.0, (clock.utcnow() - started).total_seconds()), 1), origin
