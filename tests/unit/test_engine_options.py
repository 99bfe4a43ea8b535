"""Raw engine keys judged by the engines' own parsers (data/engine_options.json): exact options only,
never an abbreviation argparse would expand, never one that loads code, files or bypasses the plan.

The differential: every option of each parser is put through the DLC entrypoint's translation
(SM_VLLM_FOO_BAR -> --foo-bar) and Python's own argparse with allow_abbrev, as the engines parse.
Whatever modeldrop accepts must resolve, in argparse, to exactly itself and to nothing refused.
"""

from __future__ import annotations

import argparse

import pytest

from modeldrop.contracts.models import DeploymentRequest
from modeldrop.contracts.step_payloads import ImageChoice
from modeldrop.serving.engine_env import KEYS, PLANNED
from modeldrop.serving.engine_options import (
    PLAN_READ_KEYS,
    _denied,
    engine_version,
    first_problem,
    option_table,
    options_of,
    raw_key_problem,
)

DEFAULT = {e: engine_version(e) for e in ("vllm", "sglang", "lmi")}  # type: ignore[arg-type]


def _image(engine: str, tag: str) -> ImageChoice:
    repo = {"vllm": "vllm", "sglang": "sglang", "lmi": "djl-inference"}[engine]
    return ImageChoice(
        engine=engine,  # type: ignore[arg-type]
        image_uri=f"763104351884.dkr.ecr.us-east-1.amazonaws.com/{repo}:{tag}",
        source="test",
        region="us-east-1",
    )


@pytest.mark.parametrize(
    "key",
    [
        "SM_VLLM_TRUST_REMOTE",
        "SM_VLLM_TRUST_REMOTE_CODE",
        "SM_VLLM_CONFIG",
        "SM_VLLM_TOOL_PARSER_PLUGIN",
        "SM_VLLM_REASONING_PARSER_PLUGIN",
        "SM_VLLM_MAX_NUM_SEQ",
        "SM_VLLM_GPU_MEMORY_UTIL",
        "SM_VLLM_HF_OVERRIDES",
        "SM_VLLM_LOAD_FORMAT",
        "SM_VLLM_SPECULATIVE_CONFIG",
        "SM_VLLM_MAX_NUM_BATCHED_TOKENS",
        "SM_VLLM_ENABLE_LORA",
        "SM_VLLM_PORT",
        "SM_VLLM_FOO_BAR",
    ],
)
def test_the_issues_vllm_keys_are_refused_naming_the_key(key: str) -> None:
    problem = raw_key_problem("vllm", key, DEFAULT["vllm"])
    assert problem is not None and key in problem[0] and problem[1]


@pytest.mark.parametrize(
    ("engine", "key"),
    [
        ("sglang", "SM_SGLANG_TRUST_REMOTE"),
        ("sglang", "SM_SGLANG_CONFIG"),
        ("lmi", "OPTION_ENABLE_LORA"),
        ("lmi", "OPTION_ENTRYPOINT"),
        ("lmi", "OPTION_TRUST_REMOTE_CODE"),
        ("lmi", "OPTION_ROLLING_BATCH"),
        ("lmi", "SERVING_LOAD_MODELS"),
        ("lmi", "OPTION_NOT_AN_OPTION"),
    ],
)
def test_sglang_and_lmi_keys_of_the_same_family_are_refused(engine: str, key: str) -> None:
    assert raw_key_problem(engine, key, DEFAULT[engine]) is not None  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("engine", "key"),
    [
        ("vllm", "SM_VLLM_ENABLE_PREFIX_CACHING"),
        ("vllm", "SM_VLLM_ENFORCE_EAGER"),
        ("vllm", "SM_VLLM_TOOL_CALL_PARSER"),
        ("vllm", "SM_VLLM_SERVED_MODEL_NAME"),
        ("vllm", "SM_VLLM_MAX_NUM_SEQS"),  # read by the plan, which checks it
        ("sglang", "SM_SGLANG_DISABLE_RADIX_CACHE"),
        ("lmi", "OPTION_ENFORCE_EAGER"),
        ("lmi", "OPTION_MAX_ROLLING_BATCH_SIZE"),
    ],
)
def test_ordinary_keys_pass(engine: str, key: str) -> None:
    assert raw_key_problem(engine, key, DEFAULT[engine]) is None  # type: ignore[arg-type]


def _argparse_like(options: frozenset[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=True, add_help=False)
    for option in sorted(options):
        parser.add_argument(option, dest=option, nargs="?")
    return parser


def _resolves_to(parser: argparse.ArgumentParser, flag: str) -> str | None:
    """What argparse makes of FLAG: the option it selects, or None (unknown or ambiguous)."""
    try:
        parsed = parser._parse_optional(flag)  # the real resolution, abbreviations included
    except SystemExit:  # ambiguous
        return None
    if not parsed:
        return None
    action = parsed[0][0] if isinstance(parsed, list) else parsed[0]
    return action.option_strings[0] if action is not None else None


@pytest.mark.parametrize(("engine", "prefix"), [("vllm", "SM_VLLM_"), ("sglang", "SM_SGLANG_")])
def test_every_accepted_key_is_exactly_one_allowed_option_in_argparse(engine: str, prefix: str) -> None:
    """Each option, and each prefix of it (every abbreviation a key could spell), through the DLC's
    translation and argparse: an accepted key must select exactly the option it names, never a
    refused one."""
    _used, options = options_of(engine, DEFAULT[engine].version)  # type: ignore[arg-type]
    parser = _argparse_like(options)
    accepted = refused = 0
    for option in options:
        for end in range(4, len(option) + 1):
            flag = option[:end]
            if flag.endswith("-") or "--" in flag[2:]:
                continue
            key = prefix + flag[2:].upper().replace("-", "_")
            if raw_key_problem(engine, key, DEFAULT[engine]) is not None:  # type: ignore[arg-type]
                refused += 1
                continue
            accepted += 1
            chosen = _resolves_to(parser, "--" + key[len(prefix) :].lower().replace("_", "-"))
            assert chosen == flag, f"{key} is accepted but argparse reads it as {chosen}"
            assert key in PLAN_READ_KEYS[engine] or _denied(chosen) is None
    assert accepted > 100 and refused > accepted  # the table is real and abbreviations are the common case


def test_every_key_the_plan_emits_is_an_option_of_the_default_engines() -> None:
    for engine in ("vllm", "sglang"):
        _used, options = options_of(engine, DEFAULT[engine].version)  # type: ignore[arg-type]
        prefix = "SM_VLLM_" if engine == "vllm" else "SM_SGLANG_"
        for meaning, key in KEYS[engine].items():
            assert "--" + key.removeprefix(prefix).lower().replace("_", "-") in options, (engine, meaning)
    _used, lmi = options_of("lmi", DEFAULT["lmi"].version)
    for meaning, key in KEYS["lmi"].items():
        if key.startswith("OPTION_"):
            assert key.removeprefix("OPTION_").lower() in lmi, meaning
    assert set(PLANNED) <= set(KEYS["vllm"])


def test_keys_are_judged_for_the_images_engine_version() -> None:
    """An option new in vLLM 0.30 is unknown to a 0.26 image and known to a 0.30 one."""
    table = option_table()["vllm"]
    new = sorted(set(table["0.30.0"]["options"]) - set(table["0.26.0"]["options"]))
    fresh = next(o for o in new if _denied(o) is None and not o.startswith("--no-"))
    key = "SM_VLLM_" + fresh[2:].upper().replace("-", "_")
    old = engine_version("vllm", _image("vllm", "0.26.0-gpu-py312-cu130-x").image_uri)
    newer = engine_version("vllm", _image("vllm", "0.30.0-gpu-py312-cu130-x").image_uri)
    assert old.version == "0.26.0" and newer.version == "0.30.0" and engine_version("vllm").version == "0.31.0"
    assert raw_key_problem("vllm", key, old) is not None and raw_key_problem("vllm", key, newer) is None
    lmi = engine_version("lmi", _image("lmi", "0.36.0-lmi27.0.0-cu130-v1.1").image_uri)
    assert lmi.version == "0.26.0" and "lmi27" in lmi.source
    undated = engine_version("vllm", _image("vllm", "server-sagemaker-cuda-v1.3").image_uri)
    assert undated.version == "0.31.0" and "no version" in undated.source


def test_a_request_with_a_refused_key_is_refused_before_anything_is_created() -> None:
    from modeldrop.contracts.errors import RequestInvalid
    from modeldrop.pipeline.config import DefaultsSettings
    from modeldrop.pipeline.deployment.steps import normalize

    raw = {"artifact_uri": "s3://bucket-a/m/model.tar.gz", "engine_env": {"SM_VLLM_TRUST_REMOTE": "1"}}
    DeploymentRequest.model_validate(raw)  # the shape is fine: the engine's parser is what refuses
    with pytest.raises(RequestInvalid, match="SM_VLLM_TRUST_REMOTE"):
        normalize(raw, "run-1", DefaultsSettings(), "arn:aws:states:us-east-1:1:execution:sm:run-1", 0)
    assert first_problem("vllm", {"OPTION_X": "1"}, DEFAULT["vllm"]) is None  # another engine's key: build_env names it
