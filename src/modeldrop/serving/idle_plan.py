"""A channel's idle policy, planned before anything is created: after how long without an invocation it
scales to zero, whether the region and the serving shape allow that, how a client knows it is waking
and how long to wait, and what the channel costs against always-on.

Scale to zero exists only for an endpoint of inference components with managed instance scaling at
MinInstanceCount 0; some regions refuse that (data/scale_to_zero.json). Where it cannot be had the
channel runs always-on, and the plan says why and what that costs, before anything is created.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from functools import cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The error a client gets while nothing runs: SageMaker Runtime's 400 ValidationError saying the
# component has no capacity (its NoCapacityInvocationFailures metric counts it, and wakes the channel).
WAKING_ERROR_CODE = "ValidationError"
WAKING_MESSAGE_PART = "no capacity"


@cache
def _data() -> dict[str, Any]:
    text = resources.files("modeldrop.serving").joinpath("data/scale_to_zero.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def refusal_message() -> str:
    return str(_data()["refusal_message"])


def provisioning_seconds() -> int:
    return int(_data()["provisioning_seconds"])


class IdleDecision(BaseModel):
    """What a channel with an idle policy does where it is planned."""

    model_config = ConfigDict(frozen=True)

    mode: Literal["scale_to_zero", "always_on"]
    after_seconds: int
    reason: str = ""  # why always-on, when it is
    region: str
    instance_type: str
    max_instances: int = Field(1, ge=1)
    hourly_price: float | None = None  # one instance, from the catalog
    # How long a client should keep retrying the waking error: provisioning an instance, then the
    # plan's own model download and container start-up.
    wake_seconds: int = 0

    @property
    def scales_to_zero(self) -> bool:
        return self.mode == "scale_to_zero"

    def always_on_day_cost(self) -> float | None:
        """A day at full size: what the stack's price ceiling counts (a channel at its maximum)."""
        return None if self.hourly_price is None else round(self.hourly_price * self.max_instances * 24, 2)


def decide(
    after_seconds: int,
    region: str,
    instance_type: str,
    max_instances: int,
    hourly_price: float | None,
    startup_seconds: int,
    also_refusing: tuple[str, ...] = (),
) -> IdleDecision:
    """Scale to zero where the region allows it; else always-on, with the reason. ALSO_REFUSING: regions
    the stack's owner lists (NoScaleToZeroRegions) beside the known ones."""
    refusing: dict[str, str] = {**_data()["refusing_regions"],
                                **{r: "the stack's NoScaleToZeroRegions" for r in also_refusing}}  # fmt: skip
    wake = provisioning_seconds() + startup_seconds
    decision = IdleDecision(mode="scale_to_zero", after_seconds=after_seconds, region=region,
                            instance_type=instance_type, max_instances=max_instances, hourly_price=hourly_price,
                            wake_seconds=wake)  # fmt: skip
    if region in refusing:
        reason = (
            f"{region} refuses MinInstanceCount 0 for managed instance scaling ({refusing[region]}): the channel "
            "runs always-on"
        )
        return decision.model_copy(update={"mode": "always_on", "reason": reason})
    return decision


def refused_at_create(decision: IdleDecision, message: str) -> IdleDecision:
    """DECISION after the region refused scale to zero at CreateEndpointConfig (a region not yet listed)."""
    reason = f"{decision.region} refused MinInstanceCount 0 at CreateEndpointConfig ({message[:200]}): always-on"
    return decision.model_copy(update={"mode": "always_on", "reason": reason})


def is_waking_error(code: str, message: str) -> bool:
    """A runtime error that means "no copy runs yet": retry, the channel is waking."""
    return code == WAKING_ERROR_CODE and WAKING_MESSAGE_PART in message.lower()


# ---- cost from a scaling history ------------------------------------------------------------------


class Interval(BaseModel):
    start: datetime
    end: datetime
    instances: int


def instance_intervals(
    since: datetime, until: datetime, changes: list[tuple[datetime, int]], initial: int = 1
) -> list[Interval]:
    """The channel's instances over [SINCE, UNTIL]: INITIAL from SINCE, then each (time, count) change."""
    out: list[Interval] = []
    current, at = initial, since
    for when, count in sorted(changes):
        if when <= at:
            current = count
            continue
        if when >= until:
            break
        out.append(Interval(start=at, end=when, instances=current))
        current, at = count, when
    if until > at:
        out.append(Interval(start=at, end=until, instances=current))
    return out


def hours_within(intervals: list[Interval], start: datetime, end: datetime) -> tuple[float, float]:
    """(instance-hours, wall hours) of INTERVALS clipped to [START, END]."""
    instance_hours = wall = 0.0
    for iv in intervals:
        lo, hi = max(iv.start, start), min(iv.end, end)
        if hi > lo:
            hours = (hi - lo) / timedelta(hours=1)
            instance_hours += hours * iv.instances
            wall += hours
    return instance_hours, wall
