"""run-local --channel's text summary: every step of the channel's day on a line with its seconds, the
adapter-only promotion and the rollback among them (they were only in --json)."""

from __future__ import annotations

from modeldrop.cli.run_summary import channel_lines


def test_each_channel_line_has_its_seconds_and_the_adapter_day_is_shown() -> None:
    lora = {
        "name": "demo-lora",
        "steps": [{"step": "created", "deployment_id": "base-1"},
                  {"step": "promoted, adapter only", "deployment_id": "day-2", "endpoints_created": []},
                  {"step": "rolled back", "deployment_id": "base-1"}],
        "history": [
            {"kind": "created", "deployment_id": "base-1", "seconds": 95.1, "reason": "timed from its upload"},
            {"kind": "promoted", "deployment_id": "day-2", "seconds": 63.4, "reason": "timed from its marker",
             "gate": {"summary": "promotable: 0 of 3 cases regressed"}},
            {"kind": "rolled_back", "deployment_id": "base-1", "seconds": 0.9, "reason": "modeldrop rollback"},
        ],
    }  # fmt: skip
    lines = channel_lines(lora)
    assert lines[1] == (
        "channel demo-lora: promoted, adapter only (no endpoint created) day-2 in 63.4 s (timed from its marker)"
    )
    assert lines[2] == "  gate: promotable: 0 of 3 cases regressed"
    assert lines[3] == "channel demo-lora: rolled back base-1 in 0.9 s (modeldrop rollback)"
    retired = channel_lines({"name": "demo", "history": [{"kind": "retired", "deployment_id": "v1", "seconds": 3600.0,
                                                          "reason": "its grace period ended"}]})  # fmt: skip
    assert retired == ["channel demo: retired v1 after 3600.0 s (its grace period ended)"]
    assert all(" s" in line for line in lines if line.startswith("channel "))
