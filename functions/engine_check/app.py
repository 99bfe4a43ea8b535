"""EngineCheck: the resolved image's engine judges the served copy (its headers and side files) before
any endpoint exists; a refusal is CheckpointRefused in the engine's own words."""

import os
from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.checkpoint.engine.engine_check import EngineCheck, engine_python
from modeldrop.checkpoint.engine.warm_probe import warm_up
from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.step_payloads import Engine
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.deployment.engine_check_step import run_step
from modeldrop.pipeline.lambda_support import handler, logger

# At init: the engine's import starts beside the runtime's, and every invocation of this container asks the same
# warm engine (a check costs ~0.1 s warm against ~15 s cold).
if os.environ.get("MODELDROP_ENGINE_CHECK", "Enabled") != "Disabled" and (python := engine_python()) is not None:
    warm_up(python)


class Event(BaseModel):
    deployment_id: str
    served_uri: ArtifactUri | None = None  # None: the adapters join a live base, judged when it was deployed
    engine: Engine
    execution_arn: str


@logger.inject_lambda_context
@handler(Event)
def lambda_handler(event: Event, context: Any) -> EngineCheck:
    settings = RecordSettings.from_env()
    return run_step(
        clients.s3(),
        settings.registry(),
        event.deployment_id,
        event.served_uri,
        event.engine,
        settings.aws_region,
        os.environ,
        owner=event.execution_arn,
    )
