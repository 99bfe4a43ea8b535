"""How `list` and `status` show a deployment: its row (age, expiry, cost so far), and whether a
channel holds it -- then it serves through the channel's endpoint, with no expiry or cost of its own."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.contracts import clock
from modeldrop.contracts.record import DeploymentRecord

LIVE = {"succeeded"}


class ChannelHold(BaseModel):
    """A deployment a channel holds: it serves (or is kept, or runs the base) through the channel's
    endpoint, and has no endpoint, expiry or cost of its own from SINCE on."""

    channel: str
    endpoint_name: str
    role: str  # "serving", "kept" (for a rollback) or "base" (of an adapter channel)
    since: str | None = None  # when it began serving the channel

    @property
    def words(self) -> str:
        return {"serving": "serves", "kept": "is kept for a rollback by", "base": "runs the base of adapter"}[self.role]


def channel_holds(registry: Registry) -> dict[str, ChannelHold]:
    """Each deployment a channel holds, by id (one read of the channels)."""
    from modeldrop.aws.dynamodb.channel_store import ChannelStore

    holds: dict[str, ChannelHold] = {}
    for channel in ChannelStore(registry.table).all():
        versions = [("serving", channel.live)] if channel.live else []
        versions += [("kept", v) for v in channel.kept]
        for role, version in versions:
            if not version.component:  # an adapter version's deployment keeps its own record's terms
                holds.setdefault(
                    version.deployment_id,
                    ChannelHold(
                        channel=channel.name, endpoint_name=channel.endpoint_name, role=role, since=version.served_at
                    ),
                )
        if channel.base_deployment:
            holds.setdefault(
                channel.base_deployment,
                ChannelHold(channel=channel.name, endpoint_name=channel.endpoint_name, role="base"),
            )
    return holds


def _hours_between(start: datetime, end: datetime) -> float:
    return (end - start).total_seconds() / 3600


class DeploymentRow(BaseModel):
    deployment_id: str
    status: str
    endpoint_name: str | None
    engine: str | None
    instance_type: str | None
    age_hours: float | None
    expires_in_hours: float | None
    cost_usd: float | None
    cost_is_final: bool
    adapter: str | None = None  # a LoRA adapter deployment: the adapter's name (served on its base)
    base: str | None = None
    channel: str | None = None  # the channel that serves or keeps it
    # A rejected upload (a marker the starter could not read): what was uploaded and why nothing started.
    artifact_uri: str | None = None
    reason: str | None = None


def row_for(record: DeploymentRecord, now: datetime | None = None, hold: ChannelHold | None = None) -> DeploymentRow:
    """One deployment's row; HOLD: a channel serves (or keeps) it, so it shows the channel's endpoint,
    no expiry, and its own cost only up to the promotion (the channel's view counts the rest)."""
    now = now or clock.utcnow()
    created, expires = record.created_at, record.expires_at
    live = record.status in LIVE and hold is None
    return DeploymentRow(
        deployment_id=record.deployment_id,
        status=f"{hold.role} ({hold.channel})" if hold else record.status,
        endpoint_name=hold.endpoint_name if hold else record.endpoint_name,
        engine=record.engine,
        instance_type=record.instance_type,
        age_hours=round(_hours_between(clock.parse_iso(created), now), 2) if created else None,
        expires_in_hours=round(_hours_between(now, clock.parse_iso(expires)), 2) if expires and live else None,
        cost_usd=_preview_cost(record, hold),
        cost_is_final=bool(record.ended_at) or hold is not None,
        adapter=_adapter_label(record),
        base=str(record.artifact_uri) if (record.request or {}).get("adapter_name") else None,
        channel=hold.channel if hold else None,
        artifact_uri=str(getattr(record, "uploaded_uri", "")) if record.status == "rejected" else None,
        reason=record.failure_reason if record.status == "rejected" else None,
    )


def _preview_cost(record: DeploymentRecord, hold: ChannelHold | None) -> float | None:
    """Its own endpoint's cost: held by a channel, up to when it began serving there (from then the
    channel's endpoint bills, and `channels` counts it), so nothing is counted twice."""
    promoted = record.step_dict("promoted").get("at") or (hold.since if hold else None)
    if hold is None or hold.role == "base" or not promoted:
        return record.cost_so_far()
    ended = min(record.ended_at or promoted, str(promoted))
    return record.model_copy(update={"ended_at": ended}).cost_so_far()


def _adapter_label(record: DeploymentRecord) -> str | None:
    """The adapter's name; shared, the adapters still served as components (and how many there were)."""
    from modeldrop.pipeline.adapters.component_steps import adapter_shares

    shares = adapter_shares(record)
    if not shares:
        return (record.request or {}).get("adapter_name")
    serving = [str(s["adapter"]) for s in shares if s["serving"]]
    return f"{', '.join(serving) or 'none'} ({len(serving)} of {len(shares)} adapter components)"


def ended_long_ago(record: DeploymentRecord, now: datetime | None = None) -> bool:
    """Ended over a day ago: `list` leaves it out unless asked (--all)."""
    ended = record.ended_at
    return bool(ended) and ((now or clock.utcnow()) - clock.parse_iso(str(ended))).total_seconds() > 86400
