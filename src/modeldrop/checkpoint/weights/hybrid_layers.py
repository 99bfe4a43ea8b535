"""Which layers of a hybrid model hold a KV cache, and the recurrent state vLLM keeps per sequence for
the others, as vLLM (0.32: ModelConfig.get_num_layers_by_block_type, each model's
get_mamba_state_shape_from_config, MambaStateShapeCalculator) derives them.

Jamba, LFM2, Qwen3-Next, MiniMax, Granite-4 hybrid, NemotronH, Zamba2 and Bamba cache K and V on
their attention layers only; their Mamba, short-convolution and linear-attention layers hold a
fixed-size state per running sequence instead (conv state plus SSM / delta-rule state), whatever its
length. Planned as if every layer cached K and V, the per-token KV was about twice vLLM's and the
state was not planned at all. Falcon-H1 runs attention and Mamba side by side in every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from modeldrop.checkpoint.weights.model_dims import MAX_LAYERS, text_section
from modeldrop.serving.memory_plan import RECURRENT_KINDS


@dataclass(frozen=True)
class HybridLayout:
    layer_types: list[str]  # per layer: an attention kind, or a RECURRENT_KINDS kind
    recurrent_layers: int
    state_shapes: tuple[tuple[int, ...], ...]  # one recurrent layer's state tensors (vLLM's shapes at TP 1)
    state_bytes_per_sequence: int  # every recurrent layer's state, at the widths vLLM keeps on a GPU

    @property
    def state_elements_per_sequence(self) -> int:
        return self.recurrent_layers * sum(prod(s) for s in self.state_shapes)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _kinds(section: dict[str, Any], layers: int) -> list[str] | None:
    """Each layer's kind, in vLLM's order of lookup: layers_block_type, attn_type_list, layer_types, and
    Jamba's attention period / offset (transformers derives its layers_block_type from them)."""
    declared = section.get("layers_block_type")
    if isinstance(declared, list) and len(declared) == layers:
        return [str(t) for t in declared]
    attn_types = section.get("attn_type_list")
    if isinstance(attn_types, list) and len(attn_types) == layers:
        return ["full_attention" if t == 1 else "linear_attention" for t in attn_types]
    layer_types = section.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == layers:
        return [str(t) for t in layer_types]
    period, offset = _int(section.get("attn_layer_period")), section.get("attn_layer_offset")
    if section.get("model_type") == "jamba" and period and isinstance(offset, int):
        return ["attention" if i % period == offset else "mamba" for i in range(layers)]
    return None


Shapes = tuple[tuple[int, ...], ...]


def _mamba1(section: dict[str, Any]) -> Shapes | None:
    """Jamba's Mamba-1 layers: conv (d_inner, d_conv - 1), ssm (d_inner, d_state)."""
    hidden, expand = _int(section.get("hidden_size")), _int(section.get("mamba_expand"))
    d_state, d_conv = _int(section.get("mamba_d_state")), _int(section.get("mamba_d_conv"))
    if hidden and expand and d_state and d_conv:
        return ((expand * hidden, d_conv - 1), (expand * hidden, d_state))
    return None


def _short_conv(section: dict[str, Any]) -> Shapes | None:
    """LFM2's short convolutions: (conv_dim, L_cache - 1)."""
    dim, kernel = _int(section.get("conv_dim")) or _int(section.get("hidden_size")), _int(section.get("conv_L_cache"))
    return ((dim, kernel - 1),) if dim and kernel else None


def _gated_delta_net(section: dict[str, Any]) -> Shapes | None:
    """Qwen3-Next / Qwen3.5 linear attention: conv (2 k_heads k_dim + v_heads v_dim, kernel - 1), state
    (v_heads, v_dim, k_dim)."""
    k_heads, v_heads = _int(section.get("linear_num_key_heads")), _int(section.get("linear_num_value_heads"))
    k_dim, v_dim = _int(section.get("linear_key_head_dim")), _int(section.get("linear_value_head_dim"))
    kernel = _int(section.get("linear_conv_kernel_dim"))
    if k_heads and v_heads and k_dim and v_dim and kernel:
        return ((2 * k_heads * k_dim + v_heads * v_dim, kernel - 1), (v_heads, v_dim, k_dim))
    return None


def _lightning(section: dict[str, Any]) -> Shapes | None:
    """MiniMax's lightning attention: (heads, head_dim, head_dim)."""
    heads, hidden = _int(section.get("num_attention_heads")), _int(section.get("hidden_size"))
    d = _int(section.get("head_dim")) or (hidden // heads if hidden and heads else None)
    return ((heads, d, d),) if heads and d else None


_FAMILIES = {
    "jamba": _mamba1,
    "lfm2": _short_conv,
    "lfm2_moe": _short_conv,
    "qwen3_next": _gated_delta_net,
    "qwen3_5": _gated_delta_net,
    "qwen3_5_text": _gated_delta_net,
    "qwen3_5_moe": _gated_delta_net,
    "qwen3_5_moe_text": _gated_delta_net,
    "minimax": _lightning,
    "minimax_text_01": _lightning,
}


def _state_shapes(section: dict[str, Any]) -> Shapes | None:
    """One recurrent layer's state tensors as the model's get_mamba_state_shape_from_config gives them."""
    family = _FAMILIES.get(str(section.get("model_type")))
    return family(section) if family else _mamba2_shapes(section)


def _mamba2_shapes(section: dict[str, Any]) -> Shapes | None:
    """Mamba-2 layers (Falcon-H1, Granite-4 hybrid, Bamba, NemotronH, Zamba2): conv (d_inner + 2 n_groups
    d_state, d_conv - 1), ssm (heads, head_dim, d_state)."""
    hidden = _int(section.get("hidden_size"))
    expand = section.get("mamba_expand", section.get("expand"))
    d_inner = _int(section.get("mamba_d_ssm")) or (
        int(expand * hidden) if hidden and isinstance(expand, int | float) and not isinstance(expand, bool) else None
    )
    heads = _int(section.get("mamba_n_heads", section.get("mamba_num_heads")))
    head_dim = _int(section.get("mamba_d_head", section.get("mamba_head_dim")))
    groups = _int(section.get("mamba_n_groups", section.get("n_groups"))) or 1
    d_state = _int(section.get("mamba_d_state", section.get("ssm_state_size")))
    d_conv = _int(section.get("mamba_d_conv", section.get("conv_kernel")))
    if heads and head_dim and not d_inner:
        d_inner = heads * head_dim
    if not (d_inner and heads and d_state and d_conv):
        return None
    return ((d_inner + 2 * groups * d_state, d_conv - 1), (heads, head_dim or d_inner // heads, d_state))


def hybrid_layout(config: dict[str, Any], dtype_bytes: int = 2) -> HybridLayout | None:
    """The layout of a hybrid model, or None for a model whose every layer caches K and V."""
    section = text_section(config)
    layers = _int(section.get("num_hidden_layers"))
    if not layers or layers > MAX_LAYERS:
        return None
    kinds = _kinds(section, layers)
    parallel = section.get("model_type") == "falcon_h1"  # attention and Mamba in every layer
    if kinds is None and not parallel:
        return None
    kinds = ["attention"] * layers if parallel else (kinds or [])
    # Falcon-H1 pairs Mamba with attention in every layer; Zamba2's "hybrid" layers are Mamba layers too.
    whole = parallel or section.get("model_type") == "zamba2"
    recurrent = layers if whole else sum(k in RECURRENT_KINDS for k in kinds)
    if recurrent == 0:
        return None
    shapes = _state_shapes(section) or ()
    # The first shape is the conv state (the model's dtype); the SSM / delta-rule state is kept at the
    # model's dtype too unless vLLM's config hooks raise it: NemotronH to float32 by default, Qwen3.5
    # to its config's mamba_ssm_dtype. (On CPU vLLM keeps it in float32: engine_probe compares elements.)
    ssm_bytes = _ssm_bytes(section, dtype_bytes)
    per_layer = sum(prod(s) * (dtype_bytes if i == 0 and len(shapes) > 1 else ssm_bytes) for i, s in enumerate(shapes))
    if len(shapes) == 1 and section.get("model_type") in ("lfm2", "lfm2_moe"):
        per_layer = prod(shapes[0]) * dtype_bytes  # a short convolution has only its conv state
    normalised = [
        k if k in RECURRENT_KINDS else "sliding_attention" if k == "sliding_attention" else "full_attention"
        for k in kinds
    ]
    return HybridLayout(
        layer_types=normalised,
        recurrent_layers=recurrent,
        state_shapes=shapes,
        state_bytes_per_sequence=per_layer * recurrent,
    )


_WIDTHS = {"float32": 4, "float16": 2, "bfloat16": 2}


def _ssm_bytes(section: dict[str, Any], dtype_bytes: int) -> int:
    declared = section.get("mamba_ssm_cache_dtype", section.get("mamba_ssm_dtype"))
    if isinstance(declared, str) and declared in _WIDTHS:
        return _WIDTHS[declared]
    return 4 if section.get("model_type") == "nemotron_h" else dtype_bytes
