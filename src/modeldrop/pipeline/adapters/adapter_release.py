"""One adapter inference component of a deployment released, and the record told: what tearing
down one adapter (`teardown --adapter`) and retiring a channel's adapter version share. Light on
imports: the reaper runs it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.sagemaker import inference_components as components
from modeldrop.contracts import clock
from modeldrop.contracts.record import DeploymentRecord

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient


def release_adapter_component(
    sm: SageMakerClient, registry: Registry, record: DeploymentRecord, adapter: str, component: str
) -> components.Released:
    """Delete RECORD's own COMPONENT (never another deployment's) and, when it went, say so in the record."""
    released = components.release(sm, str(record.endpoint_name), record.deployment_id, only=component)
    if released.deleted:
        removed = record.step("adapters_removed") or []
        entry = {"adapter": adapter, "component": component, "at": clock.iso(clock.utcnow())}
        registry.record(record.deployment_id, "adapters_removed", [*removed, entry])
    return released
