"""What moto alone cannot show about a first real endpoint: the host driver against the image's CUDA,
images in every region, starter failures, URL-encoded keys, and IAM enforced on every call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT
from typer.testing import CliRunner

MODELDROP = [sys.executable, "-m", "modeldrop"]
FIXTURE = str(ROOT / "tests" / "fixtures" / "gemma4-text-kvshared-base")


def _plan(*args: str) -> dict[str, Any]:
    from modeldrop.cli import app

    result = CliRunner().invoke(app, ["plan", FIXTURE, *args, "--json"])
    assert result.exit_code in (0, 1), result.output
    return dict(json.loads(result.output))


def test_the_plan_picks_the_host_ami_for_the_images_cuda_and_the_image_of_the_region() -> None:
    g5 = _plan("--instance-type", "ml.g5.2xlarge", "--region", "us-east-1")
    # The DLC is a CUDA 13.0 build; ml.g5's default driver is 470: only the driver-580 AMI runs it.
    assert g5["deployable"] and g5["inference_ami_version"] == "al2023-ami-sagemaker-inference-gpu-4-1"
    assert g5["host"]["driver"] == 580 and g5["host"]["image_cuda"] == "13.0" and "470" in g5["host"]["note"]
    osaka = _plan("--region", "ap-northeast-3")
    assert osaka["image"].startswith("364406365360.dkr.ecr.ap-northeast-3.amazonaws.com/vllm:")
    from modeldrop.cli import app

    unknown = CliRunner().invoke(app, ["plan", FIXTURE, "--region", "xx-nowhere-9", "--json"])
    assert unknown.exit_code == 2 and json.loads(unknown.output)["error"] == "RegionUnknown"  # before any plan
    # SGLang's DLC has kernels for H100/B200 only: an L4 type is skipped with the reason, an H100 one fits.
    sglang = _plan("--engine", "sglang", "--instance-type", "ml.g6.2xlarge,ml.p5.48xlarge", "--region", "us-east-1")
    verdicts = {c["instance_type"]: (c["verdict"], c["usable"], c["reason"]) for c in sglang["candidates"]}
    assert verdicts["ml.g6.2xlarge"][:2] == ("incompatible", False) and "sm_89" in verdicts["ml.g6.2xlarge"][2]
    assert sglang["instance_type"] == "ml.p5.48xlarge"


def test_every_region_the_catalog_prices_has_a_dlc_registry() -> None:
    from modeldrop.serving.image import registry_account
    from modeldrop.serving.memory_plan import instance_catalog

    regions = {r for spec in instance_catalog()["instances"].values() for r in spec["price"]}
    assert regions and all(registry_account(r) for r in regions)


def test_the_endpoint_config_carries_the_ami_and_without_it_the_container_cannot_start(stack: Any, archive: bytes):
    """Deployed through the state machine, the config names the AMI and the endpoint serves; the same
    CUDA 13 image on a g6 host with its default driver (535) never starts, as SageMaker fails it."""
    stack.client("s3").put_object(Bucket=stack.bucket, Key="direct/ami/model.tar.gz", Body=archive)
    arn = stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/ami/model.tar.gz"}, name="with-ami")
    desc = stack.wait(arn)
    assert desc["status"] == "SUCCEEDED", desc.get("cause")
    sm = stack.client("sagemaker")
    name = json.loads(desc["output"])["endpoint_name"]
    config = sm.describe_endpoint_config(
        EndpointConfigName=sm.describe_endpoint(EndpointName=name)["EndpointConfigName"]
    )
    assert config["ProductionVariants"][0]["InferenceAmiVersion"] == "al2023-ami-sagemaker-inference-gpu-4-1"

    from modeldrop.aws.sagemaker.sagemaker_resources import create_all, tags_for

    image = config_image = sm.describe_model(ModelName=name)["PrimaryContainer"]["Image"]
    assert "-cu130-" in config_image
    create_all(
        sm, "modeldrop-no-ami", image, f"s3://{stack.bucket}/direct/ami/", {},
        "arn:aws:iam::123456789012:role/modeldrop-local-sagemaker", "ml.g6.2xlarge", 600, 600,
        tags_for("modeldrop-local", "no-ami", "2099-01-01T00:00:00Z"),
    )  # fmt: skip  # the same image, the host's default driver: no InferenceAmiVersion
    failed = sm.describe_endpoint(EndpointName="modeldrop-no-ami")
    assert failed["EndpointStatus"] == "Failed" and "CannotStartContainerError" in failed["FailureReason"]
    with pytest.raises(Exception, match="ResourceNotFound"):  # and, as often on SageMaker, no logs at all
        stack.client("logs").describe_log_streams(logGroupName="/aws/sagemaker/Endpoints/modeldrop-no-ami")
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError, match="inferenceAmiVersion"):  # a version botocore's model does not list
        sm.create_endpoint_config(
            EndpointConfigName="modeldrop-bad-ami",
            ProductionVariants=[
                {
                    "VariantName": "AllTraffic",
                    "ModelName": name,
                    "InstanceType": "ml.g6.2xlarge",
                    "InitialInstanceCount": 1,
                    "InferenceAmiVersion": "al2-ami-sagemaker-inference-gpu-9",  # type: ignore[typeddict-item]
                }
            ],
        )


@pytest.mark.parametrize("folder", ["runs/exp 1+b", "run=7", "10:47", "pct%20literal", "모델/ünïcode", "a b/c+d=e:f%g"])
def test_keys_arrive_url_encoded_and_the_starter_decodes_them(stack: Any, folder: str) -> None:
    """S3 sends keys URL-encoded in its events (the emulator does too); the starter reads them through
    Powertools, as AWS's consumers do, so the request names the object that exists -- archive or marker."""
    s3 = stack.client("s3")
    s3.put_object(Bucket=stack.bucket, Key=f"{folder}/model.tar.gz", Body=b"archive")
    s3.put_object(Bucket=stack.bucket, Key=f"{folder}/shards/config.json", Body=b"{}")
    s3.put_object(Bucket=stack.bucket, Key=f"{folder}/shards/modeldrop.json", Body=b'{"ttl_hours": 2}')
    sfn = stack.client("stepfunctions")
    inputs = []
    for execution in sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]:
        inputs.append(json.loads(sfn.describe_execution(executionArn=execution["executionArn"])["input"]))
        stack.wait(execution["executionArn"])
    uris = sorted(i["artifact_uri"] for i in inputs)
    assert uris == [f"s3://{stack.bucket}/{folder}/model.tar.gz", f"s3://{stack.bucket}/{folder}/shards/"], uris
    starter = [i for i in stack.invocations if i.function == "StarterFunction"]
    assert all(i.error is None for i in starter), starter


def test_run_local_starter_failures_land_in_its_queue_and_encoded_keys_deploy() -> None:
    failed = subprocess.run(
        [*MODELDROP, "run-local", "--fault", "starter-error", "--json"], capture_output=True, text=True, cwd=ROOT,
        timeout=300,
    )  # fmt: skip
    assert "Traceback" not in failed.stderr, failed.stderr
    data = json.loads(failed.stdout)
    assert failed.returncode == 1 and data["status"] == "not-started" and data["leftover_resources"] == []
    [record] = data["starter_failures"]
    assert record["requestContext"]["condition"] == "RetriesExhausted"
    assert record["requestContext"]["approximateInvokeCount"] == 3  # the first try and Lambda's two retries
    assert "states:StartExecution" in record["responsePayload"]["errorMessage"]
    key = "runs/exp 1+b/model.tar.gz"
    ok = subprocess.run(
        [*MODELDROP, "run-local", "--key", key, "--json"], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    deployed = json.loads(ok.stdout)
    assert deployed["record"]["artifact_uri"].endswith(key) and deployed["leftover_resources"] == []


def test_a_capacity_stall_whose_delete_is_refused_moves_on_to_the_next_type() -> None:
    run = subprocess.run(
        [*MODELDROP, "run-local", "--fault", "delete-while-creating,capacity", "--instance-type",
         "ml.g6.2xlarge,ml.g6e.2xlarge", "--json"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    assert "Traceback" not in run.stderr, run.stderr
    data = json.loads(run.stdout)
    assert run.returncode == 0, (data.get("error"), data.get("cause"))
    record = data["record"]
    assert record["instance_type"] == "ml.g6e.2xlarge" and data["leftover_resources"] == []
    [stranded] = record["steps"]["stranded"]  # the first type's endpoint, which SageMaker kept Creating
    assert record["endpoint_name"] == stranded["endpoint"] + "-a2"
    assert f"endpoint/{stranded['endpoint']}" in data["deleted_at_exit"]


# ---- IAM, enforced ---------------------------------------------------------------------------------


def test_every_call_the_functions_made_was_checked_and_allowed(stack: Any, archive: bytes) -> None:
    from modeldrop.local.emulator.iam.enforcement import CHECKED

    stack.client("s3").put_object(Bucket=stack.bucket, Key="runs/iam/model.tar.gz", Body=archive)
    [execution] = stack.client("stepfunctions").list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
    assert stack.wait(execution["executionArn"])["status"] == "SUCCEEDED"
    stack.settle()
    assert CHECKED and not [c for c in CHECKED if c.decision != "allowed"]
    functions = {c.principal for c in CHECKED}
    assert {"StarterFunction", "RegisterFunction", "ValidateFunction", "CreateEndpointFunction"} <= functions
    assert len({c.call for c in CHECKED}) >= 15, sorted({c.call for c in CHECKED})


def _stack_without(tmp_path: Path, function: str, action: str) -> Path:
    """A copy of the project whose template lacks one function's statement naming ACTION."""
    import yaml

    from modeldrop.local.stack.emulated import _CfnLoader

    root = tmp_path / "project"
    root.mkdir()
    for name in ("statemachine", "functions"):
        (root / name).symlink_to(ROOT / name)
    text = (ROOT / "template.yaml").read_text()
    template = yaml.load(text, Loader=_CfnLoader)
    statements = template["Resources"][function]["Properties"]["Policies"][0]["Statement"]
    kept = [s for s in statements if action not in json.dumps(s)]
    assert len(kept) == len(statements) - 1, f"{function} has no single statement naming {action}"
    template["Resources"][function]["Properties"]["Policies"][0]["Statement"] = kept
    (root / "template.yaml").write_text(json.dumps(template))  # JSON is YAML: the loader reads it back
    return root


def test_a_statement_removed_from_the_template_fails_the_call_as_aws_would(make_stack: Any, archive: bytes, tmp_path):
    from modeldrop.local.emulator.iam.enforcement import CHECKED

    stack = make_stack(root=_stack_without(tmp_path, "ValidateFunction", "s3:AbortMultipartUpload"))
    stack.client("s3").put_object(Bucket=stack.bucket, Key="direct/denied/model.tar.gz", Body=archive)
    arn = stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/denied/model.tar.gz"}, name="denied")
    desc = stack.wait(arn)
    assert desc["status"] == "FAILED" and "AccessDenied" in desc["cause"], desc.get("cause")
    denied = [c for c in CHECKED if c.decision == "denied"]
    assert denied and denied[0].principal == "ValidateFunction" and "s3:PutObject" in denied[0].denied[0]
    assert stack.leftover_resources() == []


def test_the_branches_no_happy_path_reaches_are_allowed_too(make_stack: Any, archive: bytes, checkpoint: Path):
    """A prefix that changes while it is copied is refused with the reason (the cleanup deletes the
    partial copy, which the validate role may); an eval set in another bucket is refused at the door,
    before an endpoint-hour."""
    from modeldrop.local.emulator.iam.enforcement import acting_as, after_call

    stack = make_stack()
    s3 = stack.client("s3")
    for path in checkpoint.iterdir():
        s3.put_object(Bucket=stack.bucket, Key=f"direct/moving/{path.name}", Body=path.read_bytes())

    def change_it(params: Any, _result: Any) -> None:
        if str(params.get("Key", "")).startswith("modeldrop-served/") and not changed:
            changed.append(True)
            with acting_as(None):  # the uploader, not the function whose copy this follows
                s3.put_object(Bucket=stack.bucket, Key="direct/moving/late.txt", Body=b"uploaded mid-copy")

    changed: list[bool] = []
    after_call("s3", "CopyObject", change_it)
    desc = stack.wait(stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/moving/"}, name="moving"))
    assert desc["error"] == "CheckpointUnreadable" and "changed while it was being deployed" in desc["cause"]
    foreign = stack.wait(
        stack.start(
            {"artifact_uri": f"s3://{stack.bucket}/direct/moving/", "eval_set_uri": "s3://someone-else/eval.jsonl"},
            name="foreign-eval",
        )
    )
    assert foreign["error"] == "RequestInvalid" and "reads only its artifact bucket" in foreign["cause"]
    assert stack.leftover_resources() == []


@pytest.mark.parametrize("allowed", [True, False])
def test_a_secret_under_a_customer_managed_key(make_stack: Any, archive: bytes, allowed: bool) -> None:
    import boto3

    kms = boto3.client("kms", region_name="us-east-1")
    key = kms.create_key()["KeyMetadata"]["Arn"]
    stack = make_stack({"SecretsKmsKeyArn": key} if allowed else None)
    stack.client("secretsmanager").create_secret(Name="modeldrop/wandb", SecretString="v4lue", KmsKeyId=key)
    stack.client("s3").put_object(Bucket=stack.bucket, Key="direct/cmk/model.tar.gz", Body=archive)
    request = {
        "artifact_uri": f"s3://{stack.bucket}/direct/cmk/model.tar.gz",
        "secrets": {"WANDB_API_KEY": "secretsmanager:modeldrop/wandb"},
    }
    desc = stack.wait(stack.start(request, name="cmk"))
    if allowed:
        assert desc["status"] == "SUCCEEDED", desc.get("cause")
    else:
        assert desc["error"] == "RequestInvalid" and "AccessDenied" in desc["cause"], desc.get("cause")
        assert stack.leftover_resources() == []
