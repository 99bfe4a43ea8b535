"""`modeldrop plan`, KV arithmetic, the quota pre-check and secrets by reference (moto for AWS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3
import pytest
from conftest import ROOT, create_endpoint

from modeldrop.aws.sagemaker.endpoint_quota import check_endpoint_quota
from modeldrop.aws.secret_refs import check_refs, resolve
from modeldrop.contracts.errors import QuotaExceeded, RequestInvalid
from modeldrop.contracts.models import ValidationSummary
from modeldrop.serving.memory_plan import ModelShape, kv_bytes_per_token, plan_memory
from modeldrop.serving.plan import plan_report, plan_serving

E4B_MM = ModelShape(weights_gib=15.18)


def _summary(weights_gib: float, **extra: Any) -> ValidationSummary:
    base: dict[str, Any] = {
        "deployable": True,
        "format": "directory",
        "architecture": "Gemma4ForConditionalGeneration",
        "model_type": "gemma4",
        "tensor_count": 719,
        "shard_count": 4,
        "total_bytes": int(weights_gib * 1024**3),
        "weights_gib": weights_gib,
        "parameters": 8_000_000_000,
        "vocab_size": 262_144,
        "num_hidden_layers": 42,
        "max_position_embeddings": 131_072,
        "has_chat_template": True,
        "findings": [],
    }
    return ValidationSummary.model_validate({**base, **extra})


def test_kv_cache_counts_only_layers_that_own_kv_and_caps_sliding_layers() -> None:
    types = ["sliding_attention"] * 4 + ["full_attention"]
    shape = ModelShape(
        weights_gib=14.0,
        num_hidden_layers=10,
        num_kv_shared_layers=5,
        num_key_value_heads=2,
        head_dim=256,
        layer_types=types * 2,
        sliding_window=512,
    )
    full, sliding = kv_bytes_per_token(shape)
    per_layer = 2 * 2 * 256 * 2
    # Layers 0-4 own KV (4 sliding + 1 full); 5-9 reuse it.
    assert (full, sliding) == (per_layer, 4 * per_layer)
    plan = plan_memory(shape, "ml.g6.2xlarge", 32, 8192)
    expected = (per_layer * 8192 + 4 * per_layer * 512) / 1024**3
    assert plan.kv_min_gib == pytest.approx(max(0.5, expected), abs=1e-3)
    unshared = plan_memory(shape.model_copy(update={"num_kv_shared_layers": 0}), "ml.g6.2xlarge", 32, 131072)
    assert unshared.kv_min_gib > plan_memory(shape, "ml.g6.2xlarge", 32, 131072).kv_min_gib


def test_oom_plan_refused_with_numbers_and_three_ways_out_unless_forced() -> None:
    refused = plan_report(_summary(15.18), "s3://b/k/", "vllm", "us-east-1", "ml.g6.2xlarge", {}, max_num_seqs=256)
    assert not refused.deployable and refused.refused is not None
    assert refused.refused["error"] == "PlanRefused" and "budget 19.76 GiB, weights 15.18" in refused.refused["message"]
    hint = refused.refused["hint"]
    assert "max_num_seqs=128 fits on ml.g6.2xlarge" in hint and "ml.g6e.xlarge fits max_num_seqs=256 ($2.33/h" in hint
    # A long context whose KV cannot fit: a shorter max_model_len is one way out.
    long_ctx = _summary(8.0, num_key_value_heads=8, head_dim=256, layer_types=["full_attention"] * 42)
    refused_ctx = plan_report(long_ctx, "x", "vllm", "us-east-1", "ml.g6.2xlarge", {}, max_model_len=131072)
    assert refused_ctx.refused is not None and "max_model_len=" in refused_ctx.refused["hint"]
    assert refused.memory["verdict"] == "oom" and refused.env["SM_VLLM_MAX_NUM_SEQS"] == "256"
    forced = plan_report(
        _summary(15.18), "s3://b/k/", "vllm", "us-east-1", "ml.g6.2xlarge", {}, max_num_seqs=256, force=True
    )
    assert forced.deployable and any("deploying anyway" in f.message for f in forced.findings)
    plan = plan_serving("vllm", E4B_MM, "ml.g6.2xlarge", "us-east-1", max_num_seqs=256, force=True)
    assert plan.memory["verdict"] == "oom" and plan.warnings


def test_plan_report_refuses_bad_images_and_passthrough() -> None:
    lmi26 = {"LMI_IMAGE_URI": "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.36.0-lmi26.0.0-cu128"}
    report = plan_report(_summary(2.0), "x", "lmi", "us-east-1", "ml.g6.2xlarge", lmi26)
    assert report.refused is not None and report.refused["error"] == "ImageUnresolvable"
    raw = plan_report(
        _summary(2.0), "x", "lmi", "us-east-1", "ml.g6.2xlarge", {}, passthrough={"SM_VLLM_ENFORCE_EAGER": ""}
    )
    assert raw.refused is not None and "belongs to vllm" in raw.refused["message"]
    ok = plan_report(
        _summary(2.0), "x", "lmi", "us-east-1", "ml.g6.2xlarge", {}, passthrough={"OPTION_ENFORCE_EAGER": "true"}
    )
    assert ok.deployable and ok.env["OPTION_ENFORCE_EAGER"] == "true" and ok.env["OPTION_ROLLING_BATCH"] == "vllm"


def _plan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "modeldrop", "plan", *args], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


def test_plan_command(checkpoint: Path) -> None:
    # SGLang's DLC runs on H100/Blackwell only: an ml.p5 type.
    result = _plan_cli(
        str(checkpoint), "--engine", "sglang", "--instance-type", "ml.p5.48xlarge", "--region", "eu-west-1", "--json"
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["image"].startswith("763104351884.dkr.ecr.eu-west-1.amazonaws.com/sglang:")
    assert data["env"]["SM_SGLANG_MAX_RUNNING_REQUESTS"] == "32"
    assert data["env"]["SM_SGLANG_MEM_FRACTION_STATIC"] == "0.90"
    for key in ("budget_gib", "weights_gib", "kv_cache_gib", "sampler_gib", "overhead_gib", "headroom_gib", "verdict"):
        assert key in data["memory"]
    assert data["timeouts"]["container_startup_health_check_seconds"] == 600
    too_long = _plan_cli(str(checkpoint), "--region", "us-east-1", "--max-model-len", "999999", "--json")
    assert too_long.returncode == 1 and "max_position_embeddings" in json.loads(too_long.stdout)["refused"]["message"]
    human = _plan_cli(str(checkpoint), "--region", "us-east-1", "--env", "SM_VLLM_ENFORCE_EAGER=")
    assert human.returncode == 0 and "SM_VLLM_ENFORCE_EAGER=" in human.stdout and "PLAN OK" in human.stdout
    bad = _plan_cli(str(checkpoint), "--region", "us-east-1", "--env", "nonsense")
    assert bad.returncode == 2 and "KEY=VALUE" in bad.stderr
    missing = _plan_cli("/no/such/dir", "--region", "us-east-1")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr


def test_secret_references_are_checked_and_resolved_without_leaking(stack: Any) -> None:
    sm = boto3.client("secretsmanager", region_name="us-east-1")
    ssm = boto3.client("ssm", region_name="us-east-1")
    sm.create_secret(Name="modeldrop/hf", SecretString=json.dumps({"token": "hf_secret_value"}))
    ssm.put_parameter(Name="/modeldrop/wandb", Value="wandb_value", Type="SecureString")
    refs = check_refs(
        {"HF_TOKEN": "secretsmanager:modeldrop/hf#token", "WANDB_API_KEY": "ssm:/modeldrop/wandb"}, "modeldrop/", set()
    )
    assert resolve(sm, ssm, refs) == {"HF_TOKEN": "hf_secret_value", "WANDB_API_KEY": "wandb_value"}
    with pytest.raises(RequestInvalid, match="outside this stack's secrets prefix"):
        check_refs({"HF_TOKEN": "secretsmanager:team/other"}, "modeldrop/", set())
    with pytest.raises(RequestInvalid, match="is not a reference"):
        check_refs({"HF_TOKEN": "hf_plaintext_token"}, "modeldrop/", set())
    with pytest.raises(RequestInvalid, match="overwrite an engine setting"):
        check_refs({"SM_VLLM_MODEL": "ssm:/modeldrop/wandb"}, "modeldrop/", {"SM_VLLM_MODEL"})
    with pytest.raises(RequestInvalid) as missing:
        resolve(sm, ssm, check_refs({"HF_TOKEN": "secretsmanager:modeldrop/nope"}, "modeldrop/", set()))
    assert "ResourceNotFoundException" in missing.value.message
    with pytest.raises(RequestInvalid) as nokey:
        resolve(sm, ssm, check_refs({"HF_TOKEN": "secretsmanager:modeldrop/hf#other"}, "modeldrop/", set()))
    assert "hf_secret_value" not in str(nokey.value)


def test_quota_precheck_counts_creating_endpoints(make_stack: Any, archive: bytes) -> None:
    from modeldrop.local.emulator import service_quotas

    stack = make_stack(real_startup_grace=0.5)
    service_quotas.set_endpoint_quotas({"ml.g6.2xlarge": 1, "ml.g5.xlarge": 0})
    sm = stack.client("sagemaker")
    quotas = stack.client("service-quotas")
    seen = check_endpoint_quota(quotas, sm, "ml.g6.2xlarge")
    assert (seen.quota, seen.in_use, seen.quota_code) == (1.0, 0, service_quotas.local_quota_code("ml.g6.2xlarge"))
    assert check_endpoint_quota(quotas, sm, "ml.p5.48xlarge").note == "quota not listed by Service Quotas"
    with pytest.raises(QuotaExceeded) as zero:
        check_endpoint_quota(quotas, sm, "ml.g5.xlarge")
    assert "request-service-quota-increase --service-code sagemaker --quota-code L-" in zero.value.hint
    stack.hosting.plan("slow-start")  # stays Creating: it still counts
    create_endpoint(stack, "other-team-endpoint", archive, managed_by="someone-else")
    with pytest.raises(QuotaExceeded) as full:
        check_endpoint_quota(quotas, sm, "ml.g6.2xlarge")
    assert "is 1; 1 in use (other-team-endpoint (1)); this deployment needs 1 more" in full.value.message
