"""The deployments table (DynamoDB): one item per deployment, written step by step.

Step results and the request are stored as JSON strings so floats survive DynamoDB's number type
untouched and one step's shape cannot break another's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from botocore.exceptions import ClientError

from modeldrop.contracts import clock

TERMINAL = {"succeeded", "failed", "expired", "torn_down", "aborted", "timed_out"}


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
    if _put_if(table, item):
        return True
    existing = get(table, deployment_id)
    if existing and existing.get("execution_name") == execution_name:
        return False
    raise RuntimeError(f"deployment {deployment_id} is registered by another execution")


def _put_if(
    table: Any,
    item: dict[str, Any],
    condition: str = "attribute_not_exists(deployment_id)",
    values: dict[str, Any] | None = None,
) -> bool:
    """A conditional put: False when the condition does not hold (any other error raises)."""
    kwargs: dict[str, Any] = {"Item": item, "ConditionExpression": condition}
    if values:
        kwargs["ExpressionAttributeValues"] = values
    try:
        table.put_item(**kwargs)
    except ClientError as exc:
        if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
            raise
        return False
    return True


def record_step(
    table: Any,
    deployment_id: str,
    step: str,
    result: dict[str, Any] | list[Any],
    status: str | None = None,
    **fields: Any,
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
    """Dollars billed from endpoint creation to its end (or now), at the recorded hourly price of
    each of its instances."""
    price = item.get("hourly_price")
    start = item.get("started_at")
    if not price or not start:
        return None
    end = clock.parse_iso(str(item["ended_at"])) if item.get("ended_at") else clock.utcnow()
    hours = max(0.0, (end - clock.parse_iso(str(start))).total_seconds() / 3600)
    return round(hours * float(price) * int(item.get("instance_count") or 1), 4)


# One artifact version gives at most one live deployment, whichever entry point starts it: the first
# to register claims the version in an item of its own (never listed as a deployment).
CLAIM_PREFIX = "artifact#"
# A holder in one of these states has no endpoint (or never will): its claim may be taken over.
RELEASED = {"failed", "expired", "torn_down", "aborted", "timed_out"}


def is_claim(item: Mapping[str, Any]) -> bool:
    return str(item.get("deployment_id", "")).startswith(CLAIM_PREFIX)


def claim_artifact(table: Any, identity: str, deployment_id: str) -> dict[str, Any] | None:
    """Claim IDENTITY (an artifact version) for DEPLOYMENT_ID; None when it is ours now, else the holder's record."""
    import hashlib

    key = CLAIM_PREFIX + hashlib.sha256(identity.encode()).hexdigest()
    item = {"deployment_id": key, "claimed_by": deployment_id, "artifact": identity, "claimed_at": _now()}
    for _attempt in range(3):
        if _put_if(table, item):
            return None
        claim = get(table, key)
        holder = str(claim["claimed_by"]) if claim else ""
        if holder == deployment_id:
            return None  # a retried step
        holder_record = get(table, holder) if holder else None
        if holder_record is not None and holder_record.get("status") not in RELEASED:
            return holder_record
        # The holder ended without an endpoint: take the claim over, unless someone else just did.
        if _put_if(table, item, "attribute_not_exists(deployment_id) OR claimed_by = :holder", {":holder": holder}):
            return None
    claim = get(table, key)
    return get(table, str(claim["claimed_by"])) if claim else None
