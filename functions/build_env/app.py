"""BuildEngineEnv: container env, timeouts and the GPU memory plan."""

from typing import Any

from pydantic import BaseModel

from modeldrop.contracts.models import EnginePlan, ImageChoice, NormalizedRequest, ValidationSummary
from modeldrop.pipeline import steps
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    request: NormalizedRequest
    validation: ValidationSummary
    image: ImageChoice


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> EnginePlan:
    settings = RecordSettings.from_env()
    table = settings.table()
    return steps.build_plan(table, event.request, event.validation, event.image)
