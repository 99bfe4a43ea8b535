"""A Llama checkpoint the real vLLM serves on these CPUs, whose greedy answers are written into its
weights, and a PEFT LoRA adapter that changes them -- so a run with the real engine can be judged.

Why crafted and not random: random weights never say EOS, so every answer would be cut at max_tokens
(finish_reason "length") and the truncation gate would fail the run; a test could not tell the engine
from the pipeline. Here attention and the MLP add nothing (o_proj and down_proj are zero), so each
position's next token depends on its own token only: a one-hot embedding, RMSNorm, and an untied head
that maps 'a'->'b'->...->'z'->EOS and every other token to 'a'. Every answer of the base is
"abcdefghijklmnopqrstuvwxyz" and stops (finish_reason "stop"). The adapter is a rank-1 LoRA on layer
0's down_proj that lifts ':' (the chat template's last token) to 'A', whose chain runs 'A'..'Z' to EOS:
its answers are the uppercase alphabet. Float32 (bfloat16 traps on this host's AMX path) and a head
size of 32 (the CPU attention takes 32-512).
"""

from __future__ import annotations

import json
import string
import struct
from array import array
from pathlib import Path
from typing import Any

HIDDEN, INTERMEDIATE, LAYERS, HEADS, KV_HEADS = 64, 128, 2, 2, 1
SPECIAL = ["<unk>", "<s>", "</s>"]
CHARS = list(string.ascii_lowercase) + list(string.ascii_uppercase) + [":", " ", "\n", ".", ",", "?", "'"]
VOCAB = SPECIAL + CHARS  # 62 tokens: one-hot in the 64-wide hidden state
EOS = 2
LIFT = len(VOCAB)  # a coordinate no token's embedding uses: the head reads it as 'A' (the adapter's way in)
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}"
    "assistant:{% endif %}"
)
BASE_ANSWER = string.ascii_lowercase
ADAPTER_ANSWER = string.ascii_uppercase


def _id(token: str) -> int:
    return VOCAB.index(token)


def _successor(token: str) -> int:
    for alphabet in (string.ascii_lowercase, string.ascii_uppercase):
        if token in alphabet:
            i = alphabet.index(token)
            return _id(alphabet[i + 1]) if i + 1 < len(alphabet) else EOS
    return _id("a")


def _matrix(rows: int, cols: int, cells: dict[tuple[int, int], float] | None = None) -> list[float]:
    values = [0.0] * (rows * cols)
    for (r, c), v in (cells or {}).items():
        values[r * cols + c] = v
    return values


def safetensors_f32(tensors: dict[str, tuple[list[int], list[float]]], metadata: dict[str, str]) -> bytes:
    header: dict[str, Any] = {}
    blobs, offset = [], 0
    for name in sorted(tensors):
        shape, values = tensors[name]
        blob = array("f", values).tobytes()
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"".join(blobs)


def _weights() -> dict[str, tuple[list[int], list[float]]]:
    vocab, head_dim = len(VOCAB), HIDDEN // HEADS
    successors = {(_successor(VOCAB[t]), t): 10.0 for t in range(vocab)}
    tensors: dict[str, tuple[list[int], list[float]]] = {
        "model.embed_tokens.weight": ([vocab, HIDDEN], _matrix(vocab, HIDDEN, {(t, t): 1.0 for t in range(vocab)})),
        "model.norm.weight": ([HIDDEN], [1.0] * HIDDEN),
        # Row s(t) reads coordinate t: the head maps each token to its successor.
        "lm_head.weight": ([vocab, HIDDEN], _matrix(vocab, HIDDEN, {**successors, (_id("A"), LIFT): 10.0})),
    }
    eye = {(i, i): 1.0 for i in range(HIDDEN)}
    for layer in range(LAYERS):
        p = f"model.layers.{layer}."
        tensors |= {
            p + "input_layernorm.weight": ([HIDDEN], [1.0] * HIDDEN),
            p + "post_attention_layernorm.weight": ([HIDDEN], [1.0] * HIDDEN),
            p + "self_attn.q_proj.weight": ([HEADS * head_dim, HIDDEN], _matrix(HEADS * head_dim, HIDDEN, eye)),
            p + "self_attn.k_proj.weight": ([KV_HEADS * head_dim, HIDDEN], _matrix(KV_HEADS * head_dim, HIDDEN)),
            p + "self_attn.v_proj.weight": ([KV_HEADS * head_dim, HIDDEN], _matrix(KV_HEADS * head_dim, HIDDEN)),
            p + "self_attn.o_proj.weight": ([HIDDEN, HEADS * head_dim], _matrix(HIDDEN, HEADS * head_dim)),
            # gate and up pass the one-hot through (silu(8 x 4) x 8 at the token's coordinate) for the
            # adapter's down_proj to read; down_proj itself is zero, so the base's MLP adds nothing.
            p + "mlp.gate_proj.weight": ([INTERMEDIATE, HIDDEN], _matrix(INTERMEDIATE, HIDDEN, {k: 4.0 for k in eye})),
            p + "mlp.up_proj.weight": ([INTERMEDIATE, HIDDEN], _matrix(INTERMEDIATE, HIDDEN, eye)),
            p + "mlp.down_proj.weight": ([HIDDEN, INTERMEDIATE], _matrix(HIDDEN, INTERMEDIATE)),
        }
    return tensors


def write_cpu_checkpoint(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(VOCAB),
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": EOS,
        "pad_token_id": 0,
        "torch_dtype": "float32",
        "rope_theta": 10000.0,
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    (directory / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": EOS, "pad_token_id": 0, "do_sample": False})
    )
    (directory / "model.safetensors").write_bytes(safetensors_f32(_weights(), {"format": "pt"}))
    tokenizer = {
        "version": "1.0",
        "added_tokens": [
            {"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
             "special": True}
            for i, t in enumerate(SPECIAL)
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"String": ""}, "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": {t: i for i, t in enumerate(VOCAB)}, "unk_token": "<unk>"},
    }  # fmt: skip
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    (directory / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "pad_token": "<unk>",
                "model_max_length": 1024,
            }
        )
    )
    (directory / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return directory


def write_cpu_adapter(directory: Path, r: int = 8) -> Path:
    """A PEFT LoRA (rank R, one live direction) on layer 0's down_proj: at ':' it writes 64 into the
    spare coordinate LIFT, which the head reads as 'A'; the base never touches that coordinate."""
    directory.mkdir(parents=True, exist_ok=True)
    # down_proj's input at ':' is silu(8 x 4) x 8 ~ 256 on coordinate ':'; B.A scales it into LIFT.
    a = _matrix(r, INTERMEDIATE, {(0, _id(":")): 1.0})
    b = _matrix(HIDDEN, r, {(LIFT, 0): 0.25})
    prefix = "base_model.model.model.layers.0.mlp.down_proj."
    tensors = {prefix + "lora_A.weight": ([r, INTERMEDIATE], a), prefix + "lora_B.weight": ([HIDDEN, r], b)}
    (directory / "adapter_model.safetensors").write_bytes(safetensors_f32(tensors, {"format": "pt"}))
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": r,
        "lora_alpha": r,
        "lora_dropout": 0.0,
        "target_modules": ["down_proj"],
        "bias": "none",
        "base_model_name_or_path": "modeldrop/cpu-llama",
        "fan_in_fan_out": False,
        "inference_mode": True,
    }
    (directory / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return directory
