"""SmokeEval: truncation-aware eval against the new endpoint; EvalFailed names the cases and fix."""

import os
from typing import Any

import boto3
from pydantic import BaseModel

from modeldrop import steps
from modeldrop.config import ReportSettings
from modeldrop.lambda_support import handler, logger
from modeldrop.models import EndpointRef, EnginePlan, EvalVerdict, NormalizedRequest


class Event(BaseModel):
    request: NormalizedRequest
    endpoint: EndpointRef
    plan: EnginePlan


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> EvalVerdict:
    settings = ReportSettings.from_env()
    table = boto3.resource("dynamodb").Table(settings.deployments_table)
    answers_from = os.environ.get("MODELDROP_ANSWERS_FROM", "endpoint")
    return steps.smoke_eval(
        boto3.client("sagemaker-runtime"),
        boto3.client("s3"),
        table,
        event.request,
        event.endpoint,
        event.plan,
        answers_from,
    )
