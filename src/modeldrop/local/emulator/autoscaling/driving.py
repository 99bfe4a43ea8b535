"""The CloudWatch alarms and target tracking that move an inference component's copies in the emulator,
on the emulator's clock, and the state they keep (what the runtime saw, the scaling activities).

An alarm on AWS/SageMaker `Invocations` or `NoCapacityInvocationFailures` for an InferenceComponentName
(or a metric-math sum of them), whose actions name a step policy, is evaluated as CloudWatch does: at each
period's end from its creation, over its last EvaluationPeriods periods, those before it existed
included as missing data (TreatMissingData; a FILLed sum reads them as 0); while in ALARM with its
actions enabled its policy runs at every evaluation (after the policy's cooldown; a scale-in not while
the target's DynamicScalingInSuspended), its capacity clamped to the target's bounds. A target tracking
policy is evaluated each minute on invocations per copy (the emulator's stand-in for the concurrency
metric): out after 3 minutes above the target, in (unless DisableScaleIn) after 15 below 90 % of it, to
ceil(copies x metric / target) -- zero copies on a quiet component.
"""

# mypy: disable-error-code="attr-defined"
from __future__ import annotations

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
    tracking: dict[str, tuple[int, int]] = field(default_factory=dict)  # policy ARN -> minutes above, below
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


def _component_name(resource_id: str) -> str | None:
    kind, _, name = resource_id.partition("/")
    return name if kind == "inference-component" and name and "/" not in name else None


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
            _drive_target_tracking(aas, sm_backend, now)
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
    metric-math sum of FILLed metrics is never missing; periods before the alarm existed are missing too)."""
    periods = int(alarm.datapoints_to_alarm or alarm.evaluation_periods or 1)
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
    cause = f"monitor alarm {alarm.name} in state ALARM triggered policy {policy.policy_name}"
    _apply(policy, target, sm_backend, name, current, desired, now, cause)


def _apply(
    policy: Any, target: Any, sm_backend: Any, name: str, current: int, desired: int, now: datetime, cause: str
) -> None:
    """DESIRED copies (clamped to the target's bounds) for component NAME, unless scale-in is suspended."""
    assert _set_copies is not None
    desired = max(int(target.min_capacity), min(int(target.max_capacity), desired))
    suspended = (target.suspended_state or {}).get("DynamicScalingInSuspended") in (True, "true", "True")
    if desired == current or (desired < current and suspended):
        return
    _set_copies(sm_backend, name, desired, now)
    _state.last_run[policy.policy_arn] = now
    _state.activities.append(
        Activity(
            resource_id=policy.resource_id,
            description=f"Setting desired copy count to {desired}.",
            cause=cause,
            start=now,
            end=now,
            desired=desired,
        )
    )


MINUTE = timedelta(minutes=1)


def _drive_target_tracking(aas: Any, sm_backend: Any, now: datetime) -> None:
    """Each target tracking policy on a component, evaluated at every minute since it was put."""
    for policy in list(aas.policies.values()):
        if policy.policy_type != "TargetTrackingScaling" or policy.scalable_dimension != DIMENSION:
            continue
        seen = _state.first_seen.setdefault(policy.policy_arn, now)
        at = _state.evaluated.get(policy.policy_arn, seen)
        while at + MINUTE <= now:
            at += MINUTE
            _track_at(policy, aas, sm_backend, at)
        _state.evaluated[policy.policy_arn] = at


def _tracking_side(arn: str, metric: float, goal: float, no_scale_in: bool) -> str | None:
    """Which way target tracking moves after this minute (the cooldown that applies), or None: out after
    3 minutes above the target, in after 15 below 90 % of it (AWS's alarms for a 1-minute metric)."""
    high, low = _state.tracking.get(arn, (0, 0))
    high, low = (high + 1 if metric > goal else 0), (low + 1 if metric < 0.9 * goal else 0)
    _state.tracking[arn] = (high, low)
    if high >= 3:
        return "ScaleOutCooldown"
    if low >= 15 and not no_scale_in:
        return "ScaleInCooldown"
    return None


def _track_at(policy: Any, aas: Any, sm_backend: Any, at: datetime) -> None:
    config = policy._policy_body or {}
    target = aas.targets.get(DIMENSION, {}).get(policy.resource_id)
    name = _component_name(policy.resource_id)
    component = _find(sm_backend, name) if name else None
    if target is None or name is None or component is None or component.seen_deleting >= 0:
        return
    current = int((component.runtime_config or {}).get("CopyCount") or 0)
    if current == 0:  # target tracking cannot leave zero (no copy emits the metric)
        return
    goal = float(config.get("TargetValue") or 1.0)
    calls = sum(1 for t in _state.invocations.get(name, []) if at - MINUTE < t <= at)
    metric = calls / current
    cooldown = _tracking_side(policy.policy_arn, metric, goal, bool(config.get("DisableScaleIn")))
    if cooldown is None:
        return
    last = _state.last_run.get(policy.policy_arn)
    if last is not None and at - last < timedelta(seconds=int(config.get(cooldown) or 0)):
        return
    desired = int(-(-current * metric // goal)) if metric else 0
    _apply(policy, target, sm_backend, name, current, desired, at, f"target tracking {policy.policy_name}")
