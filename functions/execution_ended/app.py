"""ExecutionEnded: an execution stopped, timed out or failed -> delete what it still owns, mark the record."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.pipeline.config import ReaperSettings
from modeldrop.pipeline.deployment import teardown
from modeldrop.pipeline.lambda_support import handler, logger, metrics


class Event(BaseModel):
    detail: dict[str, Any]


@logger.inject_lambda_context
@metrics.log_metrics
@handler(Event)
def lambda_handler(event: Event, context: Any) -> dict[str, Any]:
    settings = ReaperSettings.from_env()
    if event.detail.get("error") == "DeploymentUnrecorded":
        # The bookkeeping failed for good (the alarm's metric): a retry that fixed it never gets here.
        metrics.add_metric(name="DeploymentsUnrecorded", unit="Count", value=1)
    return teardown.on_execution_ended(
        clients.sagemaker(),
        clients.s3(),
        settings.registry(),
        clients.events(),
        settings.event_bus_name,
        event.detail,
        settings.resource_prefix,
    )
