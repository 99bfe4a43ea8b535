"""adapter_mode shared: one base endpoint, each adapter its own adapter inference component, each
evaluated through its own name; one adapter torn down while the others serve; a refused adapter
component takes the whole deployment down in SageMaker's order."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError
from conftest import ROOT
from typer.testing import CliRunner

from modeldrop.cli import app
from modeldrop.local.run import run_local
from modeldrop.local.sample_adapter import write_adapter
from modeldrop.local.sample_checkpoint import write_checkpoint, write_tar_gz

COMMAND = [sys.executable, "-m", "modeldrop"]
REGION = ["--stack", "modeldrop-local", "--region", "us-east-1"]
PROBE = json.dumps({"inputs": "Say hello.", "parameters": {"max_new_tokens": 8}}).encode()


def test_run_local_serves_three_adapters_as_components_of_one_endpoint() -> None:
    """The issue's command, as a user runs it."""
    done = subprocess.run(
        [*COMMAND, "run-local", "--adapter", "--adapter-mode", "shared", "--adapters", "3", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["status"] == "succeeded" and result["leftover_resources"] == []
    assert result["invocations"]["CreateEndpointFunction"] == 1  # one endpoint for the three
    record = result["record"]
    plan = record["steps"]["create_endpoint"]["components"]
    endpoint = record["endpoint_name"]
    assert plan["base"] == endpoint and plan["model_name"] == endpoint
    assert [a["adapter"] for a in plan["adapters"]] == ["lora-sample-1", "lora-sample-2", "lora-sample-3"]
    names = [a["component"] for a in plan["adapters"]]
    # The base endpoint sizes its LoRA slots for all three (ranks 8, 16 and 24 -> slots of 32).
    env = record["steps"]["build_env"]["env"]
    assert (env["OPTION_ENABLE_LORA"], env["OPTION_MAX_LORAS"], env["OPTION_MAX_LORA_RANK"]) == ("true", "3", "32")
    # Each adapter evaluated through its own component, and each passed.
    evals = result["eval"]["components"]
    assert [e["component"] for e in evals] == names and all(e["passed"] and e["cases"] == 3 for e in evals)
    shared = result["components"]
    assert sorted(c["name"] for c in shared["components"]) == sorted([endpoint, *names])
    assert all(c["status"] == "InService" for c in shared["components"])
    # One adapter torn down: the other two and the base go on serving, the removed one is refused.
    assert shared["torn_down"] == {"adapter": "lora-sample-1", "deleted": [f"inference-component/{names[0]}"]}
    assert sorted(c["name"] for c in shared["components_after"]) == sorted([endpoint, *names[1:]])
    answers = shared["invoked_after"]
    assert answers[names[0]].startswith("refused: ValidationError")
    assert answers[names[1]].startswith("answered") and answers[names[2]].startswith("answered")
    assert answers[names[1]] != answers[names[2]]  # each through its own adapter
    # Torn down at the end: adapters, then the base, then the endpoint.
    order = [d for d in result["deleted_at_exit"] if d.startswith(("inference-component/", "endpoint/"))]
    components = [f"inference-component/{n}" for n in names[1:]]
    assert order == [*components, f"inference-component/{endpoint}", f"endpoint/{endpoint}"]


def test_a_refused_adapter_component_takes_the_deployment_down_in_order() -> None:
    result = run_local(fault="adapter-load")
    assert result.status == "failed" and result.error == "EndpointFailed", (result.error, result.cause)
    assert "lora-sample-2 Failed" in str(result.cause) and "max_lora_rank" in str(result.cause)
    assert result.leftover_resources == []
    assert result.record is not None
    deleted = result.record.step_dict("teardown")["deleted"]
    kinds = [d.split("/", 1)[0] for d in deleted if not d.startswith("s3://")]
    assert kinds == ["inference-component"] * 3 + ["endpoint", "endpoint-config", "model"]
    assert deleted[2] == f"inference-component/{result.record.endpoint_name}"  # the base after its adapters


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
    started = _cli("deploy", *uris, "--base", base_uri, "--adapter-mode", "shared", *REGION, "--wait", "--json")
    assert started.exit_code == 0, started.output
    run = json.loads(started.output)
    assert run["status"] == "SUCCEEDED", run
    deployment_id, endpoint = run["output"]["deployment_id"], run["output"]["endpoint_name"]
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

    assert _cli("teardown", deployment_id, *REGION).exit_code == 0
    assert stack.leftover_resources() == []


def test_the_reaper_takes_an_expired_shared_deployment_apart_in_order(stack: Any, tmp_path: Path) -> None:
    from modeldrop.contracts import clock

    s3 = stack.client("s3")
    s3.upload_file(
        str(write_tar_gz(write_checkpoint(tmp_path / "base"), tmp_path / "base.tar.gz")),
        stack.bucket,
        "direct/base/model.tar.gz",
    )
    uris = []
    for i in (1, 2):
        packed = write_tar_gz(write_adapter(tmp_path / f"ttl-{i}", seed=i), tmp_path / f"ttl-{i}.tar.gz")
        s3.upload_file(str(packed), stack.bucket, f"direct/ttl-{i}/adapter.tar.gz")
        uris.append(f"s3://{stack.bucket}/direct/ttl-{i}/adapter.tar.gz")
    arn = stack.start(
        {
            "artifact_uri": uris[0],
            "adapters": uris[1:],
            "base": f"s3://{stack.bucket}/direct/base/model.tar.gz",
            "adapter_mode": "shared",
            "ttl_hours": 1,
        }
    )
    desc = stack.wait(arn, timeout=180)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"))
    endpoint = json.loads(desc["output"])["endpoint_name"]
    clock.advance(2 * 3600)
    result = stack.invoke_function("ReaperFunction", {})
    assert result["expired"] == [endpoint], result
    assert stack.leftover_resources() == []
    record = stack.registry().get(json.loads(desc["output"])["deployment_id"])
    deleted = record.step_dict("expired")["deleted"]
    order = [f"{endpoint}-ttl-1", f"{endpoint}-ttl-2", endpoint]  # the adapters, then their base
    assert deleted[:3] == [f"inference-component/{name}" for name in order]


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
