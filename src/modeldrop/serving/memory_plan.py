"""GPU memory plan: predict a CUDA OOM before paying for an endpoint.

Per GPU, under the memory fraction: weights / TP, the sampler buffer (max_num_seqs x vocab x 4 B,
doubled because flashinfer copies it), activation + CUDA-graph overhead that grows with
max_num_seqs, and what is left for the KV cache. Calibrated on measured L4 (ml.g6.2xlarge) loads
(tests/test_serving_plan.py keeps them): multimodal E4B 15.18 GiB OOM at 256 sequences and loads at
32 with 3.36 GiB of KV; text E4B 14.23 GiB barely passes at 256.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any, Literal

from pydantic import BaseModel

GIB = 1024**3
# Overhead = base + per-sequence activation/CUDA-graph cost, fitted to the two L4 measurements.
OVERHEAD_BASE_GIB = 1.2
OVERHEAD_PER_SEQ_GIB = 0.012
MIN_KV_GIB = 0.5  # below this vLLM cannot allocate enough KV blocks to start
TIGHT_MARGIN_GIB = 1.0

Verdict = Literal["fits", "tight", "oom"]
# layer_types a hybrid's validation report gives its layers without a KV cache (checkpoint.hybrid_layers).
RECURRENT_KINDS = frozenset(("mamba", "mamba2", "linear_attention", "conv", "short_conv", "linear", "recurrent"))


@cache
def instance_catalog() -> dict[str, Any]:
    text = resources.files("modeldrop.serving").joinpath("data/instances.json").read_text()
    catalog: dict[str, Any] = json.loads(text)
    return catalog


def instance(instance_type: str) -> dict[str, Any] | None:
    spec: dict[str, Any] | None = instance_catalog()["instances"].get(instance_type)
    return spec


def hourly_price(instance_type: str, region: str) -> float | None:
    spec = instance(instance_type)
    if spec is None:
        return None
    price: float | None = spec["price"].get(region)
    return price


class ModelShape(BaseModel):
    weights_gib: float
    vocab_size: int = 262_144
    num_hidden_layers: int = 0
    num_kv_shared_layers: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    layer_types: list[str] | None = None
    sliding_window: int | None = None
    kv_dtype_bytes: int = 2
    kv_latent: bool = False
    kv_per_layer: list[list[int]] | None = None  # [kv_heads, head_dim] of each layer, where layers differ
    recurrent_state_bytes_per_sequence: int = 0  # a hybrid's Mamba / linear-attention state per sequence


class MemoryPlan(BaseModel):
    instance_type: str
    gpus: int
    tensor_parallel: int
    capacity_gib: float
    fraction: float
    budget_gib: float
    weights_gib: float
    sampler_gib: float
    overhead_gib: float
    kv_cache_gib: float
    kv_min_gib: float
    # What the KV cache was sized with: bytes per token (full-attention and sliding layers) and the
    # recurrent state a hybrid keeps per running sequence, reserved for max_num_seqs of them.
    kv_bytes_per_token: float = 0.0
    sliding_kv_bytes_per_token: float = 0.0
    state_bytes_per_sequence: int = 0
    state_gib: float = 0.0
    headroom_gib: float
    max_num_seqs: int
    max_model_len: int
    verdict: Verdict


def kv_bytes_per_token(shape: ModelShape) -> tuple[float, float]:
    """(bytes per token on full-attention layers, bytes per token on sliding layers)."""
    if not (shape.num_hidden_layers and shape.num_key_value_heads and shape.head_dim):
        return 0.0, 0.0
    owning = range(shape.num_hidden_layers - shape.num_kv_shared_layers)
    factor = (1 if shape.kv_latent else 2) * shape.kv_dtype_bytes
    widths = shape.kv_per_layer or []
    full = sliding = 0.0
    for layer in owning:
        heads, dim = widths[layer] if layer < len(widths) else (shape.num_key_value_heads, shape.head_dim)
        per_layer = factor * heads * dim
        kind = shape.layer_types[layer] if shape.layer_types and layer < len(shape.layer_types) else "full_attention"
        if kind in RECURRENT_KINDS:  # a hybrid's Mamba / linear-attention / conv layer caches no KV
            continue
        if kind == "sliding_attention" and shape.sliding_window:
            sliding += per_layer
        else:
            full += per_layer
    return full, sliding


def plan_memory(
    shape: ModelShape,
    instance_type: str,
    max_num_seqs: int,
    max_model_len: int,
    fraction: float = 0.90,
    tensor_parallel: int | None = None,
) -> MemoryPlan:
    spec = instance(instance_type)
    if spec is None:
        raise KeyError(instance_type)
    gpus = int(spec["gpus"])
    tp = tensor_parallel or gpus
    capacity = float(spec["gpu_gib"])
    budget = capacity * fraction
    weights = shape.weights_gib / tp
    sampler = max_num_seqs * shape.vocab_size * 4 * 2 / GIB
    overhead = OVERHEAD_BASE_GIB + OVERHEAD_PER_SEQ_GIB * max_num_seqs
    state = max_num_seqs * shape.recurrent_state_bytes_per_sequence / tp / GIB
    kv_free = budget - weights - sampler - overhead - state
    full, sliding = kv_bytes_per_token(shape)
    window = min(shape.sliding_window or max_model_len, max_model_len)
    one_sequence = (full * max_model_len + sliding * window) / tp / GIB
    kv_min = max(MIN_KV_GIB, one_sequence)
    headroom = kv_free - kv_min
    verdict: Verdict = "oom" if headroom < 0 else "tight" if headroom < TIGHT_MARGIN_GIB else "fits"
    return MemoryPlan(
        instance_type=instance_type,
        gpus=gpus,
        tensor_parallel=tp,
        capacity_gib=round(capacity, 3),
        fraction=fraction,
        budget_gib=round(budget, 3),
        weights_gib=round(weights, 3),
        sampler_gib=round(sampler, 4),
        overhead_gib=round(overhead, 3),
        kv_cache_gib=round(max(kv_free, 0.0), 3),
        kv_min_gib=round(kv_min, 3),
        kv_bytes_per_token=full,
        sliding_kv_bytes_per_token=sliding,
        state_bytes_per_sequence=shape.recurrent_state_bytes_per_sequence,
        state_gib=round(state, 4),
        headroom_gib=round(headroom, 3),
        max_num_seqs=max_num_seqs,
        max_model_len=max_model_len,
        verdict=verdict,
    )


def largest_fitting_seqs(shape: ModelShape, instance_type: str, max_model_len: int, fraction: float) -> int | None:
    for seqs in (256, 128, 64, 48, 32, 24, 16, 8, 4, 1):
        if plan_memory(shape, instance_type, seqs, max_model_len, fraction).verdict != "oom":
            return seqs
    return None


def largest_fitting_model_len(
    shape: ModelShape, instance_type: str, max_num_seqs: int, max_model_len: int, fraction: float
) -> int | None:
    """The longest context (a multiple of 256, at least 256) that fits, or None."""
    length = (max_model_len - 1) // 256 * 256
    while length >= 256:
        if plan_memory(shape, instance_type, max_num_seqs, length, fraction).verdict != "oom":
            return length
        length -= 256
    return None


def smallest_fitting_instance(
    shape: ModelShape, max_num_seqs: int, max_model_len: int, fraction: float, region: str
) -> str | None:
    candidates = []
    for name in instance_catalog()["instances"]:
        plan = plan_memory(shape, name, max_num_seqs, max_model_len, fraction)
        if plan.verdict == "fits":
            candidates.append((hourly_price(name, region) or float("inf"), name))
    return min(candidates)[1] if candidates else None
