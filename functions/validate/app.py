"""ValidateCheckpoint: open the artifact, check config and safetensors headers, refuse with fixes."""

from typing import Any

from pydantic import BaseModel

from modeldrop.aws import clients
from modeldrop.contracts.artifact import ArtifactUri
from modeldrop.contracts.models import NamedAdapter, ValidationSummary
from modeldrop.contracts.served import CopyItem
from modeldrop.contracts.step_payloads import AttachedBase, Engine
from modeldrop.pipeline.config import RecordSettings
from modeldrop.pipeline.deployment import steps
from modeldrop.pipeline.lambda_support import handler, logger, metrics, tracer


class Event(BaseModel):
    deployment_id: str
    artifact_uri: ArtifactUri
    artifact_version: str | None = None
    execution_arn: str
    copy_items: list[CopyItem] = []  # a prefix's objects, copied by the Map before this step
    # An adapter deployment: the adapter, validated against the base (artifact_uri) and served beside it.
    adapter_uri: ArtifactUri | None = None
    adapter_name: str | None = None
    adapter_version: str | None = None
    adapter_mode: str | None = None
    more_adapters: list[NamedAdapter] = []  # shared mode: the other adapters, versions pinned at registration
    attach: AttachedBase | None = None  # base_endpoint: the adapters are judged against that deployment's base
    engine: Engine | None = None  # judged for the engine (and version) of the image ResolveImage will choose


@logger.inject_lambda_context
@tracer.capture_lambda_handler
@metrics.log_metrics
@handler(Event)
def lambda_handler(event: Event, context: Any) -> ValidationSummary:
    settings = RecordSettings.from_env()
    registry = settings.registry()
    return steps.validate(
        clients.s3(),
        registry,
        event.deployment_id,
        event.artifact_uri,
        metrics=metrics,
        artifact_version=event.artifact_version,
        owner=event.execution_arn,
        items=event.copy_items,
        adapter=steps.AdapterSource.of(event.adapter_uri, event.adapter_name, event.adapter_version),
        more_adapters=[steps.AdapterSource(a.uri, a.name, a.version) for a in event.more_adapters],
        shared=event.adapter_mode == "shared",
        attached=event.attach,
        engine=event.engine,
    )
