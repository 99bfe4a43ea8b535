"""adapter_config.json as PEFT reads it: the field types LoraConfig refuses, and which modules its
target_modules / exclude_modules / layers_to_transform cover.

PEFT raises on a config these rules refuse (LoraConfig's own checks), and it creates LoRA layers
only for the modules the config covers: tensors for any other module are never loaded (vLLM's LoRA
loader refuses them outright). Regexes in the config are compiled here, never trusted: an invalid
one is a finding, and one with nested repetition ((a+)+), which can take exponential time on a
module name, is refused before it is matched.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from modeldrop.contracts.models import Finding

RETRAIN = "re-save the adapter with PEFT (model.save_pretrained) after training a LoRA on this base"
# peft.utils.peft_types.TaskType
TASK_TYPES = frozenset({"SEQ_CLS", "SEQ_2_SEQ_LM", "CAUSAL_LM", "TOKEN_CLS", "QUESTION_ANS", "FEATURE_EXTRACTION"})
# LoraConfig.init_lora_weights: a bool, or one of these (pissa_niter_<n> too)
INIT_METHODS = frozenset({"gaussian", "eva", "olora", "pissa", "corda", "loftq", "orthogonal", "mica", "lora_ga"})
# The inits that only set the adapter's first weights (vLLM 0.32's PEFTHelper._init_is_supported): the others
# (PiSSA, OLoRA, CorDA, LoftQ) change the base's weights when PEFT loads the adapter, so served on the
# unchanged base it computes something else.
SERVED_INITS = frozenset({"gaussian", "eva", "orthogonal", "mica", "lora_ga"})
# PEFT's default layer names for layers_to_transform (utils/constants.py COMMON_LAYERS_PATTERN)
COMMON_LAYERS = ("layers", "h", "block", "blocks", "layer")
MAX_PATTERN = 1000
_NESTED = re.compile(r"\((?:[^()\\]|\\.)*[+*}](?:[^()\\]|\\.)*\)\s*[+*{]")


def _invalid(message: str, hint: str = RETRAIN) -> Finding:
    return Finding(code="ADAPTER_CONFIG_INVALID", severity="error", message=message, hint=hint)


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def pattern_problem(pattern: str) -> str | None:
    """Why PATTERN may not be matched against module names (None: it may)."""
    if len(pattern) > MAX_PATTERN:
        return f"a regex of {len(pattern)} characters"
    try:
        re.compile(pattern)
    except re.error as exc:
        return f"an invalid regex ({exc})"
    if _NESTED.search(pattern):
        return "a regex with nested repetition, which can take exponential time to match"
    return None


def config_findings(config: dict[str, Any]) -> Iterable[Finding]:
    """The field types LoraConfig itself refuses, each as the one finding for its field."""
    dropout = config.get("lora_dropout", 0.0)
    if isinstance(dropout, bool) or not isinstance(dropout, int | float) or not 0 <= dropout < 1:
        yield _invalid(f"lora_dropout is {dropout!r}: PEFT takes a number in [0, 1)")
    for key in ("rank_pattern", "alpha_pattern"):
        yield from _pattern_map(key, config.get(key))
    init = config.get("init_lora_weights", True)
    if not isinstance(init, bool) and not (
        isinstance(init, str) and (init in INIT_METHODS or init.startswith("pissa_niter_"))
    ):
        yield _invalid(
            f"init_lora_weights is {init!r}: PEFT takes true, false or one of {', '.join(sorted(INIT_METHODS))}"
        )
    elif isinstance(init, str) and init.lower() not in SERVED_INITS:
        yield Finding(
            code="ADAPTER_INIT_UNSUPPORTED",
            severity="error",
            message=f"init_lora_weights is {init!r}: that initialisation changes the base model's weights when PEFT "
            "loads the adapter, so on the unchanged base the engine serves another model (vLLM refuses it: "
            '"vLLM does not support init_lora_weights")',
            hint="convert it to a plain LoRA with PEFT's save_pretrained(..., path_initial_model_for_weight_conversion="
            "...), or set init_lora_weights to true if the served base already holds the modified weights",
        )
    task = config.get("task_type")
    if task is not None and task not in TASK_TYPES:
        yield _invalid(f"task_type is {task!r}: PEFT takes one of {', '.join(sorted(TASK_TYPES))}")
    yield from _targets_config(config)
    params = config.get("target_parameters")
    if params not in (None, []):
        yield Finding(
            code="ADAPTER_TARGET_PARAMETERS",
            severity="error",
            message=f"target_parameters is {str(params)[:80]}: LoRA on raw parameters (MoE experts) is not served "
            "by vLLM, SGLang or LMI",
            hint="target modules (target_modules), or merge the adapter into the base and deploy the checkpoint",
        )


def _pattern_map(key: str, value: Any) -> Iterable[Finding]:
    """rank_pattern / alpha_pattern: module patterns (each a regex PEFT compiles) to numbers."""
    if value is None or value == {}:
        return
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) and not isinstance(v, bool) for k, v in value.items()
    ):
        yield _invalid(f"{key} is {str(value)[:80]}: PEFT takes a mapping of module patterns to numbers")
        return
    for pattern in value:
        if (problem := pattern_problem(pattern)) is not None:
            yield _invalid(f"{key} holds {problem}: {pattern[:80]!r}")


def _targets_config(config: dict[str, Any]) -> Iterable[Finding]:
    for key in ("target_modules", "exclude_modules"):
        value = config.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            if value != "all-linear" and (problem := pattern_problem(value)) is not None:
                yield _invalid(f"{key} is {problem}: {value[:80]!r}")
        elif not _strings(value):
            yield _invalid(f"{key} is {str(value)[:80]}: PEFT takes a regex or a list of module names")
    layers, pattern = config.get("layers_to_transform"), config.get("layers_pattern")
    if layers is not None and not (
        (isinstance(layers, int) and not isinstance(layers, bool))
        or (isinstance(layers, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in layers))
    ):
        yield _invalid(f"layers_to_transform is {str(layers)[:80]}: PEFT takes a layer index or a list of them")
    if pattern is not None and not (isinstance(pattern, str) or _strings(pattern)):
        yield _invalid(f"layers_pattern is {str(pattern)[:80]}: PEFT takes a name or a list of names")
    elif pattern not in (None, [], "") and layers is None:
        yield _invalid("layers_pattern is set without layers_to_transform, which PEFT refuses")


def covered(config: dict[str, Any], module: str) -> bool:
    """Whether PEFT creates a LoRA layer for MODULE (its name without base_model.model.), as
    check_target_module_exists decides: targets, then excludes, then layers_to_transform."""
    targets = config.get("target_modules")
    if targets is None or targets == "all-linear" or targets == ["all-linear"]:
        hit = True
    elif isinstance(targets, str):
        hit = re.fullmatch(targets, module) is not None
    else:
        hit = any(module == t or module.endswith(f".{t}") for t in targets)
    excludes = config.get("exclude_modules")
    if hit and isinstance(excludes, str):
        hit = re.fullmatch(excludes, module) is None
    elif hit and isinstance(excludes, list):
        hit = not any(module == e or module.endswith(f".{e}") for e in excludes)
    layers = config.get("layers_to_transform")
    if hit and layers is not None:
        wanted = {layers} if isinstance(layers, int) else set(layers)
        names = config.get("layers_pattern") or COMMON_LAYERS
        names = [names] if isinstance(names, str) else names
        found = None
        for name in names:
            match = re.match(rf".*\.{re.escape(name)}\.(\d+)\.", module)
            if match:
                found = int(match.group(1))
                break
        hit = found in wanted
    return hit


def coverage_findings(config: dict[str, Any], modules: list[str]) -> Iterable[Finding]:
    """Tensors for modules the config does not cover: PEFT never loads them, vLLM refuses the adapter.
    Only for a config config_findings passed (its regexes are then safe to run)."""
    stray = [m for m in modules if not covered(config, m)]
    if stray:
        yield Finding(
            code="ADAPTER_TARGET_UNCOVERED",
            severity="error",
            message=f"{len(stray)} adapted module(s) are outside the config's target_modules / exclude_modules / "
            f"layers_to_transform, e.g. {', '.join(stray[:3])}: PEFT never loads their tensors and vLLM refuses "
            "the adapter",
            hint="save the adapter with PEFT so adapter_config.json describes the modules it trained",
        )
