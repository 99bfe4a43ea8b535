"""adapter_mode shared on another deployment's base endpoint (`base_endpoint`): the adapters become
further adapter components of a live shared deployment, validated against its served base, with
their own record, claim, eval, teardown and TTL; the endpoint, its base component and its bill stay
the other deployment's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from modeldrop.aws.registry import Registry
from modeldrop.aws.sagemaker_resources import DEPLOYMENT_TAG, describe_endpoint, list_tags
from modeldrop.contracts.errors import RequestInvalid
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.contracts.step_payloads import AttachedBase, EnginePlan

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient


def resolve_base(registry: Registry, sm: SageMakerClient | None, name: str) -> AttachedBase:
    """The live shared deployment NAME means (its id, or the endpoint its tags say it owns)."""
    record = registry.get(name)
    if record is None and sm is not None:
        desc = describe_endpoint(sm, name)
        owner = list_tags(sm, desc["EndpointArn"]).get(DEPLOYMENT_TAG) if desc else None
        record = registry.get(owner) if owner else None
    components = record.step_dict("create_endpoint").get("components") if record else None
    if record is None or not components:
        raise RequestInvalid(
            f"base_endpoint {name!r} is no shared deployment of this stack",
            "name the deployment id or endpoint of a deployment made with adapter_mode shared (`modeldrop list`)",
        )
    if record.status != "succeeded" or record.ended_at is not None or record.served_uri is None:
        raise RequestInvalid(
            f"base_endpoint {name!r} ({record.deployment_id}) is {record.status}, not serving",
            "attach adapters to a shared deployment that succeeded and is still up",
        )
    return AttachedBase(
        deployment_id=record.deployment_id,
        endpoint_name=str(record.endpoint_name),
        base_component=str(components["base"]),
        model_name=str(components["model_name"]),
        served_uri=str(record.served_uri),
        instance_type=record.instance_type,
    )


def attached_plan(registry: Registry, req: NormalizedRequest, attached: AttachedBase) -> EnginePlan:
    """The base deployment's own plan (its endpoint already runs it), recorded for this deployment."""
    base = registry.get(attached.deployment_id)
    recorded = base.step_dict("build_env") if isinstance(base, DeploymentRecord) else {}
    if not recorded:
        raise RequestInvalid(f"{attached.deployment_id} has no recorded plan to attach adapters to")
    plan = EnginePlan.model_validate(recorded).model_copy(update={"attached": attached, "attempt": 0})
    plan.warnings.append(
        f"adapter components on {attached.endpoint_name}, the base endpoint of {attached.deployment_id}: its "
        "instance, image and env are that deployment's, and so is its bill"
    )
    registry.record(
        req.deployment_id,
        "build_env",
        plan.model_dump(mode="json"),
        attempt=0,
        status="planned",
        owner=req.execution_arn,
        live=True,
        instance_type=plan.instance_type,
    )
    return plan
