"""Promote: a request with `channel` -- start the promotion (gate, claim, endpoint created or updated)
or check the one under way; PromotionBlocked / PromotionFailed / ChannelInvalid end it."""

from typing import Any, Literal

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.aws.dynamodb.channel_store import ChannelStore
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.pipeline.channels.channel_context import ChannelContext
from modeldrop.pipeline.channels.promotion_steps import PromotionProgress, promotion_step
from modeldrop.pipeline.config import PromoteSettings
from modeldrop.pipeline.lambda_support import handler, logger, metrics


class Event(BaseModel):
    request: NormalizedRequest
    action: Literal["start", "check"]
    execution_arn: str


@logger.inject_lambda_context
@metrics.log_metrics
@handler(Event)
def lambda_handler(event: Event, context: Any) -> PromotionProgress:
    settings = PromoteSettings.from_env()
    registry = settings.registry()
    ctx = ChannelContext(
        sm=clients.sagemaker(),
        runtime=clients.sagemaker_runtime(),
        cloudwatch=clients.cloudwatch(),
        registry=registry,
        channels=ChannelStore(registry.table),
        resource_prefix=settings.resource_prefix,
        stack_tag=settings.stack_tag,
        s3=clients.s3(),
        max_channels=settings.max_channels,
        autoscaling=clients.application_autoscaling(),
        refusing_regions=settings.refusing_regions(),
    )
    return promotion_step(ctx, event.request, event.action, event.execution_arn)
