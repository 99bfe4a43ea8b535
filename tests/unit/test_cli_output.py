"""What the commands print at 80 columns: whole identifiers, one item a line, and what is left out said."""

from __future__ import annotations

from typing import Any

import pytest

from modeldrop.aws.execution_watch import StateRun
from modeldrop.cli import _shared
from modeldrop.cli.channel_commands import _rollback_line
from modeldrop.cli.states import StatePrinter
from modeldrop.cli.teardown_commands import deleted_lines
from modeldrop.contracts.channel import ChannelEvent, ChannelRecord, ChannelVersion


def test_deleted_s3_objects_are_one_line_a_folder_and_names_one_a_line() -> None:
    served = [f"s3://b/modeldrop-served/d-1/model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    lines = deleted_lines(["endpoint/e", "endpoint-config/e", *served, "s3://b/reports/d-1.json"])
    assert lines == [
        "endpoint/e",
        "endpoint-config/e",
        "s3://b/modeldrop-served/d-1/ (4 objects)",
        "s3://b/reports/d-1.json",
    ]


def _channel(history: list[tuple[str, str, str]]) -> ChannelRecord:
    events = [ChannelEvent(at=at, kind=kind, deployment_id=to, previous=frm) for at, kind, to, frm in
              [(at, k, t.split(">")[1], t.split(">")[0]) for at, k, t in history]]  # fmt: skip
    live = events[-1].deployment_id or ""
    kept = events[-1].previous or ""
    return ChannelRecord(name="main", endpoint_name="modeldrop-ch-main", live=ChannelVersion(deployment_id=live),
                         kept=[ChannelVersion(deployment_id=kept)], history=events)  # fmt: skip


def test_each_rollback_says_which_version_it_moves_to_and_an_undo_says_so() -> None:
    first = _channel([("t1", "promoted", "a>b"), ("t2", "rolled_back", "b>a")])
    assert _rollback_line(first) == "rolled back channel main: a serves again (was b, kept for a rollback)"
    second = _channel([("t1", "promoted", "a>b"), ("t2", "rolled_back", "b>a"), ("t3", "rolled_back", "a>b")])
    said = _rollback_line(second)
    assert said.endswith("b serves again (was a, kept for a rollback); this undoes the rollback of t2")


def test_a_run_of_several_executions_labels_each(capsys: pytest.CaptureFixture[str], monkeypatch: Any) -> None:
    monkeypatch.setattr(_shared.console, "width", 80)
    printer = StatePrinter(label_executions=True)
    for execution in ("local-1", "local-1", "s3-2"):
        printer.show(StateRun(name="NormalizeRequest", outcome="ok", seconds=0.1, execution=execution))
    out = capsys.readouterr().out
    assert out.count("execution local-1") == 1 and out.count("execution s3-2") == 1
    assert out.index("execution local-1") < out.index("execution s3-2")
