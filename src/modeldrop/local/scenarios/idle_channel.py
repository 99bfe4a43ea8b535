"""`run-local --channel NAME --idle 10m`: a channel that scales to zero, its day on the emulator's clock.
The generated checkpoint creates the channel with the idle policy in its request; a client calls it; the
idle period passes with no call and the channel's copies and instances go to zero; the next call is
refused as waking, the client waits it out, and the first answer's latency is reported; the channel
sleeps again and a second checkpoint is gated (the channel woken for it) and promoted onto the same
component, then rolled back while asleep; after a quiet night the report gives the channel's
instance-hours and cost against always-on; it is closed.

With `zero-refused` the region refuses MinInstanceCount 0: the channel is created always-on, its plan
saying why before anything is created. With `slow-wake` the wake-up outlasts the client's wait.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modeldrop.aws.autoscaling import idle_scaling
from modeldrop.aws.sagemaker import channel_invoke
from modeldrop.contracts import clock
from modeldrop.contracts.channel import ChannelRecord, parse_idle
from modeldrop.contracts.errors import ModeldropError
from modeldrop.local.scenarios.channel import CHANNEL_QUOTA, GATE, GRACE, channel_context
from modeldrop.pipeline.channels.channel_admin import close_channel, rollback
from modeldrop.pipeline.channels.channel_context import ChannelContext
from modeldrop.pipeline.channels.channel_cost import channel_cost

IDLE_FAULTS = frozenset({"slow-wake", "zero-refused", "gate-scale-in"})
# The night after the day: hours with no call, where a channel that scales to zero bills nothing.
QUIET_HOURS = 6
PROMPT = json.dumps({"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8}).encode()


def call_waiting(ctx: ChannelContext, channel: ChannelRecord, wait_seconds: float) -> dict[str, Any]:
    """One call to the channel as its clients are told to make it (aws/sagemaker/channel_invoke), the body left out."""
    assert ctx.runtime is not None
    done = channel_invoke.call_waiting(ctx.runtime, channel.invoke_target(), PROMPT, wait_seconds)
    done.pop("body", None)
    return done


class ReaperSchedule:
    """The stack's reaper run as its EventBridge schedule runs it: every ReaperPeriodMinutes of the
    emulator's clock (it arms a channel's idle alarm once the channel has existed its idle period)."""

    def __init__(self, stack: Any) -> None:
        self.stack = stack
        self.period = 60 * int(stack.parameters.get("ReaperPeriodMinutes") or 15)
        self.last = clock.utcnow()

    def tick(self) -> None:
        if (clock.utcnow() - self.last).total_seconds() >= self.period:
            self.last = clock.utcnow()
            self.stack.invoke_function("ReaperFunction", {"source": "aws.events", "detail-type": "Scheduled Event"})


_schedules: list[ReaperSchedule] = []  # this run's scheduled reaper (set by run_idle_channel)


def sleep_until_scaled_in(ctx: ChannelContext, channel: ChannelRecord, after_seconds: int) -> dict[str, Any]:
    """The emulator's clock moved a minute at a time (the reaper running on its schedule) until the
    channel has no copy (within twice its idle period and a reaper period): how long that took, and the
    instances its endpoint then has."""
    assert channel.idle is not None and channel.idle.component is not None
    started = clock.utcnow()
    bound = 2 * after_seconds + 120 + max((s.period for s in _schedules), default=0)
    while (clock.utcnow() - started).total_seconds() < bound:
        clock.advance(60)
        for schedule in _schedules:
            schedule.tick()
        if idle_scaling.copies(ctx.sm, channel.idle.component) == (0, 0):
            variant = ctx.sm.describe_endpoint(EndpointName=channel.endpoint_name)["ProductionVariants"][0]
            return {"step": "scaled to zero", "idle_seconds": round((clock.utcnow() - started).total_seconds()),
                    "instances": variant.get("CurrentInstanceCount")}  # fmt: skip
    return {"step": "not scaled in", "error": f"still running {bound} s after the last call"}


def _instances(ctx: ChannelContext, channel: ChannelRecord) -> int | None:
    variant = ctx.sm.describe_endpoint(EndpointName=channel.endpoint_name)["ProductionVariants"][0]
    count = variant.get("CurrentInstanceCount")
    return int(count) if count is not None else None


def _sleep_and_wake(ctx: ChannelContext, record: ChannelRecord, after: int) -> list[dict[str, Any]]:
    """A call; the idle period with none (scaled to zero); a call that wakes it; asleep again."""
    wait = float(record.idle.wake_seconds if record.idle else 0)
    steps = [{"step": "called", **call_waiting(ctx, record, wait)}, sleep_until_scaled_in(ctx, record, after)]
    woke = call_waiting(ctx, record, wait)
    steps.append({"step": "woken by a call" if woke["answered"] else "not woken", **woke})
    if woke["answered"]:
        steps.append(sleep_until_scaled_in(ctx, record, after))
    return steps


def _promote(
    ctx: ChannelContext, channel: str, folder: Path, workdir: Path, deploy: Callable[..., Any], stack: Any,
    on_state: Any, asks: dict[str, Any],
) -> tuple[Any, list[dict[str, Any]]]:  # fmt: skip
    """FOLDER deployed asking for the channel (asleep: woken for the gate), then called and left to sleep."""
    started = time.monotonic()
    asleep = ctx.channels.get(channel)
    second = deploy(stack, folder, workdir, on_state, request=asks, key="local/second/model.tar.gz", keep=True)
    fresh = ctx.channels.get(channel)
    if second.status != "succeeded" or not fresh or not fresh.live or fresh.live.deployment_id != second.deployment_id:
        return second, [{"step": "not promoted", "deployment_id": second.deployment_id, "error": second.error}]
    event = fresh.history[-1]
    steps = [{"step": "promoted while asleep" if asleep and asleep.scales_to_zero else "promoted",
              "deployment_id": second.deployment_id, "seconds_to_serving": event.seconds,
              "gate": (event.gate or {}).get("summary"), "invoke": fresh.invoke_target(),
              "wall_seconds": round(time.monotonic() - started, 1)}]  # fmt: skip
    if fresh.scales_to_zero and fresh.idle:
        steps.append({"step": "called the promoted version", **call_waiting(ctx, fresh, fresh.idle.wake_seconds)})
        steps.append(sleep_until_scaled_in(ctx, fresh, fresh.idle.after_seconds))
        back = rollback(ctx, channel, grace=GRACE)  # asleep: woken, then its component moved back
        live = back.live.deployment_id if back.live else None
        steps.append({"step": "rolled back while asleep", "deployment_id": live, "seconds": back.history[-1].seconds,
                      "invoke": back.invoke_target()})  # fmt: skip
        steps.append(sleep_until_scaled_in(ctx, back, fresh.idle.after_seconds))
    return second, steps


def run_idle_channel(
    stack: Any,
    channel: str,
    idle: str,
    workdir: Path,
    deploy: Callable[..., Any],
    on_state: Any,
    candidate: Path | None = None,
    faults: frozenset[str] = frozenset(),
) -> tuple[Any, dict[str, Any]]:
    """The idle channel's day (module docstring); DEPLOY is run-local's own deploy."""
    from modeldrop.local.emulator import service_quotas
    from modeldrop.local.samples.checkpoint import write_checkpoint
    from modeldrop.serving.memory_plan import instance_catalog

    service_quotas.set_endpoint_quotas({name: CHANNEL_QUOTA for name in instance_catalog()["instances"]})
    ctx = channel_context(stack)
    after = parse_idle(idle)
    day_started = clock.utcnow()
    asks = {"channel": channel, "gate": GATE, "promotion_grace_hours": GRACE.total_seconds() / 3600,
            "idle": {"scale_to_zero_after": idle}}  # fmt: skip
    first = deploy(stack, None, workdir, on_state, request=asks, key="local/first/model.tar.gz", keep=True)
    steps: list[dict[str, Any]] = []
    summary: dict[str, Any] = {"name": channel, "steps": steps}
    record = ctx.channels.get(channel)
    if first.status != "succeeded" or record is None:
        return first, summary
    summary["idle"] = record.idle.model_dump(mode="json") if record.idle else None
    steps.append({"step": "created", "deployment_id": first.deployment_id, "invoke": record.invoke_target(),
                  "mode": record.idle.mode if record.idle else "always_on"})  # fmt: skip
    result = first
    _schedules[:] = [ReaperSchedule(stack)]
    try:
        if record.scales_to_zero:
            steps += _sleep_and_wake(ctx, record, after)
        second_dir = candidate or write_checkpoint(workdir / "second", shards=3)
        second_asks = asks
        if "regression" in faults:  # a broken candidate, which its own smoke eval tolerates and the gate must not
            stack.hosting.plan("truncate")
            second_asks = {**asks, "eval_thresholds": {"max_truncated": 100, "max_errors": 0}}
        result, promoted = _promote(ctx, channel, second_dir, workdir, deploy, stack, on_state, second_asks)
        steps += promoted
    except ModeldropError as exc:
        summary["error"] = f"{type(exc).__name__}: {exc.message}"
    finally:
        _schedules.clear()
    final = ctx.channels.get(channel)
    if final is not None:
        clock.advance(QUIET_HOURS * 3600)
        steps.append({"step": "a quiet night", "hours": QUIET_HOURS, "instances": _instances(ctx, final)})
        summary["cost"] = channel_cost(ctx.sm, ctx.autoscaling, final, ctx.sm.meta.region_name)
        summary["day_hours"] = round((clock.utcnow() - day_started).total_seconds() / 3600, 3)
        summary["history"] = [e.model_dump(mode="json") for e in final.history]
        summary["closed"] = close_channel(ctx, channel)
    return result, summary
