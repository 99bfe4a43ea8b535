"""How a channel is shown: `promote`, `rollback` and `status CHANNEL` print it the same way."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.markup import escape

from modeldrop.cli._shared import console, fields

if TYPE_CHECKING:
    from modeldrop.contracts.channel import ChannelRecord, ChannelVersion


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
