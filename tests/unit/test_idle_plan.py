"""The idle policy's arithmetic: durations, the region decision, and instance-hours from a scaling history."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from modeldrop.contracts.channel import IdleRequest, parse_idle
from modeldrop.serving.idle_plan import (
    decide,
    hours_within,
    instance_intervals,
    is_waking_error,
    refused_at_create,
)

T0 = datetime(2026, 12, 5, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600), ("1h", 3600), ("90 min", 5400), ("1.5h", 5400),
                                               (900, 900), ("24h", 86400), ("301s", 300)])  # fmt: skip
def test_durations(text: str | int, seconds: int) -> None:
    assert parse_idle(text) == seconds


@pytest.mark.parametrize("text", ["4m", "25h", "10 parsecs", "", "-10m", True, "1e9h"])
def test_durations_refused(text: object) -> None:
    with pytest.raises(ValueError):
        parse_idle(text)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        IdleRequest.model_validate({"scale_to_zero_after": text})


def test_the_region_decides_and_the_stack_can_add_one() -> None:
    ok = decide(600, "us-east-1", "ml.g6.2xlarge", 1, 1.22, 900)
    assert ok.scales_to_zero and ok.wake_seconds > 900 and ok.always_on_day_cost() == 29.28
    paris = decide(600, "eu-west-3", "ml.g6.2xlarge", 1, 1.5, 900)
    assert not paris.scales_to_zero and "eu-west-3" in paris.reason
    listed = decide(600, "ap-south-2", "ml.g6.2xlarge", 2, None, 900, also_refusing=("ap-south-2",))
    assert not listed.scales_to_zero and "NoScaleToZeroRegions" in listed.reason
    late = refused_at_create(ok, "Min instance count needs to be greater than 0")
    assert late.mode == "always_on" and "CreateEndpointConfig" in late.reason


def test_the_waking_error_is_told_from_other_errors() -> None:
    assert is_waking_error("ValidationError", "Inference Component x has no capacity to process this request.")
    assert not is_waking_error("ValidationError", "Endpoint x not found.")
    assert not is_waking_error("ModelError", "no capacity")


def test_instance_hours_follow_the_scaling_history() -> None:
    h = timedelta(hours=1)
    changes = [(T0 + 2 * h, 0), (T0 + 5 * h, 1), (T0 + 6 * h, 0)]
    intervals = instance_intervals(T0, T0 + 10 * h, changes, initial=1)
    assert hours_within(intervals, T0, T0 + 10 * h) == (3.0, 10.0)
    assert hours_within(intervals, T0 + 4 * h, T0 + 10 * h) == (1.0, 6.0)  # a window inside the life
    # A change before the window starts sets the count it starts with.
    assert hours_within(instance_intervals(T0, T0 + h, [(T0 - h, 0)], initial=1), T0, T0 + h) == (0.0, 1.0)


def test_plan_idle_says_what_a_channel_of_the_plan_would_do(tmp_path: object) -> None:
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from modeldrop.cli import app
    from modeldrop.local.samples.checkpoint import write_checkpoint

    checkpoint = str(write_checkpoint(Path(str(tmp_path)) / "ckpt"))
    runner = CliRunner()
    virginia = runner.invoke(app, ["plan", checkpoint, "--idle", "1h", "--region", "us-east-1", "--json"])
    idle = json.loads(virginia.output)["idle"]
    assert virginia.exit_code == 0 and idle["mode"] == "scale_to_zero" and idle["after_seconds"] == 3600
    assert idle["wake_seconds"] >= 1200 and idle["always_on_day_usd"] == 29.28
    paris = runner.invoke(app, ["plan", checkpoint, "--idle", "1h", "--region", "eu-west-3"], terminal_width=100)
    assert paris.exit_code == 0 and "always-on: eu-west-3 refuses MinInstanceCount 0" in " ".join(paris.output.split())
    short = runner.invoke(app, ["plan", checkpoint, "--idle", "2m", "--region", "us-east-1"])
    assert short.exit_code == 2 and "between 5 minutes and 24 hours" in short.output


def test_a_bare_number_of_seconds_too_short_suggests_a_unit() -> None:
    with pytest.raises(ValueError, match="did you mean 5m or 5h"):
        parse_idle("5")
    with pytest.raises(ValueError) as late:
        parse_idle("25h")
    assert "did you mean" not in str(late.value)
