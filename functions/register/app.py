"""RegisterDeployment: create the deployment record, claim the artifact version, and check what
would fail the deployment late (the execution role's trust, a quota below the instance count)."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.pipeline.config import RegisterSettings
from modeldrop.pipeline.deployment import register_steps
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    request: NormalizedRequest


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> dict[str, Any]:
    settings = RegisterSettings.from_env()
    registry = settings.registry()
    aws = register_steps.RegisterClients(
        s3=clients.s3(), iam=clients.iam(), quotas=clients.service_quotas(), sagemaker=clients.sagemaker()
    )
    return register_steps.register_and_check(
        registry,
        aws,
        event.request,
        settings.aws_region,
        settings.sagemaker_role_arn,
        settings.max_archive_gb,
        register_steps.StackCeiling(settings.max_stack_hourly_price, settings.max_stack_instances),
    )
