"""The run-local faults that reshape the emulated account or the execution rather than one endpoint:
stops (at once or in the middle of a step), another team's endpoint holding the quota, secrets,
a denied starter, an untrusted role, an overwritten upload."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def stop_running(stack: Any) -> None:
    """The abort faults: StopExecution on every running execution, by the user (not the function
    whose call set it off)."""
    from modeldrop.local.emulator.iam.enforcement import acting_as

    stack.after.pop("CreateEndpointFunction", None)
    with acting_as(None):
        sfn = stack.client("stepfunctions")
        running = sfn.list_executions(stateMachineArn=stack.state_machine_arn, statusFilter="RUNNING")["executions"]
        for execution in running:
            sfn.stop_execution(executionArn=execution["executionArn"], error="Aborted", cause="run-local --fault")


ABORT_FAULTS = {"abort", "abort-mid-validate", "abort-mid-create"}


def writes_served_copy(params: Any) -> bool:
    from modeldrop.aws.s3.served_copy import SERVED_PREFIX

    return str(params.get("Key", "")).startswith(SERVED_PREFIX)


# A stop in the middle of a step: after the first call matching (service, operations, params test).
MID_STEP_ABORTS: dict[str, tuple[str, tuple[str, ...], Callable[[Any], bool]]] = {
    "abort-mid-validate": (
        "s3",
        ("CopyObject", "PutObject", "CompleteMultipartUpload", "UploadPartCopy"),
        writes_served_copy,
    ),
    "abort-mid-create": ("sagemaker", ("CreateEndpoint",), lambda params: True),
    "abort-mid-attach": ("sagemaker", ("CreateInferenceComponent",), lambda params: True),
    "slow-component-delete": (
        "sagemaker-runtime",
        ("InvokeEndpoint", "InvokeEndpointWithResponseStream"),
        lambda params: True,
    ),
}


def stop_during(stack: Any, service: str, operations: tuple[str, ...], matches: Callable[[Any], bool]) -> None:
    """StopExecution as soon as a matching call succeeds, inside the step that made it: the ABORTED
    event and its cleanup run at once, and the step's Lambda goes on afterwards, as on AWS."""
    from modeldrop.local.emulator.iam.enforcement import after_call

    fired: list[bool] = []

    def stop(params: Any, _result: Any) -> None:
        if not fired and matches(params):
            fired.append(True)
            stop_running(stack)

    for operation in operations:
        after_call(service, operation, stop)


def reap_until_clean(stack: Any, runs: int = 8) -> list[dict[str, Any]]:
    """The scheduled reaper's runs, its period apart on the emulator's clock, until nothing of the
    run is left (or RUNS runs): what finishes a teardown an ExecutionEnded Lambda had no time for."""
    from modeldrop.contracts import clock

    period = 60 * int(stack.parameters.get("ReaperPeriodMinutes") or 15)
    done: list[dict[str, Any]] = []
    for _ in range(runs):
        if not stack.leftover_resources():
            break
        clock.advance(period)
        done.append(stack.invoke_function("ReaperFunction", {"source": "aws.events", "detail-type": "Scheduled Event"}))
    return done


# --fault engine-check-oom: the engine check's memory bound for the run (importing torch alone passes it).
ENGINE_CHECK_OOM_MB = 64
# --fault engine-check-inactive: what Lambda answers an Inactive function's first invocations while it
# restores the image (initializing, then Pending), as the Step Functions Lambda integration names them.
INACTIVE_ERRORS = (*["Lambda.CodeArtifactUserPendingException"] * 2, "Lambda.ResourceConflictException")
# The faults that need a shared deployment with a second adapter component.
SHARED_FAULTS = frozenset({"adapter-load", "abort-mid-attach", "slow-component-delete"})


def arm_faults(stack: Any, faults: frozenset[str], request: dict[str, Any] | None) -> None:
    """Set the emulated account up for FAULTS before the run starts (the endpoint's own faults are
    the hosting's)."""
    from modeldrop.local.emulator.sagemaker.hosting import FUNCTION_FAULTS
    from modeldrop.local.scenarios import inputs as run_inputs

    for name in faults & set(FUNCTION_FAULTS):
        function, error = FUNCTION_FAULTS[name]
        stack.inject[function] = [error]
    if "engine-check-oom" in faults:  # the real probe, held to a bound it cannot keep
        stack.functions["EngineCheckFunction"].env["MODELDROP_ENGINE_CHECK_MAX_MB"] = str(ENGINE_CHECK_OOM_MB)
    if "engine-check-inactive" in faults:
        stack.inject["EngineCheckFunction"] = list(INACTIVE_ERRORS)
    if "gate-scale-in" in faults:
        scale_in_after_the_gates_knock(stack)
    if "reupload" in faults:
        stack.after["ValidateFunction"] = lambda event: overwrite(stack, event["artifact_uri"])
    if "abort" in faults:
        stack.after["CreateEndpointFunction"] = lambda event: stop_running(stack)
    for name in faults & set(MID_STEP_ABORTS):
        stop_during(stack, *MID_STEP_ABORTS[name])
    simple = {
        "quota-busy": lambda: occupy_quota(stack, first_type(stack, request)),
        "untrusted-role": lambda: trust_only_bedrock(stack),
        "starter-error": lambda: deny_start_execution(stack),
        "huge-archive": lambda: run_inputs.report_size(stack, run_inputs.HUGE_ARCHIVE_BYTES),
        "kill-mid-copy": lambda: run_inputs.kill_copy_after_parts(stack, run_inputs.KILL_AFTER_PARTS),
    }
    for name in sorted(faults & set(simple)):
        simple[name]()


def scale_in_after_the_gates_knock(stack: Any) -> None:
    """The gate-scale-in fault: between the gate's wake-up knock and the champion's first case, the idle
    alarm's policy sets the channel's copies to zero (once), so the champion answers none of the cases."""
    from modeldrop.local.emulator.autoscaling.driving import scale_in_now
    from modeldrop.local.emulator.iam.enforcement import before_call, current
    from modeldrop.pipeline.channels.idle_channel import KNOCK

    fired: list[str] = []

    def champion_case(params: Any) -> None:
        caller, component = current(), params.get("InferenceComponentName")
        if fired or caller is None or caller.name != "PromoteFunction" or not component or params.get("Body") == KNOCK:
            return
        fired.append(str(component))
        scale_in_now(fired[0])

    for operation in ("InvokeEndpoint", "InvokeEndpointWithResponseStream"):
        before_call("sagemaker-runtime", operation, champion_case)


QUOTA_HOLD_SECONDS = 600
OTHER_TEAM = "other-team-endpoint"


def first_type(stack: Any, request: dict[str, Any] | None) -> str:
    """The type a deployment of REQUEST tries first, as NormalizeRequest decides it."""
    from modeldrop.pipeline.config import DefaultsSettings
    from modeldrop.pipeline.deployment.steps import normalize

    raw = {"artifact_uri": "s3://placeholder-bucket/model.tar.gz", **(request or {})}
    defaults = DefaultsSettings.model_validate(
        {"default_instance_type": stack.parameters.get("DefaultInstanceType") or "ml.g6.2xlarge"}
    )
    return normalize(raw, "first-type", defaults, "arn:local:first-type", 0).instance_type


def occupy_quota(stack: Any, instance_type: str) -> None:
    """The quota-busy fault: the type's quota is 1, and another team's endpoint holds it for 10 virtual min."""
    from modeldrop.local.emulator import service_quotas

    service_quotas.set_endpoint_quota(instance_type, 1)
    sm = stack.client("sagemaker")
    stack.hosting.hold(OTHER_TEAM, QUOTA_HOLD_SECONDS)
    role = "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker"
    sm.create_model(
        ModelName=OTHER_TEAM, PrimaryContainer={"Image": "other-team/serving:latest"}, ExecutionRoleArn=role
    )
    sm.create_endpoint_config(
        EndpointConfigName=OTHER_TEAM,
        ProductionVariants=[
            {
                "VariantName": "AllTraffic",
                "ModelName": OTHER_TEAM,
                "InstanceType": instance_type,
                "InitialInstanceCount": 1,
            }
        ],
    )
    sm.create_endpoint(EndpointName=OTHER_TEAM, EndpointConfigName=OTHER_TEAM)


def hold_secrets(stack: Any, secrets: dict[str, str]) -> None:
    """run-local's emulated account holds the secrets a --secret names, under the same references:
    the value of the environment variable NAME here, else a placeholder (never printed)."""
    import os

    from modeldrop.aws.secret_refs import parse_refs
    from modeldrop.contracts.errors import RequestInvalid

    try:
        refs = parse_refs(secrets)
    except RequestInvalid:
        return  # the run's NormalizeRequest refuses it, with the reason
    for env_name, ref in refs.items():
        value = os.environ.get(env_name) or f"run-local-placeholder-for-{env_name}"
        if ref.store == "ssm":
            stack.client("ssm").put_parameter(Name=ref.name, Value=value, Type="SecureString", Overwrite=True)
            continue
        body = json.dumps({ref.key: value}) if ref.key else value
        client = stack.client("secretsmanager")
        try:
            client.create_secret(Name=ref.name, SecretString=body)
        except client.exceptions.ResourceExistsException:
            client.put_secret_value(SecretId=ref.name, SecretString=body)


def deny_start_execution(stack: Any) -> None:
    """The starter-error fault: the starter's role lost states:StartExecution (an edited policy)."""
    import dataclasses

    spec = stack.functions["StarterFunction"]
    kept = tuple(s for s in spec.principal.statements if "states:StartExecution" not in str(s.get("Action")))
    spec.principal = dataclasses.replace(spec.principal, statements=kept)


def trust_only_bedrock(stack: Any) -> None:
    """The untrusted-role fault: the source lab's role, which SageMaker could not assume."""
    from modeldrop.local.stack.build import trust_policy

    name = stack.parameters["SageMakerExecutionRoleArn"].rsplit("/", 1)[-1]
    policy = json.dumps(trust_policy("bedrock.amazonaws.com"))
    stack.client("iam").update_assume_role_policy(RoleName=name, PolicyDocument=policy)


def overwrite(stack: Any, artifact_uri: str) -> None:
    """The reupload fault: the key now holds a corrupt archive (validation would refuse it)."""
    from modeldrop.contracts.s3uri import parse_s3_uri

    uri = parse_s3_uri(artifact_uri)
    stack.client("s3").put_object(Bucket=uri.bucket, Key=uri.key, Body=b"\x1f\x8b\x08\x00 not a model any more")


# Where run-local keeps its reports: they outlive the run, unlike the emulated bucket. The newest
# KEPT_RUNS runs' folders are kept; older ones go as new runs come.
