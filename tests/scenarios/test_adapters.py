"""A LoRA adapter deployed on its base (dedicated mode): validated against the base before anything
is created, written beside the base's served copy, served under its own name, evaluated through it."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

from modeldrop.local.samples.adapter import adapter_config, adapter_tensors, write_adapter
from modeldrop.local.samples.checkpoint import TINY_CONFIG, write_checkpoint, write_tar_gz
from modeldrop.local.scenarios.run import run_local


def test_run_local_adapter_on_vllm_is_served_as_an_adapter_component_and_answers() -> None:
    """vLLM's /invocations takes the adapter only from X-Amzn-SageMaker-Adapter-Identifier, which SageMaker
    sets for adapter inference components alone: a vLLM adapter with no adapter_mode is served as one."""
    result = run_local(adapter=True)
    assert result.status == "succeeded", (result.error, result.cause)
    assert result.leftover_resources == []
    record = result.record
    assert record is not None
    adapter = record.step_dict("validate")["adapter"]
    assert (adapter["name"], adapter["max_rank"], adapter["modules"]) == ("lora-sample", 8, 12)
    env = record.step_dict("build_env")["env"]
    assert env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "true" and "SM_VLLM_LORA_MODULES" not in env
    assert result.eval is not None and result.eval["passed"] and result.eval["cases"] == 3


def test_a_dedicated_adapter_on_vllm_is_refused_before_anything_is_created(stack: Any, tmp_path: Path) -> None:
    desc = _start(stack, tmp_path, write_adapter(tmp_path / "lora-x"), adapter_mode="dedicated", engine="vllm")
    assert desc["status"] == "FAILED" and desc["error"] == "RequestInvalid", desc
    assert "answered by the base" in desc["cause"] and "X-Amzn-SageMaker-Adapter-Identifier" in desc["cause"]
    assert stack.leftover_resources() == []


def test_an_lmi_deployment_finds_the_adapter_in_its_folder_and_names_it_in_adapters() -> None:
    """LMI discovers /opt/ml/model/adapters/<name> itself and takes the name in the body's `adapters`
    list: the eval passes only if the answers went through the adapter (they differ from the base's)."""
    result = run_local(adapter=True, deploy_engine="lmi")
    assert result.status == "succeeded", (result.error, result.cause)
    assert result.leftover_resources == []
    assert result.record is not None
    env = result.record.step_dict("build_env")["env"]
    assert (env["OPTION_ENABLE_LORA"], env["OPTION_MAX_LORA_RANK"]) == ("true", "8")
    assert not any("LORA_MODULES" in key for key in env)


def _start(stack: Any, tmp_path: Path, adapter: Path, **request: Any) -> dict[str, Any]:
    s3 = stack.client("s3")
    base = write_tar_gz(write_checkpoint(tmp_path / "base"), tmp_path / "base.tar.gz")
    s3.upload_file(str(base), stack.bucket, "direct/base/model.tar.gz")
    packed = write_tar_gz(adapter, tmp_path / "adapter.tar.gz")
    s3.upload_file(str(packed), stack.bucket, "direct/runs/lora-x/adapter.tar.gz")
    arn = stack.start(
        {
            "artifact_uri": f"s3://{stack.bucket}/direct/runs/lora-x/adapter.tar.gz",
            "base": f"s3://{stack.bucket}/direct/base/model.tar.gz",
            **request,
        }
    )
    desc: dict[str, Any] = stack.wait(arn, timeout=120)
    stack.settle()
    return desc


def test_an_adapter_of_another_base_is_refused_before_any_endpoint(stack: Any, tmp_path: Path) -> None:
    bad = write_adapter(
        tmp_path / "lora-x",
        config=adapter_config(8, target_modules=["q_proj", "query_key_value"]),
        tensors=adapter_tensors(TINY_CONFIG, 8),
    )
    desc = _start(stack, tmp_path, bad)
    assert desc["status"] == "FAILED" and desc["error"] == "CheckpointRefused", desc
    assert "ADAPTER_TARGET_MISSING" in desc["cause"] and "adapter-validation" in desc["cause"]
    assert "CreateEndpointFunction" not in [i.function for i in stack.invocations]
    assert stack.leftover_resources() == []


TORCH_PYTHON = os.environ.get("MODELDROP_TORCH_PYTHON")
MAKE_ADAPTER = """
import sys, torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
torch.manual_seed(0)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
# init_lora_weights=False: B is random too, so the adapter really moves the output (PEFT's default B is 0).
config = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
get_peft_model(model, config).save_pretrained(sys.argv[2])
"""


@pytest.mark.skipif(not TORCH_PYTHON, reason="set MODELDROP_TORCH_PYTHON to a Python with torch, transformers, peft")
def test_the_transformers_engine_applies_a_real_peft_adapter(make_stack: Any, tmp_path: Path) -> None:
    """A real PEFT adapter of the fixture base, deployed on it: the greedy answer through the adapter's
    name differs from the base's, through the deployed endpoint."""
    assert TORCH_PYTHON is not None
    base = ROOT / "tests" / "fixtures" / "gemma4-text-kvshared-base"
    adapter = tmp_path / "peft-lora"
    subprocess.run([TORCH_PYTHON, "-c", MAKE_ADAPTER, str(base), str(adapter)], check=True, timeout=600)
    stack = make_stack({"MaxEvalTolerance": "10"}, engine="transformers")
    s3 = stack.client("s3")
    s3.upload_file(str(write_tar_gz(base, tmp_path / "base.tar.gz")), stack.bucket, "direct/base/model.tar.gz")
    s3.upload_file(str(write_tar_gz(adapter, tmp_path / "a.tar.gz")), stack.bucket, "direct/peft-lora/adapter.tar.gz")
    arn = stack.start(
        {
            "artifact_uri": f"s3://{stack.bucket}/direct/peft-lora/adapter.tar.gz",
            "base": f"s3://{stack.bucket}/direct/base/model.tar.gz",
            "eval_thresholds": {"max_truncated": 10},  # random weights never say EOS
        }
    )
    desc = stack.wait(arn, timeout=900)
    assert desc["status"] == "SUCCEEDED", (desc.get("error"), desc.get("cause"))
    endpoint = json.loads(desc["output"])["endpoint_name"]
    import boto3

    runtime = boto3.client("sagemaker-runtime", region_name="us-east-1", endpoint_url=stack.runtime.url)
    ask = {"messages": [{"role": "user", "content": "Say something."}], "max_tokens": 12, "temperature": 0}

    def answer(**extra: Any) -> str:
        raw = runtime.invoke_endpoint(EndpointName=endpoint, Body=json.dumps({**ask, **extra}))["Body"].read()
        return str(json.loads(raw)["choices"][0]["message"]["content"])

    through_adapter, through_base = answer(model="peft-lora"), answer()
    assert through_adapter != through_base
    assert answer(model="peft-lora") == through_adapter  # greedy: the same answer again
