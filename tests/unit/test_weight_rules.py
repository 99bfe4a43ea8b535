"""Weights against config.json, on the tensor names and shapes transformers' save_pretrained writes for
37 architectures (tests/fixtures/arch-shapes.json, from tools/gen_arch_checkpoints.py): every intact
one passes, and each fault users meet is refused naming the tensor."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from modeldrop.checkpoint.weights.weight_rules import weight_findings

HYBRIDS = ("jamba", "lfm2", "qwen3_next", "falcon_h1", "minimax", "nemotron_h")
FIXTURE = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "arch-shapes.json").read_text())
ARCHS = FIXTURE["architectures"]
_LAYER1 = re.compile(r"\.(layers|h)\.1\.")


def _shapes(arch: str) -> dict[str, tuple[int, ...]]:
    return {n: tuple(s) for n, s in ARCHS[arch]["shapes"].items()}


def _codes(config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> set[str]:
    return {f.code for f in weight_findings(config, shapes)}


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_every_intact_checkpoint_passes(arch: str) -> None:
    assert weight_findings(ARCHS[arch]["config"], _shapes(arch)) == []


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_each_fault_is_refused(arch: str) -> None:
    config, shapes = ARCHS[arch]["config"], _shapes(arch)
    layer_one = sorted(n for n in shapes if _LAYER1.search(n))
    dropped = dict(shapes)
    del dropped[layer_one[0]]
    assert "WEIGHTS_MISSING" in _codes(config, dropped)
    renamed = dict(shapes)
    renamed[layer_one[0] + "_x"] = renamed.pop(layer_one[0])
    codes = _codes(config, renamed)
    # A hybrid's layer 1 may have no peer of its kind to say the new name is foreign: its old name is missing.
    assert "WEIGHTS_UNEXPECTED" in codes or (arch in HYBRIDS and "WEIGHTS_MISSING" in codes), codes
    halved = dict(shapes)
    big = next(n for n in layer_one if len(halved[n]) == 2 and halved[n][0] > 1)
    halved[big] = (halved[big][0] // 2, halved[big][1])
    assert "WEIGHTS_SHAPE_MISMATCH" in _codes(config, halved)
    text = config.get("text_config", config)
    more = copy.deepcopy(config)
    key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in text), None)
    if key is not None:  # Nemotron-H counts its layers by its hybrid_override_pattern
        (more.get("text_config", more))[key] = text[key] + 2
        assert "WEIGHTS_MISSING" in _codes(more, shapes)
    vocab = copy.deepcopy(config)
    (vocab.get("text_config", vocab))["vocab_size"] = text["vocab_size"] + 64
    assert "WEIGHTS_CONFIG_MISMATCH" in _codes(vocab, shapes)


def test_an_expert_missing_a_tensor_in_every_layer_is_refused() -> None:
    shapes = {n: s for n, s in _shapes("mixtral").items() if not re.search(r"experts\.2\.w2\.", n)}
    findings = weight_findings(ARCHS["mixtral"]["config"], shapes)
    assert any("experts.2" in f.message and f.code == "WEIGHTS_MISSING" for f in findings), findings


def test_an_untied_head_that_is_missing_is_refused() -> None:
    shapes = {n: s for n, s in _shapes("gpt_neox").items() if n != "embed_out.weight"}
    assert ARCHS["gpt_neox"]["config"]["tie_word_embeddings"] is False
    assert "WEIGHTS_MISSING" in _codes(ARCHS["gpt_neox"]["config"], shapes)


def test_dense_and_moe_layers_side_by_side_are_two_kinds_not_a_fault() -> None:
    config, shapes = ARCHS["deepseek_v3"]["config"], _shapes("deepseek_v3")
    assert config["first_k_dense_replace"] == 1 and any(".layers.0.mlp.gate_proj" in n for n in shapes)
    assert weight_findings(config, shapes) == []


def test_a_list_nested_inside_a_layer_is_not_counted_as_layers() -> None:
    """model.layers.0.block.3: the stack is `model.layers` (one layer), `block` a list inside it."""
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1}
    shapes = {f"model.layers.0.block.{t}.weight": (8, 4096) for t in range(4)}
    assert not [f for f in weight_findings(config, shapes) if f.code == "WEIGHTS_UNEXPECTED"]
    shapes["model.layers.1.block.0.weight"] = (8, 4096)
    assert "WEIGHTS_UNEXPECTED" in {f.code for f in weight_findings(config, shapes)}


def test_a_tensor_the_engine_builds_only_behind_a_config_switch() -> None:
    """DeepSeek-V3's gate correction bias: vLLM builds it only with topk_method noaux_tc (its load fails on the
    tensor otherwise, as the engine oracle showed on transformers' default config)."""
    arch = ARCHS["deepseek_v3"]
    shapes = {name: tuple(shape) for name, shape in arch["shapes"].items()}
    assert weight_findings(arch["config"], shapes) == []
    switched_off = {**arch["config"], "topk_method": None}
    [finding] = weight_findings(switched_off, shapes)
    assert finding.code == "WEIGHTS_UNEXPECTED" and "topk_method 'noaux_tc'" in finding.message
    unbiased = {n: s for n, s in shapes.items() if not n.endswith("e_score_correction_bias")}
    assert weight_findings(switched_off, unbiased) == []


MOE = sorted(a for a in ARCHS if re.search(r"experts\.|_linear", " ".join(ARCHS[a]["shapes"])) and a != "qwen3_next")
_EXPERT_ID = re.compile(r"^(?P<layer>.*?\.(?:layers|h)\.(?P<index>\d+))\..*experts\.(?P<expert>\d+)\.")


@pytest.mark.parametrize("arch", MOE)
def test_a_moe_layer_without_one_expert_is_refused_naming_the_layer_and_the_expert(arch: str) -> None:
    config, shapes = ARCHS[arch]["config"], _shapes(arch)
    indexed = [m for n in shapes if (m := _EXPERT_ID.match(n))]
    if indexed:  # the per-expert layout: every tensor of expert 1 of the last MoE layer gone
        last = max(int(m["index"]) for m in indexed)
        layer = next(m["layer"] for m in indexed if int(m["index"]) == last)
        cut = {n: s for n, s in shapes.items() if not (n.startswith(layer + ".") and ".experts.1." in n)}
        needle = f"{layer}."
    else:  # the fused layout: one tensor per layer for all experts, the expert first
        layer, name = next(
            (n.rsplit(".experts.", 1)[0], n) for n, s in shapes.items() if ".experts." in n and len(s) >= 3
        )
        cut = {**shapes, name: (shapes[name][0] - 1, *shapes[name][1:])}
        needle = layer
    assert cut != shapes
    found = [f for f in weight_findings(config, cut) if f.code == "WEIGHTS_MISSING" and needle in f.message]
    assert found, weight_findings(config, cut)
    assert "expert" in found[0].message and (not indexed or "expert 1 " in found[0].message), found[0].message


@pytest.mark.parametrize("arch", MOE)
def test_a_moe_checkpoint_with_no_expert_weights_is_refused(arch: str) -> None:
    config, shapes = ARCHS[arch]["config"], _shapes(arch)
    bare = {n: s for n, s in shapes.items() if ".experts." not in n}
    assert "WEIGHTS_MISSING" in _codes(config, bare)


def test_experts_past_the_configs_count_are_unexpected() -> None:
    config = copy.deepcopy(ARCHS["mixtral"]["config"])
    config["num_local_experts"] -= 1
    found = [f for f in weight_findings(config, _shapes("mixtral")) if f.code == "WEIGHTS_UNEXPECTED"]
    assert found and "past the" in found[0].message, weight_findings(config, _shapes("mixtral"))


def test_experts_in_a_layout_the_count_cannot_read_are_not_taken_for_none() -> None:
    """DBRX keeps all of a layer's experts in 2-D `ffn.experts.mlp.w1` tensors (experts x rows): present,
    not countable by id or first dimension -- never "no expert weights"."""
    config = {"architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 32, "n_layers": 2,
              "vocab_size": 64, "ffn_config": {"moe_num_experts": 4, "ffn_hidden_size": 16}}  # fmt: skip
    shapes = {"transformer.wte.weight": (64, 32), "lm_head.weight": (64, 32)}
    for i in range(2):
        for w in ("w1", "v1", "w2"):
            shapes[f"transformer.blocks.{i}.ffn.experts.mlp.{w}"] = (4 * 16, 32)
        shapes[f"transformer.blocks.{i}.ffn.router.layer.weight"] = (4, 32)
    assert [f for f in weight_findings(config, shapes) if "expert" in f.message] == []
    bare = {n: s for n, s in shapes.items() if ".experts." not in n}
    assert any("no layer" in f.message for f in weight_findings(config, bare) if f.code == "WEIGHTS_MISSING")


def test_a_dense_nemotron_h_with_the_expert_count_transformers_writes_is_not_refused() -> None:
    """transformers writes n_routed_experts into every Nemotron-H config; its layer kinds say whether any
    layer is a MoE one. No MoE layer: no experts to ask for. A MoE layer without expert weights: refused."""
    config = {"model_type": "nemotron_h", "n_routed_experts": 4, "num_hidden_layers": 2,
              "layers_block_type": ["mamba", "mlp"]}  # fmt: skip
    from modeldrop.checkpoint.weights.weight_rules import expert_count_findings

    layers = {0: {"mixer.in_proj.weight": (8, 4)}, 1: {"mixer.up_proj.weight": (8, 4)}}
    assert expert_count_findings(config, "backbone.layers", layers) == []
    moe = {**config, "layers_block_type": ["mamba", "moe"]}
    assert [f.code for f in expert_count_findings(moe, "backbone.layers", layers)] == ["WEIGHTS_MISSING"]


def test_a_vision_tower_cut_short_or_without_its_patch_embedding_is_refused() -> None:
    """The engine's multimodal classes cannot be built on this CPU (no torchvision for its torch), so the tower
    is held to its config statically: names as transformers saves LLaVA (CLIP) and Qwen2-VL towers."""
    from modeldrop.checkpoint.weights.tower_rules import tower_findings

    clip = {"vision_config": {"model_type": "clip_vision_model", "num_hidden_layers": 2}}
    names = ["vision_tower.embeddings.patch_embedding.weight", "vision_tower.embeddings.position_embedding.weight",
             *(f"vision_tower.encoder.layers.{i}.mlp.fc1.weight" for i in range(2))]  # fmt: skip
    assert tower_findings(clip, names) == []
    assert [f.code for f in tower_findings(clip, names[1:])] == ["WEIGHTS_MISSING"]  # no patch embedding
    assert tower_findings({**clip, "vision_feature_layer": -2}, names[:3]) == []  # LLaVA reads layer -2: may be cut
    assert "lacks layer(s) [1]" in tower_findings(clip, names[:3])[0].message
    qwen = {"vision_config": {"model_type": "qwen2_vl_vision", "depth": 3}}
    blocks = ["visual.patch_embed.proj.weight", *(f"visual.blocks.{i}.attn.qkv.weight" for i in (0, 1, 2))]
    assert tower_findings(qwen, blocks) == [] and tower_findings(qwen, blocks[:3])
    timm = {"vision_config": {"model_type": "gemma3n_vision"}}  # a conv stem, no patch embedding: not asked
    assert tower_findings(timm, ["model.vision_tower.timm_model.blocks.0.0.conv.weight"]) == []
    assert tower_findings({"vision_config": None}, names[1:]) == []
