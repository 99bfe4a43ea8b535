"""A multimodal checkpoint's vision tower against its config, statically: the engines build the tower the
config describes and load it strictly, but this CPU's engine cannot build multimodal classes (no
torchvision for its torch), so what the tower lacks is judged here.

Two rules, for the tower layouts transformers writes:
- the patch embedding, which the ViT towers start from (CLIP/SigLIP `embeddings.patch_embedding`, Qwen-VL
  `patch_embed`, Pixtral `patch_conv`): such a tower with its layer stack and no patch embedding was cut;
- the tower's layer count where the config says it and nothing cuts the tower short: `depth` (Qwen-VL) or
  `num_hidden_layers` with no `vision_feature_layer` (LLaVA-style models drop the layers after the one they
  read, and so may their checkpoints).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from modeldrop.contracts.models import Finding

# The tower's top: the first name segment that says vision (vision_tower, vision_model, visual, ...).
_TOWER = re.compile(r"^(?P<tower>(?:[^.]+\.)*?(?:vision_tower|vision_model|visual|vision_encoder)[^.]*)\.")
_LAYER = re.compile(r"\.(?:layers|blocks|layer)\.(\d+)\.")
_PATCH = ("patch_embed", "patch_conv")
# Towers whose patch embedding carries one of those names (a timm tower -- Gemma-3n's -- starts from a conv stem).
_PATCHED = ("clip_vision_model", "siglip_vision_model", "siglip2_vision_model", "pixtral", "qwen2_vl_vision",
            "qwen2_5_vl_vision", "idefics3_vision", "intern_vit", "mllama_vision_model")  # fmt: skip
_FIX = "re-save the model with save_pretrained (the whole model: its vision tower too) and upload every shard"


def tower_findings(config: Mapping[str, Any], names: Iterable[str]) -> list[Finding]:
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return []
    towers: dict[str, dict[str, Any]] = {}
    for name in names:
        found = _TOWER.match(name)
        if found is None:
            continue
        tower = towers.setdefault(found["tower"], {"layers": set(), "patch": False})
        rest = name[found.end() :]
        layer = _LAYER.search("." + rest)
        if layer is not None:
            tower["layers"].add(int(layer.group(1)))
        tower["patch"] |= any(p in rest for p in _PATCH)
    if not towers:
        return []
    top, tower = max(towers.items(), key=lambda kv: len(kv[1]["layers"]))
    findings = []
    if tower["layers"] and not tower["patch"] and vision.get("model_type") in _PATCHED:
        findings.append(_missing(f"the vision tower {top} has {len(tower['layers'])} layers but no patch embedding "
                                 "(the tensor every image starts from)"))  # fmt: skip
    expected = _expected_layers(config, vision)
    if expected is not None and tower["layers"] and sorted(tower["layers"]) != list(range(expected)):
        lacking = sorted(set(range(expected)) - tower["layers"])
        if lacking:
            findings.append(_missing(f"the vision tower {top} lacks layer(s) {lacking[:6]} of the {expected} "
                                     "vision_config says"))  # fmt: skip
    return findings


def _expected_layers(config: Mapping[str, Any], vision: dict[str, Any]) -> int | None:
    depth = vision.get("depth")
    if isinstance(depth, int) and not isinstance(depth, bool) and depth > 0:
        return depth
    layers = vision.get("num_hidden_layers")
    cut_short = any(k in config for k in ("vision_feature_layer", "vision_feature_layers", "mm_vision_select_layer"))
    if isinstance(layers, int) and not isinstance(layers, bool) and layers > 0 and not cut_short:
        return layers
    return None


def _missing(message: str) -> Finding:
    return Finding(code="WEIGHTS_MISSING", severity="error", message=f"{message}: the engine refuses to load it",
                   hint=_FIX)  # fmt: skip
