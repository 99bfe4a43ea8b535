"""UpdateEndpoint in the emulator (moto 5.2.5 has none), blue/green as SageMaker's deployment
guardrails run it, and as strict as the API reference.

- The endpoint must exist and be InService ("Cannot update in-progress endpoint"), the new config
  must exist, an endpoint for inference components takes no blue/green policy, and DeploymentConfig
  is held to its shape: one of BlueGreenUpdatePolicy / RollingUpdatePolicy; a traffic routing Type of
  ALL_AT_ONCE, CANARY (with CanarySize) or LINEAR (with LinearStepSize); WaitIntervalInSeconds and
  TerminationWaitInSeconds in [0, 3600]; MaximumExecutionTimeoutInSeconds in [600, 28800]; 1 to 10
  AutoRollbackConfiguration alarms, which the new config's execution role must be allowed to
  DescribeAlarms; the new fleet counts against the endpoint quota beside the serving one.
- Updating: the new config's fleet (green) starts beside the serving one (blue, which keeps
  answering). Once green is InService the traffic shifts and the bake runs (the wait interval and
  the termination wait, virtual time); an alarm of AutoRollbackConfiguration in ALARM during it
  rolls back (Updating while traffic returns, then InService on the old config, the alarm OK
  again). Past the bake blue stops and the endpoint names the new config.
- Faults: `alarm-during-bake` sets the first rollback alarm to ALARM once the bake starts;
  `silent-rollback` ends the update InService on the old config with no reason given (what
  terraform-provider-aws#48997 reports), so only reading the config back tells.
"""

# Monkeypatching moto is this module's purpose.
# mypy: disable-error-code="method-assign,attr-defined"
from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from modeldrop.contracts import clock
from modeldrop.local.emulator.sagemaker.hosted import HostedEndpoint

GREEN = "@green"
# The bake also ends after this many DescribeEndpoint calls during it: a caller in another process
# (the CLI against `modeldrop local up`) waits in real time, which the emulator's clock does not see.
BAKE_POLLS = 3


@dataclass
class PendingUpdate:
    config: str
    alarms: list[str]
    bake_seconds: int
    fault: str
    green: HostedEndpoint
    bake_started: datetime | None = None
    rolling_back: bool = False
    polls_in_bake: int = 0
    started: datetime | None = None
    timeout_seconds: int = 3600  # MaximumExecutionTimeoutInSeconds: past it, the update rolls back


def _problem(config: dict[str, Any]) -> str | None:
    blue_green, rolling = config.get("BlueGreenUpdatePolicy"), config.get("RollingUpdatePolicy")
    if blue_green and rolling:
        return "DeploymentConfig takes one of BlueGreenUpdatePolicy and RollingUpdatePolicy, not both."
    if blue_green:
        routing = blue_green.get("TrafficRoutingConfiguration") or {}
        kind = routing.get("Type")
        if kind not in ("ALL_AT_ONCE", "CANARY", "LINEAR"):
            return f"TrafficRoutingConfiguration.Type {kind!r} is not one of ALL_AT_ONCE, CANARY, LINEAR."
        needed = {"CANARY": "CanarySize", "LINEAR": "LinearStepSize"}.get(kind)
        if needed and not routing.get(needed):
            return f"TrafficRoutingConfiguration of type {kind} needs {needed}."
        for size in (routing.get("CanarySize"), routing.get("LinearStepSize")):
            if size and (size.get("Type") not in ("INSTANCE_COUNT", "CAPACITY_PERCENT") or int(size["Value"]) < 1):
                return "A CapacitySize needs Type INSTANCE_COUNT or CAPACITY_PERCENT and a Value of at least 1."
        for key, low, high in (
            ("WaitIntervalInSeconds", 0, 3600),
            ("TerminationWaitInSeconds", 0, 3600),
            ("MaximumExecutionTimeoutInSeconds", 600, 28800),
        ):
            source = routing if key == "WaitIntervalInSeconds" else blue_green
            if key in source and not low <= int(source[key]) <= high:
                return f"{key} must be between {low} and {high}."
    alarms = (config.get("AutoRollbackConfiguration") or {}).get("Alarms")
    if alarms is not None and not 1 <= len(alarms) <= 10:
        return "AutoRollbackConfiguration.Alarms takes 1 to 10 alarms."
    return None


def _alarm_backend(backend: Any) -> Any:
    from moto.cloudwatch.models import cloudwatch_backends

    return cloudwatch_backends[backend.account_id][backend.region_name]


def _in_alarm(backend: Any, names: list[str]) -> list[str]:
    alarms = _alarm_backend(backend).alarms
    return [n for n in names if n in alarms and alarms[n].state_value == "ALARM"]


def _set_alarm(backend: Any, name: str, state: str, reason: str) -> None:
    cloudwatch = _alarm_backend(backend)
    if name in cloudwatch.alarms:
        cloudwatch.set_alarm_state(name, reason, None, state)


# How long an alarm stays in ALARM after the fleet that breached it stopped serving (its evaluation
# periods: 3 of a minute each).
ALARM_CLEARS_AFTER = timedelta(minutes=3)


def _alarm_clears(backend: Any) -> dict[str, datetime]:
    return backend.__dict__.setdefault("_modeldrop_alarm_clears", {})


def clear_due_alarms(backend: Any) -> None:
    """Alarms whose breaching fleet is gone, back to OK once their evaluation periods have passed."""
    clears = _alarm_clears(backend)
    for alarm, at in list(clears.items()):
        if at <= clock.utcnow():
            _set_alarm(backend, alarm, "OK", "modeldrop emulator: the rolled-back fleet no longer serves")
            del clears[alarm]


def pending(hosting: Any, name: str) -> bool:
    return name in getattr(hosting, "updates", {})


def refresh(hosting: Any, backend: Any, endpoint: Any) -> None:
    """The endpoint's status as the hosting has it now (an update moved on first)."""
    clear_due_alarms(backend)
    if pending(hosting, endpoint.endpoint_name):
        advance(hosting, backend, endpoint)
        return
    endpoint.endpoint_status, endpoint.failure_reason = hosting.status(endpoint.endpoint_name)


def advance(hosting: Any, backend: Any, endpoint: Any) -> None:
    """Move an Updating endpoint on: green starting, the bake, the rollback or the switch."""
    name = endpoint.endpoint_name
    update: PendingUpdate = hosting.updates[name]
    green = update.green
    if update.rolling_back:
        _finish(hosting, backend, endpoint, switch=False)
        return
    if green.status == "Creating":
        with green.lock:
            hosting._advance(green)
    if green.status == "Failed":
        _finish(hosting, backend, endpoint, switch=False, reason=f"the new fleet failed: {green.failure_reason}")
        return
    if green.status != "InService":
        # The new fleet must be up within the deployment's MaximumExecutionTimeoutInSeconds: else SageMaker
        # stops it and the endpoint stays on the serving config.
        if update.started and (clock.utcnow() - update.started).total_seconds() > update.timeout_seconds:
            reason = f"the new fleet was not up within MaximumExecutionTimeoutInSeconds ({update.timeout_seconds} s)"
            _finish(hosting, backend, endpoint, switch=False, reason=reason)
        return
    if update.bake_started is None:
        update.bake_started = clock.utcnow()
        if update.fault == "alarm-during-bake" and update.alarms:
            _set_alarm(
                backend, update.alarms[0], "ALARM", "modeldrop emulator: errors on the new fleet during the bake"
            )
    if _in_alarm(backend, update.alarms):
        # A deployment guardrail's rollback: traffic goes back to the serving fleet while the endpoint
        # reads Updating (RollingBack is a failed scaling or weight change's state, not this one).
        update.rolling_back = True
        endpoint.endpoint_status = "Updating"
        return
    update.polls_in_bake += 1
    baked = (clock.utcnow() - update.bake_started).total_seconds() >= update.bake_seconds
    if not baked and update.polls_in_bake <= BAKE_POLLS:
        return
    _finish(hosting, backend, endpoint, switch=update.fault != "silent-rollback")


def _finish(hosting: Any, backend: Any, endpoint: Any, switch: bool, reason: str | None = None) -> None:
    name = endpoint.endpoint_name
    update: PendingUpdate = hosting.updates.pop(name)
    hosting.endpoints.pop(name + GREEN, None)
    if switch:
        blue = hosting.endpoints.get(name)
        hosting.endpoints[name] = update.green
        if blue is not None:
            hosting._stop(blue)
        endpoint.endpoint_config_name = update.config
        endpoint.production_variants = endpoint._process_production_variants(
            backend.endpoint_configs[update.config].production_variants
        )
    else:
        hosting._stop(update.green)
        # The fleet that breached no longer serves: its alarms' metrics stop breaching, and CloudWatch
        # returns them to OK once its evaluation periods have passed (they say why meanwhile).
        clears = _alarm_clears(backend)
        for alarm in _in_alarm(backend, update.alarms):
            clears[alarm] = clock.utcnow() + ALARM_CLEARS_AFTER
    endpoint.endpoint_status = "InService"
    endpoint.failure_reason = reason
    endpoint.last_modified_time = clock.utcnow()


def _start_green(hosting: Any, backend: Any, name: str, config_name: str) -> HostedEndpoint:
    variant = backend.endpoint_configs[config_name].production_variants[0]
    model = backend._models.get(variant["ModelName"])
    container = (model.primary_container if model else None) or {}
    green = HostedEndpoint(
        name=name,
        instance_type=variant.get("InstanceType", "ml.g6.2xlarge"),
        startup_timeout=int(variant.get("ContainerStartupHealthCheckTimeoutInSeconds") or 480),
        created_virtual=clock.utcnow(),
        created_real=time.monotonic(),
        fault=hosting.planned.popleft() if hosting.planned else "none",
        env=dict(container.get("Environment") or {}),
    )
    hosting.endpoints[name + GREEN] = green
    if model is None:  # the update is accepted; its new fleet cannot start (as SageMaker reports it)
        green.status, green.failure_reason = "Failed", f'Could not find model "{variant["ModelName"]}".'
        return green
    try:
        green.model_dir = hosting._materialize(f"{name}-{config_name}", container)
        hosting._start(green)
    except Exception as exc:  # whatever stops the new fleet is the update's failure
        green.status, green.failure_reason = "Failed", f"the container did not start: {exc}"
    return green


def _alarm_reader_problem(backend: Any, config_name: str, alarms: list[str]) -> str | None:
    """Why the new config's execution role may not read the rollback alarms (the guardrails guide asks it
    of the role: SageMaker reads them as that role), or None."""
    from moto.iam.models import iam_backends

    from modeldrop.local.emulator.iam.policy import AuthRequest, allowed
    from modeldrop.local.emulator.iam.simulator import role_statements

    variants = backend.endpoint_configs[config_name].production_variants
    model = backend._models.get(variants[0].get("ModelName")) if variants else None
    role = str(getattr(model, "execution_role_arn", "") or "")
    try:
        statements = role_statements(iam_backends[backend.account_id]["global"], role)
    except Exception:
        return f"The execution role {role or '(none)'} cannot be assumed to read the rollback alarms."
    for alarm in alarms:
        arn = f"arn:aws:cloudwatch:{backend.region_name}:{backend.account_id}:alarm:{alarm}"
        if allowed(statements, AuthRequest("cloudwatch:DescribeAlarms", arn)) != "allow":
            return (
                f"The execution role {role} is not authorized to perform cloudwatch:DescribeAlarms on {arn}: "
                "auto-rollback alarms must be readable by the role."
            )
    return None


def install(get_hosting: Any, check_quota: Any = None) -> None:
    """UpdateEndpoint in moto; CHECK_QUOTA(backend, config) raises ResourceLimitExceeded for a green
    fleet the account's endpoint quota cannot hold beside every running fleet."""
    from moto.core.responses import ActionResult
    from moto.sagemaker.exceptions import ValidationError
    from moto.sagemaker.responses import SageMakerResponse
    from moto.sagemaker.utils import arn_formatter

    from modeldrop.local.emulator.sagemaker.components import is_component_endpoint

    def update_endpoint(self: Any) -> Any:
        backend = self.sagemaker_backend
        name = str(self._get_param("EndpointName") or "")
        config_name = str(self._get_param("EndpointConfigName") or "")
        deployment: dict[str, Any] = self._get_param("DeploymentConfig") or {}
        endpoint_arn = arn_formatter("endpoint", name, backend.account_id, backend.region_name)
        if name not in backend.endpoints:
            raise ValidationError(message=f'Could not find endpoint "{endpoint_arn}".')
        if backend.describe_endpoint(name)["EndpointStatus"] != "InService":
            raise ValidationError(message=f'Cannot update in-progress endpoint "{endpoint_arn}".')
        if config_name not in backend.endpoint_configs:
            config_arn = arn_formatter("endpoint-config", config_name, backend.account_id, backend.region_name)
            raise ValidationError(message=f'Could not find endpoint configuration "{config_arn}".')
        problem = _problem(deployment)
        if problem:
            raise ValidationError(message=problem)
        if not all(v.get("ModelName") for v in backend.endpoint_configs[config_name].production_variants):
            raise ValidationError(
                message="The emulator updates an endpoint only to a config whose variants name a model."
            )
        serving = backend.endpoint_configs.get(backend.endpoints[name].endpoint_config_name)
        old_variants = sorted(v.get("VariantName") for v in (serving.production_variants if serving else []))
        new_variants = sorted(v.get("VariantName") for v in backend.endpoint_configs[config_name].production_variants)
        if deployment.get("BlueGreenUpdatePolicy") and serving is not None and old_variants != new_variants:
            raise ValidationError(
                message=f"A blue/green update cannot change the endpoint's production variants ({old_variants} to "
                f"{new_variants}): the new config must name the same variants."
            )
        if deployment.get("BlueGreenUpdatePolicy") and is_component_endpoint(backend, name):
            raise ValidationError(
                message="BlueGreenUpdatePolicy is not supported for an endpoint with inference components."
            )
        alarms = [a["AlarmName"] for a in (deployment.get("AutoRollbackConfiguration") or {}).get("Alarms") or []]
        clear_due_alarms(backend)
        unreadable = _alarm_reader_problem(backend, config_name, alarms) if alarms else None
        if unreadable:
            raise ValidationError(message=unreadable)
        if check_quota is not None:  # the new fleet runs beside the serving one until the switch
            check_quota(backend, config_name)
        hosting = get_hosting()
        endpoint = backend.endpoints[name]
        if hosting is None:  # no hosting to emulate: the switch is immediate
            endpoint.endpoint_config_name = config_name
            return ActionResult({"EndpointArn": endpoint_arn})
        policy = deployment.get("BlueGreenUpdatePolicy") or {}
        routing = policy.get("TrafficRoutingConfiguration") or {}
        bake = int(routing.get("WaitIntervalInSeconds") or 0) + int(policy.get("TerminationWaitInSeconds") or 0)
        timeout = int(policy.get("MaximumExecutionTimeoutInSeconds") or 3600)
        fault = next((f for f in ("alarm-during-bake", "silent-rollback") if f in hosting.faults), "none")
        if not hasattr(hosting, "updates"):
            hosting.updates = {}
        green = _start_green(hosting, backend, name, config_name)
        hosting.updates[name] = PendingUpdate(config_name, alarms, bake, fault, green, started=clock.utcnow(),
                                              timeout_seconds=timeout)  # fmt: skip
        hosting.faults = hosting.faults - {fault}  # one update plays the fault
        endpoint.endpoint_status = "Updating"
        return ActionResult({"EndpointArn": endpoint_arn})

    SageMakerResponse.update_endpoint = update_endpoint


def forget(hosting: Any, name: str) -> None:
    """A deleted endpoint's update: its new fleet stops with it."""
    update = getattr(hosting, "updates", {}).pop(name, None)
    if update is not None:
        hosting.endpoints.pop(name + GREEN, None)
        hosting._stop(update.green)
