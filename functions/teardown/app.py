"""Teardown, one pass of the state machine's loop: the endpoint first; its config, model and served copy once
it is gone."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.step_payloads import TeardownProgress
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.deployment import teardown
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    deployment_id: str
    resource_name: str
    artifact_uri: ArtifactUri | None = None  # its bucket holds the served copy to delete
    attempt: int = 0
    deadline_at: str | None = None
    final: bool = True  # False: releasing a failed attempt before the next instance type (the copy stays)
    sagemaker: bool = True  # False: nothing was created in SageMaker; only the served copy goes
    execution_arn: str | None = None  # the owner: its teardown step is written to no other record
    endpoint_name: str | None = None  # the attempt's endpoint (default: resource_name)


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> TeardownProgress:
    settings = RecordSettings.from_env()
    return teardown.teardown_pass(
        clients.sagemaker(),
        clients.s3(),
        settings.registry(),
        event.deployment_id,
        event.resource_name,
        attempt=event.attempt,
        deadline_at=event.deadline_at,
        artifact_uri=event.artifact_uri,
        final=event.final,
        sagemaker=event.sagemaker,
        owner=event.execution_arn,
        endpoint_name=event.endpoint_name,
    )
