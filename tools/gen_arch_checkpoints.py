"""Write tiny random-init checkpoints with transformers' own save_pretrained, one per architecture,
and broken variants of each (run with a Python that has torch and transformers:
python tools/gen_arch_checkpoints.py OUT_DIR [TYPES]; the engine venv has both). The torch-tier test
judges every one with validate; test_engine_oracle holds validate to the engine check on them.

Each architecture's default config is shrunk (few layers, narrow, small vocab) keeping every
structural feature (MoE, sliding layers, untied heads, KV sharing, towers), then saved. The broken
variants are the faults users meet: a tensor dropped (from a layer, from an expert), a shape
changed, a tensor renamed, config.json with more layers, another vocab or another hidden size.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SHRINK = {
    "num_hidden_layers": 4, "n_layer": 4, "num_layers": 4, "hidden_size": 64, "n_embd": 64, "d_model": 64,
    "intermediate_size": 128, "n_inner": 128, "ffn_hidden_size": 128, "moe_intermediate_size": 32,
    "num_attention_heads": 4, "n_head": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 512,
    "num_local_experts": 4, "num_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "max_position_embeddings": 256, "n_positions": 256, "sliding_window": 32, "kv_lora_rank": 16,
    "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "first_k_dense_replace": 1,
    "num_kv_shared_layers": 0, "global_head_dim": 32, "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": 512, "moe_topk": 2, "topk_group": 1, "n_group": 1,
}  # fmt: skip
TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text",
    "phi", "phi3", "olmo", "olmo2", "granite", "gpt_neox", "gpt2", "falcon", "starcoder2", "cohere", "deepseek_v3",
    "gpt_oss", "smollm3", "stablelm", "opt", "gptj", "glm4", "exaone4", "helium", "seed_oss", "gemma4_text",
    # Hybrids: attention beside Mamba, gated delta-net, short-conv or lightning-attention layers.
    "jamba", "lfm2", "qwen3_next", "falcon_h1", "minimax", "nemotron_h",
)  # fmt: skip


# What the real models of a family set and their engines assume (not shrunk alone): Falcon's MLP is
# 4 x hidden in vLLM whatever ffn_hidden_size says, and its kv-head count follows the attention heads;
# DeepSeek-V3's gate keeps its correction bias only with noaux_tc routing; Phi's MLP is 4 x hidden in vLLM
# 0.31 (n_inner, else 4 x hidden) and its K/V take every head, as in every released Phi, whatever
# intermediate_size and num_key_value_heads say.
FAMILY = {
    "falcon": {"ffn_hidden_size": 4 * SHRINK["hidden_size"], "num_kv_heads": SHRINK["num_attention_heads"]},
    "deepseek_v3": {"topk_method": "noaux_tc"},
    "phi": {"intermediate_size": 4 * SHRINK["hidden_size"], "num_key_value_heads": SHRINK["num_attention_heads"]},
    "lfm2": {"block_dim": SHRINK["hidden_size"]},  # the hub's LFM2 configs carry it; vLLM's MLP reads it
}


def shrink(section: dict, model_type: str) -> None:
    for key, value in SHRINK.items():
        if key in section and isinstance(section[key], int | float) and not isinstance(section[key], bool):
            section[key] = value
    section.update(FAMILY.get(model_type, {}))
    if isinstance(section.get("layer_types"), list):
        kinds = section["layer_types"]
        section["layer_types"] = [kinds[i % len(kinds)] for i in range(4)]
        if "full_attention" in kinds and section["layer_types"][-1] != "full_attention":
            section["layer_types"][-1] = "full_attention"
    section.pop("per_layer_config", None)
    if isinstance(section.get("rotary_dim"), int):  # GPT-J / CodeGen: a quarter of the shrunk head
        section["rotary_dim"] = 4
    # Token ids of the full vocabulary point past the shrunk one (an embedding's padding_idx asserts it).
    for key in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
        value = section.get(key)
        if isinstance(value, int) and value >= SHRINK["vocab_size"]:
            section[key] = value % SHRINK["vocab_size"]
        elif isinstance(value, list):
            section[key] = [v % SHRINK["vocab_size"] if isinstance(v, int) else v for v in value]
    if model_type == "gpt_oss":
        section["layer_types"] = ["sliding_attention", "full_attention"] * 2


def main(out: Path, types: tuple[str, ...] = TYPES) -> None:
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    made = []
    for model_type in types:
        try:
            config = AutoConfig.for_model(model_type)
            data = config.to_dict()
            shrink(data, model_type)
            config = AutoConfig.for_model(model_type, **{k: v for k, v in data.items() if k != "model_type"})
            torch.manual_seed(0)
            model = AutoModelForCausalLM.from_config(config)
            target = out / model_type / "intact"
            model.save_pretrained(target)
        except Exception as exc:  # an architecture this transformers cannot build tiny: skipped, and said
            print(f"skip {model_type}: {type(exc).__name__}: {str(exc)[:120]}", file=sys.stderr)
            continue
        made.append(model_type)
        shard = target / "model.safetensors"
        tensors = load_file(shard)
        layer_names = sorted(n for n in tensors if ".layers.1." in n or ".h.1." in n)
        cfg = json.loads((target / "config.json").read_text())

        def variant(name: str, new_tensors: dict | None = None, new_config: dict | None = None) -> None:
            _write(out / model_type / name, tensors if new_tensors is None else new_tensors, new_config or cfg)  # noqa: B023

        if layer_names:
            dropped = dict(tensors)
            del dropped[layer_names[0]]
            variant("broken-dropped", dropped)
            renamed = dict(tensors)
            renamed[layer_names[0].replace(".weight", "_x.weight")] = renamed.pop(layer_names[0])
            variant("broken-renamed", renamed)
            halved = dict(tensors)
            big = next(n for n in layer_names if halved[n].dim() == 2 and halved[n].shape[0] > 1)
            halved[big] = halved[big][: halved[big].shape[0] // 2].contiguous()
            variant("broken-halved", halved)
        text = cfg.get("text_config", cfg)
        layers_key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in text), None)
        if layers_key is not None:
            variant("broken-more-layers", new_config=_with(cfg, layers_key, text[layers_key] + 2))
        if "vocab_size" in text:
            variant("broken-vocab", new_config=_with(cfg, "vocab_size", text["vocab_size"] + 64))
    (out / "made.json").write_text(json.dumps(made))


def _with(config: dict, key: str, value: int) -> dict:
    copy = json.loads(json.dumps(config))
    copy.get("text_config", copy)[key] = value
    return copy


def _write(where: Path, tensors: dict, config: dict) -> None:
    from safetensors.torch import save_file

    where.mkdir(parents=True, exist_ok=True)
    save_file(tensors, where / "model.safetensors", {"format": "pt"})
    (where / "config.json").write_text(json.dumps(config))


def write_shapes(out: Path, fixture: Path) -> None:
    """The intact checkpoints' config.json and tensor shapes as one JSON (tests/fixtures/arch-shapes.json)."""
    import transformers
    from safetensors import safe_open

    archs = {}
    for model_type in json.loads((out / "made.json").read_text()):
        intact = out / model_type / "intact"
        with safe_open(str(intact / "model.safetensors"), "np") as fh:
            shapes = {name: list(fh.get_slice(name).get_shape()) for name in sorted(fh.keys())}
        archs[model_type] = {"config": json.loads((intact / "config.json").read_text()), "shapes": shapes}
    provenance = (
        f"tools/gen_arch_checkpoints.py: tiny random-init models saved by transformers {transformers.__version__} "
        "save_pretrained; tensor names and shapes from their safetensors headers"
    )
    fixture.write_text(
        json.dumps({"_provenance": provenance, "architectures": archs}, separators=(",", ":"), sort_keys=True)
    )


if __name__ == "__main__":  # OUT_DIR [TYPE,TYPE,...] [--shapes FIXTURE]
    args = [a for a in sys.argv[1:] if not a.startswith("--shapes")]
    main(Path(args[0]), tuple(args[1].split(",")) if len(args) > 1 else TYPES)
    shapes = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--shapes=")]
    if shapes:
        write_shapes(Path(args[0]), Path(shapes[0]))
