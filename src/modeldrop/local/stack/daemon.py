"""`modeldrop local up`: the emulated stack kept running as a server, for every command to talk to.

One process holds what run-local holds for one run (moto's backends, the state machine's
interpreter, the handlers, the hosting of endpoints and the runtime) and serves the AWS APIs over
HTTP on loopback (moto's server, on the same backends), beside the CloudFormation stack `sam deploy`
would have made, with its outputs. `deploy`, `upload`, `list`, `status`, `extend`, `teardown`,
`doctor` and `eval` then reach it through the standard AWS_ENDPOINT_URL settings, exactly as they
reach a deployed stack. `local down` stops it; every endpoint process goes with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import socket
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

STACK_NAME = "modeldrop-local"
REGION = "us-east-1"


def stacks_dir() -> Path:
    """This user's local stacks' state files: under their own state home, never a shared temp folder
    (another user's, or another checkout's, `local down` must not find them)."""
    home = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    path = home / "modeldrop" / "local-stacks"
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:  # no writable home: a folder of this user's own in the temp folder
        path = Path(tempfile.gettempdir()) / f"modeldrop-local-stacks-{os.getuid()}"
        path.mkdir(mode=0o700, exist_ok=True)
    return path


def stack_name(name: str | None = None) -> str:
    """A local stack's name: NAME, else the current directory's (its base name and a hash of its path),
    so that two checkouts or two projects each have their own."""
    if name:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name):
            raise ValueError(f"{name!r} is not a local stack name (letters, digits, '.', '_', '-'; 64 at most)")
        return name
    cwd = str(Path.cwd())
    base = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(cwd).name)[:40] or "root"
    return f"{base.lstrip('.-_') or 'dir'}-{hashlib.sha256(cwd.encode()).hexdigest()[:8]}"


def state_path(name: str | None = None) -> Path:
    """Where a running local stack says how to reach it: MODELDROP_LOCAL_STATE (which `local up`
    exports, so a shell's later commands find its stack wherever they run), else NAME's (or the
    current directory's) file in this user's state folder."""
    explicit = os.environ.get("MODELDROP_LOCAL_STATE")
    if explicit and not name:
        return Path(explicit)
    return stacks_dir() / f"{stack_name(name)}.json"


def client_env(state: dict[str, Any]) -> dict[str, str]:
    """The settings that point the AWS SDK (and so every modeldrop command) at the local stack."""
    env = {
        "AWS_ENDPOINT_URL": state["endpoint_url"],
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": state["runtime_url"],
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "MODELDROP_STACK": STACK_NAME,
        "MODELDROP_POLL_SECONDS": "0.5",
    }
    if state.get("state_path"):  # later `local` commands in the shell, and a stopped stack's diagnosis
        env["MODELDROP_LOCAL_STATE"] = str(state["state_path"])
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _cloudformation_stack(stack: Any) -> None:
    outputs = {
        "StateMachineArn": stack.state_machine_arn,
        "DeploymentsTableName": stack.table_name,
        "ArtifactBucketName": stack.bucket,
        "EventBusName": stack.resources["EventBus"],
        "ResourcePrefix": stack.parameters.get("ResourcePrefix") or "modeldrop",
    }
    template = {
        # The template's parameters as this stack has them (the execution role, the limits), so that
        # doctor and extend read them as from a deployed stack.
        "Parameters": {k: {"Type": "String", "Default": v} for k, v in stack.parameters.items() if v != ""},
        "Resources": {"Handle": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    stack.client("cloudformation").create_stack(StackName=STACK_NAME, TemplateBody=json.dumps(template))


def serve(port: int | None = None, path: Path | None = None) -> int:
    """Run the local stack until SIGTERM or SIGINT; the state file (PATH) exists while it serves."""
    from moto import mock_aws
    from moto.server import ThreadedMotoServer

    from modeldrop.contracts import clock
    from modeldrop.local.emulator.sagemaker.hosting import LocalHosting
    from modeldrop.local.stack.build import build_stack
    from modeldrop.local.stack.hermetic import hermetic_aws

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    path = path or state_path()
    port = port or _free_port()
    clock.reset()
    hosting = LocalHosting()
    with hermetic_aws(), mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        # The EngineCheck step's probe (seconds per deployment) is off where the shell says so, as for run-local.
        disabled = os.environ.get("MODELDROP_ENGINE_CHECK") == "Disabled"
        stack = build_stack(parameters={"EngineCheck": "Disabled"} if disabled else None, hosting=hosting)
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
        try:
            _cloudformation_stack(stack)
            server.start()
            assert stack.runtime is not None
            state = {
                "pid": os.getpid(),
                "name": path.stem,
                "directory": os.getcwd(),
                "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "state_path": str(path),
                "endpoint_url": f"http://127.0.0.1:{port}",
                "runtime_url": stack.runtime.url,
                "stack": STACK_NAME,
                "region": REGION,
                "bucket": stack.bucket,
            }
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(state))
            partial.replace(path)
            stop.wait()
        finally:
            path.unlink(missing_ok=True)
            server.stop()
            stack.close()
            hosting.stop_all()
    return 0


if __name__ == "__main__":
    raise SystemExit(serve(int(sys.argv[1]) or None, Path(sys.argv[2])))
