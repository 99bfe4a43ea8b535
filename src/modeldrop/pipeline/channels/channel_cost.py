"""What a channel costs: its instances over time -- from its scaling history (Application Auto Scaling's
activities on its component) where it scales to zero, else the instances it was created with -- priced
at the catalog's hourly rate, today and this month, against the same channel always-on."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.autoscaling import idle_scaling
from modeldrop.contracts import clock
from modeldrop.contracts.channel import ChannelRecord
from modeldrop.serving.idle_plan import hours_within, instance_intervals
from modeldrop.serving.memory_plan import hourly_price

if TYPE_CHECKING:
    from mypy_boto3_application_autoscaling import ApplicationAutoScalingClient
    from mypy_boto3_sagemaker import SageMakerClient


def _created(channel: ChannelRecord) -> datetime | None:
    at = channel.idle.since if channel.idle and channel.idle.since else None
    if at is None:
        at = next((e.at for e in channel.history if e.kind == "created"), None)
    return clock.parse_iso(at) if at else None


def _shape(sm: SageMakerClient, channel: ChannelRecord) -> tuple[str | None, int]:
    """(instance type, instances) of an always-on channel: its live version's config."""
    if channel.idle is not None and channel.idle.instance_type:
        return channel.idle.instance_type, channel.idle.max_instances
    config = channel.live.endpoint_config if channel.live else ""
    if not config:
        return None, 1
    try:
        variant = sm.describe_endpoint_config(EndpointConfigName=config)["ProductionVariants"][0]
    except (ClientError, IndexError, KeyError):
        return None, 1
    return str(variant.get("InstanceType") or "") or None, int(variant.get("InitialInstanceCount") or 1)


def channel_cost(
    sm: SageMakerClient,
    autoscaling: ApplicationAutoScalingClient | None,
    channel: ChannelRecord,
    region: str,
    now: datetime | None = None,
) -> dict[str, Any]:
    """Today's and this month's instance-hours and dollars, the hours idle saved, and the wake-ups."""
    now = now or clock.utcnow()
    since = _created(channel)
    instance_type, instances = _shape(sm, channel)
    price = (channel.idle.hourly_price if channel.idle else None) or (
        hourly_price(instance_type, region) if instance_type else None
    )
    changes: list[tuple[datetime, int]] = []
    if channel.scales_to_zero and autoscaling is not None and channel.idle and channel.idle.component:
        try:
            changes = idle_scaling.scaling_changes(autoscaling, channel.idle.component)
        except ClientError:
            changes = []
    out: dict[str, Any] = {"instance_type": instance_type, "hourly_price": price, "max_instances": instances,
                           "scales_to_zero": channel.scales_to_zero,
                           "always_on_reason": channel.idle.reason if channel.idle else ""}  # fmt: skip
    if since is None:
        return out
    # A channel that scales to zero starts with one copy (one instance); always-on, with what it was created with.
    intervals = instance_intervals(since, now, changes, initial=1 if channel.scales_to_zero else instances)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    month = day.replace(day=1)
    for label, start in (("today", day), ("month", month), ("since_created", since)):
        used, wall = hours_within(intervals, max(start, since), now)
        used += _update_hours(channel, max(start, since), now)
        always = wall * instances
        out[label] = {
            "instance_hours": round(used, 3),
            "usd": round(used * price, 2) if price is not None else None,
            "always_on_usd": round(always * price, 2) if price is not None else None,
            "idle_hours_saved": round(always - used, 3),
        }
    out["wakeups"] = _wakeups(changes, instances)
    if channel.scales_to_zero:  # how an update fits: said with the hours it cost
        out["update_instance_hours"] = round(_update_hours(channel, since, now), 3)
        out["updates"] = (
            "one extra instance while an update places the new copy beside the old (MaxInstanceCount = copies + 1)"
        )
    out["current_instances"] = intervals[-1].instances if intervals else instances
    return out


def _wakeups(changes: list[tuple[datetime, int]], instances: int) -> list[str]:
    previous, wakes = instances, []
    for when, count in changes:
        if previous == 0 and count > 0:
            wakes.append(clock.iso(when))
        previous = count
    return wakes


def _update_hours(channel: ChannelRecord, start: datetime, end: datetime) -> float:
    """The extra instance each update of a scaled channel held (its promotions and rollbacks place the new
    copy beside the old one, and the channel is woken for them): from the channel's claim to the version
    serving (an event from before that was recorded: from its request, which counts more, never less)."""
    if not channel.scales_to_zero:
        return 0.0
    hours = 0.0
    for event in channel.history:
        took = event.change_seconds if event.change_seconds is not None else event.seconds
        if event.kind not in ("promoted", "rolled_back") or not took:
            continue
        done = clock.parse_iso(event.at)
        began = done.timestamp() - float(took)
        overlap = min(done.timestamp(), end.timestamp()) - max(began, start.timestamp())
        hours += max(0.0, overlap) / 3600
    return hours
