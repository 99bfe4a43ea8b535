"""Which raw `engine_env` keys may reach a container: exactly an option the image's engine parser
defines (data/engine_options.json, generated from the parsers by tools/gen_engine_options.py), and
none that loads code, reads a file or config the validation never saw, or bypasses the plan.

Why exact: the vLLM and SGLang DLC entrypoints turn SM_VLLM_FOO_BAR into `--foo-bar` and argparse
expands an unambiguous prefix, so SM_VLLM_TRUST_REMOTE reached `--trust-remote-code` and
SM_VLLM_MAX_NUM_SEQ bypassed the planned `--max-num-seqs`. An exact name is never expanded.
LMI reads OPTION_<KEY> as option.<key> by exact name: its documented options and, through its vLLM
rolling batch, vLLM's engine arguments.
"""

from __future__ import annotations

import json
import re
from functools import cache
from importlib import resources
from typing import Any

from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.contracts.errors import ImageUnresolvable
from modeldrop.contracts.step_payloads import Engine
from modeldrop.serving.engine_env import ALIASES, ENGINE_PREFIX, KEYS

# The raw keys serving/plan.py `_planned_from_raw_keys` reads into the plan (and checks): planned, not
# bypassed. Derived from the one key mapping, so a new spelling there is one here.
_PLAN_READ_MEANINGS = ("max_model_len", "max_num_seqs", "gpu_memory_utilization")
PLAN_READ_KEYS = {
    engine: frozenset({KEYS[engine][m] for m in _PLAN_READ_MEANINGS if m in KEYS[engine]})
    | frozenset(k for k, m in ALIASES[engine].items() if m in _PLAN_READ_MEANINGS)
    for engine in KEYS
}

# (pattern on the option name with `--`/`no-` removed and `_` read as `-`, why it is refused, the fix)
_DENY: tuple[tuple[str, str, str], ...] = (
    (
        r"trust-remote-code|trust-request|plugin|(^|-)cls$|class|middleware|logits-processors|worker-extension"
        r"|distributed-executor-backend|entrypoint|model-impl|^task$|custom-|allow-.*-code",
        "makes the engine import or run code the validation never judged",
        "no raw key may load code; the one way to run a checkpoint's own code is engine_settings.trust_remote_code, "
        "which the stack must allow",
    ),
    (
        r"speculative|^spec-|draft",
        "loads a draft model the memory plan does not count",
        "use engine_settings.speculative, which the plan checks",
    ),
    (
        r"lora",
        "sets LoRA serving, which the plan decides from the validated adapters",
        "deploy adapters as adapters (--base, adapter_mode): the plan sets the LoRA flags and slots",
    ),
    (
        r"max-model-len|context-length|max-num|max-running-requests|max-rolling-batch|memory|mem-fraction"
        r"|parallel|^tp$|^pp$|^dp$|tp-size|dp-size|pp-size|batched-tokens|prefill-tokens|kv-cache-dtype"
        r"|cpu-offload|swap-space|offload|gpu-blocks|cache-gb|kv-cache-memory|max-total-tokens|chunked-prefill-size"
        r"|cuda-graph-max-bs|^dtype$|^quantiz|^limit-mm|^rolling-batch$|model-loading-timeout|^device",
        "bypasses the memory plan: the plan sets concurrency, context, memory fraction, parallelism, dtype, "
        "quantization and media limits, and checks them against the GPU",
        "use the named options (--max-num-seqs, --max-model-len, --gpu-memory-utilization, --dtype, "
        "--quantization, --tensor-parallel-size, --limit-mm-per-prompt)",
    ),
    (
        r"^host$|^port$|port$|api-key|ssl|root-path|^uds$|allowed-|grpc|headless|api-server-count|disable-fastapi",
        "breaks the SageMaker container contract (port 8080, /ping and /invocations open to SageMaker)",
        "SageMaker sets the server's address; authentication is IAM on InvokeEndpoint",
    ),
    (
        r"config|overrides?$|override-|load-format|loader|file|path|-dir$|^dir$|download|revision|tokenizer$"
        r"|tokenizer-revision|chat-template$|generation-config|^model$|^model-id$|^checkpoint$|hf-|^s3-|url",
        "makes the engine read files, configs or weights other than the validated checkpoint",
        "the served model, config, tokenizer and chat template are the validated checkpoint's own",
    ),
)
_DENY_RE = tuple((re.compile(p), why, fix) for p, why, fix in _DENY)
_TAG_VERSION = re.compile(r"^v?(\d+\.\d+\.\d+)")
_LMI_AXIS = re.compile(r"-lmi(\d+)\.(\d+)\.(\d+)")


__all__ = ["EngineVersion", "engine_version", "first_problem", "raw_key_problem", "resolved_version"]


@cache
def option_table() -> dict[str, Any]:
    text = resources.files("modeldrop.serving").joinpath("data/engine_options.json").read_text()
    table: dict[str, Any] = json.loads(text)
    return table


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def _nearest(known: list[str], version: str) -> str:
    """The newest known version not newer than VERSION (the oldest known when all are newer)."""
    older = [v for v in known if _key(v) <= _key(version)]
    return max(older, key=_key) if older else min(known, key=_key)


def _default_tag(engine: Engine) -> str:
    from modeldrop.serving.image import image_table

    return str(image_table()["engines"][engine]["tag"])


def engine_version(engine: Engine, image_uri: str | None = None) -> EngineVersion:
    """The engine version of IMAGE_URI's tag (the stack's default image when None or unreadable)."""
    from modeldrop.serving.image import image_table

    tag = image_uri.rsplit(":", 1)[-1] if image_uri is not None else _default_tag(engine)
    source = f"image tag {tag}"
    if engine == "lmi":
        axis = _LMI_AXIS.search(tag) or _LMI_AXIS.search(_default_tag(engine))
        bundled: dict[str, str] = image_table()["lmi_bundled_vllm"]
        major = axis.group(1) if axis else ""
        vllm = bundled.get(major) or bundled[max(bundled, key=int)]
        return EngineVersion("lmi", vllm, f"{source}: lmi{major} bundles vLLM {vllm}")
    match = _TAG_VERSION.match(tag)
    if match is None:
        default = _TAG_VERSION.match(_default_tag(engine))
        assert default is not None
        return EngineVersion(engine, default.group(1), f"{source} names no version: judged as the default image")
    return EngineVersion(engine, match.group(1), source)


def resolved_version(engine: Engine, region: str, env: Any) -> EngineVersion:
    """The engine version of the image ENV and REGION resolve for ENGINE, as ResolveImage will choose it
    (the default image's when that cannot resolve: the plan reports why)."""
    from modeldrop.serving.image import resolve_image

    try:
        return engine_version(engine, resolve_image(engine, region, env).image_uri)
    except ImageUnresolvable:
        return engine_version(engine)


def options_of(engine: Engine, version: str) -> tuple[str, frozenset[str]]:
    """(the version whose parser is used, its option names: `--x` for vLLM/SGLang, `x` for LMI)."""
    table = option_table()
    if engine == "lmi":
        by_version: dict[str, list[str]] = table["lmi"]["vllm_engine_args"]
        used = _nearest(list(by_version), version)
        return used, frozenset(table["lmi"]["documented"]) | frozenset(by_version[used])
    versions: dict[str, Any] = table[engine]
    used = _nearest(list(versions), version)
    return used, frozenset(versions[used]["options"])


def _denied(name: str) -> tuple[str, str] | None:
    bare = name.removeprefix("--").replace("_", "-").removeprefix("no-")
    for pattern, why, fix in _DENY_RE:
        if pattern.search(bare):
            return why, fix
    return None


def _abbreviates(option: str, options: frozenset[str]) -> list[str]:
    """What argparse could expand OPTION to (the options it is a prefix of)."""
    return sorted(o for o in options if o.startswith(option) and o != option)


def raw_key_problem(engine: Engine, key: str, version: EngineVersion) -> tuple[str, str] | None:
    """(why KEY may not go in engine_env, the fix), or None. KEY already carries the engine's prefix."""
    used, options = options_of(engine, version.version)
    label = f"{'vLLM' if engine != 'sglang' else 'SGLang'} {used}" + (" (inside LMI)" if engine == "lmi" else "")
    if engine == "lmi":
        if key.startswith("SERVING_"):
            return (
                f"{key}: raw SERVING_* keys are not accepted (they configure DJL Serving itself: the models it "
                "loads, its JVM options, its workers)",
                "LMI needs none for a SageMaker endpoint; pass engine settings as OPTION_* keys",
            )
        option = key.removeprefix("OPTION_").lower()
        shown = f"option.{option}"
    else:
        prefix = "SM_VLLM_" if engine == "vllm" else "SM_SGLANG_"
        option = "--" + key.removeprefix(prefix).lower().replace("_", "-")
        shown = option
    if option not in options:
        expands = _abbreviates(option, options) if engine != "lmi" else []
        if expands:
            what = expands[0] if len(expands) == 1 else f"one of {', '.join(expands[:4])}"
            fix = "spell the option in full"
            if len(expands) == 1 and _key_of(engine, expands[0]) in PLAN_READ_KEYS[engine]:
                fix = f"spell it in full ({expands[0]}): the plan reads that one and checks it"
            elif len(expands) == 1 and (target := _denied(expands[0])) is not None:
                fix = f"none as a raw key: {expands[0]} itself is refused, as it {target[0]}; {target[1]}"
            return f"{key} becomes {shown}, which {label}'s parser would expand to {what}: an abbreviation", fix
        return (
            f"{key} becomes {shown}, which is not an option of {label} (judged for {version.source})",
            "check the spelling against the engine's documentation for that version",
        )
    if key in PLAN_READ_KEYS[engine]:
        return None
    denied = _denied(option)
    if denied is not None:
        return f"{key} ({shown}) is refused: it {denied[0]}", denied[1]
    return None


def _key_of(engine: Engine, option: str) -> str:
    """The raw key the DLC entrypoint turns into OPTION (the way back of its translation)."""
    return ENGINE_PREFIX[engine][0] + option.removeprefix("--").upper().replace("-", "_")


def first_problem(engine: Engine, passthrough: Any, version: EngineVersion) -> tuple[str, str] | None:
    """(why, fix) for the first raw key of PASSTHROUGH refused for VERSION, or None. Keys of another
    engine's prefix are left to build_env, which names their owner."""
    for key in passthrough:
        if key.startswith(ENGINE_PREFIX[engine]) and (problem := raw_key_problem(engine, key, version)):
            return problem
    return None
