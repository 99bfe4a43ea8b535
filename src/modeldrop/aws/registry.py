"""The deployments table (DynamoDB): one item per deployment, written step by step.

`Registry` is the only code that reads or writes it: it takes typed step results in and gives
`DeploymentRecord`s out. Step results and the request are stored as JSON strings (see
modeldrop.contracts.record).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.contracts import clock
from modeldrop.contracts.record import DeploymentRecord, StepName, step_key

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

# One artifact version gives at most one live deployment, whichever entry point starts it: the first
# to register claims the version in an item of its own (never listed as a deployment).
CLAIM_PREFIX = "artifact#"


def _now() -> str:
    return clock.iso(clock.utcnow())


class DeploymentRegistered(RuntimeError):
    """The deployment id is already registered by another execution."""


class Registry:
    def __init__(self, table: Table) -> None:
        self.table = table

    def register(
        self, deployment_id: str, execution_name: str, request: dict[str, Any], fields: dict[str, Any]
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
        if self._put_if(item):
            return True
        existing = self.get(deployment_id)
        if existing and existing.execution_name == execution_name:
            return False
        raise DeploymentRegistered(f"deployment {deployment_id} is registered by another execution")

    def record(
        self,
        deployment_id: str,
        step: StepName,
        result: dict[str, Any] | list[Any],
        *,
        attempt: int = 0,
        status: str | None = None,
        **fields: Any,
    ) -> DeploymentRecord:
        """Store one step's result (and any top-level fields) in one write; returns the updated record.
        Fails (ConditionalCheckFailedException) when there is no record to update."""
        names = {"#s": step_key(step, attempt)}
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
        response = self.table.update_item(
            Key={"deployment_id": deployment_id},
            UpdateExpression="SET " + ", ".join(sets),
            ExpressionAttributeNames=names,
            ExpressionAttributeValues=values,
            ConditionExpression="attribute_exists(deployment_id)",
            ReturnValues="ALL_NEW",
        )
        return DeploymentRecord.from_item(response["Attributes"])

    def get(self, deployment_id: str) -> DeploymentRecord | None:
        item = self._item(deployment_id)
        return DeploymentRecord.from_item(item) if item is not None and not is_claim(item) else None

    def deployments(self) -> list[DeploymentRecord]:
        """Every deployment, newest first (artifact claims left out)."""
        # A boto3 Table (resource) has no paginator; the client's would return undeserialized attributes.
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {}
        while True:
            page = self.table.scan(**kwargs)
            items.extend(page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        records = [DeploymentRecord.from_item(i) for i in items if not is_claim(i)]
        return sorted(records, key=lambda r: r.created_at or "", reverse=True)

    def claim_artifact(self, identity: str, deployment_id: str) -> DeploymentRecord | None:
        """Claim IDENTITY (an artifact version) for DEPLOYMENT_ID; None when it is ours now, else the
        holder's record."""
        key = CLAIM_PREFIX + hashlib.sha256(identity.encode()).hexdigest()
        item = {"deployment_id": key, "claimed_by": deployment_id, "artifact": identity, "claimed_at": _now()}
        for _attempt in range(3):
            if self._put_if(item):
                return None
            claim = self._item(key)
            holder = str(claim["claimed_by"]) if claim else ""
            if holder == deployment_id:
                return None  # a retried step
            holder_record = self.get(holder) if holder else None
            if holder_record is not None and not holder_record.released:
                return holder_record
            # The holder ended without an endpoint: take the claim over, unless someone else just did.
            if self._put_if(item, "attribute_not_exists(deployment_id) OR claimed_by = :holder", {":holder": holder}):
                return None
        claim = self._item(key)
        return self.get(str(claim["claimed_by"])) if claim else None

    def _item(self, key: str) -> dict[str, Any] | None:
        item: dict[str, Any] | None = self.table.get_item(Key={"deployment_id": key}, ConsistentRead=True).get("Item")
        return item

    def _put_if(
        self,
        item: dict[str, Any],
        condition: str = "attribute_not_exists(deployment_id)",
        values: dict[str, Any] | None = None,
    ) -> bool:
        """A conditional put: False when the condition does not hold (any other error raises)."""
        kwargs: dict[str, Any] = {"Item": item, "ConditionExpression": condition}
        if values:
            kwargs["ExpressionAttributeValues"] = values
        try:
            self.table.put_item(**kwargs)
        except ClientError as exc:
            if exc.response["Error"]["Code"] != "ConditionalCheckFailedException":
                raise
            return False
        return True


def is_claim(item: dict[str, Any]) -> bool:
    return str(item.get("deployment_id", "")).startswith(CLAIM_PREFIX)
