"""modeldrop's lifecycle events on EventBridge (shapes documented in docs/events.md)."""

from __future__ import annotations

import json
from typing import Any, Literal

SOURCE = "modeldrop"
DetailType = Literal["Deployment Succeeded", "Deployment Failed", "Deployment Expired", "Deployment Torn Down"]


def publish(events: Any, bus_name: str, detail_type: DetailType, detail: dict[str, Any]) -> None:
    response = events.put_events(
        Entries=[
            {
                "Source": SOURCE,
                "DetailType": detail_type,
                "Detail": json.dumps(detail, sort_keys=True, default=str),
                "EventBusName": bus_name,
            }
        ]
    )
    if response.get("FailedEntryCount"):
        raise RuntimeError(f"EventBridge rejected the {detail_type} event: {response['Entries']}")
