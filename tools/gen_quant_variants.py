"""Write quantized variants of a dense checkpoint, in the tensor layouts the quantizers save, and the
breaks users meet (run: python tools/gen_quant_variants.py DENSE_DIR OUT_DIR). test_engine_oracle
holds validate's static rules to the engine check on them.

Only names, dtypes and shapes matter to both judges (neither reads a weight byte), so each linear
layer of the decoder is rewritten as the format stores it, with zero bytes:
- GPTQ (AutoGPTQ / GPTQModel, 4-bit): qweight I32 [in/8, out], qzeros I32 [in/g, out/8],
  scales F16 [in/g, out], g_idx I32 [in];
- AWQ (GEMM, 4-bit): qweight I32 [in, out/8], qzeros I32 [in/g, out/8], scales F16 [in/g, out];
- FP8 block (DeepSeek / Qwen FP8 style): weight F8_E4M3 [out, in], weight_scale_inv F32 [out/128, in/128];
- compressed-tensors (llm-compressor) W4A16 pack-quantized: weight_packed I32 [out, in/8], weight_scale BF16
  [out, in/g], weight_shape I64 [2]; and FP8 per channel: weight F8_E4M3 [out, in], weight_scale BF16 [out, 1].
Breaks: a scales tensor dropped, group_size disagreeing with the tensors, the config deleted, a GPTQ
config left on dense weights (the stale block after a merge), AWQ at 3 bits, FP8 weights without their
weight_scale_inv, and a method vLLM does not know (exl2).
"""

from __future__ import annotations

import json
import math
import shutil
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
Tensors = dict[str, tuple[str, list[int]]]
_BYTES = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "F8_E4M3": 1, "U8": 1, "I8": 1}


def read_header(shard: Path) -> Tensors:
    with shard.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(length))
    return {k: (v["dtype"], v["shape"]) for k, v in header.items() if k != "__metadata__"}


def write_shard(path: Path, tensors: Tensors) -> None:
    """A safetensors file with TENSORS' headers and zero bytes (sparse where the filesystem allows)."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name in sorted(tensors):
        dtype, shape = tensors[name]
        size = math.prod(shape) * _BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(8 + len(raw) + offset)


def _is_linear(name: str) -> bool:
    return ".layers." in name and name.endswith(".weight") and name.split(".")[-2] in LINEARS


def _rewrite(dense: Tensors, linear: Callable[[str, int, int], Tensors], half: str) -> Tensors:
    """DENSE with each decoder linear layer (name, out rows, in columns) replaced by LINEAR's tensors and
    the other floating tensors in HALF (the dtype the quantizer leaves them in)."""
    out: Tensors = {}
    for name, (dtype, shape) in dense.items():
        if _is_linear(name):
            out.update(linear(name.removesuffix(".weight"), shape[0], shape[1]))
        else:
            out[name] = (half if dtype in ("BF16", "F32") else dtype, shape)
    return out


def gptq(dense: Tensors, group: int) -> Tensors:
    return _rewrite(dense, lambda base, rows, cols: {
        f"{base}.qweight": ("I32", [cols // 8, rows]),
        f"{base}.qzeros": ("I32", [cols // group, rows // 8]),
        f"{base}.scales": ("F16", [cols // group, rows]),
        f"{base}.g_idx": ("I32", [cols]),
    }, "F16")  # fmt: skip


def awq(dense: Tensors, group: int) -> Tensors:
    return _rewrite(dense, lambda base, rows, cols: {
        f"{base}.qweight": ("I32", [cols, rows // 8]),
        f"{base}.qzeros": ("I32", [cols // group, rows // 8]),
        f"{base}.scales": ("F16", [cols // group, rows]),
    }, "F16")  # fmt: skip


def fp8_block(dense: Tensors, block: int = 128) -> Tensors:
    return _rewrite(dense, lambda base, rows, cols: {
        f"{base}.weight": ("F8_E4M3", [rows, cols]),
        f"{base}.weight_scale_inv": ("F32", [-(-rows // block), -(-cols // block)]),
    }, "BF16")  # fmt: skip


def compressed_w4a16(dense: Tensors, group: int) -> Tensors:
    """llm-compressor's W4A16 (compressed-tensors, pack-quantized): eight 4-bit values an I32, a scale a group."""
    return _rewrite(dense, lambda base, rows, cols: {
        f"{base}.weight_packed": ("I32", [rows, cols // 8]),
        f"{base}.weight_scale": ("BF16", [rows, cols // group]),
        f"{base}.weight_shape": ("I64", [2]),
    }, "BF16")  # fmt: skip


def compressed_fp8(dense: Tensors) -> Tensors:
    """llm-compressor's FP8 (compressed-tensors, float-quantized, per channel, dynamic activations)."""
    return _rewrite(dense, lambda base, rows, cols: {
        f"{base}.weight": ("F8_E4M3", [rows, cols]),
        f"{base}.weight_scale": ("BF16", [rows, 1]),
    }, "BF16")  # fmt: skip


def _compressed(fmt: str, weights: dict[str, Any], activations: dict[str, Any] | None) -> dict[str, Any]:
    group = {"targets": ["Linear"], "weights": weights, "input_activations": activations, "output_activations": None,
             "format": fmt}  # fmt: skip
    return {"quant_method": "compressed-tensors", "format": fmt, "quantization_status": "compressed",
            "config_groups": {"group_0": group}, "ignore": ["lm_head"], "kv_cache_scheme": None}  # fmt: skip


def _variant(dense_dir: Path, out: Path, tensors: Tensors, quant: dict[str, Any] | None, dtype: str) -> None:
    shutil.copytree(dense_dir, out, ignore=shutil.ignore_patterns("*.safetensors", "*.index.json"))
    write_shard(out / "model.safetensors", tensors)
    config = json.loads((out / "config.json").read_text())
    config.pop("quantization_config", None)
    if quant is not None:
        config["quantization_config"] = quant
    config["torch_dtype"] = dtype
    config.pop("dtype", None)
    (out / "config.json").write_text(json.dumps(config, indent=1))


def main(dense_dir: Path, out_dir: Path) -> list[str]:
    shards = sorted(dense_dir.glob("*.safetensors"))
    dense: Tensors = {}
    for shard in shards:
        dense.update(read_header(shard))
    widths = [shape[1] for name, (_, shape) in dense.items() if _is_linear(name)]
    group = 32 if all(w % 64 == 0 for w in widths) else 8
    gptq_config = {"quant_method": "gptq", "bits": 4, "group_size": group, "desc_act": False, "sym": True,
                   "checkpoint_format": "gptq"}  # fmt: skip
    awq_config = {"quant_method": "awq", "bits": 4, "group_size": group, "zero_point": True, "version": "gemm"}
    # Real FP8 block checkpoints use 128 x 128 blocks over widths that are multiples of 128; vLLM refuses a
    # projection narrower than its block, so a tiny model gets blocks that divide its widths.
    block = 128 if all(w % 128 == 0 for w in widths) else group
    fp8_config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                  "weight_block_size": [block, block]}  # fmt: skip
    packed = gptq(dense, group)
    no_scales = dict(packed)
    del no_scales[next(n for n in sorted(packed) if n.endswith(".scales"))]
    fp8 = fp8_block(dense, block)
    fp8_unscaled = {k: v for k, v in fp8.items() if not k.endswith("_scale_inv")}
    variants: dict[str, tuple[Tensors, dict[str, Any] | None, str]] = {
        "gptq-intact": (packed, gptq_config, "float16"),
        "gptq-scales-dropped": (no_scales, gptq_config, "float16"),
        "gptq-group-size-disagrees": (packed, {**gptq_config, "group_size": group * 2}, "float16"),
        "gptq-config-deleted": (packed, None, "float16"),
        "gptq-config-on-dense": (dense, gptq_config, "bfloat16"),
        "awq-intact": (awq(dense, group), awq_config, "float16"),
        "awq-3-bits": (awq(dense, group), {**awq_config, "bits": 3}, "float16"),
        "fp8-block-intact": (fp8, fp8_config, "bfloat16"),
        "fp8-block-no-scale-inv": (fp8_unscaled, fp8_config, "bfloat16"),
        "exl2": (dense, {"quant_method": "exl2", "bits": 4.0}, "bfloat16"),
        "ct-w4a16-intact": (compressed_w4a16(dense, group), _compressed("pack-quantized", {
            "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group,
            "dynamic": False}, None), "bfloat16"),
        "ct-fp8-intact": (compressed_fp8(dense), _compressed("float-quantized", {
            "num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel", "dynamic": False}, {
            "num_bits": 8, "type": "float", "symmetric": True, "strategy": "token", "dynamic": True}), "bfloat16"),
    }  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, (tensors, quant, dtype) in variants.items():
        _variant(dense_dir, out_dir / name, tensors, quant, dtype)
    return list(variants)


if __name__ == "__main__":
    print("\n".join(main(Path(sys.argv[1]), Path(sys.argv[2]))))
