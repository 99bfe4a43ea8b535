"""Channel records in the deployments table (`channel#NAME` items): read, created once, and saved
only over the revision that was read, so two promotions racing on one channel cannot both win."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from boto3.dynamodb.conditions import Attr
from botocore.exceptions import ClientError

from modeldrop.contracts.channel import CHANNEL_PREFIX, ChannelRecord
from modeldrop.contracts.errors import RegistryBusy

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.service_resource import Table


class ChannelChanged(RegistryBusy):
    """Another promotion or rollback wrote the channel since it was read."""


class ChannelStore:
    def __init__(self, table: Table) -> None:
        self.table = table

    def get(self, name: str) -> ChannelRecord | None:
        item = self.table.get_item(Key={"deployment_id": CHANNEL_PREFIX + name}, ConsistentRead=True).get("Item")
        return _decode(item) if item else None

    def adapter_base(self, name: str) -> str | None:
        """The base deployment of adapter channel NAME (None: no such channel, or not an adapter one)."""
        channel = self.get(name)
        return channel.base_deployment if channel else None

    def all(self) -> list[ChannelRecord]:
        items: list[dict[str, Any]] = []
        # The table is mostly deployments: only channel items come back (the scan still reads them all).
        kwargs: dict[str, Any] = {"FilterExpression": Attr("deployment_id").begins_with(CHANNEL_PREFIX)}
        while True:
            page = self.table.scan(**kwargs)
            items += page.get("Items", [])
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
        return sorted((_decode(i) for i in items), key=lambda c: c.name)

    def save(self, record: ChannelRecord) -> ChannelRecord:
        """RECORD written over the revision it was read at (0: created); ChannelChanged if another wrote."""
        expected = record.revision
        saved = record.model_copy(update={"revision": expected + 1})
        # UpdateItem, not PutItem: the roles that write channels (the reaper's among them) need no more.
        values: dict[str, Any] = {":body": saved.model_dump_json(), ":next": expected + 1}
        condition = "attribute_not_exists(deployment_id)"
        if expected:
            condition, values[":expected"] = "revision = :expected", expected
        try:
            self.table.update_item(
                Key={"deployment_id": CHANNEL_PREFIX + record.name},
                UpdateExpression="SET body = :body, revision = :next",
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if exc.response["Error"]["Code"] == "ConditionalCheckFailedException":
                raise ChannelChanged(f"channel {record.name} changed while this ran; read it again") from None
            raise
        return saved

    def delete(self, record: ChannelRecord) -> None:
        self.table.delete_item(
            Key={"deployment_id": CHANNEL_PREFIX + record.name},
            ConditionExpression="revision = :expected",
            ExpressionAttributeValues={":expected": record.revision},
        )


def _decode(item: dict[str, Any]) -> ChannelRecord:
    return ChannelRecord.model_validate(json.loads(str(item["body"])))
