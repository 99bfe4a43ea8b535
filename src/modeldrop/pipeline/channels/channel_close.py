"""Closing a channel: claimed first (a `closing` claim, so that a promotion meanwhile is refused busy),
then its endpoint, every version it holds, its alarms and its record; an adapter channel's base with it
unless another channel runs on it. A close that stopped midway (its CLI killed) is finished by the next
`teardown CHANNEL`, or by the reaper once the claim is past its budget (close_stale).

Imports no eval or template code: the reaper runs it (tests/contracts/test_layout.py).
"""

from __future__ import annotations

from modeldrop.aws.autoscaling.channel_alarms import delete_alarms
from modeldrop.contracts.channel import ChannelEvent, ChannelRecord, ChannelVersion, PendingPromotion
from modeldrop.contracts.errors import ChannelInvalid, ModeldropError, TeardownIncomplete
from modeldrop.pipeline.channels import idle_channel
from modeldrop.pipeline.channels.channel_context import ChannelContext, delete_channel_endpoint
from modeldrop.pipeline.channels.channel_context import now_iso as _now
from modeldrop.pipeline.channels.channel_upkeep import delete_version
from modeldrop.pipeline.channels.promotion_settle import settle_stale, waited
from modeldrop.pipeline.deployment.teardown import held_by
from modeldrop.pipeline.deployment.teardown import teardown as teardown_now


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
    deleted = idle_channel.close(ctx, channel)  # scaling and component first: the endpoint holds them
    deleted += [] if channel.adapter_only else delete_channel_endpoint(ctx, channel)
    deleted += idle_channel.delete_config(ctx, channel)
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


def close_stale(ctx: ChannelContext, channels: list[ChannelRecord]) -> list[str]:
    """The reaper's pass: each close that stopped midway and is past its budget, finished (the channel's
    endpoint would otherwise bill on with no TTL); what happened to each, as lines."""
    done: list[str] = []
    for channel in channels:
        pending = channel.candidate
        if pending is None or pending.phase != "closing" or waited(pending) <= pending.budget_seconds:
            continue
        try:
            deleted = close_channel(ctx, channel.name)
        except ModeldropError as exc:
            done.append(f"channel {channel.name}: the close could not be finished: {exc.message}")
            continue
        done.append(f"channel {channel.name}: a close that stopped midway, finished ({len(deleted)} deleted)")
    return done
