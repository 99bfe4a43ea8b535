"""`modeldrop local up`: the emulated stack kept running as a server, for every command to talk to.

One process holds what run-local holds for one run (moto's backends, the state machine's
interpreter, the handlers, the hosting of endpoints and the runtime) and serves the AWS APIs over
HTTP on loopback (moto's server, on the same backends), beside the CloudFormation stack `sam deploy`
would have made, with its outputs. `deploy`, `upload`, `list`, `status`, `extend`, `teardown`,
`doctor` and `eval` then reach it through the standard AWS_ENDPOINT_URL settings, exactly as they
reach a deployed stack. `local down` stops it; every endpoint process goes with it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

STACK_NAME = "modeldrop-local"
REGION = "us-east-1"


def state_path() -> Path:
    """Where a running local stack says how to reach it (one per user)."""
    default = Path(tempfile.gettempdir()) / f"modeldrop-local-{os.getuid()}.json"
    return Path(os.environ.get("MODELDROP_LOCAL_STATE") or default)


def client_env(state: dict[str, Any]) -> dict[str, str]:
    """The settings that point the AWS SDK (and so every modeldrop command) at the local stack."""
    return {
        "AWS_ENDPOINT_URL": state["endpoint_url"],
        "AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME": state["runtime_url"],
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "MODELDROP_STACK": STACK_NAME,
        "MODELDROP_POLL_SECONDS": "0.5",
    }


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


def serve(port: int | None = None) -> int:
    """Run the local stack until SIGTERM or SIGINT; the state file exists while it serves."""
    from moto import mock_aws
    from moto.server import ThreadedMotoServer

    from modeldrop.contracts import clock
    from modeldrop.local.emulator.sagemaker.hosting import LocalHosting
    from modeldrop.local.stack.build import build_stack
    from modeldrop.local.stack.hermetic import hermetic_aws

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    path = state_path()
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
    raise SystemExit(serve(int(sys.argv[1]) if len(sys.argv) > 1 else None))
