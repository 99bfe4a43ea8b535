"""A base's linear weights as a LoRA sees them, dense or quantized.

vLLM serves LoRA on GPTQ, AWQ, FP8 and compressed-tensors bases: the adapter names `q_proj`, the base
stores `q_proj.qweight` (GPTQ: [in / pack, out]; AWQ: [in, out / pack], pack = 32 / bits) or
`q_proj.weight_packed` (compressed-tensors: [out, in / pack]). Matched by module and unpacked to the
[out, in] the adapter's A and B must fit, an adapter trained on the dense twin is judged as the engine
judges it, not refused because `q_proj.weight` is absent.
"""

from __future__ import annotations

from typing import Any

from modeldrop.checkpoint.headers.safetensors_header import TensorInfo

QUANTIZED_SUFFIXES = (".qweight", ".weight_packed")


def _bits(base_config: dict[str, Any]) -> int | None:
    quant = base_config.get("quantization_config")
    if not isinstance(quant, dict):
        return None
    bits = quant.get("bits", quant.get("w_bit"))
    if bits is None:  # compressed-tensors: config_groups.<group>.weights.num_bits
        groups = quant.get("config_groups")
        first: Any = next(iter(groups.values()), {}) if isinstance(groups, dict) and groups else {}
        bits = (first.get("weights") or {}).get("num_bits") if isinstance(first, dict) else None
    return bits if isinstance(bits, int) and not isinstance(bits, bool) and bits in (2, 4, 8) else None


def logical_weight(base: dict[str, TensorInfo], base_config: dict[str, Any], stem: str) -> TensorInfo | None:
    """STEM's weight: `STEM.weight`, else its packed tensor as a TensorInfo of the unpacked [out, in]
    (shape () when the packing cannot be read from the config: present, its shape not judged)."""
    dense = base.get(f"{stem}.weight")
    if dense is not None:
        return dense
    for suffix in QUANTIZED_SUFFIXES:
        packed = base.get(f"{stem}{suffix}")
        if packed is None:
            continue
        bits = _bits(base_config)
        method = str((base_config.get("quantization_config") or {}).get("quant_method", "")).lower()
        if bits is None or len(packed.shape) != 2:
            return packed._replace(shape=())
        pack = 32 // bits
        rows, cols = packed.shape
        if suffix == ".weight_packed":
            shape = (rows, cols * pack)
        elif method.startswith("awq"):
            shape = (cols * pack, rows)
        else:  # GPTQ packs the input features into rows
            shape = (cols, rows * pack)
        return packed._replace(name=f"{stem}.weight", shape=shape)
    return None


def linear_stems(base: dict[str, TensorInfo]) -> list[str]:
    """Every module with a 2-D weight, dense or packed."""
    stems = [n[: -len(".weight")] for n, t in base.items() if n.endswith(".weight") and len(t.shape) == 2]
    for suffix in QUANTIZED_SUFFIXES:
        stems += [n[: -len(suffix)] for n in base if n.endswith(suffix)]
    return stems
