"""Quantization and rope, the fast first gate (the engine check has the last word: --engine-check).

vLLM picks its loader from config.json's `quantization_config` (`quant_method`) and expects the tensors
that method writes; its config parser refuses a rope type it does not implement, or one without the
parameters it needs. What is judged here, from the config and the safetensors headers alone:
- a method no vLLM knows (exl2, ...); AWQ at other than 4 bits (vLLM's AWQ kernels are 4-bit);
- a GPTQ/AWQ config on dense weights (the stale block a merge keeps: vLLM then looks for `qweight`
  and finds `weight`), and packed tensors with no config to say how to read them;
- a packed module without its `scales` / `qzeros`, GPTQ groups that disagree with `group_size`, an
  FP8 block checkpoint whose fp8 weights lack their `weight_scale_inv`;
- a rope type no engine implements, and linear / dynamic / yarn / llama3 / longrope scaling without
  the factors it is computed from.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.contracts.models import Finding

_PACKED = ("gptq", "awq", "auto_gptq", "auto_awq", "gptq_marlin", "awq_marlin")
# Per vLLM release, what its own source accepts (tools/gen_engine_lists.py reads each release's wheel):
# the quantization methods ModelConfig knows and those it refuses as deprecated, and the rope types
# get_rope implements (with the legacy names the config code renames).
_LISTS: dict[str, dict[str, list[str]]] = json.loads(
    (Path(__file__).parents[1] / "data" / "engine_lists.json").read_text()
)["vllm"]


@dataclass(frozen=True)
class EngineLists:
    methods: frozenset[str]
    deprecated: frozenset[str]
    rope: frozenset[str]
    architectures: frozenset[str]  # what the release's registry implements itself
    release: str | None  # the vLLM release they are; None: every release's (the image's version unknown)


def engine_lists(target: EngineVersion | None) -> EngineLists:
    """TARGET's release's lists (vLLM's, or the one LMI bundles), by exact or by minor version; without
    one, the union of every release's (a method any of them reads passes) and no deprecation."""
    if target is not None and target.runs_vllm:
        minor = ".".join(target.version.split(".")[:2])
        release = target.version if target.version in _LISTS else next(
            (v for v in sorted(_LISTS) if v.startswith(minor + ".")), None
        )  # fmt: skip
        if release is not None:
            e = _LISTS[release]
            lists = (
                frozenset(e["quantization_methods"]),
                frozenset(e["deprecated_quantization"]),
                frozenset(e["rope_types"]),
                frozenset(e["architectures"]),
            )
            return EngineLists(*lists, release=release)
    every = list(_LISTS.values())
    return EngineLists(
        frozenset(m for e in every for m in e["quantization_methods"]),
        frozenset(),
        frozenset(r for e in every for r in e["rope_types"]),
        frozenset(a for e in every for a in e["architectures"]),
        release=None,
    )


_ROPE_NEEDS = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor"),
}
_FIX_STALE = (
    "a merged (dequantized) checkpoint keeps no quantization_config: `modeldrop repair SOURCE --out OUT "
    "--drop-stale-quantization` writes a copy without it (or delete the block from config.json)"
)


def _error(code: str, message: str, hint: str) -> Finding:
    return Finding(code=code, severity="error", message=message, hint=hint)


def quant_findings(
    config: Mapping[str, Any],
    headers: Mapping[str, tuple[str, tuple[int, ...]]],
    side_config: bool = False,
    target: EngineVersion | None = None,
) -> list[Finding]:
    """HEADERS: every tensor's (dtype, shape), from the shards the engine loads; SIDE_CONFIG: the
    checkpoint has AutoGPTQ's own quantize_config.json (or quant_config.json) beside config.json;
    TARGET: the image's engine, whose release's method list decides."""
    block = config.get("quantization_config")
    packed = sorted(n for n in headers if n.endswith(".qweight"))
    if not isinstance(block, Mapping):
        if packed and not side_config:
            what = f"{len(packed)} packed tensors ({packed[0]}, ...) but config.json has no quantization_config"
            fix = "save the quantized model with its quantization_config (as the quantizer wrote it)"
            return [_error("QUANT_CONFIG_MISSING", f"{what}: the engine cannot know how to read them", fix)]
        return []
    method = str(block.get("quant_method") or "").lower()
    lists = engine_lists(target)
    which = f"vLLM {lists.release}" if lists.release else "any vLLM release"
    if method and method not in lists.methods:
        fix = "quantize with a method the engine serves (AWQ, GPTQ, FP8, compressed-tensors, ...)"
        if lists.release and method in engine_lists(None).methods:
            fix = f"{fix}, or serve it with an image whose vLLM reads {method}"
        return [_error("QUANT_METHOD_UNKNOWN", f"quant_method {method!r} is not a method {which} reads", fix)]
    if method in lists.deprecated:
        fix = "re-quantize with a current method (FP8, AWQ, GPTQ, compressed-tensors)"
        return [_error("QUANT_METHOD_DEPRECATED", f"{which} refuses the deprecated quant_method {method!r} "
                       "unless started with --allow-deprecated-quantization", fix)]  # fmt: skip
    findings = list(_packed_rules(method, block, headers, packed))
    findings += _fp8_rules(method, block, headers)
    return findings


def _packed_rules(
    method: str, block: Mapping[str, Any], headers: Mapping[str, tuple[str, tuple[int, ...]]], packed: list[str]
) -> Iterable[Finding]:
    if method not in _PACKED:
        return
    bits = block.get("bits", block.get("w_bit"))
    if "awq" in method and bits not in (None, 4):
        yield _error("QUANT_UNSUPPORTED", f"AWQ with {bits} bits: vLLM's AWQ kernels read 4-bit weights only",
                     "quantize with AWQ at 4 bits, or with GPTQ")  # fmt: skip
        return
    if not packed:
        what = f"config.json names {method} quantization, but no tensor is packed (no *.qweight)"
        yield _error("QUANT_CONFIG_STALE", f"{what}: the engine would look for qweight, not weight", _FIX_STALE)
        return
    group = block.get("group_size", block.get("q_group_size"))
    for name in packed:
        module = name[: -len(".qweight")]
        missing = [f"{module}.{part}" for part in ("scales", "qzeros") if f"{module}.{part}" not in headers]
        if missing:
            yield _error("QUANT_TENSORS_MISSING", f"{', '.join(missing)}: a packed module without its "
                         f"{'scales and zeros' if len(missing) > 1 else missing[0].rsplit('.', 1)[1]}",
                         "re-export the quantized checkpoint: every module the quantizer packed writes qweight, "
                         "qzeros and scales")  # fmt: skip
            return
        if "gptq" in method and bits in (2, 4, 8) and isinstance(group, int):  # 3 bits packs across rows
            problem = _groups(headers[name][1], headers[f"{module}.scales"][1], bits, group)
            if problem:
                yield _error("QUANT_GROUP_MISMATCH", f"{module}: {problem}",
                             "use the quantization_config the quantizer wrote with these tensors")  # fmt: skip
                return


def _groups(qweight: tuple[int, ...], scales: tuple[int, ...], bits: int, group: int) -> str | None:
    """GPTQ packs 32 // bits input rows per int32 row of qweight [in*bits/32, out]; scales hold one row
    per group of GROUP input rows [in/group, out] (one row with group_size -1)."""
    if len(qweight) != 2 or len(scales) != 2:
        return None
    in_features = qweight[0] * 32 // bits
    expected = 1 if group == -1 else -(-in_features // group) if group > 0 else None
    if expected is not None and scales[0] != expected:
        return (
            f"scales has {scales[0]} rows where group_size {group} over {in_features} input features makes "
            f"{expected}: the config's group_size is not the one the tensors were packed with"
        )
    return None


def _fp8_rules(
    method: str, block: Mapping[str, Any], headers: Mapping[str, tuple[str, tuple[int, ...]]]
) -> Iterable[Finding]:
    if method != "fp8" or not block.get("weight_block_size"):
        return
    fp8 = [n for n, (dtype, _shape) in headers.items() if dtype.startswith("F8") and n.endswith(".weight")]
    lacking = [n for n in fp8 if f"{n}_scale_inv" not in headers]
    if fp8 and lacking:
        yield _error("QUANT_TENSORS_MISSING", f"{len(lacking)} fp8 block-quantized weights without their "
                     f"weight_scale_inv ({lacking[0]}, ...): the engine cannot dequantize them",
                     "re-export the FP8 checkpoint with its per-block scales")  # fmt: skip


def rope_findings(config: Mapping[str, Any], target: EngineVersion | None = None) -> list[Finding]:
    """Rope parameters the config parser refuses: an unknown type, a scaling without its factors."""
    findings: list[Finding] = []
    lists = engine_lists(target)
    for where, rope in _ropes(config):
        kind = rope.get("rope_type", rope.get("type"))
        if kind is None:
            continue
        if not isinstance(kind, str) or kind not in lists.rope:
            which = f"vLLM {lists.release} implements" if lists.release else "the engines implement"
            findings.append(_error("ROPE_INVALID", f"{where} rope_type {kind!r} is not one {which}",
                                   "use the rope type the model was trained with (default, linear, dynamic, yarn, "
                                   "llama3, longrope, ...)"))  # fmt: skip
            continue
        missing = [k for k in _ROPE_NEEDS.get(kind, ()) if k not in rope]
        if missing:
            needed = ", ".join(missing)
            fix = f"give {kind} scaling its {needed} (as the model was trained)"
            findings.append(_error("ROPE_INVALID", f"{where} rope_type {kind!r} without {needed}", fix))
    findings += _partial_rotary(config)
    return findings[:4]


def _partial_rotary(config: Mapping[str, Any]) -> list[Finding]:
    """The rotary share of each head vLLM's rope builds: partial_rotary_factor in (0, 1], or GPT-J /
    CodeGen's rotary_dim no wider than the head (vLLM: "partial_rotary_factor must be between 0.0 and 1.0")."""
    section = config.get("text_config")
    text: Mapping[str, Any] = section if isinstance(section, Mapping) else config
    factor: Any = text.get("partial_rotary_factor")
    rotary = text.get("rotary_dim")
    head = _head_size(text)
    if isinstance(rotary, int) and not isinstance(rotary, bool) and head:
        factor = rotary / head
    if not isinstance(factor, int | float) or isinstance(factor, bool) or 0 < factor <= 1:
        return []
    what = f"rotary_dim {rotary} over a head of {head}" if isinstance(rotary, int) else f"{factor}"
    return [
        _error(
            "ROPE_INVALID",
            f"partial_rotary_factor is {what}: the rotary share of a head is in (0, 1]",
            "save config.json from the trained model (the rotary dims are at most the head size)",
        )
    ]


def _head_size(text: Mapping[str, Any]) -> int | None:
    head = text.get("head_dim")
    if isinstance(head, int) and not isinstance(head, bool) and head > 0:
        return head
    hidden, heads = text.get("hidden_size", text.get("n_embd")), text.get("num_attention_heads", text.get("n_head"))
    if isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        return hidden // heads
    return None


def _ropes(config: Mapping[str, Any]) -> Iterable[tuple[str, Mapping[str, Any]]]:
    sections = [("", config)] + [
        (f"{k}.", v)
        for k, v in config.items()
        # A vision or audio tower's rope (Pixtral's 2-D "axial") is its encoder's, not the engine's rope parsers'.
        if k.endswith("_config") and isinstance(v, Mapping) and not k.startswith(("vision", "audio"))
    ]
    for prefix, section in sections:
        for key in ("rope_scaling", "rope_parameters"):
            value = section.get(key)
            if not isinstance(value, Mapping):
                continue
            if all(isinstance(v, Mapping) for v in value.values()) and value:  # per layer type (Gemma 3/4)
                yield from ((f"{prefix}{key}.{k}", v) for k, v in value.items())
            else:
                yield f"{prefix}{key}", value


# Layer kinds vLLM's Transformers backend runs (it swaps in its own attention): anything else it refuses.
_BACKEND_LAYERS = frozenset({"attention", "full_attention", "sliding_attention", "chunked_attention", "global"})


def architecture_findings(config: Mapping[str, Any], target: EngineVersion | None = None) -> list[Finding]:
    """An architecture the image's vLLM does not implement runs through its Transformers backend, which
    runs attention layers only: a model with recurrent or linear-attention layers then cannot start."""
    from modeldrop.checkpoint.weights.hybrid_layers import hybrid_layout

    archs = config.get("architectures")
    lists = engine_lists(target)
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str) or lists.release is None:
        return []
    if archs[0] in lists.architectures:
        return []
    spelled = next((a for a in lists.architectures if a.lower() == archs[0].lower()), None)
    if spelled is not None:  # transformers 5 names PhiMoE `PhimoeForCausalLM`; vLLM registers `PhiMoEForCausalLM`
        return [_error("ARCHITECTURE_MISSPELLED",
                       f"vLLM {lists.release} registers this model as {spelled}, not {archs[0]}: under the name "
                       "given it falls back to its Transformers backend, which fails at the first forward pass",
                       f'set "architectures": ["{spelled}"] in config.json')]  # fmt: skip
    text = config.get("text_config")
    section: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    kinds = {str(k) for key in ("layer_types", "layers_block_type") for k in (section.get(key) or [])
             if isinstance(section.get(key), list)}  # fmt: skip
    recurrent = sorted(kinds - _BACKEND_LAYERS)
    if recurrent or hybrid_layout(dict(config)) is not None:
        what = ", ".join(recurrent) or "recurrent"
        return [_error("ARCHITECTURE_UNSUPPORTED",
                       f"vLLM {lists.release} has no implementation of {archs[0]}; its Transformers backend "
                       f"runs attention layers only, and this model has {what} layers",
                       "serve it with an image whose vLLM implements the architecture (or the architecture "
                       "name vLLM registers for this model)")]  # fmt: skip
    return [Finding(code="ARCHITECTURE_TRANSFORMERS_BACKEND", severity="info",
                    message=f"vLLM {lists.release} has no implementation of {archs[0]} of its own: it serves it "
                    "through its Transformers backend (transformers' modeling code, vLLM's attention)",
                    hint="nothing to do; expect the throughput of the Transformers backend")]  # fmt: skip
