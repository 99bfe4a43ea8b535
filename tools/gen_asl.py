"""Generate statemachine/deployment.asl.json (run: python tools/gen_asl.py).

The ASL is data; this script only keeps its repetitive Retry/Catch blocks consistent. The JSON it
writes is committed and is what SAM, the tests and the local run all load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LAMBDA_TRANSIENT = {
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
BOOKKEEPING_RETRY = {
    "ErrorEquals": ["States.ALL"],
    "IntervalSeconds": 2,
    "MaxAttempts": 5,
    "BackoffRate": 2,
    "MaxDelaySeconds": 30,
    "JitterStrategy": "FULL",
}
SAGEMAKER_THROTTLE = {
    "ErrorEquals": ["SageMakerThrottled"],
    "IntervalSeconds": 5,
    "MaxAttempts": 8,
    "BackoffRate": 2,
    "MaxDelaySeconds": 120,
    "JitterStrategy": "FULL",
}


def to_failure(errors: list[str]) -> dict[str, Any]:
    return {
        "ErrorEquals": errors,
        "Next": "RecordFailure",
        "Assign": {"failure": "{% $merge([$states.errorOutput, {'State': $states.context.State.Name}]) %}"},
    }


def task(
    name: str,
    payload: dict[str, Any],
    *,
    next_: str | None,
    timeout: int,
    assign: dict[str, str] | None = None,
    catch: list[list[str]] | None = None,
    throttled: bool = False,
    output: Any = None,
    comment: str = "",
) -> dict[str, Any]:
    state: dict[str, Any] = {
        "Type": "Task",
        "Comment": comment,
        "Resource": "arn:aws:states:::lambda:invoke",
        "Arguments": {"FunctionName": f"${{{name}FunctionArn}}", "Payload": payload},
        "TimeoutSeconds": timeout,
        "Retry": [LAMBDA_TRANSIENT] + ([SAGEMAKER_THROTTLE] if throttled else []),
    }
    if not comment:
        del state["Comment"]
    if assign:
        state["Assign"] = assign
    if output is not None:
        state["Output"] = output
    if catch is not None:
        state["Catch"] = [to_failure(errors) for errors in catch]
    if next_:
        state["Next"] = next_
    else:
        state["End"] = True
    return state


ALL = [["States.ALL"]]
# A Fail state may not raise a States.* name (Step Functions reserves the prefix), and States.Timeout
# and other States.* errors may carry no Cause, while an undefined Cause fails the Fail state itself
# (States.QueryEvaluationError). So States.Timeout ends as StepTimedOut, any other States.* error as
# StepFailed, each with the original name in the cause.
_RESERVED = "$substring($failure.Error, 0, 7) = 'States.'"
_CAUSE = "($exists($failure.Cause) ? $failure.Cause : 'no cause was given')"
FAILURE_ERROR = (
    f"{{% {_RESERVED} ? ($failure.Error = 'States.Timeout' ? 'StepTimedOut' : 'StepFailed') : $failure.Error %}}"
)
FAILURE_CAUSE = f"{{% {_RESERVED} ? ($failure.Error & ': ' & {_CAUSE}) : {_CAUSE} %}}"
DEPLOYMENT = "{% $req.deployment_id %}"


def build() -> dict[str, Any]:
    states: dict[str, Any] = {
        "NormalizeRequest": {
            **task(
                "Normalize",
                {"request": "{% $states.input %}", "execution_name": "{% $states.context.Execution.Name %}"},
                next_="RegisterDeployment",
                timeout=60,
                assign={"req": "{% $states.result.Payload %}"},
                comment="Parse the request (direct start or S3 starter) and apply the stack defaults.",
            ),
            "Catch": [
                {
                    "ErrorEquals": ["RequestInvalid"],
                    "Next": "RequestRejected",
                    "Assign": {"failure": "{% $states.errorOutput %}"},
                },
                {
                    "ErrorEquals": ["States.ALL"],
                    "Next": "RequestRejected",
                    "Assign": {"failure": "{% $states.errorOutput %}"},
                },
            ],
        },
        "RequestRejected": {
            "Type": "Fail",
            "Comment": "Nothing was registered or created: the request itself is invalid.",
            "Error": FAILURE_ERROR,
            "Cause": FAILURE_CAUSE,
        },
        "RegisterDeployment": task(
            "Register",
            {"request": "{% $req %}"},
            next_="ValidateCheckpoint",
            timeout=60,
            assign={"artifact": "{% $states.result.Payload %}"},
            catch=[["DuplicateDeployment", "CheckpointUnreadable"], ["States.ALL"]],
        ),
        "ValidateCheckpoint": task(
            "Validate",
            {
                "deployment_id": DEPLOYMENT,
                "artifact_uri": "{% $req.artifact_uri %}",
                "artifact_version": "{% $artifact.artifact_version %}",
            },
            next_="ResolveImage",
            timeout=900,
            assign={"validation": "{% $states.result.Payload %}"},
            catch=[["CheckpointRefused", "CheckpointUnreadable"], ["States.ALL"]],
        ),
        "ResolveImage": task(
            "ResolveImage",
            {"deployment_id": DEPLOYMENT, "engine": "{% $req.engine %}", "model_type": "{% $validation.model_type %}"},
            next_="BuildEngineEnv",
            timeout=60,
            assign={"image": "{% $states.result.Payload %}"},
            catch=[["ImageUnresolvable"], ["States.ALL"]],
        ),
        "BuildEngineEnv": task(
            "BuildEnv",
            {"request": "{% $req %}", "validation": "{% $validation %}", "image": "{% $image %}"},
            next_="CreateEndpoint",
            timeout=60,
            assign={"plan": "{% $states.result.Payload %}"},
            catch=[["PlanRefused"], ["States.ALL"]],
        ),
        "CreateEndpoint": task(
            "CreateEndpoint",
            {
                "request": "{% $req %}",
                "image": "{% $image %}",
                "plan": "{% $plan %}",
                "served_uri": "{% $validation.served_uri %}",
            },
            next_="WaitForEndpoint",
            timeout=120,
            assign={"endpoint": "{% $states.result.Payload %}", "polls": 0},
            catch=[["QuotaExceeded", "ResourceNameTaken"], ["States.ALL"]],
            throttled=True,
        ),
        "WaitForEndpoint": {"Type": "Wait", "Seconds": "{% ${PollIntervalSeconds} %}", "Next": "PollEndpoint"},
        "PollEndpoint": task(
            "PollEndpoint",
            {"deployment_id": DEPLOYMENT, "endpoint": "{% $endpoint %}", "polls": "{% $polls %}"},
            next_="EndpointInService",
            timeout=60,
            assign={"poll": "{% $states.result.Payload %}", "polls": "{% $polls + 1 %}"},
            catch=[["EndpointFailed", "DeployDeadlineExceeded"], ["States.ALL"]],
            throttled=True,
        ),
        "EndpointInService": {
            "Type": "Choice",
            "Choices": [{"Condition": "{% $poll.status = 'InService' %}", "Next": "SmokeEval"}],
            "Default": "WaitForEndpoint",
        },
        "SmokeEval": task(
            "SmokeEval",
            {"request": "{% $req %}", "endpoint": "{% $endpoint %}", "plan": "{% $plan %}"},
            next_="MarkSucceeded",
            timeout=900,
            assign={"eval_result": "{% $states.result.Payload %}"},
            catch=[["EvalFailed"], ["States.ALL"]],
            throttled=True,
        ),
        "MarkSucceeded": task(
            "Finalize",
            {
                "deployment_id": DEPLOYMENT,
                "outcome": "succeeded",
                "request": "{% $req %}",
                "summary": {
                    "endpoint": "{% $endpoint %}",
                    "image": "{% $image %}",
                    "env": "{% $plan.env %}",
                    "eval": "{% $eval_result %}",
                },
            },
            next_="Deployed",
            timeout=60,
        ),
        "DeployedUnrecorded": {
            "Type": "Fail",
            "Comment": (
                "The endpoint is InService and passed its eval, but its record could not be written: it is kept "
                "(its TTL still applies) and the Finalize function's errors alarm."
            ),
            "Error": "DeploymentUnrecorded",
            "Cause": (
                "{% 'endpoint ' & $endpoint.endpoint_name & ' is InService and passed its smoke eval, but the "
                "deployment record could not be written (' & $bookkeeping.Error & '); it stays up until its TTL' %}"
            ),
        },
        "Deployed": {
            "Type": "Succeed",
            "Output": {
                "deployment_id": DEPLOYMENT,
                "status": "succeeded",
                "endpoint_name": "{% $endpoint.endpoint_name %}",
                "image": "{% $image.image_uri %}",
                "env": "{% $plan.env %}",
                "memory": "{% $plan.memory %}",
                "eval": "{% $eval_result %}",
            },
        },
        "RecordFailure": {
            **task(
                "RecordFailure",
                {"deployment_id": DEPLOYMENT, "resource_name": "{% $req.resource_name %}", "failure": "{% $failure %}"},
                next_="Teardown",
                timeout=60,
                assign={"failure_record": "{% $states.result.Payload %}"},
                comment="Capture the endpoint's FailureReason before anything is deleted; it is gone afterwards.",
            ),
            "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Teardown"}],
        },
        "Teardown": {
            **task(
                "Teardown",
                {
                    "deployment_id": DEPLOYMENT,
                    "resource_name": "{% $req.resource_name %}",
                    "artifact_uri": "{% $req.artifact_uri %}",
                },
                next_="MarkFailed",
                timeout=120,
                assign={"teardown": "{% $states.result.Payload %}"},
                throttled=True,
                comment="Delete endpoint -> endpoint config -> model; already gone counts as deleted.",
            ),
            "Catch": [
                {
                    "ErrorEquals": ["States.ALL"],
                    "Next": "MarkFailed",
                    "Assign": {"teardown": {"error": "{% $states.errorOutput %}"}},
                }
            ],
        },
        "MarkFailed": {
            **task(
                "Finalize",
                {
                    "deployment_id": DEPLOYMENT,
                    "outcome": "failed",
                    "request": "{% $req %}",
                    "summary": {"failure": "{% $failure %}", "teardown": "{% $teardown %}"},
                },
                next_="DeploymentFailed",
                timeout=60,
            ),
            "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "DeploymentFailed"}],
        },
        "DeploymentFailed": {
            "Type": "Fail",
            "Error": FAILURE_ERROR,
            "Cause": FAILURE_CAUSE,
        },
    }
    # After the eval passed, a failure is bookkeeping: retried, and never a reason to delete a
    # healthy endpoint (no RecordFailure -> Teardown here).
    states["MarkSucceeded"]["Retry"].append(BOOKKEEPING_RETRY)
    states["MarkSucceeded"]["Catch"] = [
        {
            "ErrorEquals": ["States.ALL"],
            "Next": "DeployedUnrecorded",
            "Assign": {"bookkeeping": "{% $states.errorOutput %}"},
        }
    ]
    return {
        "Comment": (
            "modeldrop: validate -> image -> engine env -> endpoint -> poll -> smoke eval; "
            "any failure -> record, tear down, fail."
        ),
        "QueryLanguage": "JSONata",
        "StartAt": "NormalizeRequest",
        "States": states,
    }


if __name__ == "__main__":
    out = Path(__file__).resolve().parent.parent / "statemachine" / "deployment.asl.json"
    out.write_text(json.dumps(build(), indent=2) + "\n")
    print(f"wrote {out}")
