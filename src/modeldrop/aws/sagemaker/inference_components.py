"""SageMaker inference components (adapter_mode shared): the base component that runs the base model
on its endpoint, the adapter components on it, and their release -- adapters first, then the base,
and the endpoint only once none is left (SageMaker's order)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import ClientError

from modeldrop.aws.pages import all_items
from modeldrop.aws.sagemaker.sagemaker_resources import (
    DEPLOYMENT_TAG,
    _already_exists,
    _is_missing,
    _raise_domain,
    list_tags,
)
from modeldrop.contracts import clock
from modeldrop.contracts.errors import EndpointFailed, ResourceNameTaken
from modeldrop.contracts.step_payloads import ComponentPlan

if TYPE_CHECKING:
    from mypy_boto3_sagemaker import SageMakerClient
    from mypy_boto3_sagemaker.type_defs import (
        InferenceComponentSpecificationTypeDef,
        InferenceComponentStartupParametersTypeDef,
        TagTypeDef,
    )

MAX_NAME = 63


def component_name(endpoint: str, suffix: str) -> str:
    """<endpoint>-<suffix>, or (past SageMaker's 63 characters) cut with a hash that keeps it unique."""
    name = f"{endpoint}-{suffix}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{endpoint[: MAX_NAME - len(digest) - len(suffix[:12]) - 2]}-{suffix[:12]}-{digest}".replace("--", "-")


def describe(sm: SageMakerClient, name: str) -> dict[str, Any] | None:
    try:
        return cast("dict[str, Any]", sm.describe_inference_component(InferenceComponentName=name))
    except ClientError as exc:
        if _is_missing(exc):
            return None
        _raise_domain(exc, f"describing inference component {name}")
        raise


def on_endpoint(sm: SageMakerClient, endpoint: str) -> list[dict[str, Any]]:
    return all_items(sm, "list_inference_components", "InferenceComponents", EndpointNameEquals=endpoint)


def _create(sm: SageMakerClient, name: str, owner: str, call: Any) -> bool:
    """Create (True), or adopt what a retried step of this deployment created (False)."""
    try:
        call()
        return True
    except ClientError as exc:
        if not _already_exists(exc):
            _raise_domain(exc, f"creating inference component {name}")
            raise
    desc = describe(sm, name)
    theirs = list_tags(sm, str(desc["InferenceComponentArn"])).get(DEPLOYMENT_TAG) if desc else None
    if theirs != owner:
        raise ResourceNameTaken(f"inference-component/{name} already exists and belongs to {theirs or 'someone else'}")
    return False


@dataclass
class Attached:
    """Where the components stand: InService once the base and every adapter are."""

    status: str
    components: dict[str, str] = field(default_factory=dict)  # name -> status


def base_specification(plan: ComponentPlan) -> InferenceComponentSpecificationTypeDef:
    spec: InferenceComponentSpecificationTypeDef = {
        "ModelName": plan.model_name,
        "ComputeResourceRequirements": {
            "NumberOfAcceleratorDevicesRequired": plan.accelerators,
            "MinMemoryRequiredInMb": plan.memory_mb,
        },
    }
    startup: InferenceComponentStartupParametersTypeDef = {}
    if plan.download_timeout_seconds:
        startup["ModelDataDownloadTimeoutInSeconds"] = plan.download_timeout_seconds
    if plan.startup_timeout_seconds:
        startup["ContainerStartupHealthCheckTimeoutInSeconds"] = plan.startup_timeout_seconds
    if startup:
        spec["StartupParameters"] = startup
    return spec


def attach(sm: SageMakerClient, endpoint: str, plan: ComponentPlan, owner: str) -> Attached:
    """One pass (the poll loop calls it until InService): the base component once the endpoint is
    InService, each adapter component once the base is; a Failed one fails the deployment."""
    tags = cast("list[TagTypeDef]", plan.tags)
    base = describe(sm, plan.base)
    if base is None:
        _create(
            sm,
            plan.base,
            owner,
            lambda: sm.create_inference_component(
                InferenceComponentName=plan.base,
                EndpointName=endpoint,
                VariantName=plan.variant,
                Specification=base_specification(plan),
                RuntimeConfig={"CopyCount": plan.copies},
                Tags=tags,
            ),
        )
        return Attached("Creating", {plan.base: "Creating"})
    state = {plan.base: str(base["InferenceComponentStatus"])}
    _fail_on(base)
    if state[plan.base] != "InService":
        return Attached("Creating", state)
    for adapter in plan.adapters:
        desc = describe(sm, adapter.component)
        if desc is None:
            _create(
                sm,
                adapter.component,
                owner,
                lambda a=adapter: sm.create_inference_component(
                    InferenceComponentName=a.component,
                    EndpointName=endpoint,
                    Specification={
                        "BaseInferenceComponentName": plan.base,
                        "Container": {"ArtifactUrl": a.artifact_url},
                    },
                    Tags=tags,
                ),
            )
            state[adapter.component] = "Creating"
            continue
        _fail_on(desc)
        state[adapter.component] = str(desc["InferenceComponentStatus"])
    done = all(s == "InService" for s in state.values())
    return Attached("InService" if done else "Creating", state)


def _fail_on(desc: dict[str, Any]) -> None:
    if desc.get("InferenceComponentStatus") == "Failed":
        name = desc["InferenceComponentName"]
        raise EndpointFailed(
            f"inference component {name} Failed: {desc.get('FailureReason') or '(no FailureReason given)'}",
            "the base component's logs are in /aws/sagemaker/InferenceComponents/<base component>; an adapter that "
            "fails to load is usually one the base's LoRA settings do not fit (rank, target modules)",
        )


@dataclass
class Released:
    deleted: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    not_ours: list[str] = field(default_factory=list)
    owned: set[str] = field(default_factory=set)  # the names of the owner's components the pass saw
    blocked: list[str] = field(default_factory=list)  # own bases that another deployment's adapters use
    waiting: list[str] = field(default_factory=list)  # own components still Deleting when the time ran out


def _owners(sm: SageMakerClient, descs: list[dict[str, Any]]) -> dict[str, str | None]:
    """Each component still there -> the deployment its tag names (a Deleting one may be gone)."""
    owners: dict[str, str | None] = {}
    for desc in descs:
        try:
            tags = list_tags(sm, str(desc["InferenceComponentArn"]))
        except ClientError as exc:
            if not _is_missing(exc):
                raise
            continue
        owners[str(desc["InferenceComponentName"])] = tags.get(DEPLOYMENT_TAG)
    return owners


def _base_of(desc: dict[str, Any]) -> str | None:
    base = desc.get("Specification", {}).get("BaseInferenceComponentName")
    return str(base) if base else None


def _delete_one(sm: SageMakerClient, name: str, out: Released) -> None:
    label = f"inference-component/{name}"
    try:
        sm.delete_inference_component(InferenceComponentName=name)
        out.deleted.append(label)
    except ClientError as exc:
        if _is_missing(exc):
            return
        _raise_domain(exc, f"deleting {label}")
        out.failed.append(f"{label}: {exc.response.get('Error', {}).get('Message', exc)}")


def release(sm: SageMakerClient, endpoint: str, owner: str, only: str | None = None) -> Released:
    """Delete the OWNER's components on ENDPOINT (ONLY: that one component): adapters first, a base
    once no adapter uses it. Never another deployment's: a base of ours that another deployment's
    adapters use stays, and is reported as blocked."""
    out = Released()
    descs = [d for d in (describe(sm, str(c["InferenceComponentName"])) for c in on_endpoint(sm, endpoint)) if d]
    owners = _owners(sm, descs)
    users: dict[str, list[str]] = {}  # base -> the adapters on it
    for desc in descs:
        base = _base_of(desc)
        if base and str(desc["InferenceComponentName"]) in owners:
            users.setdefault(base, []).append(str(desc["InferenceComponentName"]))
    # Adapters first (their bases are refused while they exist).
    for desc in sorted(descs, key=lambda d: _base_of(d) is None):
        name = str(desc["InferenceComponentName"])
        if (only is not None and name != only) or name not in owners:
            continue
        if owners[name] != owner:
            out.not_ours.append(f"inference-component/{name}")
            continue
        out.owned.add(name)
        if desc.get("InferenceComponentStatus") == "Deleting":
            continue  # on its way
        if name in users:
            theirs = sorted(u for u in users[name] if owners.get(u) != owner)
            if theirs and only is None:
                out.blocked.append(f"inference-component/{name}: the base of another deployment's {', '.join(theirs)}")
            continue
        _delete_one(sm, name, out)
    return out


def pending(sm: SageMakerClient, endpoint: str, owner: str | None = None) -> list[str]:
    """The components still on ENDPOINT (SageMaker will not delete an endpoint that holds any); with
    OWNER, only that deployment's (another's, attached to the endpoint, are not its to wait for)."""
    left = []
    for item in on_endpoint(sm, endpoint):
        if owner is not None:
            try:
                if list_tags(sm, str(item["InferenceComponentArn"])).get(DEPLOYMENT_TAG) != owner:
                    continue
            except ClientError as exc:
                if _is_missing(exc):
                    continue
                raise
        left.append(f"inference-component/{item['InferenceComponentName']}")
    return left


# How long an immediate teardown waits for its components to go before it deletes the endpoint, and
# the time a Lambda keeps after settling for the deletes and records that follow.
SETTLE_PASSES = 24
SETTLE_SECONDS = 5.0
SETTLE_RESERVE_SECONDS = 20.0


def release_all(sm: SageMakerClient, endpoint: str, owner: str | None) -> Released:
    """Release the OWNER's components on ENDPOINT and wait until none of them is left (or nothing more
    can go: a base that another deployment's adapters still use), at most SETTLE_PASSES: what an
    immediate teardown does before DeleteEndpoint. No OWNER: nothing is released. In a Lambda it
    stops waiting while SETTLE_RESERVE_SECONDS remain, and says what is still on its way (waiting):
    components can take minutes to delete, and the caller leaves the endpoint to its next pass."""
    out = Released()
    if owner is None:
        return out
    for _ in range(SETTLE_PASSES):
        one = release(sm, endpoint, owner)
        out.deleted += one.deleted
        out.failed += one.failed
        out.not_ours, out.blocked = one.not_ours, one.blocked
        # One listing after the pass: what is left, and whether anything is on its way (a component
        # that is Deleting, ours or an adapter on our base, may free the rest).
        left = {str(c["InferenceComponentName"]): str(c["InferenceComponentStatus"]) for c in on_endpoint(sm, endpoint)}
        if not (set(left) & one.owned) or one.failed:
            out.waiting = []
            return out
        if not one.deleted and "Deleting" not in left.values():
            out.waiting = []
            return out
        out.waiting = sorted(f"inference-component/{n}" for n in set(left) & one.owned)
        time_left = clock.time_left()
        if time_left is not None and time_left < SETTLE_SECONDS + SETTLE_RESERVE_SECONDS:
            return out
        clock.sleep(SETTLE_SECONDS)
    return out


def for_components(sm: SageMakerClient, config_name: str) -> bool:
    """Whether the endpoint config hosts inference components (its variants name no model)."""
    try:
        variants = sm.describe_endpoint_config(EndpointConfigName=config_name).get("ProductionVariants") or []
    except ClientError as exc:
        if _is_missing(exc):
            return False
        _raise_domain(exc, f"describing endpoint-config/{config_name}")
        raise
    return bool(variants) and not any(v.get("ModelName") for v in variants)


def component_container_env(sm: SageMakerClient, name: str) -> tuple[str, dict[str, str]] | None:
    """(status, the model's container env) of component NAME -- an adapter's is its base's model;
    None when it does not exist."""
    desc = describe(sm, name)
    if desc is None:
        return None
    base = _base_of(desc)
    model_of = describe(sm, base) if base else desc
    model = (model_of or {}).get("Specification", {}).get("ModelName")
    env: dict[str, str] = {}
    if model:
        found = sm.describe_model(ModelName=str(model))
        container = found.get("PrimaryContainer") or (found.get("Containers") or [{}])[0]
        env = dict(container.get("Environment") or {})
    return str(desc.get("InferenceComponentStatus")), env
