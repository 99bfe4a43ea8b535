"""Start a modeldrop deployment from any boto3 code (a SageMaker Pipelines step, a notebook, CI) and wait.

    python events/start_deployment.py s3://bucket/direct/runs/7/model.tar.gz --stack modeldrop [--region R]

Plain boto3, no modeldrop import: the state machine is found from the stack's outputs, the input is
a DeploymentRequest (schemas/deployment-request.schema.json). Exit 0 when the endpoint is
InService and passed its smoke eval; 1 with the error name and cause otherwise. In a SageMaker
Pipeline, run this from a ProcessingStep or wrap `deploy()` in the Lambda of a LambdaStep.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import boto3


def deploy(
    artifact_uri: str, stack: str, region: str | None = None, poll_seconds: float = 15.0, name: str | None = None
) -> dict[str, Any]:
    session = boto3.session.Session(region_name=region)
    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in session.client("cloudformation").describe_stacks(StackName=stack)["Stacks"][0]["Outputs"]
    }
    sfn = session.client("stepfunctions")
    arn = sfn.start_execution(
        stateMachineArn=outputs["StateMachineArn"],
        # A name of your own makes a retried start a no-op (ExecutionAlreadyExists) instead of a second endpoint.
        name=name or f"boto3-{time.strftime('%Y%m%d-%H%M%S')}",
        input=json.dumps({"artifact_uri": artifact_uri, "ttl_hours": 4}),
    )["executionArn"]
    while True:
        desc = sfn.describe_execution(executionArn=arn)
        if desc["status"] != "RUNNING":
            return desc
        time.sleep(poll_seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("artifact_uri")
    parser.add_argument("--stack", default="modeldrop")
    parser.add_argument("--region")
    parser.add_argument("--poll-seconds", type=float, default=15.0)
    parser.add_argument("--name", help="execution name, e.g. your training job's name")
    args = parser.parse_args(argv)
    desc = deploy(args.artifact_uri, args.stack, args.region, args.poll_seconds, args.name)
    if desc["status"] == "SUCCEEDED":
        output = json.loads(desc["output"])
        print(f"InService: {output['endpoint_name']} (eval: {output['eval']['summary']})")
        return 0
    print(f"{desc['status']}: {desc.get('error')}: {desc.get('cause')}")
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
