"""modeldrop's lifecycle events on EventBridge (shapes documented in docs/operating.md, "Events")."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal

from modeldrop.contracts.record import DeploymentRecord

if TYPE_CHECKING:
    from mypy_boto3_events import EventBridgeClient

SOURCE = "modeldrop"
DetailType = Literal[
    "Deployment Succeeded",
    "Deployment Failed",
    "Deployment Expired",
    "Deployment Torn Down",
    "Deployment Attempt Failed",
    "Deployment Rejected",
]


def publish(events: EventBridgeClient, bus_name: str, detail_type: DetailType, detail: dict[str, Any]) -> None:
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


# Record fields every lifecycle event carries (docs/operating.md, "Events").
EVENT_FIELDS = (
    "endpoint_name",
    "engine",
    "instance_type",
    "artifact_uri",
    "error",
    "failure_class",
    "failure_reason",
    "hourly_price",
    "expires_at",
)


def lifecycle_detail(record: DeploymentRecord, status: str) -> dict[str, Any]:
    """An event's detail from the deployment record; cost is so far while live, final once ended."""
    cost_key = "cost_so_far_usd" if status == "succeeded" else "final_cost_usd"
    fields = record.to_json()
    return {
        "deployment_id": record.deployment_id,
        "status": status,
        **{k: fields.get(k) for k in EVENT_FIELDS},
        cost_key: record.cost_so_far(),
    }
