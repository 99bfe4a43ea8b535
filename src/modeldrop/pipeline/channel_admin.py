"""Channel administration: a rollback to the last known-good version in one step, and closing a
channel (its endpoint, every version it holds, its alarms, its record; an adapter channel's base)."""

from __future__ import annotations

from datetime import timedelta

from modeldrop.aws.channel_alarms import delete_alarms
from modeldrop.contracts.channel import ChannelEvent, ChannelRecord
from modeldrop.contracts.errors import ChannelInvalid, TeardownIncomplete
from modeldrop.pipeline.adapter_promotion import verify_component
from modeldrop.pipeline.channel_context import DEFAULT_GRACE, ChannelContext, delete_channel_endpoint, retire, switch
from modeldrop.pipeline.channel_context import now_iso as _now
from modeldrop.pipeline.channel_upkeep import delete_version
from modeldrop.pipeline.teardown import held_by
from modeldrop.pipeline.teardown import teardown as teardown_now


def rollback(ctx: ChannelContext, channel_name: str, grace: timedelta = DEFAULT_GRACE) -> ChannelRecord:
    """CHANNEL_NAME back to its last known-good version in one step (no gate: it served before)."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        raise ChannelInvalid(f"no channel {channel_name}")
    if channel.candidate is not None:
        raise ChannelInvalid(
            f"channel {channel_name} is busy: {channel.candidate.version.deployment_id} is being promoted",
            f"wait for it (`modeldrop status {channel_name}`), then roll back",
        )
    target = channel.last_known_good()
    if target is None:
        raise ChannelInvalid(f"channel {channel_name} keeps no earlier version to roll back to",
                             "a superseded version is kept for the grace period of its promotion")  # fmt: skip
    record = ctx.registry.get(target.deployment_id)
    channel = ctx.channels.save(channel)  # claimed first, as promote does: a twin that read it is refused
    if channel.adapter_only:
        verify_component(ctx.sm, channel, target)
    else:
        switch(ctx, channel, target, record.instance_count if record else 1)
    previous = channel.live.deployment_id if channel.live else None
    channel = retire(channel, target.model_copy(update={"served_at": _now(), "retired_at": None,
                                                         "remove_after": None}), grace)  # fmt: skip
    channel.history.append(ChannelEvent(at=_now(), kind="rolled_back", deployment_id=target.deployment_id,
                                        previous=previous, reason="modeldrop rollback"))  # fmt: skip
    return ctx.channels.save(channel)


def close_channel(ctx: ChannelContext, channel_name: str) -> list[str]:
    """The whole channel deleted: its endpoint, every version it holds, its alarms and its record."""
    channel = ctx.channels.get(channel_name)
    if channel is None:
        raise ChannelInvalid(f"no channel {channel_name}")
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
