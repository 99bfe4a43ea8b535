"""The instance types a deployment may try, in order, each with its memory plan's verdict.

An explicit list is tried as given; "auto" is the requested (or default) type first, then every
catalog type whose plan fits this checkpoint and these settings, cheapest first. A type the plan
refuses, or priced above max_hourly_price, stays in the list (so `plan` can say why) but is never
tried: another GPU that would OOM only bills again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from modeldrop.contracts.errors import PlanRefused
from modeldrop.contracts.models import Candidate, EnginePlan
from modeldrop.serving.memory_plan import hourly_price, instance_catalog

PlanFor = Callable[[str], EnginePlan]

AUTO = "auto"


def candidates(
    first: str,
    requested: Sequence[str] | None,
    plan_for: PlanFor,
    region: str,
    max_hourly_price: float | None = None,
    force: bool = False,
) -> list[Candidate]:
    """The preference list. `plan_for(type)` plans one type (raising PlanRefused for an OOM)."""
    if requested is None:
        order = [first]
    elif list(requested) == [AUTO]:
        rest = [t for t in instance_catalog()["instances"] if t != first]
        order = [first, *sorted(rest, key=lambda t: (hourly_price(t, region) or float("inf"), t))]
    else:
        order = list(requested)
    auto = requested is not None and list(requested) == [AUTO]
    out: list[Candidate] = []
    for index, instance_type in enumerate(order):
        candidate = judge(instance_type, plan_for, region, max_hourly_price, force)
        # "auto" lists only what fits beyond the first type: a catalog of OOMs helps no one.
        if auto and index > 0 and candidate.verdict != "fits":
            continue
        out.append(candidate)
    return out


def judge(
    instance_type: str, plan_for: PlanFor, region: str, max_hourly_price: float | None, force: bool = False
) -> Candidate:
    price = hourly_price(instance_type, region)
    try:
        plan = plan_for(instance_type)
    except PlanRefused as exc:
        return Candidate(
            instance_type=instance_type, verdict="oom", hourly_price=price, usable=force, reason=exc.message
        )
    verdict = str(plan.memory.get("verdict") or "unknown")
    if max_hourly_price is not None and (price is None or price > max_hourly_price):
        shown = f"${price:.2f}/h" if price is not None else "an unknown price"
        return Candidate(
            instance_type=instance_type,
            verdict="over-price",
            hourly_price=price,
            usable=False,
            reason=f"{shown} is above max_hourly_price ${max_hourly_price:.2f}/h",
        )
    return Candidate(instance_type=instance_type, verdict=verdict, hourly_price=price)


def usable(candidates: Sequence[Candidate]) -> list[Candidate]:
    return [c for c in candidates if c.usable]
