"""Channel administration: a rollback to the last known-good version in one step, and closing a
channel (its endpoint, every version it holds, its alarms, its record; an adapter channel's base)."""

from __future__ import annotations

from datetime import timedelta

from modeldrop.aws.channel_alarms import delete_alarms
from modeldrop.aws.sagemaker_resources import describe_endpoint
from modeldrop.contracts.channel import ChannelEvent, ChannelRecord, ChannelVersion, PendingPromotion
from modeldrop.contracts.errors import ChannelInvalid, PromotionFailed, TeardownIncomplete
from modeldrop.pipeline.adapter_promotion import verify_component
from modeldrop.pipeline.channel_context import (
    DEFAULT_GRACE,
    SETTLE_BUDGET_SECONDS,
    TRANSITIONAL,
    ChannelContext,
    delete_channel_endpoint,
    promotion_timeouts,
    switch,
)
from modeldrop.pipeline.channel_context import now_iso as _now
from modeldrop.pipeline.channel_upkeep import delete_version
from modeldrop.pipeline.promotion_settle import claim_rollback, finish_rollback, release_rollback, settle_stale
from modeldrop.pipeline.teardown import held_by
from modeldrop.pipeline.teardown import teardown as teardown_now


def rollback(ctx: ChannelContext, channel_name: str, grace: timedelta = DEFAULT_GRACE) -> ChannelRecord:
    """CHANNEL_NAME back to its last known-good version in one step (no gate: it served before). The
    channel is claimed (one conditional write) before its endpoint is touched, as a promotion claims
    it: a promotion or a twin rollback is refused busy until this one has completed or been released."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        raise ChannelInvalid(f"no channel {channel_name}")
    if channel.candidate is not None:
        channel = settle_stale(ctx, channel)
    target = channel.last_known_good()
    if target is None:
        raise ChannelInvalid(f"channel {channel_name} keeps no earlier version to roll back to",
                             "a superseded version is kept for the grace period of its promotion")  # fmt: skip
    record = ctx.registry.get(target.deployment_id)
    timeout, budget = promotion_timeouts(record) if record else (SETTLE_BUDGET_SECONDS, float(SETTLE_BUDGET_SECONDS))
    channel = claim_rollback(ctx, channel, target, grace, budget)
    try:
        if channel.adapter_only:
            verify_component(ctx.sm, channel, target)
        else:
            switch(ctx, channel, target, record.instance_count if record else 1, timeout)
    except PromotionFailed as exc:
        if channel.adapter_only or not _moving(ctx, channel):
            release_rollback(ctx, channel, f"rollback failed: {exc.message}")
        raise
    return finish_rollback(ctx, channel)


def _moving(ctx: ChannelContext, channel: ChannelRecord) -> bool:
    """Whether the channel's endpoint is still changing: then the claim stands until it settles."""
    desc = describe_endpoint(ctx.sm, channel.endpoint_name)
    return desc is not None and desc["EndpointStatus"] in TRANSITIONAL


def close_channel(ctx: ChannelContext, channel_name: str) -> list[str]:
    """The whole channel deleted: its endpoint, every version it holds, its alarms and its record."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        raise ChannelInvalid(f"no channel {channel_name}")
    if channel.candidate is not None and channel.candidate.phase != "closing":  # a close resumed is no twin
        channel = settle_stale(ctx, channel)
    if channel.candidate is None:  # claimed before anything is deleted: a promotion after this sees it busy
        version = channel.live or ChannelVersion(deployment_id="")
        claim = PendingPromotion(version=version, phase="closing", started_at=_now(),
                                 event=ChannelEvent(at=_now(), kind="retired", reason="channel closed"))  # fmt: skip
        channel = ctx.channels.save(channel.model_copy(update={"candidate": claim}))
    deleted = [] if channel.adapter_only else delete_channel_endpoint(ctx, channel)
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
