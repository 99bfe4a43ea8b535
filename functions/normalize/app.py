"""NormalizeRequest: parse the request and apply the stack defaults."""

from typing import Any

from pydantic import BaseModel

from modeldrop import steps
from modeldrop.config import DefaultsSettings
from modeldrop.lambda_support import handler, logger
from modeldrop.models import NormalizedRequest


class Event(BaseModel):
    request: Any
    execution_name: str


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> NormalizedRequest:
    return steps.normalize(event.request, event.execution_name, DefaultsSettings.from_env())
