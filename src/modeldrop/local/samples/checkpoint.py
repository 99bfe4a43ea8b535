"""A small but structurally real checkpoint: Gemma-4-style config, real safetensors shards.

Used by `modeldrop run-local` when no artifact is given, and by the tests. Tensor bytes are
deterministic pseudo-random bf16-sized payloads; headers are exactly what safetensors writes.
"""

from __future__ import annotations

import io
import json
import struct
import tarfile
from pathlib import Path
from typing import Any

# Gemma-4's text-only class as transformers 5 saves it (tests/fixtures/gemma4-text-*, written by
# save_pretrained, hold the same fields and tensors): the class vLLM serves from a text checkpoint. The
# multimodal class needs its vision_config, which a text fine-tune has no weights for.
TINY_CONFIG: dict[str, Any] = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "dtype": "bfloat16",
    "vocab_size": 512,
    "vocab_size_per_layer_input": 512,
    "hidden_size": 64,
    "hidden_size_per_layer_input": 16,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_kv_shared_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 4096,
    "sliding_window": 512,
    "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
    # No per-layer overrides: without this key transformers gives full-attention layers a head_dim of 512.
    "per_layer_config": {},
    "rope_parameters": {
        "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0, "rope_type": "proportional"},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"},
    },
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
}


def safetensors_bytes(
    tensors: dict[str, tuple[str, list[int]]], metadata: dict[str, str] | None = None, fill: int = 0
) -> bytes:
    """Serialize tensors (name -> (dtype, shape)) with the exact safetensors layout."""
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "U8": 1}
    header: dict[str, Any] = {}
    offset = 0
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    if metadata:
        header["__metadata__"] = metadata
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # safetensors pads the header to 8 bytes
    data = bytes((fill + i * 31) & 0xFF for i in range(min(offset, 4096))) * (offset // 4096 + 1)
    return struct.pack("<Q", len(raw)) + raw + data[:offset]


def tiny_gemma4_tensors(
    config: dict[str, Any], prefix: str = "model.layers.", drop_kv_shared: bool = False
) -> dict[str, tuple[str, list[int]]]:
    """The tensors transformers' save_pretrained writes for a Gemma-4 text model of CONFIG (its per-layer
    inputs included); DROP_KV_SHARED leaves out the KV-shared layers' k_proj / v_proj / k_norm, as
    transformers does (it never creates them)."""
    text = config.get("text_config", config)
    h, inter = text["hidden_size"], text["intermediate_size"]
    heads, kv_heads, hd = text["num_attention_heads"], text["num_key_value_heads"], text["head_dim"]
    layers = text["num_hidden_layers"]
    per_layer = text.get("hidden_size_per_layer_input") or 0
    first_shared = layers - text.get("num_kv_shared_layers", 0)
    root = prefix.rsplit("layers.", 1)[0]
    tensors: dict[str, tuple[str, list[int]]] = {
        f"{root}embed_tokens.weight": ("BF16", [text["vocab_size"], h]),
        f"{root}norm.weight": ("BF16", [h]),
    }
    if per_layer:
        vocab_per_layer = text.get("vocab_size_per_layer_input") or text["vocab_size"]
        tensors.update(
            {
                f"{root}embed_tokens_per_layer.weight": ("BF16", [vocab_per_layer, layers * per_layer]),
                f"{root}per_layer_model_projection.weight": ("BF16", [layers * per_layer, h]),
                f"{root}per_layer_projection_norm.weight": ("BF16", [per_layer]),
            }
        )
    for i in range(layers):
        p = f"{prefix}{i}."
        tensors.update(
            {
                p + "self_attn.q_proj.weight": ("BF16", [heads * hd, h]),
                p + "self_attn.o_proj.weight": ("BF16", [h, heads * hd]),
                p + "self_attn.q_norm.weight": ("BF16", [hd]),
                p + "mlp.gate_proj.weight": ("BF16", [inter, h]),
                p + "mlp.up_proj.weight": ("BF16", [inter, h]),
                p + "mlp.down_proj.weight": ("BF16", [h, inter]),
                p + "input_layernorm.weight": ("BF16", [h]),
                p + "post_attention_layernorm.weight": ("BF16", [h]),
                p + "pre_feedforward_layernorm.weight": ("BF16", [h]),
                p + "post_feedforward_layernorm.weight": ("BF16", [h]),
                p + "layer_scalar": ("BF16", [1]),
            }
        )
        if per_layer:
            tensors.update(
                {
                    p + "per_layer_input_gate.weight": ("BF16", [per_layer, h]),
                    p + "per_layer_projection.weight": ("BF16", [h, per_layer]),
                    p + "post_per_layer_input_norm.weight": ("BF16", [h]),
                }
            )
        if not (drop_kv_shared and i >= first_shared):
            tensors.update(
                {
                    p + "self_attn.k_proj.weight": ("BF16", [kv_heads * hd, h]),
                    p + "self_attn.v_proj.weight": ("BF16", [kv_heads * hd, h]),
                    p + "self_attn.k_norm.weight": ("BF16", [hd]),
                }
            )
    return tensors


SAMPLE_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
SAMPLE_TOKENIZER = {
    "version": "1.0",
    "added_tokens": [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(SAMPLE_SPECIALS)
    ],
    "model": {
        "type": "WordLevel",
        "vocab": {t: i for i, t in enumerate([*SAMPLE_SPECIALS, *(f"w{n}" for n in range(250))])},
        "unk_token": "<unk>",
    },
}


def write_checkpoint(
    directory: Path,
    *,
    drop_kv_shared: bool = False,
    shards: int = 2,
    drop: tuple[str, ...] = (),
    config: dict[str, Any] | None = None,
    chat_template: bool = True,
) -> Path:
    """Write a sharded checkpoint with index, tokenizer files and chat template (without the tensors
    named in DROP)."""
    config = config or TINY_CONFIG
    directory.mkdir(parents=True, exist_ok=True)
    tensors = tiny_gemma4_tensors(config, drop_kv_shared=drop_kv_shared)
    for name in drop:  # a tensor every engine needs, lost (a bad merge): refused whatever the image
        tensors.pop(name)
    names = sorted(tensors)
    weight_map: dict[str, str] = {}
    for s in range(shards):
        shard_name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        (directory / shard_name).write_bytes(safetensors_bytes(part, {"format": "pt"}, fill=s))
        weight_map.update({n: shard_name for n in part})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}, indent=2)
    )
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    # A chat contract that holds: the tokenizer's <eos> and the template's <end_of_turn> are both stop ids.
    (directory / "generation_config.json").write_text(json.dumps({"do_sample": False, "eos_token_id": [1, 5]}))
    (directory / "tokenizer.json").write_text(json.dumps(SAMPLE_TOKENIZER))
    tok_cfg: dict[str, Any] = {"model_max_length": 4096, "bos_token": "<bos>", "eos_token": "<eos>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    if chat_template:
        (directory / "chat_template.jinja").write_text(
            "{% for m in messages %}<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
            "<start_of_turn>model\n"
        )
    return directory


def tar_gz_bytes(directory: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            tar.add(path, arcname=path.relative_to(directory).as_posix(), recursive=False)
    return buffer.getvalue()


def write_tar_gz(directory: Path, out: Path, compresslevel: int = 1) -> Path:
    """DIRECTORY packed into OUT as it is read: a multi-GB checkpoint never sits in memory. Level 1:
    safetensors weights barely compress, and packing is on the path of every local run."""
    from modeldrop.contracts import progress

    paths = sorted(directory.rglob("*"))
    add = progress.counter(sum(p.stat().st_size for p in paths if p.is_file()))
    with tarfile.open(out, mode="w:gz", compresslevel=compresslevel) as tar:
        for path in paths:
            info = tar.gettarinfo(path, arcname=path.relative_to(directory).as_posix())
            if not info.isreg():
                tar.addfile(info)
                continue
            with path.open("rb") as fh:
                tar.addfile(info, _Reporting(fh, add))
    return out


class _Reporting:
    """A file whose reads are counted into a progress callback."""

    def __init__(self, fh: Any, add: Any) -> None:
        self.fh, self.add = fh, add

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.fh.read(n)
        self.add(len(data))
        return data


# What `modeldrop sample --broken` leaves out: a weight every vLLM release needs, with the KV-shared
# layers' tensors save_pretrained never writes (needed by vLLM 0.26-0.29 only); repair copies them back.
BROKEN_DROP = ("model.layers.0.mlp.down_proj.weight",)
