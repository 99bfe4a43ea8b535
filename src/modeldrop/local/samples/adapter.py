"""A LoRA adapter in PEFT's file layout for the sample base: `adapter_config.json` and
`adapter_model.safetensors` with `base_model.model.<module>.lora_A/lora_B.weight` tensors.

Used by `run-local --adapter` and the tests; the keyword arguments make the adapters a real user
gets wrong (another rank, another base, resized vocabularies, ...).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from modeldrop.local.samples.checkpoint import TINY_CONFIG, safetensors_bytes, tiny_gemma4_tensors

PREFIX = "base_model.model."


def adapter_tensors(
    base_config: dict[str, Any],
    r: int = 8,
    target_modules: tuple[str, ...] = ("q_proj", "v_proj"),
    dtype: str = "BF16",
    tensor_rank: int | None = None,
) -> dict[str, tuple[str, list[int]]]:
    """lora_A [rank, in] and lora_B [out, rank] for every module of the base that TARGET_MODULES names."""
    rank = tensor_rank or r
    tensors: dict[str, tuple[str, list[int]]] = {}
    for name, (_dtype, shape) in sorted(tiny_gemma4_tensors(base_config).items()):
        module = name.removesuffix(".weight")
        if len(shape) != 2 or module.rsplit(".", 1)[-1] not in target_modules or "embed" in module:
            continue
        out_f, in_f = shape
        tensors[f"{PREFIX}{module}.lora_A.weight"] = (dtype, [rank, in_f])
        tensors[f"{PREFIX}{module}.lora_B.weight"] = (dtype, [out_f, rank])
    return tensors


def adapter_config(r: int = 8, **overrides: Any) -> dict[str, Any]:
    """adapter_config.json as PEFT 0.1x writes it for a causal LM."""
    config: dict[str, Any] = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": "modeldrop/tiny-gemma4",
        "r": r,
        "lora_alpha": 2 * r,
        "lora_dropout": 0.05,
        "target_modules": ["q_proj", "v_proj"],
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_dora": False,
        "use_rslora": False,
        "inference_mode": True,
    }
    config.update(overrides)
    return config


def write_adapter(
    directory: Path,
    *,
    base_config: dict[str, Any] | None = None,
    r: int = 8,
    config: dict[str, Any] | None = None,
    tensors: dict[str, tuple[str, list[int]]] | None = None,
    seed: int = 1,
) -> Path:
    """Write a PEFT LoRA adapter for BASE_CONFIG (the sample base's by default); SEED varies its bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    base = base_config or TINY_CONFIG
    cfg = config or adapter_config(r)
    names = tensors if tensors is not None else adapter_tensors(base, r, tuple(cfg.get("target_modules") or ()))
    (directory / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
    (directory / "adapter_model.safetensors").write_bytes(safetensors_bytes(names, {"format": "pt"}, fill=seed))
    return directory


def adapter_seed(path: Path) -> int:
    """The first data byte of an adapter's weights: what the reference engine keys its answers on."""
    data = (path / "adapter_model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return data[8 + n] if len(data) > 8 + n else 0
