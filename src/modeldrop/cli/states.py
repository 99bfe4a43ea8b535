"""The states of a followed execution, one line each, as `deploy` and `run-local` print them."""

from __future__ import annotations

from typing import Any

from rich.markup import escape

from modeldrop.cli._shared import console

LOOP_STATES = {
    "WaitForEndpoint",
    "PollEndpoint",
    "EndpointInService",
    "WaitForQuota",
    "CreateEndpoint",
    "EndpointCreated",
    "Teardown",
    "TeardownDone",
    "WaitForTeardown",
}


class StatePrinter:
    """A state per line; a wait loop (polling a Creating endpoint, a quota, a teardown) prints each
    state once, then one line saying how often it went round -- not sixty identical lines."""

    def __init__(self, seconds_format: str = "6.2f", label_executions: bool = False) -> None:
        self.label_executions = label_executions  # a run of several executions: a heading before each
        self.execution: str | None = None
        self.last: dict[str, str] = {}
        self.repeated: dict[str, int] = {}
        self.seconds_format = seconds_format

    def show(self, state: Any) -> None:
        execution = getattr(state, "execution", None)
        if self.label_executions and execution and execution != self.execution:
            self.flush()
            self.execution = execution
            self.last.clear()
            console.print(f"execution {escape(execution)}", highlight=False)
        if state.name in LOOP_STATES and self.last.get(state.name) == state.outcome:
            self.repeated[state.name] = self.repeated.get(state.name, 0) + 1
            return
        self.flush()
        self.last[state.name] = state.outcome
        mark = "[green]ok[/]" if state.outcome == "ok" else f"[red]{escape(state.outcome)}[/]"
        console.print(f"  {state.name:<22} {mark:<28} {state.seconds:{self.seconds_format}}s")

    def flush(self) -> None:
        if self.repeated:
            rounds = max(self.repeated.values())
            console.print(f"  [dim]... {', '.join(self.repeated)} went round {rounds} more times[/]")
            self.repeated.clear()

    def waiting(self) -> str:
        """What the loop is waiting in, for a live line: the state and how often it went round."""
        if not self.repeated:
            return ""
        name, rounds = max(self.repeated.items(), key=lambda item: item[1])
        return f"{name} went round {rounds} times"
