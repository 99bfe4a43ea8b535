"""A channel that scales to zero (request `idle`): its own endpoint of inference components with managed
instance scaling, one stable component clients name, and the scaling (aws/autoscaling/idle_scaling) that puts the
copies to 0 after the idle period and wakes them on the first invocation that finds none.

- Created: the idle policy is decided first (serving/idle_plan: the region, the price, the wake time);
  where the region refuses MinInstanceCount 0 -- known, or refused at CreateEndpointConfig, which bills
  nothing -- the channel is created always-on the usual way, its record saying why.
- Promoted: the channel is woken for the gate (the champion answers the same cases live: recorded answers
  would not show a changed engine or sampling), then UpdateInferenceComponent moves the one component onto
  the candidate's model; the component's name, its scaling and the clients' target do not change.
- Rolled back: the same update back onto the kept version's model. Closed: scaling, component, endpoint.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from modeldrop.aws.autoscaling import idle_scaling
from modeldrop.aws.sagemaker.inference_components import describe
from modeldrop.aws.sagemaker.sagemaker_resources import DEPLOYMENT_TAG, MANAGED_BY_TAG, describe_endpoint, list_tags
from modeldrop.contracts import clock
from modeldrop.contracts.channel import ChannelIdle, ChannelRecord, ChannelVersion
from modeldrop.contracts.errors import ChannelInvalid, PromotionFailed
from modeldrop.contracts.record import DeploymentRecord
from modeldrop.pipeline.channels.channel_context import CHANNEL_TAG, TRANSITIONAL, ChannelContext
from modeldrop.pipeline.channels.channel_context import now_iso as _now
from modeldrop.serving.idle_plan import IdleDecision, decide, refusal_message, refused_at_create
from modeldrop.serving.memory_plan import hourly_price, instance

DEFAULT_STARTUP_SECONDS = 600
# How long a close waits for the component to go before the endpoint can: then it is left to the next close.
CLOSE_WAIT_SECONDS = 300


def _variant(ctx: ChannelContext, version: ChannelVersion) -> dict[str, Any]:
    variants = ctx.sm.describe_endpoint_config(EndpointConfigName=version.endpoint_config)["ProductionVariants"]
    return dict(variants[0])


def decide_for(
    ctx: ChannelContext, version: ChannelVersion, record: DeploymentRecord, after_seconds: int
) -> IdleDecision:
    """The idle policy for a channel created from VERSION: its region, type, price and wake time."""
    variant = _variant(ctx, version)
    region = ctx.sm.meta.region_name
    instance_type = str(variant.get("InstanceType") or record.instance_type)
    startup = int(variant.get("ModelDataDownloadTimeoutInSeconds") or 0) + int(
        variant.get("ContainerStartupHealthCheckTimeoutInSeconds") or 0
    )
    price = hourly_price(instance_type, region)
    return decide(after_seconds, region, instance_type, max(1, record.instance_count), price,
                  startup or DEFAULT_STARTUP_SECONDS, also_refusing=ctx.refusing_regions)  # fmt: skip


def as_record(decision: IdleDecision, component: str | None = None, config: str | None = None) -> ChannelIdle:
    return ChannelIdle(
        **decision.model_dump(exclude={"model_config"}), component=component, endpoint_config=config, since=_now()
    )


def create_endpoint(ctx: ChannelContext, channel: ChannelRecord, version: ChannelVersion, record: DeploymentRecord,
                    decision: IdleDecision) -> ChannelIdle:  # fmt: skip
    """The channel's endpoint of components: its config (MinInstanceCount 0) and the endpoint; the
    component is created once the endpoint is InService (check_creating). A region refusing 0 at
    CreateEndpointConfig gives back an always-on decision and creates nothing."""
    config = f"{channel.endpoint_name}-ic"
    variant = _variant(ctx, version)
    model = ctx.sm.describe_model(ModelName=version.models[0])
    tags = [{"Key": MANAGED_BY_TAG, "Value": ctx.stack_tag}, {"Key": CHANNEL_TAG, "Value": channel.name},
            {"Key": DEPLOYMENT_TAG, "Value": record.deployment_id}]  # fmt: skip
    try:
        ctx.sm.create_endpoint_config(
            EndpointConfigName=config,
            ProductionVariants=[idle_scaling.idle_variant(decision.instance_type, decision.max_instances, variant)],  # type: ignore[list-item]
            ExecutionRoleArn=str(model["ExecutionRoleArn"]),
            Tags=tags,  # type: ignore[arg-type]
        )
    except ClientError as exc:
        message = str(exc.response.get("Error", {}).get("Message", ""))
        if refusal_message().lower() in message.lower():
            return as_record(refused_at_create(decision, message))
        raise
    try:
        ctx.sm.create_endpoint(EndpointName=channel.endpoint_name, EndpointConfigName=config, Tags=tags)  # type: ignore[arg-type]
    except ClientError:
        ctx.sm.delete_endpoint_config(EndpointConfigName=config)  # made by this call: it goes with the refusal
        raise
    return as_record(decision, component=channel.endpoint_name, config=config)


def _ours(ctx: ChannelContext, channel: ChannelRecord, arn: str) -> bool:
    """Whether ARN is tagged as this stack's channel of that name (a name alone proves nothing)."""
    tags = list_tags(ctx.sm, arn)
    return tags.get(CHANNEL_TAG) == channel.name and tags.get(MANAGED_BY_TAG) == ctx.stack_tag


def _spec(ctx: ChannelContext, version: ChannelVersion, channel: ChannelRecord) -> dict[str, Any]:
    variant = _variant(ctx, version)
    spec_of = instance(str(variant.get("InstanceType"))) or {}
    keys = ("ModelDataDownloadTimeoutInSeconds", "ContainerStartupHealthCheckTimeoutInSeconds")
    startup = {k: int(variant[k]) for k in keys if variant.get(k)}
    memory = int(float(spec_of.get("ram_gib") or 16) * 1024 * 0.8)
    return idle_scaling.component_spec(version.models[0], int(spec_of.get("gpus") or 1), memory, startup)


def check(ctx: ChannelContext, channel: ChannelRecord) -> tuple[str, str | None]:
    """One look at a pending change of a scaled channel: ("moving", None), ("done", None) or
    ("failed", why). A channel being created gets its component, then its scaling, as the endpoint allows;
    a refusal of either is the change's failure (its caller undoes what was created)."""
    try:
        state, problem = _check(ctx, channel)
    except ClientError as exc:
        error = exc.response.get("Error", {})
        state, problem = (
            "failed",
            f"channel {channel.name}: {exc.operation_name} refused: {error.get('Code')}: {error.get('Message')}",
        )
    updating = channel.candidate is not None and channel.candidate.phase != "creating"
    if state != "moving" and updating and ctx.autoscaling is not None and channel.idle and channel.idle.component:
        idle_scaling.suspend_scale_in(ctx.autoscaling, channel.idle.component, False)  # the update is over
    return state, problem


def _check(ctx: ChannelContext, channel: ChannelRecord) -> tuple[str, str | None]:
    pending, idle = channel.candidate, channel.idle
    assert pending is not None and idle is not None and idle.component is not None
    version = pending.version
    desc = describe_endpoint(ctx.sm, channel.endpoint_name)
    if desc is None:
        return "failed", f"channel {channel.name}'s endpoint {channel.endpoint_name} is gone"
    if desc["EndpointStatus"] in TRANSITIONAL:
        return "moving", None
    if desc["EndpointStatus"] != "InService":
        return "failed", f"channel {channel.name}'s endpoint is {desc['EndpointStatus']}: {desc.get('FailureReason')}"
    component = describe(ctx.sm, idle.component)
    if component is None and pending.phase == "creating":
        try:
            _create_component(ctx, channel, version, idle.component)
        except ClientError as exc:  # a twin check created it first: it is read back (and its tags) next time
            if "already existing" not in str(exc.response.get("Error", {}).get("Message", "")):
                raise
        return "moving", None
    if component is None:
        return "failed", f"channel {channel.name}'s component {idle.component} is gone"
    if not _ours(ctx, channel, str(component["InferenceComponentArn"])):
        return "failed", f"component {idle.component} is not channel {channel.name}'s (its tags say otherwise)"
    status = component.get("InferenceComponentStatus")
    if status in ("Creating", "Updating"):
        return "moving", None
    serving = (component.get("Specification") or {}).get("ModelName")
    if status != "InService" or serving != version.models[0]:
        why = component.get("FailureReason") or f"it is {status} on model {serving}, not {version.models[0]}"
        return "failed", f"channel {channel.name}'s component still serves {serving}: {why}"
    if ctx.autoscaling is not None and pending.phase == "creating":
        idle_scaling.put_idle_scaling(ctx.autoscaling, ctx.cloudwatch, idle.component, idle.after_seconds,
                                      idle.max_instances)  # fmt: skip
    return "done", None


def _create_component(ctx: ChannelContext, channel: ChannelRecord, version: ChannelVersion, name: str) -> None:
    ctx.sm.create_inference_component(
        InferenceComponentName=name, EndpointName=channel.endpoint_name, VariantName="AllTraffic",
        Specification=_spec(ctx, version, channel), RuntimeConfig={"CopyCount": 1},  # type: ignore[arg-type]
        Tags=[{"Key": MANAGED_BY_TAG, "Value": ctx.stack_tag}, {"Key": CHANNEL_TAG, "Value": channel.name},
              {"Key": DEPLOYMENT_TAG, "Value": version.deployment_id}],
    )  # fmt: skip


def start_update(ctx: ChannelContext, channel: ChannelRecord, version: ChannelVersion) -> None:
    """The channel's one component onto VERSION's model (its name, scaling and clients unchanged)."""
    assert channel.idle is not None and channel.idle.component is not None
    if ctx.autoscaling is not None:  # the idle alarm may not take the copies away under the update
        idle_scaling.suspend_scale_in(ctx.autoscaling, channel.idle.component, True)
    try:
        copies = ctx.sm.describe_inference_component(InferenceComponentName=channel.idle.component).get(
            "RuntimeConfig", {}).get("DesiredCopyCount", 1)  # fmt: skip
        policy = idle_scaling.update_policy(2 * channel.idle.wake_seconds, int(copies))
        ctx.sm.update_inference_component(
            InferenceComponentName=channel.idle.component,
            Specification=_spec(ctx, version, channel),  # type: ignore[arg-type]
            **({"DeploymentConfig": policy} if policy else {}),  # type: ignore[arg-type]
        )
    except ClientError as exc:
        if ctx.autoscaling is not None:
            idle_scaling.suspend_scale_in(ctx.autoscaling, channel.idle.component, False)
        error = exc.response.get("Error", {})
        raise PromotionFailed(
            f"SageMaker refused to update channel {channel.name}'s component: "
            f"{error.get('Code')}: {error.get('Message')}"
        ) from None


def switch(ctx: ChannelContext, channel: ChannelRecord, version: ChannelVersion) -> None:
    """A rollback's update onto VERSION, waited for here (the claim's candidate is VERSION)."""
    wake(ctx, channel)
    start_update(ctx, channel, version)
    pause = 2.0
    while True:
        state, problem = check(ctx, channel)
        if state == "done":
            return
        if state == "failed":
            raise PromotionFailed(str(problem))
        clock.sleep(pause)
        pause = min(pause * 2, 30.0)


class Waking(Exception):
    """The channel sleeps: it was knocked on (an invocation it refused, which its wake alarm counts) and
    is being woken; look again in WAIT seconds, for at most its wake time."""

    def __init__(self, channel: ChannelRecord) -> None:
        super().__init__(f"channel {channel.name} is asleep: being woken for the gate")
        self.wake_seconds = channel.idle.wake_seconds if channel.idle else 0


KNOCK = b'{"messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}'


def knock(ctx: ChannelContext, channel: ChannelRecord) -> bool:
    """True when the channel's copy runs; else one invocation it refuses for no capacity -- the way a
    client wakes it, and one the idle alarm counts as activity (a copy count set by hand would be undone
    by the idle alarm at its next minute)."""
    from modeldrop.serving.idle_plan import is_waking_error

    assert channel.idle is not None and channel.idle.component is not None
    if idle_scaling.copies(ctx.sm, channel.idle.component)[1] >= 1:
        return True
    if ctx.runtime is None:
        return False
    try:
        ctx.runtime.invoke_endpoint(Body=KNOCK, ContentType="application/json", **channel.invoke_target())
    except ClientError as exc:
        error = exc.response.get("Error", {})
        if not is_waking_error(str(error.get("Code")), str(error.get("Message"))):
            raise PromotionFailed(
                f"channel {channel.name} refused the gate's wake-up call: {error.get('Message')}"
            ) from None
        return False
    return True


def wake(ctx: ChannelContext, channel: ChannelRecord) -> float:
    """The channel's copy running, knocking until it answers, waiting up to its wake time (a CLI's own
    wait; the state machine looks again between its waits instead); the seconds waited."""
    assert channel.idle is not None
    started, pause = clock.utcnow(), 5.0
    while not knock(ctx, channel):
        waited = (clock.utcnow() - started).total_seconds()
        if waited > channel.idle.wake_seconds:
            raise PromotionFailed(
                f"channel {channel.name} did not wake within {channel.idle.wake_seconds} s",
                "the champion still serves; try again once it answers",
            )
        clock.sleep(pause)
        pause = min(pause * 2, 30.0)
    return round((clock.utcnow() - started).total_seconds(), 1)


def close(ctx: ChannelContext, channel: ChannelRecord) -> list[str]:
    """Scaling, component, endpoint and its config: the endpoint only once the component is gone."""
    idle = channel.idle
    if idle is None or idle.component is None:
        return []
    deleted: list[str] = []
    found = describe(ctx.sm, idle.component)
    if found is not None and not _ours(ctx, channel, str(found["InferenceComponentArn"])):
        raise ChannelInvalid(
            f"component {idle.component} is not channel {channel.name}'s: left alone, with its scaling",
            "delete it by hand if it is stale, then close the channel again",
        )
    if ctx.autoscaling is not None:
        deleted += idle_scaling.remove_idle_scaling(ctx.autoscaling, ctx.cloudwatch, idle.component)
    if found is not None:
        ctx.sm.delete_inference_component(InferenceComponentName=idle.component)
        deleted.append(f"inference-component/{idle.component}")
        waited, pause = 0.0, 1.0
        while describe(ctx.sm, idle.component) is not None:
            if waited > CLOSE_WAIT_SECONDS:  # within a Lambda's time: the close is finished by a later one
                raise ChannelInvalid(
                    f"component {idle.component} is still being deleted", "close the channel again later"
                )
            clock.sleep(pause)
            waited, pause = waited + pause, min(pause * 2, 30.0)
    return deleted


def delete_config(ctx: ChannelContext, channel: ChannelRecord) -> list[str]:
    config = channel.idle.endpoint_config if channel.idle else None
    if not config:
        return []
    try:
        arn = ctx.sm.describe_endpoint_config(EndpointConfigName=config)["EndpointConfigArn"]
        if not _ours(ctx, channel, arn):
            return []
        ctx.sm.delete_endpoint_config(EndpointConfigName=config)
    except ClientError:
        return []
    return [f"endpoint-config/{config}"]
