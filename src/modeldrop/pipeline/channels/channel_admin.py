"""Channel administration: a rollback to the last known-good version in one step, and closing a
channel (channel_close: its endpoint, every version it holds, its alarms, its record; an adapter
channel's base)."""

from __future__ import annotations

from datetime import timedelta

from modeldrop.aws.sagemaker.sagemaker_resources import describe_endpoint
from modeldrop.contracts.channel import ChannelRecord
from modeldrop.contracts.errors import ChannelInvalid, PromotionFailed
from modeldrop.pipeline.channels import idle_channel
from modeldrop.pipeline.channels.adapter_promotion import verify_component
from modeldrop.pipeline.channels.channel_close import close_channel
from modeldrop.pipeline.channels.channel_context import (
    DEFAULT_GRACE,
    TRANSITIONAL,
    ChannelContext,
    promotion_timeouts,
    switch,
)
from modeldrop.pipeline.channels.promotion_settle import claim_rollback, finish_rollback, release_rollback, settle_stale


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
    timeout, budget = promotion_timeouts(record)
    channel = claim_rollback(ctx, channel, target, grace, budget)
    try:
        if channel.adapter_only:
            verify_component(ctx.sm, channel, target)
        elif channel.scales_to_zero:
            idle_channel.switch(ctx, channel, target)
        else:
            switch(ctx, channel, target, record.instance_count if record else 1, timeout)
    except PromotionFailed as exc:
        if channel.adapter_only or channel.scales_to_zero or not _moving(ctx, channel):
            release_rollback(ctx, channel, f"rollback failed: {exc.message}")
        raise
    return finish_rollback(ctx, channel)


def _moving(ctx: ChannelContext, channel: ChannelRecord) -> bool:
    """Whether the channel's endpoint is still changing: then the claim stands until it settles."""
    desc = describe_endpoint(ctx.sm, channel.endpoint_name)
    return desc is not None and desc["EndpointStatus"] in TRANSITIONAL


__all__ = ["close_channel", "rollback"]
