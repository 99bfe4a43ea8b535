"""Named engine settings (EngineSettings) as plan inputs and env meanings, each checked first.

Unlike a raw `engine_env` key, a named setting is read by the memory plan: the memory fraction
is the plan's budget, the tensor-parallel size divides the weights and KV per GPU, the dtype sets
the width the weights are sized at. The rest (quantization, media limits, EAGLE3) go to the engine
through the one meaning -> key table, so an engine without the setting refuses it by name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modeldrop.contracts.errors import PlanRefused
from modeldrop.contracts.models import EngineSettings
from modeldrop.contracts.step_payloads import Engine
from modeldrop.serving.engine_env import KEYS, UNSUPPORTED
from modeldrop.serving.memory_plan import instance

# Bytes per element of the float dtypes a dtype setting can change; other dtypes (quantized,
# integer) keep their width whatever the engine's dtype.
FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# Methods that read an already quantized checkpoint (its config says how); fp8 quantizes at load.
PREQUANTIZED = frozenset(("awq", "awq_marlin", "gptq", "gptq_marlin", "compressed-tensors", "modelopt", "mxfp4"))
KNOWN_QUANTIZATION = PREQUANTIZED | {"fp8", "bitsandbytes", "experts_int8", "fbgemm_fp8"}


@dataclass
class Applied:
    """What the named settings change in the plan, and what they add to the env."""

    fraction: float | None = None
    tensor_parallel: int | None = None
    meanings: dict[str, object] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def weights_scale(dtypes: Mapping[str, int], dtype: str | None) -> float:
    """How the weights' size changes when the engine loads the float tensors at DTYPE."""
    total = sum(dtypes.values())
    if not dtype or dtype == "auto" or not total:
        return 1.0
    width = DTYPE_BYTES[dtype]
    scaled = sum(n * width / FLOAT_BYTES[d] if d in FLOAT_BYTES else n for d, n in dtypes.items())
    return scaled / total


def apply_settings(
    settings: EngineSettings | None,
    engine: Engine,
    instance_type: str,
    modalities: Sequence[str],
    passthrough: Mapping[str, str],
) -> Applied:
    applied = Applied()
    if settings is None or not settings.given():
        return applied
    applied.fraction = settings.gpu_memory_utilization
    applied.tensor_parallel = _tensor_parallel(settings.tensor_parallel_size, instance_type, applied.warnings)
    if settings.dtype and settings.dtype != "auto":
        applied.meanings["dtype"] = settings.dtype
    if settings.quantization:
        applied.meanings["quantization"] = _quantization(settings.quantization, applied.warnings)
    if settings.limit_mm_per_prompt is not None:
        applied.meanings["limit_mm_per_prompt"] = _media_limits(settings.limit_mm_per_prompt, modalities)
    if settings.speculative is not None:
        applied.meanings["speculative_config"] = _speculative(settings, applied.warnings)
    if settings.trust_remote_code:
        applied.meanings["trust_remote_code"] = True
        applied.warnings.append(
            "trust_remote_code: the engine imports the checkpoint's own Python files and runs them with the "
            "SageMaker execution role"
        )
    for meaning in applied.meanings:
        if meaning in UNSUPPORTED[engine]:
            others = " or ".join(e for e in KEYS if e != engine and meaning not in UNSUPPORTED[e])
            raise PlanRefused(
                f"{meaning} is not supported on {engine}: {UNSUPPORTED[engine][meaning]}",
                f"drop it, or deploy with {others}",
            )
        key = KEYS[engine].get(meaning)
        if key and key in passthrough:
            raise PlanRefused(f"{meaning} is set both by name and as the raw key {key}", "set it once, by name")
    return applied


def _tensor_parallel(size: int | None, instance_type: str, warnings: list[str]) -> int | None:
    if size is None:
        return None
    spec = instance(instance_type)
    if spec is None:
        warnings.append(f"tensor_parallel_size {size} not checked: {instance_type} is not in the catalog")
        return size
    gpus = int(spec["gpus"])
    if size > gpus or gpus % size:
        fits = ", ".join(str(n) for n in range(1, gpus + 1) if gpus % n == 0)
        raise PlanRefused(
            f"tensor_parallel_size {size} does not fit {instance_type}, which has {gpus} GPU(s)",
            f"use one of {fits}, or an instance type with more GPUs",
        )
    if size < gpus:
        warnings.append(f"tensor_parallel_size {size} uses {size} of the {gpus} GPUs of {instance_type}")
    return size


def _quantization(method: str, warnings: list[str]) -> str:
    if method not in KNOWN_QUANTIZATION:
        raise PlanRefused(f"unknown quantization {method!r}", f"known methods: {', '.join(sorted(KNOWN_QUANTIZATION))}")
    if method in PREQUANTIZED:
        warnings.append(f"quantization {method} reads an already quantized checkpoint (its quantization_config)")
    else:
        warnings.append(
            f"quantization {method} quantizes at load: the memory plan still counts the weights as stored, "
            "so the KV budget it predicts is a floor"
        )
    return method


def _media_limits(limits: Mapping[Any, int], modalities: Sequence[str]) -> dict[str, int]:
    if not modalities:
        raise PlanRefused(
            "limit_mm_per_prompt is for multimodal checkpoints; this one has no vision or audio config",
            "drop limit_mm_per_prompt",
        )
    unknown = sorted(set(limits) - set(modalities) - ({"video"} if "image" in modalities else set()))
    if unknown:
        raise PlanRefused(
            f"limit_mm_per_prompt names {', '.join(unknown)}, which this checkpoint does not take",
            f"it takes {', '.join(modalities)}",
        )
    return dict(limits)


def _speculative(settings: EngineSettings, warnings: list[str]) -> dict[str, object]:
    spec = settings.speculative
    assert spec is not None
    head = spec.model
    if head.startswith("./"):  # a directory inside the artifact, as the container sees it
        head = "/opt/ml/model/" + head[2:].strip("/")
    config: dict[str, object] = {
        "method": spec.method,
        "model": head,
        "num_speculative_tokens": spec.num_speculative_tokens,
    }
    if spec.parallel_drafting:
        config["parallel_drafting"] = True
    warnings.append(
        f"EAGLE3 with draft head {spec.model}: a head trained for the base model accepts fewer tokens on a "
        "fine-tune, so measure the acceptance rate; the head's weights are not in the memory plan"
    )
    return config
