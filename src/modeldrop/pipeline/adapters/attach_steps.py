"""adapter_mode shared on another deployment's base endpoint (`base_endpoint`): the adapters become
further adapter components of a live shared deployment, validated against its served base, with
their own record, claim, eval, teardown and TTL; the endpoint, its base component and its bill stay
the other deployment's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.sagemaker.inference_components import on_endpoint
from modeldrop.aws.sagemaker.sagemaker_resources import DEPLOYMENT_TAG, describe_endpoint, list_tags
from modeldrop.contracts.errors import PlanRefused, RequestInvalid
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.contracts.served import AdapterInfo
from modeldrop.contracts.step_payloads import AttachedBase, EnginePlan
from modeldrop.serving.engine_env import KEYS, engine_of_env

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
    held = None
    if sm is not None:  # the adapter components on the endpoint now: the slots attachments may take
        held = sum(
            1 for c in on_endpoint(sm, str(record.endpoint_name)) if c["InferenceComponentName"] != components["base"]
        )
    return AttachedBase(
        deployment_id=record.deployment_id,
        endpoint_name=str(record.endpoint_name),
        base_component=str(components["base"]),
        model_name=str(components["model_name"]),
        served_uri=str(record.served_uri),
        instance_type=record.instance_type,
        adapters_on_endpoint=held,
    )


def _check_lora_room(plan: EnginePlan, attached: AttachedBase, adapters: list[AdapterInfo]) -> None:
    env = plan.env
    engine = engine_of_env(env) or "lmi"
    rank_key, slots_key = KEYS[engine]["max_lora_rank"], KEYS[engine]["max_loras"]
    max_rank = int(env[rank_key]) if env.get(rank_key, "").isdigit() else None
    too_wide = [a for a in adapters if max_rank is not None and a.max_rank > max_rank]
    if too_wide:
        widest = max(too_wide, key=lambda a: a.max_rank)
        raise PlanRefused(
            f"adapter {widest.name} has LoRA rank {widest.max_rank}, over the max_lora_rank {max_rank} the base "
            f"endpoint {attached.endpoint_name} was planned and started with ({rank_key}): its engine would refuse "
            "it at load; nothing was created",
            f"train at rank <= {max_rank}, or deploy the base anew with this adapter (adapter_mode shared) so the "
            "plan sizes its slots",
        )
    slots = int(env[slots_key]) if env.get(slots_key, "").isdigit() else None
    if slots is None:
        return
    if attached.adapters_on_endpoint is None:
        return
    held = attached.adapters_on_endpoint + len(adapters)
    if held > slots:
        raise PlanRefused(
            f"the base endpoint {attached.endpoint_name} has {slots} LoRA slot(s) ({slots_key}); with these "
            f"{len(adapters)} adapter(s) it would hold {held}: nothing was created",
            "tear an attached adapter down first (modeldrop teardown ID --adapter NAME), or deploy a base with more",
        )


def attached_plan(
    registry: Registry, req: NormalizedRequest, attached: AttachedBase, adapters: list[AdapterInfo] | None = None
) -> EnginePlan:
    """The base deployment's own plan (its endpoint already runs it), recorded for this deployment;
    ADAPTERS must fit the LoRA rank and slots that plan gave its engine (vLLM refuses a larger rank
    at load: "LoRA rank 64 is greater than max_lora_rank 8"), checked before any component exists."""
    base = registry.get(attached.deployment_id)
    recorded = base.step_dict("build_env") if isinstance(base, DeploymentRecord) else {}
    if not recorded:
        raise RequestInvalid(f"{attached.deployment_id} has no recorded plan to attach adapters to")
    plan = EnginePlan.model_validate(recorded).model_copy(update={"attached": attached, "attempt": 0})
    _check_lora_room(plan, attached, adapters or [])
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
