"""EngineCheck: the resolved image's engine judges the served copy (its headers and side files) before
any endpoint exists; a refusal is CheckpointRefused in the engine's own words."""

import os
from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.checkpoint.engine_check import EngineCheck
from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.step_payloads import Engine
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.engine_check_step import check_served, raise_if_refused
from modeldrop.pipeline.lambda_support import handler, logger
from modeldrop.serving.engine_options import resolved_version


class Event(BaseModel):
    deployment_id: str
    served_uri: ArtifactUri | None = None  # None: the adapters join a live base, judged when it was deployed
    engine: Engine
    execution_arn: str


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> EngineCheck:
    settings = RecordSettings.from_env()
    target = resolved_version(event.engine, settings.aws_region, os.environ)
    if event.served_uri is None:
        check = EngineCheck(
            engine=target.engine,
            verdict="unavailable",
            judged_for=target.describe(),
            message="no served copy: the adapters join a live base, checked when it was deployed",
        )
    else:
        check = check_served(clients.s3(), event.served_uri, target)
    settings.registry().record(
        event.deployment_id, "engine_check", check.model_dump(mode="json"), owner=event.execution_arn, live=True
    )
    raise_if_refused(check)
    return check
