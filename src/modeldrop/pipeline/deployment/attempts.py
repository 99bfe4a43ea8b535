"""Capacity fallback and quota waits: what counts as a capacity failure, how long a waiter waits,
and which instance type comes next.

A failed attempt is recorded (type, reason, minutes, the most it could have cost) and announced;
its resources are released by the teardown loop before the next type is planned and created under
the same endpoint name (its config and model named per attempt).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.events_bus import publish
from modeldrop.contracts import clock
from modeldrop.contracts.errors import CapacityUnavailable, QuotaExceeded, cause_message
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.step_payloads import AttemptStep, CreateOutcome, EndpointRef, EnginePlan
from modeldrop.serving.instance_choice import usable
from modeldrop.serving.memory_plan import hourly_price

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient


def attempt_name(resource_name: str, attempt: int) -> str:
    """The endpoint keeps its name across attempts; each attempt's config and model get their own
    (a config is immutable, and the env is re-planned per type)."""
    if attempt == 0:
        return resource_name
    suffix = f"-a{attempt + 1}"
    return resource_name[: 63 - len(suffix)] + suffix


# Re-checks of a type at quota: exponential from 30 s to 5 min, full jitter, so that waiters spread out.
QUOTA_WAIT_BASE_SECONDS = 30
QUOTA_WAIT_CAP_SECONDS = 300
MAX_QUOTA_CHECKS = 60


def quota_busy(
    registry: Registry,
    req: NormalizedRequest,
    plan: EnginePlan,
    exc: QuotaExceeded,
    quota_waits: int,
    quota_wait_until: str | None,
    now: Any,
    rng: random.Random | None = None,
) -> CreateOutcome:
    until = quota_wait_until or clock.iso(now + timedelta(seconds=req.quota_wait_seconds))
    left = (clock.parse_iso(until) - now).total_seconds()
    ceiling = min(QUOTA_WAIT_CAP_SECONDS, QUOTA_WAIT_BASE_SECONDS * 2 ** min(quota_waits, 8))
    wait = max(5, round((rng or random).uniform(ceiling / 2, ceiling)))
    # At most MAX_QUOTA_CHECKS re-checks per instance type, however long the wait: a long wait's
    # checks are spaced out instead of multiplied (the execution's history has a limit).
    wait = max(wait, math.ceil(left / max(1, MAX_QUOTA_CHECKS - quota_waits)))
    wait = int(min(wait, left)) if left >= 5 and quota_waits < MAX_QUOTA_CHECKS else 0
    registry.record(
        req.deployment_id,
        "quota_wait",
        {
            "instance_type": plan.instance_type,
            "waits": quota_waits,
            "until": until,
            "next_check_seconds": wait,
            "reason": exc.message,
        },
        status="waiting-for-quota" if wait else None,
        owner=req.execution_arn,
        live=True,
    )
    return CreateOutcome(
        status="quota-busy",
        wait_seconds=wait,
        quota_waits=quota_waits + 1 if wait else quota_waits,
        quota_wait_until=until,
        reason=f"{exc.message} -- fix: {exc.hint}",
    )


# What SageMaker's FailureReason says when no instance of the type could be had.
CAPACITY_SIGNALS = (
    "insufficientinstancecapacity",
    "insufficient capacity",
    "unable to provision requested ml compute capacity",
)


def is_capacity_failure(reason: str, never_ran: Callable[[], bool]) -> bool:
    """InsufficientInstanceCapacity, or SageMaker's unhelpful 'Request to service failed' for an
    endpoint whose container never ran (no log group): nothing was provisioned, another type may be."""
    lowered = reason.lower()
    if any(signal in lowered for signal in CAPACITY_SIGNALS):
        return True
    return "request to service failed" in lowered and never_ran()


def capacity_wait_stuck(desc: Mapping[str, Any], capacity_wait_seconds: int) -> float | None:
    """Seconds Creating without a single modification, when that is past the capacity wait; else None."""
    created, modified = desc.get("CreationTime"), desc.get("LastModifiedTime")
    if not isinstance(created, datetime) or created != modified:
        return None
    elapsed = (clock.utcnow() - (created if created.tzinfo else created.replace(tzinfo=UTC))).total_seconds()
    return elapsed if elapsed >= capacity_wait_seconds else None


def next_attempt(
    registry: Registry,
    events: EventBridgeClient,
    bus: str,
    req: NormalizedRequest,
    plan: EnginePlan,
    failure: Mapping[str, Any],
    endpoint: EndpointRef | None,
    region: str,
) -> AttemptStep:
    """Record the failed attempt (type, reason, minutes, cost) and name the next usable type; when the
    list is used up, fail with every type tried."""
    now = clock.utcnow()
    error = str(failure.get("Error") or "InsufficientCapacity")
    reason = cause_message(str(failure.get("Cause") or "")) or error
    started = clock.parse_iso(endpoint.created_at) if endpoint and endpoint.created_at else now
    minutes = round((now - started).total_seconds() / 60, 1)
    price = hourly_price(plan.instance_type, region)
    failed = {
        "attempt": plan.attempt + 1,
        "instance_type": plan.instance_type,
        "error": error,
        "reason": reason[:1000],
        "minutes": minutes,
        "hourly_price": price,
        "instance_count": req.instance_count,
        # An endpoint that never got an instance bills nothing; this is the most it could have cost.
        "cost_usd_at_most": round(minutes / 60 * price * req.instance_count, 4) if price is not None else None,
        "ended_at": clock.iso(now),
    }
    record = registry.get(req.deployment_id)
    attempts = list((record.step("attempts") if record else None) or [])
    attempts.append(failed)
    tried = usable(plan.candidates)
    following = plan.attempt + 1
    has_next = following < len(tried)
    registry.record(req.deployment_id, "attempts", attempts, owner=req.execution_arn, live=True)
    detail = {
        "deploymentId": req.deployment_id,
        "attempt": failed,
        "nextInstanceType": tried[following].instance_type if has_next else None,
    }
    publish(events, bus, "Deployment Attempt Failed", detail)
    if not has_next:
        if all(a["error"] == "QuotaExceeded" for a in attempts):
            reasons = "; ".join(f"{a['instance_type']}: {a['reason']}" for a in attempts)
            raise QuotaExceeded(f"every instance type tried is at its endpoint quota: {reasons}", "")
        listing = "; ".join(f"{a['instance_type']}: {a['error']} after {a['minutes']} min" for a in attempts)
        raise CapacityUnavailable(f"no capacity on any instance type tried: {listing}")
    return AttemptStep(attempt=following, instance_type=tried[following].instance_type, failed=failed)
