"""SmokeEval: truncation-aware eval against the new endpoint; EvalFailed names the cases and fix."""

from typing import Any

import boto3
from pydantic import BaseModel

from modeldrop.contracts.models import EndpointRef, EnginePlan, EvalVerdict, NormalizedRequest
from modeldrop.evaluation.runner import runtime_client_config
from modeldrop.pipeline import steps
from modeldrop.pipeline.config import EvalSettings
from modeldrop.pipeline.lambda_support import handler, logger, metrics


class Event(BaseModel):
    request: NormalizedRequest
    endpoint: EndpointRef
    plan: EnginePlan


@logger.inject_lambda_context
@metrics.log_metrics
@handler(Event)
def lambda_handler(event: Event, context: Any) -> EvalVerdict:
    settings = EvalSettings.from_env()
    table = settings.table()
    # Throttling is retried by the eval itself, with every attempt counted in the report.
    runtime = boto3.client("sagemaker-runtime", config=runtime_client_config())
    return steps.smoke_eval(
        runtime, boto3.client("s3"), table, event.request, event.endpoint, event.plan, metrics=metrics
    )
