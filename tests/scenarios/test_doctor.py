"""`modeldrop doctor` against the emulator: moto IAM, Service Quotas, CloudFormation, Logs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

from modeldrop.cli import app

REGION = "us-east-1"
BUCKET = "team-artifacts-doctor"
ENGINE_FUNCTION = "modeldrop-EngineCheckFunction-1"


def _trust(service: str) -> str:
    statement = {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


@pytest.fixture
def account() -> Iterator[Any]:
    from moto import mock_aws

    from modeldrop.local.emulator import moto_shims, service_quotas

    moto_shims.install()
    # As Lambda does: an image function's image must be in ECR, and its ResolvedImageUri names its digest.
    os.environ["MOTO_LAMBDA_STUB_ECR"] = "false"
    with mock_aws():
        service_quotas.set_endpoint_quotas({"ml.g6.2xlarge": 2.0})
        boto3.client("s3", region_name=REGION).create_bucket(Bucket=BUCKET)
        yield lambda service: boto3.client(service, region_name=REGION)
    service_quotas.set_endpoint_quotas({})
    os.environ.pop("MOTO_LAMBDA_STUB_ECR")


def _engine_image_function(client: Any, role: str, state: str) -> None:
    """The engine-check function as `sam deploy --resolve-image-repos` leaves it: an image function whose
    repository (SAM's companion stack's) lets Lambda pull. moto's CloudFormation makes every function a zip
    one, so the stack's function is made again as the image function it is on AWS."""
    ecr = client("ecr")
    repo = ecr.create_repository(repositoryName="modeldrop-enginecheckfunction")["repository"]
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"digest": "sha256:" + "a" * 64, "size": 7}, "layers": []}  # fmt: skip
    ecr.put_image(repositoryName=repo["repositoryName"], imageManifest=json.dumps(manifest), imageTag="dev")
    if state != "no-policy":
        pull = {"Effect": "Allow", "Principal": {"Service": ["lambda.amazonaws.com"]},
                "Action": ["ecr:GetDownloadUrlForLayer", "ecr:GetRepositoryPolicy", "ecr:BatchGetImage"]}  # fmt: skip
        policy = {"Version": "2012-10-17", "Statement": [pull]}
        ecr.set_repository_policy(repositoryName=repo["repositoryName"], policyText=json.dumps(policy))
    lam = client("lambda")
    lam.delete_function(FunctionName=ENGINE_FUNCTION)
    lam.create_function(FunctionName=ENGINE_FUNCTION, Role=role, PackageType="Image",
                        Code={"ImageUri": f"{repo['repositoryUri']}:dev"})  # fmt: skip
    if state == "image-gone":  # a lifecycle rule, or a hand, removed it after the deploy
        ecr.batch_delete_image(repositoryName=repo["repositoryName"], imageIds=[{"imageTag": "dev"}])


def _stack(client: Any, role_service: str, reaper_ran: bool = True, engine_image: str | None = "ok") -> None:
    iam = client("iam")
    arn = iam.create_role(RoleName="team-sagemaker", AssumeRolePolicyDocument=_trust(role_service))["Role"]["Arn"]
    alarms = {"Effect": "Allow", "Action": "cloudwatch:DescribeAlarms", "Resource": "arn:aws:cloudwatch:*:*:alarm:*"}
    policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}, alarms]}
    iam.put_role_policy(RoleName="team-sagemaker", PolicyName="read", PolicyDocument=json.dumps(policy))
    outputs = {
        "StateMachineArn": "arn:sm",
        "DeploymentsTableName": "t",
        "ArtifactBucketName": BUCKET,
        "EventBusName": "b",
    }
    engine = {"FunctionName": ENGINE_FUNCTION, "Code": {"ZipFile": "x"}, "Role": arn, "Runtime": "python3.13",
              "Handler": "app.lambda_handler"}  # fmt: skip
    template = {
        "Parameters": {"SageMakerExecutionRoleArn": {"Type": "String"}, "DefaultInstanceType": {"Type": "String"}},
        "Resources": {
            "ReaperFunction": {"Type": "AWS::SNS::Topic"},
            "EngineCheckFunction": {"Type": "AWS::Lambda::Function", "Properties": engine},
        },
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    client("cloudformation").create_stack(
        StackName="modeldrop",
        TemplateBody=json.dumps(template),
        Parameters=[
            {"ParameterKey": "SageMakerExecutionRoleArn", "ParameterValue": arn},
            {"ParameterKey": "DefaultInstanceType", "ParameterValue": "ml.g6.2xlarge"},
        ],
    )
    if engine_image:
        _engine_image_function(client, arn, engine_image)
    if reaper_ran:
        reaper = client("cloudformation").describe_stack_resource(
            StackName="modeldrop", LogicalResourceId="ReaperFunction"
        )
        group = f"/aws/lambda/{reaper['StackResourceDetail']['PhysicalResourceId']}"
        logs = client("logs")
        logs.create_log_group(logGroupName=group)
        logs.create_log_stream(logGroupName=group, logStreamName="s")
        import time

        logs.put_log_events(
            logGroupName=group, logStreamName="s", logEvents=[{"timestamp": int(time.time() * 1000), "message": "ran"}]
        )


def _doctor(*extra: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["doctor", "--stack", "modeldrop", "--region", REGION, "--json", *extra])
    return result.exit_code, json.loads(result.output)


def _by_name(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in data["checks"]}


def test_a_healthy_account_passes(account: Any) -> None:
    _stack(account, "sagemaker.amazonaws.com")
    code, data = _doctor()
    checks = _by_name(data)
    assert code == 0 and data["ok"], data
    assert checks["SageMaker execution role"]["status"] == "ok"
    assert checks["endpoint quota for ml.g6.2xlarge"]["status"] == "ok"
    assert checks["vllm image in us-east-1"]["detail"].startswith("763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:")
    assert checks["reaper"]["status"] == "ok"
    assert checks["engine-check function"]["status"] == "ok", checks["engine-check function"]


@pytest.mark.parametrize(
    ("engine_image", "seen"),
    [(None, "zip function without the engine"), ("no-policy", "has no policy"), ("image-gone", "gone from ECR")],
)
def test_an_engine_check_function_lambda_cannot_run_fails_with_the_redeploy(
    account: Any, engine_image: str | None, seen: str
) -> None:
    _stack(account, "sagemaker.amazonaws.com", engine_image=engine_image)
    code, data = _doctor()
    check = _by_name(data)["engine-check function"]
    assert code == 1 and check["status"] == "fail" and seen in check["detail"], check
    assert "sam deploy --resolve-image-repos" in check["fix"]


def test_a_role_that_trusts_only_bedrock_fails_with_the_fix(account: Any) -> None:
    _stack(account, "bedrock.amazonaws.com")
    code, data = _doctor()
    role = _by_name(data)["SageMaker execution role"]
    assert code == 1 and role["status"] == "fail"
    assert "bedrock.amazonaws.com" in role["detail"] and "update-assume-role-policy" in role["fix"]
    assert "sagemaker.amazonaws.com" in role["fix"]


def test_a_quota_of_zero_fails_with_the_increase_command(account: Any) -> None:
    from modeldrop.local.emulator import service_quotas

    _stack(account, "sagemaker.amazonaws.com")
    service_quotas.set_endpoint_quota("ml.g6.2xlarge", 0)
    code, data = _doctor()
    quota = _by_name(data)["endpoint quota for ml.g6.2xlarge"]
    assert code == 1 and quota["status"] == "fail" and "is 0" in quota["detail"]
    assert quota["fix"].startswith("aws service-quotas request-service-quota-increase --service-code sagemaker")


def test_a_reaper_that_never_ran_and_a_missing_stack_fail(account: Any) -> None:
    _stack(account, "sagemaker.amazonaws.com", reaper_ran=False)
    code, data = _doctor()
    assert code == 1 and _by_name(data)["reaper"]["status"] == "fail"
    result = CliRunner().invoke(app, ["doctor", "--stack", "nope", "--region", REGION, "--json"])
    assert result.exit_code == 1 and json.loads(result.output)["checks"][0]["name"] == "stack"


def test_doctor_help_exists() -> None:
    result = CliRunner().invoke(app, ["doctor", "--help"])
    assert result.exit_code == 0 and "sagemaker.amazonaws.com" in result.output and "quota" in result.output


def test_the_emulator_simulates_the_roles_policies_for_the_bucket_check(account: Any) -> None:
    """moto has no SimulatePrincipalPolicy (doctor could only warn); the emulator judges the role's
    policies with its own evaluator, so a role that cannot list the bucket fails the check."""
    from modeldrop.operate.doctor import check_role_reads_bucket

    iam = account("iam")
    arn = iam.create_role(RoleName="half-reader", AssumeRolePolicyDocument=_trust("sagemaker.amazonaws.com"))["Role"][
        "Arn"
    ]
    objects = {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/*"}
    iam.put_role_policy(
        RoleName="half-reader",
        PolicyName="p",
        PolicyDocument=json.dumps({"Version": "2012-10-17", "Statement": [objects]}),
    )
    half = check_role_reads_bucket(iam, arn, BUCKET)
    assert half.status == "fail" and "s3:ListBucket" in half.detail and "s3:GetObject" not in half.detail
    listing = {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{BUCKET}"}
    policy = {"Version": "2012-10-17", "Statement": [objects, listing]}
    iam.put_role_policy(RoleName="half-reader", PolicyName="p", PolicyDocument=json.dumps(policy))
    assert check_role_reads_bucket(iam, arn, BUCKET).status == "ok"


def test_doctor_fails_a_role_that_cannot_read_the_channel_alarms(account: Any) -> None:
    """A channel's blue/green update rolls back on alarms SageMaker reads as the execution role: the
    deploy guide's policy passes, one without cloudwatch:DescribeAlarms on <prefix>-ch-* fails."""
    from modeldrop.local.stack.build import sagemaker_role_policy
    from modeldrop.operate.doctor import check_role_reads_channel_alarms

    iam = account("iam")
    arn = iam.create_role(RoleName="no-alarms", AssumeRolePolicyDocument=_trust("sagemaker.amazonaws.com"))["Role"][
        "Arn"
    ]
    guide = sagemaker_role_policy(BUCKET, "modeldrop")
    without = {**guide, "Statement": [s for s in guide["Statement"] if "cloudwatch" not in str(s["Action"])]}
    iam.put_role_policy(RoleName="no-alarms", PolicyName="p", PolicyDocument=json.dumps(without))
    missing = check_role_reads_channel_alarms(iam, arn, "us-east-1", "modeldrop")
    assert missing.status == "fail" and "cloudwatch:DescribeAlarms" in (missing.fix or "")
    iam.put_role_policy(RoleName="no-alarms", PolicyName="p", PolicyDocument=json.dumps(guide))
    assert check_role_reads_channel_alarms(iam, arn, "us-east-1", "modeldrop").status == "ok"
