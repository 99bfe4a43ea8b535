"""How a channel is shown (`promote`, `rollback` and `status CHANNEL` print it the same way), and the rows
`status DEPLOYMENT` prints: its steps, failure, adapters and attempts."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from modeldrop.cli._shared import console, fields

if TYPE_CHECKING:
    from modeldrop.contracts.channel import ChannelRecord, ChannelVersion
    from modeldrop.contracts.record import DeploymentRecord


def _version(version: ChannelVersion) -> str:
    """A version as clients meet it: its deployment, and its adapter's component on a shared base."""
    return version.deployment_id + (f" (adapter {version.adapter}, component {version.component})"
                                    if version.component else "")  # fmt: skip


def _show(record: ChannelRecord, as_json: bool) -> None:
    if as_json:  # with what clients call, as `clients call` shows it
        print(json.dumps({**record.model_dump(mode="json"), "invoke_target": record.invoke_target()}))
        return
    show_channel(record)


def _idle(record: ChannelRecord) -> str:
    idle = record.idle
    if idle is None:
        return "always-on (no idle policy)"
    if idle.mode == "always_on":
        return f"always-on: {idle.reason}"
    return (f"scales to zero after {idle.after_seconds // 60} min without a call; a call while asleep is refused "
            f"as waking for up to {idle.wake_seconds} s")  # fmt: skip


def _pending(record: ChannelRecord) -> str:
    pending = record.candidate
    return f"{_version(pending.version)}, {pending.phase} since {pending.started_at}" if pending else "-"


def show_channel(record: ChannelRecord) -> None:
    """`status CHANNEL`: the serving version, the kept ones, the history with each gate's verdict."""
    rows = [
        ("channel", record.name),
        ("endpoint", record.endpoint_name),
        ("serving", _version(record.live) if record.live else "-"),
        ("clients call", " ".join(f"{k}={v}" for k, v in record.invoke_target().items())),
        ("kept for rollback", ", ".join(f"{_version(v)} (until {v.remove_after})" for v in record.kept) or "-"),
        ("alarms", ", ".join(record.alarms) or "-"),
        ("when idle", _idle(record)),
        ("promotion under way", _pending(record)),
    ]
    fields([(k, str(v)) for k, v in rows])
    for event in record.history:
        gate = (event.gate or {}).get("summary")
        took = f" in {event.seconds:.0f} s" if event.seconds is not None else ""
        line = f"  {event.at} {event.kind} {event.deployment_id or ''}{took}"
        console.print(
            escape(line + (f": {event.reason}" if event.reason else "") + (f" [gate: {gate}]" if gate else ""))
        )


def _status_rows(record: DeploymentRecord, data: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [
        (key, str(data[key] if data.get(key) is not None else "-"))
        for key in ("deployment_id", "status", "endpoint_name", "engine", "instance_type", "instance_count", "region")
    ]
    if hold := data.get("channel"):
        since = f" since {hold['since']}" if hold.get("since") else ""
        rows.append(("channel", f"{hold['role']} in {hold['channel']}{since}: `modeldrop status {hold['channel']}`"))
        if data.get("preview_endpoint_name"):
            rows.append(
                ("own endpoint", f"{data['preview_endpoint_name']} (deleted when it began serving the channel)")
            )
    price = record.hourly_price
    rows.append(("hourly price", f"${price}/h (catalog of {record.price_read_on})" if price else "-"))
    rows.append(("started / ended", f"{record.started_at or '-'} / {record.ended_at or '-'}"))
    rows.append(("expires at", str(data.get("expires_at") or "-")))
    cost_usd = data["cost_usd"]
    cost = "-" if cost_usd is None else f"${cost_usd:.2f}" + (" (final)" if data["cost_is_final"] else " so far")
    rows.append(("cost", cost))
    rows += _failure_rows(record, data["failure"] or {})
    rows += _adapter_rows(data.get("adapter_components") or [])
    for other in data.get("attached_deployments") or []:
        rows.append((f"attached {other['deployment_id']}", ", ".join(other["adapters"]) or "-"))
    if evaluation := record.step_dict("smoke_eval"):
        rows.append(("eval", str(evaluation.get("summary"))))
        rows.append(("eval report", str(evaluation.get("report_markdown_uri"))))
    return rows + [(label.replace("_", " "), url) for label, url in data["links"].items()]


def _failure_rows(record: DeploymentRecord, failure: dict[str, Any]) -> list[tuple[str, str]]:
    if not failure:
        return []
    rows = [
        ("error", f"{failure.get('error')} (class {failure.get('failure_class')})"),
        ("FailureReason", str(record.failure_reason or "-")),
    ]
    if failure.get("diagnosis"):
        rows.append(("diagnosis", f"{failure['diagnosis']}; fix: {failure.get('hint')}"))
    return rows


def _adapter_rows(shares: list[dict[str, Any]]) -> list[tuple[str, str]]:
    rows = []
    for share in shares:
        cost_share = share["cost_share_usd"]
        state = f"{'serving' if share['serving'] else 'torn down'} as {share['component']}"
        rows.append(
            (
                f"adapter {share['adapter']}",
                state + (f"; its share ${cost_share:.2f}" if cost_share is not None else ""),
            )
        )
    return rows


def _attempts_table(attempts: list[dict[str, Any]]) -> Table:
    tries = Table(title="instance types tried before this one (capacity fallback)")
    for col in ("#", "instance type", "error", "minutes", "cost at most", "ended at"):
        tries.add_column(col, overflow="fold")
    for a in attempts:
        cost_at_most = a.get("cost_usd_at_most")
        tries.add_row(
            str(a.get("attempt")),
            str(a.get("instance_type")),
            str(a.get("error")),
            f"{a.get('minutes', 0):.1f}",
            "-" if cost_at_most is None else f"${cost_at_most:.2f}",
            str(a.get("ended_at", "-")),
        )
    return tries
