"""MarkSucceeded / MarkFailed: close the record and publish the lifecycle event."""

from typing import Any, Literal

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.pipeline.config import RegistrySettings
from modeldrop.pipeline.deployment import closing_steps
from modeldrop.pipeline.lambda_support import handler, logger, metrics


class Event(BaseModel):
    deployment_id: str
    outcome: Literal["succeeded", "failed"]
    summary: dict[str, Any]
    request: dict[str, Any] | None = None
    execution_arn: str


@logger.inject_lambda_context
@metrics.log_metrics
@handler(Event)
def lambda_handler(event: Event, context: Any) -> dict[str, Any]:
    settings = RegistrySettings.from_env()
    registry = settings.registry()
    metrics.add_metric(name=f"Deployments{event.outcome.capitalize()}", unit="Count", value=1)
    return closing_steps.finalize(
        registry,
        clients.events(),
        settings.event_bus_name,
        event.deployment_id,
        event.outcome,
        event.summary,
        owner=event.execution_arn,
    )
