"""Image resolution, the engine-env matrix and the GPU memory plan (calibrated on the source lab's measurements)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from modeldrop.contracts.errors import ImageUnresolvable, PlanRefused
from modeldrop.contracts.models import EngineSettings
from modeldrop.contracts.step_payloads import EnginePlan
from modeldrop.serving.engine_env import KEYS, MEANINGS, UNSUPPORTED, build_env
from modeldrop.serving.image import resolve_image
from modeldrop.serving.memory_plan import ModelShape, plan_memory
from modeldrop.serving.plan import plan_serving


def test_image_precedence_and_region() -> None:
    assert (
        resolve_image("vllm", "eu-west-1", {}).image_uri
        == "763104351884.dkr.ecr.eu-west-1.amazonaws.com/vllm:0.31.0-gpu-py312-cu130-ubuntu22.04-sagemaker-v1.0"
    )
    assert "ubuntu24.04" in resolve_image("sglang", "us-west-2", {}).image_uri
    v = resolve_image("vllm", "us-east-1", {"VLLM_DLC_VERSION": "0.27.0"})
    assert v.source == "VLLM_DLC_VERSION" and ":0.27.0-gpu" in v.image_uri
    full = "763104351884.dkr.ecr.us-east-1.amazonaws.com/vllm:custom"
    assert resolve_image("vllm", "us-east-1", {"VLLM_IMAGE_URI": full, "VLLM_DLC_VERSION": "1"}).image_uri == full
    assert resolve_image("vllm", "ap-east-1", {}).image_uri.startswith("871362719292.")
    with pytest.raises(ImageUnresolvable, match="is in us-east-1 but the endpoint is in eu-west-1"):
        resolve_image("vllm", "eu-west-1", {"VLLM_IMAGE_URI": full})


def test_lmi26_refused_for_gemma4_and_one_axis_version_refused() -> None:
    old = "763104351884.dkr.ecr.us-east-1.amazonaws.com/djl-inference:0.36.0-lmi26.0.0-cu128"
    with pytest.raises(ImageUnresolvable, match="Gemma-4"):
        resolve_image("lmi", "us-east-1", {"LMI_IMAGE_URI": old}, model_type="gemma4")
    assert resolve_image("lmi", "us-east-1", {"LMI_IMAGE_URI": old}, model_type="llama").image_uri == old
    with pytest.raises(ImageUnresolvable, match="both axes"):
        resolve_image("lmi", "us-east-1", {"LMI_VERSION": "0.36.0"})
    assert "lmi27" in resolve_image("lmi", "us-east-1", {}, model_type="gemma4").image_uri


def test_byoc_is_accepted_with_warning() -> None:
    choice = resolve_image(
        "vllm", "us-east-1", {"VLLM_IMAGE_URI": "111122223333.dkr.ecr.us-east-1.amazonaws.com/my-vllm:1"}
    )
    assert choice.warnings and "SageMaker contract" in choice.warnings[0]


@pytest.mark.parametrize("engine", ["vllm", "sglang", "lmi"])
def test_every_meaning_is_mapped_or_explicitly_unsupported(engine: str) -> None:
    for meaning in MEANINGS:
        mapped, unsupported = meaning in KEYS[engine], meaning in UNSUPPORTED[engine]
        assert mapped != unsupported, f"{meaning} on {engine}: mapped={mapped} unsupported={unsupported}"
        if unsupported:
            assert len(UNSUPPORTED[engine][meaning]) > 20
            with pytest.raises(PlanRefused, match="not supported"):
                build_env(engine, {meaning: 1})  # type: ignore[arg-type]


def test_concurrency_and_memory_keys_per_engine() -> None:
    settings = {
        "max_num_seqs": 32,
        "gpu_memory_utilization": 0.9,
        "model_path": "/opt/ml/model",
        "limit_mm_per_prompt": {"image": 1},
    }
    vllm = build_env("vllm", settings)
    assert vllm["SM_VLLM_MAX_NUM_SEQS"] == "32" and vllm["SM_VLLM_GPU_MEMORY_UTILIZATION"] == "0.90"
    assert vllm["SM_VLLM_LIMIT_MM_PER_PROMPT"] == '{"image":1}'
    lmi = build_env("lmi", settings)
    assert lmi["OPTION_MAX_ROLLING_BATCH_SIZE"] == "32" and lmi["OPTION_GPU_MEMORY_UTILIZATION"] == "0.90"
    assert (
        lmi["OPTION_ROLLING_BATCH"] == "vllm"
        and lmi["OPTION_TENSOR_PARALLEL_DEGREE"] == "max"
        and lmi["HF_MODEL_ID"] == "/opt/ml/model"
    )
    sg = build_env("sglang", {k: v for k, v in settings.items() if k != "limit_mm_per_prompt"})
    assert sg["SM_SGLANG_MAX_RUNNING_REQUESTS"] == "32" and sg["SM_SGLANG_MEM_FRACTION_STATIC"] == "0.90"
    assert build_env("vllm", {"enable_prefix_caching": True})["SM_VLLM_ENABLE_PREFIX_CACHING"] == ""
    assert "SM_VLLM_ENABLE_PREFIX_CACHING" not in build_env("vllm", {"enable_prefix_caching": False})


def test_passthrough_needs_the_engines_own_prefix() -> None:
    assert build_env("lmi", {}, {"OPTION_FOO": "1"})["OPTION_FOO"] == "1"
    with pytest.raises(PlanRefused, match="belongs to vllm"):
        build_env("lmi", {}, {"SM_VLLM_MAX_NUM_SEQS": "8"})


E4B_MM = ModelShape(weights_gib=15.18)
E4B_TEXT = ModelShape(weights_gib=14.23)


def test_seed_calibration_l4() -> None:
    oom = plan_memory(E4B_MM, "ml.g6.2xlarge", 256, 4096, fraction=0.92)
    assert oom.budget_gib == pytest.approx(20.20, abs=0.01) and oom.verdict == "oom"
    assert oom.sampler_gib == pytest.approx(0.5)
    fits = plan_memory(E4B_MM, "ml.g6.2xlarge", 32, 4096, fraction=0.92)
    assert fits.verdict == "fits" and fits.kv_cache_gib == pytest.approx(3.36, abs=0.1)
    assert plan_memory(E4B_TEXT, "ml.g6.2xlarge", 256, 4096, fraction=0.92).verdict == "tight"


def test_oom_plan_is_refused_with_alternatives() -> None:
    with pytest.raises(PlanRefused) as exc:
        plan_serving("vllm", E4B_MM, "ml.g6.2xlarge", "us-east-1", max_num_seqs=256)
    assert "max_num_seqs=" in exc.value.hint and "ml.g6e" in exc.value.hint
    plan = plan_serving("vllm", E4B_MM, "ml.g6.2xlarge", "us-east-1")
    assert plan.env["SM_VLLM_MAX_NUM_SEQS"] == "32" and plan.memory["verdict"] == "fits"
    assert 60 <= plan.download_timeout_seconds <= 3600 and 60 <= plan.startup_timeout_seconds <= 3600
    lmi = plan_serving("lmi", E4B_MM, "ml.g6.2xlarge", "us-east-1")
    assert int(lmi.env["OPTION_MODEL_LOADING_TIMEOUT"]) < lmi.startup_timeout_seconds


@pytest.mark.parametrize(
    ("engine", "raw"),
    [
        ("vllm", {"SM_VLLM_MAX_NUM_SEQS": "256"}),
        ("sglang", {"SM_SGLANG_MAX_RUNNING_REQUESTS": "256"}),
        ("lmi", {"OPTION_MAX_ROLLING_BATCH_SIZE": "256"}),
        ("lmi", {"OPTION_MAX_NUM_SEQS": "256"}),
        ("vllm", {"SM_VLLM_GPU_MEMORY_UTILIZATION": "0.5"}),
    ],
)
def test_a_raw_key_with_a_planned_meaning_is_planned_not_shipped_unchecked(engine: str, raw: dict[str, str]) -> None:
    """The measured L4 OOM (256 sequences) through the back door: what ships is what was planned."""
    with pytest.raises(PlanRefused, match=r"OOM|out of memory|does not fit|exceeds"):
        plan_serving(engine, E4B_MM, "ml.g6.2xlarge", "us-east-1", passthrough=raw)  # type: ignore[arg-type]


def test_raw_keys_the_plan_owns_or_that_contradict_the_request_are_refused() -> None:
    with pytest.raises(PlanRefused, match="bypasses the memory plan"):
        plan_serving("vllm", E4B_MM, "ml.g6.2xlarge", "us-east-1", passthrough={"SM_VLLM_TENSOR_PARALLEL_SIZE": "4"})
    with pytest.raises(PlanRefused, match="contradicts"):
        plan_serving(
            "vllm", E4B_MM, "ml.g6.2xlarge", "us-east-1", max_num_seqs=32, passthrough={"SM_VLLM_MAX_NUM_SEQS": "64"}
        )
    plan = plan_serving("vllm", E4B_MM, "ml.g6e.2xlarge", "us-east-1", passthrough={"SM_VLLM_MAX_NUM_SEQS": "64"})
    assert plan.env["SM_VLLM_MAX_NUM_SEQS"] == "64" and plan.max_num_seqs == 64


def test_the_deadline_comes_from_the_plan_capped_by_the_stack() -> None:
    from modeldrop.pipeline.deployment.endpoint_steps import PROVISIONING_MARGIN_SECONDS, deploy_deadline

    plan = plan_serving("vllm", E4B_MM, "ml.g6.2xlarge", "us-east-1")
    needed = plan.download_timeout_seconds + plan.startup_timeout_seconds + PROVISIONING_MARGIN_SECONDS
    assert needed > 2700  # the old fixed deadline killed this healthy load before SageMaker's own timeouts
    assert deploy_deadline(plan, 7200) == {
        "seconds": needed,
        "planned_seconds": needed,
        "cap_seconds": 7200,
        "capped": False,
    }
    assert deploy_deadline(plan, 1800)["seconds"] == 1800 and deploy_deadline(plan, 1800)["capped"]


def test_a_multimodal_checkpoint_gets_one_image_per_prompt_where_the_engine_has_the_key() -> None:
    """As the source project serves Gemma-4 multimodal; SGLang has no such flag, and a text model none."""
    from modeldrop.checkpoint.archive.artifact_scan import scan_source
    from modeldrop.checkpoint.validation import validate_scan
    from modeldrop.serving.plan import plan_serving, shape_from

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    mm = validate_scan(scan_source(str(fixtures / "gemma4-mm-kvshared-base"))).summary()
    text = validate_scan(scan_source(str(fixtures / "gemma4-text-dense"))).summary()
    assert mm.modalities == ["image", "audio"] and text.modalities == []

    def env(summary: Any, engine: Any, **kw: Any) -> dict[str, str]:
        plan = plan_serving(
            engine, shape_from(summary), "ml.g6.2xlarge", "us-east-1", modalities=summary.modalities, **kw
        )
        return plan.env

    assert env(mm, "vllm")["SM_VLLM_LIMIT_MM_PER_PROMPT"] == '{"image":1}'
    assert env(mm, "lmi")["OPTION_LIMIT_MM_PER_PROMPT"] == '{"image":1}'
    assert not any("LIMIT_MM" in k for k in env(mm, "sglang"))
    assert not any("LIMIT_MM" in k for k in env(text, "vllm"))
    # The user's own limit goes by name (the plan checks it); as a raw key it is refused.
    with pytest.raises(PlanRefused, match="limit-mm-per-prompt"):
        env(mm, "vllm", passthrough={"SM_VLLM_LIMIT_MM_PER_PROMPT": '{"image":4}'})


# ---- named engine settings: read by the plan, not shipped unchecked ----------------------------


def _plan(
    engine: Any = "vllm",
    instance_type: str = "ml.g6.12xlarge",
    modalities: tuple[str, ...] = (),
    passthrough: dict[str, str] | None = None,
    **named: Any,
) -> EnginePlan:
    return plan_serving(
        engine,
        E4B_TEXT,
        instance_type,
        "us-east-1",
        modalities=modalities,
        passthrough=passthrough,
        settings=EngineSettings.model_validate(named),
    )


def test_named_memory_fraction_and_tensor_parallelism_are_planned() -> None:
    plan = _plan(gpu_memory_utilization=0.8)
    assert plan.env["SM_VLLM_GPU_MEMORY_UTILIZATION"] == "0.80"
    assert plan.memory["budget_gib"] == pytest.approx(plan.memory["capacity_gib"] * 0.8, abs=0.01)
    split = _plan(tensor_parallel_size=2)
    assert split.env["SM_VLLM_TENSOR_PARALLEL_SIZE"] == "2" and split.memory["tensor_parallel"] == 2
    assert split.memory["weights_gib"] == pytest.approx(E4B_TEXT.weights_gib / 2, abs=0.01)
    assert any("uses 2 of the 4 GPUs" in w for w in split.warnings)
    assert _plan("lmi", tensor_parallel_size=2).env["OPTION_TENSOR_PARALLEL_DEGREE"] == "2"
    assert _plan("lmi").env["OPTION_TENSOR_PARALLEL_DEGREE"] == "max"
    with pytest.raises(PlanRefused, match="has 4 GPU") as refused:
        _plan(tensor_parallel_size=3)
    assert refused.value.hint.startswith("use one of 1, 2, 4")
    with pytest.raises(PlanRefused, match="both by name and as a raw key"):
        plan_serving(
            "vllm",
            E4B_TEXT,
            "ml.g6.12xlarge",
            "us-east-1",
            passthrough={"SM_VLLM_GPU_MEMORY_UTILIZATION": "0.7"},
            settings=__import__("modeldrop.contracts.models", fromlist=["x"]).EngineSettings(
                gpu_memory_utilization=0.8
            ),
        )


def test_named_dtype_sizes_the_weights_and_quantization_is_checked() -> None:
    from modeldrop.serving.engine_settings import weights_scale

    assert weights_scale({"BF16": 100, "I8": 100}, "float32") == pytest.approx(1.5)
    assert weights_scale({"F32": 100}, "bfloat16") == pytest.approx(0.5)
    assert weights_scale({"BF16": 100}, "auto") == 1.0
    assert _plan(dtype="bfloat16").env["SM_VLLM_DTYPE"] == "bfloat16"
    # Through the checkpoint's own dtypes: a bf16 checkpoint served as float32 needs twice the weights.
    from modeldrop.checkpoint.archive.artifact_scan import scan_source
    from modeldrop.checkpoint.validation import validate_scan
    from modeldrop.serving.plan import plan_checkpoint

    fixture = Path(__file__).resolve().parents[1] / "fixtures" / "gemma4-text-dense"
    summary = validate_scan(scan_source(str(fixture))).summary()
    assert set(summary.dtypes) == {"BF16"}
    as_stored = plan_checkpoint("vllm", summary, "ml.g6.2xlarge", "us-east-1")
    wide = plan_checkpoint("vllm", summary, "ml.g6.2xlarge", "us-east-1", settings=EngineSettings(dtype="float32"))
    assert wide.memory["weights_gib"] == pytest.approx(2 * as_stored.memory["weights_gib"], abs=0.002)
    assert _plan(quantization="fp8").env["SM_VLLM_QUANTIZATION"] == "fp8"
    assert _plan("lmi", quantization="awq").env["OPTION_QUANTIZE"] == "awq"
    assert _plan("sglang", quantization="fp8").env["SM_SGLANG_QUANTIZATION"] == "fp8"
    with pytest.raises(PlanRefused, match="unknown quantization 'q9'"):
        _plan(quantization="q9")


def test_named_media_limits_and_eagle3() -> None:
    from pydantic import ValidationError

    mm = _plan(modalities=("image", "audio"), limit_mm_per_prompt={"image": 2, "audio": 1})
    assert mm.env["SM_VLLM_LIMIT_MM_PER_PROMPT"] == '{"audio":1,"image":2}'
    with pytest.raises(PlanRefused, match="multimodal checkpoints"):
        _plan(limit_mm_per_prompt={"image": 2})
    with pytest.raises(PlanRefused, match="names audio"):
        _plan(modalities=("image",), limit_mm_per_prompt={"audio": 1})
    with pytest.raises(PlanRefused, match="not supported on sglang"):
        _plan("sglang", modalities=("image",), limit_mm_per_prompt={"image": 2})
    eagle = _plan(speculative={"model": "./eagle3-head", "num_speculative_tokens": 4, "parallel_drafting": True})
    assert eagle.env["SM_VLLM_SPECULATIVE_CONFIG"] == (
        '{"method":"eagle3","model":"/opt/ml/model/eagle3-head","num_speculative_tokens":4,"parallel_drafting":true}'
    )
    assert any("acceptance rate" in w for w in eagle.warnings)
    assert "OPTION_SPECULATIVE_CONFIG" in _plan("lmi", speculative={"model": "org/head"}).env
    with pytest.raises(PlanRefused, match="not supported on sglang") as sglang:
        _plan("sglang", speculative={"model": "org/head"})
    assert "vllm or lmi" in sglang.value.hint
    # Off by default, and never on without a draft head.
    assert not any("SPECULATIVE" in k for k in _plan().env)
    with pytest.raises(ValidationError):
        EngineSettings.model_validate({"speculative": {"num_speculative_tokens": 3}})
