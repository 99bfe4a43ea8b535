"""Every command example of the README and the docs (their ```bash blocks) is run here, as written,
so that a page cannot drift from the tool: the local ones as they are, the account ones against the
local stack (`modeldrop local up`), their placeholders filled in with what that stack holds. Usage
synopses (optional parts in brackets, placeholders in capitals) are ```text blocks, not examples."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMAND = [sys.executable, "-m", "modeldrop"]
# Run elsewhere, as written: `make test` is CI itself (.ci/run), `make sam-build` and `sam deploy`
# need the SAM CLI and an account (the build is tests/scenarios/test_shipped_artifact.py's, the
# template is checked by `sam validate --lint`), `pip install` needs the network; the real engine's
# run-local is tests/scenarios/test_real_engine.py's (the same command line).
ELSEWHERE = {
    "make test": "the Makefile's test target",
    "make sam-build": "the Makefile's sam-build target",
    ".venv-sam/bin/sam deploy": "sam validate --lint",
    'pip install ".[cli]"': "pyproject's cli extra",
    "modeldrop run-local --engine vllm": "tests/scenarios/test_real_engine.py",
    "make engine-image": "tests/scenarios/test_engine_image.py (make test builds it)",
    # The whole build: the zip functions are `make sam-build`'s, the image `make engine-image`'s.
    ".venv-sam/bin/sam build": "make sam-build + make engine-image (tests/scenarios/test_engine_image.py)",
}
# Exit codes the pages document for their examples: a failure path exits 1, as designed.
EXPECTED_EXIT = {"modeldrop run-local --fault oom --json": 1, "modeldrop run-local --fault adapter-load --json": 1}


def examples() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(), flags=re.S):
            for line in block.splitlines():
                command = line.split("  #", 1)[0].strip()
                if command and not command.startswith("#"):
                    found.append((page.name, command))
    return found


def test_the_readme_is_short_and_every_example_is_a_known_kind() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
    for page, command in examples():
        known = command.startswith(("modeldrop ", "make ", 'eval "$(modeldrop ')) or any(
            command.startswith(prefix) for prefix in ELSEWHERE
        )
        assert known, (page, command)
    makefile = (ROOT / "Makefile").read_text()
    for command in {c for _p, c in examples() if c.startswith("make ")}:
        assert f"\n{command.split()[1]}:" in makefile, command
    assert '"cli"' in (ROOT / "pyproject.toml").read_text() or "cli = [" in (ROOT / "pyproject.toml").read_text()
    real_engine = (ROOT / "tests" / "scenarios" / "test_real_engine.py").read_text()
    assert '"run-local", "--engine", "vllm"' in real_engine


def _files(tmp: Path) -> dict[str, str]:
    from modeldrop.local.samples.checkpoint import BROKEN_DROP, write_checkpoint

    checkpoint = tmp / "my-checkpoint"  # written by the README's own `modeldrop sample ./my-checkpoint`
    base = write_checkpoint(tmp / "base-model")
    broken = write_checkpoint(tmp / "broken-checkpoint", drop_kv_shared=True, drop=BROKEN_DROP)  # repair's case
    cases = tmp / "cases.jsonl"
    cases.write_text(json.dumps({"id": "hello", "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    return {
        "./my-checkpoint": str(checkpoint),
        "./broken-checkpoint": str(broken),
        "./base-model": str(base),
        "./repaired": str(tmp / "repaired"),
        "./cases.jsonl": str(cases),
    }


def _run(command: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = shlex.split(command)
    assert argv[0] == "modeldrop", command
    return subprocess.run(
        [*COMMAND, *argv[1:]], capture_output=True, text=True, env=env, cwd=cwd, timeout=900
    )  # fmt: skip


@pytest.fixture
def local_stack(tmp_path: Path) -> Any:
    # The engine check's probe (seconds per deployment) is test_engine_check's: here every step still runs.
    env = {
        **os.environ,
        "MODELDROP_LOCAL_STATE": str(tmp_path / "local-stack.json"),
        "MODELDROP_ENGINE_CHECK": "Disabled",
    }
    env = {k: v for k, v in env.items() if not k.startswith("AWS_")}
    up = subprocess.run([*COMMAND, "local", "up", "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads(up.stdout)
    try:
        yield state, {**env, **state["env"]}
    finally:
        down = subprocess.run([*COMMAND, "local", "down", "--json"], capture_output=True, text=True, env=env)
        assert json.loads(down.stdout) == {"stopped": True}, down.stdout + down.stderr
        assert not Path(env["MODELDROP_LOCAL_STATE"]).exists()


# What needs no stack: these examples run in tests/scenarios/test_doc_examples_local.py, on a worker
# of their own beside the stack's (the two halves of the pages' examples at once, not one after the other).
LOCAL_ONLY = ("modeldrop run-local", "modeldrop validate", "modeldrop plan", "modeldrop repair", "modeldrop --version")


def local_examples() -> list[tuple[str, str]]:
    """The pages' examples that need no stack, each once (`make run-local` is three pages' first step)."""
    found: dict[str, str] = {}
    for page, command in examples():
        command = "modeldrop run-local" if command == "make run-local" else command
        if command.startswith(LOCAL_ONLY) and not command.startswith(tuple(ELSEWHERE)):
            found.setdefault(command, page)
    return [(page, command) for command, page in found.items()]


def run_example(
    command: str, env: dict[str, str], work: Path, fill: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    for placeholder, value in fill.items():
        command = command.replace(placeholder, value)
    return _run(command, env, work)


def test_every_example_runs_as_written(local_stack: Any, tmp_path: Path) -> None:
    state, env = local_stack
    work = tmp_path / "work"
    work.mkdir()
    fill = _files(work)
    seen: dict[str, str] = {}
    ran = 0
    for page, command in examples():
        if any(command.startswith(prefix) for prefix in ELSEWHERE) or command.startswith("make "):
            continue
        if command.startswith(LOCAL_ONLY):
            continue  # test_doc_examples_local.py
        if command.startswith('eval "$(modeldrop local'):
            continue  # the fixture's `local up`, whose env every command below gets
        if "$(modeldrop local env --bucket)" in command:
            command = command.replace("$(modeldrop local env --bucket)", state["bucket"])
        for placeholder, value in fill.items():
            command = command.replace(placeholder, value)
        command = command.replace("<ArtifactBucketName>", state["bucket"]).replace("--stack modeldrop", "")
        if "<latest-deployment-id>" in command:
            command = command.replace("<latest-deployment-id>", seen["latest"])
        if "<deployment-id>" in command or "<endpoint-name>" in command:
            command = command.replace("<deployment-id>", seen["deployment_id"])
            command = command.replace("<endpoint-name>", seen["endpoint_name"])
        if command.startswith("modeldrop local down"):
            continue  # the fixture's, after the last example
        done = _run(command, env, work)
        expected = EXPECTED_EXIT.get(command, 0)
        assert done.returncode == expected, (page, command, done.stdout[-2000:], done.stderr[-2000:])
        assert "Traceback" not in done.stderr, (page, command, done.stderr[-2000:])
        ran += 1
        if command.startswith("modeldrop upload"):
            listed = json.loads(_run("modeldrop list --json", env, work).stdout)
            newest = {"deployment_id": listed[0]["deployment_id"], "endpoint_name": listed[0]["endpoint_name"]}
            seen = {**newest, **seen, "latest": newest["deployment_id"]}
    assert ran >= 15 and seen, (ran, seen)
    assert len(local_examples()) >= 8
