"""The state machine's promotion (a request with `channel`): after the deployment succeeded, its
Promote task starts the promotion (the gate, the channel claimed, its endpoint created or updated),
and checks it between waits until the channel serves it -- or ends it with PromotionBlocked,
PromotionFailed or ChannelInvalid, the champion serving on."""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Literal

from pydantic import BaseModel

from modeldrop.contracts.channel import ChannelRecord
from modeldrop.contracts.errors import RecordNotOwned
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.pipeline.channel_context import POLL_SECONDS, ChannelContext
from modeldrop.pipeline.gate_cases import request_gate_cases
from modeldrop.pipeline.promotion import check_promotion, start_promotion


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
    if action == "start":
        # The channel's own cases: a marker's eval_set_uri is its candidate's smoke eval, never the gate's.
        cases, pin = request_gate_cases(ctx, channel_name, request.eval_set_uri, request.source == "s3-event")
        grace = timedelta(hours=request.promotion_grace_hours)
        channel = start_promotion(ctx, request.deployment_id, channel_name, cases, request.gate, grace, pin)
    else:
        channel = check_promotion(ctx, channel_name, request.deployment_id)
    return _progress(channel, request.deployment_id)


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
