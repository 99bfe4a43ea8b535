"""NextAttempt: record a capacity (or quota) failure of one instance type; name the next type to try."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.step_payloads import AttemptStep, EndpointRef, EnginePlan
from modeldrop.pipeline.config import RegistrySettings
from modeldrop.pipeline.deployment import attempts
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    request: NormalizedRequest
    plan: EnginePlan
    failure: dict[str, Any]
    endpoint: EndpointRef | None = None


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> AttemptStep:
    settings = RegistrySettings.from_env()
    return attempts.next_attempt(
        settings.registry(),
        clients.events(),
        settings.event_bus_name,
        event.request,
        event.plan,
        event.failure,
        event.endpoint,
        settings.aws_region,
    )
