"""Scheduled: delete managed endpoints whose expires-at tag has passed, and orphans."""

from datetime import timedelta
from typing import Any

from modeldrop.aws import clients
from modeldrop.pipeline.config import ReaperSettings
from modeldrop.pipeline.lambda_support import logger, metrics, time_budget
from modeldrop.pipeline.reaper.reaper import reap


@logger.inject_lambda_context
@metrics.log_metrics
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    settings = ReaperSettings.from_env()
    with time_budget(context):
        result = reap(
            clients.sagemaker(),
            settings.registry(),
            clients.events(),
            settings.event_bus_name,
            settings.stack_tag,
            settings.resource_prefix,
            period=timedelta(minutes=settings.reaper_period_minutes),
            default_ttl=timedelta(hours=settings.default_ttl_hours),
            max_ttl=timedelta(hours=settings.max_ttl_hours),
            s3=clients.s3(),
            bucket=settings.artifact_bucket,
            cloudwatch=clients.cloudwatch(),
            autoscaling=clients.application_autoscaling(),
        )
    deletions = len(result.expired) + len(result.orphans_deleted) + len(result.served_copies_deleted)
    metrics.add_metric(name="ReaperDeletions", unit="Count", value=deletions)
    metrics.add_metric(name="OverdueEndpoints", unit="Count", value=len(result.overdue))
    logger.info("reaper run", extra=result.model_dump())
    return result.model_dump(mode="json")
