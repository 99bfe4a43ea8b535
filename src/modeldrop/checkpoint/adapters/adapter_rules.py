"""A PEFT LoRA adapter judged against the base it is meant for, before any endpoint is paid for.

An adapter is `adapter_config.json` + `adapter_model.safetensors`, whose tensors are named
`base_model.model.<module>.lora_A.weight` ([r, in_features]) and `...lora_B.weight`
([out_features, r]) for each adapted `<module>` of the base (`<module>.weight`, [out, in]). Every
rule here is one the serving engines enforce at load (vLLM, SGLang and LMI refuse the adapter, or
serve the base unchanged); each finding names the fix.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, Field

from modeldrop.checkpoint.adapters import peft_rules
from modeldrop.checkpoint.adapters.quantized_base import linear_stems, logical_weight
from modeldrop.checkpoint.archive.scan_result import ArtifactScan
from modeldrop.checkpoint.headers.safetensors_header import TensorInfo
from modeldrop.contracts.models import Finding
from modeldrop.contracts.served import MAX_LORA_RANK, VLLM_LORA_RANKS

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
_LORA = re.compile(r"^(?P<module>.+)\.(?P<kind>lora_A|lora_B|lora_embedding_A|lora_embedding_B)(?:\.[^.]+)?\.weight$")
_LORA_RAW = re.compile(r"^(?P<module>.+)\.(?P<kind>lora_embedding_A|lora_embedding_B)(?:\.[^.]+)?$")
RETRAIN = "re-save the adapter with PEFT (model.save_pretrained) after training a LoRA on this base"


class AdapterSummary(BaseModel):
    """What the report says of an adapter: its config as the engines read it, and its size."""

    peft_type: str | None = None
    r: int | None = None
    lora_alpha: float | None = None
    max_rank: int | None = None  # the largest rank of any module (rank_pattern included)
    target_modules: list[str] | str | None = None
    base_model_name_or_path: str | None = None
    modules: int = 0  # adapted modules (lora_A/lora_B pairs)
    features: int = 0  # sum of in + out features over the adapted modules (LoRA buffer sizing)
    tensors: int = 0
    bytes: int = 0
    dtypes: list[str] = Field(default_factory=list)
    base: str | None = None  # the base it was judged against


def finding(code: str, severity: str, message: str, hint: str) -> Finding:
    return Finding(code=code, severity=severity, message=message, hint=hint)  # type: ignore[arg-type]


@dataclass
class _Adapter:
    config: dict[str, Any]
    tensors: dict[str, TensorInfo]
    base: dict[str, TensorInfo]
    base_config: dict[str, Any]
    findings: list[Finding] = field(default_factory=list)
    pairs: dict[str, dict[str, TensorInfo]] = field(default_factory=dict)  # module -> kind -> tensor
    other: list[str] = field(default_factory=list)


def is_adapter(scan: ArtifactScan) -> bool:
    return ADAPTER_CONFIG in scan.files or ADAPTER_WEIGHTS in scan.files or "adapter_model.bin" in scan.files


def layout_findings(scan: ArtifactScan) -> Iterable[Finding]:
    """The files: adapter_config.json and adapter_model.safetensors at the root, never a pickle."""
    if ADAPTER_CONFIG not in scan.files:
        yield finding(
            "ADAPTER_CONFIG_MISSING",
            "error",
            f"no {ADAPTER_CONFIG} at the adapter's root",
            f"{RETRAIN}; it writes both files",
        )
    if ADAPTER_WEIGHTS not in scan.files:
        pickled = sorted(f for f in scan.files if f.endswith((".bin", ".pt", ".pth")))
        yield finding(
            "ADAPTER_WEIGHTS_MISSING",
            "error",
            f"no {ADAPTER_WEIGHTS}"
            + (f" (found {', '.join(pickled[:3])}: a pickle, which can run code)" if pickled else ""),
            "save the adapter with safe_serialization=True (PEFT's default): adapter_model.safetensors",
        )


def judge(
    config: dict[str, Any], tensors: dict[str, TensorInfo], base: dict[str, TensorInfo], base_config: dict[str, Any]
) -> tuple[list[Finding], AdapterSummary]:
    """Every rule, in the order a user fixes them: the config, the tensors, then the fit to the base."""
    a = _Adapter(config, tensors, base, base_config)
    _split(a)
    a.findings.extend(_peft_type(a))
    # Another PEFT method has other keys and tensors: its type is the one finding that matters.
    lora = config.get("peft_type") == "LORA"
    invalid = list(peft_rules.config_findings(config)) if lora else []
    a.findings.extend(invalid)
    # A config PEFT refuses (its regexes unsafe to run) is fixed first: the rules that read it wait.
    checks: tuple[Callable[[_Adapter], Iterable[Finding]], ...]
    checks = (_rank_config, _pairs, _limit, _shapes, _extra_modules, _vocab, _dtype)
    checks += () if invalid else (_ranks, _targets, _coverage)
    for check in checks if lora else ():
        a.findings.extend(check(a))
    ranks = [t.shape[0] for m in a.pairs.values() for k, t in m.items() if k in ("lora_A",) and t.shape]
    ranks += [t.shape[0] for m in a.pairs.values() for k, t in m.items() if k == "lora_embedding_A" and t.shape]
    summary = AdapterSummary(
        peft_type=_text(config.get("peft_type")),
        r=config.get("r") if isinstance(config.get("r"), int) else None,
        lora_alpha=config.get("lora_alpha") if isinstance(config.get("lora_alpha"), int | float) else None,
        max_rank=max(ranks) if ranks else None,
        target_modules=_target_names(config.get("target_modules")),
        base_model_name_or_path=_text(config.get("base_model_name_or_path")),
        modules=len(a.pairs),
        features=sum(_features(kinds) for kinds in a.pairs.values()),
        tensors=len(tensors),
        bytes=sum(t.nbytes for t in tensors.values()),
        dtypes=sorted({t.dtype for t in tensors.values()}),
    )
    return a.findings, summary


def _target_names(value: Any) -> list[str] | str | None:
    if isinstance(value, str) or (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        return value
    return None


def _coverage(a: _Adapter) -> Iterable[Finding]:
    return peft_rules.coverage_findings(a.config, sorted(a.pairs))


def _features(kinds: dict[str, TensorInfo]) -> int:
    a_t = kinds.get("lora_A") or kinds.get("lora_embedding_A")
    b_t = kinds.get("lora_B") or kinds.get("lora_embedding_B")
    in_f = a_t.shape[1] if a_t is not None and len(a_t.shape) == 2 else 0
    out_f = b_t.shape[0] if b_t is not None and len(b_t.shape) == 2 else 0
    return in_f + out_f


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _split(a: _Adapter) -> None:
    for name, info in a.tensors.items():
        m = _LORA.match(name) or _LORA_RAW.match(name)
        if m is None or not name.startswith(PEFT_PREFIX):
            a.other.append(name)
            continue
        module = m.group("module")[len(PEFT_PREFIX) :]
        a.pairs.setdefault(module, {})[m.group("kind")] = info


def _peft_type(a: _Adapter) -> Iterable[Finding]:
    kind = a.config.get("peft_type")
    if kind != "LORA":
        yield finding(
            "ADAPTER_NOT_LORA",
            "error",
            f"peft_type is {kind!r}: the serving engines load LoRA adapters only (not prompt tuning, IA3, LoHa, ...)",
            "train a LoRA adapter (peft.LoraConfig), or merge this adapter into the base and deploy the checkpoint",
        )
    if a.config.get("use_dora"):
        yield finding(
            "ADAPTER_DORA",
            "error",
            "use_dora is true: vLLM, SGLang and LMI do not serve DoRA's magnitude vectors",
            "merge the adapter into the base (merge_and_unload) and deploy the checkpoint, or train plain LoRA",
        )
    if a.config.get("bias", "none") not in ("none", None) or a.config.get("lora_bias"):
        yield finding(
            "ADAPTER_BIAS",
            "error",
            f"bias is {a.config.get('bias')!r} (lora_bias {a.config.get('lora_bias')!r}): the engines load no LoRA "
            "bias terms",
            "train with bias='none', or merge the adapter into the base and deploy the checkpoint",
        )


def _rank_config(a: _Adapter) -> Iterable[Finding]:
    r, alpha = a.config.get("r"), a.config.get("lora_alpha")
    if not isinstance(r, int) or isinstance(r, bool) or r <= 0:
        yield finding("ADAPTER_CONFIG_INVALID", "error", f"r is {r!r}: a LoRA rank is a positive integer", RETRAIN)
    if not isinstance(alpha, int | float) or isinstance(alpha, bool) or alpha <= 0:
        yield finding(
            "ADAPTER_CONFIG_INVALID", "error", f"lora_alpha is {alpha!r}: the scale needs a positive number", RETRAIN
        )


def _expected_rank(a: _Adapter, module: str) -> int | None:
    pattern = a.config.get("rank_pattern") or {}
    if isinstance(pattern, dict):
        for key, rank in pattern.items():
            if isinstance(rank, int) and (re.fullmatch(rf"(.*\.)?{key}", module) or module.endswith(f".{key}")):
                return rank
    r = a.config.get("r")
    return r if isinstance(r, int) and not isinstance(r, bool) and r > 0 else None


def _pairs(a: _Adapter) -> Iterable[Finding]:
    if not a.pairs and not a.other:
        yield finding("ADAPTER_EMPTY", "error", f"{ADAPTER_WEIGHTS} holds no LoRA tensor", RETRAIN)
    for module, kinds in sorted(a.pairs.items()):
        embedding = any(k.startswith("lora_embedding") for k in kinds)
        needed = ("lora_embedding_A", "lora_embedding_B") if embedding else ("lora_A", "lora_B")
        for kind in needed:
            if kind not in kinds:
                have = next(iter(kinds))
                yield finding(
                    "ADAPTER_TENSOR_MISSING",
                    "error",
                    f"{module} has {have} but no {kind}: the engines need both matrices of every adapted module",
                    RETRAIN,
                )


def _ranks(a: _Adapter) -> Iterable[Finding]:
    for module, kinds in sorted(a.pairs.items()):
        first, second = (
            ("lora_embedding_A", "lora_embedding_B") if "lora_embedding_A" in kinds else ("lora_A", "lora_B")
        )
        a_t, b_t = kinds.get(first), kinds.get(second)
        for t in (a_t, b_t):
            if t is not None and len(t.shape) != 2:
                yield finding(
                    "ADAPTER_SHAPE_MISMATCH", "error", f"{t.name} has shape {list(t.shape)}, not 2-D", RETRAIN
                )
                return
        rank = a_t.shape[0] if a_t is not None else (b_t.shape[1] if b_t is not None else None)
        if a_t is not None and b_t is not None and a_t.shape[0] != b_t.shape[1]:
            yield finding(
                "ADAPTER_RANK_MISMATCH",
                "error",
                f"{module}: {first} has rank {a_t.shape[0]} but {second} has rank {b_t.shape[1]}",
                RETRAIN,
            )
        expected = _expected_rank(a, module)
        if rank is not None and expected is not None and rank != expected:
            yield finding(
                "ADAPTER_RANK_MISMATCH",
                "error",
                f"{module}'s tensors have rank {rank} but adapter_config.json says r={expected}: the engines size "
                "their LoRA buffers by the config and the load fails (or the scale lora_alpha/r is wrong)",
                f"set r (or rank_pattern) to the rank the adapter was trained with ({rank}), or {RETRAIN}",
            )


def _limit(a: _Adapter) -> Iterable[Finding]:
    ranks = [t.shape[0] for kinds in a.pairs.values() for k, t in kinds.items() if k in ("lora_A", "lora_embedding_A")]
    configured = [r for r in [a.config.get("r")] if isinstance(r, int)]
    highest = max(ranks + configured, default=0)
    if highest > MAX_LORA_RANK:
        yield finding(
            "ADAPTER_RANK_TOO_LARGE",
            "error",
            f"rank {highest} is past what the engines serve: vLLM's max_lora_rank goes up to {MAX_LORA_RANK} "
            f"(one of {', '.join(map(str, VLLM_LORA_RANKS))}), LMI's OPTION_MAX_LORA_RANK and SGLang's "
            "--max-lora-rank alike",
            f"train with r <= {MAX_LORA_RANK} (64 is the LMI guide's example), or merge the adapter into the base "
            "and deploy the checkpoint",
        )


# How a module PEFT names (transformers 5 keeps multimodal models as `model.language_model.*` in memory)
# is named in a base saved in the original layout: the prefixes vLLM's per-model hf_to_vllm_mapper
# rewrites, applied to LoRA names too (LLaVA, Gemma 3, Mistral 3: `language_model.model.*`;
# Qwen2-VL / Qwen2.5-VL: `model.*`), and the way back for a base saved as transformers 5 holds it.
SAVED_LAYOUTS: tuple[tuple[str, str], ...] = (
    ("model.language_model.", "language_model.model."),
    ("model.language_model.", "model."),
    ("language_model.model.", "model.language_model."),
    ("model.", "model.language_model."),
    ("model.", "language_model.model."),
)


def _base_module(a: _Adapter, module: str) -> TensorInfo | None:
    """The base tensor MODULE adapts: `<module>.weight`, the same module in the base's saved layout (a
    multimodal base saved by transformers 5 in its original layout), or the one base weight ending in
    it (an adapter trained on the text-only class of a multimodal base names its layers without
    `language_model.`)."""
    exact = logical_weight(a.base, a.base_config, module)
    if exact is not None:
        return exact
    for memory, saved in SAVED_LAYOUTS:
        if module.startswith(memory):
            mapped = logical_weight(a.base, a.base_config, f"{saved}{module[len(memory) :]}")
            if mapped is not None:
                return mapped
    tail = module.split(".", 1)[1] if module.startswith("model.") else module
    matches = [n for n in linear_stems(a.base) if n.endswith(f".{tail}")]
    if len(matches) > 1:
        matches = [n for n in matches if "language_model" in n] or matches
    return logical_weight(a.base, a.base_config, matches[0]) if len(matches) == 1 else None


def _base_modules(a: _Adapter) -> list[str]:
    return linear_stems(a.base)


def _targets(a: _Adapter) -> Iterable[Finding]:
    targets = a.config.get("target_modules")
    modules = _base_modules(a)
    if targets in (None, "all-linear") or targets == ["all-linear"]:
        return
    if isinstance(targets, str):
        missing = [] if any(re.fullmatch(targets, m) for m in modules) else [targets]
    elif isinstance(targets, list) and all(isinstance(t, str) for t in targets):
        missing = [t for t in targets if not any(m == t or m.endswith(f".{t}") for m in modules)]
    else:
        yield finding("ADAPTER_CONFIG_INVALID", "error", f"target_modules is {targets!r}", RETRAIN)
        return
    if missing:
        names = sorted({m.rsplit(".", 1)[-1] for m in modules})
        yield finding(
            "ADAPTER_TARGET_MISSING",
            "error",
            f"target_modules {missing} name no module of the base (its linear layers are {', '.join(names[:12])})",
            "train the adapter on this base (or name the base it was trained on with --base)",
        )
    for module in sorted(a.pairs):
        if _base_module(a, module) is None:
            yield finding(
                "ADAPTER_TARGET_MISSING",
                "error",
                f"the adapter adapts {module}, which the base does not have",
                "train the adapter on this base (or name the base it was trained on with --base)",
            )


# Bases whose linear layers are transformers' Conv1D ([in, out]): there fan_in_fan_out is real; on
# nn.Linear PEFT resets it to False (with a warning) and loads the adapter as usual.
CONV1D_MODEL_TYPES = frozenset({"gpt2", "imagegpt", "decision_transformer"})


def _shapes(a: _Adapter) -> Iterable[Finding]:
    flipped = bool(a.config.get("fan_in_fan_out")) and a.base_config.get("model_type") in CONV1D_MODEL_TYPES
    for module, kinds in sorted(a.pairs.items()):
        weight = _base_module(a, module)
        if weight is None or len(weight.shape) != 2:
            continue
        out_f, in_f = (weight.shape[1], weight.shape[0]) if flipped else weight.shape
        if "lora_embedding_A" in kinds or "lora_embedding_B" in kinds:
            a_t, b_t = kinds.get("lora_embedding_A"), kinds.get("lora_embedding_B")
            want_a, want_b = (weight.shape[0], "vocab rows"), (weight.shape[1], "hidden size")
        else:
            a_t, b_t = kinds.get("lora_A"), kinds.get("lora_B")
            want_a, want_b = (in_f, "in_features"), (out_f, "out_features")
        problems = []
        if "lora_embedding_A" in kinds and a_t is not None and len(a_t.shape) == 2 and a_t.shape[1] != want_a[0]:
            yield finding(
                "ADAPTER_VOCAB_RESIZED",
                "error",
                f"{module}: the adapter's embedding covers {a_t.shape[1]} tokens but the base's vocabulary is "
                f"{want_a[0]}: the tokenizer was resized, which the engines' LoRA loaders do not serve",
                "train without adding tokens, or merge the adapter into the resized base (merge_and_unload) and "
                "deploy that checkpoint",
            )
            continue
        if a_t is not None and len(a_t.shape) == 2 and a_t.shape[1] != want_a[0]:
            problems.append(f"{a_t.name.rsplit('.', 2)[-2]} is {list(a_t.shape)} for {want_a[1]} {want_a[0]}")
        if b_t is not None and len(b_t.shape) == 2 and b_t.shape[0] != want_b[0]:
            problems.append(f"{b_t.name.rsplit('.', 2)[-2]} is {list(b_t.shape)} for {want_b[1]} {want_b[0]}")
        if problems:
            yield finding(
                "ADAPTER_SHAPE_MISMATCH",
                "error",
                f"{module}: {'; '.join(problems)} of the base's {weight.name} {list(weight.shape)}: the adapter was "
                "trained on another base (or another size of it)",
                "deploy the adapter on the base it was trained on (--base), or train it on this one",
            )


def _is_vocab_module(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("embed_tokens", "lm_head", "wte", "word_embeddings", "embed_out", "embedding")


def _extra_modules(a: _Adapter) -> Iterable[Finding]:
    saved = a.config.get("modules_to_save")
    # DoRA's magnitude vectors are DoRA's own finding (ADAPTER_DORA), not trained modules.
    trained = [
        n
        for n in a.other
        if not (_is_vocab_module(n.rsplit(".", 1)[0]) and n.endswith(".weight")) and "lora_magnitude_vector" not in n
    ]
    if saved or trained:
        named = saved if saved else sorted({n.rsplit(".", 1)[0][len(PEFT_PREFIX) :] for n in trained})[:5]
        yield finding(
            "ADAPTER_MODULES_TO_SAVE",
            "error",
            f"the adapter carries fully trained modules ({named}), not only LoRA matrices: vLLM, SGLang and LMI "
            "load LoRA tensors only, so these would be ignored or refused",
            "merge the adapter into the base (merge_and_unload), save_pretrained, and deploy that checkpoint",
        )


def _vocab(a: _Adapter) -> Iterable[Finding]:
    """Saved embedding layers (PEFT's save_embedding_layers) with another vocabulary than the base's."""
    base_rows = {n: t.shape[0] for n, t in a.base.items() if _is_vocab_module(n.rsplit(".", 1)[0]) and t.shape}
    base_vocab = max(base_rows.values(), default=None)
    for name in a.other:
        info = a.tensors[name]
        if _is_vocab_module(name.rsplit(".", 1)[0]) and info.shape and base_vocab and info.shape[0] != base_vocab:
            yield finding(
                "ADAPTER_VOCAB_RESIZED",
                "error",
                f"{name} has {info.shape[0]} rows but the base's vocabulary is {base_vocab}: the tokenizer was "
                "resized for this adapter, which the engines' LoRA loaders do not serve (vLLM removed "
                "lora_extra_vocab_size; LMI's OPTION_LORA_EXTRA_VOCAB_SIZE covers lmi-dist only)",
                "train without adding tokens, or merge the adapter into the resized base (merge_and_unload) and "
                "deploy that checkpoint",
            )
    for name in a.other:
        info = a.tensors[name]
        module = name.rsplit(".", 1)[0]
        if _is_vocab_module(module) and info.shape and base_vocab and info.shape[0] == base_vocab:
            if module[len(PEFT_PREFIX) :] in a.pairs:  # LoRA on the head: PEFT saves the head's base weight beside
                yield finding(
                    "ADAPTER_BASE_WEIGHT_SAVED",
                    "warning",
                    f"{name} is the base's own weight, which PEFT saves beside a LoRA on that layer: the engines "
                    "serve the base's copy and apply the LoRA matrices, so a change to this copy would not be served",
                    "nothing to do if the layer was only LoRA-trained; otherwise merge the adapter into the base",
                )
                continue
            yield finding(
                "ADAPTER_MODULES_TO_SAVE",
                "error",
                f"{name} is a full copy of the base's embedding (save_embedding_layers): the engines load LoRA "
                "tensors only",
                "save the adapter with save_embedding_layers=False, or merge it into the base and deploy the "
                "checkpoint",
            )


def _dtype(a: _Adapter) -> Iterable[Finding]:
    adapter = {t.dtype for t in a.tensors.values()}
    base = {t.dtype for t in a.base.values()}
    if adapter and base and not adapter <= base:
        yield finding(
            "ADAPTER_DTYPE",
            "info",
            f"the adapter is {', '.join(sorted(adapter))} and the base {', '.join(sorted(base))}: the engines cast "
            "the LoRA weights to the model's dtype at load",
            "nothing to do; save the adapter in the base's dtype to halve its size",
        )
