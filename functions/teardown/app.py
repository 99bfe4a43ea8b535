"""Teardown: delete endpoint -> endpoint config -> model (already gone counts as deleted)."""

from typing import Any

import boto3
from pydantic import BaseModel

from modeldrop.contracts.models import TeardownResult
from modeldrop.pipeline import steps
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    deployment_id: str
    resource_name: str


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> TeardownResult:
    settings = RecordSettings.from_env()
    table = settings.table()
    return steps.teardown(boto3.client("sagemaker"), table, event.deployment_id, event.resource_name)
