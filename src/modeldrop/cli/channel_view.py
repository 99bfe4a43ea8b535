"""How a channel is shown: `promote`, `rollback` and `status CHANNEL` print it the same way."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.markup import escape

from modeldrop.cli._shared import console, fields

if TYPE_CHECKING:
    from modeldrop.contracts.channel import ChannelRecord


def _show(record: ChannelRecord, as_json: bool) -> None:
    if as_json:
        print(record.model_dump_json())
        return
    show_channel(record)


def show_channel(record: ChannelRecord) -> None:
    """`status CHANNEL`: the serving version, the kept ones, the history with each gate's verdict."""
    rows = [
        ("channel", record.name),
        ("endpoint", record.endpoint_name),
        ("serving", record.live.deployment_id if record.live else "-"),
        ("kept for rollback", ", ".join(f"{v.deployment_id} (until {v.remove_after})" for v in record.kept) or "-"),
        ("alarms", ", ".join(record.alarms) or "-"),
    ]
    fields([(k, str(v)) for k, v in rows])
    for event in record.history:
        gate = (event.gate or {}).get("summary")
        took = f" in {event.seconds:.0f} s" if event.seconds is not None else ""
        line = f"  {event.at} {event.kind} {event.deployment_id or ''}{took}"
        console.print(
            escape(line + (f": {event.reason}" if event.reason else "") + (f" [gate: {gate}]" if gate else ""))
        )
