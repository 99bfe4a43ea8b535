"""The registry's own state machine, on a DynamoDB table in moto: owned writes, allowed transitions,
ended records that nothing brings back, and transient errors the state machine retries."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.contracts.errors import DeploymentEnded, RecordNotOwned, RegistryBusy, StepContractViolated

MINE = "arn:aws:states:us-east-1:123456789012:execution:sm:mine"
THEIRS = "arn:aws:states:us-east-1:123456789012:execution:sm:theirs"


@pytest.fixture
def registry() -> Iterator[Registry]:
    with mock_aws():
        ddb = boto3.resource("dynamodb", region_name="us-east-1")
        table = ddb.create_table(
            TableName="deployments",
            BillingMode="PAY_PER_REQUEST",
            AttributeDefinitions=[{"AttributeName": "deployment_id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "deployment_id", "KeyType": "HASH"}],
        )
        yield Registry(table)


def test_only_the_owner_writes_and_only_along_allowed_transitions(registry: Registry) -> None:
    assert registry.register("d-1", "mine", {}, {}, MINE) is True
    assert registry.register("d-1", "mine", {}, {}, MINE) is False  # a retried step
    with pytest.raises(RecordNotOwned):
        registry.register("d-1", "theirs", {}, {}, THEIRS)
    with pytest.raises(RecordNotOwned):
        registry.record("d-1", "validate", {}, status="validated", owner=THEIRS, live=True)
    registry.record("d-1", "validate", {}, status="validated", owner=MINE, live=True)
    with pytest.raises(StepContractViolated, match="cannot move from validated to creating"):
        registry.record("d-1", "create_endpoint", {}, status="creating", owner=MINE, live=True)
    registry.record("d-1", "build_env", {}, status="planned", owner=MINE, live=True)
    registry.record("d-1", "create_endpoint", {}, status="creating", owner=MINE, live=True)
    assert registry.get("d-1").status == "creating"


def test_nothing_moves_a_record_out_of_an_ended_status(registry: Registry) -> None:
    registry.register("d-2", "mine", {}, {}, MINE)
    registry.record("d-2", "execution_ended", {}, status="aborted")
    for step, status in (("validate", "validated"), ("failure", "failing"), ("result", "failed")):
        with pytest.raises(DeploymentEnded):
            registry.record("d-2", step, {}, status=status, owner=MINE, live=True)  # type: ignore[arg-type]
    with pytest.raises(DeploymentEnded):
        registry.live("d-2", MINE)
    # Cleanup still writes what it did, and the status stays.
    registry.record("d-2", "teardown", {"deleted": []}, owner=MINE)
    assert registry.get("d-2").status == "aborted"


def test_a_tombstone_makes_a_late_registration_fail_as_ended(registry: Registry) -> None:
    assert registry.tombstone("d-3", "mine", MINE, "aborted") is True
    with pytest.raises(DeploymentEnded):
        registry.register("d-3", "mine", {}, {}, MINE)


def test_an_ended_holder_passes_its_artifact_claim_on(registry: Registry) -> None:
    registry.register("d-4", "first", {}, {}, MINE)
    assert registry.claim_artifact("s3://b/k@v1", "d-4") is None
    registry.register("d-5", "second", {}, {}, THEIRS)
    holder = registry.claim_artifact("s3://b/k@v1", "d-5")
    assert holder is not None and holder.deployment_id == "d-4"
    registry.record("d-4", "execution_ended", {}, status="aborted")
    assert registry.claim_artifact("s3://b/k@v1", "d-5") is None


def test_a_busy_table_is_registry_busy(registry: Registry, monkeypatch: Any) -> None:
    from botocore.exceptions import ClientError

    registry.register("d-6", "mine", {}, {}, MINE)

    def busy(**_kwargs: Any) -> Any:
        raise ClientError(
            {"Error": {"Code": "ProvisionedThroughputExceededException", "Message": "slow"}}, "UpdateItem"
        )

    monkeypatch.setattr(registry.table, "update_item", busy)
    with pytest.raises(RegistryBusy):
        registry.record("d-6", "validate", {}, status="validated", owner=MINE, live=True)
