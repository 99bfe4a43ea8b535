"""The lines `deploy` and `run-local` print for a followed execution: a wait loop is one line per
state and one saying how often it went round, never sixty `PollEndpoint ok` lines."""

from __future__ import annotations

from modeldrop.aws.execution_watch import StateRun
from modeldrop.cli import _shared
from modeldrop.cli.states import StatePrinter


def test_a_wait_loop_prints_each_state_once_then_how_often_it_went_round() -> None:
    printer = StatePrinter()
    with _shared.console.capture() as captured:
        printer.show(StateRun(name="CreateEndpoint", outcome="ok", seconds=1.0))
        for _ in range(30):
            for name in ("WaitForEndpoint", "PollEndpoint", "EndpointInService"):
                printer.show(StateRun(name=name, outcome="ok", seconds=0.1))
        assert printer.waiting().endswith("went round 29 times")
        printer.show(StateRun(name="SmokeEval", outcome="failed: EvalFailed", seconds=2.0))
        printer.flush()
    lines = [line for line in captured.get().splitlines() if line.strip()]
    assert [line.split()[0] for line in lines] == [
        "CreateEndpoint",
        "WaitForEndpoint",
        "PollEndpoint",
        "EndpointInService",
        "...",
        "SmokeEval",
    ], lines
    assert "went round 29 more times" in lines[4] and "failed: EvalFailed" in lines[5]
