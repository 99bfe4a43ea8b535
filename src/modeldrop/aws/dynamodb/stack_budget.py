"""The stack-wide ceiling: the hourly price and instance count of everything live, held in one
registry item and changed only by conditional writes, so that N bucket writers each within the
per-deployment limits cannot add up past it, however many arrive at once.

A deployment reserves its worst-case hourly cost (the dearest type it may be tried on, times its
instance count) at registration, before anything is copied or created; the reservation goes when
its record ends. Both writes are idempotent (a map entry per deployment), and the reaper releases
reservations whose record ended or vanished, so a Lambda killed between the two cannot leak budget.
"""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.contracts.errors import LimitExceeded

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

BUDGET_KEY = "stack#budget"


def _money(value: float) -> Decimal:
    return Decimal(str(round(value, 4)))


def reserve(
    table: Table, deployment_id: str, hourly: float, instances: int, max_hourly: float, max_instances: int
) -> None:
    """Reserve HOURLY USD/h and INSTANCES for DEPLOYMENT_ID in one conditional write (a retried step
    finds its own reservation), or LimitExceeded naming what is live."""
    cost = _money(hourly)
    _ensure(table)
    try:
        table.update_item(
            Key={"deployment_id": BUDGET_KEY},
            UpdateExpression="SET reservations.#d = :r, hourly = hourly + :cost, instances = instances + :n",
            ConditionExpression=("attribute_not_exists(reservations.#d) AND hourly <= :room AND instances <= :seats"),
            ExpressionAttributeNames={"#d": deployment_id},
            ExpressionAttributeValues={
                ":r": {"hourly": cost, "instances": instances},
                ":cost": cost,
                ":n": instances,
                ":room": _money(max_hourly) - cost,
                ":seats": max_instances - instances,
            },
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise
        if deployment_id in reservations(table):
            return
        live = current(table)
        raise LimitExceeded(
            f"the stack's live deployments already cost ${live[0]:.2f}/h on {live[1]} instance(s); this one "
            f"(${hourly:.2f}/h, {instances} instance(s)) would pass MaxStackHourlyPrice ${max_hourly:.2f}/h or "
            f"MaxStackInstances {max_instances}: nothing was created",
            "tear down a deployment you no longer need (modeldrop list; modeldrop teardown ID), or have the stack's "
            "owner raise MaxStackHourlyPrice / MaxStackInstances",
        ) from None


def _ensure(table: Table) -> None:
    """The budget item, created once (a racing creation is as good)."""
    try:
        table.put_item(
            Item={"deployment_id": BUDGET_KEY, "reservations": {}, "hourly": 0, "instances": 0},
            ConditionExpression="attribute_not_exists(deployment_id)",
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
            raise


def release(table: Table, deployment_id: str) -> bool:
    """Give DEPLOYMENT_ID's reservation back; False when it holds none (released already, or never)."""
    held = reservations(table).get(deployment_id)
    if held is None:
        return False
    try:
        table.update_item(
            Key={"deployment_id": BUDGET_KEY},
            UpdateExpression="REMOVE reservations.#d SET hourly = hourly - :cost, instances = instances - :n",
            ConditionExpression="attribute_exists(reservations.#d)",
            ExpressionAttributeNames={"#d": deployment_id},
            ExpressionAttributeValues={":cost": held["hourly"], ":n": held["instances"]},
        )
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
            return False  # a racing release got there first
        raise
    return True


def reservations(table: Table) -> dict[str, dict[str, Any]]:
    item = table.get_item(Key={"deployment_id": BUDGET_KEY}, ConsistentRead=True).get("Item") or {}
    found: dict[str, dict[str, Any]] = dict(item.get("reservations") or {})  # type: ignore[arg-type]
    return found


def current(table: Table) -> tuple[float, int]:
    item = table.get_item(Key={"deployment_id": BUDGET_KEY}, ConsistentRead=True).get("Item") or {}
    return float(item.get("hourly") or 0), int(item.get("instances") or 0)  # type: ignore[arg-type]
