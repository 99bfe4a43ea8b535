"""RegisterDeployment: create the deployment record, claim the artifact version, and check what
would fail the deployment late (the execution role's trust, a quota below the instance count)."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.pipeline import steps
from modeldrop.pipeline.config import RegisterSettings
from modeldrop.pipeline.lambda_support import handler, logger
from modeldrop.pipeline.preflight import preflight


class Event(BaseModel):
    request: NormalizedRequest


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> dict[str, Any]:
    settings = RegisterSettings.from_env()
    registry = settings.registry()
    registered = steps.register(registry, clients.s3(), event.request, settings.aws_region)
    # After the record exists, so that a refusal here is recorded (and shown by `modeldrop status`).
    preflight(registry, clients.iam(), clients.service_quotas(), event.request, settings.sagemaker_role_arn)
    return registered
