"""ValidateCheckpoint: open the artifact, check config and safetensors headers, refuse with fixes."""

import time
from typing import Any

import boto3
from pydantic import BaseModel

from modeldrop import steps
from modeldrop.config import RecordSettings
from modeldrop.lambda_support import handler, logger, metrics, tracer
from modeldrop.models import ValidationSummary


class Event(BaseModel):
    deployment_id: str
    artifact_uri: str


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
@handler(Event)
def lambda_handler(event: Event, context: Any) -> ValidationSummary:
    settings = RecordSettings.from_env()
    table = settings.table()
    started = time.monotonic()
    summary = steps.validate(boto3.client("s3"), table, event.deployment_id, event.artifact_uri)
    seconds = time.monotonic() - started
    metrics.add_metric(name="ValidationSeconds", unit="Seconds", value=round(seconds, 3))
    metrics.add_metric(
        name="ValidationMBps", unit="Megabytes/Second", value=round(summary.total_bytes / 1e6 / seconds, 2)
    )
    return summary
