"""The deployments table (DynamoDB): one item per deployment, written step by step.

Step results and the request are stored as JSON strings so floats survive DynamoDB's number type
untouched and one step's shape cannot break another's.
"""

from __future__ import annotations

import json
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
) -> None:
    names = {"#s": step}
    values: dict[str, Any] = {":v": json.dumps(result, sort_keys=True, default=str), ":now": _now()}
    sets = ["steps.#s = :v", "updated_at = :now"]
    if status:
        names["#st"] = "status"
        sets.append("#st = :status")
        values[":status"] = status
    for i, (key, value) in enumerate(fields.items()):
        if value is None:
            continue
        names[f"#f{i}"] = key
        values[f":f{i}"] = value
        sets.append(f"#f{i} = :f{i}")
    table.update_item(
        Key={"deployment_id": deployment_id},
        UpdateExpression="SET " + ", ".join(sets),
        ExpressionAttributeNames=names,
        ExpressionAttributeValues=values,
        ConditionExpression="attribute_exists(deployment_id)",
    )


def set_fields(table: Any, deployment_id: str, **fields: Any) -> None:
    names: dict[str, str] = {}
    values: dict[str, Any] = {":now": _now()}
    sets = ["updated_at = :now"]
    for i, (key, value) in enumerate(fields.items()):
        if value is None:
            continue
        names[f"#f{i}"] = key
        values[f":f{i}"] = value
        sets.append(f"#f{i} = :f{i}")
    kwargs: dict[str, Any] = {
        "Key": {"deployment_id": deployment_id},
        "UpdateExpression": "SET " + ", ".join(sets),
        "ExpressionAttributeValues": values,
        "ConditionExpression": "attribute_exists(deployment_id)",
    }
    if names:
        kwargs["ExpressionAttributeNames"] = names
    table.update_item(**kwargs)


def get(table: Any, deployment_id: str) -> dict[str, Any] | None:
    item: dict[str, Any] | None = table.get_item(Key={"deployment_id": deployment_id}, ConsistentRead=True).get("Item")
    return item


def step_result(item: dict[str, Any], step: str) -> dict[str, Any] | None:
    raw = item.get("steps", {}).get(step)
    return json.loads(raw) if raw else None


def scan_all(table: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {}
    while True:
        page = table.scan(**kwargs)
        items.extend(page.get("Items", []))
        if "LastEvaluatedKey" not in page:
            return items
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
