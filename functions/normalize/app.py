"""NormalizeRequest: parse the request and apply the stack defaults."""

from typing import Any

from pydantic import BaseModel

from modeldrop.contracts.models import NormalizedRequest
from modeldrop.pipeline.config import NormalizeSettings
from modeldrop.pipeline.deployment import steps
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    request: Any
    execution_name: str
    execution_arn: str
    started_at: str


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> NormalizedRequest:
    settings = NormalizeSettings.from_env()
    return steps.normalize(
        event.request,
        event.execution_name,
        settings,
        event.execution_arn,
        event.started_at,
        channel_base=settings.channel_base(),
    )
