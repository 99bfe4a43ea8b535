"""BuildEngineEnv: container env, timeouts and the GPU memory plan for one attempt's instance type."""

from typing import Any

from pydantic import BaseModel

from modeldrop.contracts.models import NormalizedRequest, ValidationSummary
from modeldrop.contracts.step_payloads import EnginePlan, ImageChoice
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.deployment import steps
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    request: NormalizedRequest
    validation: ValidationSummary
    image: ImageChoice
    attempt: int = 0


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> EnginePlan:
    settings = RecordSettings.from_env()
    registry = settings.registry()
    return steps.build_plan(registry, event.request, event.validation, event.image, event.attempt)
