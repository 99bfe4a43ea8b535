"""The engine's verdict in the checkpoint commands: `validate` (directories, archives and S3 sources,
several in one engine process), `upload` and `repair` apply the one rule the pipeline's EngineCheck
applies (engine_refusal), so a command never calls deployable what another refuses."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modeldrop.cli._shared import console, fail


@dataclass
class Judged:
    """One source as validate read it: its report and, for an archive or S3 source, its scan."""

    source: str
    report: Any
    scan: Any = None
    base: str | None = None
    base_scan: Any = None


def engine_check_off(asked_off: bool) -> str | None:
    """Why the engine's check does not run by default here (None: it runs)."""
    from modeldrop.checkpoint.engine.engine_check import engine_python

    if asked_off:
        return "not asked (--no-engine-check): the static rules judged alone"
    if os.environ.get("MODELDROP_ENGINE_CHECK") == "Disabled":
        return "MODELDROP_ENGINE_CHECK is Disabled: the static rules judged alone"
    if engine_python() is None:
        return (
            "no engine here (the vLLM venv: `make vllm-venv` in a clone, or MODELDROP_VLLM_PYTHON): the static rules "
            "judged alone"
        )
    return None


def require_engine() -> None:
    """--engine-check asked for explicitly: exit 2 when there is no engine venv to ask."""
    from modeldrop.checkpoint.engine.engine_check import ENGINE_VENV_FIX, engine_python

    if engine_python() is None:
        fail("--engine-check needs the engine venv, which is absent", ENGINE_VENV_FIX)


def engine_line(check: Any) -> str:
    """The engine's verdict in one line of the text output."""
    if check is None:
        return "-"
    who = f"vLLM {check.version}" if check.version else "the engine"
    if check.verdict == "loads":
        if check.strict_not_loaded:
            return f"{who} would serve uninitialised weights: {check.strict_not_loaded[0]}"
        return f"{who} loads it" + (" (the engine venv's release, not the image's)" if check.note else "")
    if check.verdict == "refused":
        return f"{who} refuses it: {check.message.splitlines()[0][:200] if check.message else check.stage}"
    return f"{who} could not judge it: {check.message.splitlines()[0][:200] if check.message else check.verdict}"


def judge_by_engine(entries: Sequence[Judged], target: Any, not_judged: str | None) -> list[Any]:
    """Each entry's report with the engine's verdict and its findings (the stricter of the two stands),
    every source in one engine process; or with why the engine did not judge it."""
    from modeldrop.checkpoint.engine.engine_check import EngineCheck, judge_many
    from modeldrop.checkpoint.validation import default_target

    target = target or default_target()
    if not_judged is not None:
        why = EngineCheck(engine=target.engine, verdict="unavailable", judged_for=target.describe(), message=not_judged)
        return [e.report.model_copy(update={"engine_check": why}) for e in entries]
    skipped = EngineCheck(engine=target.engine, verdict="skipped", judged_for=target.describe(), message="not "
                          "started: the static rules refused the checkpoint (fix their findings first, then the "
                          "engine judges it)")  # fmt: skip
    judged = [e for e in entries if e.report.deployable]  # never started on what the static rules refused
    with tempfile.TemporaryDirectory(prefix="modeldrop-judge-") as tmp, _asking():
        items = [_directories(e, Path(tmp) / str(i)) for i, e in enumerate(judged)]
        checks = dict(zip((id(e) for e in judged), judge_many(items, target), strict=True))
    return [_with_check(e.report, checks[id(e)]) if id(e) in checks else
            e.report.model_copy(update={"engine_check": skipped}) for e in entries]  # fmt: skip


def with_engine_check(report: Any, source: str, target: Any, base: str | None = None) -> Any:
    """REPORT of the local directory SOURCE (an adapter on BASE) with the engine's verdict."""
    return judge_by_engine([Judged(source, report, base=base)], target, None)[0]


def _with_check(report: Any, check: Any) -> Any:
    from modeldrop.checkpoint.engine.engine_check import engine_findings

    findings = [*report.findings, *engine_findings(check)]
    deployable = not any(f.severity == "error" for f in findings)
    return report.model_copy(update={"engine_check": check, "findings": findings, "deployable": deployable})


def _directories(entry: Judged, tmp: Path) -> tuple[Path, Path | None]:
    """What the probe reads for ENTRY: the directory itself, or a skeleton of an archive or S3 source
    (its side files and headers, no weight byte); its base too when it is an adapter."""
    from modeldrop.checkpoint.engine.skeleton import write_skeleton

    def local(source: str, scan: Any, name: str) -> Path:
        if Path(source).is_dir() or scan is None:
            return Path(source)
        return write_skeleton(scan, tmp / name)

    model = local(entry.source, entry.scan, "model")
    if entry.report.adapter is None or entry.base is None:
        return model, None
    return model, local(entry.base, entry.base_scan, "base")


@contextlib.contextmanager
def _asking() -> Iterator[None]:
    with console.status("asking the engine's own code") if console.is_terminal else contextlib.nullcontext():
        yield
