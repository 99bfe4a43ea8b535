"""Scale to zero in the emulator, held to AWS: managed instance scaling on the endpoint config, Application
Auto Scaling on a component's copies (moto alone accepts none of it, or anything), the idle alarm scaling
the copies and the instances to zero on the emulator's clock, an invocation refused while nothing runs and
counted, and the wake alarm bringing a copy back."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from modeldrop.aws.autoscaling import idle_scaling
from modeldrop.aws.s3.checkpoint_upload import upload_directory
from modeldrop.contracts import clock
from modeldrop.local.samples.checkpoint import write_checkpoint
from modeldrop.serving.idle_plan import is_waking_error

ROLE = "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.36.0-lmi18.0.0-cu128"
PROBE = json.dumps({"inputs": "Say hello.", "parameters": {"max_new_tokens": 4}}).encode()
SCALING = {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 1}


def _refused(call: Any, code: str = "ValidationException", **kwargs: Any) -> str:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    error = info.value.response["Error"]
    assert error["Code"] == code, error
    return str(error["Message"])


def _variant(**extra: Any) -> dict[str, Any]:
    return {"VariantName": "AllTraffic", "InitialInstanceCount": 1, "InstanceType": "ml.g6.2xlarge", **extra}


def _in_service(sm: Any, component: str) -> dict[str, Any]:
    for _ in range(400):
        desc = sm.describe_inference_component(InferenceComponentName=component)
        if desc["InferenceComponentStatus"] not in ("Creating", "Updating"):
            return dict(desc)
    raise AssertionError(f"{component} still moving")


def _component_endpoint(stack: Any, tmp_path: Path, name: str, scaling: dict[str, Any] = SCALING) -> str:
    sm, s3 = stack.client("sagemaker"), stack.client("s3")
    upload_directory(s3, write_checkpoint(tmp_path / name), stack.bucket, f"served-{name}/", marker=False)
    source = {"S3Uri": f"s3://{stack.bucket}/served-{name}/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    sm.create_model(ModelName=f"{name}-model", ExecutionRoleArn=ROLE,
                    PrimaryContainer={"Image": IMAGE, "ModelDataSource": {"S3DataSource": source}})  # fmt: skip
    sm.create_endpoint_config(EndpointConfigName=name, ExecutionRoleArn=ROLE,
                              ProductionVariants=[_variant(ManagedInstanceScaling=scaling)])  # fmt: skip
    sm.create_endpoint(EndpointName=name, EndpointConfigName=name)
    for _ in range(200):
        if sm.describe_endpoint(EndpointName=name)["EndpointStatus"] != "Creating":
            break
    sm.create_inference_component(
        InferenceComponentName=f"{name}-ic", EndpointName=name, VariantName="AllTraffic",
        Specification=idle_scaling.component_spec(f"{name}-model", 1, 1024, {}), RuntimeConfig={"CopyCount": 1},
    )  # fmt: skip
    assert _in_service(sm, f"{name}-ic")["InferenceComponentStatus"] == "InService"
    return f"{name}-ic"


def test_managed_instance_scaling_is_refused_as_sagemaker_refuses_it(stack: Any) -> None:
    sm = stack.client("sagemaker")
    create = sm.create_endpoint_config
    model_variant = _variant(ModelName="m", ManagedInstanceScaling=SCALING)
    assert "inference components" in _refused(create, EndpointConfigName="a", ProductionVariants=[model_variant])
    backwards = _variant(ManagedInstanceScaling={"Status": "ENABLED", "MinInstanceCount": 2, "MaxInstanceCount": 1})
    assert "greater than" in _refused(create, EndpointConfigName="b", ProductionVariants=[backwards],
                                      ExecutionRoleArn=ROLE)  # fmt: skip
    no_bounds = _variant(ManagedInstanceScaling={"Status": "ENABLED"})
    assert "MinInstanceCount and MaxInstanceCount" in _refused(
        create, EndpointConfigName="c", ProductionVariants=[no_bounds], ExecutionRoleArn=ROLE
    )
    create(EndpointConfigName="d", ProductionVariants=[_variant(ManagedInstanceScaling=SCALING)], ExecutionRoleArn=ROLE)
    # A region that refuses scale to zero (eu-west-3, as users report it) says so at CreateEndpointConfig.
    paris = boto3.client("sagemaker", region_name="eu-west-3")
    to_zero = [_variant(ManagedInstanceScaling=SCALING)]
    assert "greater than 0" in _refused(
        paris.create_endpoint_config, EndpointConfigName="e", ProductionVariants=to_zero, ExecutionRoleArn=ROLE
    )


def test_application_auto_scaling_of_copies_is_as_strict_as_aws(stack: Any, tmp_path: Path) -> None:
    component = _component_endpoint(stack, tmp_path, "strict")
    aas = stack.client("application-autoscaling")
    register = aas.register_scalable_target
    target = {"ServiceNamespace": "sagemaker", "ScalableDimension": idle_scaling.DIMENSION}
    assert "does not exist" in _refused(register, ResourceId="inference-component/nope", MinCapacity=0,
                                        MaxCapacity=1, **target)  # fmt: skip
    assert "required" in _refused(register, ResourceId=idle_scaling.resource_id(component), **target)
    assert "greater than" in _refused(register, ResourceId=idle_scaling.resource_id(component), MinCapacity=3,
                                      MaxCapacity=1, **target)  # fmt: skip
    assert "Unsupported" in _refused(register, ResourceId=f"endpoint/{component}", MinCapacity=0, MaxCapacity=1,
                                     **target)  # fmt: skip
    policy = {"PolicyName": "p", "ResourceId": idle_scaling.resource_id(component), **target}
    step = {
        "AdjustmentType": "ExactCapacity",
        "StepAdjustments": [{"MetricIntervalUpperBound": 0, "ScalingAdjustment": 0}],
    }
    assert "No scalable target" in _refused(aas.put_scaling_policy, PolicyType="StepScaling",
                                            StepScalingPolicyConfiguration=step, **policy)  # fmt: skip
    register(ResourceId=idle_scaling.resource_id(component), MinCapacity=0, MaxCapacity=1, **target)
    wrong_metric = {"TargetValue": 5.0, "PredefinedMetricSpecification": {
        "PredefinedMetricType": "SageMakerVariantInvocationsPerInstance"}}  # fmt: skip
    assert "not supported" in _refused(aas.put_scaling_policy, PolicyType="TargetTrackingScaling",
                                       TargetTrackingScalingPolicyConfiguration=wrong_metric, **policy)  # fmt: skip
    assert "StepAdjustments" in _refused(aas.put_scaling_policy, PolicyType="StepScaling",
                                         StepScalingPolicyConfiguration={"AdjustmentType": "ExactCapacity"},
                                         **policy)  # fmt: skip
    aas.put_scaling_policy(PolicyType="StepScaling", StepScalingPolicyConfiguration=step, **policy)
    # A component is created with a copy; only a runtime update (or its scaling) takes it to zero.
    sm = stack.client("sagemaker")
    spec = idle_scaling.component_spec("strict-model", 1, 1024, {})
    zero = {"InferenceComponentName": "strict-zero", "EndpointName": "strict", "VariantName": "AllTraffic",
            "Specification": spec, "RuntimeConfig": {"CopyCount": 0}}  # fmt: skip
    assert "CopyCount of at least 1" in _refused(sm.create_inference_component, **zero)
    update = sm.update_inference_component_runtime_config
    assert "Could not find" in _refused(update, InferenceComponentName="nope", DesiredRuntimeConfig={"CopyCount": 0})
    update(InferenceComponentName=component, DesiredRuntimeConfig={"CopyCount": 0})
    assert idle_scaling.copies(sm, component) == (0, 0)


def test_an_idle_component_scales_to_zero_refuses_and_wakes(stack: Any, tmp_path: Path) -> None:
    component = _component_endpoint(stack, tmp_path, "idle")
    sm, aas, cw = stack.client("sagemaker"), stack.client("application-autoscaling"), stack.client("cloudwatch")
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)
    idle_scaling.put_idle_scaling(aas, cw, component, after_seconds=600, max_instances=1)
    assert idle_scaling.arm_idle(cw, component)  # the reaper arms it once the channel is idle-old; here at once

    def invoke() -> dict[str, Any]:
        return dict(runtime.invoke_endpoint(EndpointName="idle", InferenceComponentName=component, Body=PROBE,
                                            ContentType="application/json"))  # fmt: skip

    invoke()
    clock.advance(300)
    invoke()  # within the idle period: still one copy
    clock.advance(300)
    assert idle_scaling.copies(sm, component) == (1, 1)
    clock.advance(360)  # ten whole minutes (periods) without an invocation
    assert idle_scaling.copies(sm, component) == (0, 0)
    variant = sm.describe_endpoint(EndpointName="idle")["ProductionVariants"][0]
    assert variant["CurrentInstanceCount"] == 0  # the instances follow the copies
    with pytest.raises(ClientError) as info:
        invoke()
    error = info.value.response["Error"]
    assert is_waking_error(error["Code"], error["Message"]), error
    clock.advance(61)  # the wake alarm's minute
    assert idle_scaling.copies(sm, component)[0] == 1
    with pytest.raises(ClientError):
        invoke()  # an instance is being provisioned: still no capacity
    clock.advance(300)  # provisioned: the container starts, as a client keeps retrying
    for _ in range(60):
        try:
            answered = invoke()
            break
        except ClientError as exc:
            assert is_waking_error(exc.response["Error"]["Code"], exc.response["Error"]["Message"])
            clock.sleep(5)
    else:
        raise AssertionError("never woke")
    assert answered["Body"].read()
    changes = idle_scaling.scaling_changes(aas, component)
    assert [count for _when, count in changes] == [0, 1]
    gone = idle_scaling.remove_idle_scaling(aas, cw, component)
    assert any(g.startswith("scalable-target/") for g in gone)
    assert cw.describe_alarms(AlarmNames=idle_scaling.alarm_names(component))["MetricAlarms"] == []


def test_a_close_leaves_a_component_that_is_not_the_channels_alone(stack: Any, tmp_path: Path) -> None:
    """A component under the channel's name but not tagged as its own (another stack's, a hand-made one)
    is neither deleted nor unscaled by closing the channel, nor taken for the channel's by its checks."""
    from modeldrop.contracts.channel import ChannelIdle, ChannelRecord
    from modeldrop.contracts.errors import ChannelInvalid
    from modeldrop.local.scenarios.channel import channel_context
    from modeldrop.pipeline.channels import idle_channel

    component = _component_endpoint(stack, tmp_path, "foreign")  # untagged: nobody's channel
    ctx = channel_context(stack)
    idle_scaling.put_idle_scaling(ctx.autoscaling, ctx.cloudwatch, component, 600, 1)  # type: ignore[arg-type]
    record = ChannelRecord(name="foreign", endpoint_name="foreign", idle=ChannelIdle(
        after_seconds=600, mode="scale_to_zero", component=component, endpoint_config="foreign"))  # fmt: skip
    with pytest.raises(ChannelInvalid):
        idle_channel.close(ctx, record)
    assert idle_scaling.copies(stack.client("sagemaker"), component) == (1, 1)
    assert ctx.cloudwatch.describe_alarms(AlarmNames=idle_scaling.alarm_names(component))["MetricAlarms"]
    assert idle_channel.delete_config(ctx, record) == []  # its endpoint config is not the channel's either


def _asleep_after(sm: Any, component: str, minutes: int) -> int:
    for minute in range(1, minutes + 1):
        clock.advance(60)
        if idle_scaling.copies(sm, component) == (0, 0):
            return minute
    raise AssertionError(f"{component} still has copies after {minutes} min")


def test_a_fresh_idle_channel_sleeps_only_once_armed_though_its_alarm_fires_at_once(stack: Any, tmp_path: Path) -> None:
    """CloudWatch reads the minutes before a never-called component existed as missing, which the FILLed
    sum makes 0: the idle alarm is in ALARM at its first minute. Created with its actions off, it is armed
    once the channel has existed its idle period."""
    component = _component_endpoint(stack, tmp_path, "fresh")
    sm, aas, cw = stack.client("sagemaker"), stack.client("application-autoscaling"), stack.client("cloudwatch")
    idle_scaling.put_idle_scaling(aas, cw, component, after_seconds=600, max_instances=1)
    clock.advance(300)  # half the idle period, never called
    assert idle_scaling.copies(sm, component) == (1, 1)
    idle_alarm = cw.describe_alarms(AlarmNames=[idle_scaling.alarm_names(component)[0]])["MetricAlarms"][0]
    assert idle_alarm["StateValue"] == "ALARM" and not idle_alarm["ActionsEnabled"]  # armed, it would act now
    clock.advance(300)
    assert idle_scaling.copies(sm, component) == (1, 1)
    assert idle_scaling.arm_idle(cw, component) and not idle_scaling.arm_idle(cw, component)
    idle_scaling.suspend_scale_in(aas, component, True)  # an update under way: the alarm's action is held
    clock.advance(180)
    assert idle_scaling.copies(sm, component) == (1, 1)
    idle_scaling.suspend_scale_in(aas, component, False)
    assert _asleep_after(sm, component, 2) == 1  # re-run at the next evaluation it is still in ALARM


def test_a_retrying_client_wakes_a_three_instance_channel_to_exactly_one_copy(stack: Any, tmp_path: Path) -> None:
    """CloudWatch re-runs the wake alarm's scaling action every minute it stays in ALARM, and the client is
    refused for minutes while an instance provisions: the wake policy sets one copy, it never adds one."""
    scaling = {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 4}
    component = _component_endpoint(stack, tmp_path, "busy", scaling)
    sm, aas, cw = stack.client("sagemaker"), stack.client("application-autoscaling"), stack.client("cloudwatch")
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)
    idle_scaling.put_idle_scaling(aas, cw, component, after_seconds=600, max_instances=3)
    assert idle_scaling.arm_idle(cw, component)
    _asleep_after(sm, component, 12)
    desired_seen = set()
    for _ in range(240):  # every 5 s for up to 20 minutes, as a client told to retry the waking error does
        try:
            runtime.invoke_endpoint(EndpointName="busy", InferenceComponentName=component, Body=PROBE,
                                    ContentType="application/json")  # fmt: skip
            break
        except ClientError as exc:
            assert is_waking_error(exc.response["Error"]["Code"], exc.response["Error"]["Message"])
        desired_seen.add(idle_scaling.copies(sm, component)[0])
        clock.advance(5)
    else:
        raise AssertionError("never woke")
    assert desired_seen <= {0, 1} and idle_scaling.copies(sm, component) == (1, 1)
    assert [count for _when, count in idle_scaling.scaling_changes(aas, component)] == [0, 1]


def test_a_quiet_multi_instance_channel_keeps_one_copy_until_its_idle_period(stack: Any, tmp_path: Path) -> None:
    """Target tracking with scale-in on a target whose minimum is 0 takes a quiet component to zero copies
    within minutes (the emulator evaluates it as AWS does); the channel's load policy only scales out."""
    scaling = {"Status": "ENABLED", "MinInstanceCount": 0, "MaxInstanceCount": 4}
    component = _component_endpoint(stack, tmp_path, "quiet", scaling)
    sm, aas, cw = stack.client("sagemaker"), stack.client("application-autoscaling"), stack.client("cloudwatch")
    idle_scaling.put_idle_scaling(aas, cw, component, after_seconds=3600, max_instances=3)
    clock.advance(30 * 60)  # half the idle period, no traffic (the reaper arms the idle alarm at its end)
    assert idle_scaling.copies(sm, component) == (1, 1)
    load = idle_scaling.policy_names(component)["load"]
    metric = {"PredefinedMetricType": "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"}
    config = {"TargetValue": idle_scaling.CONCURRENCY_TARGET, "PredefinedMetricSpecification": metric,
              "ScaleInCooldown": 0, "ScaleOutCooldown": 60, "DisableScaleIn": False}  # fmt: skip
    rid = idle_scaling.resource_id(component)
    aas.put_scaling_policy(PolicyName=load, ServiceNamespace="sagemaker", ResourceId=rid,
                           ScalableDimension=idle_scaling.DIMENSION, PolicyType="TargetTrackingScaling",
                           TargetTrackingScalingPolicyConfiguration=config)  # fmt: skip
    assert _asleep_after(sm, component, 20) <= 16  # with scale-in: zero copies long before the idle period


def test_an_update_whose_new_copy_cannot_fit_beside_the_old_is_refused(stack: Any, tmp_path: Path) -> None:
    """SageMaker places an update's new copies before it removes the old ones: one copy of all the
    instance's GPUs on an endpoint allowed one instance has nowhere to go."""
    sm = stack.client("sagemaker")
    tight = _component_endpoint(stack, tmp_path, "tight")  # MaxInstanceCount 1, one copy
    roomy = _component_endpoint(stack, tmp_path, "roomy", idle_scaling.idle_variant("ml.g6.2xlarge", 1, {})[
        "ManagedInstanceScaling"])  # fmt: skip
    spec = idle_scaling.component_spec("roomy-model", 1, 1024, {})
    message = _refused(sm.update_inference_component, InferenceComponentName=tight, Specification=spec)
    assert "Insufficient capacity" in message and "MaxInstanceCount is 1" in message
    assert _in_service(sm, tight)["Specification"]["ModelName"] == "tight-model"  # untouched
    # A rolling batch of 1 copy out of 1 is 100 % of the copies: SageMaker takes 5-50 % (botocore's
    # InferenceComponentRollingUpdatePolicy), so no batch is valid at one copy and the update sends none.
    one_of_one = {"RollingUpdatePolicy": {"MaximumBatchSize": {"Type": "COPY_COUNT", "Value": 1},
                                          "WaitIntervalInSeconds": 0,
                                          "MaximumExecutionTimeoutInSeconds": 600}}  # fmt: skip
    spec = idle_scaling.component_spec("tight-model", 1, 1024, {})
    message = _refused(sm.update_inference_component, InferenceComponentName=roomy, Specification=spec,
                       DeploymentConfig=one_of_one)  # fmt: skip
    assert "between 5% and 50% of the copy count" in message, message
    assert idle_scaling.update_policy(600, 1) is None
    assert idle_scaling.update_policy(600, 2)["RollingUpdatePolicy"]["MaximumBatchSize"]["Value"] == 1  # type: ignore[index]
    sm.update_inference_component(InferenceComponentName=roomy, Specification=spec)
    assert _in_service(sm, roomy)["Specification"]["ModelName"] == "tight-model"
