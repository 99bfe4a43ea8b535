"""Application Auto Scaling of inference components, and the CloudWatch alarms that drive it, in the
emulator (moto 5.2.5 knows neither the component's DesiredCopyCount dimension nor DescribeScalingActivities,
and evaluates no alarm), by AWS's rules (its API reference, the SageMaker guide "Scale an endpoint to zero
instances"): botocore's enums; RegisterScalableTarget on an existing base component's
`inference-component/NAME`, MinCapacity and MaxCapacity on a first registration, 0 <= Min <= Max;
PutScalingPolicy on a registered target (target tracking on the component's predefined metrics, step
scaling with an AdjustmentType and a StepAdjustment); DescribeScalingActivities newest first. What drives
the copies (the alarms' evaluation, target tracking) is in `driving`.
"""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="method-assign,assignment,attr-defined"
from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from modeldrop.contracts import clock
from modeldrop.local.emulator.autoscaling import driving
from modeldrop.local.emulator.autoscaling.driving import (
    COMPONENT_METRICS,
    DIMENSION,
    _component_name,
    activities,
    drive_all,
)


@functools.cache
def _enum(service: str, shape: str) -> tuple[str, ...]:
    import botocore.session

    model = botocore.session.get_session().get_service_model(service)
    return tuple(model.shape_for(shape).enum)


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
            component = driving._find(sagemaker_backends[self.account_id][self.region_name], name)
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
        state = driving._state
        with state.lock:  # evaluated from its creation on the emulator's clock (moto stamps real time)
            state.first_seen[name] = clock.utcnow()
            state.evaluated.pop(name, None)
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
