"""RegisterDeployment: create the deployment record."""

from typing import Any

import boto3
from pydantic import BaseModel

from modeldrop import steps
from modeldrop.config import ReportSettings
from modeldrop.lambda_support import handler, logger
from modeldrop.models import NormalizedRequest


class Event(BaseModel):
    request: NormalizedRequest


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> dict[str, Any]:
    settings = ReportSettings.from_env()
    table = boto3.resource("dynamodb").Table(settings.deployments_table)
    return steps.register(table, event.request, settings.aws_region)
