"""RegisterDeployment: create the deployment record and claim the artifact version."""

from typing import Any

import boto3
from pydantic import BaseModel

from modeldrop.contracts.models import NormalizedRequest
from modeldrop.pipeline import steps
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    request: NormalizedRequest


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> dict[str, Any]:
    settings = RecordSettings.from_env()
    table = settings.table()
    return steps.register(table, boto3.client("s3"), event.request, settings.aws_region)
