"""S3 Object Created (via EventBridge) -> one execution per bucket/key/version-id."""

from typing import Any

from modeldrop.aws import clients
from modeldrop.aws.events_bus import publish
from modeldrop.pipeline.config import StarterSettings
from modeldrop.pipeline.deployment.starter import record_rejected, start_from_event
from modeldrop.pipeline.lambda_support import logger


@logger.inject_lambda_context
def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    settings = StarterSettings.from_env()
    outcome = start_from_event(
        event, clients.s3(), clients.stepfunctions(), settings.state_machine_arn, settings.artifact_bucket
    )
    if outcome.status == "rejected":
        logger.error("s3 event rejected: nothing started", extra=outcome.model_dump())
        record_rejected(outcome, settings.registry(), lambda detail: publish(
            clients.events(), settings.event_bus_name, "Deployment Rejected", detail))  # fmt: skip
    else:
        logger.info("s3 event handled", extra=outcome.model_dump())
    return outcome.model_dump(mode="json")
