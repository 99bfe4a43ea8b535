"""CreateEndpoint: quota check (at quota: wait or move on), secrets by reference, then model, endpoint config and
endpoint, tagged."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.step_payloads import CreateOutcome, EnginePlan, ImageChoice
from modeldrop.pipeline.config import DeploySettings
from modeldrop.pipeline.deployment import endpoint_steps
from modeldrop.pipeline.lambda_support import handler, logger


class Event(BaseModel):
    request: NormalizedRequest
    image: ImageChoice
    plan: EnginePlan
    served_uri: ArtifactUri | None = None
    served_digest: str | None = None
    quota_waits: int = 0
    quota_wait_until: str | None = None


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> CreateOutcome:
    settings = DeploySettings.from_env()
    registry = settings.registry()
    aws = endpoint_steps.CreateClients(
        sagemaker=clients.sagemaker(),
        quotas=clients.service_quotas(),
        secretsmanager=clients.secretsmanager(),
        ssm=clients.ssm(),
        s3=clients.s3(),
    )
    return endpoint_steps.create(
        aws,
        registry,
        event.request,
        event.image,
        event.plan,
        settings.sagemaker_role_arn,
        settings.stack_tag,
        served_uri=event.served_uri,
        quota_waits=event.quota_waits,
        quota_wait_until=event.quota_wait_until,
        served_digest=event.served_digest,
    )
