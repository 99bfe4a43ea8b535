"""The instance types a deployment may try, in order, each with its memory plan's verdict.

An explicit list is tried as given; "auto" is the requested (or default) type first, then every
catalog type whose plan fits this checkpoint and these settings, cheapest first. A type the plan
refuses, or priced above max_hourly_price, stays in the list (so `plan` can say why) but is never
tried: another GPU that would OOM only bills again.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence

from modeldrop.contracts.errors import PlanRefused
from modeldrop.contracts.models import MAX_INSTANCE_TYPES
from modeldrop.contracts.step_payloads import Candidate, EnginePlan
from modeldrop.serving.host import HostIncompatible
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
    allowed: Sequence[str] = (),
) -> list[Candidate]:
    """The preference list. `plan_for(type)` plans one type (raising PlanRefused for an OOM); "auto"
    looks only at catalog types the ALLOWED patterns (the stack's limit) admit."""
    if requested is None:
        order = [first]
    elif list(requested) == [AUTO]:
        rest = [t for t in instance_catalog()["instances"] if t != first and type_allowed(allowed, t)]
        order = [first, *sorted(rest, key=lambda t: (hourly_price(t, region) or float("inf"), t))]
    else:
        order = list(requested)
    auto = requested is not None and list(requested) == [AUTO]
    out: list[Candidate] = []
    for index, instance_type in enumerate(order):
        if auto and len(out) >= MAX_INSTANCE_TYPES:
            break
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
    except HostIncompatible as exc:  # no force helps: the container cannot start on this host
        return Candidate(
            instance_type=instance_type, verdict="incompatible", hourly_price=price, usable=False, reason=exc.message
        )
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


def type_allowed(patterns: Sequence[str], instance_type: str) -> bool:
    """Whether an instance type matches one of PATTERNS (`*` matches any run); no patterns: any type."""
    return not patterns or any(fnmatch.fnmatchcase(instance_type, p) for p in patterns)


def usable(candidates: Sequence[Candidate]) -> list[Candidate]:
    return [c for c in candidates if c.usable]
