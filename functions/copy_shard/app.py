"""CopyShard: a batch of a prefix's objects copied server-side into the deployment's served copy (a Map iteration)."""

from typing import Any

from pydantic import BaseModel, Field

from modeldrop.aws import clients
from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.served import CopyBatchResult, CopyItem
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.deployment.copy_steps import copy_batch
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    deployment_id: str
    artifact_uri: ArtifactUri
    execution_arn: str
    items: list[CopyItem] = Field(min_length=1)


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> CopyBatchResult:
    settings = RecordSettings.from_env()
    return copy_batch(
        clients.s3(), settings.registry(), event.deployment_id, event.execution_arn, event.artifact_uri, event.items
    )
