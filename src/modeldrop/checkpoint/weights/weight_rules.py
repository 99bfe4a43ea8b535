"""Weights held against config.json, by rules that need no per-architecture table.

transformers and vLLM refuse (or silently misload) a checkpoint whose tensors disagree with its
config: vLLM's strict loader reports "Following weights were not initialized from checkpoint" for a
missing tensor, its weight loaders assert sizes, and an unknown name has no parameter to load into.
What can be judged from the weights and the config alone:
- the token embedding is vocab_size x hidden_size, and the untied head is there and as large;
- decoder layers are numbered 0..num_hidden_layers-1 (MTP layers past them where the config has them);
- layers of one kind (layer_types, per_layer_config) hold the same tensors with the same shapes;
- the experts of a layer hold the same tensors as each other.
Layers of another kind (dense and MoE layers of DeepSeek, Llama-4's interleave, cross-attention
layers) differ by many tensors and are never compared: only a difference of a few tensors between
layers that are otherwise alike is a fault.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from modeldrop.checkpoint.weights.model_dims import MAX_LAYERS, text_section
from modeldrop.contracts.models import Finding

# A decoder stack's layers: `<prefix>.<layers|h|blocks|layer>.<i>.<rest>`.
# The first layer list of a name is its stack (lazy): a list nested inside a layer (block.N in layers.M) is not.
_LAYER = re.compile(r"^(?P<prefix>(?:.*?\.)?(?:layers|h|blocks|block|layer))\.(?P<index>\d{1,5})\.(?P<rest>.+)$")
_EXPERT = re.compile(r"(?P<head>(?:^|.*\.)experts)\.(?P<index>\d{1,5})\.(?P<rest>.+)$")
_TOWERS = ("vision", "visual", "audio", "image", "vit", "mm_projector", "multi_modal", "speech", "encoder")
_EMBEDDINGS = (
    "embed_tokens.weight",
    "wte.weight",
    "embed_in.weight",
    "word_embeddings.weight",
    "backbone.embeddings.weight",
)
_HEADS = ("lm_head.weight", "embed_out.weight", ".output_layer.weight")
FEW = 4  # layers alike but for at most this many tensors are the same kind of layer, one of them damaged
_FIX = "re-save the model with save_pretrained from the trained weights (or restore the file from the training run)"


def _error(code: str, message: str, hint: str = _FIX) -> Finding:
    return Finding(code=code, severity="error", message=message, hint=hint)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _is_tower(name: str) -> bool:
    head = name.split(".layers.", 1)[0].split(".h.", 1)[0]
    return any(t in head for t in _TOWERS)


def weight_findings(
    config: dict[str, Any], shapes: Mapping[str, tuple[int, ...]], skip_layers: frozenset[int] = frozenset()
) -> list[Finding]:
    """Findings for SHAPES (tensor name -> shape) against CONFIG; SKIP_LAYERS (KV-shared layers, judged
    by their own rule) are left out of the layer comparison."""
    if not shapes or not config:
        return []
    section = text_section(config)
    findings = list(_embedding(section, shapes))
    # transformers 5 ties a composite model's head by its top-level flag (Mistral 3 saves none when it is
    # true, whatever text_config says): either flag true means no head is expected.
    findings += [] if _tied(config) else _head(section, shapes)
    stacks = _stacks(shapes)
    decoder = _decoder(stacks)
    if decoder is not None:
        findings += _layer_count(section, decoder, stacks[decoder])
    for prefix, layers in stacks.items():
        kinds = _layer_kinds(section) if prefix == decoder else {}
        sized_per_layer = prefix == decoder and _sized_per_layer(section)
        findings += _alike(prefix, layers, kinds, skip_layers if prefix == decoder else frozenset(), sized_per_layer)
        findings += _experts(prefix, layers)
    if decoder is not None:
        findings += expert_count_findings(section, decoder, stacks[decoder])
    findings += _switched(config, shapes)
    return findings[:20]


# Tensors an engine builds a parameter for only when a config.json switch says so: (architectures, tensor
# suffix, key, value). vLLM's DeepSeek-V2/V3 MoE gate has e_score_correction_bias only with
# topk_method "noaux_tc" (0.26-0.32 alike); transformers 5 saves the tensor whatever the config says,
# and vLLM's load_weights then fails on it (KeyError).
SWITCHED_TENSORS = (
    (frozenset({"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"}), ".mlp.gate.e_score_correction_bias",
     "topk_method", "noaux_tc"),
)  # fmt: skip


def _switched(config: dict[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Iterable[Finding]:
    architectures = set(config.get("architectures") or []) if isinstance(config.get("architectures"), list) else set()
    for archs, suffix, key, value in SWITCHED_TENSORS:
        if not archs & architectures or text_section(config).get(key) == value:
            continue
        found = sorted(n for n in shapes if n.endswith(suffix))
        if found:
            has = text_section(config).get(key)
            yield Finding(code="WEIGHTS_UNEXPECTED", severity="error",
                          message=f"{len(found)} tensors like {found[0]} that the engine builds only when config.json "
                          f"has {key} {value!r} (it has {has!r}): vLLM's load fails on them",
                          hint=f"set {key} to {value!r} as the model was trained (or drop the tensors)")  # fmt: skip


def _embedding(section: dict[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Iterable[Finding]:
    vocab = _int(section.get("vocab_size"))
    hidden = _int(
        section.get("word_embed_proj_dim")  # OPT-350m projects a narrower embedding
        or section.get("embedding_size")
        or section.get("hidden_size")
        or section.get("n_embd")
    )
    for name, shape in shapes.items():
        if not name.endswith(_EMBEDDINGS) or _is_tower(name) or len(shape) != 2:
            continue
        if vocab and shape[0] != vocab:
            yield _error(
                "WEIGHTS_CONFIG_MISMATCH",
                f"{name} has {shape[0]} rows but config.json says vocab_size {vocab}: the engines size the "
                "embedding from the config and refuse (or misload) the weights",
                "save config.json with the model it was trained with (resize_token_embeddings updates both)",
            )
        if hidden and shape[1] != hidden:
            yield _error(
                "WEIGHTS_CONFIG_MISMATCH",
                f"{name} is {shape[1]} wide but config.json says hidden_size {hidden}",
                "save config.json with the model it was trained with",
            )
        return


def _tied(section: dict[str, Any]) -> bool | None:
    value = section.get("tie_word_embeddings")
    return value if isinstance(value, bool) else None


def _head(section: dict[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> Iterable[Finding]:
    if _tied(section) is not False:
        return
    heads = any(name.endswith(_HEADS) or name == "output.weight" for name in shapes)
    if any(name.endswith(_EMBEDDINGS) for name in shapes) and not heads:
        yield _error(
            "WEIGHTS_MISSING",
            "config.json says tie_word_embeddings: false but the checkpoint has no output head (lm_head.weight or "
            "embed_out.weight): the engines would leave it uninitialized",
            _FIX,
        )


def _stacks(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, dict[int, dict[str, tuple[int, ...]]]]:
    """prefix -> layer index -> (the name after the index -> shape)."""
    stacks: dict[str, dict[int, dict[str, tuple[int, ...]]]] = defaultdict(lambda: defaultdict(dict))
    rests: dict[str, str] = {}  # one string per name within a layer, not one per tensor (12 MB at 150k)
    for name, shape in shapes.items():
        match = _LAYER.match(name)
        if match is not None:
            rest = match["rest"]
            stacks[match["prefix"]][int(match["index"])][rests.setdefault(rest, rest)] = shape
    return {prefix: dict(layers) for prefix, layers in stacks.items()}


def _decoder(stacks: dict[str, dict[int, dict[str, tuple[int, ...]]]]) -> str | None:
    """The language model's stack: the largest one that is not a vision/audio tower."""
    candidates = [(sum(len(t) for t in layers.values()), p) for p, layers in stacks.items() if not _is_tower(p + ".")]
    return max(candidates)[1] if candidates else None


def _layer_count(section: dict[str, Any], prefix: str, layers: dict[int, Any]) -> Iterable[Finding]:
    expected = next(
        (_int(section.get(k)) for k in ("num_hidden_layers", "n_layer", "num_layers") if k in section), None
    )
    if not expected or expected > MAX_LAYERS:
        return
    extra_allowed = _int(section.get("num_nextn_predict_layers")) or 0  # DeepSeek's MTP layers follow the decoder
    missing = [i for i in range(expected) if i not in layers]
    beyond = sorted(i for i in layers if i >= expected + extra_allowed)
    if missing:
        shown = ", ".join(str(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        yield _error(
            "WEIGHTS_MISSING",
            f"config.json has num_hidden_layers {expected} but {prefix} has no weights for layer(s) {shown}",
            "save config.json with the model it was trained with, or restore the missing shards",
        )
    if beyond:
        yield _error(
            "WEIGHTS_UNEXPECTED",
            f"{prefix} has weights for layer {beyond[0]} but config.json has num_hidden_layers {expected}: the "
            "engines have no parameter to load them into",
            "save config.json with the model it was trained with",
        )


def _layer_kinds(section: dict[str, Any]) -> dict[int, str]:
    """Each layer's kind where the config says layers differ (layer_types, per_layer_config)."""
    kinds: dict[int, str] = {}
    types = section.get("layer_types")
    if isinstance(types, list):
        kinds = {i: str(t) for i, t in enumerate(types[:MAX_LAYERS])}
    overrides = section.get("per_layer_config")
    if isinstance(overrides, dict):
        for key, value in list(overrides.items())[:MAX_LAYERS]:
            if str(key).isdigit():
                index = int(key)
                kinds[index] = kinds.get(index, "") + json.dumps(value, sort_keys=True, default=str)
    return kinds


def _sized_per_layer(section: dict[str, Any]) -> bool:
    """Whether the config gives sizes per layer (Gemma-3n's intermediate_size list): shapes may differ."""
    return any(isinstance(section.get(k), list) for k in ("intermediate_size", "num_key_value_heads", "head_dim"))


def _signature(tensors: dict[str, tuple[int, ...]]) -> frozenset[tuple[str, tuple[int, ...]]]:
    return frozenset(tensors.items())


def _alike(
    prefix: str,
    layers: dict[int, dict[str, tuple[int, ...]]],
    kinds: dict[int, str],
    skip: frozenset[int],
    sized_per_layer: bool = False,
) -> Iterable[Finding]:
    groups: dict[str, list[int]] = defaultdict(list)
    for index in sorted(layers):
        if index not in skip:
            groups[kinds.get(index, "")].append(index)
    for members in groups.values():
        if len(members) < 2:
            continue
        counts = Counter(_signature(layers[i]) for i in members)
        # The reference: the commonest signature; on a tie the larger set (a dropped tensor shrinks a layer).
        reference, _n = max(counts.items(), key=lambda kv: (kv[1], len(kv[0])))
        names = {n: s for n, s in reference}
        for index in members:
            own = layers[index]
            if _signature(own) == reference:
                continue
            missing = sorted(set(names) - set(own))
            extra = sorted(set(own) - set(names))
            reshaped = sorted(n for n in set(own) & set(names) if own[n] != names[n])
            if len(missing) + len(extra) > FEW or (sized_per_layer and not missing and not extra):
                continue  # another kind of layer (dense next to MoE, cross-attention...), not a damaged one
            yield _layer_fault(prefix, index, missing, extra, reshaped, own, names)


def _layer_fault(
    prefix: str,
    index: int,
    missing: list[str],
    extra: list[str],
    reshaped: list[str],
    own: dict[str, tuple[int, ...]],
    names: dict[str, tuple[int, ...]],
) -> Finding:
    where = f"{prefix}.{index}"
    if missing and not extra:
        return _error("WEIGHTS_MISSING", f"{where} lacks {', '.join(missing[:3])}, which the other layers like it have")
    if extra and not missing:
        return _error("WEIGHTS_UNEXPECTED", f"{where} has {', '.join(extra[:3])}, which no other layer like it has")
    if missing:
        return _error(
            "WEIGHTS_UNEXPECTED",
            f"{where} has {', '.join(extra[:3])} where the other layers like it have {', '.join(missing[:3])} "
            "(a renamed tensor: the engines have no parameter of that name)",
        )
    first = reshaped[0]
    return _error(
        "WEIGHTS_SHAPE_MISMATCH",
        f"{where}.{first} is {list(own[first])} where the other layers like it have {list(names[first])}: the "
        "engines' weight loaders assert each tensor's size",
    )


def _experts(prefix: str, layers: dict[int, dict[str, tuple[int, ...]]]) -> Iterable[Finding]:
    for index, tensors in sorted(layers.items()):
        experts: dict[tuple[str, int], dict[str, tuple[int, ...]]] = defaultdict(dict)
        for rest, shape in tensors.items():
            match = _EXPERT.match(rest)
            if match is not None:
                experts[(match["head"], int(match["index"]))][match["rest"]] = shape
        by_head: dict[str, list[int]] = defaultdict(list)
        for head, expert in experts:
            by_head[head].append(expert)
        for head, indices in by_head.items():
            counts = Counter(frozenset(experts[(head, e)].items()) for e in indices)
            reference = dict(max(counts.items(), key=lambda kv: (kv[1], len(kv[0])))[0])
            for expert in sorted(indices):
                own = experts[(head, expert)]
                missing = sorted(set(reference) - set(own))
                if missing or own != reference:
                    what = f"lacks {', '.join(missing[:3])}" if missing else "differs in its tensors or shapes"
                    yield _error(
                        "WEIGHTS_MISSING" if missing else "WEIGHTS_SHAPE_MISMATCH",
                        f"{prefix}.{index}.{head}.{expert} {what}, unlike the layer's other experts",
                    )
                    return


# Where a config says how many routed experts a MoE layer holds (the text section's; DBRX's in ffn_config).
EXPERT_COUNT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts", "moe_num_experts")
# A fused expert tensor: one tensor for all of a layer's experts, the expert first (transformers 5's
# `experts.gate_up_proj`, GPT-OSS's `_blocks`/`_scales`, GraniteMoE's and JetMoE's `input_linear`).
_FUSED = re.compile(r"(?:^|.*\.)(?:experts\.[^.]+|(?:input|output)_linear(?:\.weight)?)$")
_FIX_EXPERTS = (
    "re-save the model with save_pretrained from the trained weights (every expert of every MoE layer), or, if "
    "experts were pruned on purpose, set the config's expert count and the router to what the checkpoint holds"
)


def expert_count(section: dict[str, Any]) -> tuple[str, int] | None:
    """(the config key, the routed experts a MoE layer holds) where the config says, 2 or more."""
    ffn = section.get("ffn_config")
    sources = [*((k, section.get(k)) for k in EXPERT_COUNT_KEYS), ("ffn_config.moe_num_experts",
               ffn.get("moe_num_experts") if isinstance(ffn, dict) else None)]  # fmt: skip
    return next(((k, v) for k, v in sources if (n := _int(v)) is not None and n >= 2 and n == v), None)


def _layer_experts(tensors: dict[str, tuple[int, ...]]) -> tuple[dict[str, set[int]], dict[str, int]]:
    """A layer's expert ids by module (`mlp.experts`), and its fused expert tensors' expert dimension."""
    indexed: dict[str, set[int]] = defaultdict(set)
    fused: dict[str, int] = {}
    for rest, shape in tensors.items():
        if "experts" in rest.split(".") and not _EXPERT.match(rest) and not (len(shape) >= 3 and _FUSED.match(rest)):
            fused.setdefault("", 0)  # experts in a layout not counted here (DBRX's 2-D experts.mlp.w1): present
        match = _EXPERT.match(rest)
        if match is not None:
            indexed[match["head"]].add(int(match["index"]))
        elif len(shape) >= 3 and _FUSED.match(rest):
            fused[rest] = shape[0]
    return indexed, fused


def expert_count_findings(
    section: dict[str, Any], prefix: str, layers: dict[int, dict[str, tuple[int, ...]]]
) -> list[Finding]:
    """Every MoE layer holds the experts the config says. vLLM's fused-MoE parameters hold all of a layer's
    experts in one tensor, so its strict check cannot see a missing expert: the engine would serve
    uninitialized weights for it. Stricter than the engine on purpose."""
    counted = expert_count(section)
    if counted is None:
        return []
    key, count = counted
    faults: dict[str, list[int]] = defaultdict(list)  # what is wrong -> the layers it is wrong in
    any_experts = False
    for index, tensors in sorted(layers.items()):
        indexed, fused = _layer_experts(tensors)
        any_experts = any_experts or bool(indexed or fused)
        for head, ids in sorted(indexed.items()):
            missing = sorted(set(range(count)) - ids)
            if missing:
                faults[f"{head} has no weights for expert {_ids(missing)} of the {count} ({key})"].append(index)
            if beyond := sorted(i for i in ids if i >= count):
                faults[f"{head} has weights for expert {_ids(beyond)} past the {count} ({key})"].append(index)
        for rest, experts in sorted(fused.items()):
            if rest and experts != count:
                faults[f"{rest} holds {experts} experts where {key} says {count}"].append(index)
    findings = [
        _error("WEIGHTS_MISSING" if "no weights" in what or "holds" in what else "WEIGHTS_UNEXPECTED",
               f"{prefix}.{where[0]}.{what}{_more_layers(where)}: vLLM's fused-MoE layer holds every expert in one "
               "parameter, so the engine cannot see the gap and would serve uninitialized weights for it",
               _FIX_EXPERTS)
        for what, where in faults.items()
    ]  # fmt: skip
    if not any_experts and layers and not _no_moe_layer(section):
        findings.append(_error(
            "WEIGHTS_MISSING",
            f"config.json says {count} experts a MoE layer ({key}) but no layer of {prefix} has expert weights",
            _FIX_EXPERTS,
        ))  # fmt: skip
    return findings[:5]


def _no_moe_layer(section: dict[str, Any]) -> bool:
    """The config's own list of layer kinds names no MoE layer: transformers writes an expert count into every
    Nemotron-H config, dense ones too (its layers_block_type, or the hybrid_override_pattern's `E`, says)."""
    kinds = section.get("layers_block_type")
    if isinstance(kinds, list) and kinds and all(isinstance(k, str) for k in kinds):
        return not any(k.lower() in ("moe", "e") for k in kinds)
    pattern = section.get("hybrid_override_pattern")
    return isinstance(pattern, str) and bool(pattern) and "E" not in pattern


def _ids(ids: list[int]) -> str:
    return ", ".join(str(i) for i in ids[:6]) + (f" and {len(ids) - 6} more" if len(ids) > 6 else "")


def _more_layers(layers: list[int]) -> str:
    if len(layers) < 2:
        return ""
    return f" (and in {len(layers) - 1} more layer{'s' if len(layers) > 2 else ''}: {_ids(layers[1:])})"
