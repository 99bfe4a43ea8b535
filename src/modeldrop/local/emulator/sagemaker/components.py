"""SageMaker inference components in the emulator (moto 5.2.5 has none), as strict as the API reference.

- An endpoint for inference components is one whose config names no ModelName in its variants; such
  a config needs an ExecutionRoleArn, and cannot mix with variants that name a model.
- CreateInferenceComponent: a name of at most 63 of [a-zA-Z0-9-], unique (case-insensitively); the
  endpoint must exist, be InService and be an endpoint for components, and the variant must be its own.
  - A base component names an existing model, its compute (MinMemoryRequiredInMb) and a copy count.
  - An adapter component names an InService base component on the same endpoint
    (BaseInferenceComponentName) and a `.tar.gz` Container.ArtifactUrl, and takes no ModelName, no
    compute and no copy count: it uses the base's.
- Creating -> InService or Failed, decided by the local hosting (it runs the base's model and loads
  each adapter into that running engine); DeleteInferenceComponent makes it Deleting (still listed
  and described, its name still taken) until it is seen once more.
- UpdateInferenceComponent and the copies (scaled to zero and back) are component_scaling's.
- Stricter than the documentation says in two places: a base that still holds adapters, and an
  endpoint that still holds components, are refused deletion (modeldrop deletes adapters, then the
  base, then the endpoint, as the SageMaker guide does).
"""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="method-assign,assignment,attr-defined"
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from modeldrop.contracts import clock
from modeldrop.local.emulator.autoscaling import driving as autoscaling

_NAME = re.compile(r"^[a-zA-Z0-9]([\-a-zA-Z0-9]*[a-zA-Z0-9])?$")
_ARTIFACT = re.compile(r"^(https|s3)://([^/]+)/?(.*)$")


@dataclass
class Component:
    name: str
    arn: str
    endpoint_name: str
    endpoint_arn: str
    variant_name: str | None
    specification: dict[str, Any]
    runtime_config: dict[str, Any] | None
    tags: list[dict[str, str]]
    created: datetime = field(default_factory=clock.utcnow)
    status: str = "Creating"
    failure_reason: str | None = None
    seen_deleting: int = -1  # describes/lists since the delete; -1 while not Deleting
    gone_at: datetime | None = None  # when a Deleting component is gone (the emulator's clock)

    @property
    def base(self) -> str | None:
        return self.specification.get("BaseInferenceComponentName")

    def summary(self) -> dict[str, Any]:
        return {
            "InferenceComponentName": self.name,
            "InferenceComponentArn": self.arn,
            "EndpointName": self.endpoint_name,
            "EndpointArn": self.endpoint_arn,
            "VariantName": self.variant_name or "AllTraffic",
            "InferenceComponentStatus": self.status,
            "CreationTime": self.created,
            "LastModifiedTime": self.created,
        }

    def describe(self) -> dict[str, Any]:
        out = self.summary()
        spec = {k: v for k, v in self.specification.items() if k != "Container"}
        if "Container" in self.specification:
            spec["Container"] = {"ArtifactUrl": self.specification["Container"].get("ArtifactUrl")}
        out["Specification"] = spec
        if self.runtime_config:
            copies = int(self.runtime_config.get("CopyCount") or 0)
            out["RuntimeConfig"] = {"DesiredCopyCount": copies, "CurrentCopyCount": current_copies(self)}
        if self.failure_reason:
            out["FailureReason"] = self.failure_reason
        return out


class ComponentHosting(Protocol):
    """What runs a component (modeldrop.local.emulator.sagemaker.component_hosting.ComponentHost)."""

    def created(self, component: Component, model_container: dict[str, Any] | None) -> None: ...

    def status(self, component: Component) -> tuple[str, str | None]: ...

    def deleted(self, component: Component) -> None: ...

    def delete_seconds(self) -> float: ...


def current_copies(component: Component) -> int:
    """Copies that answer: the desired ones, as far as the host has them running (0 while scaled in)."""
    desired = int((component.runtime_config or {}).get("CopyCount") or 0)
    if component.status != "InService" or component.base is not None:
        return 0
    running = getattr(_hosting(), "running_copies", None)
    return desired if running is None or running(component) else 0  # one local process holds every copy


def components_of(backend: Any) -> dict[str, Component]:
    if not hasattr(backend, "_modeldrop_components"):
        backend._modeldrop_components = {}
    store: dict[str, Component] = backend._modeldrop_components
    return store


def find(backend: Any, name: str) -> Component | None:
    return next((c for n, c in components_of(backend).items() if n.lower() == name.lower()), None)


_host: ComponentHosting | None = None


def set_component_host(host: ComponentHosting | None) -> None:
    """What runs the components (the local hosting's; None: they go InService at once)."""
    global _host
    _host = host


def _hosting() -> ComponentHosting | None:
    return _host


def _refresh(backend: Any, component: Component) -> None:
    """Advance what the hosting decides; a Deleting component seen once more, and past the time its
    deletion takes, is gone."""
    if component.seen_deleting >= 0:
        component.seen_deleting += 1
        if component.seen_deleting > 1 and (component.gone_at is None or clock.utcnow() >= component.gone_at):
            components_of(backend).pop(component.name, None)
        return
    hosting = _hosting()
    if hosting is not None and component.status == "Creating":
        component.status, component.failure_reason = hosting.status(component)
    update_status = getattr(hosting, "update_status", None)
    if update_status is not None and component.status == "Updating":
        component.status, component.failure_reason = update_status(component)


def is_component_endpoint(backend: Any, endpoint_name: str) -> bool:
    endpoint = backend.endpoints.get(endpoint_name)
    if endpoint is None:
        return False
    config = backend.endpoint_configs.get(endpoint.endpoint_config_name)
    return config is not None and not any(v.get("ModelName") for v in config.production_variants)


def install() -> None:
    from moto.sagemaker import models as sm
    from moto.sagemaker.exceptions import ValidationError
    from moto.sagemaker.responses import SageMakerResponse
    from moto.sagemaker.utils import arn_formatter

    def arn(backend: Any, kind: str, name: str) -> str:
        return str(arn_formatter(kind, name, backend.account_id, backend.region_name))

    # ---- endpoint configs for components --------------------------------------------------------
    original_validate = sm.SageMakerModelBackend.validate_production_variants
    original_create_config = SageMakerResponse.create_endpoint_config
    original_describe_config = sm.SageMakerModelBackend.describe_endpoint_config

    def validate_production_variants(self: Any, production_variants: list[dict[str, Any]]) -> None:
        original_validate(self, [v for v in production_variants if v.get("ModelName")])

    def create_endpoint_config(self: Any) -> Any:
        variants = self._get_param("ProductionVariants") or []
        role = self._get_param("ExecutionRoleArn")
        modelless = [v for v in variants if not v.get("ModelName")]
        if modelless and len(modelless) != len(variants):
            raise ValidationError(
                message="Either all or none of the production variants must specify ModelName: a variant without "
                "one hosts inference components."
            )
        if modelless and not role:
            raise ValidationError(
                message="ExecutionRoleArn is required for an endpoint configuration whose production variants do "
                "not specify ModelName (an endpoint for inference components)."
            )
        result = original_create_config(self)
        config = self.sagemaker_backend.endpoint_configs[self._get_param("EndpointConfigName")]
        config.execution_role_arn = role
        return result

    def describe_endpoint_config(self: Any, endpoint_config_name: str) -> Any:
        out = dict(original_describe_config(self, endpoint_config_name))
        role = getattr(self.endpoint_configs[endpoint_config_name], "execution_role_arn", None)
        if role:
            out["ExecutionRoleArn"] = role
        return out

    sm.SageMakerModelBackend.validate_production_variants = validate_production_variants
    SageMakerResponse.create_endpoint_config = create_endpoint_config
    sm.SageMakerModelBackend.describe_endpoint_config = describe_endpoint_config

    # ---- an endpoint that holds components is not deleted -----------------------------------------
    original_delete_endpoint = sm.SageMakerModelBackend.delete_endpoint

    def delete_endpoint(self: Any, endpoint_name: str) -> None:
        held = sorted(c.name for c in components_of(self).values() if c.endpoint_name == endpoint_name)
        if held:
            raise ValidationError(
                message=f'Cannot delete endpoint "{arn(self, "endpoint", endpoint_name)}": it still has inference '
                f"components ({', '.join(held)}). Delete them first."
            )
        original_delete_endpoint(self, endpoint_name)

    sm.SageMakerModelBackend.delete_endpoint = delete_endpoint

    # ---- tags on components ----------------------------------------------------------------------
    original_resource = sm.SageMakerModelBackend._get_resource_from_arn

    def get_resource_from_arn(self: Any, resource_arn: str) -> Any:
        kind, _, name = resource_arn.split(":")[-1].partition("/")
        if kind == "inference-component":
            component = find(self, name)
            if component is None:
                raise ValidationError(message=f"Could not find inference-component with name {name}")
            return component
        return original_resource(self, resource_arn)

    sm.SageMakerModelBackend._get_resource_from_arn = get_resource_from_arn

    def add_tags(self: Any, arn_: str, tags: list[dict[str, str]]) -> list[dict[str, str]]:
        """AddTags as SageMaker does it: a key that is there already gets the new value (moto appends a
        second tag of the same key), and a resource holds at most 50 tags."""
        resource = self._get_resource_from_arn(arn_)
        merged = {t["Key"]: t["Value"] for t in resource.tags}
        merged.update({t["Key"]: t["Value"] for t in tags})
        if len(merged) > 50:
            raise ValidationError(message="A resource can have at most 50 tags.")
        resource.tags = [{"Key": k, "Value": v} for k, v in merged.items()]
        return list(resource.tags)

    sm.SageMakerModelBackend.add_tags = add_tags

    def existing(backend: Any, name: str, live: bool = False) -> Component:
        """The component NAME (LIVE: not Deleting), or SageMaker's not-found error."""
        component = find(backend, name)
        if component is None or (live and component.seen_deleting >= 0):
            missing = arn(backend, "inference-component", name)
            raise ValidationError(message=f'Could not find inference component "{missing}".')
        return component

    # ---- the API ---------------------------------------------------------------------------------
    def create_inference_component(self: Any) -> Any:
        from moto.core.responses import ActionResult

        backend = self.sagemaker_backend
        name = str(self._get_param("InferenceComponentName") or "")
        endpoint_name = str(self._get_param("EndpointName") or "")
        variant = self._get_param("VariantName")
        spec: dict[str, Any] = self._get_param("Specification") or {}
        runtime = self._get_param("RuntimeConfig")
        if not _NAME.match(name) or len(name) > 63:
            raise ValidationError(
                message=f"1 validation error detected: Value '{name}' at 'inferenceComponentName' failed to satisfy "
                "constraint: Member must satisfy regular expression pattern: ^[a-zA-Z0-9]([\\-a-zA-Z0-9]*[a-zA-Z0-9])?$"
                " and have length less than or equal to 63"
            )
        if find(backend, name) is not None:
            taken = arn(backend, "inference-component", name)
            raise ValidationError(message=f'Cannot create already existing inference component "{taken}".')
        endpoint = backend.endpoints.get(endpoint_name)
        if endpoint is None:
            raise ValidationError(message=f'Could not find endpoint "{arn(backend, "endpoint", endpoint_name)}".')
        if not is_component_endpoint(backend, endpoint_name):
            raise ValidationError(
                message=f"Endpoint {endpoint_name} hosts models in its production variants; inference components "
                "need an endpoint whose configuration names no ModelName."
            )
        status = backend.describe_endpoint(endpoint_name)["EndpointStatus"]
        if status != "InService":
            raise ValidationError(message=f"Endpoint {endpoint_name} is {status}: it must be InService.")
        config = backend.endpoint_configs[endpoint.endpoint_config_name]
        variants = [v["VariantName"] for v in config.production_variants]
        base_name = spec.get("BaseInferenceComponentName")
        model_container: dict[str, Any] | None = None
        if base_name:
            base = existing(backend, base_name, live=True)
            _refresh(backend, base)
            if base.endpoint_name != endpoint_name or base.base is not None or base.status != "InService":
                raise ValidationError(
                    message=f"Base inference component {base_name} must be an InService base component on endpoint "
                    f"{endpoint_name} (it is {base.status}"
                    f"{', an adapter' if base.base else ''} on {base.endpoint_name})."
                )
            extra = [k for k in ("ModelName", "ComputeResourceRequirements", "StartupParameters") if k in spec]
            if extra or runtime:
                raise ValidationError(
                    message="An adapter inference component uses its base's model and compute: it takes no "
                    f"{', '.join([*extra, *(['RuntimeConfig'] if runtime else [])])}."
                )
            url = str((spec.get("Container") or {}).get("ArtifactUrl") or "")
            if not _ARTIFACT.match(url) or not url.endswith(".tar.gz"):
                raise ValidationError(
                    message="An adapter inference component needs Specification.Container.ArtifactUrl: the S3 path "
                    f"of a single gzip compressed tar archive (.tar.gz suffix); got {url!r}."
                )
            variant = variant or base.variant_name
        else:
            if variant not in variants:
                raise ValidationError(message=f"Variant {variant!r} is not a production variant of {endpoint_name}.")
            model_name = spec.get("ModelName")
            if not model_name or model_name not in backend._models:
                raise ValidationError(message=f'Could not find model "{arn(backend, "model", str(model_name))}".')
            compute = spec.get("ComputeResourceRequirements") or {}
            if not compute.get("MinMemoryRequiredInMb"):
                raise ValidationError(
                    message="Specification.ComputeResourceRequirements.MinMemoryRequiredInMb is required for an "
                    "inference component that hosts a model."
                )
            if not runtime or int(runtime.get("CopyCount") or 0) < 1:
                raise ValidationError(message="RuntimeConfig.CopyCount of at least 1 is required.")
            _check_startup(spec.get("StartupParameters") or {})
            model = backend._models[model_name]
            model_container = dict(model.primary_container or {})
        component = Component(
            name=name,
            arn=arn(backend, "inference-component", name),
            endpoint_name=endpoint_name,
            endpoint_arn=endpoint.arn,
            variant_name=variant,
            specification=spec,
            runtime_config=runtime,
            tags=list(self._get_param("Tags") or []),
        )
        components_of(backend)[name] = component
        hosting = _hosting()
        if hosting is not None:
            hosting.created(component, model_container)
        else:
            component.status = "InService"
        return ActionResult({"InferenceComponentArn": component.arn})

    def describe_inference_component(self: Any) -> Any:
        from moto.core.responses import ActionResult

        backend = self.sagemaker_backend
        component = existing(backend, str(self._get_param("InferenceComponentName")))
        autoscaling.drive(backend, backend.account_id, backend.region_name)
        _refresh(backend, component)
        return ActionResult(component.describe())

    def list_inference_components(self: Any) -> Any:
        from moto.core.responses import ActionResult

        backend = self.sagemaker_backend
        endpoint = self._get_param("EndpointNameEquals")
        status = self._get_param("StatusEquals")
        base = self._get_param("BaseInferenceComponentName")
        listed = []
        for component in list(components_of(backend).values()):
            if endpoint and component.endpoint_name != endpoint:
                continue
            _refresh(backend, component)
            if component.name not in components_of(backend):
                continue
            if status and component.status != status:
                continue
            if base and component.base != base:
                continue
            listed.append(component.summary())
        return ActionResult({"InferenceComponents": sorted(listed, key=lambda c: c["CreationTime"])})

    def delete_inference_component(self: Any) -> Any:
        from moto.core.responses import EmptyResult

        backend = self.sagemaker_backend
        name = str(self._get_param("InferenceComponentName"))
        component = existing(backend, name)
        adapters = sorted(c.name for c in components_of(backend).values() if c.base == component.name)
        if adapters:
            raise ValidationError(
                message=f"Cannot delete inference component {name}: adapter inference components still use it "
                f"({', '.join(adapters)}). Delete them first."
            )
        if component.seen_deleting < 0:
            component.status, component.seen_deleting = "Deleting", 0
            hosting = _hosting()
            if hosting is not None:
                component.gone_at = clock.utcnow() + timedelta(seconds=hosting.delete_seconds())
                hosting.deleted(component)
        return EmptyResult()

    SageMakerResponse.create_inference_component = create_inference_component
    SageMakerResponse.describe_inference_component = describe_inference_component
    SageMakerResponse.list_inference_components = list_inference_components
    SageMakerResponse.delete_inference_component = delete_inference_component


@functools.cache
def _startup_shape() -> Any:
    import botocore.session

    return (
        botocore.session.get_session().get_service_model("sagemaker").shape_for("InferenceComponentStartupParameters")
    )


def _check_startup(startup: dict[str, Any]) -> None:
    """StartupParameters within the bounds botocore's model gives (60-3600 s): botocore checks only the
    minimum on the client, SageMaker refuses the rest."""
    from moto.sagemaker.exceptions import ValidationError

    for name, member in _startup_shape().members.items():
        value = startup.get(name)
        low, high = member.metadata.get("min"), member.metadata.get("max")
        if value is not None and not (low <= int(value) <= high):
            raise ValidationError(
                message=f"Value '{value}' at 'specification.startupParameters.{name[0].lower()}{name[1:]}' failed to "
                f"satisfy constraint: Member must have value between {low} and {high}"
            )
