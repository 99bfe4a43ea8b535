"""Generate statemachine/deployment.asl.json (run: make asl, or python tools/gen_asl.py).

The ASL is data; this script only keeps its repeated Retry / Catch / Lambda-invoke blocks consistent.
The JSON it writes is committed and is what SAM, the tests and the local run all load; a contract
test fails when the committed file is not what this builds.

The flow, by phase:
- request: NormalizeRequest refuses the request -> RequestRejected (nothing exists).
- prepare: Register, Validate, ResolveImage, BuildEngineEnv -> RecordFailure (no SageMaker calls)
  -> DiscardServedCopy (the validated copy, if any) -> MarkFailed.
- endpoint: CreateEndpoint .. SmokeEval -> RecordFailure (FailureReason, logs) -> the teardown loop
  (endpoint first, wait until gone, then config, model and served copy) -> MarkFailed.
  A capacity failure (or a type at quota with no wait left) -> NextAttempt -> the teardown loop for
  that attempt -> BuildEngineEnv for the next type; a type at quota with wait left -> WaitForQuota.
- bookkeeping: MarkSucceeded after the eval passed is retried; if it still fails the endpoint is kept
  (its TTL applies) and the run ends DeploymentUnrecorded.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "statemachine" / "deployment.asl.json"

LAMBDA_RETRY = {
    "ErrorEquals": [
        "Lambda.ServiceException",
        "Lambda.AWSLambdaException",
        "Lambda.SdkClientException",
        "Lambda.TooManyRequestsException",
        "Lambda.ClientExecutionTimeoutException",
    ],
    "IntervalSeconds": 2,
    "MaxAttempts": 6,
    "BackoffRate": 2,
    "MaxDelaySeconds": 60,
    "JitterStrategy": "FULL",
}
# A function idle for weeks goes Inactive (above all the engine check's container image): its first invokes
# fail CodeArtifactUserPendingException ("Lambda is initializing your function", public reports see it clear
# in 40-106 s), ResourceConflictException while it is Pending, ResourceNotReadyException in the VPC-interface
# case. Retried for about ten minutes, longer than restoring an image takes. CodeArtifactUserFailedException
# is not retried: the image needs a code update, and waiting cannot fix it.
INACTIVE_RETRY = {
    "ErrorEquals": [
        "Lambda.CodeArtifactUserPendingException",
        "Lambda.ResourceNotReadyException",
        "Lambda.ResourceConflictException",
    ],
    "IntervalSeconds": 15,
    "MaxAttempts": 8,
    "BackoffRate": 1.5,
    "MaxDelaySeconds": 120,
    "JitterStrategy": "FULL",
}
# The deployments table busy past the SDK's own retries: every step is retried, with backoff.
REGISTRY_RETRY = {
    "ErrorEquals": ["RegistryBusy"],
    "IntervalSeconds": 3,
    "MaxAttempts": 6,
    "BackoffRate": 2,
    "MaxDelaySeconds": 60,
    "JitterStrategy": "FULL",
}
THROTTLE_RETRY = {
    "ErrorEquals": ["SageMakerThrottled"],
    "IntervalSeconds": 5,
    "MaxAttempts": 8,
    "BackoffRate": 2,
    "MaxDelaySeconds": 120,
    "JitterStrategy": "FULL",
}
FAILURE = "{% $merge([$states.errorOutput, {'State': $states.context.State.Name}]) %}"
# A Fail state's Error: the domain error's name; the interpreter's own States.* become two names of ours.
FAIL_ERROR = (
    "{% $substring($failure.Error, 0, 7) = 'States.' ? ($failure.Error = 'States.Timeout' ? 'StepTimedOut' : "
    "'StepFailed') : $failure.Error %}"
)
FAIL_CAUSE = (
    "{% $substring($failure.Error, 0, 7) = 'States.' ? ($failure.Error & ': ' & ($exists($failure.Cause) ? "
    "$failure.Cause : 'no cause was given')) : ($exists($failure.Cause) ? $failure.Cause : 'no cause was given') %}"
)
# The execution that owns the deployment: the registry refuses its steps' writes to any other record.
EXECUTION = "{% $states.context.Execution.Id %}"
# The current attempt's endpoint: the resource name, or <name>-aN when an earlier attempt's still held it.
ATTEMPT_ENDPOINT = "{% $endpoint != null ? $endpoint.endpoint_name : $req.resource_name %}"
RETRY_EVERYTHING = {
    "ErrorEquals": ["States.ALL"],
    "IntervalSeconds": 2,
    "MaxAttempts": 5,
    "BackoffRate": 2,
    "MaxDelaySeconds": 30,
    "JitterStrategy": "FULL",
}


@dataclass(frozen=True)
class Phase:
    """Where a failing step goes. What exists by then decides it: nothing (request), a record and
    maybe the validated copy (prepare), SageMaker resources (endpoint), a healthy endpoint (bookkeeping)."""

    target: str
    name: str | None = None  # the $phase RecordFailure and FailurePhase read
    record_failure: bool = True  # assign $failure (the error, and the state it came from)
    assign: dict[str, Any] = field(default_factory=dict)
    # Named errors that leave the phase's path: a capacity failure moves on to the next instance type.
    redirects: dict[str, str] = field(default_factory=dict)
    retry: dict[str, Any] | None = None  # beyond the Lambda (and throttling) retries every task has


PHASES: dict[str, Phase] = {
    "request": Phase("RequestRejected"),
    "prepare": Phase("RecordFailure", "prepare"),
    "endpoint": Phase("RecordFailure", "endpoint", redirects={"InsufficientCapacity": "NextAttempt"}),
    # RecordFailure itself: a diagnosis that cannot be written must not stop the teardown.
    "diagnosis": Phase(
        "FailurePhase", record_failure=False, assign={"after_teardown": "fail", "teardown_deadline": None}
    ),
    # A teardown step that fails outright: the record is marked failed, and the execution-ended rule
    # and the reaper delete what is left.
    "teardown": Phase("MarkFailed", record_failure=False, assign={"teardown": {"error": "{% $states.errorOutput %}"}}),
    # After the eval passed: retried, and never a teardown of the healthy endpoint.
    "bookkeeping": Phase(
        "DeployedUnrecorded",
        record_failure=False,
        assign={"bookkeeping": "{% $states.errorOutput %}"},
        retry=RETRY_EVERYTHING,
    ),
    "final": Phase("DeploymentFailed", record_failure=False),
    # A request with `channel`, after the deployment succeeded: a refused promotion ends the execution
    # with its error; the candidate was deleted (gate, read-back) or keeps its TTL (an invalid channel).
    "promotion": Phase("PromotionRefused"),
}


# Every step: a record that another execution owns is never touched, whatever the phase (nothing of
# that deployment is recorded, diagnosed or torn down); a deployment that ended under a step (stopped,
# torn down) goes down its phase's path, whose steps tolerate an ended record.
NOT_OURS = "NotOurDeployment"
# Map iterations of the prefix copy at once (each a Lambda; S3 copies the parts).
COPY_CONCURRENCY = 16
EVERY_STEP_ERRORS = ["DeploymentEnded"]


def catches(phase: Phase, errors: list[str]) -> list[dict[str, Any]]:
    """The step's own errors by name (so the contract test sees each routed), then everything else."""
    errors = [e for e in errors if e != "RecordNotOwned"]
    errors += [e for e in EVERY_STEP_ERRORS if e not in errors]
    assign: dict[str, Any] = {"failure": FAILURE} if phase.record_failure else {}
    if phase.name is not None:
        assign["phase"] = phase.name
    assign.update(phase.assign)

    def entry(names: list[str], target: str) -> dict[str, Any]:
        return {"ErrorEquals": names, "Next": target, **({"Assign": assign} if assign else {})}

    redirected = [entry([e], phase.redirects[e]) for e in errors if e in phase.redirects]
    named = [e for e in errors if e not in phase.redirects]
    not_ours = {"ErrorEquals": ["RecordNotOwned"], "Next": NOT_OURS, "Assign": {"failure": FAILURE}}
    return [
        not_ours,
        *redirected,
        *([entry(named, phase.target)] if named else []),
        entry(["States.ALL"], phase.target),
    ]


def task(
    function: str,
    payload: dict[str, Any],
    next_state: str,
    phase: str,
    errors: list[str] | None = None,
    assign: dict[str, Any] | None = None,
    timeout: int = 60,
    throttled: bool = False,
    comment: str | None = None,
) -> dict[str, Any]:
    """A Lambda task whose failures go where its PHASE sends them; ERRORS are the ones it raises."""
    routing = PHASES[phase]
    state: dict[str, Any] = {"Type": "Task"}
    if comment:
        state["Comment"] = comment
    state.update(
        {
            "Resource": "arn:aws:states:::lambda:invoke",
            "Arguments": {"FunctionName": "${" + function + "FunctionArn}", "Payload": payload},
            "TimeoutSeconds": timeout,
            "Retry": [
                LAMBDA_RETRY,
                INACTIVE_RETRY,
                REGISTRY_RETRY,
                *([THROTTLE_RETRY] if throttled else []),
                *([routing.retry] if routing.retry else []),
            ],
        }
    )
    if assign:
        state["Assign"] = assign
    state["Next"] = next_state
    state["Catch"] = catches(routing, errors or [])
    return state


def definition() -> dict[str, Any]:
    s: dict[str, Any] = {}
    s["NormalizeRequest"] = task(
        "Normalize",
        {
            "request": "{% $states.input %}",
            "execution_name": "{% $states.context.Execution.Name %}",
            "execution_arn": EXECUTION,
            "started_at": "{% $states.context.Execution.StartTime %}",
        },
        "RegisterDeployment",
        comment="Parse the request (direct start or S3 starter) and apply the stack defaults.",
        assign={"req": "{% $states.result.Payload %}"},
        phase="request",
        errors=["RequestInvalid", "LimitExceeded"],
    )
    s[NOT_OURS] = {
        "Type": "Fail",
        "Comment": "The deployment id's record belongs to another execution: nothing of it was touched.",
        "Error": "RecordNotOwned",
        "Cause": "{% $exists($failure.Cause) ? $failure.Cause : 'the deployment belongs to another execution' %}",
    }
    s["RequestRejected"] = {
        "Type": "Fail",
        "Comment": "Nothing was registered or created: the request itself is invalid.",
        "Error": FAIL_ERROR,
        "Cause": FAIL_CAUSE,
    }
    s["RegisterDeployment"] = task(
        "Register",
        {"request": "{% $req %}"},
        "ServedCopyShape",
        assign={
            "artifact": "{% $states.result.Payload %}",
            # Every variable a later state reads exists from here on.
            "attempt": 0,
            "quota_waits": 0,
            "quota_wait_until": None,
            "endpoint": None,
            "after_teardown": "fail",
            "teardown_deadline": None,
        },
        phase="prepare",
        errors=[
            "DuplicateDeployment",
            "CheckpointUnreadable",
            "ExecutionRoleUnusable",
            "QuotaExceeded",
            "ArchiveTooLarge",
            "RequestInvalid",
        ],
    )
    s["ServedCopyShape"] = {
        "Type": "Choice",
        "Comment": "A prefix is copied by the Map, one batch of objects per iteration; an archive's members are "
        "written by the pass that validates them.",
        "Choices": [{"Condition": "{% $count($artifact.copy_batches) > 0 %}", "Next": "CopyShards"}],
        "Default": "ValidateCheckpoint",
    }
    s["CopyShards"] = {
        "Type": "Map",
        "Comment": "The served copy of a prefix, fanned out: at most 100 batches of about equal bytes (the "
        "history's budget), each object copied server-side (parallel part copies for a large one), pinned by the "
        "ETag listed at registration.",
        "Items": "{% $artifact.copy_batches %}",
        "ItemSelector": {
            "deployment_id": "{% $req.deployment_id %}",
            "artifact_uri": "{% $req.artifact_uri %}",
            "execution_arn": EXECUTION,
            # Array brackets around the slice: JSONata unwraps a one-item sequence.
            "items": "{% ($batch := $states.context.Map.Item.Value; "
            "[$artifact.copy_items[[$batch[0]..$batch[1]-1]]]) %}",
        },
        "MaxConcurrency": COPY_CONCURRENCY,
        "ItemProcessor": {
            "ProcessorConfig": {"Mode": "INLINE"},
            "StartAt": "CopyShard",
            "States": {
                "CopyShard": {
                    "Type": "Task",
                    "Resource": "arn:aws:states:::lambda:invoke",
                    "Arguments": {"FunctionName": "${CopyShardFunctionArn}", "Payload": "{% $states.input %}"},
                    "TimeoutSeconds": 960,
                    "Retry": [LAMBDA_RETRY, INACTIVE_RETRY, REGISTRY_RETRY],
                    "Output": "{% $states.result.Payload %}",
                    "End": True,
                }
            },
        },
        "Assign": {"copied": "{% $sum($states.result.copied) %}"},
        "Next": "ValidateCheckpoint",
        "Catch": catches(PHASES["prepare"], ["CheckpointUnreadable"]),
    }
    s["ValidateCheckpoint"] = task(
        "Validate",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "artifact_uri": "{% $req.artifact_uri %}",
            "artifact_version": "{% $artifact.artifact_version %}",
            "copy_items": "{% $artifact.copy_items %}",
            "adapter_uri": "{% $req.adapter_uri %}",
            "adapter_name": "{% $req.adapter_name %}",
            "adapter_version": "{% $artifact.adapter_version %}",
            "adapter_mode": "{% $req.adapter_mode %}",
            "more_adapters": "{% $artifact.more_adapters %}",
            "attach": "{% $artifact.attach %}",
            "engine": "{% $req.engine %}",
            "execution_arn": EXECUTION,
        },
        "ResolveImage",
        timeout=960,
        assign={"validation": "{% $states.result.Payload %}"},
        phase="prepare",
        errors=["CheckpointRefused", "CheckpointUnreadable"],
    )
    s["ResolveImage"] = task(
        "ResolveImage",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "engine": "{% $req.engine %}",
            "model_type": "{% $validation.model_type %}",
            "execution_arn": EXECUTION,
        },
        "EngineCheck",
        assign={"image": "{% $states.result.Payload %}"},
        phase="prepare",
        errors=["ImageUnresolvable"],
    )
    s["EngineCheck"] = task(
        "EngineCheck",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "served_uri": "{% $validation.served_uri %}",
            "engine": "{% $image.engine %}",
            "execution_arn": EXECUTION,
        },
        "BuildEngineEnv",
        comment="The resolved image's engine judges the served copy's headers and side files (no GPU, no weight "
        "byte); a refusal fails here, before anything is created.",
        timeout=960,
        assign={"engine_check": "{% $states.result.Payload %}"},
        phase="prepare",
        errors=["CheckpointRefused", "CheckpointUnreadable", "EngineCheckFailed"],
    )
    s["BuildEngineEnv"] = task(
        "BuildEnv",
        {
            "request": "{% $req %}",
            "validation": "{% $validation %}",
            "image": "{% $image %}",
            "attempt": "{% $attempt %}",
        },
        "CreateEndpoint",
        comment="The plan for this attempt's instance type (re-planned per type); the first lists the types.",
        assign={"plan": "{% $states.result.Payload %}"},
        # A later attempt's BuildEngineEnv runs after the previous attempt was torn down: nothing exists.
        phase="prepare",
        errors=["PlanRefused"],
    )
    s["CreateEndpoint"] = task(
        "CreateEndpoint",
        {
            "request": "{% $req %}",
            "image": "{% $image %}",
            "plan": "{% $plan %}",
            "served_uri": "{% $validation.served_uri %}",
            "served_digest": "{% $validation.served_digest %}",
            "quota_waits": "{% $quota_waits %}",
            "quota_wait_until": "{% $quota_wait_until %}",
        },
        "EndpointCreated",
        timeout=120,
        throttled=True,
        assign={
            "create": "{% $states.result.Payload %}",
            "endpoint": "{% $states.result.Payload.endpoint %}",
            "quota_waits": "{% $states.result.Payload.quota_waits %}",
            "quota_wait_until": "{% $states.result.Payload.quota_wait_until %}",
            "polls": 0,
        },
        phase="endpoint",
        errors=["QuotaExceeded", "ResourceNameTaken", "CheckpointUnreadable"],
    )
    s["EndpointCreated"] = {
        "Type": "Choice",
        "Comment": "Created; or the type is at its quota: wait and re-check, or move on to the next type.",
        "Choices": [
            {"Condition": "{% $create.status = 'created' %}", "Next": "WaitForEndpoint"},
            {"Condition": "{% $create.wait_seconds > 0 %}", "Next": "WaitForQuota"},
        ],
        "Default": "QuotaFallThrough",
    }
    s["WaitForQuota"] = {"Type": "Wait", "Seconds": "{% $create.wait_seconds %}", "Next": "CreateEndpoint"}
    s["QuotaFallThrough"] = {
        "Type": "Pass",
        "Assign": {"failure": {"Error": "QuotaExceeded", "Cause": "{% $create.reason %}", "State": "CreateEndpoint"}},
        "Next": "NextAttempt",
    }
    s["WaitForEndpoint"] = {
        "Type": "Wait",
        "Comment": "The stack's poll interval, stretched for a long deadline (the history limit is 25,000 events).",
        "Seconds": "{% $max([${PollIntervalSeconds}, $endpoint.min_poll_seconds]) %}",
        "Next": "PollEndpoint",
    }
    s["PollEndpoint"] = task(
        "PollEndpoint",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "endpoint": "{% $endpoint %}",
            "polls": "{% $polls %}",
            "capacity_wait_seconds": "{% $req.capacity_wait_seconds %}",
            "execution_arn": EXECUTION,
        },
        "EndpointInService",
        throttled=True,
        assign={"poll": "{% $states.result.Payload %}", "polls": "{% $polls + 1 %}"},
        phase="endpoint",
        errors=["InsufficientCapacity", "EndpointFailed", "DeployDeadlineExceeded"],
    )
    s["EndpointInService"] = {
        "Type": "Choice",
        "Comment": "InService; with adapter_mode shared, once its base and adapter inference components are too.",
        "Choices": [{"Condition": "{% $poll.status = 'InService' %}", "Next": "SmokeEval"}],
        "Default": "WaitForEndpoint",
    }
    s["SmokeEval"] = task(
        "SmokeEval",
        {"request": "{% $req %}", "endpoint": "{% $endpoint %}", "plan": "{% $plan %}"},
        "MarkSucceeded",
        timeout=960,
        throttled=True,
        assign={"eval_result": "{% $states.result.Payload %}"},
        phase="endpoint",
        errors=["EvalFailed"],
    )
    s["MarkSucceeded"] = task(
        "Finalize",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "outcome": "succeeded",
            "execution_arn": EXECUTION,
            "request": "{% $req %}",
            "summary": {
                "endpoint": "{% $endpoint %}",
                "image": "{% $image %}",
                "env": "{% $plan.env %}",
                "instance_type": "{% $plan.instance_type %}",
                "eval": "{% $eval_result %}",
            },
        },
        "ChannelRequested",
        comment="After the eval passed: the bookkeeping is retried, and never tears the endpoint down.",
        phase="bookkeeping",
    )
    s["ChannelRequested"] = {
        "Type": "Choice",
        "Comment": "A request with channel: the deployment is a candidate for the channel's stable endpoint.",
        "Choices": [{"Condition": "{% $type($req.channel) = 'string' %}", "Next": "Promote"}],
        "Default": "Deployed",
    }
    promotion_errors = ["PromotionBlocked", "PromotionFailed", "ChannelInvalid", "LimitExceeded", "ChannelChanged"]

    def promote_task(action: str, comment: str, timeout: int) -> dict[str, Any]:
        return task(
            "Promote",
            {"request": "{% $req %}", "action": action, "execution_arn": EXECUTION},
            "PromotionSettled",
            comment=comment,
            timeout=timeout,
            throttled=True,
            assign={"promotion": "{% $states.result.Payload %}"},
            phase="promotion",
            errors=promotion_errors,
        )

    s["Promote"] = promote_task(
        "start",
        "The gate against the serving version, then the channel claimed and its endpoint created or updated "
        "(blue/green, rolled back on its alarms), or an adapter's component switched to by name.",
        960,
    )
    s["PromotionSettled"] = {
        "Type": "Choice",
        "Choices": [{"Condition": "{% $promotion.status = 'serving' %}", "Next": "Promoted"}],
        "Default": "WaitForPromotion",
    }
    s["WaitForPromotion"] = {"Type": "Wait", "Seconds": "{% $promotion.wait_seconds %}", "Next": "CheckPromotion"}
    # The Promote function's own timeout: a failed check deletes the candidate.
    s["CheckPromotion"] = promote_task(
        "check", "Read the channel's endpoint back: still updating, serving the candidate, or not (a rollback).", 960
    )
    s["PromotionRefused"] = {
        "Type": "Fail",
        "Comment": "The channel serves its previous version: the gate blocked the candidate, the update did not "
        "take, or the channel cannot take it.",
        "Error": FAIL_ERROR,
        "Cause": FAIL_CAUSE,
    }
    s["DeployedUnrecorded"] = {
        "Type": "Fail",
        "Comment": (
            "The endpoint is InService and passed its eval, but its record could not be written: it is kept "
            "(its TTL still applies) and the Finalize function's errors alarm."
        ),
        "Error": "DeploymentUnrecorded",
        "Cause": (
            "{% 'endpoint ' & $endpoint.endpoint_name & ' is InService and passed its smoke eval, but the deployment "
            "record could not be written (' & $bookkeeping.Error & '); it stays up until its TTL' %}"
        ),
    }
    s["Deployed"] = {
        "Type": "Succeed",
        "Output": {
            "deployment_id": "{% $req.deployment_id %}",
            "status": "succeeded",
            "endpoint_name": "{% $endpoint.endpoint_name %}",
            "instance_type": "{% $plan.instance_type %}",
            "image": "{% $image.image_uri %}",
            "env": "{% $plan.env %}",
            "memory": "{% $plan.memory %}",
            "eval": "{% $eval_result %}",
        },
    }
    s["Promoted"] = {
        "Type": "Succeed",
        "Output": {**s["Deployed"]["Output"], "channel": "{% $promotion %}"},
    }
    s["NextAttempt"] = task(
        "NextAttempt",
        {
            "request": "{% $req %}",
            "plan": "{% $plan %}",
            "failure": "{% $failure %}",
            "endpoint": "{% $endpoint %}",
        },
        "Teardown",
        comment="Record the failed attempt; release it (the teardown loop), then plan the next type.",
        assign={"next": "{% $states.result.Payload %}", "after_teardown": "retry", "teardown_deadline": None},
        phase="endpoint",
        errors=["CapacityUnavailable", "QuotaExceeded"],
    )
    s["RecordFailure"] = task(
        "RecordFailure",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "resource_name": ATTEMPT_ENDPOINT,
            "failure": "{% $failure %}",
            "phase": "{% $phase %}",
            "execution_arn": EXECUTION,
        },
        "FailurePhase",
        comment="Capture the endpoint's FailureReason before anything is deleted; it is gone afterwards.",
        assign={"failure_record": "{% $states.result.Payload %}", "after_teardown": "fail", "teardown_deadline": None},
        phase="diagnosis",
    )
    s["FailurePhase"] = {
        "Type": "Choice",
        "Choices": [{"Condition": "{% $phase = 'prepare' %}", "Next": "DiscardServedCopy"}],
        "Default": "Teardown",
    }
    s["DiscardServedCopy"] = task(
        "Teardown",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "resource_name": "{% $req.resource_name %}",
            "artifact_uri": "{% $req.artifact_uri %}",
            "sagemaker": False,
            "execution_arn": EXECUTION,
        },
        "MarkFailed",
        timeout=120,
        comment="Nothing exists in SageMaker yet: only the validated copy (if any) is deleted.",
        assign={"teardown": "{% $states.result.Payload %}"},
        phase="teardown",
    )
    s["Teardown"] = task(
        "Teardown",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "resource_name": "{% $req.resource_name %}",
            "artifact_uri": "{% $req.artifact_uri %}",
            "attempt": "{% $plan.attempt %}",
            "deadline_at": "{% $teardown_deadline %}",
            "final": "{% $after_teardown = 'fail' %}",
            "execution_arn": EXECUTION,
            "endpoint_name": ATTEMPT_ENDPOINT,
        },
        "TeardownDone",
        timeout=120,
        throttled=True,
        comment="One pass: delete the endpoint; once it is gone, its config and model (and the served copy).",
        assign={
            "teardown": "{% $states.result.Payload %}",
            "teardown_deadline": "{% $states.result.Payload.deadline_at %}",
        },
        phase="teardown",
    )
    s["TeardownDone"] = {
        "Type": "Choice",
        "Choices": [
            {"Condition": "{% $teardown.done and $after_teardown = 'retry' %}", "Next": "PrepareNextAttempt"},
            {"Condition": "{% $teardown.done %}", "Next": "MarkFailed"},
            {"Condition": "{% $teardown.gave_up and $after_teardown = 'retry' %}", "Next": "ReleaseGaveUp"},
            {"Condition": "{% $teardown.gave_up %}", "Next": "MarkFailed"},
        ],
        "Default": "WaitForTeardown",
    }
    s["WaitForTeardown"] = {"Type": "Wait", "Seconds": "{% $teardown.wait_seconds %}", "Next": "Teardown"}
    s["PrepareNextAttempt"] = {
        "Type": "Pass",
        "Comment": "The failed attempt is gone: the next instance type starts from a clean slate.",
        "Assign": {
            "attempt": "{% $next.attempt %}",
            "after_teardown": "fail",
            "teardown_deadline": None,
            "quota_waits": 0,
            "quota_wait_until": None,
            "endpoint": None,
        },
        "Next": "BuildEngineEnv",
    }
    s["ReleaseGaveUp"] = {
        "Type": "Pass",
        "Comment": (
            "The failed attempt's endpoint could not be deleted in time: no new one under its name; the reaper retries."
        ),
        "Assign": {
            "failure": {
                "Error": "TeardownIncomplete",
                "Cause": (
                    "{% 'the failed attempt on ' & $plan.instance_type & ' could not be deleted before the next "
                    "type: ' & $string($teardown.left_behind) %}"
                ),
                "State": "Teardown",
            }
        },
        "Next": "MarkFailed",
    }
    s["MarkFailed"] = task(
        "Finalize",
        {
            "deployment_id": "{% $req.deployment_id %}",
            "outcome": "failed",
            "execution_arn": EXECUTION,
            "request": "{% $req %}",
            "summary": {"failure": "{% $failure %}", "teardown": "{% $teardown %}"},
        },
        "DeploymentFailed",
        phase="final",
    )
    s["DeploymentFailed"] = {"Type": "Fail", "Error": FAIL_ERROR, "Cause": FAIL_CAUSE}
    return {
        "Comment": (
            "modeldrop: validate -> image -> engine env -> endpoint -> poll -> smoke eval. Failures are routed by "
            "phase (see tools/gen_asl.py); capacity failures fall back across the request's instance types."
        ),
        "QueryLanguage": "JSONata",
        "StartAt": "NormalizeRequest",
        "States": s,
    }


def build() -> dict[str, Any]:
    return definition()


def render() -> str:
    return json.dumps(definition(), indent=2) + "\n"


if __name__ == "__main__":
    if "--check" in sys.argv:
        sys.exit(0 if OUT.read_text() == render() else 1)
    OUT.write_text(render())
    print(f"wrote {OUT}")
