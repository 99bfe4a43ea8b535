"""One deployment end to end on this machine: the real ASL and handlers over moto."""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from modeldrop.local.moto_shims import EndpointScript

CANNED_NOTE = (
    "endpoint answers come from moto's sagemaker-runtime result queue (canned OpenAI chat completions), "
    "not from a model server"
)

OOM_REASON = (
    "The primary container for production variant AllTraffic did not pass the ping health check. "
    "Please check CloudWatch logs for this endpoint."
)
CAPACITY_REASON = (
    "InsufficientInstanceCapacity: We currently do not have sufficient capacity for ml.g6.2xlarge "
    "in the Availability Zone you requested."
)

FAULTS: dict[str, str] = {
    "none": "no fault",
    "oom": "the endpoint goes Failed: engine CUDA OOM, ping health check not passed",
    "capacity": "the endpoint goes Failed: InsufficientInstanceCapacity",
    "slow-start": "the endpoint stays Creating past the deploy deadline",
    "truncate": "the endpoint answers with finish_reason=length",
}


class StateRun(BaseModel):
    name: str
    outcome: str
    seconds: float


class RunResult(BaseModel):
    status: str
    error: str | None = None
    cause: str | None = None
    deployment_id: str | None = None
    execution_name: str | None = None
    states: list[StateRun] = Field(default_factory=list)
    output: dict[str, Any] | None = None
    record: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] | None = None
    leftover_resources: list[str] = Field(default_factory=list)
    note: str = CANNED_NOTE
    fault: str = "none"
    seconds: float = 0.0


def _chat(finish: str) -> dict[str, Any]:
    text = "Hello! Nice to meet you." if finish == "stop" else "Hello! Nice to"
    return {
        "id": "chatcmpl-local",
        "object": "chat.completion",
        "model": "local",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 14, "completion_tokens": 7 if finish == "stop" else 64, "total_tokens": 21},
    }


def _artifact_bytes(artifact: Path | None, workdir: Path) -> bytes:
    from modeldrop.sample_checkpoint import tar_gz_bytes, write_checkpoint

    if artifact is None:
        return tar_gz_bytes(write_checkpoint(workdir / "sample"))
    if artifact.is_dir():
        return tar_gz_bytes(artifact)
    return artifact.read_bytes()


def run_local(
    artifact: Path | None = None,
    fault: str = "none",
    on_state: Callable[[StateRun], None] | None = None,
    engine: str | None = None,
) -> RunResult:
    from moto import mock_aws

    from modeldrop import clock
    from modeldrop.local.stack import build_stack
    from modeldrop.models import deployment_id_for

    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; choose from {', '.join(FAULTS)}")
    started = time.monotonic()
    clock.reset()
    with (
        tempfile.TemporaryDirectory(prefix="modeldrop-") as tmp,
        mock_aws(config={"stepfunctions": {"execute_state_machine": True}}),
    ):
        stack = build_stack(parameters={"DefaultEngine": engine} if engine else None)
        stack.extra_env["MODELDROP_ANSWERS_FROM"] = "moto result queue (canned)"
        if fault == "oom":
            stack.hosting.plan(
                EndpointScript(
                    ["Creating", "Creating", "Failed"],
                    OOM_REASON,
                )
            )
        elif fault == "capacity":
            stack.hosting.plan(
                EndpointScript(
                    ["Creating", "Failed"],
                    CAPACITY_REASON,
                )
            )
        elif fault == "slow-start":
            stack.hosting.plan(EndpointScript(["Creating"]))
        finish = "length" if fault == "truncate" else "stop"
        stack.queue_chat_answers([_chat(finish) for _ in range(8)])
        body = _artifact_bytes(artifact, Path(tmp))
        key = f"local/{datetime.now().strftime('%Y%m%d-%H%M%S')}/model.tar.gz"
        stack.client("s3").put_object(Bucket=stack.bucket, Key=key, Body=body)
        sfn = stack.client("stepfunctions")
        executions = sfn.list_executions(stateMachineArn=stack.state_machine_arn)["executions"]
        if not executions:
            return RunResult(
                status="not-started", error="NoExecution", cause="the S3 event started no execution", fault=fault
            )
        entered: dict[str, datetime] = {}
        states: list[StateRun] = []

        def on_event(event: dict[str, Any]) -> None:
            kind = event["type"]
            if kind.endswith("StateEntered"):
                entered[event["stateEnteredEventDetails"]["name"]] = event["timestamp"]
            elif kind.endswith("StateExited"):
                name = event["stateExitedEventDetails"]["name"]
                seconds = (event["timestamp"] - entered.get(name, event["timestamp"])).total_seconds()
                state = StateRun(name=name, outcome="ok", seconds=round(seconds, 3))
                states.append(state)
                if on_state:
                    on_state(state)
            elif kind == "TaskFailed" and on_state:
                details = event.get("taskFailedEventDetails", {})
                on_state(StateRun(name="  (task failed)", outcome=details.get("error", "?"), seconds=0.0))

        desc = stack.wait(executions[0]["executionArn"], timeout=120, on_event=on_event)
        # Fail states have no exit event: show where the execution ended.
        if desc["status"] == "FAILED":
            last = [n for n in entered if n not in {s.name for s in states}]
            for name in last:
                state = StateRun(name=name, outcome=desc.get("error", "failed"), seconds=0.0)
                states.append(state)
                if on_state:
                    on_state(state)
        deployment_id = deployment_id_for(desc["name"])
        item = stack.table().get_item(Key={"deployment_id": deployment_id}).get("Item") or {}
        record = {k: (json.loads(v) if k == "request" else v) for k, v in item.items() if k != "steps"}
        record["steps"] = {k: json.loads(v) for k, v in item.get("steps", {}).items()}
        output = json.loads(desc["output"]) if desc.get("output") else None
        return RunResult(
            status="succeeded" if desc["status"] == "SUCCEEDED" else "failed",
            error=desc.get("error"),
            cause=_cause(desc.get("cause")),
            deployment_id=deployment_id,
            execution_name=desc["name"],
            states=states,
            output=output,
            record=json.loads(json.dumps(record, default=str)),
            eval=(output or {}).get("eval") or record["steps"].get("smoke_eval"),
            leftover_resources=stack.leftover_resources() if desc["status"] != "SUCCEEDED" else [],
            fault=fault,
            seconds=round(time.monotonic() - started, 2),
        )


def _cause(cause: str | None) -> str | None:
    if not cause:
        return cause
    try:
        parsed = json.loads(cause)
    except json.JSONDecodeError:
        return cause
    return str(parsed.get("errorMessage", cause)) if isinstance(parsed, dict) else cause
