"""Hybrid models (Jamba, Qwen3-Next, Granite-4 hybrid, Falcon-H1, LFM2) planned as vLLM allocates them:
KV per token on the attention layers only, and the recurrent state per sequence of the Mamba /
delta-rule / short-conv layers. The checkpoints are written by transformers' save_pretrained (the
engine venv's); the reference is the built model's own cache spec (engine_probe: get_kv_cache_spec)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modeldrop.checkpoint.archive.artifact_scan import scan_local
from modeldrop.checkpoint.engine.engine_check import probe
from modeldrop.checkpoint.validation import validate_scan
from modeldrop.checkpoint.weights.hybrid_layers import hybrid_layout
from modeldrop.cli import app
from modeldrop.local.samples.cpu_checkpoint import write_cpu_checkpoint
from modeldrop.serving.memory_plan import ModelShape, kv_bytes_per_token

VLLM = os.environ.get("MODELDROP_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not VLLM, reason="set MODELDROP_VLLM_PYTHON (make test sets the engine venv)")

_SMALL = {"hidden_size": 256, "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 512,
          "vocab_size": 512, "max_position_embeddings": 256}  # fmt: skip
HYBRIDS = {
    "jamba": {"num_hidden_layers": 8, "attn_layer_period": 4, "attn_layer_offset": 2, "num_experts": 2,
              "expert_layer_period": 2, "expert_layer_offset": 1},
    "qwen3_next": {"num_hidden_layers": 8, "num_attention_heads": 4, "head_dim": 64, "linear_num_key_heads": 4,
                   "linear_num_value_heads": 8, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
                   "moe_intermediate_size": 128, "num_experts": 4, "num_experts_per_tok": 2},
    "granitemoehybrid": {"num_hidden_layers": 6, "layer_types": ["mamba", "mamba", "attention"] * 2,
                         "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 64, "mamba_n_groups": 1},
    "falcon_h1": {"num_hidden_layers": 4, "mamba_n_heads": 8, "mamba_d_head": 32, "mamba_d_state": 64,
                  "mamba_d_ssm": 256},
    "lfm2": {"num_hidden_layers": 6, "layer_types": ["conv", "conv", "full_attention"] * 2, "conv_dim": 256,
             "conv_L_cache": 3, "block_dim": 256, "block_ff_dim": 512, "block_multiple_of": 256,
             "block_ffn_dim_multiplier": 1.0, "block_auto_adjust_ff_dim": False},
}  # fmt: skip

WRITE = r"""
import json, sys, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM
out, cases = Path(sys.argv[1]), json.loads(sys.argv[2])
for model_type, overrides in cases.items():
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **overrides)).save_pretrained(out / model_type)
"""


@pytest.fixture(scope="module")
def hybrids(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrids")
    cases = {name: {**_SMALL, **own} for name, own in HYBRIDS.items()}
    subprocess.run([str(VLLM), "-c", WRITE, str(root), json.dumps(cases)], check=True, capture_output=True, timeout=600)
    tokenizer = write_cpu_checkpoint(root / "_tokenizer")
    for name in HYBRIDS:
        for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
            shutil.copy(tokenizer / f, root / name / f)
    return {name: root / name for name in HYBRIDS}


@pytest.fixture(scope="module")
def engine(hybrids: dict[str, Path]) -> dict[str, dict[str, object]]:
    assert VLLM is not None
    return {Path(str(line["directory"])).name: line for line in probe(list(hybrids.values()), VLLM)}


def test_hybrids_are_planned_as_the_engine_allocates_them(
    hybrids: dict[str, Path], engine: dict[str, dict[str, object]]
) -> None:
    compared = []
    for name, folder in hybrids.items():
        report = validate_scan(scan_local(str(folder)))
        assert report.deployable, (name, [f.message for f in report.findings if f.severity == "error"])
        if engine[name]["verdict"] != "loads":  # this venv's vLLM refuses it: nothing to hold the plan to
            continue
        shape = ModelShape(weights_gib=0.1, num_hidden_layers=report.num_hidden_layers or 0,
                           num_key_value_heads=report.num_key_value_heads or 0, head_dim=report.head_dim or 0,
                           layer_types=report.layer_types)  # fmt: skip
        full, _sliding = kv_bytes_per_token(shape)
        theirs = float(str(engine[name]["kv_bytes_per_token"]))
        assert abs(full - theirs) <= 0.05 * theirs, (name, full, theirs)
        layout = hybrid_layout(json.loads((folder / "config.json").read_text()))
        assert layout is not None and report.recurrent_state_bytes_per_sequence == layout.state_bytes_per_sequence
        assert layout.state_elements_per_sequence == engine[name]["state_elements_per_sequence"], name
        compared.append(name)
    assert len(compared) >= 4, engine


def test_plan_json_shows_the_kv_and_state_it_planned_with(hybrids: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["plan", str(hybrids["jamba"]), "--json", "--region", "us-east-1",
                                      "--max-num-seqs", "256"])  # fmt: skip
    memory = json.loads(result.stdout)["memory"]
    # Jamba here: 2 attention layers of 8, 2 KV heads of 32 dims, bf16; 6 Mamba layers of conv (512, 3) + ssm (512, 16).
    assert memory["kv_bytes_per_token"] == 2 * 2 * 2 * 32 * 2
    assert memory["state_bytes_per_sequence"] == 6 * (512 * 3 + 512 * 16) * 2
    assert memory["state_gib"] == round(256 * memory["state_bytes_per_sequence"] / 1024**3, 4)
