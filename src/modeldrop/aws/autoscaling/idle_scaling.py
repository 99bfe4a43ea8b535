"""A channel that scales to zero, on SageMaker: its endpoint of inference components with managed
instance scaling (MinInstanceCount 0), its one stable component holding the live version's model, and
the Application Auto Scaling that moves the component's copies:

- scale in: an alarm on the component's activity (invocations answered plus those refused for no copy,
  per minute, < 1 for the idle period's minutes) runs a step policy setting the copies to 0
  (ExactCapacity); a refused invocation counts, or the idle alarm would undo every wake-up. The alarm is
  created with its actions off: CloudWatch reads the minutes before a component existed as missing,
  which the FILLed sum makes 0, so a new channel's alarm is in ALARM at its first minute. The reaper
  turns the actions on once the channel has existed its idle period (`arm_idle`), so a channel sleeps
  only after a whole idle period (at most one reaper period late); the instances follow the copies;
- wake: an alarm on `NoCapacityInvocationFailures` (an invocation refused for no copy) runs a step
  policy setting exactly one copy -- CloudWatch re-runs a scaling action every minute the alarm stays
  in ALARM, and clients keep being refused while the instance provisions, so "+1" would climb to the
  maximum; target tracking cannot leave zero (the SageMaker guide says so);
- under load, with more than one instance allowed: target tracking on concurrent requests per copy,
  scale-out only (DisableScaleIn): with scale-in it would compute zero copies after a few quiet
  minutes, whatever the idle period says; the idle policy alone takes the copies to zero;
- an update (promotion, rollback) places the new copy beside the old one, one copy at a time
  (`UPDATE_POLICY`), so the endpoint may hold one instance more than the channel's copies
  (MaxInstanceCount = copies + 1; managed instance scaling provisions it only for the update), and
  scale-in is suspended while it runs (`suspend_scale_in`).

Names are the channel's endpoint's with a suffix, so the stack's roles act on `<prefix>-ch-*` only.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    from mypy_boto3_application_autoscaling import ApplicationAutoScalingClient
    from mypy_boto3_cloudwatch import CloudWatchClient
    from mypy_boto3_sagemaker import SageMakerClient

DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
NAMESPACE = "sagemaker"
# Concurrent requests per copy that target tracking holds (an engine batches many; this is where a
# second copy starts paying off for latency, not a capacity limit).
CONCURRENCY_TARGET = 8.0
WAKE_COOLDOWN_SECONDS = 60
# The instances an update needs beyond the channel's copies: its new copy, placed before the old goes.
UPDATE_SPARE_INSTANCES = 1


def update_policy(timeout_seconds: int, copies: int) -> dict[str, Any] | None:
    """UpdateInferenceComponent's DeploymentConfig for a component of COPIES copies: one copy at a time, so an
    update needs one spare instance (SageMaker places a batch's new copies before removing old ones). A
    rolling batch must be 5-50 % of the copy count (botocore's InferenceComponentRollingUpdatePolicy): at one
    copy no batch is valid, and none is sent -- the default update, whose one new copy takes the spare."""
    if copies < 2:
        return None
    batch = max(UPDATE_SPARE_INSTANCES, -(-copies * 5 // 100))  # within 5-50 % from 2 copies on
    return {
        "RollingUpdatePolicy": {
            "MaximumBatchSize": {"Type": "COPY_COUNT", "Value": batch},
            "WaitIntervalInSeconds": 0,
            "MaximumExecutionTimeoutInSeconds": max(600, min(28_800, timeout_seconds)),
        }
    }


def rolling_batch_problem(copies: int, deployment: dict[str, Any] | None) -> str | None:
    """Why SageMaker refuses DEPLOYMENT's rolling batch for a component of COPIES copies (5-50 % of them)."""
    size = ((deployment or {}).get("RollingUpdatePolicy") or {}).get("MaximumBatchSize")
    if not isinstance(size, dict):
        return None
    value, kind = float(size.get("Value") or 0), str(size.get("Type"))
    share = value if kind == "CAPACITY_PERCENT" else 100.0 * value / max(1, copies)
    if 5.0 <= share <= 50.0:
        return None
    return (
        f"RollingUpdatePolicy.MaximumBatchSize {kind} {value:g} is {share:.0f}% of the {copies} "
        "cop" + ("y" if copies == 1 else "ies") + "; the value must be between 5% and 50% of the copy count."
    )


def resource_id(component: str) -> str:
    return f"inference-component/{component}"


def idle_variant(instance_type: str, max_instances: int, extras: dict[str, Any]) -> dict[str, Any]:
    """The channel endpoint's one variant: no model (it hosts components), instances from 0 to MAX
    copies, plus the one an update's new copy takes beside the old (UPDATE_POLICY)."""
    variant: dict[str, Any] = {
        "VariantName": "AllTraffic",
        "InstanceType": instance_type,
        "InitialInstanceCount": 1,
        "ManagedInstanceScaling": {
            "Status": "ENABLED",
            "MinInstanceCount": 0,
            "MaxInstanceCount": max_instances + UPDATE_SPARE_INSTANCES,
        },
        "RoutingConfig": {"RoutingStrategy": "LEAST_OUTSTANDING_REQUESTS"},
    }
    return {**variant, **{k: v for k, v in extras.items() if k == "InferenceAmiVersion"}}


def component_spec(model: str, gpus: int, memory_mb: int, startup: dict[str, int]) -> dict[str, Any]:
    """One copy takes the whole instance's GPUs (the plan is per instance)."""
    spec: dict[str, Any] = {
        "ModelName": model,
        "ComputeResourceRequirements": {"NumberOfAcceleratorDevicesRequired": gpus, "MinMemoryRequiredInMb": memory_mb},
    }
    if startup:
        spec["StartupParameters"] = startup
    return spec


def policy_names(component: str) -> dict[str, str]:
    return {"idle": f"{component}-to-zero", "wake": f"{component}-wake", "load": f"{component}-load"}


def alarm_names(component: str) -> list[str]:
    return [f"{component}-idle", f"{component}-no-capacity"]


def put_idle_scaling(
    aas: ApplicationAutoScalingClient,
    cw: CloudWatchClient,
    component: str,
    after_seconds: int,
    max_instances: int,
) -> list[str]:
    """Register COMPONENT's copies (0..MAX_INSTANCES) and the policies and alarms above; returns the
    alarms' names (the policies go with the target)."""
    rid, names = resource_id(component), policy_names(component)
    aas.register_scalable_target(
        ServiceNamespace=NAMESPACE,
        ResourceId=rid,
        ScalableDimension=DIMENSION,
        MinCapacity=0,
        MaxCapacity=max_instances,
    )
    to_zero = aas.put_scaling_policy(
        PolicyName=names["idle"], ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION,
        PolicyType="StepScaling",
        StepScalingPolicyConfiguration={"AdjustmentType": "ExactCapacity", "MetricAggregationType": "Maximum",
                                        "StepAdjustments": [{"MetricIntervalUpperBound": 0, "ScalingAdjustment": 0}]},
    )  # fmt: skip
    wake = aas.put_scaling_policy(
        PolicyName=names["wake"], ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION,
        PolicyType="StepScaling",
        StepScalingPolicyConfiguration={"AdjustmentType": "ExactCapacity", "MetricAggregationType": "Maximum",
                                        "Cooldown": WAKE_COOLDOWN_SECONDS,
                                        "StepAdjustments": [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]},
    )  # fmt: skip
    if max_instances > 1:
        aas.put_scaling_policy(
            PolicyName=names["load"], ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION,
            PolicyType="TargetTrackingScaling",
            TargetTrackingScalingPolicyConfiguration={
                "TargetValue": CONCURRENCY_TARGET,
                "PredefinedMetricSpecification": {
                    "PredefinedMetricType": "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution"},
                "ScaleInCooldown": after_seconds, "ScaleOutCooldown": 60, "DisableScaleIn": True},
        )  # fmt: skip
    idle_alarm, wake_alarm = alarm_names(component)
    dimensions = [{"Name": "InferenceComponentName", "Value": component}]

    # Activity is an invocation answered or one refused for no copy: a client knocking on a sleeping
    # channel keeps this alarm OK, so it never undoes the wake-up it asked for.
    def counted(metric_id: str, metric: str) -> dict[str, Any]:
        return {"Id": metric_id, "ReturnData": False, "MetricStat": {"Period": 60, "Stat": "Sum", "Metric": {
            "Namespace": "AWS/SageMaker", "MetricName": metric, "Dimensions": dimensions}}}  # fmt: skip

    cw.put_metric_alarm(
        AlarmName=idle_alarm, AlarmDescription=f"modeldrop idle channel: no invocation for {after_seconds // 60} min",
        Metrics=[counted("answered", "Invocations"), counted("refused", "NoCapacityInvocationFailures"),
                 {"Id": "activity", "Expression": "FILL(answered,0)+FILL(refused,0)", "ReturnData": True,
                  "Label": "invocations, answered or refused"}],
        EvaluationPeriods=after_seconds // 60, DatapointsToAlarm=after_seconds // 60, Threshold=1.0,
        ComparisonOperator="LessThanThreshold", TreatMissingData="breaching",
        AlarmActions=[to_zero["PolicyARN"]], ActionsEnabled=False,  # armed once the idle period has passed
    )  # fmt: skip
    cw.put_metric_alarm(
        AlarmName=wake_alarm, AlarmDescription="modeldrop idle channel: an invocation found no copy: wake",
        Namespace="AWS/SageMaker", MetricName="NoCapacityInvocationFailures", Dimensions=dimensions,
        Statistic="Maximum", Period=60, EvaluationPeriods=1, Threshold=1.0,
        ComparisonOperator="GreaterThanOrEqualToThreshold", TreatMissingData="notBreaching",
        AlarmActions=[wake["PolicyARN"]],
    )  # fmt: skip
    return alarm_names(component)


def arm_idle(cw: CloudWatchClient, component: str) -> bool:
    """Turn on COMPONENT's idle alarm's actions (it may put the copies to zero from now on); True when it
    was off. The caller has checked that the channel has existed its idle period."""
    idle_alarm = alarm_names(component)[0]
    found = cw.describe_alarms(AlarmNames=[idle_alarm])["MetricAlarms"]
    if not found or found[0].get("ActionsEnabled"):
        return False
    cw.enable_alarm_actions(AlarmNames=[idle_alarm])
    return True


def suspend_scale_in(aas: ApplicationAutoScalingClient, component: str, suspended: bool) -> None:
    """Scale-in of COMPONENT's copies held (SUSPENDED) while an update runs, or given back after: the idle
    alarm may not set zero copies under an update."""
    try:
        aas.register_scalable_target(
            ServiceNamespace=NAMESPACE, ResourceId=resource_id(component), ScalableDimension=DIMENSION,
            SuspendedState={"DynamicScalingInSuspended": suspended},
        )  # fmt: skip
    except ClientError as exc:  # no target (an always-on channel, or one closed meanwhile): nothing to hold
        if exc.response.get("Error", {}).get("Code") not in ("ObjectNotFoundException", "ValidationException"):
            raise


def remove_idle_scaling(aas: ApplicationAutoScalingClient, cw: CloudWatchClient, component: str) -> list[str]:
    """The alarms, policies and target of COMPONENT's scaling, whichever are there; what went, as names."""
    gone: list[str] = []
    names = alarm_names(component)
    if cw.describe_alarms(AlarmNames=names)["MetricAlarms"]:
        cw.delete_alarms(AlarmNames=names)
        gone += [f"alarm/{n}" for n in names]
    rid = resource_id(component)
    for name in policy_names(component).values():
        try:
            aas.delete_scaling_policy(
                PolicyName=name, ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION
            )
            gone.append(f"scaling-policy/{name}")
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("ObjectNotFoundException", "ValidationException"):
                raise
    try:
        aas.deregister_scalable_target(ServiceNamespace=NAMESPACE, ResourceId=rid, ScalableDimension=DIMENSION)
        gone.append(f"scalable-target/{rid}")
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("ObjectNotFoundException", "ValidationException"):
            raise
    return gone


def copies(sm: SageMakerClient, component: str) -> tuple[int, int]:
    """(desired, current) copies of COMPONENT."""
    runtime = sm.describe_inference_component(InferenceComponentName=component).get("RuntimeConfig") or {}
    return int(runtime.get("DesiredCopyCount") or 0), int(runtime.get("CurrentCopyCount") or 0)


def scaling_changes(aas: ApplicationAutoScalingClient, component: str) -> list[tuple[datetime, int]]:
    """(when, copies) for each successful scaling of COMPONENT, oldest first, from its activities."""
    changes: list[tuple[datetime, int]] = []
    kwargs: dict[str, Any] = {"ServiceNamespace": NAMESPACE, "ResourceId": resource_id(component),
                              "ScalableDimension": DIMENSION}  # fmt: skip
    while True:
        page = aas.describe_scaling_activities(**kwargs)
        for activity in page.get("ScalingActivities", []):
            if activity.get("StatusCode") != "Successful":
                continue
            count = _desired_in(str(activity.get("Description", "")))
            if count is not None:
                changes.append((activity.get("EndTime") or activity["StartTime"], count))
        token = page.get("NextToken")
        if not token:
            break
        kwargs["NextToken"] = token
    return sorted(changes)


def _desired_in(description: str) -> int | None:
    """The count in AAS's `Setting desired copy count to N.` (its activities' own wording)."""
    words = description.rstrip(".").split()
    return int(words[-1]) if words and words[-1].isdigit() and "copy count" in description else None
