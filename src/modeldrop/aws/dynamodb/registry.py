"""The deployments table (DynamoDB): one item per deployment, written step by step.

`Registry` is the only code that reads or writes it: it takes typed step results in and gives
`DeploymentRecord`s out. Step results and the request are stored as JSON strings (see
modeldrop.contracts.record).

Every write is conditional. A pipeline step writes only a record its own execution owns
(`owner`, the execution ARN), only while the deployment is in flight (`live`), and only along the
record's allowed transitions (contracts.record.TRANSITIONS): a Lambda still running after its
execution was stopped cannot bring an aborted record back, and a step can never write another
deployment's record. Cleanup (teardown, the reaper, the execution-ended rule) writes without `live`.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from modeldrop.aws.dynamodb import stack_budget
from modeldrop.contracts import clock
from modeldrop.contracts.channel import CHANNEL_PREFIX
from modeldrop.contracts.errors import DeploymentEnded, RecordNotOwned, RegistryBusy, StepContractViolated
from modeldrop.contracts.record import ENDED, TRANSITIONS, DeploymentRecord, StepName, step_key

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table

# One artifact version gives at most one live deployment, whichever entry point starts it: the first
# to register claims the version in an item of its own (never listed as a deployment).
CLAIM_PREFIX = "artifact#"

# What DynamoDB answers when it is busy or briefly unwell: the step is retried, not failed.
TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "ServiceUnavailable",
        "TransactionConflictException",
    }
)


def _now() -> str:
    return clock.iso(clock.utcnow())


def _transient(exc: ClientError) -> None:
    code = str(exc.response.get("Error", {}).get("Code", ""))
    if code in TRANSIENT_CODES:
        raise RegistryBusy(f"the deployments table is busy ({code})") from None


class Registry:
    def __init__(self, table: Table) -> None:
        self.table = table

    def register(
        self,
        deployment_id: str,
        execution_name: str,
        request: dict[str, Any],
        fields: dict[str, Any],
        execution_arn: str | None = None,
    ) -> bool:
        """Create the record; False when this execution already created it (a retried task).

        The id's record held by another execution is RecordNotOwned; one this execution's own end
        already closed (the execution-ended rule left a tombstone) is DeploymentEnded."""
        now = _now()
        item = {
            "deployment_id": deployment_id,
            "execution_name": execution_name,
            "status": "registered",
            "request": json.dumps(request, sort_keys=True),
            "steps": {},
            "created_at": now,
            "updated_at": now,
            **({"execution_arn": execution_arn} if execution_arn else {}),
            **{k: v for k, v in fields.items() if v is not None},
        }
        if self._put_if(item):
            return True
        existing = self.get(deployment_id)
        if existing is None or not _same_owner(existing, execution_name, execution_arn):
            raise RecordNotOwned(
                f"deployment {deployment_id} is registered by another execution: nothing of it was touched"
            )
        if existing.status in ENDED:
            raise DeploymentEnded(f"deployment {deployment_id} already ended ({existing.status})")
        return False

    def record_rejection(self, deployment_id: str, execution_name: str, artifact_uri: str, reason: str) -> bool:
        """An upload the starter refused, as a closed record `list` shows with its reason; False when this
        upload's rejection is recorded already (a redelivered event). Only ids the starter may write
        (`rejected-*`: its role's dynamodb:LeadingKeys) and only a new item: no record of a deployment is
        reachable from a rejected upload."""
        now = _now()
        values = {":s": "rejected", ":n": execution_name, ":u": artifact_uri, ":e": "RequestInvalid",
                  ":r": reason[:2000], ":t": now}  # fmt: skip
        try:
            self.table.update_item(
                Key={"deployment_id": deployment_id},
                UpdateExpression="SET #s = :s, execution_name = :n, uploaded_uri = :u, #e = :e, failure_reason = :r, "
                "created_at = :t, updated_at = :t, ended_at = :t",
                ConditionExpression="attribute_not_exists(deployment_id)",
                ExpressionAttributeNames={"#s": "status", "#e": "error"},
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "ConditionalCheckFailedException":
                return False
            raise
        return True

    def tombstone(self, deployment_id: str, execution_name: str, execution_arn: str, status: str) -> bool:
        """An execution that ended before it registered: a closed record in its place, so that a
        RegisterDeployment still running finds it ended and creates nothing. False if a record exists."""
        now = _now()
        item = {
            "deployment_id": deployment_id,
            "execution_name": execution_name,
            "execution_arn": execution_arn,
            "status": status,
            "steps": {},
            "created_at": now,
            "updated_at": now,
            "ended_at": now,
        }
        return self._put_if(item)

    def record(
        self,
        deployment_id: str,
        step: StepName,
        result: dict[str, Any] | list[Any],
        *,
        attempt: int = 0,
        status: str | None = None,
        owner: str | None = None,
        live: bool = False,
        **fields: Any,
    ) -> DeploymentRecord:
        """Store one step's result (and any top-level fields) in one conditional write; returns the
        updated record.

        OWNER (an execution ARN): the record must be that execution's (RecordNotOwned otherwise).
        LIVE: the deployment must not have ended (DeploymentEnded otherwise). STATUS: the record
        must be in a status that may move there (StepContractViolated otherwise)."""
        names: dict[str, str] = {"#s": step_key(step, attempt)}
        values: dict[str, Any] = {":v": json.dumps(result, sort_keys=True, default=str), ":now": _now()}
        sets = ["steps.#s = :v", "updated_at = :now"]
        conditions = ["attribute_exists(deployment_id)"]
        if owner is not None:
            names["#ex"] = "execution_arn"
            values[":owner"] = owner
            conditions.append("#ex = :owner")
        if live or status:
            names["#st"] = "status"
        if live:
            conditions.append(_not_in("#st", sorted(ENDED), "e", values))
        if status:
            if status not in TRANSITIONS:
                raise StepContractViolated(f"internal error: {status!r} is no deployment status")
            conditions.append(_in("#st", sorted(TRANSITIONS[status]), "t", values))
            fields["status"] = status
        for i, (key, value) in enumerate(fields.items()):
            if value is None:
                continue
            names[f"#f{i}"] = key
            values[f":f{i}"] = value
            sets.append(f"#f{i} = :f{i}")
        try:
            response = self.table.update_item(
                Key={"deployment_id": deployment_id},
                UpdateExpression="SET " + ", ".join(sets),
                ExpressionAttributeNames=names,
                ExpressionAttributeValues=values,
                ConditionExpression=" AND ".join(conditions),
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ConditionalCheckFailedException":
                _transient(exc)
                raise
            raise self._refusal(deployment_id, step, status, owner) from None
        if status in ENDED:  # nothing of it bills any more: its share of the stack's ceiling is free
            stack_budget.release(self.table, deployment_id)
        return DeploymentRecord.from_item(response["Attributes"])

    def reserve_budget(
        self, deployment_id: str, hourly: float, instances: int, max_hourly: float, max_instances: int
    ) -> None:
        stack_budget.reserve(self.table, deployment_id, hourly, instances, max_hourly, max_instances)

    def release_stale_reservations(self) -> list[str]:
        """Reservations whose deployment ended or never registered (a Lambda killed between the two
        writes): released, and their ids returned."""
        released = []
        for deployment_id in stack_budget.reservations(self.table):
            record = self.get(deployment_id)
            if (record is None or record.status in ENDED) and stack_budget.release(self.table, deployment_id):
                released.append(deployment_id)
        return released

    def _refusal(self, deployment_id: str, step: str, status: str | None, owner: str | None) -> Exception:
        """Why a conditional write was refused, as the error the step raises."""
        current = self.get(deployment_id)
        if current is None:
            return StepContractViolated(f"internal error: no record of deployment {deployment_id} to write {step}")
        if owner is not None and current.execution_arn != owner:
            return RecordNotOwned(
                f"deployment {deployment_id} belongs to execution {current.execution_arn or current.execution_name}, "
                f"not {owner}: nothing of it was touched"
            )
        if current.status in ENDED:
            return DeploymentEnded(f"deployment {deployment_id} already ended ({current.status}) before {step}")
        return StepContractViolated(
            f"internal error: deployment {deployment_id} cannot move from {current.status} to {status} ({step})"
        )

    def live(self, deployment_id: str, owner: str) -> DeploymentRecord:
        """OWNER's record, still in flight: a step checks this before work it would have to undo."""
        current = self.get(deployment_id)
        if current is None:
            raise StepContractViolated(f"internal error: no record of deployment {deployment_id}")
        if current.execution_arn != owner:
            raise RecordNotOwned(f"deployment {deployment_id} belongs to another execution: nothing of it was touched")
        if current.status in ENDED:
            raise DeploymentEnded(f"deployment {deployment_id} already ended ({current.status})")
        return current

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
        try:
            item: dict[str, Any] | None = self.table.get_item(Key={"deployment_id": key}, ConsistentRead=True).get(
                "Item"
            )
        except ClientError as exc:
            _transient(exc)
            raise
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
                _transient(exc)
                raise
            return False
        return True


def _same_owner(record: DeploymentRecord, execution_name: str, execution_arn: str | None) -> bool:
    if execution_arn and record.execution_arn:
        return record.execution_arn == execution_arn
    return record.execution_name == execution_name


def _in(name: str, options: list[str], tag: str, values: dict[str, Any]) -> str:
    placeholders = []
    for i, option in enumerate(options):
        values[f":{tag}{i}"] = option
        placeholders.append(f":{tag}{i}")
    return f"{name} IN ({', '.join(placeholders)})"


def _not_in(name: str, options: list[str], tag: str, values: dict[str, Any]) -> str:
    return f"NOT ({_in(name, options, tag, values)})"


def is_claim(item: dict[str, Any]) -> bool:
    """An item that is no deployment: an artifact claim, the stack's budget, or a channel."""
    return str(item.get("deployment_id", "")).startswith((CLAIM_PREFIX, stack_budget.BUDGET_KEY, CHANNEL_PREFIX))
