"""The hosting emulator's container contract: env translation, a real process per endpoint, cleanup."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from modeldrop.local.engines.launch import EngineUnavailable, check_available, entrypoint_args


def test_dlc_entrypoint_translation() -> None:
    env = {
        "SM_VLLM_MODEL": "/opt/ml/model",
        "SM_VLLM_MAX_MODEL_LEN": "4096",
        "SM_VLLM_ENABLE_PREFIX_CACHING": "",
        "SM_VLLM_LIMIT_MM_PER_PROMPT": '{"image":2}',
        "HF_TOKEN": "never-a-flag",
    }
    assert entrypoint_args("SM_VLLM_", env, Path("/tmp/m")) == [
        "--enable-prefix-caching",
        "--limit-mm-per-prompt",
        '{"image":2}',
        "--max-model-len",
        "4096",
        "--model",
        "/tmp/m",
    ]
    assert entrypoint_args("SM_SGLANG_", {"SM_SGLANG_TP_SIZE": "2"}, Path("/m")) == ["--tp-size", "2"]


def test_engines_that_are_not_here_are_refused_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    check_available("reference")
    with pytest.raises(EngineUnavailable, match=r"sglang (is not installed|needs a CUDA GPU)"):
        check_available("sglang")
    monkeypatch.setenv("MODELDROP_VLLM_PYTHON", sys.executable)  # a Python without vllm
    with pytest.raises(EngineUnavailable, match="cannot import vllm; `make vllm-venv`"):
        check_available("vllm")
    with pytest.raises(EngineUnavailable, match="unknown local engine"):
        check_available("tgi")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_endpoint_is_a_process_with_a_read_only_model_dir_and_its_env(stack: Any, archive: bytes) -> None:
    from conftest import create_endpoint

    from modeldrop.aws.sagemaker.sagemaker_resources import delete_all

    create_endpoint(
        stack, "modeldrop-proc", archive, env={"SM_VLLM_MAX_MODEL_LEN": "1024", "SM_VLLM_SERVED_MODEL_NAME": "tiny"}
    )
    sm = stack.client("sagemaker")
    hosted = stack.hosting.endpoints["modeldrop-proc"]
    assert sm.describe_endpoint(EndpointName="modeldrop-proc")["EndpointStatus"] in ("Creating", "InService")
    while sm.describe_endpoint(EndpointName="modeldrop-proc")["EndpointStatus"] == "Creating":
        pass
    assert sm.describe_endpoint(EndpointName="modeldrop-proc")["EndpointStatus"] == "InService"
    model_dir = hosted.model_dir
    assert (model_dir / "config.json").is_file()
    assert oct((model_dir / "config.json").stat().st_mode & 0o222) == "0o0"
    environ = Path(f"/proc/{hosted.process.pid}/environ").read_bytes()
    assert environ.count(b"SM_VLLM_MAX_MODEL_LEN=1024") == 1 and b"AWS_SECRET_ACCESS_KEY" not in environ
    # The container's stdout reaches its log stream through a pump thread, flushed on each DescribeEndpoint:
    # on a busy machine the line may come a little after InService, so look again (while the process lives).
    wanted = "Maximum model length: 1024; served model name: tiny"
    for _ in range(600):
        sm.describe_endpoint(EndpointName="modeldrop-proc")
        logs = stack.client("logs").get_log_events(logGroupName=hosted.log_group, logStreamName=hosted.log_stream)
        if any(wanted in e["message"] for e in logs["events"]) or hosted.process.poll() is not None:
            break
        time.sleep(0.05)
    assert any(wanted in e["message"] for e in logs["events"])
    pid = hosted.process.pid
    deleted, _gone, failed, _not_ours = delete_all(sm, "modeldrop-proc", "modeldrop-proc", "modeldrop-proc")
    assert failed == [] and len(deleted) == 3
    assert not _pid_alive(pid) and not model_dir.exists()
    assert stack.hosting.running() == []


@pytest.mark.skipif(
    not os.environ.get("MODELDROP_TORCH_PYTHON"), reason="set MODELDROP_TORCH_PYTHON to a Python with torch"
)
def test_transformers_engine_generates_from_the_checkpoints_own_weights() -> None:
    import json
    import subprocess
    import sys

    from conftest import ROOT

    fixture = ROOT / "tests" / "fixtures" / "gemma4-text-kvshared-base"
    result = subprocess.run(
        [sys.executable, "-m", "modeldrop", "run-local", str(fixture), "--engine", "transformers", "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=600,
    )
    data = json.loads(result.stdout)
    # Random weights never say EOS: every answer runs to max_tokens, and the eval says so.
    assert data["error"] == "EvalFailed" and data["leftover_resources"] == []
    cases = data["eval_report"]["cases"]
    assert all(c["outcome"] == "truncated" and c["completion_tokens"] == c["max_tokens"] for c in cases)


def test_a_refused_endpoint_delete_leaves_its_config_and_model(stack: Any, archive: bytes, monkeypatch: Any) -> None:
    """Deleting the config and model of a live endpoint would strand it billing: leave them for the retry."""
    from conftest import create_endpoint
    from moto.sagemaker import models as sm_models
    from moto.sagemaker.exceptions import ValidationError

    from modeldrop.aws.sagemaker.sagemaker_resources import delete_all

    create_endpoint(stack, "modeldrop-stuck", archive, env={})

    def refuse(self: Any, endpoint_name: str) -> None:
        raise ValidationError(message="Cannot update in-progress endpoint")

    monkeypatch.setattr(sm_models.SageMakerModelBackend, "delete_endpoint", refuse)
    deleted, _gone, failed, _not_ours = delete_all(
        stack.client("sagemaker"), "modeldrop-stuck", "modeldrop-stuck", "modeldrop-stuck"
    )
    assert deleted == [] and len(failed) == 1
    left = set(stack.leftover_resources())
    assert {"endpoint/modeldrop-stuck", "endpoint-config/modeldrop-stuck", "model/modeldrop-stuck"} <= left


def test_an_endpoint_name_deleted_in_one_emulated_account_is_not_deleted_in_the_next(archive: bytes) -> None:
    """The emulator shows a deleted endpoint Deleting until it is described once more; that state is the
    account's own. A name left Deleting in one run must not make the next run's endpoint of that name
    vanish (two tests in one process each create `modeldrop-ch-main`)."""
    from conftest import ROOT, create_endpoint
    from moto import mock_aws

    from modeldrop.local.emulator.sagemaker.hosting import LocalHosting
    from modeldrop.local.stack.build import build_stack

    for run in (1, 2):
        with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
            stack = build_stack(ROOT, None, hosting=LocalHosting())
            try:
                create_endpoint(stack, "modeldrop-reused", archive)
                sm = stack.client("sagemaker")
                for _ in range(3):
                    assert sm.describe_endpoint(EndpointName="modeldrop-reused")["EndpointName"] == "modeldrop-reused"
                if run == 1:
                    sm.delete_endpoint(EndpointName="modeldrop-reused")  # left Deleting: never described again
            finally:
                stack.close()
