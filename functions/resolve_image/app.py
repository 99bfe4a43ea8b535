"""ResolveImage: full-URI env -> version env -> the known-image registry, in the endpoint's region."""

import os
from typing import Any

from pydantic import BaseModel

from modeldrop.contracts.step_payloads import Engine, ImageChoice
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.deployment import steps
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    deployment_id: str
    engine: Engine
    model_type: str | None = None
    execution_arn: str


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> ImageChoice:
    settings = RecordSettings.from_env()
    registry = settings.registry()
    return steps.resolve(
        registry,
        event.deployment_id,
        event.engine,
        settings.aws_region,
        dict(os.environ),
        event.model_type,
        owner=event.execution_arn,
    )
