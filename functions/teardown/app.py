"""Teardown: delete endpoint -> endpoint config -> model (already gone counts as deleted)."""

from typing import Any

import boto3
from pydantic import BaseModel

from modeldrop.contracts.models import TeardownResult
from modeldrop.contracts.s3uri import parse_s3_uri
from modeldrop.pipeline import steps
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    deployment_id: str
    resource_name: str
    artifact_uri: str | None = None  # its bucket holds the served copy to delete


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> TeardownResult:
    settings = RecordSettings.from_env()
    table = settings.table()
    bucket = parse_s3_uri(event.artifact_uri).bucket if event.artifact_uri else None
    return steps.teardown(
        boto3.client("sagemaker"),
        table,
        event.deployment_id,
        event.resource_name,
        s3=boto3.client("s3"),
        artifact_bucket=bucket,
    )
