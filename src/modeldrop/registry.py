"""The deployments table (DynamoDB): one item per deployment, written step by step.

Step results and the request are stored as JSON strings so floats survive DynamoDB's number type
untouched and one step's shape cannot break another's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from modeldrop import clock

TERMINAL = {"succeeded", "failed", "expired", "torn_down"}


def _now() -> str:
    return clock.iso(clock.utcnow())


def register(
    table: Any, deployment_id: str, execution_name: str, request: dict[str, Any], fields: dict[str, Any]
) -> bool:
    """Create the record; False when this execution already created it (a retried task)."""
    now = _now()
    item = {
        "deployment_id": deployment_id,
        "execution_name": execution_name,
        "status": "registered",
        "request": json.dumps(request, sort_keys=True),
        "steps": {},
        "created_at": now,
        "updated_at": now,
        **{k: v for k, v in fields.items() if v is not None},
    }
    try:
        table.put_item(Item=item, ConditionExpression="attribute_not_exists(deployment_id)")
        return True
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        existing = get(table, deployment_id)
        if existing and existing.get("execution_name") == execution_name:
            return False
        raise


def record_step(
    table: Any, deployment_id: str, step: str, result: dict[str, Any], status: str | None = None, **fields: Any
) -> dict[str, Any]:
    """Store one step's result (and any top-level fields) in one write; returns the updated record."""
    names = {"#s": step}
    values: dict[str, Any] = {":v": json.dumps(result, sort_keys=True, default=str), ":now": _now()}
    sets = ["steps.#s = :v", "updated_at = :now"]
    if status:
        fields["status"] = status
    for i, (key, value) in enumerate(fields.items()):
        if value is None:
            continue
        names[f"#f{i}"] = key
        values[f":f{i}"] = value
        sets.append(f"#f{i} = :f{i}")
    response = table.update_item(
        Key={"deployment_id": deployment_id},
        UpdateExpression="SET " + ", ".join(sets),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
        ConditionExpression="attribute_exists(deployment_id)",
        ReturnValues="ALL_NEW",
    )
    item: dict[str, Any] = response["Attributes"]
    return item


def get(table: Any, deployment_id: str) -> dict[str, Any] | None:
    item: dict[str, Any] | None = table.get_item(Key={"deployment_id": deployment_id}, ConsistentRead=True).get("Item")
    return item


def decoded(item: Mapping[str, Any]) -> dict[str, Any]:
    """A record with its JSON-string fields (the request, each step) turned back into values."""
    out = {k: v for k, v in item.items() if k not in ("request", "steps")}
    out["request"] = json.loads(item["request"]) if item.get("request") else None
    out["steps"] = {k: json.loads(v) for k, v in (item.get("steps") or {}).items()}
    return out


def cost_so_far(item: Mapping[str, Any]) -> float | None:
    """Dollars billed from endpoint creation to its end (or now), at the recorded hourly price."""
    price = item.get("hourly_price")
    start = item.get("started_at")
    if not price or not start:
        return None
    end = clock.parse_iso(str(item["ended_at"])) if item.get("ended_at") else clock.utcnow()
    hours = max(0.0, (end - clock.parse_iso(str(start))).total_seconds() / 3600)
    return round(hours * float(price), 4)
