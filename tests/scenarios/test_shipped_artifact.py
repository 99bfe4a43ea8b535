"""What `sam build` ships, run as the Lambda python3.13 runtime would run it.

`make test` builds the stack with the SAM CLI and a runtime-like interpreter (a venv with only
boto3), then sets MODELDROP_SAM_BUILD_DIR and MODELDROP_LAMBDA_PYTHON. Every built function runs
in its own warm worker of that interpreter, with only its directory and the layer's `python/` on the
path, against the local AWS emulator served over HTTP; the real state machine drives them. An
import-time or first-call dependency gap in the layer fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest
from conftest import ROOT, served_dispatch

from modeldrop.local.stack.build import load_template as yaml_template

BUILD_DIR = os.environ.get("MODELDROP_SAM_BUILD_DIR")
LAMBDA_PYTHON = os.environ.get("MODELDROP_LAMBDA_PYTHON")
WORKER = ROOT / "tests" / "runtime" / "lambda_worker.py"
RUNTIME_ENV = ("PATH", "LANG", "TZ")
# Functions shipped as container images, which `make sam-build` leaves out (`make engine-image` builds them).
IMAGE_FUNCTIONS = {
    k
    for k, v in yaml_template(ROOT)["Resources"].items()
    if v["Type"] == "AWS::Serverless::Function" and v["Properties"].get("PackageType") == "Image"
}


def _built() -> tuple[Path, str]:
    if not BUILD_DIR or not LAMBDA_PYTHON:
        if os.environ.get("CI"):
            pytest.fail("CI must test the shipped artifact: run `make test` (it sets MODELDROP_SAM_BUILD_DIR)")
        pytest.skip("run through `make test`, which builds with `sam build` and sets MODELDROP_SAM_BUILD_DIR")
    build = Path(BUILD_DIR).resolve()
    if not (build / "template.yaml").is_file():
        pytest.fail(f"{build} has no built template: `sam build` did not run")
    return build, LAMBDA_PYTHON


class _Worker:
    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.process = process
        self.lock = threading.Lock()
        self.invocations: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        with self.lock:
            self.process.stdin.write(json.dumps(event) + "\n")
            self.process.stdin.flush()
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the worker died: {self._stderr_tail()}")
        answer: dict[str, Any] = json.loads(line)
        self.invocations.append((event, answer))
        return answer

    def _stderr_tail(self) -> str:
        self.process.kill()
        stderr: IO[str] | None = self.process.stderr
        return stderr.read()[-2000:] if stderr else ""


class ShippedFunctions:
    """The moto Lambda dispatcher, answered by the built functions in runtime-like workers."""

    def __init__(self, build: Path, python: str, stack: Any, endpoint_url: str) -> None:
        self.build, self.python, self.stack, self.endpoint_url = build, python, stack, endpoint_url
        self.layer = build / "ModeldropLayer" / "python"
        self.workers: dict[str, _Worker] = {}

    def env_for(self, logical_id: str) -> dict[str, str]:
        spec = self.stack.functions[logical_id]
        env = {k: os.environ[k] for k in RUNTIME_ENV if k in os.environ}
        env.update(spec.env)
        env.update(
            {
                # What the Lambda runtime sets; tracing stays on, as `Tracing: Active` has it.
                "AWS_REGION": "us-east-1",
                "AWS_DEFAULT_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing",
                "AWS_SESSION_TOKEN": "testing",
                "AWS_LAMBDA_FUNCTION_NAME": spec.name,
                "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "1024",
                "AWS_EXECUTION_ENV": "AWS_Lambda_python3.13",
                "LAMBDA_TASK_ROOT": str(self.build / logical_id),
                "_X_AMZN_TRACE_ID": "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1",
                "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000",
                "AWS_EC2_METADATA_DISABLED": "true",
                "PYTHONPATH": os.pathsep.join([str(self.build / logical_id), str(self.layer)]),
                "PYTHONNOUSERSITE": "1",
                # The emulator instead of AWS: every client the functions build goes there.
                "AWS_ENDPOINT_URL": self.endpoint_url,
                "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": self.stack.runtime.url,
            }
        )
        return env

    def worker(self, logical_id: str) -> _Worker:
        if logical_id not in self.workers:
            spec = self.stack.functions[logical_id]
            process = subprocess.Popen(
                [self.python, "-s", str(WORKER), spec.handler],
                cwd=self.build / logical_id,
                env=self.env_for(logical_id),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            threading.Thread(target=_drain, args=(process,), daemon=True).start()
            self.workers[logical_id] = _Worker(process)
        return self.workers[logical_id]

    def dispatch(self, function_name: str, payload: dict[str, Any]) -> tuple[str, bool, str]:
        logical_id = next(k for k, f in self.stack.functions.items() if f.name == function_name)
        if logical_id in IMAGE_FUNCTIONS:  # not a zip: its image is shipped and run by test_engine_image.py
            result: tuple[str, bool, str] = self.stack.dispatch(function_name, payload)
            return result
        answer = self.worker(logical_id).invoke(payload)
        if "result" in answer:
            return json.dumps(answer["result"]), False, ""
        return json.dumps(answer), True, ""

    def import_failures(self) -> list[tuple[str, dict[str, Any]]]:
        """Answers that say the artifact itself is broken, not the event."""
        return [
            (logical_id, answer)
            for logical_id, worker in self.workers.items()
            for _event, answer in worker.invocations
            if answer.get("errorType") in ("ImportError", "ModuleNotFoundError", "AttributeError", "NameError")
        ]

    def close(self) -> None:
        for worker in self.workers.values():
            if worker.process.stdin:
                worker.process.stdin.close()
            worker.process.wait(timeout=10)


def _drain(process: subprocess.Popen[str]) -> None:
    """Keep the worker's stderr (its logs) from filling the pipe; keep the tail for errors."""
    assert process.stderr is not None
    tail: list[str] = []
    for line in process.stderr:
        tail = [*tail[-40:], line]
    process.stderr = _Tail("".join(tail))  # type: ignore[assignment]


class _Tail:
    def __init__(self, text: str) -> None:
        self.text = text

    def read(self) -> str:
        return self.text


@pytest.fixture
def shipped(make_stack: Any) -> Any:
    build, python = _built()
    stack = make_stack()
    with served_dispatch(stack, lambda url: ShippedFunctions(build, python, stack, url)) as functions:
        yield stack, functions


def _wait(stack: Any, count: int, functions: ShippedFunctions, timeout: float = 120) -> list[dict[str, Any]]:
    sfn = stack.client("stepfunctions")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        broken = functions.import_failures()
        assert broken == [], broken
        runs = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        if len(runs) >= count and all(r["status"] != "RUNNING" for r in runs):
            return [sfn.describe_execution(executionArn=r["executionArn"]) for r in runs]
        time.sleep(0.1)
    answers = {k: [a for _e, a in w.invocations][-2:] for k, w in functions.workers.items()}
    raise TimeoutError(f"executions still running; the functions answered: {answers}")


def test_every_built_function_imports_and_runs_in_the_lambda_runtime(
    shipped: Any, archive: bytes, checkpoint: Path, tmp_path: Path
) -> None:
    stack, functions = shipped
    built = {p.name for p in functions.build.iterdir() if (p / "app.py").is_file()}
    assert built == set(stack.functions) - IMAGE_FUNCTIONS, "sam build and template.yaml disagree on the functions"
    assert "--exclude " + " --exclude ".join(sorted(IMAGE_FUNCTIONS)) in (ROOT / "Makefile").read_text()
    layer_packages = {p.name for p in functions.layer.iterdir()}
    assert "modeldrop" in layer_packages and not {"boto3", "botocore", "moto", "typer", "rich"} & layer_packages
    assert (
        not (functions.layer / "modeldrop" / "cli").exists() and not (functions.layer / "modeldrop" / "local").exists()
    )

    # One deployment that succeeds and one whose endpoint fails: every step of the state machine runs.
    s3 = stack.client("s3")
    s3.put_object(Bucket=stack.bucket, Key="shipped/ok/model.tar.gz", Body=archive)
    _wait(stack, 1, functions)
    stack.hosting.plan("oom")
    s3.put_object(Bucket=stack.bucket, Key="shipped/oom/model.tar.gz", Body=archive)
    _wait(stack, 2, functions)
    # And one whose first instance type has no capacity, from a prefix, for a channel: the fallback
    # steps, the Map's copy and the promotion run too.
    stack.hosting.plan("capacity")
    for path in sorted(checkpoint.iterdir()):
        s3.put_object(Bucket=stack.bucket, Key=f"direct/shipped/fallback/{path.name}", Body=path.read_bytes())
    stack.client("stepfunctions").start_execution(
        stateMachineArn=stack.state_machine_arn,
        name="shipped-fallback",
        input=json.dumps(
            {
                "artifact_uri": f"s3://{stack.bucket}/direct/shipped/fallback/",
                "instance_types": ["ml.g6.2xlarge", "ml.g6e.2xlarge"],
                "channel": "shipped",  # the Promote task too: it creates the channel, then checks it
            }
        ),
    )
    _wait(stack, 3, functions)
    # And a LoRA adapter on that base: the adapter's validation and serving run in the runtime too.
    from modeldrop.local.samples.adapter import write_adapter
    from modeldrop.local.samples.checkpoint import write_tar_gz

    packed = write_tar_gz(write_adapter(tmp_path / "lora-shipped"), tmp_path / "adapter.tar.gz")
    s3.upload_file(str(packed), stack.bucket, "direct/shipped/lora/adapter.tar.gz")
    stack.client("stepfunctions").start_execution(
        stateMachineArn=stack.state_machine_arn,
        name="shipped-adapter",
        input=json.dumps(
            {
                "artifact_uri": f"s3://{stack.bucket}/direct/shipped/lora/adapter.tar.gz",
                "base": f"s3://{stack.bucket}/shipped/ok/model.tar.gz",
            }
        ),
    )
    outcomes = {d["name"]: d for d in _wait(stack, 4, functions)}
    reaper = functions.worker("ReaperFunction").invoke(
        json.loads((ROOT / "events" / "reaper-scheduled.json").read_text())
    )

    assert functions.import_failures() == []
    assert "result" in reaper, reaper
    statuses = sorted((d["status"], d.get("error")) for d in outcomes.values())
    assert statuses == [("FAILED", "EndpointFailed"), ("SUCCEEDED", None), ("SUCCEEDED", None), ("SUCCEEDED", None)], [
        (d["status"], d.get("error"), d.get("cause")) for d in outcomes.values()
    ]
    assert set(functions.workers) == built, f"never invoked: {built - set(functions.workers)}"
    # The validate function inflates with isal and parses headers with msgspec, not the stdlib
    # fallbacks, in the runtime.
    probe_code = (
        "from isal import igzip; import modeldrop.checkpoint.archive.artifact_scan;"
        "from modeldrop.checkpoint.headers import header_json as h; assert h._msgspec_decode is not None"
    )
    probe = subprocess.run(
        [functions.python, "-s", "-c", probe_code],
        env=functions.env_for("ValidateFunction"),
        capture_output=True,
        text=True,
    )
    assert probe.returncode == 0, probe.stderr
    # Only the deployments that succeeded are still up (until their TTL; the channel's with no TTL): each
    # an endpoint, config, model, process, and the served copy of its artifact (the files of a prefix).
    left = stack.leftover_resources()
    served = {r.split("/")[4] for r in left if r.startswith("s3://")}
    others = [r for r in left if not r.startswith("s3://")]
    endpoints = sorted(r.split("/", 1)[1] for r in left if r.startswith("endpoint/"))
    # The adapter on vLLM is served as adapter inference components: the base's and the adapter's.
    components = [r for r in others if r.startswith("inference-component/")]
    assert len(others) - len(components) == 12 and len(components) == 2, left
    assert len(endpoints) == 3 and len(served) == 3, left
    # The channel's endpoint serves the fallback deployment's config (its own preview endpoint is gone).
    from modeldrop.aws.dynamodb.channel_store import ChannelStore

    channel = ChannelStore(stack.registry().table).get("shipped")
    assert channel is not None and channel.live is not None and "modeldrop-ch-shipped" in endpoints, left
    serving = [e.replace("ch-shipped", channel.live.deployment_id) for e in endpoints]
    assert all(any(s in e for e in serving) for s in served), left
