"""A LoRA trained on the dense twin, served on a quantized base: vLLM serves LoRA on GPTQ / AWQ /
compressed-tensors bases, so the adapter is matched to the packed module (`down_proj.qweight`), not
refused for a `down_proj.weight` the base does not have; its shapes are held to the unpacked [out, in]."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from modeldrop.checkpoint.validation import validate_source
from modeldrop.local.samples.cpu_checkpoint import write_cpu_adapter, write_cpu_checkpoint


def _quantized(tmp_path: Path, method: str) -> Path:
    base = write_cpu_checkpoint(tmp_path / method)
    weights = load_file(str(base / "model.safetensors"))
    pack, group = 8, 32  # 4-bit
    for name in [n for n in weights if n.endswith("mlp.down_proj.weight")]:  # every layer's, as GPTQ writes
        module = name[: -len(".weight")]
        out_f, in_f = weights.pop(name).shape
        if method == "gptq":
            weights[f"{module}.qweight"] = np.zeros((in_f // pack, out_f), np.int32)
        else:  # awq packs the output features
            weights[f"{module}.qweight"] = np.zeros((in_f, out_f // pack), np.int32)
        weights[f"{module}.qzeros"] = np.zeros((in_f // group, out_f // pack), np.int32)
        weights[f"{module}.scales"] = np.zeros((in_f // group, out_f), np.float16)
    save_file(weights, str(base / "model.safetensors"), {"format": "pt"})
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": method, "bits": 4, "group_size": group}
    if method == "gptq":
        config["quantization_config"].update(desc_act=False, sym=True)
    (base / "config.json").write_text(json.dumps(config))
    return base


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_an_adapter_on_a_quantized_base_is_matched_by_module(tmp_path: Path, method: str) -> None:
    base = _quantized(tmp_path, method)
    adapter = write_cpu_adapter(tmp_path / "adapter")
    report = validate_source(str(adapter), str(base))
    errors = {f.code: f.message for f in report.findings if f.severity == "error"}
    assert "ADAPTER_TARGET_MISSING" not in errors and report.deployable, errors


def test_an_adapter_for_another_size_is_still_refused_on_a_quantized_base(tmp_path: Path) -> None:
    base = _quantized(tmp_path, "gptq")
    adapter = write_cpu_adapter(tmp_path / "adapter")
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    key = next(k for k in tensors if "lora_A" in k)
    tensors[key] = np.zeros((tensors[key].shape[0], tensors[key].shape[1] * 2), np.float32)
    save_file(tensors, str(adapter / "adapter_model.safetensors"), {"format": "pt"})
    report = validate_source(str(adapter), str(base))
    assert "ADAPTER_SHAPE_MISMATCH" in {f.code for f in report.findings}


def test_repair_drops_a_stale_quantization_config_and_the_copy_passes(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from modeldrop.cli import app

    merged = write_cpu_checkpoint(tmp_path / "merged")  # dense weights, as merge_and_unload writes them
    config = json.loads((merged / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": False}
    (merged / "config.json").write_text(json.dumps(config))
    assert "QUANT_CONFIG_STALE" in {f.code for f in validate_source(str(merged)).findings}
    out = tmp_path / "fixed"
    result = CliRunner().invoke(app, ["repair", str(merged), "--out", str(out), "--drop-stale-quantization", "--json"])
    assert result.exit_code == 0, result.stdout
    data = json.loads(result.stdout)
    assert data["dropped_quantization_config"]["quant_method"] == "gptq" and data["report"]["deployable"]
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    assert "quantization_config" in json.loads((merged / "config.json").read_text())  # the source is untouched
    # A config that is not stale is left alone, with a reason.
    again = CliRunner().invoke(app, ["repair", str(out), "--out", str(tmp_path / "x"), "--drop-stale-quantization"])
    assert again.exit_code == 2 and "not stale" in again.stdout + again.stderr
