"""RecordFailure: classify the error; capture the FailureReason and the log lines that explain it, before teardown."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.step_payloads import FailureRecord
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.deployment import closing_steps
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    deployment_id: str
    resource_name: str
    failure: dict[str, Any]
    phase: str = "endpoint"
    execution_arn: str


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> FailureRecord:
    settings = RecordSettings.from_env()
    registry = settings.registry()
    return closing_steps.record_failure(
        clients.sagemaker(),
        clients.logs(),
        registry,
        event.deployment_id,
        event.resource_name,
        event.failure,
        event.phase,
        owner=event.execution_arn,
    )
