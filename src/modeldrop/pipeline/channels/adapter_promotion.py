"""Adapter channels: the cheapest safe promotion. A channel made from a shared deployment serves one
LoRA adapter as an inference component on that deployment's running base; a candidate is another
adapter attached to the same base (`base_endpoint`), so promoting it creates no endpoint and touches
no base: the channel's record switches its clients to the candidate's component by name, after the
component is read back InService on the channel's base with the candidate's artifact. The replaced
component stays for a rollback until its grace period ends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from botocore.exceptions import ClientError

from modeldrop.aws.sagemaker.inference_components import describe
from modeldrop.aws.sagemaker.sagemaker_resources import DEPLOYMENT_TAG, list_tags
from modeldrop.contracts.channel import ChannelRecord, ChannelVersion
from modeldrop.contracts.errors import ChannelInvalid, PromotionFailed
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.pipeline.adapters.component_steps import adapter_components

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient


def is_adapter_deployment(record: DeploymentRecord) -> bool:
    """RECORD serves adapters as inference components (shared mode, or attached to a shared base)."""
    return bool(adapter_components(record))


def base_of(record: DeploymentRecord) -> str:
    """The shared deployment whose base RECORD's adapters run on (itself, unless attached)."""
    return str(record.step_dict("create_endpoint").get("attached_to") or record.deployment_id)


def adapter_version(sm: SageMakerClient, record: DeploymentRecord) -> ChannelVersion:
    """The one adapter component RECORD serves, InService, as a channel version."""
    if record.status != "succeeded" or not record.endpoint_name:
        raise ChannelInvalid(f"deployment {record.deployment_id} is {record.status}: only a succeeded one is promoted")
    removed = {str(e.get("component")) for e in record.step("adapters_removed") or [] if isinstance(e, dict)}
    serving = [a for a in adapter_components(record) if str(a.get("component")) not in removed]
    if len(serving) != 1:
        raise ChannelInvalid(
            f"deployment {record.deployment_id} serves {len(serving)} adapter components: a channel serves one",
            "deploy the adapter on its own (`base_endpoint` on the channel's base) to promote it",
        )
    component = str(serving[0]["component"])
    desc = describe(sm, component)
    if desc is None or desc.get("InferenceComponentStatus") != "InService":
        state = desc.get("InferenceComponentStatus") if desc else "gone"
        raise ChannelInvalid(f"deployment {record.deployment_id}'s component {component} is {state}, not InService")
    return ChannelVersion(
        deployment_id=record.deployment_id,
        component=component,
        adapter=str(serving[0].get("adapter") or component),
        artifact_uri=str(record.artifact_uri) if record.artifact_uri else None,
    )


def check_candidate(channel: ChannelRecord, record: DeploymentRecord, adapter: bool) -> None:
    """A candidate takes the channel's own path: an adapter on its base, or a checkpoint on its endpoint."""
    if channel.adapter_only and not adapter:
        raise ChannelInvalid(
            f"channel {channel.name} serves adapters on {channel.base_deployment}'s base; "
            f"{record.deployment_id} is no adapter on it",
            f"deploy the adapter with base_endpoint {channel.base_deployment}, then promote that deployment",
        )
    if not channel.adapter_only and adapter:
        raise ChannelInvalid(
            f"channel {channel.name} serves whole checkpoints on {channel.endpoint_name}; "
            f"{record.deployment_id} is an adapter component",
            "promote it to an adapter channel of its own, or deploy the merged checkpoint",
        )
    if adapter and base_of(record) != channel.base_deployment:
        raise ChannelInvalid(
            f"{record.deployment_id}'s adapter runs on {base_of(record)}'s base, not on channel {channel.name}'s "
            f"({channel.base_deployment})",
            f"deploy the adapter with base_endpoint {channel.base_deployment}: an adapter-only promotion needs no "
            "new endpoint only on the base that serves",
        )


def verify_component(sm: SageMakerClient, channel: ChannelRecord, version: ChannelVersion) -> None:
    """Read the candidate's component back before clients are sent to it: InService, on the channel's
    endpoint and base component, and still its deployment's (tags) -- else the switch is refused."""
    component = str(version.component)
    try:
        desc = describe(sm, component)
    except ClientError as exc:
        raise PromotionFailed(f"component {component} could not be read back: {exc}") from None
    if desc is None:
        raise PromotionFailed(f"component {component} is gone: the channel still serves its version")
    problems = []
    if desc.get("InferenceComponentStatus") != "InService":
        problems.append(f"it is {desc.get('InferenceComponentStatus')}")
    if desc.get("EndpointName") != channel.endpoint_name:
        problems.append(f"it runs on {desc.get('EndpointName')}, not {channel.endpoint_name}")
    base = (desc.get("Specification") or {}).get("BaseInferenceComponentName")
    live_base = _live_base(sm, channel)
    if live_base is not None and base != live_base:
        problems.append(f"its base component is {base}, not the channel's {live_base}")
    if list_tags(sm, str(desc["InferenceComponentArn"])).get(DEPLOYMENT_TAG) != version.deployment_id:
        problems.append(f"it is not tagged for {version.deployment_id}")
    if problems:
        raise PromotionFailed(f"component {component} was not switched to: {'; '.join(problems)}")


def _live_base(sm: SageMakerClient, channel: ChannelRecord) -> str | None:
    if channel.live is None or not channel.live.component:
        return None
    desc = describe(sm, channel.live.component)
    base = (desc or {}).get("Specification", {}).get("BaseInferenceComponentName")
    return str(base) if base else None
