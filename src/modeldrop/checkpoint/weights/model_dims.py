"""The dimensions the engines derive from a config, as vLLM's ModelConfig derives them (get_head_size,
get_total_num_kv_heads, get_num_layers), for the KV cache the memory plan sizes.

transformers writes no `head_dim` for Qwen2/2.5, Phi-3/4, OLMo-2, Granite, StarCoder2, Cohere...,
no `num_key_value_heads` for GPT-NeoX, Falcon or GPT-2, and GPT-2 calls its sizes n_layer, n_head,
n_embd: the engines fill them in, so must the plan (a missing one planned the KV cache at zero).
MLA (DeepSeek-V2/V3, Kimi) caches one latent of kv_lora_rank + qk_rope_head_dim per token and layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Each dimension's spellings across architectures, in vLLM's order of preference.
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN = ("hidden_size", "n_embd", "d_model", "model_dim")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "num_heads")
_KV_HEADS = ("num_key_value_heads", "n_head_kv", "num_kv_heads", "multi_query_group_num", "num_attention_groups")
# The architectures vLLM (0.32, is_deepseek_mla) serves with MLA; MiniCPM3 has kv_lora_rank but caches per head.
MLA_MODEL_TYPES = frozenset(
    {
        "axk1", "deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_v4", "deepseek_v41", "dots3_note",
        "deepseek_mtp", "k3_dspark", "glm5_next", "glm5_next_text", "glm_moe_dsa", "glm4_moe_lite",
        "glm4_moe_lite_mtp", "kimi_k2", "kimi_linear", "longcat_flash", "pangu_ultra_moe", "pangu_ultra_moe_mtp",
        "bailing_hybrid", "bailing_hybrid_mtp", "hy_v4", "hy_v4_mtp",
    }
)  # fmt: skip
MAX_LAYERS = 4096  # side_files.CONFIG_BOUNDS: past it no per-layer work is done


@dataclass(frozen=True)
class KvDims:
    num_layers: int | None
    kv_heads: int | None
    head_dim: int | None
    latent: bool = False  # MLA: one latent vector per token and layer, not a K and a V
    # [kv_heads, head_dim] of each layer, where layers differ (Gemma-4's full-attention layers use a
    # 512 head_dim through per_layer_config); head_dim and kv_heads above are then the widest.
    per_layer: tuple[tuple[int, int], ...] | None = None

    @property
    def complete(self) -> bool:
        return bool(self.num_layers and self.kv_heads and self.head_dim)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def text_section(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's own config: `text_config` (or `llm_config`) of a multimodal model, else the config."""
    for key in ("text_config", "llm_config", "language_config"):
        section = config.get(key)
        if isinstance(section, dict):
            return {**{k: v for k, v in config.items() if k not in section}, **section}
    return config


def _first(section: dict[str, Any], names: tuple[str, ...]) -> int | None:
    for name in names:
        value = _int(section.get(name))
        if value is not None:
            return value
    return None


def kv_dims(config: dict[str, Any]) -> KvDims:
    section = text_section(config)
    layers = _first(section, _LAYERS)
    kv_lora_rank, rope = _int(section.get("kv_lora_rank")), _int(section.get("qk_rope_head_dim"))
    if kv_lora_rank and rope and section.get("model_type") in MLA_MODEL_TYPES:
        return KvDims(layers, 1, kv_lora_rank + rope, latent=True)
    heads = _first(section, _HEADS)
    hidden = _first(section, _HIDDEN)
    head_dim = _int(section.get("head_dim")) or (hidden // heads if hidden and heads and hidden % heads == 0 else None)
    kv_heads = _falcon_kv_heads(section) or _first(section, _KV_HEADS)
    attn = section.get("attn_config")
    if kv_heads is None and isinstance(attn, dict):  # MPT
        kv_heads = _int(attn.get("kv_n_heads"))
    kv_heads = kv_heads or heads
    per_layer = _per_layer(section, layers, kv_heads, head_dim)
    if per_layer:
        return KvDims(layers, max(k for k, _ in per_layer), max(d for _, d in per_layer), per_layer=per_layer)
    return KvDims(layers, kv_heads, head_dim)


def _per_layer(
    section: dict[str, Any], layers: int | None, kv_heads: int | None, head_dim: int | None
) -> tuple[tuple[int, int], ...] | None:
    """Each layer's [kv_heads, head_dim] from `per_layer_config` ({"05": {"head_dim": 512}}), or None."""
    overrides = section.get("per_layer_config")
    if not (isinstance(overrides, dict) and overrides and layers and kv_heads and head_dim) or layers > MAX_LAYERS:
        return None
    out = []
    for layer in range(layers):
        own = overrides.get(f"{layer:02d}", overrides.get(str(layer)))
        own = own if isinstance(own, dict) else {}
        out.append((_int(own.get("num_key_value_heads")) or kv_heads, _int(own.get("head_dim")) or head_dim))
    return tuple(out)


def _falcon_kv_heads(section: dict[str, Any]) -> int | None:
    if section.get("model_type") not in ("falcon", "RefinedWeb", "RefinedWebModel"):
        return None
    if section.get("new_decoder_architecture"):
        return _int(section.get("num_kv_heads"))
    if section.get("multi_query"):
        return 1
    return None
