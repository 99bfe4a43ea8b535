"""Copies of an inference component, and the instances under them, in the emulator:

- CreateEndpointConfig with ManagedInstanceScaling: Status ENABLED or DISABLED, MinInstanceCount >= 0,
  MaxInstanceCount >= 1 and >= MinInstanceCount, only on an endpoint for inference components (a
  variant without ModelName); MinInstanceCount 0 refused where the region refuses it (SageMaker's
  message, seen in eu-west-3; the `zero-refused` fault makes the emulated region one of them).
- UpdateInferenceComponentRuntimeConfig (and Application Auto Scaling, through the same setter) sets the
  desired copies, 0 included; the runtime's CopyCount on create must still be at least 1.
- The local host follows the copies: to 0 the container stops (and the endpoint's instance goes, under
  managed instance scaling); from 0 an instance is provisioned for PROVISION_SECONDS of the emulator's
  clock (`slow-wake`: longer than any client waits), then the container starts. CurrentCopyCount and the
  endpoint's CurrentInstanceCount count what answers.
- Invoking a component with no running copy: SageMaker Runtime's 400 ValidationError saying it has no
  capacity, counted as NoCapacityInvocationFailures (what the wake alarm watches).
- UpdateInferenceComponent with a new Specification.ModelName (a channel's promotion): Updating while
  the new model's container starts; InService on it, or back on the previous model if it fails. As
  SageMaker's rolling update, it places a batch of new copies (DeploymentConfig's MaximumBatchSize, which
  must be 5-50 % of the copy count -- none is valid at one copy --; without one, all of them) before it
  removes old ones: an update whose batch does not fit beside the
  endpoint's copies in MaxInstanceCount instances is refused (`update_capacity_problem`).
"""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="method-assign,assignment,attr-defined"
from __future__ import annotations

from datetime import datetime
from typing import Any

from modeldrop.aws.autoscaling.idle_scaling import rolling_batch_problem
from modeldrop.local.emulator.autoscaling import driving as autoscaling
from modeldrop.serving.idle_plan import refusal_message

NO_CAPACITY_MESSAGE = (
    "Inference Component {name} has no capacity to process this request. ApplicationAutoScaling may be "
    "in-progress (if configured) or try to increase the capacity by invoking "
    "UpdateInferenceComponentRuntimeConfig API."
)
# Regions refusing MinInstanceCount 0 in the emulator (the `zero-refused` fault adds the stack's own).
zero_refused_regions: set[str] = {"eu-west-3"}


def managed_scaling_problem(variants: list[dict[str, Any]], region: str) -> str | None:
    """Why CreateEndpointConfig refuses these variants' ManagedInstanceScaling (None: it takes them)."""
    for variant in variants:
        scaling = variant.get("ManagedInstanceScaling")
        if not scaling:
            continue
        status = scaling.get("Status")
        if status not in ("ENABLED", "DISABLED"):
            return f"ManagedInstanceScaling.Status must be ENABLED or DISABLED, got {status!r}."
        low, high = scaling.get("MinInstanceCount"), scaling.get("MaxInstanceCount")
        if variant.get("ModelName"):
            return (
                "ManagedInstanceScaling is supported only for an endpoint of inference components (production "
                "variants without ModelName)."
            )
        if status == "ENABLED" and (low is None or high is None):
            return "ManagedInstanceScaling with Status ENABLED needs MinInstanceCount and MaxInstanceCount."
        if low is not None and int(low) < 0:
            return "ManagedInstanceScaling.MinInstanceCount must be at least 0."
        if high is not None and int(high) < 1:
            return "ManagedInstanceScaling.MaxInstanceCount must be at least 1."
        if low is not None and high is not None and int(low) > int(high):
            return "ManagedInstanceScaling.MinInstanceCount cannot be greater than MaxInstanceCount."
        if status == "ENABLED" and low is not None and int(low) == 0 and region in zero_refused_regions:
            return refusal_message()
    return None


def update_capacity_problem(
    copies: dict[str, int], name: str, deployment: dict[str, Any] | None, max_instances: int, per_instance: int
) -> str | None:
    """Why an update of component NAME cannot place its first batch: COPIES are the endpoint's base
    components' copy counts (NAME's among them), PER_INSTANCE how many copies of it an instance holds."""
    own = copies.get(name, 0)
    size = ((deployment or {}).get("RollingUpdatePolicy") or {}).get("MaximumBatchSize") or {}
    value = int(size.get("Value") or 0)
    batch = {"COPY_COUNT": value, "CAPACITY_PERCENT": -(-own * value // 100)}.get(str(size.get("Type")), own)
    batch = min(own, max(1, batch)) if own else 0
    needed = -(-(sum(copies.values()) + batch) // max(1, per_instance))
    if needed <= max_instances:
        return None
    return (
        f"Insufficient capacity to update inference component {name}: the rolling update places {batch} new "
        f"cop{'y' if batch == 1 else 'ies'} beside the {sum(copies.values())} running before it removes any, "
        f"which needs {needed} instances; the endpoint's ManagedInstanceScaling.MaxInstanceCount is {max_instances}."
    )


def _gpus(instance_type: str) -> int:
    from modeldrop.serving.memory_plan import instance

    return int((instance(instance_type) or {}).get("gpus") or 1)


def install() -> None:
    from moto.sagemaker import models as sm
    from moto.sagemaker.exceptions import ValidationError
    from moto.sagemaker.responses import SageMakerResponse

    from modeldrop.local.emulator.sagemaker.components import _check_startup as check_startup
    from modeldrop.local.emulator.sagemaker.components import _hosting, components_of, current_copies, find
    from modeldrop.local.emulator.sagemaker.components import _refresh as refresh

    def set_copies(backend: Any, name: str, copies: int, at: datetime | None = None) -> None:
        component = find(backend, name)
        if component is None:
            return
        component.runtime_config = {**(component.runtime_config or {}), "CopyCount": copies}
        host = _hosting()
        scale = getattr(host, "scale", None)
        if scale is not None:
            scale(component, copies, at)

    def finder(backend: Any, name: str | None) -> Any:
        if name is None:
            return next(iter(components_of(backend).values()), None)
        return find(backend, name)

    autoscaling.set_component_hooks(set_copies, finder)

    original_create_config = SageMakerResponse.create_endpoint_config

    def create_endpoint_config(self: Any) -> Any:
        variants = self._get_param("ProductionVariants") or []
        problem = managed_scaling_problem(variants, self.region)
        if problem:
            raise ValidationError(message=problem)
        result = original_create_config(self)
        config = self.sagemaker_backend.endpoint_configs[self._get_param("EndpointConfigName")]
        for stored, asked in zip(config.production_variants, variants, strict=False):
            if asked.get("ManagedInstanceScaling"):
                stored["ManagedInstanceScaling"] = asked["ManagedInstanceScaling"]
        return result

    def updatable(backend: Any, name: str, changes: bool) -> Any:
        """The component NAME an update may change: there, not an adapter (with CHANGES), InService."""
        component = find(backend, name)
        if component is None or component.seen_deleting >= 0:
            raise ValidationError(message=f'Could not find inference component "{name}".')
        if changes and component.base is not None:
            raise ValidationError(message="An adapter inference component takes no RuntimeConfig or Specification.")
        refresh(backend, component)
        if component.status != "InService":
            raise ValidationError(message=f"Inference component {name} is {component.status}: it must be InService.")
        return component

    def update_runtime_config(self: Any) -> Any:
        from moto.core.responses import ActionResult

        name = str(self._get_param("InferenceComponentName"))
        copies = (self._get_param("DesiredRuntimeConfig") or {}).get("CopyCount")
        if copies is None or int(copies) < 0:
            raise ValidationError(message="DesiredRuntimeConfig.CopyCount of at least 0 is required.")
        component = updatable(self.sagemaker_backend, name, True)
        set_copies(self.sagemaker_backend, name, int(copies))
        return ActionResult({"InferenceComponentArn": component.arn})

    def update_inference_component(self: Any) -> Any:
        from moto.core.responses import ActionResult

        backend = self.sagemaker_backend
        name = str(self._get_param("InferenceComponentName"))
        runtime, spec = self._get_param("RuntimeConfig"), self._get_param("Specification")
        component = updatable(backend, name, bool(runtime or spec))
        if runtime:
            set_copies(backend, name, int(runtime.get("CopyCount") or 0))
        if spec:
            update_spec(backend, component, spec, self._get_param("DeploymentConfig"))
        return ActionResult({"InferenceComponentArn": component.arn})

    def fits_beside(backend: Any, component: Any, spec: dict[str, Any], deployment: dict[str, Any] | None) -> None:
        endpoint = backend.endpoints.get(component.endpoint_name)
        config = backend.endpoint_configs.get(endpoint.endpoint_config_name) if endpoint else None
        variant: dict[str, Any] = next(iter(config.production_variants), {}) if config else {}
        scaling = variant.get("ManagedInstanceScaling") or {}
        enabled = scaling.get("Status") == "ENABLED"
        most = int(scaling["MaxInstanceCount"] if enabled else variant.get("InitialInstanceCount") or 1)
        held = [c for c in components_of(backend).values() if c.endpoint_name == component.endpoint_name
                and c.base is None and c.seen_deleting < 0]  # fmt: skip
        copies = {c.name: int((c.runtime_config or {}).get("CopyCount") or 0) for c in held}
        wanted = int((spec.get("ComputeResourceRequirements") or {}).get("NumberOfAcceleratorDevicesRequired") or 1)
        per_instance = max(1, _gpus(str(variant.get("InstanceType"))) // max(1, wanted))
        problem = rolling_batch_problem(copies.get(component.name, 0), deployment) or update_capacity_problem(
            copies, component.name, deployment, most, per_instance)  # fmt: skip
        if problem:
            raise ValidationError(message=problem)

    def update_spec(
        backend: Any, component: Any, spec: dict[str, Any], deployment: dict[str, Any] | None = None
    ) -> None:
        """A new model for the component (a channel's promotion): Updating until its container answers."""
        model_name = spec.get("ModelName")
        if not model_name or model_name not in backend._models:
            raise ValidationError(message=f'Could not find model "{model_name}".')
        check_startup(spec.get("StartupParameters") or {})
        fits_beside(backend, component, spec, deployment)
        merged = {**component.specification, **spec}
        update_model = getattr(_hosting(), "update_model", None)
        if update_model is None:
            component.specification = merged
            return
        component.status = "Updating"
        update_model(component, dict(backend._models[model_name].primary_container or {}), merged)

    SageMakerResponse.create_endpoint_config = create_endpoint_config
    SageMakerResponse.update_inference_component_runtime_config = update_runtime_config
    SageMakerResponse.update_inference_component = update_inference_component

    # ---- the endpoint's instances follow the running copies (managed instance scaling) --------------
    original_describe = sm.SageMakerModelBackend.describe_endpoint

    def describe_endpoint(self: Any, endpoint_name: str) -> Any:
        autoscaling.drive(self, self.account_id, self.region_name)
        out = original_describe(self, endpoint_name)
        endpoint = self.endpoints.get(endpoint_name)
        config = self.endpoint_configs.get(endpoint.endpoint_config_name) if endpoint else None
        if config is None or not isinstance(out, dict):
            return out
        scaling = next((v.get("ManagedInstanceScaling") for v in config.production_variants), None)
        if scaling and scaling.get("Status") == "ENABLED":
            held = [c for c in components_of(self).values() if c.endpoint_name == endpoint_name and c.base is None]
            running = sum(current_copies(c) for c in held)
            desired = sum(int((c.runtime_config or {}).get("CopyCount") or 0) for c in held)
            low, high = int(scaling.get("MinInstanceCount", 0)), int(scaling.get("MaxInstanceCount", 1))
            for variant in out.get("ProductionVariants") or []:
                variant["CurrentInstanceCount"] = max(low, min(high, running))
                variant["DesiredInstanceCount"] = max(low, min(high, desired))
                variant["ManagedInstanceScaling"] = scaling
        return out

    sm.SageMakerModelBackend.describe_endpoint = describe_endpoint
