"""What serving a LoRA adapter beside its base adds to a plan: the engine's LoRA flags, the adapter's
location, and the GPU memory the engine reserves for LoRA weights."""

from __future__ import annotations

from modeldrop.contracts.models import AdapterInfo, Engine

# vLLM accepts these max_lora_rank values only (LMI's lmi-dist is vLLM's loader); SGLang takes any.
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
GIB = 1024**3
BYTES_PER_ELEMENT = 2  # the LoRA buffers are in the model's dtype (bf16/fp16)


def slot_rank(max_rank: int) -> int:
    """The smallest max_lora_rank the engines accept that holds the adapter's rank."""
    return next((r for r in VLLM_RANKS if r >= max_rank), VLLM_RANKS[-1])


def lora_env(engine: Engine, adapter: AdapterInfo, max_loras: int = 1) -> dict[str, str]:
    """The container env that serves ADAPTER under its name: vLLM/SGLang name it on the command line,
    LMI finds it in /opt/ml/model/adapters/<name> (the served copy's layout)."""
    rank = str(slot_rank(adapter.max_rank))
    if engine == "vllm":
        return {
            "SM_VLLM_ENABLE_LORA": "",
            "SM_VLLM_LORA_MODULES": f"{adapter.name}={adapter.path}",
            "SM_VLLM_MAX_LORAS": str(max_loras),
            "SM_VLLM_MAX_LORA_RANK": rank,
        }
    if engine == "sglang":
        return {
            "SM_SGLANG_ENABLE_LORA": "",
            "SM_SGLANG_LORA_PATHS": f"{adapter.name}={adapter.path}",
            "SM_SGLANG_MAX_LORAS_PER_BATCH": str(max_loras),
            "SM_SGLANG_MAX_LORA_RANK": rank,
        }
    return {
        "OPTION_ENABLE_LORA": "true",
        "OPTION_MAX_LORAS": str(max_loras),
        "OPTION_MAX_LORA_RANK": rank,
        "OPTION_MAX_CPU_LORAS": str(max_loras),
    }


def lora_gib(adapter: AdapterInfo, max_loras: int = 1) -> float:
    """GPU memory the engine reserves for LoRA: every adapted module's A and B at the slot rank, for
    each resident adapter (vLLM allocates them at start, whatever the adapter's own rank)."""
    return adapter.features * slot_rank(adapter.max_rank) * BYTES_PER_ELEMENT * max_loras / GIB
