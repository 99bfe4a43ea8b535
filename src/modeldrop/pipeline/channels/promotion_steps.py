"""The state machine's promotion (a request with `channel`): after the deployment succeeded, its
Promote task starts the promotion (the gate, the channel claimed, its endpoint created or updated),
and checks it between waits until the channel serves it -- or ends it with PromotionBlocked,
PromotionFailed or ChannelInvalid, the champion serving on."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel

from modeldrop.contracts import clock
from modeldrop.contracts.channel import ChannelEvent, ChannelRecord
from modeldrop.contracts.errors import PromotionFailed, RecordNotOwned
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.pipeline.channels.channel_context import POLL_SECONDS, ChannelContext, now_iso
from modeldrop.pipeline.channels.gate_cases import request_gate_cases
from modeldrop.pipeline.channels.idle_channel import Waking
from modeldrop.pipeline.channels.promotion import check_promotion, start_promotion
from modeldrop.pipeline.channels.promotion_settle import refuse


class PromotionProgress(BaseModel):
    """What the state machine reads: whether to wait and look again, and what serves."""

    status: Literal["pending", "serving"]
    channel: str
    deployment_id: str
    wait_seconds: int = POLL_SECONDS
    endpoint_name: str
    invoke: dict[str, str]
    gate: str | None = None  # the gate's summary
    seconds: float | None = None  # from the upload (an adapter) or the request to serving


def promotion_step(
    ctx: ChannelContext, request: NormalizedRequest, action: Literal["start", "check"], execution_arn: str
) -> PromotionProgress:
    """One Promote task: start the request's promotion, or check the one under way."""
    channel_name = str(request.channel)
    record = ctx.registry.get(request.deployment_id)
    if record is None or (record.execution_arn and record.execution_arn != execution_arn):
        raise RecordNotOwned(f"deployment {request.deployment_id} belongs to another execution: nothing was promoted")
    if action == "start" and _started(ctx, channel_name, request.deployment_id):
        action = "check"  # a retried start: the first attempt got as far as the claim
    elif action == "check" and record.step("channel_waking") and not _started(ctx, channel_name, request.deployment_id):
        action = "start"  # the channel was asleep at the start: woken meanwhile, the gate runs now
    if action == "start":
        # The channel's own cases: a marker's eval_set_uri is its candidate's smoke eval, never the gate's.
        cases, pin = request_gate_cases(ctx, channel_name, request.eval_set_uri, request.source == "s3-event")
        grace = timedelta(hours=request.promotion_grace_hours)
        idle_after = request.idle.seconds if request.idle else None
        try:
            channel = start_promotion(ctx, request.deployment_id, channel_name, cases, request.gate, grace, pin,
                                      idle_after)  # fmt: skip
        except Waking as waking:
            return _waking(ctx, record, channel_name, waking)
    else:
        channel = check_promotion(ctx, channel_name, request.deployment_id)
    return _progress(channel, request.deployment_id)


def _waking(ctx: ChannelContext, record: DeploymentRecord, channel_name: str, waking: Waking) -> PromotionProgress:
    """The channel sleeps: knocked on; the state machine looks again after its wait, for at most the
    channel's wake time from the first knock -- then the candidate is refused, the champion sleeps on."""
    since = str(record.step_dict("channel_waking").get("since") or now_iso())
    if not record.step("channel_waking"):
        ctx.registry.record(record.deployment_id, "channel_waking", {"since": since, "channel": channel_name})
    waited = (clock.utcnow() - clock.parse_iso(since)).total_seconds()
    channel = ctx.channels.get(channel_name)
    if waited > waking.wake_seconds and channel is not None:
        reason = f"channel {channel_name} did not wake within {waking.wake_seconds} s for the gate"
        refuse(ctx, channel, record, ChannelEvent(at=now_iso(), kind="promotion_failed",
                                                  deployment_id=record.deployment_id, reason=reason))  # fmt: skip
        raise PromotionFailed(reason, "the champion still serves; promote again once it answers")
    return PromotionProgress(
        status="pending",
        wait_seconds=POLL_SECONDS,
        channel=channel_name,
        deployment_id=record.deployment_id,
        endpoint_name=channel.endpoint_name if channel else "",
        invoke=channel.invoke_target() if channel else {},
        gate="waking the channel for the gate",
    )


def _started(ctx: ChannelContext, channel_name: str, deployment_id: str) -> bool:
    channel = ctx.channels.get(channel_name)
    if channel is None:
        return False
    pending = channel.candidate is not None and channel.candidate.version.deployment_id == deployment_id
    return pending or (channel.live is not None and channel.live.deployment_id == deployment_id)


# Checks of one promotion at most: the wait between them stretches to fit its budget, so that the
# WaitForPromotion/CheckPromotion loop stays inside the execution's 25,000 events (a contract test adds it up).
MAX_PROMOTION_CHECKS = 60


def _progress(channel: ChannelRecord, deployment_id: str) -> PromotionProgress:
    pending = channel.candidate
    wait = max(POLL_SECONDS, math.ceil(pending.budget_seconds / MAX_PROMOTION_CHECKS)) if pending else POLL_SECONDS
    event = pending.event if pending else (channel.history[-1] if channel.history else None)
    gate = (event.gate or {}).get("summary") if event else None
    return PromotionProgress(
        status="pending" if pending else "serving",
        wait_seconds=wait,
        channel=channel.name,
        deployment_id=deployment_id,
        endpoint_name=channel.endpoint_name,
        invoke=channel.invoke_target(),
        gate=str(gate) if gate else None,
        seconds=None if pending or event is None else event.seconds,
    )
