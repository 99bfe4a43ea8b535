"""The engine-check function as its container image ships (`make engine-image`: `sam build` of its Dockerfile):
the real state machine's EngineCheck task is answered by the image's own runtime interface client
(awslambdaric, through a Lambda Runtime API) in a container run as Lambda runs one -- read-only but for
/tmp, an unprivileged user, its memory -- reading the served copy from the emulated S3 over HTTP and
asking the image's vLLM. A refused and an accepted checkpoint; nothing else runs in the container.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ROOT, served_dispatch
from test_engine_check import _deploy, _variant

from modeldrop.local.samples.cpu_checkpoint import write_cpu_checkpoint
from modeldrop.local.stack.build import load_template

IMAGE = os.environ.get("MODELDROP_ENGINE_IMAGE")
FUNCTION = "EngineCheckFunction"
RUNTIME_ENV = ("LANG", "TZ")


def _image() -> str:
    if not IMAGE:
        if os.environ.get("CI"):
            pytest.fail("CI must test the engine-check image: `make test` builds it and sets MODELDROP_ENGINE_IMAGE")
        pytest.skip("run through `make test`: it builds the image (make engine-image), sets MODELDROP_ENGINE_IMAGE")
    build = os.environ.get("MODELDROP_ENGINE_IMAGE_BUILD")
    if build:  # make test: built here, in this worker, while the others run CPU-bound tests
        done = subprocess.run(shlex.split(build), cwd=ROOT, capture_output=True, text=True, timeout=3600, check=False)
        if done.returncode != 0:
            why = (done.stderr or done.stdout)[-3000:]
            if not os.environ.get("CI"):  # a laptop without Docker or root: said, not failed
                pytest.skip(f"the engine image cannot be built here: {why.strip().splitlines()[-1:]}")
            pytest.fail(f"the engine image did not build: {why}")
    if shutil.which("docker") is None or subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True,
                                                         check=False).returncode != 0:  # fmt: skip
        pytest.fail(f"no image {IMAGE}: `make engine-image` builds it (Docker must run)")
    return IMAGE


class ImageFunction:
    """The moto Lambda dispatcher: EngineCheckFunction answered by the container, the rest in-process."""

    def __init__(self, stack: Any, image: str, endpoint_url: str) -> None:
        import sys

        sys.path.insert(0, str(ROOT / "tests" / "runtime"))
        from runtime_api import RuntimeApi

        # The image function as template.yaml declares it: its environment (Globals' too), memory and timeout.
        props = load_template(ROOT)["Resources"][FUNCTION]["Properties"]
        self.stack, self.spec = stack, stack.functions[FUNCTION]
        self.memory_mb, self.timeout = int(props["MemorySize"]), float(props["Timeout"])
        self.api = RuntimeApi(self.spec.arn, self.timeout)
        self.name = f"modeldrop-engine-check-{uuid.uuid4().hex[:8]}"
        env = {k: os.environ[k] for k in RUNTIME_ENV if k in os.environ}
        env.update(self.spec.env)
        env.update({
            "AWS_LAMBDA_RUNTIME_API": self.api.address,
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_LAMBDA_FUNCTION_NAME": self.spec.name,
            "AWS_LAMBDA_FUNCTION_VERSION": "$LATEST",
            "AWS_LAMBDA_FUNCTION_MEMORY_SIZE": str(self.memory_mb),
            "AWS_LAMBDA_LOG_GROUP_NAME": f"/aws/lambda/{self.spec.name}",
            "AWS_LAMBDA_LOG_STREAM_NAME": "engine-image-test",
            "AWS_XRAY_DAEMON_ADDRESS": "127.0.0.1:2000",
            "AWS_EC2_METADATA_DISABLED": "true",
            "AWS_ENDPOINT_URL": endpoint_url,
        })  # fmt: skip
        # As Lambda runs it: a read-only root but /tmp (512 MB, its default), no /dev/shm, another user,
        # its memory.
        args = ["docker", "run", "--rm", "--detach", "--name", self.name, "--network", "host", "--read-only",
                "--tmpfs", "/tmp:exec,size=512m", "--ipc", "none", "--user", "993:990",
                "--memory", f"{self.memory_mb}m", "--cpus", "2"]  # fmt: skip
        for key, value in env.items():
            args += ["--env", f"{key}={value}"]
        subprocess.run([*args, image], check=True, capture_output=True, timeout=120)

    def dispatch(self, function_name: str, payload: dict[str, Any]) -> tuple[str, bool, str]:
        if function_name != self.spec.name:
            result: tuple[str, bool, str] = self.stack.dispatch(function_name, payload)
            return result
        errored, answer = self.api.invoke(payload, wait_s=self.timeout)
        return json.dumps(answer), errored, ""

    def logs(self) -> str:
        done = subprocess.run(["docker", "logs", self.name], capture_output=True, text=True, check=False)
        return (done.stdout + done.stderr)[-3000:]

    def close(self) -> None:
        subprocess.run(["docker", "rm", "--force", self.name], capture_output=True, check=False, timeout=120)
        self.api.close()


@pytest.fixture
def in_container(make_stack: Any) -> Iterator[tuple[Any, ImageFunction]]:
    image = _image()
    stack = make_stack({"EngineCheck": "Enabled", "DefaultEngine": "vllm"})
    with served_dispatch(stack, lambda url: ImageFunction(stack, image, url)) as function:
        yield stack, function


def test_the_image_judges_the_served_copy_in_its_own_container(in_container: Any, tmp_path: Path) -> None:
    stack, function = in_container
    base = write_cpu_checkpoint(tmp_path / "llama")
    odd = _variant(base, tmp_path, "odd-activation", config=lambda c: c.update(hidden_act="wibble"))
    refused = _deploy(stack, tmp_path, odd)
    assert refused["status"] == "FAILED" and refused["error"] == "CheckpointRefused", (refused, function.logs())
    assert "ENGINE_REFUSED" in refused["cause"] and "Unsupported activation: wibble" in refused["cause"]
    assert "CreateEndpointFunction" not in [i.function for i in stack.invocations]
    assert stack.leftover_resources() == []
    fine = _deploy(stack, tmp_path, base)
    assert fine["status"] == "SUCCEEDED", (fine, function.logs())
    assert function.api.served == 2 and function.api.init_error is None  # both answered by the container
    checks = [r.step_dict("engine_check") for r in stack.registry().deployments() if r.step_dict("engine_check")]
    assert sorted(c["verdict"] for c in checks) == ["loads", "refused"], checks
    labels = json.loads(subprocess.run(["docker", "image", "inspect", IMAGE, "--format", "{{json .Config.Labels}}"],
                                       capture_output=True, text=True, check=True).stdout)  # fmt: skip
    assert {c["version"] for c in checks} == {labels["modeldrop.engine-version"]}
