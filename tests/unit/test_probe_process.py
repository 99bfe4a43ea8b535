"""The engine probe as a held process: a probe past its memory or time bound is stopped and said as such
(`failed`, never a verdict), its whole process group with it; it runs offline, with no credentials; and
the probe file itself refuses any connection beyond loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from modeldrop.checkpoint.engine import engine_check
from modeldrop.checkpoint.engine.engine_check import PROBE, engine_findings, from_probe, probe
from modeldrop.checkpoint.engine.probe_process import probe_env, run_probe
from modeldrop.contracts.engine_target import EngineVersion

TARGET = EngineVersion("vllm", "0.26.0", "the default image")


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "fake_probe.py"
    path.write_text(body)
    return path


def test_a_probe_past_its_memory_bound_is_stopped_with_its_children(tmp_path: Path) -> None:
    # A child (as vLLM's model inspection is) grows; the group's sum is what is bounded.
    fake = _script(tmp_path, "import subprocess, sys, time\n"
                   "child = subprocess.Popen([sys.executable, '-c', 'import time; b = bytearray(400 << 20); "
                   "b[::4096] = bytes(len(b[::4096])); time.sleep(600)'])\n"
                   "time.sleep(600)\n")  # fmt: skip
    run = run_probe([sys.executable, str(fake)], timeout=600, max_mb=200)
    assert run.died and "memory bound" in run.died and run.peak_mb > 200, run  # the memory bound, not the time
    for _ in range(100):  # SIGKILL is delivered at once; the kernel may take a moment to remove the process
        leftover = subprocess.run(["pgrep", "-f", "bytearray\\(400"], capture_output=True, text=True)
        if not leftover.stdout.strip():
            break
        time.sleep(0.1)
    assert leftover.stdout.strip() == "", "the probe's child outlived it"


def test_a_probe_past_its_time_bound_is_stopped(tmp_path: Path) -> None:
    fake = _script(tmp_path, "import time\ntime.sleep(600)\n")
    run = run_probe([sys.executable, str(fake)], timeout=1, max_mb=10_000)
    assert run.died and "time bound" in run.died


def test_a_probe_killed_by_a_signal_is_said_as_such(tmp_path: Path) -> None:
    fake = _script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    run = run_probe([sys.executable, str(fake)], timeout=600, max_mb=10_000)
    assert run.died and "SIGKILL" in run.died and "out-of-memory" in run.died


def test_a_dying_check_is_failed_and_an_error_never_a_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _script(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    monkeypatch.setattr(engine_check, "PROBE", fake)
    [line] = probe([tmp_path], sys.executable)
    check = from_probe(line, TARGET)
    assert check.verdict == "failed" and "died" in check.message
    [finding] = engine_findings(check)
    assert finding.code == "ENGINE_CHECK_FAILED" and finding.severity == "error"


def test_the_probe_runs_offline_without_the_callers_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-the-engine")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "nor-this")
    monkeypatch.setenv("HF_TOKEN", "nor-this")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/tmp/vllm-cache")
    env = probe_env()
    assert not {k for k in env if k.startswith("AWS_") or k.endswith("_TOKEN")}
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == "/tmp/vllm-cache"  # the engine's own settings pass


def test_the_probe_file_refuses_connections_beyond_loopback() -> None:
    """The probe's guard, loaded from its own file in a fresh interpreter (it installs an audit hook)."""
    code = f"import runpy, socket, json; g = runpy.run_path({str(PROBE)!r}, run_name='probe')\n" + (
        "g['_loopback_only']()\n"
        "out = {}\n"
        "for name, call in [('connect', lambda: socket.create_connection(('198.51.100.7', 443), timeout=1)),\n"
        "                   ('lookup', lambda: socket.getaddrinfo('huggingface.co', 443))]:\n"
        "    try:\n        call(); out[name] = 'reached'\n"
        "    except OSError as exc:\n        out[name] = str(exc)\n"
        "server = socket.create_server(('127.0.0.1', 0)); port = server.getsockname()[1]\n"
        "socket.create_connection(('127.0.0.1', port), timeout=5).close(); out['loopback'] = 'ok'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert "offline" in out["connect"] and "offline" in out["lookup"] and out["loopback"] == "ok", out


def test_the_pipelines_adapter_check_says_why_it_cannot_judge_and_fails_when_it_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A served copy with an adapter beside its base: an SGLang image is undetermined (its code does not run
    here) and an engine interpreter that cannot start is `failed` -- neither crashes the step."""
    import boto3
    from moto import mock_aws

    from modeldrop.contracts.artifact import Artifact
    from modeldrop.local.samples.adapter import write_adapter
    from modeldrop.local.samples.checkpoint import write_checkpoint
    from modeldrop.pipeline.deployment import engine_check_step

    base, adapter = write_checkpoint(tmp_path / "base"), write_adapter(tmp_path / "lora")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="served")
        for path in base.iterdir():
            s3.put_object(Bucket="served", Key=f"d/{path.name}", Body=path.read_bytes())
        for path in adapter.iterdir():
            s3.put_object(Bucket="served", Key=f"d/adapters/lora/{path.name}", Body=path.read_bytes())
        served = Artifact.parse("s3://served/d/")
        monkeypatch.delenv(engine_check_step.ENABLED_ENV, raising=False)  # the suite turns it off by default
        monkeypatch.setattr(engine_check_step, "engine_python", lambda: str(tmp_path / "no-such-python"))
        sglang = engine_check_step.check_served(s3, served, EngineVersion("sglang", "0.5.15", "the SGLang image"))
        assert sglang.verdict == "undetermined" and "SGLang" in sglang.message
        failed = engine_check_step.check_served(s3, served, TARGET)
        assert failed.verdict == "failed" and "could not start" in failed.message, failed


def test_an_engine_venv_without_vllm_is_the_machines_fault_not_the_checkpoints(tmp_path: Path) -> None:
    """An interrupted `make vllm-venv` leaves an interpreter that cannot import vLLM: the check is undetermined
    (the static verdict stands, exit 0 on the tool's own sample), and its fix names make vllm-venv."""
    import os

    from modeldrop.local.samples.checkpoint import write_checkpoint

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    empty = str(tmp_path / "venv" / "bin" / "python")
    sample = write_checkpoint(tmp_path / "sample")
    check = engine_check.engine_check(sample, TARGET, empty)
    assert check.verdict == "undetermined" and "No module named 'vllm'" in check.message, check
    [finding] = engine_findings(check)
    assert finding.severity == "warning" and "make vllm-venv" in finding.hint
    env = {**os.environ, "MODELDROP_VLLM_PYTHON": empty}
    env.pop("MODELDROP_ENGINE_CHECK", None)
    done = subprocess.run([sys.executable, "-m", "modeldrop", "validate", str(sample), "--json"],
                          capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["engine_check"]["verdict"] == "undetermined", done.stdout[-2000:]
    assert any("make vllm-venv" in f["hint"] for f in report["findings"])
