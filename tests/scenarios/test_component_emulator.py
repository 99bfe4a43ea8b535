"""The emulated inference components refuse what SageMaker's API reference says it refuses: each
refusal here is a call moto (which has no inference components) would not check."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from modeldrop.aws.s3.checkpoint_upload import upload_directory
from modeldrop.local.samples.adapter import write_adapter
from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz

ROLE = "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker"
IMAGE = "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.36.0-lmi18.0.0-cu128"
PROBE = json.dumps({"inputs": "Say hello.", "parameters": {"max_new_tokens": 8}}).encode()


def _refused(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as info:
        call(**kwargs)
    error = info.value.response["Error"]
    assert error["Code"] == "ValidationException", error
    return str(error["Message"])


def _wait(describe: Any, key: str, **kwargs: Any) -> str:
    for _ in range(200):
        status = str(describe(**kwargs)[key])
        if status not in ("Creating", "Updating"):
            return status
    raise AssertionError(f"still creating: {kwargs}")


def _variant(model: str | None = None) -> dict[str, Any]:
    variant: dict[str, Any] = {"VariantName": "AllTraffic", "InitialInstanceCount": 1, "InstanceType": "ml.g6.2xlarge"}
    return {**variant, "ModelName": model} if model else variant


def test_inference_components_are_as_strict_as_sagemaker(stack: Any, tmp_path: Path) -> None:
    sm, s3 = stack.client("sagemaker"), stack.client("s3")
    upload_directory(s3, write_checkpoint(tmp_path / "base"), stack.bucket, "served-x/base/", marker=False)
    container = {
        "Image": IMAGE,
        "Environment": {"OPTION_ENABLE_LORA": "true", "OPTION_MAX_LORAS": "2", "OPTION_MAX_LORA_RANK": "16"},
        "ModelDataSource": {
            "S3DataSource": {
                "S3Uri": f"s3://{stack.bucket}/served-x/base/",
                "S3DataType": "S3Prefix",
                "CompressionType": "None",
            }
        },
    }
    sm.create_model(ModelName="ic-model", ExecutionRoleArn=ROLE, PrimaryContainer=container)
    # A config for components names no model and carries the role; it does not mix with model variants.
    assert "ExecutionRoleArn is required" in _refused(
        sm.create_endpoint_config, EndpointConfigName="ic-norole", ProductionVariants=[_variant()]
    )
    mixed = [_variant("ic-model"), {**_variant(), "VariantName": "Other"}]
    assert "all or none" in _refused(
        sm.create_endpoint_config, EndpointConfigName="ic-mixed", ProductionVariants=mixed, ExecutionRoleArn=ROLE
    )
    sm.create_endpoint_config(EndpointConfigName="ic-ep", ProductionVariants=[_variant()], ExecutionRoleArn=ROLE)
    assert sm.describe_endpoint_config(EndpointConfigName="ic-ep")["ExecutionRoleArn"] == ROLE
    sm.create_endpoint(EndpointName="ic-ep", EndpointConfigName="ic-ep")
    assert _wait(sm.describe_endpoint, "EndpointStatus", EndpointName="ic-ep") == "InService"

    base: dict[str, Any] = {
        "InferenceComponentName": "ic-base",
        "EndpointName": "ic-ep",
        "VariantName": "AllTraffic",
        "Specification": {
            "ModelName": "ic-model",
            "ComputeResourceRequirements": {"NumberOfAcceleratorDevicesRequired": 1, "MinMemoryRequiredInMb": 1024},
        },
        "RuntimeConfig": {"CopyCount": 1},
    }
    create = sm.create_inference_component
    assert "Could not find endpoint" in _refused(create, **{**base, "EndpointName": "ic-missing"})
    assert "Could not find model" in _refused(
        create, **{**base, "Specification": {**base["Specification"], "ModelName": "nope"}}
    )
    no_compute = {"ModelName": "ic-model"}  # botocore checks the fields inside, not that it is there
    assert "MinMemoryRequiredInMb" in _refused(create, **{**base, "Specification": no_compute})
    assert "CopyCount" in _refused(create, **{k: v for k, v in base.items() if k != "RuntimeConfig"})
    assert "regular expression" in _refused(create, **{**base, "InferenceComponentName": "under_score"})

    packed = write_tar_gz(write_adapter(tmp_path / "lora-a"), tmp_path / "lora-a.tar.gz")
    s3.upload_file(str(packed), stack.bucket, "served-x/lora/lora-a.tar.gz")
    adapter: dict[str, Any] = {
        "InferenceComponentName": "ic-lora-a",
        "EndpointName": "ic-ep",
        "Specification": {
            "BaseInferenceComponentName": "ic-base",
            "Container": {"ArtifactUrl": f"s3://{stack.bucket}/served-x/lora/lora-a.tar.gz"},
        },
    }
    assert "Could not find inference component" in _refused(create, **adapter)  # no base yet

    create(**base)
    assert "Cannot create already existing inference component" in _refused(create, **base)
    assert _wait(sm.describe_inference_component, "InferenceComponentStatus", InferenceComponentName="ic-base") == (
        "InService"
    )
    with_compute = {
        **adapter["Specification"],
        "ComputeResourceRequirements": base["Specification"]["ComputeResourceRequirements"],
    }
    assert "takes no ComputeResourceRequirements" in _refused(create, **{**adapter, "Specification": with_compute})
    assert "takes no RuntimeConfig" in _refused(create, **adapter, RuntimeConfig={"CopyCount": 1})
    folder = {**adapter["Specification"], "Container": {"ArtifactUrl": f"s3://{stack.bucket}/served-x/lora/lora-a/"}}
    assert ".tar.gz" in _refused(create, **{**adapter, "Specification": folder})
    create(**adapter)
    assert _wait(sm.describe_inference_component, "InferenceComponentStatus", InferenceComponentName="ic-lora-a") == (
        "InService"
    )
    # What holds components is not deleted before them.
    assert "adapter inference components still use it" in _refused(
        sm.delete_inference_component, InferenceComponentName="ic-base"
    )
    assert "still has inference components" in _refused(sm.delete_endpoint, EndpointName="ic-ep")

    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)
    with pytest.raises(ClientError, match="Inference Component Name header is required"):
        runtime.invoke_endpoint(EndpointName="ic-ep", Body=PROBE)

    def answer(component: str) -> str:
        body = runtime.invoke_endpoint(EndpointName="ic-ep", InferenceComponentName=component, Body=PROBE)["Body"]
        return str(json.loads(body.read())["generated_text"])

    assert answer("ic-lora-a") != answer("ic-base")  # the adapter component's invocations go through the adapter

    sm.delete_inference_component(InferenceComponentName="ic-lora-a")
    listed = sm.list_inference_components(EndpointNameEquals="ic-ep")["InferenceComponents"]
    assert {c["InferenceComponentName"]: c["InferenceComponentStatus"] for c in listed}["ic-lora-a"] == "Deleting"
    assert [c["InferenceComponentName"] for c in sm.list_inference_components()["InferenceComponents"]] == ["ic-base"]
    sm.delete_inference_component(InferenceComponentName="ic-base")
    sm.list_inference_components()
    sm.list_inference_components()
    sm.delete_endpoint(EndpointName="ic-ep")
