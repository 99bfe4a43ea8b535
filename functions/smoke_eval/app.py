"""SmokeEval: truncation-aware eval against the new endpoint; EvalFailed names the cases and fix."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.step_payloads import EndpointRef, EnginePlan, EvalVerdict
from modeldrop.pipeline.config import EvalSettings
from modeldrop.pipeline.deployment import eval_steps
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
    registry = settings.registry()
    # Throttling is retried by the eval itself, with every attempt counted in the report.
    runtime = clients.sagemaker_runtime()
    return eval_steps.smoke_eval(
        runtime, clients.s3(), registry, event.request, event.endpoint, event.plan, metrics=metrics
    )
