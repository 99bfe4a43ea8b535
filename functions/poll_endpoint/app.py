"""PollEndpoint: InService, Failed (EndpointFailed; InsufficientCapacity for no capacity) or past the deadline."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.step_payloads import EndpointPoll, EndpointRef
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.deployment import endpoint_steps
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    deployment_id: str
    endpoint: EndpointRef
    polls: int = 0
    capacity_wait_seconds: int = 1800
    execution_arn: str = ""  # the owner: a shared deployment's components are attached only while it is live


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> EndpointPoll:
    return endpoint_steps.poll(
        clients.sagemaker(),
        event.endpoint,
        event.polls,
        logs=clients.logs(),
        capacity_wait_seconds=event.capacity_wait_seconds,
        registry=RecordSettings.from_env().registry() if event.endpoint.components else None,
        owner=event.execution_arn,
    )
