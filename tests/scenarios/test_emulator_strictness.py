"""The emulator refuses what AWS refuses: each test here fails against moto's lenient default."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError
from conftest import ROOT

ROLE = "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.26.0-gpu-py312-cu130-ubuntu22.04-sagemaker-v1.1"


def _model(sm: Any, name: str, container: dict[str, Any] | None = None) -> None:
    sm.create_model(
        ModelName=name,
        ExecutionRoleArn=ROLE,
        PrimaryContainer=container or {"Image": IMAGE, "ModelDataUrl": "s3://bucket-x/a/model.tar.gz"},
    )


def _config(sm: Any, name: str, instance_type: str = "ml.g6.2xlarge") -> None:
    sm.create_endpoint_config(
        EndpointConfigName=name,
        ProductionVariants=[
            {"VariantName": "AllTraffic", "ModelName": name, "InitialInstanceCount": 1, "InstanceType": instance_type}
        ],
    )


def _refused(call: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as info:
        call(*args, **kwargs)
    error = info.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    return str(error["Message"])


def test_sagemaker_names_are_unique_for_models_and_configs(stack: Any) -> None:
    sm = stack.client("sagemaker")
    _model(sm, "modeldrop-dup")
    assert "Cannot create already existing model" in _refused(_model, sm, "modeldrop-dup")
    _config(sm, "modeldrop-dup")
    assert "Cannot create already existing endpoint configuration" in _refused(_config, sm, "modeldrop-dup")


def test_instance_types_come_from_botocores_service_model(stack: Any) -> None:
    from modeldrop.contracts.instance_types import hosting_instance_types, instance_type_problem

    sm = stack.client("sagemaker")
    _model(sm, "modeldrop-types")
    assert "instanceType" in _refused(_config, sm, "modeldrop-types", "ml.g6.2xlage")
    _config(sm, "modeldrop-types", "ml.g6e.2xlarge")  # a GPU type moto's own list lacks
    assert {"ml.g6.2xlarge", "ml.g6e.2xlarge", "ml.p5.48xlarge"} <= hosting_instance_types()
    typo = instance_type_problem("ml.g6.2xlage")
    assert typo is not None and "ml.g6.2xlarge" in typo[1]
    cpu = instance_type_problem("ml.m5.xlarge")
    assert cpu is not None and "no NVIDIA GPU" in cpu[0]
    assert instance_type_problem("ml.g6.2xlarge") is None


@pytest.mark.parametrize(
    ("container", "says"),
    [
        ({"ModelDataUrl": "s3://bucket-x/a/model.tar"}, ".tar.gz"),
        ({"ModelDataUrl": "s3://bucket-x/a/weights.zip"}, ".tar.gz"),
        (
            {
                "ModelDataSource": {
                    "S3DataSource": {"S3Uri": "s3://bucket-x/a", "S3DataType": "S3Prefix", "CompressionType": "None"}
                }
            },
            "slash",
        ),
        (
            {
                "ModelDataSource": {
                    "S3DataSource": {"S3Uri": "s3://bucket-x/a/", "S3DataType": "S3Prefix", "CompressionType": "Gzip"}
                }
            },
            "Gzip",
        ),
    ],
)
def test_create_model_refuses_artifacts_sagemaker_cannot_load(stack: Any, container: dict[str, Any], says: str) -> None:
    sm = stack.client("sagemaker")
    assert says in _refused(_model, sm, "modeldrop-shape", {"Image": IMAGE, **container})


def test_an_uncompressed_prefix_is_accepted(stack: Any) -> None:
    source = {"S3Uri": "s3://bucket-x/a/", "S3DataType": "S3Prefix", "CompressionType": "None"}
    _model(stack.client("sagemaker"), "modeldrop-prefix", {"Image": IMAGE, "ModelDataSource": {"S3DataSource": source}})


def _run(stack: Any, request: dict[str, Any]) -> dict[str, Any]:
    return stack.wait(stack.start(request))


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("artifact_uri", "s3://{bucket}/runs/x/model.tar", "model.tar.gz"),
        ("artifact_uri", "s3://{bucket}/runs/x/model.tgz", "s3://bucket/prefix/"),
        ("instance_type", "ml.g6.2xlage", "ml.g6.2xlarge"),
        ("instance_type", "ml.m5.xlarge", "no NVIDIA GPU"),
    ],
)
def test_the_state_machine_refuses_before_anything_exists(stack: Any, field: str, value: str, says: str) -> None:
    request = {"artifact_uri": f"s3://{stack.bucket}/runs/x/model.tar.gz", field: value.format(bucket=stack.bucket)}
    desc = _run(stack, request)
    assert desc["status"] == "FAILED" and desc["error"] == "RequestInvalid", desc
    assert says in desc["cause"], desc["cause"]
    assert stack.leftover_resources() == []
    assert stack.table().scan()["Items"] == []


def test_a_definition_using_eval_is_refused(stack: Any) -> None:
    sfn = stack.client("stepfunctions")
    definition = {
        "QueryLanguage": "JSONata",
        "StartAt": "A",
        "States": {"A": {"Type": "Pass", "Assign": {"eval": 1}, "Output": "{% $eval %}", "End": True}},
    }
    with pytest.raises(ClientError) as info:
        sfn.create_state_machine(name="uses-eval", definition=json.dumps(definition), roleArn=ROLE)
    assert info.value.response["Error"]["Code"] == "InvalidDefinition"
    assert "$eval" in info.value.response["Error"]["Message"]


def test_a_wait_of_seven_and_a_half_seconds_fails_the_state(stack: Any) -> None:
    sfn = stack.client("stepfunctions")
    definition = {
        "QueryLanguage": "JSONata",
        "StartAt": "W",
        "States": {"W": {"Type": "Wait", "Seconds": "{% 7.5 %}", "End": True}},
    }
    arn = sfn.create_state_machine(name="wait-7-5", definition=json.dumps(definition), roleArn=ROLE)["stateMachineArn"]
    desc = stack.wait(sfn.start_execution(stateMachineArn=arn)["executionArn"])
    assert desc["status"] == "FAILED" and desc["error"] == "States.QueryEvaluationError", desc


def test_the_poll_interval_parameter_takes_whole_seconds_only(make_stack: Any) -> None:
    with pytest.raises(ValueError, match="PollIntervalSeconds"):
        make_stack({"PollIntervalSeconds": "7.5"})


def test_an_error_without_a_cause_ends_as_itself(stack: Any, archive: bytes) -> None:
    """States.Timeout carries no Cause (and a Fail state may not raise a States.* name): it ends as StepTimedOut."""
    stack.inject["ValidateFunction"] = ["States.Timeout"]
    stack.client("s3").put_object(Bucket=stack.bucket, Key="runs/timeout/model.tar.gz", Body=archive)
    execution = stack.client("stepfunctions").list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    desc = stack.wait(execution[0]["executionArn"])
    assert desc["status"] == "FAILED" and desc["error"] == "StepTimedOut", (desc.get("error"), desc.get("cause"))
    assert desc["cause"].startswith("States.Timeout: "), desc["cause"]
    assert stack.leftover_resources() == []


def test_the_committed_definition_passes_the_strict_checks() -> None:
    from modeldrop.local.emulator.stepfunctions import definition_problems

    assert definition_problems((ROOT / "statemachine" / "deployment.asl.json").read_text()) == []


def test_a_copy_of_a_multipart_upload_reads_back_as_s3_serves_it(stack: Any, tmp_path: Path) -> None:
    """moto's CopyObject drops a composite checksum's type, and every GET of the served copy of an
    artifact over 8 MB (uploaded in parts) then fails the SDK's checksum check: the shim keeps it."""
    from boto3.s3.transfer import TransferConfig

    from modeldrop.aws.s3.served_copy import copy_pinned

    big = tmp_path / "model-00001-of-00001.safetensors"
    big.write_bytes(os.urandom(20 * 1024 * 1024))
    s3 = stack.client("s3")
    s3.upload_file(str(big), stack.bucket, "direct/big/shard", Config=TransferConfig(multipart_threshold=8 << 20))
    etag = s3.head_object(Bucket=stack.bucket, Key="direct/big/shard")["ETag"]
    key = "modeldrop-served/big/shard"
    assert copy_pinned(s3, stack.bucket, "direct/big/shard", etag, key, big.stat().st_size) == 1
    body = s3.get_object(Bucket=stack.bucket, Key=key, ChecksumMode="ENABLED")["Body"].read()
    assert body == big.read_bytes()


def test_add_tags_overwrites_a_key_and_holds_at_most_50(stack: Any) -> None:
    """moto appends a second tag of the same key; SageMaker replaces its value (an extended expiry that
    kept the old tag first would never be read)."""
    sm = stack.client("sagemaker")
    _model(sm, "modeldrop-tags")
    arn = sm.describe_model(ModelName="modeldrop-tags")["ModelArn"]
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "k", "Value": "1"}])
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "k", "Value": "2"}])
    assert [t for t in sm.list_tags(ResourceArn=arn)["Tags"] if t["Key"] == "k"] == [{"Key": "k", "Value": "2"}]
    with pytest.raises(ClientError, match="at most 50 tags"):
        sm.add_tags(ResourceArn=arn, Tags=[{"Key": f"t{i}", "Value": "x"} for i in range(50)])


def test_the_streamed_eval_and_a_component_invoke_need_their_own_grants(stack: Any, archive: bytes) -> None:
    """The SAR: InvokeEndpointWithResponseStream is an action of its own, and inference-component a
    resource type of both invoke actions. A role granted only InvokeEndpoint on endpoint/* is denied
    both; the SmokeEval role the template grants is allowed."""
    import boto3
    from conftest import create_endpoint

    from modeldrop.local.emulator.iam.enforcement import Principal, acting_as

    create_endpoint(stack, "modeldrop-grants", archive)
    sm = stack.client("sagemaker")
    for _ in range(40):
        if sm.describe_endpoint(EndpointName="modeldrop-grants")["EndpointStatus"] != "Creating":
            break
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}).encode()
    narrow = Principal(
        "old-smoke-eval",
        "arn:aws:iam::123456789012:role/old-smoke-eval",
        ({"Effect": "Allow", "Action": "sagemaker:InvokeEndpoint", "Resource": "arn:aws:sagemaker:*:*:endpoint/*"},),
    )
    with acting_as(narrow), pytest.raises(ClientError, match="InvokeEndpointWithResponseStream"):
        runtime.invoke_endpoint_with_response_stream(EndpointName="modeldrop-grants", Body=body)
    with acting_as(narrow), pytest.raises(ClientError, match="inference-component"):
        runtime.invoke_endpoint(EndpointName="modeldrop-grants", InferenceComponentName="modeldrop-x", Body=body)
    with acting_as(stack.functions["SmokeEvalFunction"].principal):
        events = runtime.invoke_endpoint_with_response_stream(EndpointName="modeldrop-grants", Body=body)["Body"]
        assert any("PayloadPart" in event for event in events)


def test_a_component_startup_timeout_outside_sagemakers_bounds_is_refused() -> None:
    """botocore checks only the minimum on the client; SageMaker refuses past 3600 s."""
    from moto.sagemaker.exceptions import ValidationError

    from modeldrop.local.emulator.sagemaker.components import _check_startup

    _check_startup({"ModelDataDownloadTimeoutInSeconds": 3600, "ContainerStartupHealthCheckTimeoutInSeconds": 60})
    with pytest.raises(ValidationError, match="between 60 and 3600"):
        _check_startup({"ContainerStartupHealthCheckTimeoutInSeconds": 7200})


def test_a_checksum_that_does_not_match_the_body_is_refused_and_a_checksummed_upload_needs_its_parts(
    stack: Any,
) -> None:
    """moto stores a body whatever its x-amz-checksum-crc32 says, and completes an upload created for
    CRC-32 from parts named without theirs; S3 answers BadDigest and InvalidRequest."""
    s3 = stack.client("s3")
    with pytest.raises(ClientError, match="BadDigest"):
        s3.put_object(Bucket=stack.bucket, Key="direct/c/a", Body=b"abc", ChecksumCRC32="AAAAAA==")
    s3.put_object(Bucket=stack.bucket, Key="direct/c/a", Body=b"abc", ChecksumCRC32="NSRBwg==")
    upload = s3.create_multipart_upload(Bucket=stack.bucket, Key="direct/c/m", ChecksumAlgorithm="CRC32")["UploadId"]
    with pytest.raises(ClientError, match="BadDigest"):
        s3.upload_part(
            Bucket=stack.bucket, Key="direct/c/m", UploadId=upload, PartNumber=1, Body=b"x", ChecksumCRC32="AAAAAA=="
        )
    part = s3.upload_part(Bucket=stack.bucket, Key="direct/c/m", UploadId=upload, PartNumber=1, Body=b"x")
    named = {"PartNumber": 1, "ETag": part["ETag"]}
    with pytest.raises(ClientError, match="must include the checksum for each part"):
        s3.complete_multipart_upload(
            Bucket=stack.bucket, Key="direct/c/m", UploadId=upload, MultipartUpload={"Parts": [named]}
        )
    parts = [{**named, "ChecksumCRC32": part["ChecksumCRC32"]}]
    s3.complete_multipart_upload(
        Bucket=stack.bucket, Key="direct/c/m", UploadId=upload, MultipartUpload={"Parts": parts}
    )
