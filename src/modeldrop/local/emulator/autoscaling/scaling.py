"""Application Auto Scaling of inference components, and the CloudWatch alarms that drive it, in the
emulator (moto 5.2.5 knows neither the component's DesiredCopyCount dimension nor DescribeScalingActivities,
and evaluates no alarm), by AWS's rules (its API reference, the SageMaker guide "Scale an endpoint to zero
instances"): botocore's enums; RegisterScalableTarget on an existing base component's
`inference-component/NAME`, MinCapacity and MaxCapacity on a first registration, 0 <= Min <= Max;
PutScalingPolicy on a registered target (target tracking on the component's predefined metrics, step
scaling with an AdjustmentType and a StepAdjustment); DescribeScalingActivities newest first.
Driving, on the emulator's clock, at each look at a component or invocation: an alarm on AWS/SageMaker
`Invocations` or `NoCapacityInvocationFailures` for an InferenceComponentName, whose actions name a step
policy, is evaluated over its periods from the invocations the runtime saw; in ALARM it runs the policy
(after its cooldown), whose capacity (clamped to the target's bounds) becomes the component's copy count,
which its host follows. Periods before the alarm existed count as no data (see docs/operating.md).
"""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="method-assign,assignment,attr-defined"
from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from modeldrop.contracts import clock

DIMENSION = "sagemaker:inference-component:DesiredCopyCount"
COMPONENT_METRICS = (
    "SageMakerInferenceComponentInvocationsPerCopy",
    "SageMakerInferenceComponentConcurrentRequestsPerCopyHighResolution",
)
INVOCATIONS = "Invocations"
NO_CAPACITY = "NoCapacityInvocationFailures"


@dataclass
class Activity:
    resource_id: str
    description: str
    cause: str
    start: datetime
    end: datetime
    desired: int
    activity_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    def shape(self) -> dict[str, Any]:
        return {
            "ActivityId": self.activity_id,
            "ServiceNamespace": "sagemaker",
            "ResourceId": self.resource_id,
            "ScalableDimension": DIMENSION,
            "Description": self.description,
            "Cause": self.cause,
            "StartTime": self.start,
            "EndTime": self.end,
            "StatusCode": "Successful",
            "StatusMessage": f"Successfully set desired copy count to {self.desired}.",
        }


@dataclass
class _State:
    invocations: dict[str, list[datetime]] = field(default_factory=dict)
    no_capacity: dict[str, list[datetime]] = field(default_factory=dict)
    activities: list[Activity] = field(default_factory=list)
    last_run: dict[str, datetime] = field(default_factory=dict)  # policy ARN -> its last scaling
    first_seen: dict[str, datetime] = field(default_factory=dict)  # alarm name -> when the emulator saw it
    evaluated: dict[str, datetime] = field(default_factory=dict)  # alarm name -> its last evaluation
    lock: threading.RLock = field(default_factory=threading.RLock)
    driving: bool = False


_state = _State()
# How a copy count reaches the component (set by the SageMaker component shims: (backend, name, copies, at)).
_set_copies: Callable[[Any, str, int, datetime], None] | None = None


def _no_components(_backend: Any, _name: str | None) -> Any:
    return None


# How a component is found: (backend, name) -> it, or (backend, None) -> any one (set by the same shims).
_find: Callable[[Any, str | None], Any] = _no_components


def reset() -> None:
    global _state
    _state = _State()


def set_component_hooks(
    setter: Callable[[Any, str, int, datetime], None] | None, finder: Callable[[Any, str | None], Any]
) -> None:
    """What this module asks of the SageMaker component shims (it imports none of them)."""
    global _set_copies, _find
    _set_copies, _find = setter, finder


def record(component: str, metric: str) -> None:
    """An invocation the runtime saw for COMPONENT (INVOCATIONS), or one it refused for no capacity."""
    with _state.lock:
        store = _state.invocations if metric == INVOCATIONS else _state.no_capacity
        store.setdefault(component, []).append(clock.utcnow())


def activities(resource_id: str | None = None) -> list[dict[str, Any]]:
    with _state.lock:
        found = [a for a in _state.activities if resource_id in (None, a.resource_id)]
    return [a.shape() for a in sorted(found, key=lambda a: a.start, reverse=True)]


@functools.cache
def _enum(service: str, shape: str) -> tuple[str, ...]:
    import botocore.session

    model = botocore.session.get_session().get_service_model(service)
    return tuple(model.shape_for(shape).enum)


def _component_name(resource_id: str) -> str | None:
    kind, _, name = resource_id.partition("/")
    return name if kind == "inference-component" and name and "/" not in name else None


def install() -> None:
    from moto.applicationautoscaling import models as aas
    from moto.applicationautoscaling import responses as aas_responses
    from moto.applicationautoscaling.exceptions import AWSValidationException
    from moto.applicationautoscaling.responses import ApplicationAutoScalingResponse
    from moto.sagemaker.models import sagemaker_backends

    original_valid = aas._target_params_are_valid
    original_validate_params = ApplicationAutoScalingResponse._validate_params
    original_register = aas.ApplicationAutoscalingBackend.register_scalable_target
    original_put_policy = aas.ApplicationAutoscalingBackend.put_scaling_policy

    def target_params_are_valid(namespace: str, r_id: str, dimension: str) -> bool:
        if dimension != DIMENSION:
            return bool(original_valid(namespace, r_id, dimension))
        if namespace != "sagemaker" or _component_name(r_id) is None:
            raise AWSValidationException("Unsupported service namespace, resource type or scalable dimension")
        return True

    def validate_params(self: Any) -> None:
        """The enums of botocore's model, which name the component dimension moto's list lacks."""
        namespace, dimension = self._get_param("ServiceNamespace"), self._get_param("ScalableDimension")
        dimensions = _enum("application-autoscaling", "ScalableDimension")
        namespaces = _enum("application-autoscaling", "ServiceNamespace")
        if dimension == DIMENSION and namespace in namespaces:
            return
        if dimension is not None and dimension not in dimensions:
            raise AWSValidationException(
                f"1 validation error detected: Value '{dimension}' at 'scalableDimension' failed to satisfy "
                f"constraint: Member must satisfy enum value set: [{', '.join(dimensions)}]"
            )
        original_validate_params(self)

    def register_scalable_target(
        self: Any,
        namespace: str,
        r_id: str,
        dimension: str,
        min_capacity: int | None,
        max_capacity: int | None,
        role_arn: str,
        suspended_state: str,
    ) -> Any:
        if dimension == DIMENSION:
            target_params_are_valid(namespace, r_id, dimension)
            name = str(_component_name(r_id))
            component = _find(sagemaker_backends[self.account_id][self.region_name], name)
            if component is None or component.seen_deleting >= 0:
                raise AWSValidationException(f"Inference component {name} does not exist.")
            if component.base is not None:
                raise AWSValidationException(
                    f"Inference component {name} is an adapter component: it has no copies to scale "
                    "(scale its base component)."
                )
            existing = self.targets.get(dimension, {}).get(r_id)
            if existing is None and (min_capacity is None or max_capacity is None):
                raise AWSValidationException(
                    "MinCapacity and MaxCapacity are required to register a new scalable target."
                )
            low = existing.min_capacity if min_capacity is None else min_capacity
            high = existing.max_capacity if max_capacity is None else max_capacity
            if low < 0 or high < 0:
                raise AWSValidationException("MinCapacity and MaxCapacity must be at least 0.")
            if low > high:
                raise AWSValidationException(f"Minimum capacity {low} cannot be greater than maximum capacity {high}.")
        return original_register(
            self, namespace, r_id, dimension, min_capacity, max_capacity, role_arn, suspended_state
        )

    def put_scaling_policy(
        self: Any,
        policy_name: str,
        service_namespace: str,
        resource_id: str,
        scalable_dimension: str,
        policy_body: dict[str, Any],
        policy_type: str | None,
    ) -> Any:
        if scalable_dimension == DIMENSION:
            if resource_id not in self.targets.get(DIMENSION, {}):
                raise aas.AWSValidationException(
                    f"No scalable target registered for service namespace: {service_namespace}, resource ID: "
                    f"{resource_id}, scalable dimension: {scalable_dimension}"
                )
            _check_policy(policy_type, policy_body, AWSValidationException)
        return original_put_policy(
            self, policy_name, service_namespace, resource_id, scalable_dimension, policy_body, policy_type
        )

    def describe_scaling_activities(self: Any) -> str:
        import json

        drive_all()
        resource = self._get_param("ResourceId")
        return json.dumps({"ScalingActivities": activities(resource)}, default=_iso)

    from moto.cloudwatch.models import CloudWatchBackend

    original_put_alarm = CloudWatchBackend.put_metric_alarm

    def put_metric_alarm(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
        with _state.lock:  # evaluated from its creation on the emulator's clock (moto stamps real time)
            _state.first_seen[name] = clock.utcnow()
            _state.evaluated.pop(name, None)
        return original_put_alarm(self, name, *args, **kwargs)

    CloudWatchBackend.put_metric_alarm = put_metric_alarm
    aas._target_params_are_valid = target_params_are_valid
    aas_responses._target_params_are_valid = target_params_are_valid
    ApplicationAutoScalingResponse._validate_params = validate_params
    aas.ApplicationAutoscalingBackend.register_scalable_target = register_scalable_target
    aas.ApplicationAutoscalingBackend.put_scaling_policy = put_scaling_policy
    ApplicationAutoScalingResponse.describe_scaling_activities = describe_scaling_activities


def _iso(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.timestamp()
    raise TypeError(type(value).__name__)


def _check_policy(policy_type: str | None, body: dict[str, Any], error: type[Exception]) -> None:
    # moto hands over the policy's configuration itself (StepScaling... or TargetTracking...Configuration).
    config = body or {}
    if policy_type == "TargetTrackingScaling":
        predefined = (config.get("PredefinedMetricSpecification") or {}).get("PredefinedMetricType")
        if predefined is not None and predefined not in COMPONENT_METRICS:
            raise error(
                f"Predefined metric type {predefined} is not supported for scalable dimension {DIMENSION}; "
                f"use one of {', '.join(COMPONENT_METRICS)}."
            )
        if predefined is None and not config.get("CustomizedMetricSpecification"):
            raise error(
                "A target tracking policy needs a PredefinedMetricSpecification or a CustomizedMetricSpecification."
            )
    elif policy_type == "StepScaling":
        if config.get("AdjustmentType") not in _enum("application-autoscaling", "AdjustmentType"):
            raise error("StepScalingPolicyConfiguration.AdjustmentType is required.")
        if not config.get("StepAdjustments"):
            raise error("StepScalingPolicyConfiguration.StepAdjustments needs at least one step adjustment.")


# ---- the alarms driving the policies -----------------------------------------------------------------


def scale_in_now(component: str) -> None:
    """COMPONENT's copies set to zero at once, as its idle alarm's step policy does (a fault's trigger)."""
    from moto.sagemaker.models import sagemaker_backends

    for backend in (b for regions in list(sagemaker_backends.values()) for b in list(regions.values())):
        if _set_copies is not None and _find(backend, component) is not None:
            _set_copies(backend, component, 0, clock.utcnow())


def drive_all() -> None:
    """Every region's components: evaluate the alarms that scale them (the runtime and the describes call it)."""
    from moto.sagemaker.models import sagemaker_backends

    for account, regions in list(sagemaker_backends.items()):
        for region in list(regions.keys()):
            backend = regions[region]
            if _find(backend, None) is not None:
                drive(backend, account, region)


def drive(sm_backend: Any, account: str, region: str) -> None:
    """Every evaluation due since the last look, across the alarms in time order (a wake-up at 02:01 and
    a scale-in at 02:11 happen in that order, whichever alarm is looked at first)."""
    from moto.applicationautoscaling.models import applicationautoscaling_backends
    from moto.cloudwatch.models import cloudwatch_backends

    with _state.lock:
        if _state.driving:
            return
        _state.driving = True
        try:
            cw = cloudwatch_backends[account][region]
            aas = applicationautoscaling_backends[account][region]
            now = clock.utcnow()
            watched = [(alarm, w) for alarm in list(cw.alarms.values()) if (w := _watched(alarm)) is not None]
            while True:
                due = [(_next_evaluation(alarm, w[2], now), i) for i, (alarm, w) in enumerate(watched)]
                ready = [(at, i) for at, i in due if at <= now]
                if not ready:
                    break
                at, i = min(ready)
                alarm, (component, metrics, period) = watched[i]
                _evaluate_at(alarm, component, metrics, period, aas, sm_backend, at)
        finally:
            _state.driving = False


def _watched(alarm: Any) -> tuple[str, tuple[str, ...], timedelta] | None:
    """(component, metrics summed, period) of an alarm the emulator evaluates: one component metric,
    or a metric-math sum of them (`FILL(m1,0)+FILL(m2,0)`, each a Sum of a component metric); None
    for any other alarm (not evaluated here)."""
    if alarm.namespace == "AWS/SageMaker" and alarm.metric_name in (INVOCATIONS, NO_CAPACITY):
        component = next((d.value for d in alarm.dimensions if d.name == "InferenceComponentName"), None)
        return (component, (alarm.metric_name,), timedelta(seconds=int(alarm.period or 60))) if component else None
    stats = _summed_stats(alarm.metric_data_queries or [])
    if not stats:
        return None
    metrics, components = [], set()
    for stat in stats:
        metric = stat.metric
        if metric.namespace != "AWS/SageMaker" or metric.metric_name not in (INVOCATIONS, NO_CAPACITY):
            return None
        if stat.stat != "Sum":
            return None
        components |= {d.value for d in metric.dimensions if d.name == "InferenceComponentName"}
        metrics.append(metric.metric_name)
    if len(components) != 1:
        return None
    return components.pop(), tuple(metrics), timedelta(seconds=int(stats[0].period or 60))


def _summed_stats(queries: list[Any]) -> list[Any]:
    """The metric stats an expression `FILL(a,0)+FILL(b,0)` sums (the one query returned); [] for another."""
    stats = {q.id: q.metric_stat for q in queries if q.metric_stat is not None}
    returned = [q for q in queries if q.expression and q.return_data in (None, True, "true")]
    if len(returned) != 1 or not stats:
        return []
    terms = returned[0].expression.replace(" ", "").split("+")
    ids = [t[5:-3] for t in terms if t.startswith("FILL(") and t.endswith(",0)")]
    if len(ids) != len(terms) or any(i not in stats for i in ids):
        return []
    return [stats[i] for i in ids]


def _next_evaluation(alarm: Any, period: timedelta, now: datetime) -> datetime:
    """CloudWatch evaluates at each period's end from the alarm's creation, not when somebody looks."""
    seen = _state.first_seen.setdefault(alarm.name, now)
    return _state.evaluated.get(alarm.name, seen) + period


def _evaluate_at(
    alarm: Any, component: str, metrics: tuple[str, ...], period: timedelta, aas: Any, sm_backend: Any, at: datetime
) -> None:
    _state.evaluated[alarm.name] = at
    breaching = _breaching(alarm, component, metrics, period, _state.first_seen[alarm.name], at)
    state = "ALARM" if breaching else "OK"
    if state != alarm.state_value:
        alarm.update_state(f"emulated evaluation of {'+'.join(metrics)} for {component}", "{}", state)
    # A policy action runs at each evaluation in ALARM (CloudWatch re-invokes scaling actions).
    if breaching and alarm.actions_enabled:
        for action in alarm.alarm_actions or []:
            policy = next((p for p in aas.policies.values() if p.policy_arn == action), None)
            if policy is not None and policy.policy_type == "StepScaling":
                _run_step(policy, aas, sm_backend, alarm, at)


def _breaching(
    alarm: Any, component: str, metrics: tuple[str, ...], period: timedelta, seen: datetime, now: datetime
) -> bool:
    """Each of the alarm's last EvaluationPeriods periods breaches (missing ones per TreatMissingData; a
    metric-math sum of FILLed metrics is never missing; periods before the alarm existed are not evaluated)."""
    periods = int(alarm.datapoints_to_alarm or alarm.evaluation_periods or 1)
    if now - seen < period * periods:
        return False
    filled = len(metrics) > 1 or bool(alarm.metric_data_queries)
    times = [
        t for m in metrics for t in (_state.invocations if m == INVOCATIONS else _state.no_capacity).get(component, [])
    ]
    threshold = float(alarm.threshold)
    for i in range(periods):
        end = now - period * i
        start = end - period
        count = sum(1 for t in times if start < t <= end)
        if count == 0 and not filled:
            if alarm.treat_missing_data != "breaching":
                return False
            continue
        value = float(count) if (filled or alarm.statistic in ("Sum", "SampleCount")) else 1.0
        if not _compare(alarm.comparison_operator, value, threshold):
            return False
    return True


def _compare(operator: str, value: float, threshold: float) -> bool:
    return {
        "GreaterThanOrEqualToThreshold": value >= threshold,
        "GreaterThanThreshold": value > threshold,
        "LessThanThreshold": value < threshold,
        "LessThanOrEqualToThreshold": value <= threshold,
    }.get(operator, False)


def _run_step(policy: Any, aas: Any, sm_backend: Any, alarm: Any, now: datetime) -> None:
    config = policy._policy_body or {}
    cooldown = timedelta(seconds=int(config.get("Cooldown") or 0))
    last = _state.last_run.get(policy.policy_arn)
    if last is not None and now - last < cooldown:
        return
    target = aas.targets.get(DIMENSION, {}).get(policy.resource_id)
    name = _component_name(policy.resource_id)
    if target is None or name is None or _set_copies is None:
        return
    component = _find(sm_backend, name)
    if component is None or component.seen_deleting >= 0:
        return
    current = int((component.runtime_config or {}).get("CopyCount") or 0)
    adjustment = int((config.get("StepAdjustments") or [{}])[0].get("ScalingAdjustment", 0))
    kind = config.get("AdjustmentType")
    desired = {
        "ExactCapacity": adjustment,
        "ChangeInCapacity": current + adjustment,
        "PercentChangeInCapacity": current + (current * adjustment) // 100,
    }.get(str(kind), current)
    desired = max(int(target.min_capacity), min(int(target.max_capacity), desired))
    if desired == current:
        return
    _set_copies(sm_backend, name, desired, now)
    _state.last_run[policy.policy_arn] = now
    _state.activities.append(
        Activity(
            resource_id=policy.resource_id,
            description=f"Setting desired copy count to {desired}.",
            cause=f"monitor alarm {alarm.name} in state ALARM triggered policy {policy.policy_name}",
            start=now,
            end=now,
            desired=desired,
        )
    )
