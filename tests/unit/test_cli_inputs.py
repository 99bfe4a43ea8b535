"""Inputs a user can mistype, refused as one line (one JSON object with --json), exit 2, no traceback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from modeldrop.cli import app

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "gemma4-text-dense"


@pytest.mark.parametrize("source", ["s3:///x/", "s3://UPPER/x/", "/tmp/" + "x" * 5000])
def test_validate_of_an_unusable_source_is_one_json_object_and_exit_2(source: str) -> None:
    result = CliRunner().invoke(app, ["validate", source, "--json"])
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout)["error"] == "CheckpointUnreadable"
    assert "Traceback" not in result.output


def test_validate_of_a_fifo_named_like_an_archive_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "model.tar.gz"
    os.mkfifo(fifo)
    result = CliRunner().invoke(app, ["validate", str(fifo), "--json"])
    assert result.exit_code == 2 and "not a regular file" in json.loads(result.stdout)["message"]


@pytest.mark.parametrize(
    "env",
    [
        "SM_VLLM_TRUST_REMOTE=1",
        "SM_VLLM_CONFIG=/opt/ml/model/x.yaml",
        "SM_VLLM_TOOL_PARSER_PLUGIN=/opt/ml/model/p.py",
        "SM_VLLM_MAX_NUM_SEQ=1024",
    ],
)
def test_plan_refuses_engine_keys_that_load_code_or_bypass_the_plan(env: str) -> None:
    result = CliRunner().invoke(app, ["plan", str(FIXTURE), "--region", "us-east-1", "--env", env, "--json"])
    assert result.exit_code == 2, result.output
    refused = json.loads(result.stdout)
    assert refused["error"] == "EngineKeyRefused" and env.split("=")[0] in refused["message"]


def test_plan_accepts_an_ordinary_engine_flag() -> None:
    args = ["plan", str(FIXTURE), "--region", "us-east-1", "--env", "SM_VLLM_ENABLE_PREFIX_CACHING=", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["env"]["SM_VLLM_ENABLE_PREFIX_CACHING"] == ""


def test_a_value_the_parser_refuses_is_one_json_object_with_json() -> None:
    import subprocess
    import sys

    args = [sys.executable, "-c", "from modeldrop.cli import main; main()", "plan", str(FIXTURE)]
    done = subprocess.run([*args, "--max-model-len", "0", "--json"], capture_output=True, text=True)
    assert done.returncode == 2 and json.loads(done.stdout)["error"] == "UsageError", done.stdout + done.stderr
    assert "--max-model-len" in json.loads(done.stdout)["message"]


def test_an_s3_key_with_a_newline_is_refused_where_it_is_typed() -> None:
    from modeldrop.contracts.s3uri import parse_s3_uri

    with pytest.raises(ValueError, match="control character"):
        parse_s3_uri("s3://bucket-a/runs\n/model.tar.gz")
    result = CliRunner().invoke(app, ["validate", "s3://bucket-a/runs\n/model.tar.gz", "--json"])
    assert result.exit_code == 2 and "control character" in json.loads(result.stdout)["message"]


def test_upload_refuses_a_marker_that_could_never_deploy_before_uploading(tmp_path: Path) -> None:
    import shutil

    directory = tmp_path / "ck"
    shutil.copytree(FIXTURE, directory)
    for args, says in (
        (["--engine", "vlm"], "choose vllm, sglang or lmi"),
        (["--instance-type", "ml.g6.2xlarg"], "not a SageMaker hosting instance type"),
    ):
        result = CliRunner().invoke(app, ["upload", str(directory), "s3://bucket-a/p/", *args, "--json"])
        assert result.exit_code == 2 and says in json.loads(result.stdout)["message"], result.output
    (directory / "modeldrop.json").write_text('{"ttl_hours": 2}')
    result = CliRunner().invoke(app, ["upload", str(directory), "s3://bucket-a/p/", "--json"])
    assert result.exit_code == 2 and "--merge-marker" in json.loads(result.stdout)["hint"]
    from modeldrop.cli.upload_commands import _marker_overrides

    assert _marker_overrides(directory, "lmi", None, merge=True) == {"ttl_hours": 2, "engine": "lmi"}


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--channel", "demo", "--adapter"], "no --adapter, --prefix or --engine"),
        (["--channel", "demo", "--prefix"], "no --adapter, --prefix or --engine"),
        (["--channel", "Demo_1"], "channel name"),
        (["--channel", "x" * 25], "channel name"),
    ],
)
def test_run_local_refuses_a_channel_it_cannot_play(args: list[str], says: str) -> None:
    result = CliRunner().invoke(app, ["run-local", *args, "--json"])
    assert result.exit_code == 2, result.output
    assert says in json.loads(result.stdout)["message"] and "Traceback" not in result.output


@pytest.mark.parametrize("command", [["run-local"], ["local", "up"]])
def test_a_command_whose_extra_is_missing_names_the_extra_and_exits_2(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pip install ".[cli]"` then `modeldrop run-local`: one line naming the extra, never a traceback."""
    import importlib.util

    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "moto" else found(name, *a))
    result = CliRunner().invoke(app, command)
    assert (result.exit_code == 2 and result.exception is None) or isinstance(result.exception, SystemExit)
    assert "`local` extra" in result.output and 'pip install ".[local]"' in result.output, result.output
    assert "Traceback" not in result.output


def test_plan_refuses_a_region_sagemaker_has_not_before_computing_anything(tmp_path: Path) -> None:
    from modeldrop.local.samples.checkpoint import write_checkpoint

    folder = write_checkpoint(tmp_path / "c")
    result = CliRunner().invoke(app, ["plan", str(folder), "--region", "us-est-1"])
    assert result.exit_code == 2 and "not a region SageMaker runs in" in result.output, result.output
    assert "did you mean" in result.output and "memory" not in result.output.lower()  # nothing was planned
    swapped = CliRunner().invoke(app, ["plan", str(folder), "--region", "us-esat-1"])
    assert swapped.exit_code == 2 and "did you mean us-east-1?" in swapped.output, swapped.output


def test_close_matches_are_close_and_of_the_kind_asked_for() -> None:
    """By edit distance (a swap of two neighbours is one edit), and within the family: a GPU type asked for
    is answered with GPU types only."""
    from modeldrop.contracts.instance_types import closest, is_gpu
    from modeldrop.contracts.text import edit_distance, nearest

    assert edit_distance("us-esat-1", "us-east-1") == 1 and edit_distance("us-esat-1", "us-west-1") == 2
    assert nearest("us-esat-1", ["us-west-1", "us-east-1", "eu-west-1"]) == ["us-east-1"]
    assert nearest("zz-nowhere-9", ["us-east-1"]) == []
    assert closest("ml.g99.huge") and all(is_gpu(t) for t in closest("ml.g99.huge"))
    assert closest("ml.g6.2xlarg")[0] == "ml.g6.2xlarge"
    assert closest("ml.p5.48xlarg")[0] == "ml.p5.48xlarge"


@pytest.mark.parametrize("command", [["doctor"], ["list"], ["status", "x"], ["channels"]])
def test_every_aws_command_refuses_an_unknown_region_before_any_call(
    command: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pointed at an address where nothing listens: a call would blame the network, not the typo."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    result = CliRunner().invoke(app, [*command, "--region", "mars-1"])
    assert result.exit_code == 2 and "not a region SageMaker runs in" in result.output, result.output
    assert "cannot reach" not in result.output and "Traceback" not in result.output


def test_a_shell_pointed_at_a_stopped_local_stack_is_told_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from modeldrop.operate.aws_problems import stopped_stack_problem

    state = tmp_path / "mine.json"
    env = {"MODELDROP_LOCAL_STATE": str(state), "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    assert "is stopped" in str(stopped_stack_problem(env))
    state.write_text(json.dumps({"endpoint_url": "http://127.0.0.1:10"}))
    assert "was restarted at http://127.0.0.1:10" in str(stopped_stack_problem(env))
    state.write_text(json.dumps({"endpoint_url": "http://127.0.0.1:9"}))
    assert stopped_stack_problem(env) is None  # running: a refused connection is something else
    assert stopped_stack_problem({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}) is None  # not local up's exports
    monkeypatch.setenv("MODELDROP_LOCAL_STATE", str(tmp_path / "gone.json"))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    import botocore.endpoint

    calls: list[object] = []
    monkeypatch.setattr(botocore.endpoint.Endpoint, "make_request", lambda *a, **k: calls.append(a))
    result = CliRunner().invoke(app, ["list", "--json"])
    assert result.exit_code == 2 and json.loads(result.stdout)["error"] == "LocalStackStopped", result.output
    assert calls == []  # said before any call: not after the SDK's retries of a refused connection (~11 s)


def test_local_stacks_are_the_users_own_per_directory_or_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from modeldrop.local.stack.daemon import stack_name, state_path

    monkeypatch.delenv("MODELDROP_LOCAL_STATE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    here = state_path()
    monkeypatch.chdir(tmp_path / "b")
    assert state_path() != here and here.parent == state_path().parent == tmp_path / "state/modeldrop/local-stacks"
    assert here.name.startswith("a-") and stack_name("demo") == "demo"
    with pytest.raises(ValueError, match="not a local stack name"):
        stack_name("../x")
    (here.parent / "junk.json").write_text("not a state")  # listed over, not a refusal of the whole status
    result = CliRunner().invoke(app, ["local", "status", "--json"])
    assert result.exit_code == 1 and json.loads(result.stdout) == {"current": None, "stacks": [], "problem": None}


def test_the_build_refuses_a_python_it_does_not_support_in_one_line() -> None:
    import shutil
    import subprocess

    old = shutil.which("python3.11") or next(iter(Path.home().glob(".pyenv/versions/3.11*/bin/python3.11")), None)
    if old is None:
        pytest.skip("no Python 3.11 on this machine to build with")
    backend = Path(__file__).resolve().parents[2] / "tools" / "build_backend"
    done = subprocess.run([str(old), "-c", "import modeldrop_build"], cwd=backend, capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert "modeldrop needs Python 3.12 or newer" in done.stderr and "this is Python 3.11" in done.stderr
