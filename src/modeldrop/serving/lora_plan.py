"""What serving a LoRA adapter beside its base adds to a plan: the engine's LoRA settings (through
the one meaning-to-key mapping), and the GPU memory the engine reserves for LoRA weights."""

from __future__ import annotations

from modeldrop.contracts.models import AdapterInfo
from modeldrop.contracts.served import VLLM_LORA_RANKS
from modeldrop.contracts.step_payloads import Engine
from modeldrop.serving.engine_env import KEYS, MEANINGS, format_value

GIB = 1024**3
BYTES_PER_ELEMENT = 2  # the LoRA buffers are in the model's dtype (bf16/fp16)


def slot_rank(max_rank: int) -> int:
    """The smallest max_lora_rank the engines accept that holds the adapter's rank."""
    return next((r for r in VLLM_LORA_RANKS if r >= max_rank), VLLM_LORA_RANKS[-1])


def lora_env(engine: Engine, adapter: AdapterInfo, max_loras: int = 1, named: bool = True) -> dict[str, str]:
    """The container env that serves ADAPTER under its name: vLLM/SGLang name it on the command line,
    LMI finds it in /opt/ml/model/adapters/<name> (the served copy's layout). Not NAMED (adapter
    inference components), LoRA is only enabled and sized: each adapter arrives through the API."""
    settings: dict[str, object] = {
        "enable_lora": True,
        "max_loras": max_loras,
        "max_lora_rank": slot_rank(adapter.max_rank),
    }
    if named:
        settings["lora_modules"] = f"{adapter.name}={adapter.path}"
    env = {}
    for meaning, value in settings.items():
        key = KEYS[engine].get(meaning)
        formatted = format_value(engine, MEANINGS[meaning].kind, value)
        if key is not None and formatted is not None:
            env[key] = formatted
    if engine == "vllm" and not named:
        # vLLM's adapter API (SageMaker's POST /adapters, /v1/load_lora_adapter) is off unless this is set.
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "true"
    return env


def lora_gib(adapter: AdapterInfo, max_loras: int = 1) -> float:
    """GPU memory the engine reserves for LoRA: every adapted module's A and B at the slot rank, for
    each resident adapter (vLLM allocates them at start, whatever the adapter's own rank)."""
    return adapter.features * slot_rank(adapter.max_rank) * BYTES_PER_ELEMENT * max_loras / GIB


def widest(adapters: list[AdapterInfo]) -> AdapterInfo:
    """One adapter standing for all that share an engine: the largest rank and the most features,
    which is what the engine's slots are sized for."""
    return adapters[0].model_copy(
        update={"max_rank": max(a.max_rank for a in adapters), "features": max(a.features for a in adapters)}
    )
