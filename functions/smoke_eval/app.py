"""SmokeEval: truncation-aware eval against the new endpoint; EvalFailed names the cases and fix."""

from typing import Any

import boto3
from pydantic import BaseModel

from modeldrop import steps
from modeldrop.config import EvalSettings
from modeldrop.lambda_support import handler, logger
from modeldrop.models import EndpointRef, EnginePlan, EvalVerdict, NormalizedRequest


class Event(BaseModel):
    request: NormalizedRequest
    endpoint: EndpointRef
    plan: EnginePlan


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> EvalVerdict:
    settings = EvalSettings.from_env()
    table = settings.table()
    return steps.smoke_eval(
        boto3.client("sagemaker-runtime"),
        boto3.client("s3"),
        table,
        event.request,
        event.endpoint,
        event.plan,
        settings.modeldrop_answers_from,
    )
