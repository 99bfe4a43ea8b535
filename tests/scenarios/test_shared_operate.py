"""adapter_mode shared against the emulated stack: `deploy A1 A2 A3 --base B --adapter-mode shared`,
one adapter torn down while the base and the others serve, `status`/`list` showing which serve, the
reaper at the TTL; and (torch tier) real PEFT adapters loaded into a running base as components."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from conftest import ROOT
from typer.testing import CliRunner

from modeldrop.cli import app
from modeldrop.contracts import clock
from modeldrop.local.samples.adapter import write_adapter
from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz

REGION = ["--stack", "modeldrop-local", "--region", "us-east-1"]
PROBE = json.dumps({"inputs": "Say hello.", "parameters": {"max_new_tokens": 8}}).encode()


def _cli(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_deploy_three_adapters_then_tear_one_down_while_the_others_serve(deployed: Any, tmp_path: Path) -> None:
    stack = deployed
    s3 = stack.client("s3")
    base = write_tar_gz(write_checkpoint(tmp_path / "base"), tmp_path / "base.tar.gz")
    s3.upload_file(str(base), stack.bucket, "direct/base/model.tar.gz")
    uris = []
    for i in (1, 2, 3):
        packed = write_tar_gz(write_adapter(tmp_path / f"sweep-{i}", seed=i), tmp_path / f"sweep-{i}.tar.gz")
        s3.upload_file(str(packed), stack.bucket, f"direct/sweep-{i}/adapter.tar.gz")
        uris.append(f"s3://{stack.bucket}/direct/sweep-{i}/adapter.tar.gz")
    base_uri = f"s3://{stack.bucket}/direct/base/model.tar.gz"
    started = _cli(
        "deploy", *uris, "--base", base_uri, "--adapter-mode", "shared", "--ttl", "4h", *REGION, "--wait", "--json"
    )
    assert started.exit_code == 0, started.output
    run = json.loads(started.output)
    assert run["status"] == "succeeded", run
    deployment_id, endpoint = run["deployment_id"], run["endpoint_name"]
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)

    def invoke(component: str) -> str:
        body = runtime.invoke_endpoint(EndpointName=endpoint, InferenceComponentName=component, Body=PROBE)["Body"]
        return str(json.loads(body.read())["generated_text"])

    base_answer = invoke(endpoint)
    answers = {i: invoke(f"{endpoint}-sweep-{i}") for i in (1, 2, 3)}
    assert len({base_answer, *answers.values()}) == 4  # every adapter answers its own way, none as the base
    with pytest.raises(ClientError, match="Inference Component Name header is required"):
        runtime.invoke_endpoint(EndpointName=endpoint, Body=PROBE)

    down = _cli("teardown", deployment_id, "--adapter", "sweep-2", *REGION, "--json")
    assert down.exit_code == 0, down.output
    assert json.loads(down.output) == {
        "deployment_id": deployment_id,
        "deleted": [f"inference-component/{endpoint}-sweep-2"],
        "serving": ["sweep-1", "sweep-3"],
    }
    again = _cli("teardown", deployment_id, "--adapter", "sweep-2", *REGION)
    assert again.exit_code == 2 and "no longer served" in again.output
    stack.client("sagemaker").list_inference_components()  # Deleting, then gone
    with pytest.raises(ClientError, match="not found"):
        invoke(f"{endpoint}-sweep-2")
    assert invoke(f"{endpoint}-sweep-1") == answers[1] and invoke(f"{endpoint}-sweep-3") == answers[3]
    assert invoke(endpoint) == base_answer

    status = json.loads(_cli("status", deployment_id, *REGION, "--json").output)
    serving = {c["adapter"]: c["serving"] for c in status["adapter_components"]}
    assert serving == {"sweep-1": True, "sweep-2": False, "sweep-3": True}
    [row] = json.loads(_cli("list", *REGION, "--json").output)
    assert row["adapter"] == "sweep-1, sweep-3 (2 of 3 adapter components)"
    # A component deleted outside modeldrop is not shown as serving.
    stack.client("sagemaker").delete_inference_component(InferenceComponentName=f"{endpoint}-sweep-3")
    status = json.loads(_cli("status", deployment_id, *REGION, "--json").output)
    gone = {c["adapter"]: c.get("gone") for c in status["adapter_components"] if not c["serving"]}
    assert gone == {"sweep-2": None, "sweep-3": "deleted outside modeldrop"}

    # Past its TTL the reaper takes it apart in SageMaker's order: adapters, their base, the endpoint.
    clock.advance(5 * 3600)
    assert stack.invoke_function("ReaperFunction", {})["expired"] == [endpoint]
    assert stack.leftover_resources() == []
    deleted = stack.registry().get(deployment_id).step_dict("expired")["deleted"]
    order = [f"{endpoint}-sweep-1", endpoint, None]
    assert [d.removeprefix("inference-component/") if d.startswith("inference-") else None for d in deleted[:3]] == (
        order
    )
    assert deleted[2] == f"endpoint/{endpoint}"


def _upload_adapter(stack: Any, tmp_path: Path, name: str, seed: int) -> str:
    packed = write_tar_gz(write_adapter(tmp_path / name, seed=seed), tmp_path / f"{name}.tar.gz")
    stack.client("s3").upload_file(str(packed), stack.bucket, f"direct/{name}/adapter.tar.gz")
    return f"s3://{stack.bucket}/direct/{name}/adapter.tar.gz"


def test_adapters_attached_to_another_deployments_endpoint_come_and_go_on_their_own(
    deployed: Any, tmp_path: Path
) -> None:
    stack = deployed
    base = write_tar_gz(write_checkpoint(tmp_path / "base"), tmp_path / "base.tar.gz")
    stack.client("s3").upload_file(str(base), stack.bucket, "direct/base/model.tar.gz")
    first = stack.start(
        {
            "artifact_uri": _upload_adapter(stack, tmp_path, "team-a", 1),
            "base": f"s3://{stack.bucket}/direct/base/model.tar.gz",
            "adapter_mode": "shared",
            "ttl_hours": 8,
        }
    )
    desc = stack.wait(first, timeout=180)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"))
    owner, endpoint = json.loads(desc["output"])["deployment_id"], json.loads(desc["output"])["endpoint_name"]

    # A second deployment adds its adapter to that endpoint, named by the endpoint: no endpoint of its own.
    second = stack.start(
        {"artifact_uri": _upload_adapter(stack, tmp_path, "team-b", 2), "base_endpoint": endpoint, "ttl_hours": 1}
    )
    desc = stack.wait(second, timeout=180)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"))
    attached_id = json.loads(desc["output"])["deployment_id"]
    assert json.loads(desc["output"])["endpoint_name"] == endpoint
    record = stack.registry().get(attached_id)
    create = record.step_dict("create_endpoint")
    assert create["attached_to"] == owner and create["components"]["base"] == endpoint
    [component] = [a["component"] for a in create["components"]["adapters"]]
    assert record.hourly_price is None  # the instance is the other deployment's bill
    assert stack.client("sagemaker").list_endpoints()["Endpoints"][0]["EndpointName"] == endpoint  # still one
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)

    def invoke(name: str) -> str:
        body = runtime.invoke_endpoint(EndpointName=endpoint, InferenceComponentName=name, Body=PROBE)["Body"]
        return str(json.loads(body.read())["generated_text"])

    assert invoke(component) != invoke(f"{endpoint}-team-a")
    passed = record.step_dict("smoke_eval")
    assert passed["passed"] and [c["component"] for c in passed["components"]] == [component]

    status = json.loads(_cli("status", owner, *REGION, "--json").output)
    assert status["attached_deployments"] == [{"deployment_id": attached_id, "adapters": ["team-b"]}]
    assert f"attached {attached_id}" in _cli("status", owner, *REGION).output

    # Extending the attached deployment moves its own component's expiry, never the base endpoint's.
    sm = stack.client("sagemaker")

    def expiry(arn: str) -> str:
        return next(t["Value"] for t in sm.list_tags(ResourceArn=arn)["Tags"] if t["Key"] == "modeldrop:expires-at")

    endpoint_arn = sm.describe_endpoint(EndpointName=endpoint)["EndpointArn"]
    component_arn = sm.describe_inference_component(InferenceComponentName=component)["InferenceComponentArn"]
    base_expiry, component_expiry = expiry(endpoint_arn), expiry(component_arn)
    extended = _cli("extend", attached_id, "--ttl", "2h", *REGION)
    assert extended.exit_code == 0, extended.output
    assert expiry(endpoint_arn) == base_expiry and expiry(component_arn) > component_expiry
    assert _cli("extend", attached_id, "--ttl", "1h", *REGION).exit_code == 0

    # An adapter wider than the rank the base was planned for is refused before any component exists.
    wide = write_tar_gz(write_adapter(tmp_path / "wide", seed=9, r=64), tmp_path / "wide.tar.gz")
    stack.client("s3").upload_file(str(wide), stack.bucket, "direct/wide/adapter.tar.gz")
    refused = stack.wait(
        stack.start({"artifact_uri": f"s3://{stack.bucket}/direct/wide/adapter.tar.gz", "base_endpoint": endpoint}),
        timeout=180,
    )
    assert refused["status"] == "FAILED" and "max_lora_rank" in refused["cause"], refused.get("cause")
    assert len(sm.list_inference_components(EndpointNameEquals=endpoint)["InferenceComponents"]) == 3

    # The base cannot go while another deployment's adapter is on it; that adapter's TTL ends it alone.
    blocked = _cli("teardown", owner, *REGION)
    assert blocked.exit_code == 2 and component in blocked.output, blocked.output
    still = stack.registry().get(owner)
    assert still.ended_at is None and still.status == "succeeded"  # a base that still serves stays live
    clock.advance(2 * 3600)
    reaped = stack.invoke_function("ReaperFunction", {})
    assert f"inference-component/{component}" in reaped["expired"] and endpoint not in reaped["expired"], reaped
    assert stack.registry().get(attached_id).status == "expired"
    assert invoke(endpoint)  # the base still serves
    with pytest.raises(ClientError, match="not found"):
        invoke(component)

    final = _cli("teardown", owner, *REGION)
    assert final.exit_code == 0, final.output
    assert stack.leftover_resources() == []


TORCH_PYTHON = os.environ.get("MODELDROP_TORCH_PYTHON")
MAKE_ADAPTER = """
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
torch.manual_seed(int(sys.argv[3]))
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
config = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
get_peft_model(model, config).save_pretrained(sys.argv[2])
"""


@pytest.mark.skipif(not TORCH_PYTHON, reason="set MODELDROP_TORCH_PYTHON to a Python with torch, transformers, peft")
def test_the_transformers_engine_loads_real_peft_adapters_as_components(make_stack: Any, tmp_path: Path) -> None:
    """Two real PEFT adapters of the fixture base, each loaded into the running base by its adapter
    component: each component's greedy answer differs from the base's and from the other's."""
    assert TORCH_PYTHON is not None
    base = ROOT / "tests" / "fixtures" / "gemma4-text-kvshared-base"
    stack = make_stack({"MaxEvalTolerance": "10"}, engine="transformers")
    s3 = stack.client("s3")
    s3.upload_file(str(write_tar_gz(base, tmp_path / "base.tar.gz")), stack.bucket, "direct/base/model.tar.gz")
    uris = []
    for seed in (1, 2):
        adapter = tmp_path / f"peft-{seed}"
        subprocess.run([TORCH_PYTHON, "-c", MAKE_ADAPTER, str(base), str(adapter), str(seed)], check=True, timeout=600)
        packed = write_tar_gz(adapter, tmp_path / f"peft-{seed}.tar.gz")
        s3.upload_file(str(packed), stack.bucket, f"direct/peft-{seed}/adapter.tar.gz")
        uris.append(f"s3://{stack.bucket}/direct/peft-{seed}/adapter.tar.gz")
    arn = stack.start(
        {
            "artifact_uri": uris[0],
            "adapters": uris[1:],
            "base": f"s3://{stack.bucket}/direct/base/model.tar.gz",
            "adapter_mode": "shared",
            "eval_thresholds": {"max_truncated": 10},  # random weights never say EOS
        }
    )
    desc = stack.wait(arn, timeout=900)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"))
    endpoint = json.loads(desc["output"])["endpoint_name"]
    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)
    ask = json.dumps({"inputs": "Say something.", "parameters": {"max_new_tokens": 12}}).encode()

    def answer(component: str) -> str:
        body = runtime.invoke_endpoint(EndpointName=endpoint, InferenceComponentName=component, Body=ask)["Body"]
        return str(json.loads(body.read())["generated_text"])

    through = [answer(f"{endpoint}-peft-{seed}") for seed in (1, 2)]
    assert len({answer(endpoint), *through}) == 3


def test_a_base_past_its_ttl_is_kept_for_attached_adapters_then_goes_with_them(deployed: Any, tmp_path: Path) -> None:
    """Its own TTL passed while another deployment's adapter is on it: the reaper keeps the base (not
    counted overdue), and deletes it in the run that removes the last attachment."""
    stack = deployed
    base = write_tar_gz(write_checkpoint(tmp_path / "base"), tmp_path / "base.tar.gz")
    stack.client("s3").upload_file(str(base), stack.bucket, "direct/kept/model.tar.gz")
    first = stack.wait(
        stack.start(
            {
                "artifact_uri": _upload_adapter(stack, tmp_path, "own", 1),
                "base": f"s3://{stack.bucket}/direct/kept/model.tar.gz",
                "adapter_mode": "shared",
                "ttl_hours": 1,
            }
        ),
        timeout=180,
    )
    assert first["status"] == "SUCCEEDED", first.get("cause")
    owner, endpoint = json.loads(first["output"])["deployment_id"], json.loads(first["output"])["endpoint_name"]
    second = stack.wait(
        stack.start(
            {"artifact_uri": _upload_adapter(stack, tmp_path, "guest", 2), "base_endpoint": endpoint, "ttl_hours": 4}
        ),
        timeout=180,
    )
    assert second["status"] == "SUCCEEDED", second.get("cause")
    clock.advance(2 * 3600)  # the base's TTL and two reaper periods have passed
    run = stack.invoke_function("ReaperFunction", {})
    assert endpoint not in run["expired"] and endpoint not in run["overdue"], run
    assert any(k.startswith(f"{endpoint}:") for k in run["kept"]), run
    assert stack.registry().get(owner).ended_at is None  # still serving its guest
    clock.advance(3 * 3600)  # the guest's TTL: it goes, and the base with it in the same run
    run = stack.invoke_function("ReaperFunction", {})
    assert endpoint in run["expired"], run
    stack.settle()
    assert stack.registry().get(owner).status == "expired" and stack.leftover_resources() == []
