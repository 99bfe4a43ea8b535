"""One mapping from meaning to container env keys, for every engine.

Every meaning is either mapped for an engine or listed as unsupported there with a reason, so a
setting can never again apply to one engine and silently miss another (tests walk the matrix).
vLLM / SGLang DLC entrypoints turn SM_VLLM_FOO_BAR=v into --foo-bar v (an empty value is a bare
flag); LMI reads OPTION_<KEY> as option.<key> and SERVING_<KEY> as server settings.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from modeldrop.contracts.errors import PlanRefused
from modeldrop.contracts.step_payloads import Engine

MODEL_PATH = "/opt/ml/model"
Kind = Literal["str", "int", "fraction", "flag", "json"]


@dataclass(frozen=True)
class Meaning:
    name: str
    kind: Kind
    description: str


MEANINGS: dict[str, Meaning] = {
    m.name: m
    for m in (
        Meaning("model_path", "str", "where the container finds the weights"),
        Meaning("max_model_len", "int", "context length (prompt + completion)"),
        Meaning("max_num_seqs", "int", "concurrent sequences; drives the sampler buffer"),
        Meaning("gpu_memory_utilization", "fraction", "fraction of GPU memory the engine may use"),
        Meaning("tensor_parallel_degree", "str", "GPUs per model replica"),
        Meaning("dtype", "str", "weight/activation dtype"),
        Meaning("limit_mm_per_prompt", "json", "multimodal items allowed per prompt"),
        Meaning("enable_prefix_caching", "flag", "reuse KV of shared prompt prefixes"),
        Meaning("speculative_config", "json", "speculative decoding configuration"),
        Meaning("quantization", "str", "quantization method"),
        Meaning("trust_remote_code", "flag", "run the checkpoint's own modelling code"),
        Meaning("served_model_name", "str", "model name the OpenAI API answers to"),
        Meaning("enable_lora", "flag", "serve LoRA adapters"),
        Meaning("max_loras", "int", "LoRA adapters resident at once"),
        Meaning("max_lora_rank", "int", "largest LoRA rank accepted"),
        Meaning("lora_modules", "str", "the LoRA adapters to load at start, name=path"),
    )
}

ENGINE_PREFIX: dict[str, tuple[str, ...]] = {
    "vllm": ("SM_VLLM_",),
    "sglang": ("SM_SGLANG_",),
    "lmi": ("OPTION_", "SERVING_"),
}

KEYS: dict[str, dict[str, str]] = {
    "vllm": {
        "model_path": "SM_VLLM_MODEL",
        "max_model_len": "SM_VLLM_MAX_MODEL_LEN",
        "max_num_seqs": "SM_VLLM_MAX_NUM_SEQS",
        "gpu_memory_utilization": "SM_VLLM_GPU_MEMORY_UTILIZATION",
        "tensor_parallel_degree": "SM_VLLM_TENSOR_PARALLEL_SIZE",
        "dtype": "SM_VLLM_DTYPE",
        "limit_mm_per_prompt": "SM_VLLM_LIMIT_MM_PER_PROMPT",
        "enable_prefix_caching": "SM_VLLM_ENABLE_PREFIX_CACHING",
        "speculative_config": "SM_VLLM_SPECULATIVE_CONFIG",
        "quantization": "SM_VLLM_QUANTIZATION",
        "trust_remote_code": "SM_VLLM_TRUST_REMOTE_CODE",
        "served_model_name": "SM_VLLM_SERVED_MODEL_NAME",
        "enable_lora": "SM_VLLM_ENABLE_LORA",
        "max_loras": "SM_VLLM_MAX_LORAS",
        "max_lora_rank": "SM_VLLM_MAX_LORA_RANK",
        "lora_modules": "SM_VLLM_LORA_MODULES",
    },
    "sglang": {
        "model_path": "SM_SGLANG_MODEL_PATH",
        "max_model_len": "SM_SGLANG_CONTEXT_LENGTH",
        "max_num_seqs": "SM_SGLANG_MAX_RUNNING_REQUESTS",
        "gpu_memory_utilization": "SM_SGLANG_MEM_FRACTION_STATIC",
        "tensor_parallel_degree": "SM_SGLANG_TP_SIZE",
        "dtype": "SM_SGLANG_DTYPE",
        "quantization": "SM_SGLANG_QUANTIZATION",
        "trust_remote_code": "SM_SGLANG_TRUST_REMOTE_CODE",
        "served_model_name": "SM_SGLANG_SERVED_MODEL_NAME",
        "enable_lora": "SM_SGLANG_ENABLE_LORA",
        "max_loras": "SM_SGLANG_MAX_LORAS_PER_BATCH",
        "max_lora_rank": "SM_SGLANG_MAX_LORA_RANK",
        "lora_modules": "SM_SGLANG_LORA_PATHS",
    },
    "lmi": {
        "model_path": "HF_MODEL_ID",
        "max_model_len": "OPTION_MAX_MODEL_LEN",
        "max_num_seqs": "OPTION_MAX_ROLLING_BATCH_SIZE",
        "gpu_memory_utilization": "OPTION_GPU_MEMORY_UTILIZATION",
        "tensor_parallel_degree": "OPTION_TENSOR_PARALLEL_DEGREE",
        "dtype": "OPTION_DTYPE",
        "limit_mm_per_prompt": "OPTION_LIMIT_MM_PER_PROMPT",
        "enable_prefix_caching": "OPTION_ENABLE_PREFIX_CACHING",
        "speculative_config": "OPTION_SPECULATIVE_CONFIG",
        "quantization": "OPTION_QUANTIZE",
        "trust_remote_code": "OPTION_TRUST_REMOTE_CODE",
        "enable_lora": "OPTION_ENABLE_LORA",
        "max_loras": "OPTION_MAX_LORAS",
        "max_lora_rank": "OPTION_MAX_LORA_RANK",
    },
}

UNSUPPORTED: dict[str, dict[str, str]] = {
    "vllm": {},
    "sglang": {
        "limit_mm_per_prompt": "SGLang has no per-prompt multimodal item limit flag",
        "enable_prefix_caching": (
            "SGLang's radix cache is on unless --disable-radix-cache; "
            "pass SM_SGLANG_DISABLE_RADIX_CACHE as a raw key to turn it off"
        ),
        "speculative_config": (
            "SGLang takes separate --speculative-* flags, not one JSON config; pass SM_SGLANG_SPECULATIVE_* raw keys"
        ),
    },
    "lmi": {
        "served_model_name": "LMI serves one model on /invocations; the OpenAI model name is not configurable",
        "lora_modules": "LMI loads every adapter it finds in /opt/ml/model/adapters/<name>: none is named",
    },
}

# LMI defaults that load Gemma-4: vLLM as the rolling-batch backend, every GPU of the instance.
ENGINE_DEFAULTS: dict[str, dict[str, str]] = {
    "vllm": {},
    "sglang": {},
    "lmi": {"OPTION_ROLLING_BATCH": "vllm"},
}


# What the memory plan decides: a raw key carrying one of these meanings would ship a number the
# plan never checked (`SM_VLLM_MAX_NUM_SEQS=256` planned as 32 is the OOM the plan exists to stop).
PLANNED = ("max_model_len", "max_num_seqs", "gpu_memory_utilization", "tensor_parallel_degree", "model_path")
# Other spellings the containers also read for a planned meaning (DLC flag aliases, LMI's option names).
ALIASES: dict[str, dict[str, str]] = {
    "vllm": {
        "SM_VLLM_TP": "tensor_parallel_degree",
        "SM_VLLM_PIPELINE_PARALLEL_SIZE": "tensor_parallel_degree",
        "SM_VLLM_PP": "tensor_parallel_degree",
        "SM_VLLM_MODEL_PATH": "model_path",
    },
    "sglang": {
        "SM_SGLANG_TENSOR_PARALLEL_SIZE": "tensor_parallel_degree",
        "SM_SGLANG_TP": "tensor_parallel_degree",
        "SM_SGLANG_MODEL": "model_path",
        "SM_SGLANG_MAX_NUM_SEQS": "max_num_seqs",
    },
    "lmi": {
        "OPTION_MAX_NUM_SEQS": "max_num_seqs",
        "OPTION_MODEL_ID": "model_path",
        "TENSOR_PARALLEL_DEGREE": "tensor_parallel_degree",
    },
}


def planned_keys(engine: Engine, passthrough: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """meaning -> (raw key, value) for every raw key in PASSTHROUGH that carries a planned meaning."""
    by_key = {KEYS[engine][m]: m for m in PLANNED if m in KEYS[engine]} | ALIASES[engine]
    found: dict[str, tuple[str, str]] = {}
    for key, value in passthrough.items():
        meaning = by_key.get(key.upper())
        if meaning is not None:
            if meaning in found:
                raise PlanRefused(f"{found[meaning][0]} and {key} both set {meaning}", "set it once")
            found[meaning] = (key, value)
    return found


def format_value(engine: Engine, kind: Kind, value: Any) -> str | None:
    """Values as the containers expect them; None means 'omit the key'."""
    if kind == "flag":
        if engine == "lmi":
            return "true" if value else "false"
        return "" if value else None
    if kind == "fraction":
        v = float(value)
        if not 0.0 < v <= 1.0:
            raise PlanRefused(f"memory fraction {v} is outside (0, 1]", "use e.g. 0.90")
        return f"{v:.2f}"
    if kind == "json":
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    if kind == "int":
        return str(int(value))
    return str(value)


def build_env(
    engine: Engine,
    settings: Mapping[str, Any],
    passthrough: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Container env for ``engine`` from meaning -> value settings (None values are skipped)."""
    env: dict[str, str] = dict(ENGINE_DEFAULTS[engine])
    if engine == "lmi":
        env["OPTION_TENSOR_PARALLEL_DEGREE"] = "max"
    for name, value in settings.items():
        if value is None:
            continue
        if name not in MEANINGS:
            raise PlanRefused(f"unknown engine setting {name!r}", f"known settings: {', '.join(MEANINGS)}")
        if name in UNSUPPORTED[engine]:
            raise PlanRefused(f"{name} is not supported on {engine}: {UNSUPPORTED[engine][name]}")
        formatted = format_value(engine, MEANINGS[name].kind, value)
        if formatted is not None:
            env[KEYS[engine][name]] = formatted
    for key, value in (passthrough or {}).items():
        if not key.startswith(ENGINE_PREFIX[engine]):
            owner = next((e for e, ps in ENGINE_PREFIX.items() if key.startswith(ps)), None)
            why = f"it belongs to {owner}" if owner else "it has no engine prefix"
            raise PlanRefused(
                f"raw env key {key} cannot go on a {engine} plan: {why}",
                f"{engine} keys start with {' or '.join(ENGINE_PREFIX[engine])}",
            )
        env[key] = value
    return env


def engine_of_env(env: Mapping[str, str]) -> Engine | None:
    """Which engine a container env was built for (None for a BYOC env without engine keys)."""
    for engine in ("vllm", "sglang", "lmi"):
        if any(k.startswith(ENGINE_PREFIX[engine]) for k in env):
            return engine
    return None


def max_model_len_of_env(env: Mapping[str, str]) -> int | None:
    for keys in KEYS.values():
        value = env.get(keys["max_model_len"])
        if value and value.isdigit():
            return int(value)
    return None
