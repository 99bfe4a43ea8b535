"""Per-architecture checks, kept as data: a registry that grows.

Gemma-4 E-series share KV: the last ``num_kv_shared_layers`` layers reuse earlier layers' KV, so
transformers never creates their k_proj / v_proj / k_norm and ``save_pretrained`` drops them
(E4B: 18 layers x 3 = 54 tensors). vLLM registers them on every layer and refuses to load:
"Following weights were not initialized from checkpoint: ...layers.24...k_norm".
"""

from __future__ import annotations

from dataclasses import dataclass

# Where each architecture family keeps its decoder layers, most specific first.
LAYER_PREFIXES = (
    "model.language_model.layers.",
    "language_model.model.layers.",
    "model.layers.",
)


@dataclass(frozen=True)
class KvSharedRule:
    model_types: frozenset[str]
    per_layer: tuple[str, ...]
    # Layers whose v_proj transformers does not create (K doubles as V on full-attention layers).
    v_proj_skipped_when_k_eq_v: bool = True

    def applies(self, model_type: str | None) -> bool:
        return model_type in self.model_types


KV_SHARED_RULES: tuple[KvSharedRule, ...] = (
    KvSharedRule(
        model_types=frozenset({"gemma4", "gemma4_text", "gemma3n", "gemma3n_text"}),
        per_layer=("self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.k_norm.weight"),
    ),
)


def rule_for(model_type: str | None) -> KvSharedRule | None:
    return next((r for r in KV_SHARED_RULES if r.applies(model_type)), None)


def layer_prefix(tensor_names: set[str]) -> str:
    for prefix in LAYER_PREFIXES:
        if any(n.startswith(prefix) for n in tensor_names):
            return prefix
    return LAYER_PREFIXES[-1]


def expected_kv_tensors(
    rule: KvSharedRule,
    prefix: str,
    num_hidden_layers: int,
    num_kv_shared_layers: int,
    layer_types: list[str] | None,
    k_eq_v: bool,
) -> list[str]:
    first_shared = num_hidden_layers - num_kv_shared_layers
    names = []
    for layer in range(first_shared, num_hidden_layers):
        full = bool(layer_types and layer < len(layer_types) and layer_types[layer] == "full_attention")
        for suffix in rule.per_layer:
            if suffix.startswith("self_attn.v_proj") and k_eq_v and full and rule.v_proj_skipped_when_k_eq_v:
                continue
            names.append(f"{prefix}{layer}.{suffix}")
    return names
