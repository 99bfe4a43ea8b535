"""adapter_mode shared: what the endpoint's inference components are (the base's model and compute,
one adapter component per validated adapter), and tearing one adapter down while the rest serve."""

from __future__ import annotations

from typing import TYPE_CHECKING

from modeldrop.aws.dynamodb.registry import Registry
from modeldrop.aws.sagemaker import inference_components as components
from modeldrop.contracts.artifact import Artifact
from modeldrop.contracts.errors import RequestInvalid
from modeldrop.contracts.models import NormalizedRequest
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.contracts.step_payloads import AdapterComponent, ComponentPlan, EnginePlan
from modeldrop.pipeline.adapters.adapter_release import release_adapter_component
from modeldrop.pipeline.adapters.adapter_steps import SHARED_DIR
from modeldrop.serving.memory_plan import instance

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker.type_defs import TagTypeDef

# The base component asks for this share of the instance's memory (the rest is SageMaker's and the OS's).
HOST_MEMORY_SHARE = 0.5


def component_plan(
    req: NormalizedRequest,
    plan: EnginePlan,
    endpoint: str,
    model_name: str,
    served: Artifact | None,
    tags: list[TagTypeDef],
    own: bool = False,
) -> ComponentPlan | None:
    """The components a shared deployment puts on ENDPOINT: the base (named as the endpoint; component
    names are their own namespace) on every GPU of the instance, and one adapter component per adapter,
    given the .tar.gz that validation packed from the validated files."""
    if req.adapter_mode != "shared" or req.adapter_name is None or served is None:
        return None
    spec = instance(plan.instance_type) or {}
    names = [req.adapter_name, *(a.name for a in req.more_adapters)]
    return ComponentPlan(
        base=endpoint,
        model_name=model_name,
        accelerators=int(spec.get("gpus", 1)),
        memory_mb=int(float(spec.get("ram_gib", 16)) * 1024 * HOST_MEMORY_SHARE),
        copies=req.instance_count,
        download_timeout_seconds=plan.download_timeout_seconds,
        startup_timeout_seconds=plan.startup_timeout_seconds,
        adapters=[
            AdapterComponent(
                # On another deployment's endpoint (OWN components): the deployment's id keeps names apart.
                component=components.component_name(endpoint, f"{name}-{req.deployment_id[-6:]}" if own else name),
                adapter=name,
                artifact_url=f"s3://{served.bucket}/{served.key}{SHARED_DIR}/{name}.tar.gz",
            )
            for name in names
        ],
        tags=[{"Key": t["Key"], "Value": t["Value"]} for t in tags],
    )


def adapter_components(record: DeploymentRecord) -> list[dict[str, str]]:
    """The adapter components a deployment created (from its create step)."""
    plan = record.step_dict("create_endpoint").get("components") or {}
    return [a for a in plan.get("adapters", []) if isinstance(a, dict)]


def adapter_shares(record: DeploymentRecord) -> list[dict[str, object]]:
    """Each adapter component a shared deployment created: whether it still serves, and its share of
    the base endpoint's cost so far (the endpoint's cost split among the adapters it served)."""
    known = adapter_components(record)
    removed = {str(e.get("component")) for e in record.step("adapters_removed") or [] if isinstance(e, dict)}
    cost = record.cost_so_far()
    share = round(cost / len(known), 4) if known and cost is not None else None
    return [
        {
            "adapter": a.get("adapter"),
            "component": a.get("component"),
            "serving": str(a.get("component")) not in removed and record.status in ("creating", "succeeded"),
            "cost_share_usd": share,
        }
        for a in known
    ]


def teardown_adapter(sm: SageMakerClient, registry: Registry, record: DeploymentRecord, adapter: str) -> list[str]:
    """Delete one adapter's component (by the adapter's name or the component's); the base and the
    other adapters go on serving. Only this deployment's component is ever deleted."""
    known = adapter_components(record)
    match = [a for a in known if adapter in (a.get("adapter"), a.get("component"))]
    if not match:
        names = ", ".join(str(a.get("adapter")) for a in known) or "none"
        raise RequestInvalid(
            f"{record.deployment_id} serves no adapter {adapter!r} as an inference component (its adapters: {names})",
            "name one of its adapters, or tear the whole deployment down",
        )
    component = str(match[0]["component"])
    released = release_adapter_component(sm, registry, record, str(match[0].get("adapter")), component)
    if released.failed:
        raise RequestInvalid(f"could not delete {component}: {'; '.join(released.failed)}")
    if not released.deleted:
        raise RequestInvalid(
            f"the adapter {adapter!r} of {record.deployment_id} is no longer served ({component} is gone or going)",
            "`modeldrop status` shows what the deployment still serves",
        )
    return released.deleted
