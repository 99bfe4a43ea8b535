"""Follow a Step Functions execution state by state, from its history (the CLI and the local run)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from pydantic import BaseModel

from modeldrop.aws.pages import all_items

if TYPE_CHECKING:
    from mypy_boto3_stepfunctions import SFNClient


class StateRun(BaseModel):
    name: str
    outcome: str
    seconds: float
    execution: str | None = None  # the execution's name (a run of several, as a channel's day, labels each)


class _Tracker:
    def __init__(self, on_state: Callable[[StateRun], None] | None) -> None:
        self.entered: dict[str, datetime] = {}
        self.states: list[StateRun] = []
        self.on_state = on_state
        self.execution: str | None = None
        self.failed: str | None = None  # the current task's last error, until it succeeds
        self.retries = 0

    def emit(self, state: StateRun) -> None:
        state.execution = self.execution
        self.states.append(state)
        if self.on_state:
            self.on_state(state)

    def event(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind.endswith("StateEntered"):
            self.entered[event["stateEnteredEventDetails"]["name"]] = event["timestamp"]
            self.failed, self.retries = None, 0
        elif kind == "TaskFailed":
            self.failed = event.get("taskFailedEventDetails", {}).get("error", "?")
            self.retries += 1
        elif kind == "TaskSucceeded":
            self.failed = None
        elif kind.endswith("StateExited"):
            name = event["stateExitedEventDetails"]["name"]
            seconds = (event["timestamp"] - self.entered.get(name, event["timestamp"])).total_seconds()
            # A task that failed and exits without succeeding was caught: never "ok".
            if self.failed:
                outcome = f"failed: {self.failed}"
            elif self.retries:
                outcome = f"ok after {self.retries} {'retry' if self.retries == 1 else 'retries'}"
            else:
                outcome = "ok"
            self.emit(StateRun(name=name, outcome=outcome, seconds=round(seconds, 3)))

    def close(self, desc: dict[str, Any]) -> None:
        # Fail states have no exit event: show where the execution ended.
        if desc["status"] == "FAILED":
            done = {s.name for s in self.states}
            for name in [n for n in self.entered if n not in done]:
                self.emit(StateRun(name=name, outcome=desc.get("error", "failed"), seconds=0.0))


def _history(sfn: SFNClient, arn: str) -> list[dict[str, Any]]:
    return all_items(sfn, "get_execution_history", "events", page_size=1000, executionArn=arn)


def watch(
    sfn: SFNClient,
    arn: str,
    on_state: Callable[[StateRun], None] | None = None,
    poll_seconds: float = 2.0,
    timeout_seconds: float | None = None,
    on_poll: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], list[StateRun]]:
    """Poll until the execution ends; returns (describe_execution, the states it went through).

    `on_poll` runs before every poll and may raise to stop watching.
    """
    tracker = _Tracker(on_state)
    tracker.execution = arn.rsplit(":", 1)[-1]
    seen = 0
    deadline = time.monotonic() + timeout_seconds if timeout_seconds else None
    while True:
        if on_poll is not None:
            on_poll()
        # Read as plain data: the tracker and the run's result pick the fields they show.
        desc = cast(dict[str, Any], sfn.describe_execution(executionArn=arn))
        events = _history(sfn, arn)
        for event in events[seen:]:
            tracker.event(event)
        seen = len(events)
        if desc["status"] != "RUNNING":
            tracker.close(desc)
            return desc, tracker.states
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"execution {arn} still RUNNING after {timeout_seconds}s")
        time.sleep(poll_seconds)


def outcome(desc: Mapping[str, Any]) -> tuple[str, str | None]:
    """(status, error) of an ended execution as every command that waits on one says them: succeeded,
    failed, aborted or timed_out, and its named error (ExecutionAborted for a stop, which names none)."""
    status = {"SUCCEEDED": "succeeded", "ABORTED": "aborted", "TIMED_OUT": "timed_out"}.get(desc["status"], "failed")
    return status, desc.get("error") or ("ExecutionAborted" if status == "aborted" else None)
