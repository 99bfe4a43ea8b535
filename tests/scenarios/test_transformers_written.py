"""Checkpoints as transformers 5 (the engine venv's) writes them, for the layouts the hand-made fixtures
missed: Mistral 3 saved with its head tied by the top-level flag (no lm_head, text_config saying false)
and Pixtral's 2-D "axial" rope in its vision tower."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from modeldrop.checkpoint.validation import validate_source
from modeldrop.local.samples.cpu_checkpoint import write_cpu_checkpoint

VLLM = os.environ.get("MODELDROP_VLLM_PYTHON")
pytestmark = pytest.mark.skipif(not VLLM, reason="set MODELDROP_VLLM_PYTHON (transformers is in the engine venv)")

MISTRAL3 = r"""
import sys
from transformers import Mistral3Config, Mistral3ForConditionalGeneration
text = dict(model_type="mistral", hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, tie_word_embeddings=False)
vision = dict(model_type="pixtral", hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              head_dim=16, image_size=64, patch_size=16)
Mistral3ForConditionalGeneration(Mistral3Config(text_config=text, vision_config=vision)).save_pretrained(sys.argv[1])
"""


def test_a_mistral3_checkpoint_as_transformers_saves_it_passes(tmp_path: Path) -> None:
    folder = tmp_path / "mistral3"
    subprocess.run([str(VLLM), "-c", MISTRAL3, str(folder)], check=True, capture_output=True, timeout=600)
    tokenizer = write_cpu_checkpoint(tmp_path / "tok")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(tokenizer / name, folder / name)
    report = validate_source(str(folder))
    assert report.deployable, [(f.code, f.message) for f in report.findings if f.severity == "error"]
